"""Hidden checks for lesson 11 (profiling). Never released; see lesson 1's for the form.

Every case draws its traces' specs at grading time (``Case.draw``: the boundaries first, then specs from
``gpucourse.checks.lesson11_profiling.trace_specs`` with a seed drawn then). The sandbox builds each trace from its spec
(``synthetic_trace``) and calls the answer; the judge builds the same trace here and runs the reference below,
which exists on the grader's side only, on it. The real-profile case draws the phases' names and where it puts
the sleep and the ``.item()``, and knows its answer from that.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson11_profiling import NAME_SETS, judge_diagnoses, synthetic_trace, trace_specs

# --- diagnose --------------------------------------------------------------------------------
# What the exercise's text states, and the hidden case that checks it:
#  1. a phase's time: the "dur" of every CPU range of that name (cat "user_annotation", "ph" "X"),
#     summed over every step of the trace ................................. "steps of different lengths ..."
#     events of another cat named like a phase (python_function, cpu_op) are no ranges .. "exactly `share` ..."
#  2. names match exactly (other ranges may contain a phase's name) ....... "lookalike labels"
#  3. GPU ranges of the same names (cat "gpu_user_annotation") do not count "a GPU trace ..."
#  4. 'stall': the phase taking more than `share` of the phases' total; None when none does:
#     any phase, any names, phases passed in any order ..................... "other names ...", "no stall at all"
#     "more than": a phase at exactly `share` of the total is no stall, two phases at half each neither;
#     a total of 0 (phases that never ran) has no stall ....................... "exactly `share` ..."
#     just either side of `share` (within 0.005: not rounded) ................ "exactly `share` ..."
#     the total is the sum of the phases' times, not the steps' (ProfilerStep#) time, which also
#     holds time in no phase, nor that of ranges not in `phases` ........... "exactly `share` ..."
#  5. `share` other than 0.5, by name or as the third argument ............. "another share"
#  6. 'syncs': the phases in which an op of the four sync names starts (its ts within a range of
#     the phase, ends included), each once, any order; aten::_local_scalar_dense alone counts;
#     cudaStreamSynchronize / cudaDeviceSynchronize count ................ "a GPU trace ...", "other names ..."
#     both ends included: a sync op starting exactly at a range's ts or ts + dur, a range of no
#     duration ........................................................... "where a sync op starts ..."
#     where it starts only (not a next phase it runs on into), on any thread, in any step's range
#     (not only the last), an instant event ("ph" "i") of the name is none .. "where a sync op starts ..."
#     only the four names (cudaEventSynchronize, cudaStreamWaitEvent are none) .. "a GPU trace ..."
#  7. a sync op in no phase (between steps, in a range not in `phases`) is in no phase .. "a read between steps"
#  8. events in any order; events other than "X" (metadata, flows, instants) carry no "dur" .. "shuffled events"
#  9. the events are left unchanged ......................................... every case
# 10. a real torch.profiler trace ........................................... "a real profile ..."

SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize")


def reference_diagnose(events, phases, share=0.5):
    """The text's rule, on the events: (stall, sorted syncs)."""
    ranges = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") in phases]
    totals = {phase: 0.0 for phase in phases}
    for r in ranges:
        totals[r["name"]] += r["dur"]
    whole = sum(totals.values())
    stall = next((phase for phase in phases if totals[phase] > share * whole), None)
    syncs = {r["name"] for op in events if op.get("ph") == "X" and op.get("name") in SYNC_OPS
             for r in ranges if r["ts"] <= op["ts"] <= r["ts"] + r["dur"]}
    return stall, sorted(syncs)


def expected_for(spec):
    return reference_diagnose(synthetic_trace(spec), list(spec["phases"]), spec.get("share", 0.5))


def _label(spec, i, label):
    return f"{spec.get('label') or f'{label}, trace {i + 1}'} (phases {spec['phases']}, share={spec.get('share', 0.5)})"


def judge_specs(label):
    def judge(results, specs):
        return judge_diagnoses(results, [expected_for(s) for s in specs], [_label(s, i, label) for i, s in enumerate(specs)])
    return judge


def observe_specs(ns, specs):
    from gpucourse.checks.lesson11_profiling import observe_diagnoses

    return observe_diagnoses(ns, specs)


def _seed(rng):
    return rng.randrange(2**31)


def _positional(rng, specs):
    for spec in specs:
        if "share" in spec and rng.random() < 0.5:
            spec["positional"] = True
    return specs


def draw_edges(rng):
    """Boundaries, with durations exact in binary floating point: a phase at exactly `share` (0.5, 0.75) of the
    phases' total, two phases at half each, time in no phase inside the steps, phases that never ran (a total of
    0), ranges not in `phases` that would change the total; a phase within 0.005 of `share` on either side;
    events of another category named like a phase."""
    specs = [
        {"label": "a phase at exactly share=0.5",
         "phases": ["load", "fwd", "bwd", "step"], "order": ["load", "fwd", "bwd", "step"], "steps": 3, "seed": _seed(rng),
         "us": {"load": 512.0, "fwd": 256.0, "bwd": 128.0, "step": 128.0}},
        {"label": "a phase at exactly share=0.75",
         "phases": ["opt", "fetch", "model"], "order": ["fetch", "model", "opt"], "steps": 2, "seed": _seed(rng), "share": 0.75,
         "us": {"fetch": 64.0, "model": 768.0, "opt": 192.0}},
        {"label": "two phases at half each",
         "phases": ["a", "b"], "order": ["b", "a"], "steps": rng.randint(1, 4), "seed": _seed(rng),
         "us": {"a": 256.0, "b": 256.0}},
        {"label": "time in no phase: the phases' sum, not the steps' time",
         "phases": ["read", "forward", "backward"], "order": ["read", "forward", "backward"], "steps": 4, "seed": _seed(rng),
         "idle": 4000.0, "us": {"read": 300.0, "forward": 900.0, "backward": 300.0}},
        {"label": "time in no phase, share=0.6",
         "phases": ["h2d", "compute", "apply"], "order": ["h2d", "compute", "apply"], "steps": 2, "seed": _seed(rng),
         "share": 0.6, "idle": 2500.0, "us": {"h2d": 200.0, "compute": 1400.0, "apply": 200.0}},
        # phases that never ran in this trace: every phase's time is 0, so none is a stall (nor a sync)
        {"label": "phases that never ran: a total of 0",
         "phases": ["validate", "export"], "order": ["data", "forward"], "steps": 2, "seed": _seed(rng),
         "syncs": {"forward": "item"}, "us": {"data": 900.0, "forward": 100.0}},
        # ranges of no duration, and a phase that never ran beside one that did
        {"label": "ranges of no duration",
         "phases": ["data", "forward", "log"], "order": ["data", "forward"], "steps": 2, "seed": _seed(rng),
         "us": {"data": 0.0, "forward": 0.0}},
        {"label": "a phase with all the time beside one with none",
         "phases": ["data", "forward", "log"], "order": ["data", "forward"], "steps": 3, "seed": _seed(rng),
         "us": {"data": 10.0, "forward": 0.0}},
        # a label not in `phases` takes most of the step: it is not counted in the total
        {"label": "a label that is not a phase takes most of the step: not in the total",
         "phases": ["forward", "backward"], "order": ["data", "forward", "backward"], "steps": 2, "seed": _seed(rng),
         "us": {"data": 5000.0, "forward": 300.0, "backward": 500.0}},
        # just either side of `share` (within 0.005 of it): "more than" is not "more than, once rounded"
        {"label": "a phase just above share=0.5",
         "phases": ["load", "fwd", "bwd"], "order": ["load", "fwd", "bwd"], "steps": rng.randint(1, 3), "seed": _seed(rng),
         "us": {"load": 504.0, "fwd": 300.0, "bwd": 196.0}},
        {"label": "a phase just below share=0.5",
         "phases": ["load", "fwd", "bwd"], "order": ["load", "fwd", "bwd"], "steps": rng.randint(1, 3), "seed": _seed(rng),
         "us": {"load": 496.0, "fwd": 304.0, "bwd": 200.0}},
        {"label": "a phase just above share=0.75",
         "phases": ["fetch", "model", "opt"], "order": ["fetch", "model", "opt"], "steps": 2, "seed": _seed(rng),
         "share": 0.75, "us": {"fetch": 150.0, "model": 754.0, "opt": 96.0}},
        {"label": "a phase just below share=0.75",
         "phases": ["fetch", "model", "opt"], "order": ["fetch", "model", "opt"], "steps": 2, "seed": _seed(rng),
         "share": 0.75, "us": {"fetch": 150.0, "model": 746.0, "opt": 104.0}},
        # events of another category named like a phase (a Python function, an op) are not its ranges
        {"label": "a Python function named like a phase: not one of its ranges",
         "phases": ["data", "forward"], "order": ["data", "forward"], "steps": 2, "seed": _seed(rng),
         "extra": [{"in": "forward", "name": "forward", "cat": "python_function", "at": 0.05, "dur": 360.0}],
         "us": {"data": 600.0, "forward": 400.0}},
        {"label": "an op named like a phase: not one of its ranges",
         "phases": ["data", "forward", "backward"], "order": ["data", "forward", "backward"], "steps": 2,
         "seed": _seed(rng), "extra": [{"in": "forward", "name": "forward", "cat": "cpu_op", "at": 0.01, "dur": 340.0}],
         "us": {"data": 400.0, "forward": 350.0, "backward": 250.0}},
    ]
    return _positional(rng, specs)


def draw_sync_edges(rng):
    """Sync ops starting exactly at a range's ts or ts + dur (both ends are in), in a range of no duration, at the
    end of the last phase of a step; a sync in a label that is not a phase; an instant event of a sync op's name; a
    sync op running on past its phase's end into the next; one on another thread; one in a single step."""
    specs = [
        {"label": "sync ops at a range's first and last microsecond",
         "phases": ["batch", "model", "grads", "update"], "order": ["batch", "model", "grads", "update"], "steps": 2,
         "seed": _seed(rng), "sync_at": {"model": "start", "update": "end"},
         "us": {"batch": 300.0, "model": 400.0, "grads": 500.0, "update": 200.0}},
        {"label": "a sync op at the end of the last phase",
         "phases": ["fetch", "forward_pass", "opt"], "order": ["forward_pass", "opt", "fetch"], "steps": 3, "seed": _seed(rng),
         "shuffle": True, "sync_at": {"fetch": "end"}, "us": {"fetch": 250.0, "forward_pass": 450.0, "opt": 350.0}},
        {"label": "a sync op at an end of a range of no duration",
         "phases": ["data", "zero", "step"], "order": ["data", "zero", "step"], "steps": 2, "seed": _seed(rng),
         "sync_at": {"zero": rng.choice(["start", "end"])}, "us": {"data": 250.0, "zero": 0.0, "step": 350.0}},
        {"label": "a sync op in a label that is not a phase",
         "phases": ["data", "step"], "order": ["data", "log", "step"], "steps": 2, "seed": _seed(rng),
         "syncs": {"log": rng.choice(["item", "dense"])}, "us": {"data": 250.0, "log": 40.0, "step": 350.0}},
        # an instant event ("ph" "i") named like a sync op is no complete event: it is ignored
        {"label": "an event other than a complete one named aten::item",
         "phases": ["data", "model", "opt"], "order": ["data", "model", "opt"], "steps": 2, "seed": _seed(rng),
         "extra": [{"in": "model", "name": "aten::item", "ph": "i", "cat": "cpu_instant_event"}],
         "us": {"data": 250.0, "model": 400.0, "opt": 300.0}},
        # a sync op is in the phase where it starts, not in the next one it runs on into
        {"label": "a sync op that starts in one phase and runs on into the next",
         "phases": ["data", "model", "opt"], "order": ["data", "model", "opt"], "steps": 2, "seed": _seed(rng),
         "extra": [{"in": "data", "name": rng.choice(["aten::item", "cudaStreamSynchronize"]), "at": 0.95, "dur": 150.0}],
         "us": {"data": 200.0, "model": 300.0, "opt": 200.0}},
        # "whose ts lies within a range": whatever thread it runs on
        {"label": "a sync op on another thread during a phase",
         "phases": ["data", "model", "opt"], "order": ["data", "model", "opt"], "steps": 2, "seed": _seed(rng),
         "extra": [{"in": "model", "name": rng.choice(["cudaStreamSynchronize", "aten::item"]), "thread": 1,
                    "cat": "cuda_runtime"}],
         "us": {"data": 250.0, "model": 400.0, "opt": 300.0}},
        # any range of the phase, in any step: a .item() every few steps
        {"label": "a sync op in one step only, not the last",
         "phases": ["data", "model", "opt"], "order": ["data", "model", "opt"], "steps": 3, "seed": _seed(rng),
         "extra": [{"in": "opt", "name": "aten::item", "step": rng.randrange(2)}],
         "us": {"data": 250.0, "model": 400.0, "opt": 300.0}},
    ]
    return specs


def _drawn(count, **kinds):
    def draw(rng):
        specs = trace_specs(_seed(rng), count, **kinds)
        return _positional(rng, specs) if kinds.get("share") else specs
    return draw


def draw_gpu(rng):
    """A GPU trace whose GPU ranges (of the same names, 50 times the CPU ranges' time, in reverse order) would make
    another phase the stall if they counted, with a CUDA sync; then generated GPU traces."""
    first = {"label": "GPU ranges that would move the stall", "phases": ["c", "a", "b"], "order": ["a", "b", "c"],
             "steps": 2, "seed": _seed(rng), "gpu": True, "syncs": {rng.choice(["a", "b"]): rng.choice(["stream", "device"])},
             "us": {"a": 600.0, "b": 100.0, "c": 100.0}}
    # CUDA calls other than the four sync ops' names do not count (cudaEventSynchronize, cudaStreamWaitEvent)
    others = {"label": "CUDA calls that are not one of the four sync ops", "phases": ["a", "b", "c"],
              "order": ["a", "b", "c"], "steps": 2, "seed": _seed(rng), "gpu": True, "syncs": {"a": "device"},
              "extra": [{"in": "b", "name": "cudaEventSynchronize", "cat": "cuda_runtime"},
                        {"in": "c", "name": "cudaStreamWaitEvent", "cat": "cuda_runtime"}],
              "us": {"a": 300.0, "b": 250.0, "c": 200.0}}
    return [first, others] + trace_specs(_seed(rng), 6, gpu=True, syncs="some")


def draw_share(rng):
    """share=0.8 as the third argument and by name, where the largest phase is above half of the total but not
    above 0.8; then generated traces with other shares, passed either way."""
    fixed = [{"label": f"share=0.8 {how}, the largest phase at 0.65", "phases": ["data", "model", "opt"],
              "order": ["data", "model", "opt"], "steps": 2, "seed": _seed(rng), "share": 0.8, "positional": positional,
              "us": {"data": 650.0, "model": 250.0, "opt": 100.0}}
             for how, positional in (("as the third argument", True), ("by name", False))]
    return fixed + _positional(rng, trace_specs(_seed(rng), 6, share=True))


def draw_real(rng):
    names = list(rng.choice([n for n in NAME_SETS if len(n) == 4]))
    return {"phases": names, "sleep_in": rng.choice(names), "item_in": rng.choice(names)}


def observe_real(ns, plan):
    from gpucourse.checks.lesson11_profiling import observe_real_profile

    return observe_real_profile(ns, sleep_in=plan["sleep_in"], item_in=plan["item_in"], phases=plan["phases"])


def judge_real(results, plan):
    return judge_diagnoses(results, [(plan["sleep_in"], [plan["item_in"]])],
                           [f"a real profile (phases {plan['phases']}: a sleep in {plan['sleep_in']!r}, "
                            f".item() in {plan['item_in']!r})"])


CASES = [
    ("exactly `share` is not more than `share`; time in no phase is not a phase's", draw_edges, "boundaries"),
    ("where a sync op starts (within a range of the phase, both ends included)", draw_sync_edges,
     "sync ops at a range's ends"),
    ("other names, phases passed in another order, the slow phase anywhere", _drawn(8), "other names"),
    ("no stall at all, no sync", _drawn(4, stall="no", syncs="none"), "no stall at all"),
    ("a stall and syncs in the same trace", _drawn(4, stall="yes", syncs="some"), "both problems"),
    ("steps of different lengths (one slow step)", _drawn(6, uneven=True), "steps of different lengths"),
    ("another share", draw_share, "another share"),
    ("a GPU trace (GPU ranges of the same names, CUDA syncs)", draw_gpu, "a GPU trace"),
    ("lookalike labels", _drawn(4, decoys=True), "lookalike labels"),
    ("a read between steps, in no phase", _drawn(4, outside=True), "a read between steps"),
    ("shuffled events", _drawn(6, shuffle=True, syncs="some"), "shuffled events"),
]

HIDDEN = {"diagnose": [Case(name, observe_specs, judge_specs(label), draw=draw) for name, draw, label in CASES]
          + [Case("a real profile of a training loop", observe_real, judge_real, draw=draw_real)]}

PUBLIC = "three small traces: a slow data phase, an .item() in a step, share=0.95"
_D = [c.name for c in HIDDEN["diagnose"]]
CLAUSES = {"diagnose": {
    "events in no particular order; only complete events (ph X) have a dur, the others are ignored": [_D[1], _D[10]],
    "phases in any order, with any names (not necessarily those used in the lesson)": [_D[2], _D[4]],
    "a phase's time: the sum of dur over every CPU range of exactly that name (ph X, cat user_annotation), "
    "over all steps": [PUBLIC, _D[5], _D[2], _D[0]],
    "ranges whose name merely contains a phase's name are other ranges": [_D[8]],
    "gpu_user_annotation ranges of the same names do not count": [_D[7]],
    "stall: the phase whose time is more than share of the sum of the phases' times (not the steps' time)":
        [PUBLIC, _D[0], _D[2], _D[4]],
    "more than: exactly share is no stall; None when no phase is": [_D[0], _D[3]],
    "share other than 0.5 (0.5 <= share < 1), passed by name or position": [PUBLIC, _D[6]],
    "syncs: phases in which an op named aten::item, aten::_local_scalar_dense, cudaStreamSynchronize or "
    "cudaDeviceSynchronize starts": [PUBLIC, _D[4], _D[7], _D[1]],
    "within a range of that phase, from ts to ts + dur, both ends included": [_D[1]],
    "each phase at most once, in any order": [_D[4], _D[2]],
    "a sync op outside every phase's ranges belongs to no phase": [_D[9], _D[1]],
    "judged by the name, not by the duration": [_D[2], _D[11]],
    "returns the dict {'stall': ..., 'syncs': [...]} with exactly these two keys": [PUBLIC, _D[2]],
    "leaves events unchanged": [_D[2], _D[10]],
    "a real torch.profiler trace": [_D[11]],
}}

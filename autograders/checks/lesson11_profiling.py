"""Hidden checks for lesson 11 (profiling). Never released; see lesson01's file for the form.

The traces are built in the sandbox from specs (``gpucourse.checks.lesson11.trace_specs``, seeded);
the expected diagnosis is worked out here, in the grader, from the same specs: which phase was made
slow, and where a sync op was put. The real-profile case knows its answer the same way: it put the
sleep and the ``.item()`` where it says.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson11 import judge_diagnoses, trace_specs

# --- diagnose --------------------------------------------------------------------------------
# What the exercise's text states, and the hidden case that checks it:
#  1. a phase's time: the "dur" of every CPU range of that name (cat "user_annotation", "ph" "X"),
#     summed over every step of the trace ................................. "steps of different lengths ..."
#  2. names match exactly (other ranges may contain a phase's name) ....... "lookalike labels"
#  3. GPU ranges of the same names (cat "gpu_user_annotation") do not count "a GPU trace ..."
#  4. 'stall': the phase taking more than `share` of the phases' total; None when none does:
#     any phase, any names, phases passed in any order ..................... "other names ...", "no stall at all"
#     "more than": a phase at exactly `share` of the total is no stall ...... "exactly `share` ..."
#     the total is the sum of the phases' times, not the steps' (ProfilerStep#) time, which also
#     holds time in no phase ................................................ "time in no phase ..."
#  5. `share` other than 0.5 ................................................ "another share"
#  6. 'syncs': the phases in which an op of the four sync names starts (its ts within a range of
#     the phase, ends included), each once, any order; aten::_local_scalar_dense alone counts;
#     cudaStreamSynchronize / cudaDeviceSynchronize count ................ "a GPU trace ...", "other names ..."
#     both ends included: a sync op starting exactly at a range's ts or ts + dur ..... "at the very start or end ..."
#  7. a sync op in no phase is in no phase ................................. "a read between steps"
#  8. events in any order; events other than "X" (metadata, flows, instants) carry no "dur" .. "shuffled events"
#  9. the events are left unchanged ......................................... every case
# 10. a real torch.profiler trace ........................................... "a real profile ..."


def expected_diagnosis(spec):
    """(stall, syncs) for a spec: the phase whose summed time is above share x the total, the sync phases."""
    totals = {p: (sum(v) if isinstance(v, list) else v * spec["steps"]) for p, v in spec["us"].items() if p in spec["phases"]}
    whole = sum(totals.values())
    share = spec.get("share", 0.5)
    stall = next((p for p, v in totals.items() if v > share * whole), None)
    return stall, sorted(p for p in spec.get("syncs", {}) if p in spec["phases"])


def _judge(seed, count, label, **kinds):
    def judge(results):
        specs = trace_specs(seed, count, **kinds)
        return judge_diagnoses(results, [expected_diagnosis(s) for s in specs],
                               [f"{label}, trace {i + 1}" for i in range(count)])
    return judge


def observe_other_names(ns):
    from gpucourse.checks.lesson11 import observe_diagnoses, trace_specs

    return observe_diagnoses(ns, trace_specs(1101, 8))


def observe_no_stall(ns):
    from gpucourse.checks.lesson11 import observe_diagnoses, trace_specs

    return observe_diagnoses(ns, trace_specs(1102, 4, stall="no", syncs="none"))


def observe_both(ns):
    from gpucourse.checks.lesson11 import observe_diagnoses, trace_specs

    return observe_diagnoses(ns, trace_specs(1103, 4, stall="yes", syncs="some"))


def observe_uneven(ns):
    from gpucourse.checks.lesson11 import observe_diagnoses, trace_specs

    return observe_diagnoses(ns, trace_specs(1104, 6, uneven=True))


def observe_other_share(ns):
    from gpucourse.checks.lesson11 import observe_diagnoses, trace_specs

    return observe_diagnoses(ns, trace_specs(1105, 6, share=True))


def observe_gpu(ns):
    from gpucourse.checks.lesson11 import observe_diagnoses, trace_specs

    return observe_diagnoses(ns, trace_specs(1106, 6, gpu=True, syncs="some"))


def observe_lookalikes(ns):
    from gpucourse.checks.lesson11 import observe_diagnoses, trace_specs

    return observe_diagnoses(ns, trace_specs(1107, 4, decoys=True))


def observe_outside(ns):
    from gpucourse.checks.lesson11 import observe_diagnoses, trace_specs

    return observe_diagnoses(ns, trace_specs(1108, 4, outside=True))


def observe_shuffled(ns):
    from gpucourse.checks.lesson11 import observe_diagnoses, trace_specs

    return observe_diagnoses(ns, trace_specs(1109, 6, shuffle=True, syncs="some"))


def observe_real(ns):
    from gpucourse.checks.lesson11 import observe_real_profile

    return observe_real_profile(ns, sleep_in="model_bwd", item_in="loader", phases=["loader", "model_fwd", "model_bwd", "sgd_step"])


def judge_real(results):
    return judge_diagnoses(results, [("model_bwd", ["loader"])], ["a real profile (sleep in one phase, .item() in another)"])


# Boundaries, with durations that are exact in binary floating point, so that "exactly" is exact:
# a phase at exactly `share` of the phases' total (0.5 and 0.75), and a trace whose steps spend most of their
# time in no phase (the slow phase is above `share` of the phases' sum, below it of the steps' time).
EDGE_SPECS = [
    {"phases": ["load", "fwd", "bwd", "step"], "order": ["load", "fwd", "bwd", "step"], "steps": 3, "seed": 7,
     "us": {"load": 512.0, "fwd": 256.0, "bwd": 128.0, "step": 128.0}},
    {"phases": ["opt", "fetch", "model"], "order": ["fetch", "model", "opt"], "steps": 2, "seed": 8, "share": 0.75,
     "us": {"fetch": 64.0, "model": 768.0, "opt": 192.0}},
    {"phases": ["read", "forward", "backward"], "order": ["read", "forward", "backward"], "steps": 4, "seed": 9,
     "idle": 4000.0, "us": {"read": 300.0, "forward": 900.0, "backward": 300.0}},
    {"phases": ["h2d", "compute", "apply"], "order": ["h2d", "compute", "apply"], "steps": 2, "seed": 10, "share": 0.6,
     "idle": 2500.0, "us": {"h2d": 200.0, "compute": 1400.0, "apply": 200.0}},
]
EDGE_LABELS = ["a phase at exactly share=0.5", "a phase at exactly share=0.75",
               "time in no phase: the phases' sum, not the steps' time", "time in no phase, share=0.6"]
SYNC_EDGE_SPECS = [
    {"phases": ["batch", "model", "grads", "update"], "order": ["batch", "model", "grads", "update"], "steps": 2,
     "seed": 11, "sync_at": {"model": "start", "update": "end"},
     "us": {"batch": 300.0, "model": 400.0, "grads": 500.0, "update": 200.0}},
    {"phases": ["fetch", "forward_pass", "opt"], "order": ["forward_pass", "opt", "fetch"], "steps": 3, "seed": 12,
     "shuffle": True, "sync_at": {"fetch": "end"}, "us": {"fetch": 250.0, "forward_pass": 450.0, "opt": 350.0}},
]
SYNC_EDGE_LABELS = ["sync ops at a range's first and last microsecond", "a sync op at the end of the last phase"]


def observe_edges(ns):
    from gpucourse.checks.lesson11 import observe_diagnoses

    return observe_diagnoses(ns, [
        {"phases": ["load", "fwd", "bwd", "step"], "order": ["load", "fwd", "bwd", "step"], "steps": 3, "seed": 7,
         "us": {"load": 512.0, "fwd": 256.0, "bwd": 128.0, "step": 128.0}},
        {"phases": ["opt", "fetch", "model"], "order": ["fetch", "model", "opt"], "steps": 2, "seed": 8, "share": 0.75,
         "us": {"fetch": 64.0, "model": 768.0, "opt": 192.0}},
        {"phases": ["read", "forward", "backward"], "order": ["read", "forward", "backward"], "steps": 4, "seed": 9,
         "idle": 4000.0, "us": {"read": 300.0, "forward": 900.0, "backward": 300.0}},
        {"phases": ["h2d", "compute", "apply"], "order": ["h2d", "compute", "apply"], "steps": 2, "seed": 10, "share": 0.6,
         "idle": 2500.0, "us": {"h2d": 200.0, "compute": 1400.0, "apply": 200.0}},
    ])


def observe_sync_edges(ns):
    from gpucourse.checks.lesson11 import observe_diagnoses

    return observe_diagnoses(ns, [
        {"phases": ["batch", "model", "grads", "update"], "order": ["batch", "model", "grads", "update"], "steps": 2,
         "seed": 11, "sync_at": {"model": "start", "update": "end"},
         "us": {"batch": 300.0, "model": 400.0, "grads": 500.0, "update": 200.0}},
        {"phases": ["fetch", "forward_pass", "opt"], "order": ["forward_pass", "opt", "fetch"], "steps": 3, "seed": 12,
         "shuffle": True, "sync_at": {"fetch": "end"}, "us": {"fetch": 250.0, "forward_pass": 450.0, "opt": 350.0}},
    ])


def _expected_with_edges(spec):
    stall, syncs = expected_diagnosis(spec)
    return stall, sorted(set(syncs) | set(spec.get("sync_at", {})))


HIDDEN = {"diagnose": [
    Case("exactly `share` is not more than `share`; time in no phase is not a phase's", observe_edges,
         lambda results: judge_diagnoses(results, [expected_diagnosis(s) for s in EDGE_SPECS], EDGE_LABELS)),
    Case("sync ops at the very start or end of a range (both ends included)", observe_sync_edges,
         lambda results: judge_diagnoses(results, [_expected_with_edges(s) for s in SYNC_EDGE_SPECS], SYNC_EDGE_LABELS)),
    Case("other names, phases passed in another order, the slow phase anywhere", observe_other_names,
         _judge(1101, 8, "other names")),
    Case("no stall at all, no sync", observe_no_stall, _judge(1102, 4, "no stall at all", stall="no", syncs="none")),
    Case("a stall and syncs in the same trace", observe_both, _judge(1103, 4, "both problems", stall="yes", syncs="some")),
    Case("steps of different lengths (one slow step)", observe_uneven, _judge(1104, 6, "steps of different lengths", uneven=True)),
    Case("another share", observe_other_share, _judge(1105, 6, "another share", share=True)),
    Case("a GPU trace (GPU ranges of the same names, CUDA syncs)", observe_gpu,
         _judge(1106, 6, "a GPU trace", gpu=True, syncs="some")),
    Case("lookalike labels", observe_lookalikes, _judge(1107, 4, "lookalike labels", decoys=True)),
    Case("a read between steps, in no phase", observe_outside, _judge(1108, 4, "a read between steps", outside=True)),
    Case("shuffled events", observe_shuffled, _judge(1109, 6, "shuffled events", shuffle=True, syncs="some")),
    Case("a real profile of a training loop", observe_real, judge_real),
]}

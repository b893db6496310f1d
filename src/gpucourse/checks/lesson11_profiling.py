"""Public checks for lesson 11 (profiling). Observers are self-contained: see lesson01_processes_threads.py.

``diagnose`` is called on traces shaped like the ones ``torch.profiler``'s ``export_chrome_trace``
writes (the ``"traceEvents"`` list): ``synthetic_trace`` builds one from a *spec*, plain data saying
which phases a training step has, in which order they run, how long each takes (µs), where a host
synchronisation happens and what else the trace holds (GPU ranges, flow and metadata events,
lookalike labels, shuffled order). The spec travels as plain data, so the same trace is rebuilt
wherever it is needed and the expected diagnosis follows from the spec, never from the events.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson11_profiling"  # the course folder this module's exercises belong to

SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize")


# --- Exercise 1: diagnose ------------------------------------------------------------------

def synthetic_trace(spec: dict) -> list[dict]:
    """The ``traceEvents`` of a profiled loop, built from ``spec`` (plain data; see the module's docstring).

    Keys: ``order`` (the labels of one step, in the order they run), ``us`` (label -> µs per step, a
    number or one number per step), ``steps``; optional: ``syncs`` (label -> "item", "dense", "stream"
    or "device": which sync op runs inside that label's range), ``outside`` (an ``aten::item`` between
    two steps, in no label), ``gpu`` (GPU ranges of the same names and kernels, as a CUDA run has),
    ``decoys`` (CPU ranges whose names contain a label's name), ``shuffle`` (events in random order),
    ``seed``, ``idle`` (µs per step spent in no phase, inside the step's ``ProfilerStep#`` range),
    ``sync_at`` (label -> "start" or "end": an ``aten::item`` exactly at that end of the label's ranges),
    ``extra`` (further events inside a label's ranges, a list of dicts: ``in`` (the label), ``name``; optional
    ``cat`` ("cpu_op"), ``ph`` ("X"; "i" an instant event, which has no ``dur``), ``at`` (where it starts, as a
    fraction of the range: 0.5), ``dur`` (µs: 1.0), ``thread`` (added to the tid: 0), ``step`` (in that step only)).
    ``phases`` (what ``diagnose`` is given: may name labels that never run, and leave out labels that do),
    ``share`` and ``positional`` (share passed as the third argument, not by name) say how it is called.
    """
    import random

    rng = random.Random(spec.get("seed", 0))
    pid, tid = 4242, 4242
    t = 1_700_000_000_000.0 + rng.randint(0, 10**6) + 0.25
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "ts": t, "pid": pid, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "ts": t, "pid": pid, "tid": tid, "args": {"name": "thread 1 (python)"}},
        {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": t},
    ]
    syncs = spec.get("syncs", {})
    gpu_t = t + 50.0
    flow = 0

    def op(name, start, dur, cat="cpu_op"):
        events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": start, "dur": dur,
                       "args": {"External id": len(events), "Record function id": 0}})

    def per_step(label, step):
        value = spec["us"][label]
        return float(value[step] if isinstance(value, list) else value)

    for step in range(spec["steps"]):
        t += 20.0 + rng.randint(0, 40)
        step_start = t
        for label in spec["order"]:
            dur = per_step(label, step)
            start = t
            events.append({"ph": "X", "cat": "user_annotation", "name": label, "pid": pid, "tid": tid,
                           "ts": start, "dur": dur, "args": {"External id": len(events)}})
            # ops inside the range: a few small ones, and the sync op (if any) in the middle
            op("aten::empty", start + 0.1 * dur, 0.05 * dur)
            op("aten::linear", start + 0.2 * dur, 0.1 * dur)
            if spec.get("decoys"):
                events.append({"ph": "X", "cat": "user_annotation", "name": f"{label}#inner", "pid": pid, "tid": tid,
                               "ts": start + 0.4 * dur, "dur": 0.5 * dur, "args": {}})
                events.append({"ph": "X", "cat": "user_annotation", "name": f"Optimizer.step#SGD.{label}", "pid": pid,
                               "tid": tid, "ts": start + 0.41 * dur, "dur": 0.48 * dur, "args": {}})
            edge = spec.get("sync_at", {}).get(label)
            if edge is not None:  # a sync op starting exactly at an end of the range: both ends are inside it
                op("aten::item", start if edge == "start" else start + dur, 1.0)
            for more in spec.get("extra", ()):
                if more["in"] == label and more.get("step", step) == step:
                    event = {"ph": more.get("ph", "X"), "cat": more.get("cat", "cpu_op"), "name": more["name"], "pid": pid,
                             "tid": tid + more.get("thread", 0), "ts": start + more.get("at", 0.5) * dur,
                             "args": {"External id": len(events)}}
                    if event["ph"] == "X":
                        event["dur"] = float(more.get("dur", 1.0))
                    elif event["ph"] == "i":
                        event["s"] = "t"
                    events.append(event)
            kind = syncs.get(label)
            middle = start + 0.6 * dur
            if kind == "item":
                op("aten::item", middle, 0.02 * dur)
                op("aten::_local_scalar_dense", middle + 0.002 * dur, 0.01 * dur)
            elif kind == "dense":
                op("aten::_local_scalar_dense", middle, 0.01 * dur)
            elif kind == "stream":
                op("aten::to", middle - 0.01 * dur, 0.04 * dur)
                op("cudaMemcpyAsync", middle, 0.01 * dur, cat="cuda_runtime")
                op("cudaStreamSynchronize", middle + 0.011 * dur, 0.02 * dur, cat="cuda_runtime")
            elif kind == "device":
                op("cudaDeviceSynchronize", middle, 0.02 * dur, cat="cuda_runtime")
            if spec.get("gpu"):
                op("cudaLaunchKernel", start + 0.8 * dur, 0.01 * dur, cat="cuda_runtime")
                # the GPU runs the phase's kernels later, for its own time: 50x the CPU range's, reversed
                gpu_dur = 50.0 * per_step(spec["order"][-1 - spec["order"].index(label)], step)
                gpu_t = max(gpu_t, start + 0.8 * dur)
                events.append({"ph": "X", "cat": "gpu_user_annotation", "name": label, "pid": 0, "tid": 7,
                               "ts": gpu_t, "dur": gpu_dur, "args": {}})
                events.append({"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float>", "pid": 0, "tid": 7,
                               "ts": gpu_t + 1.0, "dur": gpu_dur - 2.0, "args": {}})
                gpu_t += gpu_dur + 1.0
            if label == spec["order"][0]:
                flow += 1
                events.append({"ph": "s", "id": flow, "pid": pid, "tid": tid, "ts": start + 0.3 * dur, "cat": "fwdbwd", "name": "fwdbwd"})
            elif label == spec["order"][-1]:
                events.append({"ph": "f", "id": flow, "pid": pid, "tid": tid, "ts": start + 0.3 * dur, "cat": "fwdbwd",
                               "name": "fwdbwd", "bp": "e"})
            t = start + dur + 3.0 + rng.randint(0, 5)
        t += float(spec.get("idle", 0.0))  # time in the step but in no phase (not part of the phases' sum)
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + 2}", "pid": pid, "tid": tid,
                       "ts": step_start - 1.0, "dur": t - step_start + 1.0, "args": {}})
        if spec.get("decoys"):  # a long range on another thread whose name contains the shortest phase's
            shortest = min(spec["order"], key=lambda label: per_step(label, step))
            events.append({"ph": "X", "cat": "user_annotation", "name": f"{shortest}#prefetch", "pid": pid,
                           "tid": tid + 1, "ts": step_start, "dur": 3.0 * (t - step_start), "args": {}})
        if spec.get("outside") and step == 0:  # a read between two steps: a sync, but in no phase
            t += 5.0
            op("aten::item", t, 4.0)
            op("aten::_local_scalar_dense", t + 1.0, 2.0)
            t += 10.0
    events.append({"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": t + 100.0})
    if spec.get("shuffle"):
        rng.shuffle(events)
    return events


def observe_diagnoses(ns, specs):
    """Call ``ns["diagnose"]`` on each spec's trace; record what came back, as plain data."""
    import copy

    from gpucourse.checks import answer
    from gpucourse.checks.lesson11_profiling import synthetic_trace

    diagnose = answer(ns, "diagnose")
    results = []
    for spec in specs:
        events = synthetic_trace(spec)
        before = copy.deepcopy(events)
        try:
            if "share" in spec and spec.get("positional"):
                got = diagnose(events, list(spec["phases"]), spec["share"])
            elif "share" in spec:
                got = diagnose(events, list(spec["phases"]), share=spec["share"])
            else:
                got = diagnose(events, list(spec["phases"]))
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - reported by name: the judge says which case raised it
            results.append({"error": f"{type(error).__name__}: {str(error)[:200]}"})
            continue
        results.append(describe_diagnosis(got, events == before))
    return results


def describe_diagnosis(got, untouched=True) -> dict:
    """A diagnosis as plain data: its type, keys, ``stall`` and ``syncs`` (sorted), and whether the events were left as they were."""
    out = {"type": type(got).__name__, "untouched": bool(untouched)}
    if not isinstance(got, dict):
        return out
    out["keys"] = sorted(str(k) for k in got)
    stall = got.get("stall")
    # a str subclass (numpy.str_, ...) is read as the text it holds (str.__str__: not an override); any other type by its name
    out["stall"] = stall if stall is None else str.__str__(stall) if isinstance(stall, str) else f"<{type(stall).__name__}>"
    syncs = got.get("syncs")
    if isinstance(syncs, (list, tuple, set, frozenset)):
        items = list(syncs)
        out["syncs_type"] = type(syncs).__name__
        out["syncs"] = sorted(str.__str__(s) if isinstance(s, str) else f"<{type(s).__name__}>" for s in items)
        out["syncs_repeated"] = len(set(map(str, items))) != len(items)
    else:
        out["syncs_type"] = type(syncs).__name__
    return out


def judge_diagnoses(results, expected, labels) -> str | None:
    """Compare recorded diagnoses with expected ``(stall, syncs)`` pairs; ``labels`` name the cases in messages."""
    if len(results) != len(expected):
        return f"expected {len(expected)} diagnoses, got {len(results)}"
    for got, (stall, syncs), label in zip(results, expected, labels):
        if "error" in got:
            return f"{label}: raised {got['error']}"
        if got["type"] != "dict":
            return f"{label}: return a dict with the keys 'stall' and 'syncs', not a {got['type']}"
        if got["keys"] != ["stall", "syncs"]:
            return f"{label}: the dict's keys must be exactly 'stall' and 'syncs', got {got['keys']}"
        if "syncs" not in got:
            return f"{label}: 'syncs' must be a list (or set) of phase names, not a {got['syncs_type']}"
        if not got["untouched"]:
            return f"{label}: the events were modified: leave them as they were"
        if got["stall"] != stall:
            if stall is None:
                return f"{label}: 'stall' is {got['stall']!r}, but no phase takes more than `share` of the phases' time here"
            if got["stall"] is None:
                return f"{label}: 'stall' is None, but one phase takes more than `share` of the phases' time here"
            return f"{label}: 'stall' is {got['stall']!r}, which is not the phase that takes more than `share` of the time"
        if got["syncs_repeated"]:
            return f"{label}: 'syncs' names a phase more than once: each phase once"
        if got["syncs"] != sorted(syncs):
            missing, extra = sorted(set(syncs) - set(got["syncs"])), sorted(set(got["syncs"]) - set(syncs))
            if extra:
                return f"{label}: 'syncs' names {extra}, in which no sync op starts"
            return f"{label}: 'syncs' misses {len(missing)} phase(s) in which a sync op starts"
    return None


STEP = ["data", "forward", "backward", "optimizer"]
PUBLIC_SPECS = [
    # a slow Dataset: the data phase takes most of each step; no sync
    {"phases": STEP, "order": STEP, "steps": 3, "seed": 1,
     "us": {"data": 9000.0, "forward": 400.0, "backward": 800.0, "optimizer": 150.0}},
    # a loss.item() in the optimizer phase, nothing slow
    {"phases": STEP, "order": STEP, "steps": 3, "seed": 2, "syncs": {"optimizer": "item"},
     "us": {"data": 300.0, "forward": 400.0, "backward": 800.0, "optimizer": 150.0}},
    # the same trace as the first, with share=0.95: data's share (about 87%) is not above it
    {"phases": STEP, "order": STEP, "steps": 3, "seed": 1, "share": 0.95,
     "us": {"data": 9000.0, "forward": 400.0, "backward": 800.0, "optimizer": 150.0}},
]
PUBLIC_EXPECTED = [("data", []), (None, ["optimizer"]), (None, [])]
PUBLIC_LABELS = ["a slow data phase", "an .item() in the optimizer phase", "a slow data phase with share=0.95"]


def observe_public_diagnoses(ns):
    from gpucourse.checks.lesson11_profiling import PUBLIC_SPECS, observe_diagnoses

    return observe_diagnoses(ns, PUBLIC_SPECS)


register("diagnose",
         Case("three small traces: a slow data phase, an .item() in a step, share=0.95", observe_public_diagnoses,
              lambda d: judge_diagnoses(d, PUBLIC_EXPECTED, PUBLIC_LABELS)),
         answers=[Answer("diagnose", "function",
                         "a function diagnose(events, phases, share=0.5) returning a dict with the keys "
                         "'stall' (a phase name or None) and 'syncs' (a list of phase names)")],
         points=3)


NAME_SETS = [["load", "fwd", "bwd", "step"], ["batch", "model", "grads", "update", "log"],
             ["fetch", "forward_pass", "backward_pass", "opt"], ["data", "forward", "backward", "optimizer"],
             ["h2d", "compute", "apply"], ["read", "augment", "forward", "backward", "optimizer_step"]]


def trace_specs(seed: int, count: int, *, stall: str = "random", gpu: bool = False, shuffle: bool = False,
                decoys: bool = False, outside: bool = False, uneven: bool = False, share: bool = False,
                syncs: str = "random") -> list[dict]:
    """``count`` random specs for ``synthetic_trace``, as plain data: other phase names (3 to 5 phases), the
    phases passed in another order than they run, durations that differ from step to step (``uneven``:
    the slow phase slow in one step only), the slow phase anywhere (``stall``: "yes", "no" or "random"),
    sync ops of every kind in 0 to 2 phases (``syncs``: "random", "none" or "some"), a ``share`` other
    than 0.5 (``share=True``). Whichever phase is largest, its share of the phases' total time is at least
    0.06 away from the threshold.
    """
    import random

    rng = random.Random(seed)
    specs = []
    for _ in range(count):
        order = list(rng.choice(NAME_SETS))
        phases = rng.sample(order, len(order))
        steps = rng.randint(2, 5)
        threshold = round(rng.uniform(0.6, 0.9), 2) if share else 0.5
        slow = rng.random() < 0.5 if stall == "random" else stall == "yes"
        base = {p: rng.uniform(100.0, 1000.0) for p in order}
        total = sum(base.values())
        if slow:
            culprit = rng.choice(order)
            others = total - base[culprit]
            target = rng.uniform(threshold + 0.06, 0.98)
            base[culprit] = target / (1 - target) * others
        elif share and threshold >= 0.64:  # the largest phase above half, but not above `share`
            culprit = rng.choice(order)
            others = total - base[culprit]
            target = rng.uniform(0.56, threshold - 0.06)
            base[culprit] = target / (1 - target) * others
        else:  # keep the largest share at most threshold - 0.07, whatever the other durations
            while max(base.values()) > (threshold - 0.07) * sum(base.values()):
                largest = max(base, key=base.get)
                base[largest] *= 0.8
        us = {}
        for p in order:
            per_step = base[p] * steps
            if uneven and slow and p == culprit:
                first = rng.randrange(steps)  # one slow step (a cold cache, a slow file) carries most of it
                values = [per_step * 0.05 / max(steps - 1, 1)] * steps
                values[first] = per_step - sum(v for i, v in enumerate(values) if i != first)
                us[p] = [round(v, 3) for v in values]
            elif uneven:
                weights = [rng.uniform(0.6, 1.4) for _ in range(steps)]
                us[p] = [round(per_step * w / sum(weights), 3) for w in weights]
            else:
                us[p] = round(base[p], 3)
        kinds = ["item", "dense"] + (["stream", "device"] if gpu else [])
        n_syncs = {"none": 0, "some": rng.randint(1, 2)}.get(syncs, rng.randint(0, 2))
        spec = {"phases": phases, "order": order, "steps": steps, "seed": rng.randint(0, 10**6), "us": us,
                "syncs": {p: rng.choice(kinds) for p in rng.sample(order, n_syncs)}}
        if share:
            spec["share"] = threshold
        for flag, on in (("gpu", gpu), ("shuffle", shuffle), ("decoys", decoys), ("outside", outside)):
            if on:
                spec[flag] = True
        specs.append(spec)
    return specs


def observe_real_profile(ns, sleep_in: str, item_in: str, phases: list, seconds: float = 0.04):
    """Profile a real tiny training loop with torch.profiler (CPU): ``time.sleep(seconds)`` inside the
    range ``sleep_in``, a ``loss.item()`` inside ``item_in``; call ``diagnose`` on the exported trace."""
    import json
    import os
    import tempfile
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from gpucourse.checks import answer
    from gpucourse.checks.lesson11_profiling import describe_diagnosis

    diagnose = answer(ns, "diagnose")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    loss = None
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2)) as prof:
        for _ in range(4):
            for name in phases:
                with record_function(name):
                    if name == sleep_in:
                        time.sleep(seconds)
                    if name == phases[1]:
                        loss = torch.nn.functional.mse_loss(model(x), y)
                    elif name == phases[2]:
                        optimizer.zero_grad()
                        loss.backward()
                    elif name == phases[3]:
                        optimizer.step()
                    if name == item_in and loss is not None:
                        loss.item()
            prof.step()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return [describe_diagnosis(diagnose(events, list(phases)))]

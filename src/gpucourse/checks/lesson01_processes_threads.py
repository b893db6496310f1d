"""Public checks for lesson 1 (processes, threads and the GIL).

Every ``observe_*`` function is self-contained (its imports inside) because the grader sends its
source into the sandbox; judges stay with the grader. The grader adds hidden cases of the same form.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, Script, register
from gpucourse.checks.ddp import judge_script_ran

ASSIGNMENT = "lesson01_processes_threads"  # the course folder this module's exercises belong to


# --- Exercise 1: parallel_map -------------------------------------------------------------

def observe_squares_io(ns):
    from gpucourse.checks import answer
    from gpucourse.processes_threads import square
    return answer(ns, "parallel_map")(square, [1, 2, 3], "io")


def observe_squares_cpu(ns):
    from gpucourse.checks import answer
    from gpucourse.processes_threads import square
    return answer(ns, "parallel_map")(square, [1, 2, 3], "cpu")


def observe_cpu_pids(ns):
    import os
    from gpucourse.checks import answer
    from gpucourse.processes_threads import worker_identity
    return {"me": os.getpid(), "pids": [pid for _, pid, _ in answer(ns, "parallel_map")(worker_identity, range(6), "cpu", workers=2)]}


def _judge_cpu_pids(d):
    if len(d["pids"]) != 6 or not all(isinstance(p, int) for p in d["pids"]):
        return "expected one result per item, each (x, pid, thread)"
    return None if d["me"] not in d["pids"] else "ran in this process: use processes for GIL-bound work"


register(
    "parallel_map",
    Case("kind='io' returns [fn(x) for x in items]", observe_squares_io,
         lambda d: None if d == [1, 4, 9] else f"expected [1, 4, 9], got {d}"),
    Case("kind='cpu' returns [fn(x) for x in items]", observe_squares_cpu,
         lambda d: None if d == [1, 4, 9] else f"expected [1, 4, 9], got {d}"),
    Case("kind='cpu' runs in other processes", observe_cpu_pids, _judge_cpu_pids),
    answers=[Answer("parallel_map", "function",
                    'a function parallel_map(fn, items, kind, workers=None) returning the list [fn(x) for x in items], '
                    'in order; kind is "cpu" or "io"')],
    points=2,
)


# --- Exercise 2: LinesDataset -------------------------------------------------------------

def observe_small_file(ns):
    import pickle
    import tempfile
    from pathlib import Path

    import torch
    from gpucourse.checks import answer
    from gpucourse.processes_threads import write_int_lines

    path = write_int_lines(Path(tempfile.mkdtemp()) / "ints.txt", [7, -2, 40, 5])
    dataset = answer(ns, "LinesDataset")(path)
    first = dataset[0]
    copy = pickle.loads(pickle.dumps(dataset))
    return {
        "len": len(dataset),
        "first_type": f"{type(first).__module__}.{type(first).__qualname__}",
        "first": int(first) if type(first) is torch.Tensor else None,
        "copy": [int(copy[i]) for i in range(4)],
    }


def _judge_small_file(d):
    if d["len"] != 4:
        return f"len should be 4, got {d['len']}"
    if d["first_type"] != "torch.Tensor" or d["first"] != 7:
        return f"ds[0] should be tensor(7), got a {d['first_type']}"
    if d["copy"] != [7, -2, 40, 5]:
        return f"the unpickled dataset gives {d['copy']}"
    return None


register("lines_dataset", Case("len, ds[0] and a pickle round trip", observe_small_file, _judge_small_file),
         answers=[Answer("LinesDataset", "class",
                         "a torch Dataset class: LinesDataset(path) over a text file of one integer per line, "
                         "ds[i] a tensor holding line i")], points=2)


# --- Exercise 3: choosing the tool --------------------------------------------------------

def observe_choices(ns):
    from gpucourse.checks import answer
    choices = answer(ns, "choices")
    return {str(k): str(v).strip().lower() for k, v in choices.items()}


def _judge_choices_form(d):
    if set(d) != set("abcdef"):
        return f"answer exactly the keys a-f, got {sorted(d)}"
    unknown = {k: v for k, v in d.items() if v not in {"serial", "threads", "processes", "asyncio"}}
    return f"unknown tools {unknown}; use serial, threads, processes or asyncio" if unknown else None


register("choose_tools", Case("one known tool for each of a-f", observe_choices, _judge_choices_form),
         answers=[Answer("choices", "dict",
                         'a dict from each workload key "a", "b", "c", "d", "e", "f" to one tool, a str: '
                         '"serial", "threads", "processes" or "asyncio"')], points=2, kind="answer",
         choices=lambda solution: {k: ["serial", "threads", "processes", "asyncio"] for k in solution})


# (Exercise 4, explaining a measurement, is a markdown answer graded by hand: nothing to declare.)


# --- Exercise 5: processes that talk (run as a 2-process script) --------------------------

def drive_average_across_ranks(ns, inputs=None):
    """Each rank's part (run by ddp_harness under torchrun): shards for two sizes and one average; with
    ``inputs`` (a check's generated ``{"shards": [[n, rank, world_size], ...], "tensors": [{"dtype",
    "shape", "values": {rank: flat list}}, ...]}``) also ``shard_indices`` on each triple and one
    average per tensor, each recorded with what it returned or raised. Where one rank's call raised, every
    rank stops after that tensor (``ddp.settle``): its peers do not wait out the collective timeout."""
    import numbers

    import torch
    import torch.distributed as dist
    from gpucourse.checks.ddp import leave, settle
    from gpucourse.checks.ddp_harness import init_process_group

    device = init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    shards = {str(n): [int(i) for i in ns["shard_indices"](n, rank, world)] for n in (10, 7)}
    x = torch.tensor([rank + 1.0, 10.0 * rank], device=device)
    before = x.clone()
    average = ns["average_across_ranks"](x)
    record = {
        "rank": rank,
        "world_size": world,
        "shards": shards,
        "average": [float(v) for v in torch.as_tensor(average).detach().cpu().reshape(-1).tolist()],
        "input_unchanged": bool(torch.equal(x, before)),
    }
    if inputs is not None:
        calls = []
        for n, r, w in inputs["shards"]:
            try:
                got = ns["shard_indices"](n, r, w)
                items = list(got)
                calls.append({"args": [n, r, w], "type": type(got).__name__, "is_list": isinstance(got, list),
                              "ints": all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in items),
                              "indices": [int(i) for i in items]})
            except Exception as error:  # one bad call is reported, the other calls still run
                calls.append({"args": [n, r, w], "error": f"{type(error).__name__}: {error}"[:200]})
        averages = []
        for spec in inputs["tensors"]:
            t = torch.tensor(spec["values"][str(rank)], dtype=getattr(torch, spec["dtype"])).reshape(spec["shape"]).to(device)
            kept = t.clone()
            try:
                out = ns["average_across_ranks"](t)
                averages.append({"is_tensor": isinstance(out, torch.Tensor), "same_object": out is t,
                                 "shape": list(torch.as_tensor(out).shape),
                                 "values": [float(v) for v in torch.as_tensor(out).detach().cpu().reshape(-1).tolist()],
                                 "input_unchanged": bool(torch.equal(t, kept))})
            except Exception as error:
                averages.append({"error": f"{type(error).__name__}: {error}"[:200]})
            if not settle("error" in averages[-1]):  # a rank raised: every rank stops here, at once
                break
        record["generated"] = {"shards": calls, "averages": averages}
    settle(False)
    leave()
    return record


def observe_ranks(ns):
    from gpucourse.checks.ddp import run_exercise_script
    return run_exercise_script(ns, "average_across_ranks")


def _judge_ranks_agree(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    ranks = d["ranks"]
    if ranks["0"]["average"] != ranks["1"]["average"]:
        return f"ranks disagree: {ranks['0']['average']} vs {ranks['1']['average']}"
    # the driver's inputs, known here: ranks hold [1, 0] and [2, 10]; shards of 10 and 7 items
    average = ranks["0"]["average"]
    if len(average) != 2 or not abs(average[0] - 1.5) <= 1e-4 or not abs(average[1] - 5.0) <= 1e-4:
        return f"the average of [1, 0] and [2, 10] came out as {average}"
    for n in ("10", "7"):
        together = sorted(i for r in ("0", "1") for i in ranks[r]["shards"][n])
        if together != list(range(int(n))):
            return f"with n={n} the ranks' shards do not cover each index exactly once"
    return None


register("average_across_ranks", Case("both ranks finish and agree", observe_ranks, _judge_ranks_agree),
         answers=[Answer("shard_indices", "function",
                         "a function shard_indices(n, rank, world_size) returning the list of indices (ints) this rank handles"),
                  Answer("average_across_ranks", "function",
                         "a function average_across_ranks(tensor) returning a new tensor, the element-wise mean over all ranks")],
         points=2, kind=Script(("shard_indices", "average_across_ranks"),
                               driver="gpucourse.checks.lesson01_processes_threads:drive_average_across_ranks"))

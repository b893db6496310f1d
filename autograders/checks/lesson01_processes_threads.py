"""Hidden checks for lesson 1. Never released, never readable from the sandbox.

``HIDDEN`` adds cases to the exercises gpucourse.checks.lesson01 declares; the grader runs an
exercise's public cases and the hidden ones below, and gives its test cell the declared points only
when every case passes. Observers are self-contained (imports inside): their
source is sent into the sandbox. Judges see plain data only and say what is wrong in words that
do not give the answer away.
"""

from gpucourse.checks import Case
from gpucourse.checks.ddp import judge_script_ran
from gpucourse.checks.lesson01 import observe_choices, observe_ranks  # same observations, stricter judges



# --- parallel_map -------------------------------------------------------------------------

def observe_io_identities(ns):
    import os
    import threading
    from gpucourse.checks import answer
    from gpucourse.parallel import worker_identity
    rows = answer(ns, "parallel_map")(worker_identity, range(8), "io", workers=4)
    return {"me": os.getpid(), "main_thread": threading.get_ident(),
            "xs": [x for x, _, _ in rows], "pids": [p for _, p, _ in rows], "threads": [t for _, _, t in rows]}


def judge_io_identities(d):
    if d["xs"] != list(range(8)):
        return "kind='io': results out of order"
    if set(d["pids"]) != {d["me"]}:
        return "kind='io' left this process: waiting needs threads, not processes"
    if d["main_thread"] in d["threads"]:
        return "kind='io' ran in the calling thread"
    if not 2 <= len(set(d["threads"])) <= 4:
        return f"kind='io' with workers=4 used {len(set(d['threads']))} thread(s)"
    return None


def observe_cpu_worker_count(ns):
    from gpucourse.checks import answer
    from gpucourse.parallel import worker_identity
    return sorted({pid for _, pid, _ in answer(ns, "parallel_map")(worker_identity, range(8), "cpu", workers=2)})


def observe_completion_order(ns):
    from gpucourse.checks import answer
    from gpucourse.parallel import sleep_then_return
    late_first = [(i, 0.3 if i == 0 else 0.0) for i in range(6)]
    return {kind: answer(ns, "parallel_map")(sleep_then_return, late_first, kind, workers=3) for kind in ("io", "cpu")}


def observe_empty_and_bad_kinds(ns):
    from gpucourse.checks import answer
    from gpucourse.parallel import square
    result = {"empty": [answer(ns, "parallel_map")(square, [], "cpu"), answer(ns, "parallel_map")(square, [], "io")]}
    for bad in ["gpu", "CPU ", None]:
        try:
            answer(ns, "parallel_map")(square, [1], bad)
            result[repr(bad)] = "no error"
        except ValueError:
            result[repr(bad)] = "ValueError"
        except Exception as error:
            result[repr(bad)] = type(error).__name__
    return result


def judge_empty_and_bad_kinds(d):
    if d["empty"] != [[], []]:
        return "an empty list of items must give []"
    wrong = {k: v for k, v in d.items() if k != "empty" and v != "ValueError"}
    return f"unknown kinds must raise ValueError: {wrong}" if wrong else None


# --- LinesDataset -------------------------------------------------------------------------

def observe_dataset_everywhere(ns):
    import tempfile
    from pathlib import Path

    import torch
    from torch.utils.data import DataLoader
    from gpucourse.checks import answer
    from gpucourse.parallel import write_int_lines

    values = list(range(-5, 20, 2))
    dataset = answer(ns, "LinesDataset")(write_int_lines(Path(tempfile.mkdtemp()) / "more.txt", values))
    items = [dataset[i] for i in range(len(dataset))]
    out_of_range = []
    for bad in (len(values), len(values) + 3):
        try:
            dataset[bad]
            out_of_range.append("no error")
        except IndexError:
            out_of_range.append("IndexError")
        except Exception as error:
            out_of_range.append(type(error).__name__)
    loaded = [int(v) for batch in DataLoader(dataset, batch_size=3, num_workers=2) for v in batch]
    return {"values": values, "len": len(dataset), "types": sorted({f"{type(i).__module__}.{type(i).__qualname__}" for i in items}),
            "items": [int(i) if type(i) is torch.Tensor else None for i in items],
            "out_of_range": out_of_range, "loaded": loaded}


def judge_dataset_everywhere(d):
    if d["types"] != ["torch.Tensor"]:
        return f"items must be plain torch.Tensor, got {d['types']}"
    if d["len"] != len(d["values"]) or d["items"] != d["values"]:
        return "a longer file gives other items than its lines"
    if d["out_of_range"] != ["IndexError", "IndexError"]:
        return "an index past the end must raise IndexError"
    if d["loaded"] != d["values"]:
        return "DataLoader(num_workers=2) gives other items than the file holds"
    return None


# --- choose_tools -------------------------------------------------------------------------

ACCEPTED = {"a": {"processes"}, "b": {"threads"}, "c": {"asyncio"}, "d": {"processes"}, "e": {"serial"}, "f": {"threads"}}


def judge_choices(d):
    wrong = sorted(k for k, ok in ACCEPTED.items() if d.get(k) not in ok)
    return f"reconsider {wrong}" if wrong else None


# --- average_across_ranks (a 2-process script) ---------------------------------------------

def judge_ranks_in_detail(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    ranks = d["ranks"]
    if any(r["world_size"] != 2 or str(r["rank"]) != k for k, r in ranks.items()):
        return "ranks report the wrong rank or world size"
    for n in ("10", "7"):
        if any(ranks[k]["shards"][n] != list(range(int(k), int(n), 2)) for k in ("0", "1")):
            return f"with n={n}, each rank takes every world_size-th index starting at its rank"
    if any(r["average"] != [1.5, 5.0] for r in ranks.values()):
        return "the average over ranks is wrong on some rank"
    if not all(r["input_unchanged"] for r in ranks.values()):
        return "average_across_ranks must not change its input"
    return None


HIDDEN = {
    "parallel_map": [
        Case("kind='io' uses up to `workers` threads, in order", observe_io_identities, judge_io_identities),
        Case("kind='cpu' uses up to `workers` processes", observe_cpu_worker_count,
             lambda d: None if 1 <= len(d) <= 2 else f"workers=2 used {len(d)} processes"),
        Case("results follow the items, not completion", observe_completion_order,
             lambda d: None if d == {"io": list(range(6)), "cpu": list(range(6))} else "results must follow the order of items"),
        Case("empty input and unknown kinds", observe_empty_and_bad_kinds, judge_empty_and_bad_kinds),
    ],
    "lines_dataset": [Case("a longer file, bad indices and two workers", observe_dataset_everywhere, judge_dataset_everywhere)],
    "choose_tools": [Case("the choices", observe_choices, judge_choices)],
    "average_across_ranks": [Case("every rank: shards, average, world size", observe_ranks, judge_ranks_in_detail)],
}

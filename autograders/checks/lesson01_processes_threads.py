"""Hidden checks for lesson 1. Never released, never readable from the sandbox.

``HIDDEN`` adds cases to the exercises gpucourse.checks.lesson01 declares; the grader runs an
exercise's public cases and the hidden ones below, and gives its test cell the declared points only
when every case passes. Observers are self-contained (imports inside): their source is sent into the
sandbox. Inputs come from seeded generators and differ from the notebook's examples in size, values
and order. Judges see plain data only and say what is wrong in words that do not give the answer away.
Above each exercise's cases: the clauses its text states, numbered, and the case that checks each.
"""

from gpucourse.checks import Case
from gpucourse.checks.ddp import judge_script_ran
from gpucourse.checks.lesson01 import observe_choices  # same observation, stricter judges


# --- parallel_map -------------------------------------------------------------------------
# 1. returns a list, [fn(x) for x in items]: one result per item, also for one item and for none  -> "a list ..."
# 2. in the order of items, not the order the calls finish in (nor sorted)                       -> "results follow ..."
# 3. kind="cpu" runs fn in other processes                                                       -> "kind='cpu' ..."
# 4. kind="io" runs fn in threads (of this process, not the calling thread)                       -> "kind='io' ..."
# 5. workers=N: at most N threads or processes (workers=None: the pool's default)                -> both kind cases
# 6. any other kind raises ValueError (also with no items)                                        -> "other kinds ..."

def observe_io_threads(ns):
    import os
    import threading
    from gpucourse.checks import answer
    from gpucourse.parallel import worker_identity
    parallel_map = answer(ns, "parallel_map")
    result = {"me": os.getpid(), "main_thread": threading.get_ident()}
    for workers in (1, 3):
        rows = parallel_map(worker_identity, range(9), "io", workers=workers)
        result[str(workers)] = {"xs": [x for x, _, _ in rows], "pids": sorted({p for _, p, _ in rows}),
                                "threads": sorted({t for _, _, t in rows})}
    return result


def judge_io_threads(d):
    for workers in ("1", "3"):
        got = d[workers]
        if got["xs"] != list(range(9)):
            return f"workers={workers}: results are not [fn(x) for x in items]"
        if got["pids"] != [d["me"]]:
            return "kind='io' left this process: waiting needs threads, not processes"
        if d["main_thread"] in got["threads"]:
            return "kind='io' ran fn in the calling thread, not in a pool of threads"
        if len(got["threads"]) > int(workers):
            return f"kind='io' with workers={workers} used {len(got['threads'])} threads"
    return None


def observe_cpu_processes(ns):
    import os
    from gpucourse.checks import answer
    from gpucourse.parallel import worker_identity
    parallel_map = answer(ns, "parallel_map")
    result = {"me": os.getpid()}
    for workers in (1,):  # every process pool costs a start-up; the public case runs workers=2
        rows = parallel_map(worker_identity, range(9), "cpu", workers=workers)
        result[str(workers)] = {"xs": [x for x, _, _ in rows], "pids": sorted({p for _, p, _ in rows})}
    return result


def judge_cpu_processes(d):
    for workers in ("1",):
        got = d[workers]
        if got["xs"] != list(range(9)):
            return f"workers={workers}: results are not [fn(x) for x in items]"
        if d["me"] in got["pids"]:
            return "kind='cpu' ran fn in this process: GIL-bound work needs processes"
        if len(got["pids"]) > int(workers):
            return f"kind='cpu' with workers={workers} used {len(got['pids'])} processes"
    return None


def observe_item_order(ns):
    import random
    from gpucourse.checks import answer
    from gpucourse.parallel import sleep_then_return
    rng = random.Random(1)
    values = [rng.randint(-50, 50) for _ in range(7)]
    values[4] = values[1]  # a repeated value
    # the first items sleep longest, so completion order is roughly the reverse of the items
    pairs = tuple((v, 0.12 - 0.02 * i if i < 5 else 0.0) for i, v in enumerate(values))  # a tuple of items
    result = {"expected": values}
    for kind in ("io", "cpu"):
        result[kind] = answer(ns, "parallel_map")(sleep_then_return, pairs, kind, workers=3)
    return result


def _item_order_values():
    """observe_item_order's items, rebuilt here: a judge never takes its expected values from an observation."""
    import random
    rng = random.Random(1)
    values = [rng.randint(-50, 50) for _ in range(7)]
    values[4] = values[1]
    return values


def judge_item_order(d):
    expected = _item_order_values()
    for kind in ("io", "cpu"):
        if d[kind] != expected:
            if isinstance(d[kind], list) and sorted(map(str, d[kind])) == sorted(map(str, expected)):
                return f"kind='{kind}': the right results in another order: keep the order of items"
            return f"kind='{kind}': results are not [fn(x) for x in items]"
    return None


def observe_list_one_and_none(ns):
    from gpucourse.checks import answer
    from gpucourse.parallel import square
    parallel_map = answer(ns, "parallel_map")
    result = {}
    for kind in ("io", "cpu"):
        for name, items in [("one", [-7]), ("none", [])]:
            got = parallel_map(square, items, kind)
            result[f"{kind}/{name}"] = {"type": type(got).__name__, "is_list": isinstance(got, list), "values": list(got)}
    return result


def judge_list_one_and_none(d):
    expected = {"one": [49], "none": []}
    for key in ("io/one", "io/none", "cpu/one", "cpu/none"):  # the judge's keys, not the observation's
        kind, name = key.split("/")
        got = d[key]
        if not got["is_list"]:
            return f"kind='{kind}' returned a {got['type']}, not a list"
        if got["values"] != expected[name]:
            what = {"one": "a single item", "none": "an empty list of items"}[name]
            return f"kind='{kind}' with {what}: results are not [fn(x) for x in items]"
    return None


def observe_other_kinds(ns):
    from gpucourse.checks import answer
    from gpucourse.parallel import square
    parallel_map = answer(ns, "parallel_map")  # a missing answer is reported as such, not as a wrong error
    result = {}
    for bad, items in [("gpu", [1]), ("CPU", [1]), ("IO", [1, 2]), ("threads", [1]), ("", [1]), (None, [1]),
                       ("cpu ", [2]), ("gpu", [])]:
        try:
            parallel_map(square, items, bad)
            outcome = "no error"
        except ValueError:
            outcome = "ValueError"
        except Exception as error:
            outcome = type(error).__name__
        result[f"{bad!r} with {len(items)} item(s)"] = outcome
    return result


OTHER_KINDS = ["'gpu' with 1 item(s)", "'CPU' with 1 item(s)", "'IO' with 2 item(s)", "'threads' with 1 item(s)",
               "'' with 1 item(s)", "None with 1 item(s)", "'cpu ' with 1 item(s)", "'gpu' with 0 item(s)"]


def judge_other_kinds(d):
    if sorted(d) != sorted(OTHER_KINDS):
        return "not every other kind was tried"
    wrong = sorted(k for k, v in d.items() if v != "ValueError")
    return f"kind={wrong[0]} gave {d[wrong[0]]}, not ValueError ({len(wrong)} such)" if wrong else None


# --- LinesDataset -------------------------------------------------------------------------
# 1. a torch.utils.data.Dataset; len(ds) is the number of lines                  -> "another file ..."
# 2. ds[i] is line i (from 0) as a torch.tensor holding exactly that integer      -> "another file ...", "one line ..."
#    (negative, zero, and beyond what int32 or float32 hold)
# 3. an index outside 0 .. len(ds)-1 raises IndexError: negative ones included     -> "indices outside ..."
# 4. survives pickle (keeps no open file), also after items were read            -> "pickled ..." (and public)
# 5. loads correctly through a DataLoader with num_workers=2                      -> "pickled ... DataLoader ..."

def observe_dataset_items(ns):
    import random
    import tempfile
    from pathlib import Path

    import torch
    from torch.utils.data import Dataset
    from gpucourse.checks import answer
    from gpucourse.parallel import write_int_lines

    rng = random.Random(11)
    values = [rng.randint(-999, 999) for _ in range(13)]
    values[2], values[5], values[9] = 0, 2**40 + 1, -(2**35) - 3  # 2**40 + 1: no float32 or int32 holds it
    dataset = answer(ns, "LinesDataset")(write_int_lines(Path(tempfile.mkdtemp()) / "other.txt", values))
    items = []
    for i in range(len(values)):
        try:
            item = dataset[i]
            if type(item) is not torch.Tensor:
                items.append(f"a {type(item).__module__}.{type(item).__qualname__}")
            elif item.numel() != 1:
                items.append(f"a tensor of shape {list(item.shape)}")
            else:
                items.append(int(item.reshape(-1)[0]))
        except Exception as error:
            items.append(f"{type(error).__name__}")
    return {"values": values, "len": len(dataset), "is_dataset": isinstance(dataset, Dataset), "items": items}


def _dataset_item_values():
    """observe_dataset_items' file, rebuilt here (the same seed)."""
    import random
    rng = random.Random(11)
    values = [rng.randint(-999, 999) for _ in range(13)]
    values[2], values[5], values[9] = 0, 2**40 + 1, -(2**35) - 3
    return values


def judge_dataset_items(d):
    values = _dataset_item_values()
    if not d["is_dataset"]:
        return "LinesDataset must be a torch.utils.data.Dataset"
    if d["len"] != len(values):
        return f"len(ds) is not the number of lines for a {len(values)}-line file"
    odd = [i for i in d["items"] if isinstance(i, str)]
    if odd:
        return f"ds[i] must be a torch.tensor holding line i's integer, got {odd[0]}"
    wrong = [i for i, want in enumerate(values) if i >= len(d["items"]) or d["items"][i] != want]
    if wrong:
        return f"{len(wrong)} of {len(values)} items do not hold exactly the integer on their line"
    return None


def observe_dataset_bounds(ns):
    import tempfile
    from pathlib import Path

    from gpucourse.checks import answer
    from gpucourse.parallel import write_int_lines

    folder = Path(tempfile.mkdtemp())
    result = {}
    for name, values in [("9 lines", [5, -1, 12, 0, 7, 3, -8, 44, 2]), ("one line", [-31]), ("no lines", [])]:
        dataset = answer(ns, "LinesDataset")(write_int_lines(folder / f"{len(values)}.txt", values))
        n = len(values)
        outcomes = {}
        for index in sorted({-1, -n, -n - 1, n, n + 4}):
            try:
                dataset[index]
                outcomes[str(index)] = "no error"
            except IndexError:
                outcomes[str(index)] = "IndexError"
            except Exception as error:
                outcomes[str(index)] = type(error).__name__
        result[name] = {"len": len(dataset), "outcomes": outcomes,
                        "first": int(dataset[0]) if n else None}
    return result


def judge_dataset_bounds(d):
    expected = {"9 lines": (9, 5), "one line": (1, -31), "no lines": (0, None)}
    for name, (n, _) in expected.items():  # every file, and every index tried on it
        got = d[name]
        if (got["len"], got["first"]) != expected[name]:
            return f"a file of {name}: wrong len(ds) or ds[0]"
        if sorted(got["outcomes"], key=int) != [str(i) for i in sorted({-1, -n, -n - 1, n, n + 4})]:
            return f"a file of {name}: not every index outside 0 .. len-1 was tried"
        # past the end first: the negative indices are the clause a list's own indexing gets wrong
        for index, outcome in sorted(got["outcomes"].items(), key=lambda item: int(item[0]) < 0):
            if outcome != "IndexError":
                side = "a negative index" if int(index) < 0 else "an index past the end"
                return f"{side} ({index}, file of {name}) must raise IndexError, got {outcome}"
    return None


def observe_dataset_pickle_and_workers(ns):
    import pickle
    import random
    import tempfile
    from pathlib import Path

    from torch.utils.data import DataLoader
    from gpucourse.checks import answer
    from gpucourse.parallel import write_int_lines

    rng = random.Random(12)
    values = [rng.randint(-10**6, 10**6) for _ in range(11)]
    dataset = answer(ns, "LinesDataset")(write_int_lines(Path(tempfile.mkdtemp()) / "loaded.txt", values))
    read_first = [int(dataset[i]) for i in range(len(values))]  # items read before pickling, as training does
    try:
        copy = pickle.loads(pickle.dumps(dataset))
        copied = [int(copy[i]) for i in range(len(values))]
    except Exception as error:
        copied = f"{type(error).__name__}: {error}"[:200]
    loaded = [int(v) for batch in DataLoader(dataset, batch_size=4, num_workers=2) for v in batch.reshape(-1)]
    return {"values": values, "read": read_first, "copied": copied, "loaded": loaded}


def judge_dataset_pickle_and_workers(d):
    import random
    rng = random.Random(12)  # observe_dataset_pickle_and_workers' file, rebuilt
    values = [rng.randint(-10**6, 10**6) for _ in range(11)]
    if isinstance(d["copied"], str):
        return f"after reading items, the dataset no longer pickles ({d['copied']})"
    if d["copied"] != values:
        return "the unpickled dataset gives other items than the file holds"
    if d["loaded"] != values:
        return "DataLoader(num_workers=2) gives other items than the file holds"
    return None


# --- choose_tools -------------------------------------------------------------------------
# 1. a dict with exactly the keys "a" .. "f"                          -> public
# 2. each value one of "serial", "threads", "processes", "asyncio"    -> public
# 3. the tool with the most speedup for the least cost on GIL CPython, per workload:
#    pure-Python / PIL work (a, d)                                    -> "work that holds the GIL ..."
#    work in C that releases the GIL, blocking waits (b, f)            -> "work that releases the GIL ..."
#    10,000 idle connections (c)                                      -> "thousands of idle connections"
#    a tiny job, once (e)                                             -> "a tiny job ..."

ACCEPTED = {"a": {"processes"}, "b": {"threads"}, "c": {"asyncio"}, "d": {"processes"}, "e": {"serial"}, "f": {"threads"}}


def _choices_judge(keys):
    def judge(d):
        wrong = [k for k in keys if d.get(k) not in ACCEPTED[k]]
        return f"reconsider {', '.join(repr(k) for k in wrong)}" if wrong else None
    return judge


# --- average_across_ranks (a 2-process script) ---------------------------------------------
# 1. shard_indices returns a list of ints                                         -> "shard_indices: ..."
# 2. every world_size-th index of 0 .. n-1 starting at rank                        -> "shard_indices: ..."
# 3. the ranks together cover each index exactly once (n below world_size, n = 0,  -> "shard_indices: ..."
#    n not a multiple of world_size; other ranks and world sizes than the launch's)
# 4. average_across_ranks returns a new tensor, and leaves its input unchanged      -> "... a new tensor ..."
# 5. its result is the element-wise mean over all ranks (other shapes and dtypes)   -> "... the mean ..."
# 6. the same on every rank                                                        -> "... the mean ..." (and public)
# One launch with generated inputs serves every hidden case (run_exercise_script keeps it), and none is
# made when the public case's launch already breaks a clause: ranks take seconds to start.

def observe_generated_ranks(ns):
    import random
    from gpucourse.checks.ddp import run_exercise_script

    public = run_exercise_script(ns, "average_across_ranks")  # launched by the public case already
    if public.get("returncode") != 0 or sorted(public.get("ranks", {})) != ["0", "1"]:
        return public  # a script that did not run is not launched again
    # The public launch's own record, in the form of a generated one: when it already breaks a clause,
    # the judges below say so from it, and the ranks are not started a second time.
    ranks = public["ranks"]
    seen = {"inputs": {"shards": [[n, r, 2] for n in (10, 7) for r in (0, 1)],
                       "tensors": [{"dtype": "float32", "shape": [2], "values": {"0": [1.0, 0.0], "1": [2.0, 10.0]}}]}}
    for rank, record in ranks.items():
        calls = [{"args": [n, r, 2], "type": "list", "is_list": True, "ints": True, "indices": ranks[str(r)]["shards"][str(n)]}
                 for n, r, _ in seen["inputs"]["shards"]]
        averages = [{"is_tensor": True, "same_object": False, "shape": [len(record["average"])], "values": record["average"],
                     "input_unchanged": record["input_unchanged"]}]
        record = dict(record, generated={"shards": calls, "averages": averages})
        seen.setdefault("ranks", {})[rank] = record
    # the public inputs' right answers: strided shards of 10 and 7, and the mean of [1, 0] and [2, 10]
    broken = any(any(record["shards"][str(n)] != list(range(int(rank), n, 2)) for n in (10, 7))
                 or len(record["average"]) != 2 or not abs(record["average"][0] - 1.5) <= 1e-4
                 or not abs(record["average"][1] - 5.0) <= 1e-4 or not record["input_unchanged"]
                 for rank, record in ranks.items())
    if broken:
        return dict(public, **seen)
    rng = random.Random(5)
    shards = []
    for world_size, n in [(1, 4), (2, 0), (2, 9), (3, 2), (3, 3 * rng.randint(3, 6) + 1), (5, rng.randint(11, 19))]:
        shards += [[n, rank, world_size] for rank in range(world_size)]
    tensors = []
    for dtype, shape in [("float64", [3]), ("float32", [2, 3]), ("float64", [])]:
        size = 1
        for s in shape:
            size *= s
        tensors.append({"dtype": dtype, "shape": shape,
                        "values": {str(r): [round(rng.uniform(-100, 100), 3) for _ in range(size)] for r in range(2)}})
    inputs = {"shards": shards, "tensors": tensors}
    return {**run_exercise_script(ns, "average_across_ranks", inputs=inputs), "inputs": inputs}


PUBLIC_RANK_INPUTS = {"shards": [[n, r, 2] for n in (10, 7) for r in (0, 1)],
                      "tensors": [{"dtype": "float32", "shape": [2], "values": {"0": [1.0, 0.0], "1": [2.0, 10.0]}}]}


def generated_rank_inputs() -> dict:
    """observe_generated_ranks' inputs, rebuilt here (the same seed)."""
    import random
    rng = random.Random(5)
    shards = []
    for world_size, n in [(1, 4), (2, 0), (2, 9), (3, 2), (3, 3 * rng.randint(3, 6) + 1), (5, rng.randint(11, 19))]:
        shards += [[n, rank, world_size] for rank in range(world_size)]
    tensors = []
    for dtype, shape in [("float64", [3]), ("float32", [2, 3]), ("float64", [])]:
        size = 1
        for s in shape:
            size *= s
        tensors.append({"dtype": dtype, "shape": shape,
                        "values": {str(r): [round(rng.uniform(-100, 100), 3) for _ in range(size)] for r in range(2)}})
    return {"shards": shards, "tensors": tensors}


def _rank_inputs(d) -> "dict | None":
    """Which of the two input sets the judge knows the observation claims to answer (the public launch's
    own, when it already broke a clause, or the generated one); None for any other."""
    for known in (PUBLIC_RANK_INPUTS, generated_rank_inputs()):
        if d.get("inputs") == known:
            return known
    return None


def judge_generated_shards(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    inputs = _rank_inputs(d)
    if inputs is None:
        return "the inputs were changed while checking"
    calls = d["ranks"]["0"]["generated"]["shards"]
    if [c.get("args") for c in calls] != inputs["shards"]:
        return "shard_indices was not called on every generated input"
    for call in calls:
        n, rank, world_size = call["args"]
        where = f"shard_indices({n}, {rank}, {world_size})"
        if "error" in call:
            return f"{where} raised {call['error']}"
        if not (call["is_list"] and call["ints"]):
            return f"{where} returned a {call['type']}: return a list of ints"
    for n, world_size in sorted({(c["args"][0], c["args"][2]) for c in calls}):
        together = sorted(i for c in calls if c["args"][0] == n and c["args"][2] == world_size for i in c["indices"])
        if together != list(range(n)):
            return f"with n={n} and world_size={world_size} the ranks together do not cover each index exactly once"
    for call in calls:
        n, rank, world_size = call["args"]
        if call["indices"] != list(range(rank, n, world_size)):
            return f"with n={n} and world_size={world_size}, rank {rank} does not take every world_size-th index from its rank"
    return None


def judge_generated_new_tensor(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    inputs = _rank_inputs(d)
    if inputs is None:
        return "the inputs were changed while checking"
    for rank, record in sorted(d["ranks"].items()):
        if len(record["generated"]["averages"]) != len(inputs["tensors"]):
            return f"rank {rank}: average_across_ranks was not called on every generated tensor"
        for spec, got in zip(inputs["tensors"], record["generated"]["averages"]):
            if "error" in got:
                return f"average_across_ranks raised {got['error']} for a {spec['dtype']} tensor of shape {spec['shape']}"
            if not got["input_unchanged"]:
                return f"average_across_ranks changed its input (rank {rank}, shape {spec['shape']})"
            if not got["is_tensor"] or got["same_object"]:
                return "average_across_ranks must return a new tensor, not its input"
    return None


def judge_generated_mean(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    inputs = _rank_inputs(d)
    if inputs is None:
        return "the inputs were changed while checking"
    results = {rank: record["generated"]["averages"] for rank, record in d["ranks"].items()}
    if any(len(averages) != len(inputs["tensors"]) for averages in results.values()):
        return "average_across_ranks was not called on every generated tensor"
    for i, spec in enumerate(inputs["tensors"]):
        per_rank = list(spec["values"].values())
        mean = [sum(vs) / len(vs) for vs in zip(*per_rank)]
        for rank, averages in sorted(results.items()):
            got = averages[i]
            if "error" in got:
                return f"average_across_ranks raised {got['error']}"
            if got["shape"] != spec["shape"]:
                return f"for a tensor of shape {spec['shape']} the result has shape {got['shape']}"
            close = (abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(got["values"], mean))  # NaN is never close
            if len(got["values"]) != len(mean) or not all(close):
                return f"rank {rank}: not the element-wise mean over ranks for a {spec['dtype']} tensor of shape {spec['shape']}"
    return None


HIDDEN = {
    "parallel_map": [
        Case("kind='io': threads of this process, at most `workers`", observe_io_threads, judge_io_threads),
        Case("kind='cpu': other processes, at most `workers`", observe_cpu_processes, judge_cpu_processes),
        Case("results follow the order of items (a tuple), whatever finishes first", observe_item_order, judge_item_order),
        Case("a list, for one item and for no items", observe_list_one_and_none, judge_list_one_and_none),
        Case("other kinds raise ValueError", observe_other_kinds, judge_other_kinds),
    ],
    "lines_dataset": [
        Case("another file: len and every item (negative, zero, beyond 32 bits)", observe_dataset_items, judge_dataset_items),
        Case("indices outside 0 .. len-1 raise IndexError (negative ones too), one line, no lines", observe_dataset_bounds,
             judge_dataset_bounds),
        Case("pickled after use, and through DataLoader(num_workers=2)", observe_dataset_pickle_and_workers,
             judge_dataset_pickle_and_workers),
    ],
    "choose_tools": [
        Case("work that holds the GIL", observe_choices, _choices_judge("ad")),
        Case("work that releases the GIL or waits on a blocking call", observe_choices, _choices_judge("bf")),
        Case("thousands of idle connections", observe_choices, _choices_judge("c")),
        Case("a tiny job, once", observe_choices, _choices_judge("e")),
    ],
    "average_across_ranks": [
        Case("shard_indices: a list, other n, ranks and world sizes", observe_generated_ranks, judge_generated_shards),
        Case("average_across_ranks: a new tensor, input unchanged", observe_generated_ranks, judge_generated_new_tensor),
        Case("average_across_ranks: the mean over ranks, other shapes and dtypes", observe_generated_ranks, judge_generated_mean),
    ],
}

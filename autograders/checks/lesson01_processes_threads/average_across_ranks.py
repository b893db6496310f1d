"""Hidden checks for lesson 1: average_across_ranks, a 2-process script (the package's docstring says how every part works)."""

import math

from gpucourse.checks.ddp import first_raised, judge_script_ran


# --- average_across_ranks (a 2-process script) ---------------------------------------------
# The public case launches 2 ranks on fixed inputs; the hidden cases share one launch of 3 ranks (an
# "all ranks" that is not 2) and one of a single rank (the boundary: the mean over one rank is its own
# values, still in a new tensor) on inputs drawn at grading time: shard_indices calls for other n, ranks
# and world sizes, and per-rank tensors of other shapes and dtypes, integer ones last (their mean is
# fractional: the first one's first element always is; an answer may refuse them with an error, as
# torch.mean does, but a tensor it returns must hold that mean, not a rounded one). The ranks' drivers
# (gpucourse.checks.lesson01_processes_threads.drive_average_across_ranks) only call the answer and report what it
# returned; the observer also calls shard_indices in the notebook's own process, to see the type of each
# index (the ranks' reports carry them as JSON numbers). The expected indices and means are computed here.
# No launch is made when the public one did not run: ranks take seconds to start.

HIDDEN_WORLD_SIZE = 3


def reference_shard_indices(n, rank, world_size):
    return list(range(rank, n, world_size))


def draw_rank_inputs(rng):
    pairs = [(0, 1), (0, 3), (1, 1), (1, 4), (2, 5), (3, 3)]
    for _ in range(2):
        w = rng.randint(2, 7)
        k = rng.randint(1, 6)
        pairs += [(w * k, w), (w * k + 1, w), (w * k + w - 1, w)]
    pairs += [(rng.randint(0, 200), rng.randint(1, 9)) for _ in range(4)]
    pairs.append((rng.randint(1000, 5000), rng.randint(10, 40)))
    pairs = list(dict.fromkeys(pairs))  # each (n, world_size) once: the judge puts each one's ranks together
    shards = [[n, rank, w] for n, w in pairs for rank in range(w)]
    tensors = []
    layouts = [("float64", []), ("float32", [rng.randint(1, 5)]), ("float64", [rng.randint(1, 4), rng.randint(1, 4)]),
               ("float32", [2, rng.randint(1, 3), rng.randint(1, 3)]), ("float16", [rng.randint(1, 6)]),
               ("bfloat16", [rng.randint(1, 3), 2]),
               ("int64", [rng.randint(1, 5)]), ("int32", [rng.randint(1, 3), 2])]  # last: an answer may refuse them
    for dtype, shape in layouts:
        size = math.prod(shape)
        if dtype in ("float16", "bfloat16"):  # values the dtype holds exactly, sums too
            values = {str(r): [rng.randint(-32, 32) / 4 for _ in range(size)] for r in range(HIDDEN_WORLD_SIZE)}
        elif dtype.startswith("int"):  # small enough that the float32 a division gives holds their sums exactly
            values = {str(r): [rng.randint(-1000, 1000) for _ in range(size)] for r in range(HIDDEN_WORLD_SIZE)}
            if dtype == "int64":  # the boundary: a first element whose mean over the 3 ranks is fractional
                while sum(values[str(r)][0] for r in range(HIDDEN_WORLD_SIZE)) % HIDDEN_WORLD_SIZE == 0:
                    values["0"][0] = rng.randint(-1000, 1000)
        else:
            values = {str(r): [round(rng.uniform(-100, 100), rng.randint(0, 6)) for _ in range(size)]
                      for r in range(HIDDEN_WORLD_SIZE)}
        tensors.append({"dtype": dtype, "shape": shape, "values": values})
    return {"shards": shards, "tensors": tensors}


def observe_generated_ranks(ns, inputs):
    from gpucourse.checks import answer
    from gpucourse.checks.ddp import run_exercise_script

    public = run_exercise_script(ns, "average_across_ranks")  # launched by the public case already
    if public.get("returncode") != 0 or sorted(public.get("ranks", {})) != ["0", "1"]:
        return {**public, "world_size": 2}  # a script that did not run is not launched again
    three = run_exercise_script(ns, "average_across_ranks", inputs=inputs, world_size=3)
    single = run_exercise_script(ns, "average_across_ranks", inputs={"shards": [], "tensors": inputs["tensors"]},
                                 world_size=1)
    shard_indices, item_types = answer(ns, "shard_indices"), []
    for n, rank, world_size in inputs["shards"]:
        try:
            got = shard_indices(n, rank, world_size)
            item_types.append(sorted({f"{type(i).__module__}.{type(i).__qualname__}" for i in got}))
        except Exception:  # the ranks' reports say what it raised
            item_types.append(None)
    return {**three, "world_size": 3, "single": single, "item_types": item_types}


def _launched(d, world_size=None):
    """What is wrong with the launch itself, or None."""
    ran = judge_script_ran(d, world_size=world_size or d.get("world_size", 2))
    if ran:
        return ran
    if any("generated" not in record for record in d["ranks"].values()):
        return "the ranks did not report the drawn inputs"
    return None


def _launches(d):
    """The hidden launches as (record, world size), the 3 ranks' first, or what is wrong with one of them."""
    launched = _launched(d)
    if launched:
        return launched
    single = d.get("single")
    if not isinstance(single, dict):
        return "the 1-process script was not launched"
    return _launched(single, world_size=1) or [(d, d["world_size"]), (single, 1)]


def judge_generated_shards(d, inputs):
    launched = _launched(d)
    if launched:
        return launched
    calls = d["ranks"]["0"]["generated"]["shards"]
    if [c.get("args") for c in calls] != inputs["shards"]:
        return "shard_indices was not called on every drawn input"
    item_types = d.get("item_types")
    if not isinstance(item_types, list) or len(item_types) != len(calls):
        return "shard_indices was not called on every drawn input"
    for call, types in zip(calls, item_types):
        n, rank, world_size = call["args"]
        where = f"shard_indices({n}, {rank}, {world_size})"
        if "error" in call:
            return f"{where} raised {call['error']}"
        if not (call["is_list"] and call["ints"]):
            return f"{where} returned a {call['type']}: return a list of ints"
        others = [t for t in types or [] if t != "builtins.int"]
        if others:
            return f"{where} returned a list holding {others[0]} values: return a list of Python ints"
    shards = {tuple(c["args"]): c["indices"] for c in calls}  # a repeated call counts once
    for n, world_size in sorted({(n, w) for n, _, w in shards}):
        together = sorted(i for rank in range(world_size) for i in shards.get((n, rank, world_size), []))
        if together != list(range(n)):
            return f"with n={n} and world_size={world_size} the ranks together do not cover each index exactly once"
    for call in calls:
        n, rank, world_size = call["args"]
        if call["indices"] != reference_shard_indices(n, rank, world_size):
            return f"with n={n} and world_size={world_size}, rank {rank} does not take every world_size-th index from its rank"
    return None


def _ranks_words(world_size):
    return "1 rank" if world_size == 1 else f"{world_size} ranks"


def _tensor_words(spec):
    article = "an" if spec["dtype"].startswith("int") else "a"
    return f"{article} {spec['dtype']} tensor of shape {spec['shape']}"


def _raised(d, inputs):
    """(index of the first drawn tensor on which a rank's answer raised, that rank's own error in words) or
    None. A peer of that rank stops there too, with gloo's lost connection (``ddp.settle``). An integer
    tensor may be refused (torch.mean refuses it too): its error is None, and nothing after it is judged."""
    runs = {rank: {"runs": record["generated"]["averages"]} for rank, record in d["ranks"].items()}
    raised = first_raised(runs, len(inputs["tensors"]))
    if raised is None:
        return None
    i, rank, error = raised
    spec = inputs["tensors"][i]
    if spec["dtype"].startswith("int"):
        return i, None
    return i, f"rank {rank}: average_across_ranks raised {error} for {_tensor_words(spec)}"


def judge_generated_new_tensor(d, inputs):
    """The drawn tensors in order, each launch's: an input changed or returned comes before a later tensor's error."""
    launches = _launches(d)
    if isinstance(launches, str):
        return launches
    for record, world_size in launches:
        raised = _raised(record, inputs)
        stop = raised[0] if raised else len(inputs["tensors"])
        for rank, ran in sorted(record["ranks"].items()):
            averages = ran["generated"]["averages"]
            if len(averages) < stop or (raised is None and len(averages) != len(inputs["tensors"])):
                return f"{_ranks_words(world_size)}, rank {rank}: average_across_ranks was not called on every drawn tensor"
            for spec, got in zip(inputs["tensors"][:stop], averages):
                if "error" in got:
                    return f"average_across_ranks raised {got['error']} for {_tensor_words(spec)}"
                if not got["input_unchanged"]:
                    return f"average_across_ranks changed its input ({_ranks_words(world_size)}, rank {rank}, shape {spec['shape']})"
                if not got["is_tensor"] or got["same_object"]:
                    return f"{_ranks_words(world_size)}: average_across_ranks must return a new tensor, not its input"
        if raised and raised[1]:
            return f"{_ranks_words(world_size)}, {raised[1]}"
    return None


EPS = {"float64": 1e-12, "float32": 1e-6, "float16": 2 ** -9, "bfloat16": 2 ** -6,  # a few of the dtype's ulps
       "int64": 1e-6, "int32": 1e-6}  # an integer tensor's mean: a float32 at least (what dividing it gives)


def reference_mean(spec, world_size):
    """The element-wise mean over the ranks of the values each rank held (in its dtype), in float64."""
    import torch

    held = [torch.tensor(spec["values"][str(r)], dtype=getattr(torch, spec["dtype"])).double() for r in range(world_size)]
    return (torch.stack(held).sum(0) / world_size).tolist()


def _mean_problem(d, world_size, inputs):
    """What is wrong with the means one launch of ``world_size`` ranks reported, tensor by tensor, or None."""
    raised = _raised(d, inputs)
    stop = raised[0] if raised else len(inputs["tensors"])
    results = {rank: record["generated"]["averages"] for rank, record in d["ranks"].items()}
    if any(len(averages) < stop or (raised is None and len(averages) != stop) for averages in results.values()):
        return "average_across_ranks was not called on every drawn tensor"
    for i, spec in enumerate(inputs["tensors"][:stop]):
        mean = reference_mean(spec, world_size)
        what = _tensor_words(spec)
        for rank, averages in sorted(results.items()):
            got = averages[i]
            if "error" in got:
                return f"average_across_ranks raised {got['error']} for {what}"
            if got["shape"] != spec["shape"]:
                return f"for {what} the result has shape {got['shape']}"
            eps = EPS[spec["dtype"]]  # relative to the largest value summed: a sum's rounding is as large as that
            scales = [max([1.0] + [abs(v[k]) for v in spec["values"].values()]) for k in range(len(mean))]
            close = (abs(a - b) <= 4 * eps * scale for a, b, scale in zip(got["values"], mean, scales))  # NaN is never close
            if len(got["values"]) != len(mean) or not all(close):
                return f"{_ranks_words(world_size)}, rank {rank}: not the element-wise mean over all ranks for {what}"
        held = {rank: averages[i]["values"] for rank, averages in results.items()}
        if len({repr(values) for values in held.values()}) > 1:  # bit for bit: every rank must step the same weights
            return (f"{_ranks_words(world_size)}: the mean of {what} is not the same on every rank, bit for bit "
                    "(each rank summed in its own order?)")
    return raised[1] if raised else None


def judge_generated_mean(d, inputs):
    launches = _launches(d)
    if isinstance(launches, str):
        return launches
    for record, world_size in launches:
        problem = _mean_problem(record, world_size, inputs)
        if problem:
            return problem
    return None

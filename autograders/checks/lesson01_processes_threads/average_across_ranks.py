"""Hidden checks for lesson 1: average_across_ranks, a 2-process script (the package's docstring says how every part works)."""

from gpucourse.checks.ddp import first_raised, judge_script_ran


# --- average_across_ranks (a 2-process script) ---------------------------------------------
# The public case launches 2 ranks on fixed inputs; the hidden cases share one launch of 3 ranks (an
# "all ranks" that is not 2) on inputs drawn at grading time: shard_indices calls for other n, ranks
# and world sizes, and per-rank tensors of other shapes and dtypes. The ranks' drivers
# (gpucourse.checks.lesson01_processes_threads.drive_average_across_ranks) only call the answer and report what it
# returned; the expected indices and means are computed here. No launch is made when the public one
# did not run: ranks take seconds to start.

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
               ("bfloat16", [rng.randint(1, 3), 2])]
    for dtype, shape in layouts:
        size = 1
        for s in shape:
            size *= s
        if dtype in ("float16", "bfloat16"):  # values the dtype holds exactly, sums too
            values = {str(r): [rng.randint(-32, 32) / 4 for _ in range(size)] for r in range(HIDDEN_WORLD_SIZE)}
        else:
            values = {str(r): [round(rng.uniform(-100, 100), rng.randint(0, 6)) for _ in range(size)]
                      for r in range(HIDDEN_WORLD_SIZE)}
        tensors.append({"dtype": dtype, "shape": shape, "values": values})
    return {"shards": shards, "tensors": tensors}


def observe_generated_ranks(ns, inputs):
    from gpucourse.checks.ddp import run_exercise_script

    public = run_exercise_script(ns, "average_across_ranks")  # launched by the public case already
    if public.get("returncode") != 0 or sorted(public.get("ranks", {})) != ["0", "1"]:
        return {**public, "world_size": 2}  # a script that did not run is not launched again
    return {**run_exercise_script(ns, "average_across_ranks", inputs=inputs, world_size=3), "world_size": 3}


def _launched(d):
    """What is wrong with the launch itself, or None."""
    ran = judge_script_ran(d, world_size=d.get("world_size", 2))
    if ran:
        return ran
    if any("generated" not in record for record in d["ranks"].values()):
        return "the ranks did not report the drawn inputs"
    return None


def judge_generated_shards(d, inputs):
    launched = _launched(d)
    if launched:
        return launched
    calls = d["ranks"]["0"]["generated"]["shards"]
    if [c.get("args") for c in calls] != inputs["shards"]:
        return "shard_indices was not called on every drawn input"
    for call in calls:
        n, rank, world_size = call["args"]
        where = f"shard_indices({n}, {rank}, {world_size})"
        if "error" in call:
            return f"{where} raised {call['error']}"
        if not (call["is_list"] and call["ints"]):
            return f"{where} returned a {call['type']}: return a list of ints"
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


def _average_raised(d, inputs) -> str | None:
    """The first drawn tensor on which a rank's answer raised, named with that rank's own error (a peer of it
    stops there too, with gloo's lost connection: ``ddp.settle``), or None."""
    runs = {rank: {"runs": record["generated"]["averages"]} for rank, record in d["ranks"].items()}
    raised = first_raised(runs, len(inputs["tensors"]))
    if raised is None:
        return None
    i, rank, error = raised
    spec = inputs["tensors"][i]
    return f"rank {rank}: average_across_ranks raised {error} for a {spec['dtype']} tensor of shape {spec['shape']}"


def judge_generated_new_tensor(d, inputs):
    launched = _launched(d) or _average_raised(d, inputs)
    if launched:
        return launched
    for rank, record in sorted(d["ranks"].items()):
        if len(record["generated"]["averages"]) != len(inputs["tensors"]):
            return f"rank {rank}: average_across_ranks was not called on every drawn tensor"
        for spec, got in zip(inputs["tensors"], record["generated"]["averages"]):
            if "error" in got:
                return f"average_across_ranks raised {got['error']} for a {spec['dtype']} tensor of shape {spec['shape']}"
            if not got["input_unchanged"]:
                return f"average_across_ranks changed its input (rank {rank}, shape {spec['shape']})"
            if not got["is_tensor"] or got["same_object"]:
                return "average_across_ranks must return a new tensor, not its input"
    return None


EPS = {"float64": 1e-12, "float32": 1e-6, "float16": 2 ** -9, "bfloat16": 2 ** -6}  # a few of the dtype's ulps


def reference_mean(spec, world_size):
    """The element-wise mean over the ranks of the values each rank held (in its dtype), in float64."""
    import torch

    held = [torch.tensor(spec["values"][str(r)], dtype=getattr(torch, spec["dtype"])).double() for r in range(world_size)]
    return (torch.stack(held).sum(0) / world_size).tolist()


def judge_generated_mean(d, inputs):
    launched = _launched(d) or _average_raised(d, inputs)
    if launched:
        return launched
    world_size = d["world_size"]
    results = {rank: record["generated"]["averages"] for rank, record in d["ranks"].items()}
    if any(len(averages) != len(inputs["tensors"]) for averages in results.values()):
        return "average_across_ranks was not called on every drawn tensor"
    for i, spec in enumerate(inputs["tensors"]):
        mean = reference_mean(spec, world_size)
        for rank, averages in sorted(results.items()):
            got = averages[i]
            what = f"a {spec['dtype']} tensor of shape {spec['shape']}"
            if "error" in got:
                return f"average_across_ranks raised {got['error']} for {what}"
            if got["shape"] != spec["shape"]:
                return f"for {what} the result has shape {got['shape']}"
            eps = EPS[spec["dtype"]]  # relative to the largest value summed: a sum's rounding is as large as that
            scales = [max([1.0] + [abs(v[k]) for v in spec["values"].values()]) for k in range(len(mean))]
            close = (abs(a - b) <= 4 * eps * scale for a, b, scale in zip(got["values"], mean, scales))  # NaN is never close
            if len(got["values"]) != len(mean) or not all(close):
                return f"{world_size} ranks, rank {rank}: not the element-wise mean over all ranks for {what}"
        held = {rank: averages[i]["values"] for rank, averages in results.items()}
        if len({repr(values) for values in held.values()}) > 1:  # bit for bit: every rank must step the same weights
            return (f"{world_size} ranks: the mean of a {spec['dtype']} tensor of shape {spec['shape']} is not the same "
                    "on every rank, bit for bit (each rank summed in its own order?)")
    return None

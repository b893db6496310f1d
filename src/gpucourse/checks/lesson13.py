"""Public checks for lesson 13 (sharded data parallel: ZeRO and FSDP). Observers are self-contained: see lesson01.py.

``ShardedAdam`` runs as a script under torchrun (gpucourse.checks.ddp): every rank runs the driver
below and reports the weights after every step and the bytes its optimizer keeps. The judges rebuild the
same model and data here and train them with one process (the mean of every rank's gradient, then
``torch.optim.Adam``: what DDP + Adam computes) to know the expected weights; they never read an expected
value from a rank's report.
"""

from __future__ import annotations

import math

from gpucourse.checks import Answer, Case, Script, register
from gpucourse.checks.ddp import judge_script_ran

ASSIGNMENT = "lesson13_sharded_data_parallel"  # the course folder this module's exercises belong to

# widths: the model is Linear(widths[0], widths[1]), Tanh, Linear(widths[1], widths[2]), ... in float64.
# Adam's eps is large on purpose: Adam divides the gradient by its own root mean square, so a gradient
# summed instead of averaged over the ranks changes an update only where eps matters.
SHARDED_INPUTS = {"seed": 0, "steps": 4, "rows": 6, "lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-3,
                  "runs": [{"widths": [24, 40, 2]}]}  # 1082 parameters, 960 of them in one weight
BOOKKEEPING = 64  # elements a ShardedAdam may keep beyond 3 per parameter of its shard (step counts, sizes)


def build_model(widths, seed):
    """The model of a run: Linear layers of ``widths`` with Tanh between, float64, its weights drawn from a
    generator of its own (the global generator is shared by every thread of the grader that judges
    submissions side by side), uniform in +-1/sqrt(fan_in) as nn.Linear draws them."""
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layer = nn.Linear(a, b, dtype=torch.float64)
        with torch.no_grad():
            for p in (layer.weight, layer.bias):
                p.copy_((torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 - 1) / a ** 0.5)
        layers += [layer] + ([nn.Tanh()] if i < len(widths) - 2 else [])
    return nn.Sequential(*layers)


def rank_rows(widths, seed, step, rank, rows):
    """Rank ``rank``'s rows ``(x, y)`` at ``step``: deterministic, different on every rank."""
    import torch

    g = torch.Generator().manual_seed(seed * 7_919 + step * 101 + rank)
    return (torch.randn(rows, widths[0], generator=g, dtype=torch.float64),
            torch.randn(rows, widths[-1], generator=g, dtype=torch.float64))


def parameter_count(widths) -> int:
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def state_budget_bytes(widths, world_size, itemsize=8) -> int:
    """What a rank may keep: 3 elements per element of its shard (Adam's two moments and, if wanted, a
    copy of the shard) plus BOOKKEEPING, in the parameters' dtype."""
    return (3 * math.ceil(parameter_count(widths) / world_size) + BOOKKEEPING) * itemsize


def expected_weights(inputs, run, world_size):
    """The weights after every step when one process averages every rank's gradient and steps
    ``torch.optim.Adam``: what DDP + Adam computes. Run in the grader, from the inputs alone."""
    import torch
    from torch.nn import functional as F

    widths = run["widths"]
    model = build_model(widths, inputs["seed"])
    adam = torch.optim.Adam(model.parameters(), lr=inputs["lr"], betas=tuple(inputs["betas"]), eps=inputs["eps"])
    after = []
    for step in range(inputs["steps"]):
        adam.zero_grad()
        for rank in range(world_size):
            x, y = rank_rows(widths, inputs["seed"], step, rank, inputs["rows"])
            (F.mse_loss(model(x), y) / world_size).backward()
        adam.step()
        after.append([float(w) for p in model.parameters() for w in p.detach().reshape(-1)])
    return after


def kept_tensor_bytes(root, exclude, namespace=None) -> int:
    """Bytes of every tensor storage reachable from ``root`` (attributes, containers, closures; and from
    the student's module-level names in ``namespace``), each storage once, except those of ``exclude``."""
    import types

    import torch

    skip = {t.untyped_storage().data_ptr() for t in exclude if t is not None}
    todo = [root] + [v for k, v in (namespace or {}).items() if not k.startswith("__")]
    seen, storages = set(), {}
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (types.ModuleType, str, bytes, int, float, complex, bool, type(None))):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            local = obj.to_local() if hasattr(obj, "to_local") else obj
            storage = local.untyped_storage()
            if storage.data_ptr() not in skip:
                storages[storage.data_ptr()] = storage.nbytes()
            if obj.is_leaf:  # a leaf's .grad is kept with it; a non-leaf has none
                todo.append(obj.grad)
        elif type(obj).__module__ == "numpy" and hasattr(obj, "nbytes"):  # state kept outside torch counts too
            storages[("numpy", id(obj))] = int(obj.nbytes)
        elif isinstance(obj, dict):
            todo += list(obj.keys()) + list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += list(obj)
        elif isinstance(obj, types.FunctionType):
            for cell in obj.__closure__ or ():
                try:
                    todo.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass
            todo += list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
        elif isinstance(obj, types.MethodType):
            todo += [obj.__self__, obj.__func__]
        elif isinstance(obj, type):
            if obj.__module__ == "student":  # class attributes of the student's own classes
                todo += list(vars(obj).values())
        else:
            todo += list(getattr(obj, "__dict__", {}).values())
            todo += [getattr(obj, name, None) for name in getattr(type(obj), "__slots__", ()) if isinstance(name, str)]
    return sum(storages.values())


def drive_sharded_adam(ns, inputs=None):
    """On this rank, for every run of ``inputs`` (SHARDED_INPUTS by default): build the model (the same
    on every rank), the student's ShardedAdam over its parameters, and for every step compute this
    rank's loss on its own rows, backward, ``step()``; record the weights after every step and the
    bytes of the tensors the optimizer keeps (not the parameters, not their gradients)."""
    import torch.distributed as dist
    from torch.nn import functional as F

    from gpucourse.checks.ddp_harness import init_process_group
    from gpucourse.checks.lesson13 import SHARDED_INPUTS, build_model, kept_tensor_bytes, rank_rows

    inputs = {**SHARDED_INPUTS, **(inputs or {})}
    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    records = []
    for run in inputs["runs"]:
        widths = run["widths"]
        model = build_model(widths, inputs["seed"])
        record = {"widths": widths, "weights": [], "state_bytes": None}
        try:
            optimizer = ns["ShardedAdam"](model.parameters(), lr=inputs["lr"], betas=tuple(inputs["betas"]),
                                          eps=inputs["eps"])
            for step in range(inputs["steps"]):
                for p in model.parameters():
                    p.grad = None
                x, y = rank_rows(widths, inputs["seed"], step, rank, inputs["rows"])
                F.mse_loss(model(x), y).backward()
                optimizer.step()
                record["weights"].append([float(w) for p in model.parameters() for w in p.detach().reshape(-1)])
            params = list(model.parameters())
            record["state_bytes"] = kept_tensor_bytes(optimizer, params + [p.grad for p in params], ns)
            record["itemsize"] = params[0].element_size()
        except Exception as error:
            record["error"] = f"{type(error).__name__}: {str(error)[:200]}"
        records.append(record)
        dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "world_size": world, "runs": records}


def observe_sharded_adam(ns):
    from gpucourse.checks.ddp import run_exercise_script
    return run_exercise_script(ns, "sharded_adam")


def judge_weights(d, inputs=None, world_size=2, runs=None):
    """Every run (or those of ``runs``) on every rank: no error, the same weights on every rank after every
    step, and those of DDP + Adam (recomputed here) to 1e-9 (float64: only rounding differs)."""
    from gpucourse.checks.lesson13 import SHARDED_INPUTS, expected_weights

    ran = judge_script_ran(d, world_size)
    if ran:
        return ran
    inputs = {**SHARDED_INPUTS, **(inputs or {})}
    ranks = d["ranks"]
    for i, run in enumerate(inputs["runs"]):
        if runs is not None and i not in runs:
            continue
        parameters = sum(a * b + b for a, b in zip(run['widths'], run['widths'][1:]))
        where = f"{world_size} ranks, widths {run['widths']} ({parameters} parameters)"
        for rank, r in sorted(ranks.items()):
            if r["world_size"] != world_size:
                return f"rank {rank} saw world size {r['world_size']}, not {world_size}"
            got = r["runs"][i]
            if "error" in got:
                return f"{where}, rank {rank}: ShardedAdam raised {got['error']}"
        want = expected_weights(inputs, run, world_size)
        for step, expected in enumerate(want):
            mine = [ranks[str(k)]["runs"][i]["weights"][step] for k in range(world_size)]
            if any(m != mine[0] for m in mine[1:]):
                return (f"{where}: after step {step + 1} the ranks hold different weights: every rank must end "
                        "a step with all the updated parameters")
            if len(mine[0]) != len(expected):
                return f"{where}: after step {step + 1} the model has {len(mine[0])} weights, not {len(expected)}"
            gap = max(abs(a - b) if a == a else math.inf for a, b in zip(mine[0], expected))
            if not gap <= 1e-9:
                return (f"{where}: after step {step + 1} the weights differ from DDP + Adam's by up to {gap:.3g} "
                        "(float64, so only rounding may differ)")
    return None


def judge_state(d, inputs=None, world_size=2, runs=None):
    """Every rank keeps at most 3 elements per element of its shard, plus bookkeeping."""
    from gpucourse.checks.lesson13 import SHARDED_INPUTS, state_budget_bytes

    ran = judge_script_ran(d, world_size)
    if ran:
        return ran
    inputs = {**SHARDED_INPUTS, **(inputs or {})}
    for i, run in enumerate(inputs["runs"]):
        if runs is not None and i not in runs:
            continue
        budget = state_budget_bytes(run["widths"], world_size)
        full = 2 * sum(a * b + b for a, b in zip(run["widths"], run["widths"][1:])) * 8
        for rank, r in sorted(d["ranks"].items()):
            got = r["runs"][i]
            if "error" in got:
                return f"rank {rank}: ShardedAdam raised {got['error']}"
            if got["state_bytes"] is None or got["state_bytes"] > budget:
                return (f"{world_size} ranks, widths {run['widths']}: rank {rank} keeps {got['state_bytes']} bytes of "
                        f"optimizer state; its shard allows at most {budget} (Adam's full state is {full})")
    return None


register("sharded_adam",
         Case("2 ranks, 4 steps: every rank ends each step with DDP + Adam's weights", observe_sharded_adam,
              judge_weights),
         Case("each rank keeps only its shard of optimizer state", observe_sharded_adam, judge_state),
         answers=[Answer("ShardedAdam", "class",
                         "a class ShardedAdam(params, lr, betas, eps) whose step() averages the gradients over all "
                         "processes, updates this rank's shard with Adam and all-gathers the parameters")],
         points=4, kind=Script(("ShardedAdam",), driver="gpucourse.checks.lesson13:drive_sharded_adam"))


def generated_inputs(seed: int, world_size: int) -> dict:
    """Inputs for a check with other sizes: models whose parameter count ``world_size`` does not divide
    (both remainders where there are two), other Adam settings and more steps. Seeded: the observer
    and the judge build the same."""
    import random

    rng = random.Random(seed)
    runs, wanted = [], set(range(1, world_size))  # every non-zero remainder once, and at least two models
    while wanted or len(runs) < 2:
        widths = [rng.randint(3, 11) for _ in range(rng.choice([3, 4]))]
        remainder = parameter_count(widths) % world_size
        if remainder and (remainder in wanted or not wanted):
            wanted.discard(remainder)
            runs.append({"widths": widths})
    return {"seed": rng.randint(1, 999), "steps": 5, "rows": rng.randint(3, 7), "lr": rng.choice([0.02, 0.005]),
            "betas": [rng.choice([0.8, 0.85]), rng.choice([0.95, 0.97])], "eps": rng.choice([1e-3, 3e-3]), "runs": runs}


# --- Exercise 1: shard boundaries with the padding rule ----------------------------------------------

SHARD_PUBLIC = [[10, 4], [8, 2], [3, 1]]  # [numel, world_size]: every rank of each


def observe_shard_ranges(ns, grid=None, bad=()):
    """``shard_range`` for every rank of every ``[numel, world_size]`` of ``grid`` (SHARD_PUBLIC by default),
    and what each of ``bad`` ``[numel, rank, world_size]`` raises. Results as data: a pair of ints, or a
    description of what came back."""
    from gpucourse.checks import answer
    from gpucourse.checks.lesson13 import SHARD_PUBLIC

    def describe(got):
        if isinstance(got, tuple) and len(got) == 2 and all(type(v) is int for v in got):
            return list(got)
        return f"a {type(got).__name__} {str(got)[:60]}"

    function = answer(ns, "shard_range")
    results = []
    for numel, world in grid or SHARD_PUBLIC:
        for rank in range(world):
            try:
                results.append([numel, rank, world, describe(function(numel, rank, world))])
            except Exception as error:
                results.append([numel, rank, world, f"raised {type(error).__name__}"])
    raised = []
    for numel, rank, world in bad:
        try:
            raised.append([numel, rank, world, f"returned {str(function(numel, rank, world))[:60]}"])
        except Exception as error:
            raised.append([numel, rank, world, type(error).__name__])
    return {"results": results, "raised": raised}


def expected_shard(numel, rank, world_size):
    """The padding rule: chunks of ceil(numel / world_size); padding dropped; ranks past the end get (numel, numel)."""
    chunk = -(-numel // world_size)
    return [min(rank * chunk, numel), min((rank + 1) * chunk, numel)]


def judge_shard_ranges(d, grid=None):
    from gpucourse.checks.lesson13 import SHARD_PUBLIC, expected_shard

    wanted = [[n, r, w] for n, w in (grid or SHARD_PUBLIC) for r in range(w)]
    if [row[:3] for row in d["results"]] != wanted:
        return "the inputs were changed while checking"
    for numel, rank, world, got in d["results"]:
        want = expected_shard(numel, rank, world)
        if isinstance(got, str) and not got.startswith("raised"):
            return f"shard_range({numel}, {rank}, {world}) returned {got}: return a tuple of two ints (start, stop)"
        if got != want:
            shown = f"returned {tuple(got)}" if isinstance(got, list) else got if got.startswith("raised") else f"returned {got}"
            return (f"shard_range({numel}, {rank}, {world}) {shown}; with chunks of ceil({numel}/{world}) "
                    f"and the padding dropped it is {tuple(want)}")
    return None


register("shard_range",
         Case("10 elements on 4 ranks, 8 on 2, 3 on 1: chunks of ceil(numel / world_size)", observe_shard_ranges,
              judge_shard_ranges),
         answers=[Answer("shard_range", "function",
                         "a function shard_range(numel, rank, world_size) returning (start, stop), this rank's "
                         "elements of a flat vector padded to equal chunks")],
         points=1)

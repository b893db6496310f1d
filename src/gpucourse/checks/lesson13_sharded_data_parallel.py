"""Public checks for lesson 13 (sharded data parallel: ZeRO and FSDP). Observers are self-contained: see lesson01_processes_threads.py.

``ShardedAdam`` runs as a script under torchrun (gpucourse.checks.ddp): every rank runs the driver
below and reports the weights after every step and the bytes its optimizer keeps. The public judge
compares them with sums of DDP + Adam's weights stored below (``SHARDED_PUBLIC_SUMS``: this module has
no way to compute them); the grader's hidden checks draw other models, Adam settings and numbers of
processes at grading time and train DDP + Adam themselves to know the expected weights.
"""

from __future__ import annotations

import math

from gpucourse.checks import Answer, Case, Script, register
from gpucourse.checks.ddp import first_raised, judge_script_ran

ASSIGNMENT = "lesson13_sharded_data_parallel"  # the course folder this module's exercises belong to

# widths: the model is Linear(widths[0], widths[1]), Tanh, Linear(widths[1], widths[2]), ... in float64.
# Adam's eps is large on purpose: Adam divides the gradient by its own root mean square, so a gradient
# summed instead of averaged over the ranks changes an update only where eps matters.
SHARDED_INPUTS = {"seed": 0, "steps": 4, "rows": 6, "lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-3,
                  "runs": [{"widths": [24, 40, 2]}]}  # 1082 parameters, 960 of them in one weight
BOOKKEEPING = 64  # elements a ShardedAdam may keep beyond 3 per parameter of its shard (step counts, sizes)
TEXT_DEFAULTS = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8}  # ShardedAdam(params)'s, as the text writes them


def build_model(widths, seed, dtype=None):
    """The model of a run: Linear layers of ``widths`` with Tanh between, float64 (or ``dtype``, a name such
    as "float32": the float64 weights rounded to it), its weights drawn from a generator of its own (the
    global generator is shared by every thread of the grader that judges submissions side by side), uniform
    in +-1/sqrt(fan_in) as nn.Linear draws them."""
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
    model = nn.Sequential(*layers)
    return model.to(getattr(torch, dtype)) if dtype else model


def rank_rows(widths, seed, step, rank, rows, dtype=None):
    """Rank ``rank``'s rows ``(x, y)`` at ``step``: deterministic, different on every rank (float64, or
    rounded to ``dtype`` as the model is)."""
    import torch

    g = torch.Generator().manual_seed(seed * 7_919 + step * 101 + rank)
    x, y = (torch.randn(rows, widths[0], generator=g, dtype=torch.float64),
            torch.randn(rows, widths[-1], generator=g, dtype=torch.float64))
    return (x.to(getattr(torch, dtype)), y.to(getattr(torch, dtype))) if dtype else (x, y)


def parameter_count(widths) -> int:
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def state_budget_bytes(widths, world_size, itemsize=8) -> int:
    """What a rank may keep: 3 elements per element of its shard (Adam's two moments and, if wanted, a
    copy of the shard) plus BOOKKEEPING, in the parameters' dtype."""
    return (3 * math.ceil(parameter_count(widths) / world_size) + BOOKKEEPING) * itemsize


def run_settings(inputs, run) -> dict:
    """A run's settings: the launch's (``inputs``, over SHARDED_INPUTS), then the run's own (``lr``, ``betas``,
    ``eps``, ``steps``, ``rows``, ``seed``, ``call``: how ShardedAdam is built, "keywords" by default)."""
    return {**SHARDED_INPUTS, **(inputs or {}), **run}


def kept_tensor_bytes(root, exclude, namespace=None, by_dtype=None) -> int:
    """Bytes of every tensor storage reachable from ``root`` (attributes, containers, closures, attributes
    set on a tensor, a parameter's too; and from the student's module-level names in ``namespace``), each
    storage once, except those of ``exclude``. ``by_dtype``, a dict, receives those bytes per dtype
    ("torch.float64"; a numpy array's as the torch dtype of that name)."""
    import types

    import torch

    skip = {t.untyped_storage().data_ptr() for t in exclude if t is not None}
    todo = [root] + [v for k, v in (namespace or {}).items() if not k.startswith("__")]
    seen, storages = set(), {}  # storage -> (bytes, dtype)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (types.ModuleType, str, bytes, int, float, complex, bool, type(None))):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            local = obj.to_local() if hasattr(obj, "to_local") else obj
            storage = local.untyped_storage()
            if storage.data_ptr() not in skip:
                storages[storage.data_ptr()] = (storage.nbytes(), str(local.dtype))
            if obj.is_leaf:  # a leaf's .grad is kept with it; a non-leaf has none
                todo.append(obj.grad)
            todo += list(getattr(obj, "__dict__", {}).values())  # state set as attributes of a tensor (p.exp_avg)
        elif type(obj).__module__ == "numpy" and hasattr(obj, "nbytes"):  # state kept outside torch counts too
            storages[("numpy", id(obj))] = (int(obj.nbytes), f"torch.{obj.dtype}")
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
    if by_dtype is not None:
        for nbytes, dtype in storages.values():
            by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    return sum(nbytes for nbytes, _ in storages.values())


def drive_sharded_adam(ns, inputs=None):
    """On this rank, for every run of ``inputs`` (SHARDED_INPUTS by default; a run's own settings over the
    launch's, ``run_settings``): build the model (the same on every rank, float64 or the run's ``dtype``), the student's ShardedAdam over
    its parameters (as the run's ``call`` says: "keywords", "positional", "lr_only" or "defaults"), and for
    every step compute this rank's loss on its own rows, backward, drop the ``.grad`` of the parameters the run's
    ``drop`` list names for this step and rank (``{"step", "param", "ranks"}``), ``step()``; record the weights after
    every step and the bytes of the tensors the optimizer keeps (not the parameters, not their gradients), in
    all and per dtype."""
    import torch.distributed as dist
    from torch.nn import functional as F

    from gpucourse.checks.ddp import leave, settle
    from gpucourse.checks.ddp_harness import init_process_group
    from gpucourse.checks.lesson13_sharded_data_parallel import build_model, kept_tensor_bytes, rank_rows, run_settings

    inputs = inputs or {}
    init_process_group(device="cpu")  # the model and its rows live on the CPU: gloo, whatever GPUs there are
    rank, world = dist.get_rank(), dist.get_world_size()
    records = []
    for run in run_settings(inputs, {})["runs"]:
        s = run_settings(inputs, run)
        widths = s["widths"]
        model = build_model(widths, s["seed"], s.get("dtype"))
        record = {"widths": widths, "weights": [], "state_bytes": None}
        try:
            cls, lr, betas, eps = ns["ShardedAdam"], s["lr"], tuple(s["betas"]), s["eps"]
            how = s.get("call", "keywords")
            if how == "positional":
                optimizer = cls(model.parameters(), lr, betas, eps)
            elif how == "defaults":
                optimizer = cls(model.parameters())
            elif how == "lr_only":
                optimizer = cls(model.parameters(), lr=lr)
            else:
                optimizer = cls(model.parameters(), lr=lr, betas=betas, eps=eps)
            for step in range(s["steps"]):
                for p in model.parameters():
                    p.grad = None
                x, y = rank_rows(widths, s["seed"], step, rank, s["rows"], s.get("dtype"))
                F.mse_loss(model(x), y).backward()
                params = list(model.parameters())
                for drop in s.get("drop", []):  # parameters left without .grad on some ranks at some steps
                    if drop["step"] == step and rank in drop["ranks"]:
                        params[drop["param"]].grad = None
                optimizer.step()
                record["weights"].append([float(w) for p in model.parameters() for w in p.detach().reshape(-1)])
            params = list(model.parameters())
            record["state_by_dtype"] = {}
            record["state_bytes"] = kept_tensor_bytes(optimizer, params + [p.grad for p in params], ns, record["state_by_dtype"])
            record["itemsize"], record["dtype"] = params[0].element_size(), str(params[0].dtype)
        except Exception as error:
            record["error"] = f"{type(error).__name__}: {str(error)[:200]}"
        records.append(record)
        if not settle("error" in record):  # a rank raised: every rank stops here, at once
            break
    leave()
    return {"rank": rank, "world_size": world, "runs": records}


def observe_sharded_adam(ns):
    from gpucourse.checks.ddp import run_exercise_script
    return run_exercise_script(ns, "sharded_adam")


def run_words(settings, world_size) -> str:
    """A run in a few words, for messages."""
    how = {"positional": ", ShardedAdam(params, lr, betas, eps)", "defaults": ", ShardedAdam(params): the defaults",
           "lr_only": ", ShardedAdam(params, lr=...)"}.get(settings.get("call"), "")
    dropped = ", some parameters without .grad on some processes (zeros there)" if settings.get("drop") else ""
    dtype = f", {settings['dtype']} parameters" if settings.get("dtype") else ""
    return (f"{world_size} ranks, widths {settings['widths']} ({parameter_count(settings['widths'])} parameters{dtype}), "
            f"{settings['steps']} steps{how}{dropped}")


def launch_problem(d, inputs=None, world_size=2) -> str | None:
    """What is wrong with a launch's record before any expected value: a rank that did not report, saw
    another world size, raised, or ended a step with weights that differ from another rank's, or of
    another count than the model's."""
    ran = judge_script_ran(d, world_size)
    if ran:
        return ran
    ranks = d["ranks"]
    runs = run_settings(inputs, {})["runs"]
    for rank, r in sorted(ranks.items()):
        if r.get("world_size") != world_size:
            return f"rank {rank} saw world size {r.get('world_size')}, not {world_size}"
    raised = first_raised(ranks, len(runs))  # before the count: every rank stops at the run where one raised
    if raised:
        i, rank, error = raised
        return f"{run_words(run_settings(inputs, runs[i]), world_size)}, rank {rank}: ShardedAdam raised {error}"
    for rank, r in sorted(ranks.items()):
        if not isinstance(r.get("runs"), list) or len(r["runs"]) != len(runs):
            return f"rank {rank} reported {len(r.get('runs') or [])} runs, not {len(runs)}"
    for i, run in enumerate(runs):
        s = run_settings(inputs, run)
        where = run_words(s, world_size)
        for step in range(s["steps"]):
            mine = [ranks[str(k)]["runs"][i]["weights"][step] if step < len(ranks[str(k)]["runs"][i]["weights"]) else None
                    for k in range(world_size)]
            if mine[0] is None or any(m != mine[0] for m in mine[1:]):
                return (f"{where}: after step {step + 1} the ranks hold different weights: every rank must end "
                        "a step with all the updated parameters")
            if len(mine[0]) != parameter_count(s["widths"]):
                return f"{where}: after step {step + 1} the model has {len(mine[0])} weights, not {parameter_count(s['widths'])}"
    return None


def tensor_sums(weights, widths) -> list[list[float]]:
    """Per parameter tensor (each layer's weight, then its bias): the sum of its elements and their sum with
    signs of a fixed pseudo-random pattern. Two sums per tensor are what the public judge stores."""
    import random

    signs = random.Random(13)
    out, at = [], 0
    for a, b in zip(widths, widths[1:]):
        for size in (a * b, b):
            part = weights[at:at + size]
            at += size
            out.append([math.fsum(part), math.fsum(w if signs.random() < 0.5 else -w for w in part)])
    return out


def tensor_names(widths) -> list[str]:
    return [f"layer {i + 1}'s {kind}" for i in range(len(widths) - 1) for kind in ("weight", "bias")]


# DDP + Adam's weights on SHARDED_INPUTS (2 ranks), summed per tensor (``tensor_sums``) after each step:
# computed once by the grader's reference and stored, so that this module holds no way to compute them.
SHARDED_PUBLIC_SUMS = [  # [step][tensor] -> [sum, signed sum]; tensors: layer 1's weight, bias, layer 2's weight, bias
    [[-0.8871477268396185, 0.528274746930601], [0.6952239980572945, 0.742311731471857],
     [0.5647278223069468, 0.1837320012831186], [0.0364388462571109, -0.22019348250452675]],
    [[-0.7729168635532889, 0.43842191049491247], [0.675761702709247, 0.6956705223989451],
     [0.5262385469030538, 0.11761795825640559], [0.03854377357688207, -0.20235254545577297]],
    [[-0.7289181995670644, 0.48616324920787063], [0.6705762931354574, 0.7384160447673691],
     [0.4624930942299448, 0.09128939472385159], [0.02897320784614213, -0.19632502167039562]],
    [[-0.7564358903944349, 0.2871185388409461], [0.6659473268339677, 0.7762964306234345],
     [0.4114986982891396, 0.07448387839249389], [0.019695864952862657, -0.1940351504377146]],
]
SUM_TOLERANCE = 1e-9  # float64: a right answer differs by rounding only (about 1e-15 here)


def judge_weights(d):
    """The public launch: it ran on 2 ranks, every rank holds the same weights after every step, and their
    sums per tensor are DDP + Adam's (stored, ``SHARDED_PUBLIC_SUMS``)."""
    from gpucourse.checks.lesson13_sharded_data_parallel import (SHARDED_INPUTS, SHARDED_PUBLIC_SUMS, SUM_TOLERANCE, run_words,
                                                                 tensor_names, tensor_sums)

    problem = launch_problem(d, None, 2)
    if problem:
        return problem
    s = run_settings(None, SHARDED_INPUTS["runs"][0])
    names = tensor_names(s["widths"])
    for step, stored in enumerate(SHARDED_PUBLIC_SUMS):
        sums = tensor_sums(d["ranks"]["0"]["runs"][0]["weights"][step], s["widths"])
        for name, got, want in zip(names, sums, stored):
            if not all(abs(g - w) <= SUM_TOLERANCE for g, w in zip(got, want)):  # nan fails too
                return (f"{run_words(s, 2)}: after step {step + 1} the weights of {name} differ from DDP + Adam's "
                        "(float64, so only rounding may differ)")
    return None


def judge_state(d, inputs=None, world_size=2):
    """Every rank keeps at most 3 elements per element of its shard, plus bookkeeping, in every run."""
    ran = judge_script_ran(d, world_size)
    if ran:
        return ran
    raised = first_raised(d["ranks"], len(run_settings(inputs, {})["runs"]))
    if raised:
        return f"rank {raised[1]}: ShardedAdam raised {raised[2]}"
    for i, run in enumerate(run_settings(inputs, {})["runs"]):
        s = run_settings(inputs, run)
        budget = state_budget_bytes(s["widths"], world_size)
        full = 2 * parameter_count(s["widths"]) * 8
        for rank, r in sorted(d["ranks"].items()):
            got = r["runs"][i] if isinstance(r.get("runs"), list) and i < len(r["runs"]) else {"error": "no record"}
            if "error" in got:
                return f"rank {rank}: ShardedAdam raised {got['error']}"
            if got["state_bytes"] is None or got["state_bytes"] > budget:
                return (f"{run_words(s, world_size)}: rank {rank} keeps {got['state_bytes']} bytes of optimizer state; "
                        f"its shard allows at most {budget} (Adam's full state is {full})")
    return None


register("sharded_adam",
         Case("2 ranks, 4 steps: every rank ends each step with DDP + Adam's weights", observe_sharded_adam,
              judge_weights),
         Case("each rank keeps only its shard of optimizer state", observe_sharded_adam, judge_state),
         answers=[Answer("ShardedAdam", "class",
                         "a class ShardedAdam(params, lr, betas, eps) whose step() averages the gradients over all "
                         "processes, updates this rank's shard with Adam and all-gathers the parameters")],
         points=4, kind=Script(("ShardedAdam",), driver="gpucourse.checks.lesson13_sharded_data_parallel:drive_sharded_adam"))


# --- Exercise 1: shard boundaries with the padding rule ----------------------------------------------

# [numel, world_size] -> every rank's (start, stop), as the exercise's text works them out: stored, so that
# this public module holds no way to compute a shard range (the grader's reference lives with its hidden checks)
SHARD_PUBLIC = {(10, 4): [(0, 3), (3, 6), (6, 9), (9, 10)], (8, 2): [(0, 4), (4, 8)], (3, 1): [(0, 3)]}


def observe_shard_ranges(ns):
    """``shard_range`` on every rank of the public cases (``SHARD_PUBLIC``), as ``observe_calls`` reports it."""
    from gpucourse.checks import observe_calls
    from gpucourse.checks.lesson13_sharded_data_parallel import SHARD_PUBLIC
    from gpucourse.checks.values import describe

    calls = [{"args": describe([numel, rank, world]), "kwargs": describe({})}
             for numel, world in SHARD_PUBLIC for rank in range(world)]
    return observe_calls(ns, "shard_range", calls)


def judge_shard_ranges(observed):
    from gpucourse.checks.lesson13_sharded_data_parallel import SHARD_PUBLIC
    from gpucourse.checks.values import describe, type_words

    wanted = [(numel, rank, world, stored[rank]) for (numel, world), stored in SHARD_PUBLIC.items() for rank in range(world)]
    if not isinstance(observed, list) or len(observed) != len(wanted):
        return "the answer was not called on every public case"
    for (numel, rank, world, want), got in zip(wanted, observed):
        where = f"shard_range({numel}, {rank}, {world})"
        if not isinstance(got, dict) or "returned" not in got:
            raised = got.get("raised", ["an exception"])[0] if isinstance(got, dict) else "nothing"
            return f"{where} raised {raised}"
        if got["returned"] != describe(want):
            if type_words(got["returned"]) != "a tuple":
                return f"{where} returned {type_words(got['returned'])}: return a tuple of two ints (start, stop)"
            return f"{where} returned a wrong range; with chunks of ceil({numel}/{world}) and the padding dropped it is {want}"
    return None


register("shard_range",
         Case("10 elements on 4 ranks, 8 on 2, 3 on 1: chunks of ceil(numel / world_size)", observe_shard_ranges,
              judge_shard_ranges),
         answers=[Answer("shard_range", "function",
                         "a function shard_range(numel, rank, world_size) returning (start, stop), this rank's "
                         "elements of a flat vector padded to equal chunks")],
         points=1)

"""Public checks for lesson 7 (multi-GPU exercises run as scripts). Observers are self-contained: see lesson01_processes_threads.py.

Every exercise runs as a 2-process script under torchrun (gpucourse.checks.ddp); the *drivers* below
are what every rank does with the student's code, and each returns that rank's record.
"""

from __future__ import annotations

import os

from gpucourse.checks import Answer, Case, Script, register
from gpucourse.checks.ddp import first_raised, judge_script_ran

ASSIGNMENT = "lesson07_ddp_scripts"  # the course folder this module's exercises belong to

# --- Exercise 1: averaging gradients by hand ------------------------------------------------


AVERAGE_INPUTS = {"seed": 0, "steps": 3, "hidden": 8, "rows": [8, 5], "lr": 0.1, "momentum": 0.9}
# rows: this step's shard size on each rank. The grader draws other inputs at grading time for its hidden checks.


def average_model(hidden, head=False):
    """The model the average_gradients check trains: ``TinyNet(hidden)``, or with ``head`` a TinyNet with one
    more layer, ``head`` (Linear(1, 1)), that ``forward`` uses after ``body``: a model whose parameters are
    not all in ``body``. Built from torch's global generator, as TinyNet is."""
    import torch

    from gpucourse.ddp_scripts import TinyNet

    if not head:
        return TinyNet(hidden)

    class TinyNetWithHead(TinyNet):
        def __init__(self, hidden):
            super().__init__(hidden)
            self.head = torch.nn.Linear(1, 1)

        def forward(self, x):
            return self.head(self.body(x)).squeeze(-1)

    return TinyNetWithHead(hidden)


def drive_average_gradients(ns, inputs=None):
    """Train TinyNet on this rank's shards with the student's ``average_gradients`` after ``backward``;
    record, step by step, the gradients it leaves (zeros where a parameter has none, and which have
    none), and the weights at the end. ``inputs`` (AVERAGE_INPUTS by default): seed, steps, TinyNet's
    width, each rank's number of rows per step (unequal shards), SGD's lr and momentum; optionally
    ``head`` (``average_model``'s) and ``zero_rank``, a rank whose rows are all zeros (its first layer's
    weight gradient is then exactly zero there). Nothing here knows what the gradients should be: the
    judges compute that themselves."""
    import torch
    import torch.distributed as dist

    from gpucourse.checks.ddp_harness import init_process_group
    from gpucourse.checks.lesson07_ddp_scripts import AVERAGE_INPUTS, average_model
    from gpucourse.ddp_scripts import flat_grads, regression_batch

    inputs = {**AVERAGE_INPUTS, **(inputs or {})}
    device = init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if inputs.get("nodes"):  # the ranks as torchrun places them on that many machines: LOCAL_WORLD_SIZE is one node's
        import os

        local = world // inputs["nodes"]
        os.environ.update(LOCAL_WORLD_SIZE=str(local), LOCAL_RANK=str(rank % local), GROUP_RANK=str(rank // local),
                          NODE_RANK=str(rank // local), GROUP_WORLD_SIZE=str(inputs["nodes"]))
    rows = inputs["rows"][rank % len(inputs["rows"])]
    torch.manual_seed(inputs["seed"])
    mine = average_model(inputs["hidden"], inputs.get("head", False)).to(device)
    optimizer = torch.optim.SGD(mine.parameters(), lr=inputs["lr"], momentum=inputs["momentum"])
    loss_fn = torch.nn.MSELoss()
    grads, no_grad, kept_tensor = [], [], True
    for step in range(inputs["steps"]):
        x, y = regression_batch(step, rank, world, per_rank=max(inputs["rows"]), seed=inputs["seed"])
        x, y = x[:rows].to(device), y[:rows].to(device)
        if rank == inputs.get("zero_rank"):
            x = torch.zeros_like(x)
        optimizer.zero_grad()
        loss_fn(mine(x), y).backward()
        before = {name: p.grad for name, p in mine.named_parameters()}
        ns["average_gradients"](mine)
        no_grad.append(sorted(name for name, p in mine.named_parameters() if p.grad is None))
        kept_tensor = kept_tensor and all(isinstance(p.grad, torch.Tensor) and p.grad.shape == p.shape
                                          for name, p in mine.named_parameters() if before[name] is not None)
        grads.append([float(g) for g in flat_grads(mine).cpu()])
        optimizer.step()
    weights = torch.cat([p.detach().reshape(-1) for p in mine.parameters()]).cpu()
    record = {"rank": rank, "world_size": world, "rows": rows, "grads": grads, "no_grad": no_grad,
              "grads_in_place": kept_tensor, "steps": inputs["steps"], "weights": [float(w) for w in weights]}
    dist.barrier()
    dist.destroy_process_group()
    return record


def observe_average_gradients(ns):
    from gpucourse.checks.ddp import run_exercise_script
    return run_exercise_script(ns, "average_gradients")


def judge_same_weights(d, why):
    """Both ranks ran and ended with the same weights (``why``: what differing weights mean here)."""
    ran = judge_script_ran(d)
    if ran:
        return ran
    return why if d["ranks"]["0"]["weights"] != d["ranks"]["1"]["weights"] else None


def gap(got, want) -> float:
    """The largest difference between two lists of numbers (inf when their lengths differ; NaN is never close)."""
    if not isinstance(got, list) or len(got) != len(want):
        return float("inf")
    worst = 0.0
    for a, b in zip(got, want):
        d = abs(a - b)
        worst = max(worst, d if d == d else float("inf"))
    return worst


# The weights DDP ends with on AVERAGE_INPUTS (TinyNet(8): body, then the unused `spare`), stored: this
# module holds no way to compute them (the grader's reference lives with its hidden checks).
AVERAGE_PUBLIC_WEIGHTS = [
    -0.41740865, 0.45556247, -0.58967614, -0.65521801, -0.030043988, 0.31767032, 0.12099586, 0.27067459,
    -0.24221522, 0.15015903, -0.26402172, -0.16571368, -0.62481403, 0.1263399, -0.35858056, -0.77930039,
    -0.29537579, 0.79468757, -0.53165513, -1.0345138, 0.19265467, 0.68345082, -0.12403258, 0.0064900485,
    -0.39226589, 0.028567633, 0.34748042, -0.37835863, 0.26057783, -0.64555806, 0.1671519, 1.1813459, -0.040115546,
    -0.38223857, -0.22339746, -0.55860829, 0.14612654, 0.43296602, 0.44888178, -0.27220359, -1.6344962, 0.65357935,
    -0.54200786, -0.36801162, -1.7490946, -0.012504502, -1.0807651, 1.6505222, -0.38758996, -0.0255141, 0.4522377,
    0.70295823, 0.28063807, 0.095525071, 0.47410542
]


def _judge_matches_ddp(d):
    same = judge_same_weights(d, "after 3 steps the two ranks hold different weights: their gradients were not the same")
    if same:
        return same
    worst = max(gap(r["weights"], AVERAGE_PUBLIC_WEIGHTS) for r in d["ranks"].values())
    if not worst <= 1e-5:
        return f"the weights differ from DDP's by up to {worst:.3g}"
    return None


register("average_gradients", Case("both ranks end with DDP's weights", observe_average_gradients, _judge_matches_ddp),
         answers=[Answer("average_gradients", "function",
                         "a function average_gradients(model) that replaces every parameter's .grad with its mean "
                         "over all processes")],
         points=3, kind=Script(("average_gradients",), driver="gpucourse.checks.lesson07_ddp_scripts:drive_average_gradients"))


# --- Exercise 2: gradient accumulation with no_sync -----------------------------------------------

ACCUM_INPUTS = {"seed": 0, "hidden": 8, "lr": 0.1, "runs": [{"accum_steps": 2, "rows": [[4, 4, 4, 4], [4, 4, 4, 4]]}]}
# runs: each one trains a fresh model; rows[rank][i] is the size of micro-batch i on that rank.


def drive_accumulate(ns, inputs=None):
    """For each run of ``inputs`` (ACCUM_INPUTS by default): wrap a fresh model in DDP with a
    communication hook that counts the gradient all-reduces, call the student's ``train_accumulating`` on
    this rank's micro-batches, and record the weights it ends with. What they should be is the judges'
    business, never the rank's."""
    import math

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpucourse.checks.ddp import leave, settle
    from gpucourse.checks.ddp_harness import init_process_group
    from gpucourse.checks.lesson07_ddp_scripts import ACCUM_INPUTS
    from gpucourse.ddp_scripts import regression_batch

    inputs = {**ACCUM_INPUTS, **(inputs or {})}
    device = init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    records = []
    for index, run in enumerate(inputs["runs"]):
        accum, rows = run["accum_steps"], run["rows"]
        data = [[tuple(t.to(device) for t in regression_batch(1000 * index + 100 * r + i, per_rank=n, seed=inputs["seed"]))
                 for i, n in enumerate(rows[r])] for r in range(world)]
        torch.manual_seed(inputs["seed"] + index)
        model = nn.Sequential(nn.Linear(4, inputs["hidden"]), nn.Tanh(), nn.Linear(inputs["hidden"], 1), nn.Flatten(0)).to(device)
        rounds, own, in_hook = [], [], []

        def counting_hook(state, bucket):  # DDP's own averaging, counted: one round ends with the last bucket
            if bucket.is_last():
                rounds.append(1)
            in_hook.append(1)
            try:
                reduced = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()
            finally:
                in_hook.pop()
            return reduced.then(lambda fut: fut.value()[0])

        ddp_model = DDP(model)
        ddp_model.register_comm_hook(None, counting_hook)
        optimizer = torch.optim.SGD(ddp_model.parameters(), lr=inputs["lr"])
        record = {"run": index, "accum_steps": accum, "batches": len(rows[rank]),
                  "steps": math.ceil(len(rows[rank]) / accum), "rows": rows[rank]}
        group_class = type(dist.distributed_c10d._get_default_group())
        collectives = {}  # every collective of the process group the answer ran itself (not DDP's hook's)
        for name in ("allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "_allgather_base",
                     "allgather_into_tensor_coalesced", "reduce", "reduce_scatter", "_reduce_scatter_base",
                     "reduce_scatter_tensor_coalesced", "broadcast", "alltoall_base", "alltoall", "gather", "scatter"):
            if hasattr(group_class, name):
                collectives[name] = getattr(group_class, name)

        def counted(name, real):
            def collective(*args, **kwargs):
                if not in_hook:
                    own.append(name)
                return real(*args, **kwargs)
            return collective

        for name, real in collectives.items():
            setattr(group_class, name, counted(name, real))
        try:
            ns["train_accumulating"](ddp_model, list(data[rank]), accum, optimizer)
        except Exception as error:
            record["error"] = f"{type(error).__name__}: {str(error)[:200]}"
        finally:
            for name, real in collectives.items():
                setattr(group_class, name, real)
        record["rounds"] = len(rounds)
        record["own_collectives"] = sorted(set(own))
        record["own_collective_calls"] = len(own)
        record["weights"] = [float(w) for w in torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()]
        # the text: zero_grad() after every step, the last one too, so the next call starts from zero gradients
        record["gradients_left"] = sum(1 for p in model.parameters() if p.grad is not None and bool(p.grad.any()))
        records.append(record)
        if not settle("error" in record):  # a rank raised: every rank stops here, at once
            break
    leave()
    return {"rank": rank, "world_size": world, "runs": records}


def observe_accumulate(ns):
    from gpucourse.checks.ddp import run_exercise_script
    return run_exercise_script(ns, "accumulate_no_sync")


# The weights of one process training on both ranks' micro-batches of ACCUM_INPUTS (each rank's loss divided
# by accum_steps and the world size), stored: the grader's reference lives with its hidden checks.
ACCUM_PUBLIC_WEIGHTS = [
    -0.046558585, 0.30582947, -0.45055708, -0.38181475, -0.19574219, 0.1773129, 0.0031154866, 0.32734844,
    -0.035091206, 0.10766163, -0.14031757, -0.055844866, -0.54246706, -0.22004221, -0.29014385, -0.16480693,
    0.0882985, 0.44410074, -0.42359662, -0.40264153, 0.15446809, 0.49185053, -0.14816, 0.25671551, -0.083981156,
    0.020664411, 0.4443512, -0.3873578, -0.2044566, -0.27437517, -0.068209045, 0.5811581, -0.29133832, -0.21521302,
    -0.37093565, -0.41357842, -0.15319601, 0.47876829, 0.21250989, 0.13522132, -0.38115349, 0.025434352,
    -0.00049835601, -0.23995873, -0.56463617, -0.30270246, -0.043809526, 0.38798448, -0.56471056
]


def judge_accumulate_runs(d, runs=None, inputs=None, expected=None):
    """Every run of ``inputs`` (the judge's own; ACCUM_INPUTS by default), or those of ``runs``: no error,
    the same weights on both ranks, one all-reduce round per optimizer step, no collective of the answer's
    own, and the weights ``expected`` (per run: a list of weights, or a function of the run's index that
    computes them; ACCUM_PUBLIC_WEIGHTS by default)."""
    import math

    inputs = inputs or ACCUM_INPUTS
    expected = expected if expected is not None else [ACCUM_PUBLIC_WEIGHTS]
    ran = judge_script_ran(d)
    if ran:
        return ran
    ranks = d["ranks"]
    raised = first_raised(ranks, len(inputs["runs"]))  # before the count: every rank stops at the run where one raised
    if raised:
        i, rank, error = raised
        return (f"with accum_steps={inputs['runs'][i]['accum_steps']} and {len(inputs['runs'][i]['rows'][0])} "
                f"micro-batches, rank {rank}: train_accumulating raised {error}")
    if any(len(r["runs"]) != len(inputs["runs"]) for r in ranks.values()):
        return f"{len(ranks['0']['runs'])} of {len(inputs['runs'])} runs reported"
    for i, run in enumerate(inputs["runs"]):
        if runs is not None and i not in runs:
            continue
        batches = len(run["rows"][0])
        where = f"with accum_steps={run['accum_steps']} and {batches} micro-batches"
        for rank, r in sorted(ranks.items()):
            if "error" in r["runs"][i]:
                return f"{where}, rank {rank}: train_accumulating raised {r['runs'][i]['error']}"
        if ranks["0"]["runs"][i]["weights"] != ranks["1"]["runs"][i]["weights"]:
            return f"{where} the two ranks end with different weights: their gradients were not averaged before every step"
        for rank, r in sorted(ranks.items()):
            if r["runs"][i]["own_collective_calls"]:
                return (f"{where}, rank {rank}: train_accumulating ran {r['runs'][i]['own_collective_calls']} "
                        f"collective(s) of its own ({', '.join(r['runs'][i]['own_collectives'])}) besides DDP's: "
                        "all-reduce once per optimizer step, DDP's, with no_sync() on the other micro-batches")
        for rank, r in sorted(ranks.items()):
            got, steps = r["runs"][i]["rounds"], math.ceil(len(run["rows"][int(rank)]) / run["accum_steps"])
            if got > steps:
                return (f"{where}, rank {rank}: DDP all-reduced the gradients {got} times for {steps} optimizer step(s): "
                        "all-reduce once per optimizer step, not after every micro-batch")
            if got < steps:
                return f"{where}, rank {rank}: DDP all-reduced the gradients {got} times for {steps} optimizer step(s)"
        want = expected(i) if callable(expected) else expected[i]
        worst = max(gap(r["runs"][i]["weights"], want) for r in ranks.values())
        if not worst <= 1e-5:  # NaN is never close
            return (f"{where} the weights differ from one process training on both ranks' micro-batches "
                    f"by up to {worst:.3g}")
        for rank, r in sorted(ranks.items()):
            if r["runs"][i].get("gradients_left"):
                return (f"{where}, rank {rank}: {r['runs'][i]['gradients_left']} parameter(s) still hold gradients when "
                        "train_accumulating returns: optimizer.step(), then optimizer.zero_grad(), after every group, "
                        "the last, shorter one too")
    return None


register("accumulate_no_sync", Case("accum_steps=2, 4 micro-batches: one all-reduce per step, the weights of one process",
                                    observe_accumulate, judge_accumulate_runs),
         answers=[Answer("train_accumulating", "function",
                         "a function train_accumulating(ddp_model, batches, accum_steps, optimizer) that steps once "
                         "per accum_steps micro-batches and all-reduces gradients only before each step")],
         points=2, kind=Script(("train_accumulating",), driver="gpucourse.checks.lesson07_ddp_scripts:drive_accumulate"))


# --- Exercise 3: a Lightning DDP script with synced metrics ----------------------------------

SYNCED_INPUTS = {"seed": 0, "train_rows": 24, "train_batch": 4, "val_rows": 15, "val_batch": 3, "outlier": 5, "max_epochs": 3}
# 15 validation rows: DistributedSampler pads them to 16 (rank 1 sees row 0 twice), and each rank's 8 rows come in
# batches of 3, 3 and 2. The outlier, an odd row, is seen by rank 1 only.


def drive_synced_metrics(ns, inputs=None):
    """Fit the student's module with the student's Trainer on this rank; record weights, what was logged
    after each validation epoch and the module's predictions on the whole validation set at that moment.
    The judges rebuild the validation set from the inputs and compute the true metrics themselves."""
    import warnings

    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from gpucourse.checks.ddp_harness import gpu_per_rank
    from gpucourse.checks.lesson07_ddp_scripts import SYNCED_INPUTS
    from gpucourse.ddp_scripts import regression_batch

    warnings.filterwarnings("ignore")  # Lightning's advice about workers and logging: not the point here
    inputs = {**SYNCED_INPUTS, **(inputs or {})}
    x, y = regression_batch(0, per_rank=inputs["train_rows"], seed=inputs["seed"])
    xv, yv = regression_batch(1, per_rank=inputs["val_rows"], seed=inputs["seed"])
    yv[inputs["outlier"]] += inputs.get("outlier_shift", 25.0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    train = DataLoader(TensorDataset(x, y), batch_size=inputs["train_batch"])
    val = DataLoader(TensorDataset(xv, yv), batch_size=inputs["val_batch"])
    accelerator = "gpu" if gpu_per_rank() else "cpu"

    probe = {}
    try:  # make_trainer must pass its arguments on: another max_epochs, and a GPU where there is none
        other = ns["make_trainer"](max_epochs=inputs["max_epochs"] + 4, accelerator=accelerator, devices=world)
        probe["max_epochs"] = other.max_epochs
    except Exception as error:
        probe["max_epochs"] = f"raised {type(error).__name__}"
    try:  # and another device count: built with it, or refused where torchrun started another number of processes
        probe["one_device"] = ns["make_trainer"](max_epochs=1, accelerator=accelerator, devices=1).num_devices
    except Exception as error:
        probe["one_device"] = f"raised {type(error).__name__}"
    if accelerator == "cpu":
        try:
            ns["make_trainer"](max_epochs=1, accelerator="gpu", devices=world)
            probe["gpu_without_gpus"] = "built"
        except Exception:
            probe["gpu_without_gpus"] = "raised"

    epochs = []

    class Record(pl.Callback):
        def on_validation_end(self, trainer, module):
            if trainer.sanity_checking:
                return
            with torch.no_grad():
                predictions = module(xv.to(module.device)).reshape(-1).cpu().float()
            epochs.append({"logged": {k: float(v) for k, v in trainer.callback_metrics.items()
                                      if k.startswith("val") and torch.as_tensor(v).numel() == 1},
                           "predictions": [float(p) for p in predictions]})

    torch.manual_seed(0)
    model = ns["SyncedRegressor"]()
    trainer = ns["make_trainer"](max_epochs=inputs["max_epochs"], accelerator=accelerator, devices=world)
    trainer.callbacks.append(Record())
    trainer.fit(model, train, val)
    model = model.cpu().eval()
    with torch.no_grad():
        predictions = model(xv).reshape(-1).float()
    return {"rank": trainer.global_rank, "world_size": trainer.world_size, "num_devices": trainer.num_devices,
            "accelerator": type(trainer.accelerator).__name__, "strategy": type(trainer.strategy).__name__,
            "epochs": trainer.current_epoch, "max_epochs": inputs["max_epochs"], "probe": probe, "per_epoch": epochs,
            "weights": [round(float(w), 6) for p in model.parameters() for w in p.detach().reshape(-1)],
            "logged": {k: float(v) for k, v in trainer.callback_metrics.items() if torch.as_tensor(v).numel() == 1},
            "predictions": [float(p) for p in predictions]}


def observe_synced_metrics(ns):
    from gpucourse.checks.ddp import run_exercise_script
    return run_exercise_script(ns, "synced_metrics")


def validation_metrics(predictions, inputs=None, world_size=2) -> dict:
    """The metrics of ``predictions`` (a rank's report of the module's outputs on the validation set) over
    the validation set of ``inputs``, rebuilt here: the mean squared error over the set, over the set as
    DistributedSampler pads it, and the largest absolute error. Run by the judges, never by a rank."""
    from gpucourse.checks.lesson07_ddp_scripts import SYNCED_INPUTS
    from gpucourse.ddp_scripts import regression_batch

    inputs = {**SYNCED_INPUTS, **(inputs or {})}
    _, yv = regression_batch(1, per_rank=inputs["val_rows"], seed=inputs["seed"])
    targets = [float(t) for t in yv]
    targets[inputs["outlier"]] += inputs.get("outlier_shift", 25.0)
    if not isinstance(predictions, list) or len(predictions) != len(targets):
        return {}
    errors = [abs(p - t) for p, t in zip(predictions, targets)]
    padded = list(range(len(errors)))
    padded += padded[:(-len(padded)) % world_size]  # what DistributedSampler hands out, all ranks together
    return {"val_loss": [sum(e * e for e in errors) / len(errors), sum(errors[i] ** 2 for i in padded) / len(padded)],
            "val_max_error": [max(errors)]}


def judge_synced_metric(d, name, inputs=None):
    """Every rank logged ``name`` at the end of fit, and it equals the value over the whole validation set
    (the set itself or, for val_loss, the set as DistributedSampler pads it), computed here from the
    rank's reported predictions and the judge's own validation set."""
    for rank, r in sorted(d["ranks"].items()):
        if name not in r["logged"]:
            return f"rank {rank} has no {name!r} in trainer.callback_metrics"
        want = validation_metrics(r.get("predictions"), inputs).get(name)
        if not want:
            return f"rank {rank}: the module's predictions on the validation set could not be read"
        got = r["logged"][name]
        if all(not abs(got - w) <= 1e-4 * max(1.0, abs(w)) for w in want):
            return f"rank {rank}: {name} = {got:.4f}, but over the whole validation set it is {want[0]:.4f}"
    return None


def _judge_ddp_and_loss(d):
    same = judge_same_weights(d, "the ranks ended with different weights")
    if same:
        return same
    ranks = d["ranks"]
    if any(r["world_size"] != 2 for r in ranks.values()):
        return f"the Trainer saw world sizes {[r['world_size'] for r in ranks.values()]}, not 2"
    return judge_synced_metric(d, "val_loss")


register("synced_metrics", Case("DDP on 2 processes, identical weights, val_loss over all ranks",
                                observe_synced_metrics, _judge_ddp_and_loss),
         answers=[Answer("SyncedRegressor", "class",
                         'a LightningModule class SyncedRegressor() that logs "val_loss" and "val_max_error" '
                         "over the whole validation set"),
                  Answer("make_trainer", "function",
                         "a function make_trainer(max_epochs, accelerator, devices) returning a pl.Trainer that runs DDP")],
         points=3, kind=Script(("SyncedRegressor", "make_trainer"), driver="gpucourse.checks.lesson07_ddp_scripts:drive_synced_metrics"))

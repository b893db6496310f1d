"""Public checks for lesson 7 (multi-GPU exercises run as scripts). Observers are self-contained: see lesson01.py.

Both exercises run as 2-process scripts under torchrun (gpucourse.checks.ddp); the *drivers* below
are what every rank does with the student's code, and each returns that rank's record.
"""

from __future__ import annotations

import os

from gpucourse.checks import Answer, Case, Script, register
from gpucourse.checks.ddp import judge_script_ran

ASSIGNMENT = "lesson07_ddp_scripts"  # the course folder this module's exercises belong to

# --- Exercise 1: averaging gradients by hand ------------------------------------------------


AVERAGE_INPUTS = {"seed": 0, "steps": 3, "hidden": 8, "rows": [8, 5]}  # rows: this step's shard size on each rank


def drive_average_gradients(ns, inputs=None):
    """Train the same TinyNet twice on this rank's shards: with the student's ``average_gradients``
    after ``backward``, and wrapped in DDP. Record both, step by step. ``inputs`` (AVERAGE_INPUTS by
    default): seed, steps, TinyNet's width and each rank's number of rows per step (unequal shards)."""
    import copy

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpucourse.checks.ddp_harness import init_process_group
    from gpucourse.checks.lesson07 import AVERAGE_INPUTS
    from gpucourse.ddp_scripts import TinyNet, flat_grads, regression_batch

    inputs = {**AVERAGE_INPUTS, **(inputs or {})}
    device = init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = inputs["rows"][rank % len(inputs["rows"])]
    torch.manual_seed(inputs["seed"])
    mine = TinyNet(inputs["hidden"]).to(device)
    theirs = DDP(copy.deepcopy(mine), find_unused_parameters=True)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (mine, theirs)]
    loss_fn = torch.nn.MSELoss()
    grad_gaps, no_grad, kept_tensor = [], [], True
    for step in range(inputs["steps"]):
        x, y = regression_batch(step, rank, world, per_rank=max(inputs["rows"]), seed=inputs["seed"])
        x, y = x[:rows].to(device), y[:rows].to(device)
        for model, optimizer in zip((mine, theirs), optimizers):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            if model is mine:
                before = {name: p.grad for name, p in mine.named_parameters()}
                ns["average_gradients"](mine)
        no_grad.append(sorted(name for name, p in mine.named_parameters() if p.grad is None))
        kept_tensor = kept_tensor and all(isinstance(p.grad, torch.Tensor) and p.grad.shape == p.shape
                                          for name, p in mine.named_parameters() if before[name] is not None)
        grad_gaps.append(float((flat_grads(mine) - flat_grads(theirs.module)).abs().max()))
        for optimizer in optimizers:
            optimizer.step()
    weights = torch.cat([p.detach().reshape(-1) for p in mine.parameters()]).cpu()
    reference = torch.cat([p.detach().reshape(-1) for p in theirs.module.parameters()]).cpu()
    record = {"rank": rank, "world_size": world, "rows": rows, "grad_gaps": grad_gaps, "no_grad": no_grad,
              "grads_in_place": kept_tensor, "steps": inputs["steps"],
              "weights": [float(w) for w in weights], "max_gap_to_ddp": float((weights - reference).abs().max())}
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


def _judge_matches_ddp(d):
    same = judge_same_weights(d, "after 3 steps the two ranks hold different weights: their gradients were not the same")
    if same:
        return same
    ranks = d["ranks"]
    if max(r["max_gap_to_ddp"] for r in ranks.values()) > 1e-5:
        return f"the weights differ from DDP's by up to {max(r['max_gap_to_ddp'] for r in ranks.values()):.3g}"
    return None


register("average_gradients", Case("both ranks end with DDP's weights", observe_average_gradients, _judge_matches_ddp),
         answers=[Answer("average_gradients", "function",
                         "a function average_gradients(model) that replaces every parameter's .grad with its mean "
                         "over all processes")],
         points=3, kind=Script(("average_gradients",), driver="gpucourse.checks.lesson07:drive_average_gradients"))


# --- Exercise 2: a Lightning DDP script with synced metrics ----------------------------------

SYNCED_INPUTS = {"train_rows": 24, "train_batch": 4, "val_rows": 15, "val_batch": 3, "outlier": 5, "max_epochs": 3}
# 15 validation rows: DistributedSampler pads them to 16 (rank 1 sees row 0 twice), and each rank's 8 rows come in
# batches of 3, 3 and 2. The outlier, an odd row, is seen by rank 1 only.


def drive_synced_metrics(ns, inputs=None):
    """Fit the student's module with the student's Trainer on this rank; record weights, what was logged
    after each validation epoch, and the true validation metrics computed here over the whole validation
    set at that moment (and over the set as DistributedSampler pads it)."""
    import warnings

    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from gpucourse.checks.ddp_harness import gpu_per_rank
    from gpucourse.checks.lesson07 import SYNCED_INPUTS
    from gpucourse.ddp_scripts import regression_batch

    warnings.filterwarnings("ignore")  # Lightning's advice about workers and logging: not the point here
    inputs = {**SYNCED_INPUTS, **(inputs or {})}
    x, y = regression_batch(0, per_rank=inputs["train_rows"])
    xv, yv = regression_batch(1, per_rank=inputs["val_rows"])
    yv[inputs["outlier"]] += 25.0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    padded = list(range(len(xv)))
    padded += padded[:(-len(padded)) % world]  # what DistributedSampler hands out, all ranks together
    train = DataLoader(TensorDataset(x, y), batch_size=inputs["train_batch"])
    val = DataLoader(TensorDataset(xv, yv), batch_size=inputs["val_batch"])
    accelerator = "gpu" if gpu_per_rank() else "cpu"

    probe = {}
    try:  # make_trainer must pass its arguments on: another max_epochs, and a GPU where there is none
        other = ns["make_trainer"](max_epochs=inputs["max_epochs"] + 4, accelerator=accelerator, devices=world)
        probe["max_epochs"] = other.max_epochs
    except Exception as error:
        probe["max_epochs"] = f"raised {type(error).__name__}"
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
                errors = (module(xv.to(module.device)).reshape(-1).cpu().float() - yv).abs()
            epochs.append({"logged": {k: float(v) for k, v in trainer.callback_metrics.items()
                                      if k.startswith("val") and torch.as_tensor(v).numel() == 1},
                           "true_val_loss": float(errors.pow(2).mean()), "padded_val_loss": float(errors[padded].pow(2).mean()),
                           "true_max_error": float(errors.max())})

    torch.manual_seed(0)
    model = ns["SyncedRegressor"]()
    trainer = ns["make_trainer"](max_epochs=inputs["max_epochs"], accelerator=accelerator, devices=world)
    trainer.callbacks.append(Record())
    trainer.fit(model, train, val)
    model = model.cpu().eval()
    with torch.no_grad():
        errors = (model(xv).reshape(-1) - yv).abs()
    return {"rank": trainer.global_rank, "world_size": trainer.world_size, "num_devices": trainer.num_devices,
            "accelerator": type(trainer.accelerator).__name__, "strategy": type(trainer.strategy).__name__,
            "epochs": trainer.current_epoch, "max_epochs": inputs["max_epochs"], "probe": probe, "per_epoch": epochs,
            "weights": [round(float(w), 6) for p in model.parameters() for w in p.detach().reshape(-1)],
            "logged": {k: float(v) for k, v in trainer.callback_metrics.items() if torch.as_tensor(v).numel() == 1},
            "true_val_loss": float(errors.pow(2).mean()), "padded_val_loss": float(errors[padded].pow(2).mean()),
            "true_max_error": float(errors.max())}


def observe_synced_metrics(ns):
    from gpucourse.checks.ddp import run_exercise_script
    return run_exercise_script(ns, "synced_metrics")


def judge_synced_metric(d, name, truths):
    """Every rank logged ``name`` at the end of fit, and it equals the value over the whole validation set
    (any of ``truths``: the set itself, or the set as DistributedSampler pads it)."""
    for rank, r in sorted(d["ranks"].items()):
        if name not in r["logged"]:
            return f"rank {rank} has no {name!r} in trainer.callback_metrics"
        got, want = r["logged"][name], [r[t] for t in truths]
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
    return judge_synced_metric(d, "val_loss", ("true_val_loss", "padded_val_loss"))


register("synced_metrics", Case("DDP on 2 processes, identical weights, val_loss over all ranks",
                                observe_synced_metrics, _judge_ddp_and_loss),
         answers=[Answer("SyncedRegressor", "class",
                         'a LightningModule class SyncedRegressor() that logs "val_loss" and "val_max_error" '
                         "over the whole validation set"),
                  Answer("make_trainer", "function",
                         "a function make_trainer(max_epochs, accelerator, devices) returning a pl.Trainer that runs DDP")],
         points=3, kind=Script(("SyncedRegressor", "make_trainer"), driver="gpucourse.checks.lesson07:drive_synced_metrics"))

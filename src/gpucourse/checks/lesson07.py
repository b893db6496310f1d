"""Public checks for lesson 7 (multi-GPU exercises run as scripts). Observers are self-contained: see lesson01.py.

Both exercises run as 2-process scripts under torchrun (gpucourse.checks.ddp); the *drivers* below
are what every rank does with the student's code, and each returns that rank's record.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, Script, register
from gpucourse.checks.ddp import judge_script_ran

ASSIGNMENT = "lesson07_ddp_scripts"  # the course folder this module's exercises belong to

# --- Exercise 1: averaging gradients by hand ------------------------------------------------


def drive_average_gradients(ns):
    """Train the same TinyNet twice on this rank's shards: with the student's ``average_gradients``
    after ``backward``, and wrapped in DDP. Record both, step by step."""
    import copy

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpucourse.checks.ddp_harness import init_process_group
    from gpucourse.ddp_scripts import TinyNet, flat_grads, regression_batch

    device = init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    mine = TinyNet().to(device)
    theirs = DDP(copy.deepcopy(mine), find_unused_parameters=True)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (mine, theirs)]
    loss_fn = torch.nn.MSELoss()
    grad_gaps = []
    for step in range(3):
        x, y = (t.to(device) for t in regression_batch(step, rank, world))
        for model, optimizer in zip((mine, theirs), optimizers):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            if model is mine:
                ns["average_gradients"](mine)
        grad_gaps.append(float((flat_grads(mine) - flat_grads(theirs.module)).abs().max()))
        for optimizer in optimizers:
            optimizer.step()
    weights = torch.cat([p.detach().reshape(-1) for p in mine.parameters()]).cpu()
    reference = torch.cat([p.detach().reshape(-1) for p in theirs.module.parameters()]).cpu()
    record = {"rank": rank, "world_size": world, "grad_gaps": grad_gaps,
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

OUTLIER = 5  # an odd index: DistributedSampler gives it to rank 1, so only rank 1 sees the largest error


def drive_synced_metrics(ns):
    """Fit the student's module with the student's Trainer on this rank; record weights, logged
    metrics, and the true validation metrics computed here over the whole validation set."""
    import warnings

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from gpucourse.checks.ddp_harness import gpu_per_rank
    from gpucourse.ddp_scripts import regression_batch

    warnings.filterwarnings("ignore")  # Lightning's advice about workers and logging: not the point here
    x, y = regression_batch(0, per_rank=32)
    xv, yv = regression_batch(1, per_rank=16)
    yv[OUTLIER] += 25.0
    train = DataLoader(TensorDataset(x, y), batch_size=4)
    val = DataLoader(TensorDataset(xv, yv), batch_size=4)
    torch.manual_seed(0)
    model = ns["SyncedRegressor"]()
    trainer = ns["make_trainer"](max_epochs=2, accelerator="gpu" if gpu_per_rank() else "cpu", devices=2)
    trainer.fit(model, train, val)
    model = model.cpu().eval()
    with torch.no_grad():
        errors = (model(xv).reshape(-1) - yv).abs()
    return {"rank": trainer.global_rank, "world_size": trainer.world_size,
            "strategy": type(trainer.strategy).__name__, "epochs": trainer.current_epoch,
            "weights": [round(float(w), 6) for p in model.parameters() for w in p.detach().reshape(-1)],
            "logged": {k: float(v) for k, v in trainer.callback_metrics.items() if torch.as_tensor(v).numel() == 1},
            "true_val_loss": float(errors.pow(2).mean()), "true_max_error": float(errors.max())}


def observe_synced_metrics(ns):
    from gpucourse.checks.ddp import run_exercise_script
    return run_exercise_script(ns, "synced_metrics")


def judge_synced_metric(d, name, truth):
    """Every rank logged ``name`` and it equals the value over the whole validation set."""
    for rank, r in sorted(d["ranks"].items()):
        if name not in r["logged"]:
            return f"rank {rank} has no {name!r} in trainer.callback_metrics"
        if abs(r["logged"][name] - r[truth]) > 1e-4 * max(1.0, abs(r[truth])):
            return f"rank {rank}: {name} = {r['logged'][name]:.4f}, but over the whole validation set it is {r[truth]:.4f}"
    return None


def _judge_ddp_and_loss(d):
    same = judge_same_weights(d, "the ranks ended with different weights")
    if same:
        return same
    ranks = d["ranks"]
    if any(r["world_size"] != 2 for r in ranks.values()):
        return f"the Trainer saw world sizes {[r['world_size'] for r in ranks.values()]}, not 2"
    return judge_synced_metric(d, "val_loss", "true_val_loss")


register("synced_metrics", Case("DDP on 2 processes, identical weights, val_loss over all ranks",
                                observe_synced_metrics, _judge_ddp_and_loss),
         answers=[Answer("SyncedRegressor", "class",
                         'a LightningModule class SyncedRegressor() that logs "val_loss" and "val_max_error" '
                         "over the whole validation set"),
                  Answer("make_trainer", "function",
                         "a function make_trainer(max_epochs, accelerator, devices) returning a pl.Trainer that runs DDP")],
         points=3, kind=Script(("SyncedRegressor", "make_trainer"), driver="gpucourse.checks.lesson07:drive_synced_metrics"))

"""Hidden checks for lesson 7 (multi-GPU exercises as scripts). Never released.

Every exercise runs as a 2-process script. average_gradients and synced_metrics are launched once per
submission: the public and hidden cases share that launch (a launch costs seconds of start-up on every
rank), and the hidden judges look closer at the same records. accumulate_no_sync's hidden cases share a
second launch with generated inputs, made only when the public launch passed. The drivers' inputs
(gpucourse.checks.lesson07_ddp_scripts: AVERAGE_INPUTS, SYNCED_INPUTS) already differ from the text's picture:
unequal shards per rank, a validation set
DistributedSampler must pad, batches of unequal size, 3 epochs.
"""

from gpucourse.checks import Case
from gpucourse.checks.ddp import judge_script_ran
from gpucourse.checks.lesson07_ddp_scripts import (AVERAGE_INPUTS, _judge_matches_ddp, average_model, gap,
                                       judge_accumulate_runs, judge_synced_metric, observe_average_gradients,
                                       observe_synced_metrics, validation_metrics)


# --- average_gradients ----------------------------------------------------------------------------
# 1. after the call each parameter's .grad holds the mean of that gradient over all processes, exactly
#    DDP's, at every step                                                  -> "the gradients equal the mean ..." (public launch),
#                                                                             "drawn sizes ... 3 processes" (drawn launch)
# 2. called on every process: all processes end with the same weights      -> public case, drawn case
# 3. a parameter whose .grad is None is left alone (stays None)            -> "parameters without a gradient", drawn case
# 4. over all processes, whatever their number (dist.get_world_size(), not a constant 2)
#                                                                          -> the drawn launch runs 3 processes
# 5. every parameter of the model it is given, not only TinyNet's `body`   -> the drawn launch's model has a
#                                                                             `head` layer after `body`
# 6. only a None .grad is left alone: a gradient of zeros on one process still enters the mean (and that
#    process still joins that all-reduce)                                  -> the drawn launch: one rank's rows
#                                                                             all zeros (its first weight's gradient is 0)

def reference_average(inputs):
    """Each step's mean gradient over the ranks and the weights at the end, one process (grader side)."""
    import torch

    from gpucourse.checks.seeded import global_rng
    from gpucourse.ddp_scripts import flat_grads, regression_batch

    inputs = {**AVERAGE_INPUTS, **(inputs or {})}
    world = len(inputs["rows"])
    with global_rng():  # the grader's threads share torch's generator
        torch.manual_seed(inputs["seed"])
        model = average_model(inputs["hidden"], inputs.get("head", False))
    optimizer = torch.optim.SGD(model.parameters(), lr=inputs["lr"], momentum=inputs["momentum"])
    grads = []
    for step in range(inputs["steps"]):
        optimizer.zero_grad()
        for rank in range(world):
            rows = inputs["rows"][rank]
            x, y = regression_batch(step, rank, world, per_rank=max(inputs["rows"]), seed=inputs["seed"])
            x = torch.zeros_like(x) if rank == inputs.get("zero_rank") else x
            (torch.nn.functional.mse_loss(model(x[:rows]), y[:rows]) / world).backward()
        grads.append([float(g) for g in flat_grads(model)])
        optimizer.step()
    owners = [name for name, p in model.named_parameters() for _ in range(p.numel())]
    return {"grads": grads, "weights": [float(w) for p in model.parameters() for w in p.detach().reshape(-1)],
            "owners": owners}


def judge_average_launch(d, inputs=None):
    """Every rank: .grad tensors kept, None kept None, each step's gradients the mean over the ranks, the
    final weights DDP's (the reference's, computed here from the inputs)."""
    inputs = {**AVERAGE_INPUTS, **(inputs or {})}
    world = len(inputs["rows"])
    ran = judge_script_ran(d, world)
    if ran:
        return ran
    want = reference_average(inputs)
    where = f"{world} processes, shards of {inputs['rows']} rows"
    if inputs.get("head"):
        where += ", a model with a layer after body"
    if inputs.get("zero_rank") is not None:
        where += f", rank {inputs['zero_rank']}'s rows all zeros (a gradient of zeros there)"
    for rank, r in sorted(d["ranks"].items()):
        if r["world_size"] != world:
            return f"rank {rank} saw world size {r['world_size']}"
        if not r["grads_in_place"]:
            return f"rank {rank}: after average_gradients a parameter's .grad is not a tensor of the parameter's shape"
        if len(r["grads"]) != inputs["steps"] or len(r["no_grad"]) != inputs["steps"]:
            return f"rank {rank}: {len(r['grads'])} of {inputs['steps']} steps reported"
        for step, names in enumerate(r["no_grad"]):
            if names != ["spare.bias", "spare.weight"]:
                return (f"{where}, rank {rank}, step {step}: parameters without a gradient must keep .grad None; "
                        f"afterwards these had none: {names}")
        for step, (got, expected) in enumerate(zip(r["grads"], want["grads"])):
            worst = gap(got, expected)
            if not worst <= 1e-5:
                gaps = [abs(a - b) if a == a else float("inf") for a, b in zip(got, expected)] if len(got) == len(expected) else []
                at = f" (in {want['owners'][gaps.index(max(gaps))]})" if gaps else ""
                return (f"{where}, rank {rank}, step {step}: the gradients after average_gradients differ from their "
                        f"mean over all processes by up to {worst:.3g}{at}")
    weights = [r["weights"] for r in d["ranks"].values()]
    if any(w != weights[0] for w in weights[1:]):
        return f"{where}: the processes end with different weights"
    worst = gap(weights[0], want["weights"])
    return None if worst <= 1e-5 else f"{where}: the weights differ from DDP's by up to {worst:.3g}"


def judge_gradients_every_step(d):
    return judge_average_launch(d)


def judge_missing_gradients(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    steps = AVERAGE_INPUTS["steps"]
    for rank, r in sorted(d["ranks"].items()):
        if not isinstance(r.get("no_grad"), list) or len(r["no_grad"]) != steps:
            return f"rank {rank}: {len(r.get('no_grad') or [])} of {steps} steps reported"
        for step, names in enumerate(r["no_grad"]):
            if names != ["spare.bias", "spare.weight"]:
                return (f"rank {rank}, step {step}: parameters without a gradient must keep .grad None; "
                        f"afterwards these had none: {names}")
    return None


def draw_average_inputs(rng):
    """3 processes (a constant 2 shows) on 3 machines, one each (LOCAL_WORLD_SIZE 1: the world is all of them),
    shards of 1 to 9 rows each (equal or not), TinyNet 1 to 16 wide with a `head` layer after `body` (every
    parameter, not only body's), one rank's rows all zeros (its first weight's gradient is exactly zero
    there: still a gradient, not None), 1 to 4 steps, SGD with a drawn lr and momentum (0 included), a
    drawn seed."""
    rows = rng.choice([[1, 1, 1], [rng.randint(1, 9)] * 3, [rng.randint(1, 9) for _ in range(3)]])
    return {"seed": rng.randint(0, 10 ** 6), "steps": rng.randint(1, 4), "hidden": rng.choice([1, rng.randint(2, 16)]),
            "rows": rows, "lr": round(rng.uniform(0.01, 0.3), 4), "momentum": rng.choice([0.0, 0.5, 0.9]), "nodes": 3,
            "head": True, "zero_rank": rng.randrange(3)}


def observe_average_drawn(ns, inputs):
    from gpucourse.checks.ddp import run_exercise_script
    from gpucourse.checks.lesson07_ddp_scripts import _judge_matches_ddp

    public = run_exercise_script(ns, "average_gradients")
    if _judge_matches_ddp(public) is not None:  # not launched again: the public launch's failure says why
        return {**public, "public_only": True}
    return run_exercise_script(ns, "average_gradients", inputs=inputs, world_size=len(inputs["rows"]))


def judge_average_drawn(d, inputs):
    if d.get("public_only"):
        return f"(the public 2-process launch already failed) {_judge_matches_ddp(d)}"
    return judge_average_launch(d, inputs)


# --- accumulate_no_sync ---------------------------------------------------------------------------
# 1. one optimizer step per accum_steps micro-batches, gradients summed over the group   -> drawn case (weights)
# 2. each micro-batch's loss (MSE) divided by accum_steps                                 -> drawn case, public
# 3. a last, shorter group still steps, its losses still divided by accum_steps           -> drawn case
# 4. DDP all-reduces once per optimizer step: no_sync() on the group's other micro-batches -> drawn case, public
#    and no collective of the answer's own besides                                       -> drawn case, public
# 5. any accum_steps >= 1 (1: a step and an all-reduce after every micro-batch)           -> drawn case
# 6. the ranks' micro-batches may differ in size                                          -> drawn case
# The public launch is judged first; a submission that fails it is not launched again.

def reference_accumulate(inputs, index):
    """Run ``index`` of ``inputs``: the weights of one process training on both ranks' micro-batches (the
    same groups, each rank's loss divided by accum_steps and by the world size), computed here."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    from gpucourse.checks.seeded import global_rng
    from gpucourse.ddp_scripts import regression_batch

    world, run = 2, inputs["runs"][index]
    accum, rows = run["accum_steps"], run["rows"]
    data = [[regression_batch(1000 * index + 100 * r + i, per_rank=n, seed=inputs["seed"]) for i, n in enumerate(rows[r])]
            for r in range(world)]
    with global_rng():
        torch.manual_seed(inputs["seed"] + index)
        model = nn.Sequential(nn.Linear(4, inputs["hidden"]), nn.Tanh(), nn.Linear(inputs["hidden"], 1), nn.Flatten(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=inputs["lr"])
    for start in range(0, len(rows[0]), accum):
        optimizer.zero_grad()
        for i in range(start, min(start + accum, len(rows[0]))):
            for r in range(world):
                x, y = data[r][i]
                (F.mse_loss(model(x), y) / accum / world).backward()
        optimizer.step()
    return [float(w) for p in model.parameters() for w in p.detach().reshape(-1)]


def draw_accumulate_inputs(rng):
    """Runs on one launch, boundaries first: accum_steps=1; a count accum_steps does not divide; fewer
    micro-batches than accum_steps; one micro-batch; unequal sizes on the two ranks; then drawn ones."""
    def sizes(count, equal=None):
        return [[equal or rng.randint(1, 9) for _ in range(count)] for _ in range(2)]

    k = rng.randint(2, 5)
    runs = [{"accum_steps": 1, "rows": sizes(rng.randint(2, 4), rng.randint(1, 6))},
            {"accum_steps": k, "rows": sizes(k * rng.randint(1, 2) + rng.randint(1, k - 1), rng.randint(1, 6))},
            {"accum_steps": k + 1, "rows": sizes(rng.randint(1, k))},
            {"accum_steps": rng.randint(1, 4), "rows": sizes(1)},
            {"accum_steps": rng.randint(2, 4), "rows": sizes(rng.randint(3, 7))}]
    return {"seed": rng.randint(1, 10 ** 6), "hidden": rng.randint(2, 12), "lr": round(rng.uniform(0.02, 0.3), 4),
            "runs": runs}


def observe_accumulate_drawn(ns, inputs):
    from gpucourse.checks.ddp import run_exercise_script
    from gpucourse.checks.lesson07_ddp_scripts import judge_accumulate_runs

    public = run_exercise_script(ns, "accumulate_no_sync")
    if judge_accumulate_runs(public) is not None:
        return {**public, "public_only": True}
    return run_exercise_script(ns, "accumulate_no_sync", inputs=inputs)


def judge_accumulate_drawn(d, inputs):
    if d.get("public_only"):  # the public launch failed, so the drawn one was not made: say why
        return f"(the public launch already failed) {judge_accumulate_runs(d) or 'the drawn launch did not run'}"
    return judge_accumulate_runs(d, None, inputs, lambda i: reference_accumulate(inputs, i))


# --- synced_metrics -------------------------------------------------------------------------------
# 1. "val_loss": the mean squared error over the whole validation set (or over the set as
#    DistributedSampler pads it to equal shards), batches of unequal size  -> "val_loss over the whole set, every epoch"
# 2. "val_max_error": the largest absolute error over the whole set         -> "val_max_error is the largest error"
# 3. both with that value on every process, in trainer.callback_metrics     -> both of the above, per rank
# 4. logged every validation epoch (each epoch's own values)                -> both of the above, per epoch
# 5. make_trainer trains for max_epochs epochs                              -> "make_trainer passes max_epochs on"
# 6. DDP over the processes torchrun started, identical weights             -> "the Trainer runs DDP" (+ public)
# 7. on `accelerator`, with `devices` devices per machine                   -> "make_trainer passes accelerator and devices on"
# 8. logger, checkpoints and progress bar off: advice for speed, not graded (no result depends on it).

def judge_every_epoch(d, name, inputs=None):
    """Every rank, every validation epoch: ``name`` logged, equal to its value over that epoch's whole
    validation set (computed here from the rank's reported predictions and the judge's own targets)."""
    ran = judge_script_ran(d)
    if ran:
        return ran
    for rank, r in sorted(d["ranks"].items()):
        if len(r["per_epoch"]) != r["epochs"]:  # how many epochs ran is judged by "make_trainer passes max_epochs on"
            return f"rank {rank} validated {len(r['per_epoch'])} time(s) in {r['epochs']} epochs"
        for epoch, e in enumerate(r["per_epoch"]):
            if name not in e["logged"]:
                return f"rank {rank}, epoch {epoch}: no {name!r} in trainer.callback_metrics after validation"
            want = validation_metrics(e.get("predictions"), inputs).get(name)
            if not want:
                return f"rank {rank}, epoch {epoch}: the module's predictions could not be read"
            got = e["logged"][name]
            if all(not abs(got - w) <= 1e-4 * max(1.0, abs(w)) for w in want):
                return (f"rank {rank}, epoch {epoch}: {name} = {got:.4f}, but over that epoch's whole validation "
                        f"set it is {want[0]:.4f}")
    return judge_synced_metric(d, name, inputs)


def judge_trained_with_ddp(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    for rank, r in sorted(d["ranks"].items()):
        if r["strategy"] != "DDPStrategy" or r["world_size"] != 2:
            return (f"rank {rank} trained with {r['strategy']} in a world of {r['world_size']}, not DDP over the "
                    "processes torchrun started")
    return None


def judge_max_epochs(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    for rank, r in sorted(d["ranks"].items()):
        if r["epochs"] != r["max_epochs"]:
            return f"rank {rank}: make_trainer(max_epochs={r['max_epochs']}) trained {r['epochs']} epoch(s)"
        if r["probe"]["max_epochs"] != r["max_epochs"] + 4:
            return f"rank {rank}: make_trainer(max_epochs={r['max_epochs'] + 4}) gave a Trainer with max_epochs={r['probe']['max_epochs']}"
    return None


def judge_accelerator_and_devices(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    for rank, r in sorted(d["ranks"].items()):
        if r["num_devices"] != 2:
            return f"rank {rank}: make_trainer(devices=2) gave a Trainer with {r['num_devices']} device(s)"
        one = r["probe"].get("one_device", 1)  # 1, or refused: torchrun started another number of processes
        if one != 1 and not str(one).startswith("raised"):
            return f"rank {rank}: make_trainer(devices=1) gave a Trainer with {one} device(s): it must use the devices it is given"
        if r["probe"].get("gpu_without_gpus", "raised") != "raised":
            return (f"rank {rank}: on a machine without GPUs, make_trainer(accelerator='gpu') built a Trainer anyway: "
                    "it must use the accelerator it is given")
    return None


def draw_synced_inputs(rng):
    """Another validation set: an odd number of rows (DistributedSampler pads it), batches that do not divide
    a rank's share, the outlier on either rank and below its prediction (the largest error is then a
    negative one: a max of signed errors misses it), 1 or 2 epochs, another seed and training set."""
    val_rows = rng.choice([5, 7, 9, 11, 13])
    return {"seed": rng.randint(1, 10 ** 6), "train_rows": rng.choice([8, 12, 16]), "train_batch": rng.randint(2, 5),
            "val_rows": val_rows, "val_batch": rng.randint(2, 4), "outlier": rng.randrange(val_rows),
            "outlier_shift": -25.0, "max_epochs": rng.randint(1, 2)}


def observe_synced_drawn(ns, inputs):
    from gpucourse.checks.ddp import run_exercise_script
    from gpucourse.checks.lesson07_ddp_scripts import _judge_ddp_and_loss

    public = run_exercise_script(ns, "synced_metrics")
    if _judge_ddp_and_loss(public) is not None:
        return {**public, "public_only": True}
    return run_exercise_script(ns, "synced_metrics", inputs=inputs)


def judge_synced_drawn(d, inputs):
    from gpucourse.checks.lesson07_ddp_scripts import _judge_ddp_and_loss

    if d.get("public_only"):
        return f"(the public launch already failed) {_judge_ddp_and_loss(d)}"
    for check in (judge_trained_with_ddp, lambda r: judge_every_epoch(r, "val_loss", inputs),
                  lambda r: judge_every_epoch(r, "val_max_error", inputs), judge_max_epochs):
        verdict = check(d)
        if verdict:
            where = f"{inputs['val_rows']} validation rows in batches of {inputs['val_batch']}, {inputs['max_epochs']} epoch(s)"
            return f"{where}: {verdict}"
    return None


HIDDEN = {
    "average_gradients": [
        Case("the gradients equal the mean over the processes after every step, with shards of unequal size",
             observe_average_gradients, judge_gradients_every_step),
        Case("parameters without a gradient keep .grad None", observe_average_gradients, judge_missing_gradients),
        Case("drawn sizes, seed, lr and momentum on 3 processes: the gradients are the mean over all of them, "
             "the weights DDP's; every parameter of the model (a layer outside body too); a gradient of zeros on "
             "one process is still averaged", observe_average_drawn, judge_average_drawn, draw=draw_average_inputs),
    ],
    "accumulate_no_sync": [
        Case("drawn accum_steps (1 too) and micro-batch counts it may not divide, sizes unequal across ranks: one "
             "all-reduce per step, the weights of one process", observe_accumulate_drawn, judge_accumulate_drawn,
             draw=draw_accumulate_inputs),
    ],
    "synced_metrics": [
        Case("val_loss over the whole set, every epoch, every rank", observe_synced_metrics,
             lambda d: judge_every_epoch(d, "val_loss")),
        Case("val_max_error is the largest error over all ranks, every epoch, every rank", observe_synced_metrics,
             lambda d: judge_every_epoch(d, "val_max_error")),
        Case("the Trainer runs DDP over the processes torchrun started", observe_synced_metrics, judge_trained_with_ddp),
        Case("make_trainer passes max_epochs on", observe_synced_metrics, judge_max_epochs),
        Case("make_trainer passes accelerator and devices on", observe_synced_metrics, judge_accelerator_and_devices),
        Case("a drawn validation set, batch sizes, outlier and epochs: both metrics over the whole set, every epoch",
             observe_synced_drawn, judge_synced_drawn, draw=draw_synced_inputs),
    ],
}

AVG = [c.name for c in HIDDEN["average_gradients"]]
SYN = [c.name for c in HIDDEN["synced_metrics"]]
ACC = HIDDEN["accumulate_no_sync"][0].name
ACC_PUBLIC = "accum_steps=2, 4 micro-batches: one all-reduce per step, the weights of one process"
CLAUSES = {
    "average_gradients": {
        "afterwards each parameter's .grad holds the mean of that gradient over all processes, exactly DDP's":
            [AVG[0], AVG[2], "both ranks end with DDP's weights"],
        "called on every process: all processes end with the same weights": ["both ranks end with DDP's weights", AVG[2]],
        "a parameter whose .grad is None is left alone (only None: a gradient of zeros is still averaged)":
            [AVG[1], AVG[2]],
        "each parameter of the model it is given (not only TinyNet's body)": [AVG[2]],
        "over all processes, whatever their number (dist.get_world_size()), on any number of machines (not "
        "LOCAL_WORLD_SIZE)": [AVG[2]],
    },
    "accumulate_no_sync": {
        "the loss of a micro-batch is F.mse_loss(ddp_model(x), y) / accum_steps": [ACC_PUBLIC, ACC],
        "optimizer.step() then zero_grad() after every accum_steps micro-batches, for any accum_steps": [ACC_PUBLIC, ACC],
        "the last, shorter group steps too, its losses still divided by accum_steps": [ACC],
        "the gradients zero when it returns (zero_grad after the last step too), as when it was called": [ACC_PUBLIC, ACC],
        "DDP all-reduces once per optimizer step (no_sync on the others), no collective of its own": [ACC_PUBLIC, ACC],
        "the other process's micro-batches may be of other sizes": [ACC],
    },
    "synced_metrics": {
        "val_loss: the mean squared error over the whole validation set, every validation epoch": [SYN[0], SYN[5]],
        "val_max_error: the largest absolute error over the whole validation set, every validation epoch (a "
        "negative error too)": [SYN[1], SYN[5]],
        "both with that value on every process": [SYN[0], SYN[1], "DDP on 2 processes, identical weights, val_loss over all ranks"],
        "make_trainer trains for max_epochs epochs": [SYN[3], SYN[5]],
        "DDP over the processes torchrun started": [SYN[2], "DDP on 2 processes, identical weights, val_loss over all ranks"],
        "on accelerator with devices devices per machine": [SYN[4]],
    },
}

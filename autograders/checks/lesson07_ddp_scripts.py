"""Hidden checks for lesson 7 (multi-GPU exercises as scripts). Never released.

Every exercise runs as a 2-process script. average_gradients and synced_metrics are launched once per
submission: the public and hidden cases share that launch (a launch costs seconds of start-up on every
rank), and the hidden judges look closer at the same records. accumulate_no_sync's hidden cases share a
second launch with generated inputs, made only when the public launch passed. The drivers' inputs
(gpucourse.checks.lesson07: AVERAGE_INPUTS, SYNCED_INPUTS) already differ from the text's picture: unequal shards per rank, a validation set
DistributedSampler must pad, batches of unequal size, 3 epochs.
"""

from gpucourse.checks import Case
from gpucourse.checks.ddp import judge_script_ran
from gpucourse.checks.lesson07 import (judge_accumulate_runs, judge_synced_metric, observe_average_gradients,
                                       observe_synced_metrics)


# --- average_gradients ----------------------------------------------------------------------------
# 1. after the call each parameter's .grad holds the mean of that gradient over all processes,
#    exactly DDP's, at every step (shards of 8 and 5 rows)                  -> "the gradients equal DDP's" (+ public weights)
# 2. called on every process: all processes end with the same weights      -> public "both ranks end with DDP's weights"
# 3. a parameter whose .grad is None is left alone (stays None)            -> "parameters without a gradient"
# 4. with torch.distributed and dist.get_world_size(): a constant 2 cannot be told apart with 2 processes,
#    so this clause is taught, not graded.

def judge_gradients_every_step(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    for rank, r in sorted(d["ranks"].items()):
        if r["world_size"] != 2:
            return f"rank {rank} saw world size {r['world_size']}"
        if not r["grads_in_place"]:
            return f"rank {rank}: after average_gradients a parameter's .grad is not a tensor of the parameter's shape"
        if len(r["grad_gaps"]) != 3:  # AVERAGE_INPUTS' steps
            return f"rank {rank}: {len(r['grad_gaps'])} of 3 steps reported"
        worst = max(r["grad_gaps"])
        if worst > 1e-6:
            step = r["grad_gaps"].index(worst)
            return f"rank {rank}, step {step}: the gradients after average_gradients differ from DDP's by {worst:.3g}"
    return None


def judge_missing_gradients(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    for rank, r in sorted(d["ranks"].items()):
        if len(r["no_grad"]) != 3:  # AVERAGE_INPUTS' steps
            return f"rank {rank}: {len(r['no_grad'])} of 3 steps reported"
        for step, names in enumerate(r["no_grad"]):
            if names != ["spare.bias", "spare.weight"]:
                return (f"rank {rank}, step {step}: parameters without a gradient must keep .grad None; "
                        f"afterwards these had none: {names}")
    return None


# --- accumulate_no_sync ---------------------------------------------------------------------------
# 1. one optimizer step per accum_steps micro-batches, gradients summed over the group   -> every case (weights)
# 2. each micro-batch's loss (MSE) divided by accum_steps                                 -> every case (weights)
# 3. a last, shorter group still steps, its losses still divided by accum_steps           -> "does not divide"
# 4. DDP all-reduces once per optimizer step: no_sync() on the group's other micro-batches -> every case (rounds)
#    and no collective of the answer's own besides (an all-reduce per step of its own)    -> every case (own collectives)
# 5. accum_steps=1: a step and an all-reduce after every micro-batch                      -> "accum_steps=1"
# 6. the ranks' micro-batches may differ in size: still the weights of one process        -> "unequal sizes"
#    averaging the ranks' mean losses
# The public launch (accum_steps=2, 4 equal micro-batches) is judged first; a submission that fails it is
# not launched again, and the hidden judges report the public record's failure.

def observe_accumulate_generated(ns):
    import random
    from gpucourse.checks.ddp import run_exercise_script
    from gpucourse.checks.lesson07 import judge_accumulate_runs

    public = run_exercise_script(ns, "accumulate_no_sync")
    if judge_accumulate_runs(public) is not None:
        return {**public, "public_only": True}
    rng = random.Random(71)
    equal = rng.randint(3, 6)
    runs = [{"accum_steps": 1, "rows": [[equal] * 3] * 2},
            {"accum_steps": 3, "rows": [[equal] * 7] * 2},   # 7 = 3 + 3 + 1
            {"accum_steps": 5, "rows": [[equal] * 3] * 2},   # fewer micro-batches than accum_steps
            {"accum_steps": 2, "rows": [[rng.randint(1, 9) for _ in range(6)] for _ in range(2)]}]
    inputs = {"seed": rng.randint(1, 999), "hidden": rng.choice([5, 12]), "lr": 0.1, "runs": runs}
    return run_exercise_script(ns, "accumulate_no_sync", inputs=inputs)


def accumulate_generated_inputs() -> dict:
    """observe_accumulate_generated's inputs, rebuilt here (the same seed)."""
    import random
    rng = random.Random(71)
    equal = rng.randint(3, 6)
    runs = [{"accum_steps": 1, "rows": [[equal] * 3] * 2},
            {"accum_steps": 3, "rows": [[equal] * 7] * 2},
            {"accum_steps": 5, "rows": [[equal] * 3] * 2},
            {"accum_steps": 2, "rows": [[rng.randint(1, 9) for _ in range(6)] for _ in range(2)]}]
    return {"seed": rng.randint(1, 999), "hidden": rng.choice([5, 12]), "lr": 0.1, "runs": runs}


def judge_accumulate_hidden(runs):
    def judge(d):
        if d.get("public_only"):  # the public launch failed, so the generated one was not made: say why
            return judge_accumulate_runs(d) or "the generated launch did not run"
        return judge_accumulate_runs(d, runs, accumulate_generated_inputs())
    return judge


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

def judge_every_epoch(d, name, truths):
    ran = judge_script_ran(d)
    if ran:
        return ran
    for rank, r in sorted(d["ranks"].items()):
        if len(r["per_epoch"]) != r["epochs"]:  # how many epochs ran is judged by "make_trainer passes max_epochs on"
            return f"rank {rank} validated {len(r['per_epoch'])} time(s) in {r['epochs']} epochs"
        for epoch, e in enumerate(r["per_epoch"]):
            if name not in e["logged"]:
                return f"rank {rank}, epoch {epoch}: no {name!r} in trainer.callback_metrics after validation"
            got, want = e["logged"][name], [e[t] for t in truths]
            if all(not abs(got - w) <= 1e-4 * max(1.0, abs(w)) for w in want):
                return (f"rank {rank}, epoch {epoch}: {name} = {got:.4f}, but over that epoch's whole validation "
                        f"set it is {want[0]:.4f}")
    return judge_synced_metric(d, name, truths)


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
        if r["probe"].get("gpu_without_gpus", "raised") != "raised":
            return (f"rank {rank}: on a machine without GPUs, make_trainer(accelerator='gpu') built a Trainer anyway: "
                    "it must use the accelerator it is given")
    return None


HIDDEN = {
    "average_gradients": [
        Case("the gradients equal DDP's after every step, with shards of unequal size", observe_average_gradients,
             judge_gradients_every_step),
        Case("parameters without a gradient keep .grad None", observe_average_gradients, judge_missing_gradients),
    ],
    "accumulate_no_sync": [
        Case("accum_steps=1: a step and an all-reduce after every micro-batch", observe_accumulate_generated,
             judge_accumulate_hidden([0])),
        Case("a count of micro-batches accum_steps does not divide: the last, shorter group steps too",
             observe_accumulate_generated, judge_accumulate_hidden([1, 2])),
        Case("micro-batches of unequal sizes on the two ranks", observe_accumulate_generated, judge_accumulate_hidden([3])),
    ],
    "synced_metrics": [
        Case("val_loss over the whole set, every epoch, every rank", observe_synced_metrics,
             lambda d: judge_every_epoch(d, "val_loss", ("true_val_loss", "padded_val_loss"))),
        Case("val_max_error is the largest error over all ranks, every epoch, every rank", observe_synced_metrics,
             lambda d: judge_every_epoch(d, "val_max_error", ("true_max_error",))),
        Case("the Trainer runs DDP over the processes torchrun started", observe_synced_metrics, judge_trained_with_ddp),
        Case("make_trainer passes max_epochs on", observe_synced_metrics, judge_max_epochs),
        Case("make_trainer passes accelerator and devices on", observe_synced_metrics, judge_accelerator_and_devices),
    ],
}

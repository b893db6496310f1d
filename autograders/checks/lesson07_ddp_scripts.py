"""Hidden checks for lesson 7 (multi-GPU exercises as scripts). Never released.

Both exercises are launched once per submission as 2-process scripts (the public and hidden cases
share that launch); the hidden judges look closer at the same records.
"""

from gpucourse.checks import Case
from gpucourse.checks.ddp import judge_script_ran
from gpucourse.checks.lesson07 import judge_synced_metric, observe_average_gradients, observe_synced_metrics



def judge_gradients_every_step(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    for rank, r in sorted(d["ranks"].items()):
        if r["world_size"] != 2:
            return f"rank {rank} saw world size {r['world_size']}"
        worst = max(r["grad_gaps"])
        if worst > 1e-6:
            step = r["grad_gaps"].index(worst)
            return f"rank {rank}, step {step}: the gradients after average_gradients differ from DDP's by {worst:.3g}"
    return None


def judge_max_error_everywhere(d):
    ran = judge_script_ran(d)
    return ran or judge_synced_metric(d, "val_max_error", "true_max_error")


def judge_trained_with_ddp(d):
    ran = judge_script_ran(d)
    if ran:
        return ran
    for rank, r in sorted(d["ranks"].items()):
        if r["strategy"] != "DDPStrategy":
            return f"rank {rank} trained with {r['strategy']}, not DDP over the processes torchrun started"
        if r["epochs"] != 2:
            return f"rank {rank} stopped after {r['epochs']} epoch(s); make_trainer(max_epochs=2) must train 2"
    return None


HIDDEN = {
    "average_gradients": [Case("the gradients equal DDP's after every step", observe_average_gradients,
                               judge_gradients_every_step)],
    "synced_metrics": [
        Case("val_max_error is the largest error over all ranks, on every rank", observe_synced_metrics,
             judge_max_error_everywhere),
        Case("the Trainer runs DDP for max_epochs", observe_synced_metrics, judge_trained_with_ddp),
    ],
}

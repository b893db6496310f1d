"""Hidden checks for lesson 4 (mixed precision). Never released; see lesson01's file for the form."""

from gpucourse.checks import Case
from gpucourse.checks.lesson04 import observe_training  # same observation, stricter judge



def _steps(events):
    """Split the training events into one list per optimizer step (at each scale)."""
    steps, current = [], []
    for event in events:
        if event[0] == "scale" and any(e[0] == "scale" for e in current):
            steps.append(current)
            current = []
        current.append(event)
    return steps + [current] if current else steps


def judge_order(d):
    events = [tuple(e) for e in d["events"]]
    steps = _steps([e for e in events if e[0] != "forward"])
    if len(steps) != 3 * d["batches"]:
        return "one scaled loss, one backward and one optimizer update per batch"
    for number, step in enumerate(steps):
        names = [e[0] for e in step]
        try:
            backward, scaler_step, update = names.index("backward"), names.index("scaler.step"), names.index("update")
        except ValueError:
            return "each batch: scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update()"
        if not backward < scaler_step < update or "optimizer.step" not in names[scaler_step:update + 1]:
            return "the order within a batch is backward, then scaler.step(optimizer), then scaler.update()"
        if "unscale_" in names and not backward < names.index("unscale_") < scaler_step:
            return "unscale_ belongs between backward and scaler.step"
    zeroes = [i for i, e in enumerate(events) if e[0] == "zero_grad"]
    backwards = [i for i, e in enumerate(events) if e[0] == "backward"]
    updates = [i for i, e in enumerate(events) if e[0] == "update"]
    for previous_update, backward in zip(updates, backwards[1:]):
        if not any(previous_update < z < backward for z in zeroes):
            return "gradients must be zeroed between one update and the next backward"
    mean_losses = []
    scaled = [e[1] for e in events if e[0] == "scale"]
    for epoch in range(3):
        chunk = scaled[epoch * d["batches"]:(epoch + 1) * d["batches"]]
        mean_losses.append(sum(chunk) / len(chunk))
    if any(abs(a - b) > 1e-3 * max(1.0, abs(b)) for a, b in zip(d["losses"], mean_losses)):
        return "train_epoch must return the mean loss over the epoch's batches"
    return None


HIDDEN = {"train_epoch": [Case("step order, zeroed gradients, the mean loss", observe_training, judge_order)]}

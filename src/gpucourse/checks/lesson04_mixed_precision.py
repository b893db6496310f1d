"""Public checks for lesson 4 (automatic mixed precision). Observers are self-contained: see lesson01_processes_threads.py.

The training loop is graded on behaviour: the observer hands it a model, an optimizer and a
GradScaler that record what happens to them (forward under autocast or not, backward under autocast
or not, scale/step/update/zero_grad in which order) and the losses it saw. The clipped AMP step is
graded the same way: the order of the student's scaler calls, the norm returned, and the norm of the
gradients the optimizer really steps with.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson04_mixed_precision"  # the course folder this module's exercises belong to


def recording_scaler(record):
    """A ``torch.amp.GradScaler`` subclass that calls ``record(call, tensor)`` for the student's calls:
    ``("scale", loss)`` and ``("scaled", scaled loss)``, then ``("unscale_", None)``, ``("scaler.step", None)``,
    ``("update", None)``. Public and hidden observers import it (``GradScaler.step`` unscales by itself:
    only the student's own ``unscale_`` counts)."""
    import torch

    class RecordedScaler(torch.amp.GradScaler):
        inside_step = False

        def scale(self, outputs):
            record("scale", outputs)
            scaled = super().scale(outputs)
            record("scaled", scaled)
            return scaled

        def unscale_(self, optimizer):
            if not self.inside_step:
                record("unscale_", None)
            return super().unscale_(optimizer)

        def step(self, optimizer, *args, **kwargs):
            record("scaler.step", None)
            self.inside_step = True
            try:
                return super().step(optimizer, *args, **kwargs)
            finally:
                self.inside_step = False

        def update(self, new_scale=None):
            record("update", None)
            return super().update(new_scale)

    return RecordedScaler



def observe_training(ns):
    import torch
    from torch import nn
    from gpucourse.checks import answer
    from gpucourse.checks.lesson04_mixed_precision import recording_scaler

    events = []

    class Recorded(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 4))

        def forward(self, x):
            events.append(("forward", torch.is_autocast_enabled("cpu"), torch.is_grad_enabled()))
            out = self.net(x)
            if out.requires_grad:
                out.register_hook(lambda g: events.append(("backward", torch.is_autocast_enabled("cpu"))))
            return out

    class RecordedSGD(torch.optim.SGD):
        def step(self, closure=None):
            events.append(("optimizer.step",))
            return super().step(closure)

        def zero_grad(self, set_to_none=True):
            events.append(("zero_grad",))
            return super().zero_grad(set_to_none)

    def record(call, tensor):  # the student's scale/unscale_/step/update calls, in order
        if call == "scale":
            events.append(("scale", float(tensor.detach().float())))
        elif call != "scaled":
            events.append((call,))

    RecordedScaler = recording_scaler(record)

    torch.manual_seed(0)
    centres = torch.randn(4, 3, 8, 8) * 2
    labels = torch.arange(64) % 4
    images = centres[labels] + 0.3 * torch.randn(64, 3, 8, 8)
    loader = [(images[i:i + 16], labels[i:i + 16]) for i in range(0, 64, 16)]
    model = Recorded()
    optimizer = RecordedSGD(model.parameters(), lr=0.1)
    scaler = RecordedScaler("cpu", enabled=True)  # float16 on the CPU: a real loss scale
    losses = [float(answer(ns, "train_epoch")(model, loader, optimizer, scaler, "cpu", torch.float16)) for _ in range(3)]
    training = list(events)
    events.clear()
    accuracy = float(answer(ns, "evaluate")(model, loader, "cpu", torch.float16))
    with torch.no_grad():  # the trained model's predictions: the judge counts the right ones itself
        predictions = [int(p) for x, _ in loader for p in model.net(x).argmax(1)]
    return {"losses": losses, "events": training, "eval_events": list(events), "accuracy": accuracy,
            "predictions": predictions}


TRAINING_BATCHES = 4  # observe_training's loader: 64 items in batches of 16, labels arange(64) % 4


def _judge_autocast_and_loss(d):
    forwards = [e for e in d["events"] if e[0] == "forward"]
    backwards = [e for e in d["events"] if e[0] == "backward"]
    if not forwards or not all(e[1] for e in forwards):
        return "the forward pass (model and loss) must run under torch.autocast"
    if not backwards or any(e[1] for e in backwards):
        return "backward must run outside autocast"
    if sum(e[0] == "scale" for e in d["events"]) != 3 * TRAINING_BATCHES:
        return "every batch's loss goes through scaler.scale(loss) before backward"
    if len(d["losses"]) != 3:
        return "three epochs' losses expected"
    return None if d["losses"][-1] < d["losses"][0] else f"the loss did not go down over 3 epochs: {d['losses']}"


def _judge_evaluate(d):
    forwards = [e for e in d["eval_events"] if e[0] == "forward"]
    if not forwards or not all(e[1] and not e[2] for e in forwards):
        return "evaluate: forward under autocast and without gradients (torch.no_grad or inference_mode)"
    if len(d["predictions"]) != 64:
        return "the model's predictions could not be read"
    expected = sum(p == i % 4 for i, p in enumerate(d["predictions"])) / 64
    return None if abs(d["accuracy"] - expected) <= 1 / 64 else f"accuracy {d['accuracy']} is not the fraction of correct predictions"


register("train_epoch",
         Case("autocast around the forward, scaled backward outside it, loss going down", observe_training, _judge_autocast_and_loss),
         Case("evaluate under autocast and no_grad, returning accuracy", observe_training, _judge_evaluate),
         answers=[Answer("train_epoch", "function",
                         "a function train_epoch(model, loader, optimizer, scaler, device_type, dtype) "
                         "returning the epoch's mean loss, a float"),
                  Answer("evaluate", "function",
                         "a function evaluate(model, loader, device_type, dtype) returning the fraction of "
                         "correct predictions, a float")], points=4)


def observe_clipped_step(ns):
    import copy

    import torch
    from torch import nn
    from gpucourse.checks import answer
    from gpucourse.checks.lesson04_mixed_precision import recording_scaler

    events = []

    def record(call, tensor):
        if call == "scaled":
            if tensor.requires_grad:
                tensor.register_hook(lambda grad: events.append(("scaled backward",)))
        else:
            events.append((call,))

    class RecordedSGD(torch.optim.SGD):
        def step(self, closure=None):  # the gradient norm the update really uses
            grads = [p.grad.double().flatten() for group in self.param_groups for p in group["params"] if p.grad is not None]
            events.append(("optimizer.step", float(torch.cat(grads).norm()) if grads else None))
            return super().step(closure)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    inputs, targets = torch.randn(16, 6) * 4, torch.randint(0, 3, (16,))
    reference = copy.deepcopy(model)  # the true gradient norm: float32, no autocast, no scaling
    nn.functional.cross_entropy(reference(inputs), targets).backward()
    true_norm = float(torch.cat([p.grad.double().flatten() for p in reference.parameters()]).norm())
    max_norm = true_norm / 4  # the clip must act
    scaler = recording_scaler(record)("cpu", init_scale=2.0 ** 12)
    returned = answer(ns, "clipped_step")(model, inputs, targets, RecordedSGD(model.parameters(), lr=0.1), scaler,
                                          "cpu", torch.float16, max_norm)
    return {"events": [list(e) for e in events],
            "is_float": isinstance(returned, float), "type": type(returned).__name__,
            "returned": float(returned) if isinstance(returned, (int, float, torch.Tensor)) else None}


def _judge_clip_order(d):
    names = [e[0] for e in d["events"]]
    for name in ("scaled backward", "unscale_", "scaler.step", "update"):
        if names.count(name) != 1:
            return f"{name} happened {names.count(name)} times in one step"
    if not names.index("scaled backward") < names.index("unscale_") < names.index("scaler.step") < names.index("update"):
        return "the order is scaler.scale(loss).backward(), scaler.unscale_(optimizer), clipping, scaler.step, scaler.update"
    return None


# observe_clipped_step's gradients' true norm (float32, no autocast, no scaling; torch.manual_seed(0)), stored:
# this module computes no expected value of a graded exercise.
CLIP_TRUE_NORM = 0.9857488330584644


def clip_true_norm() -> float:
    return CLIP_TRUE_NORM


def _judge_clip_norms(d):
    true_norm = clip_true_norm()
    d = dict(d, true_norm=true_norm, max_norm=true_norm / 4)  # the judge's values, whatever was observed
    steps = [e for e in d["events"] if e[0] == "optimizer.step"]
    if not d["is_float"]:
        return f"clipped_step must return a float, not a {d['type']}"
    if not abs(d["returned"] - d["true_norm"]) <= 0.02 * d["true_norm"]:
        return (f"returned {d['returned']:.4g}, but the gradients' true norm is {d['true_norm']:.4g}: return the norm "
                "of the unscaled gradients, before clipping")
    if len(steps) != 1 or steps[0][1] is None or not abs(steps[0][1] - d["max_norm"]) <= 0.02 * d["max_norm"]:
        got = steps[0][1] if len(steps) == 1 else None
        return f"the optimizer stepped with gradients of norm {got}, not clipped to max_norm={d['max_norm']:.4g}"
    return None


register("clipped_step",
         Case("unscale_ between the scaled backward and scaler.step, then update", observe_clipped_step, _judge_clip_order),
         Case("the clip sees the true gradient norm and the optimizer gets clipped gradients", observe_clipped_step,
              _judge_clip_norms),
         answers=[Answer("clipped_step", "function",
                         "a function clipped_step(model, inputs, targets, optimizer, scaler, device_type, dtype, max_norm) "
                         "returning the gradients' total norm before clipping, a float")], points=2)

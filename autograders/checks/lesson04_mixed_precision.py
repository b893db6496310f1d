"""Hidden checks for lesson 4 (mixed precision). Never released; see lesson01's file for the form.

The training loop is observed, not read: a model, optimizer and GradScaler that record what happens
to them (see gpucourse.checks.lesson04), on a few tiny batches of unequal sizes, so that each case
costs milliseconds.
"""

from gpucourse.checks import Case


# --- train_epoch and evaluate ---------------------------------------------------------------
# What the exercise text and answer lines require:
#  train_epoch(model, loader, optimizer, scaler, device_type, dtype), for each (inputs, targets) batch:
#  1. move the batch to the model's device -> "batches moved to the model's device ..."
#  2. zero the gradients, in any way (zero_grad(), set_to_none, p.grad = None; before the backward
#     or after the update) -> "gradients zeroed between one update and the next backward"
#  3. the model's output and the cross-entropy loss under torch.autocast(device_type, dtype=dtype):
#     the device type and dtype given -> "autocast with the device type and dtype given ..."; the
#     loss itself cross-entropy, computed where autocast keeps it float32 -> "the loss: cross-entropy ..."
#  4. backpropagate scaler.scale(loss), outside autocast -> public "autocast around the forward ..."
#     and "the scaled loss backpropagated, then scaler.step, then scaler.update, once per batch"
#  5. then scaler.step(optimizer) and scaler.update() -> "the scaled loss backpropagated, ..."
#  6. return the epoch's mean loss (unscaled; over batches or over items) as a float -> "returns the
#     mean loss ..."
#  evaluate(model, loader, device_type, dtype):
#  7. the fraction of correct predictions (argmax) over all items, as a float -> "evaluate: the
#     fraction of correct predictions over all items ..."
#  8. under autocast (device type and dtype given) and without gradients -> public "evaluate under
#     autocast and no_grad ..." and "autocast with the device type and dtype given ..."
#  9. batches moved to the model's device -> "batches moved to the model's device ..."

def observe_amp_epoch(ns):
    import torch
    import torch.nn.functional as F
    from torch import nn
    from gpucourse.checks import answer
    from gpucourse.checks.lesson04 import recording_scaler

    events, moved = [], set()
    g = torch.Generator().manual_seed(4)
    sizes = [5, 8, 3]  # unequal: a mean over batches and a mean over items differ
    batches = [(torch.randn(n, 6, generator=g) * 3, torch.randint(0, 3, (n,), generator=g)) for n in sizes]
    ids = {id(t) for batch in batches for t in batch}

    def zeroed(params):
        return all(p.grad is None or not bool(p.grad.any()) for p in params)

    class Recorded(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(6, 3)

        def forward(self, x):
            out = self.net(x)
            index = sizes.index(len(x)) if len(x) in sizes else -1
            expected = float(F.cross_entropy(out.detach().float(), batches[index][1])) if index >= 0 else None
            events.append({"e": "forward", "autocast": torch.is_autocast_enabled("cpu"), "expected_loss": expected})
            if out.requires_grad:
                out.register_hook(lambda grad: events.append({"e": "backward", "zeroed": zeroed(self.parameters())}))
            return out

    class RecordedSGD(torch.optim.SGD):
        def step(self, closure=None):
            events.append({"e": "optimizer.step", "zeroed": zeroed(p for group in self.param_groups for p in group["params"])})
            return super().step(closure)

    def record(call, tensor):
        if call == "scale":
            events.append({"e": "scale", "value": float(tensor.detach().float()), "dtype": str(tensor.dtype)})
        elif call == "scaled":
            if tensor.requires_grad:
                tensor.register_hook(lambda grad: events.append({"e": "scaled backward"}))
        else:
            events.append({"e": call})

    RecordedScaler = recording_scaler(record)

    real_to = torch.Tensor.to

    def recording_to(self, *args, **kwargs):
        if id(self) in ids and (kwargs.get("device") is not None or (args and isinstance(args[0], (str, torch.device)))):
            moved.add(id(self))
        return real_to(self, *args, **kwargs)

    torch.manual_seed(4)
    model = Recorded()
    torch.Tensor.to = recording_to
    try:
        result = answer(ns, "train_epoch")(model, list(batches), RecordedSGD(model.parameters(), lr=0.05),
                                           RecordedScaler("cpu", init_scale=1024.0), "cpu", torch.float16)
    finally:
        torch.Tensor.to = real_to
    return {"events": events, "sizes": sizes, "moved": len(moved), "tensors": len(ids),
            "type": type(result).__name__, "is_float": isinstance(result, float),
            "value": float(result) if isinstance(result, (int, float, torch.Tensor)) and getattr(result, "numel", lambda: 1)() == 1 else None}


def _per_batch(events):
    """The events of each batch: a new batch starts at each forward pass."""
    batches = []
    for event in events:
        if event["e"] == "forward":
            batches.append([])
        if batches:
            batches[-1].append(event)
    return batches


def judge_zeroing(d):
    backwards = [e for e in d["events"] if e["e"] == "backward"]
    if len(backwards) != len(d["sizes"]):
        return f"{len(d['sizes'])} batches gave {len(backwards)} backward passes"
    if not all(e["zeroed"] for e in backwards):
        return "gradients from the previous batch were still there at the next backward: zero them every batch"
    return None


def judge_scaler_order(d):
    batches = _per_batch(d["events"])
    if len(batches) != len(d["sizes"]):
        return f"{len(d['sizes'])} batches gave {len(batches)} forward passes"
    for number, events in enumerate(batches):
        names = [e["e"] for e in events]
        for name in ("scale", "scaled backward", "scaler.step", "update"):
            if names.count(name) != 1:
                return (f"batch {number + 1}: {name} happened {names.count(name)} times; each batch: "
                        "scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update()")
        if names.count("optimizer.step") != 1:
            return f"batch {number + 1}: the optimizer stepped {names.count('optimizer.step')} times (scaler.step steps it)"
        if not names.index("scale") < names.index("scaled backward") < names.index("scaler.step") < names.index("update"):
            return f"batch {number + 1}: the order is scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update()"
        if "unscale_" in names and not names.index("scaled backward") < names.index("unscale_") < names.index("scaler.step"):
            return "unscale_ belongs between backward and scaler.step"
        if next(e for e in events if e["e"] == "optimizer.step")["zeroed"]:
            return f"batch {number + 1}: the optimizer stepped with zeroed gradients"
    return None


def judge_loss(d):
    for number, events in enumerate(_per_batch(d["events"])):
        forward = events[0]
        scaled = [e for e in events if e["e"] == "scale"]
        if not scaled:
            return f"batch {number + 1}: no loss went through scaler.scale"
        if scaled[0]["dtype"] != "torch.float32":
            return f"the loss came out in {scaled[0]['dtype']}: compute it under autocast, which keeps it in float32"
        expected = forward["expected_loss"]
        if expected is None or not abs(scaled[0]["value"] - expected) <= 1e-3 * max(1.0, abs(expected)):
            return f"batch {number + 1}: the loss is not the cross-entropy of the model's output and the targets"
    return None


def judge_mean_loss(d):
    if not d["is_float"]:
        return f"train_epoch must return a float, not a {d['type']}"
    losses = [e["value"] for e in d["events"] if e["e"] == "scale"]
    if len(losses) != len(d["sizes"]):
        return "one loss per batch expected"
    over_batches = sum(losses) / len(losses)
    over_items = sum(loss * n for loss, n in zip(losses, d["sizes"])) / sum(d["sizes"])
    if not any(abs(d["value"] - mean) <= 1e-3 * max(1.0, abs(mean)) for mean in (over_batches, over_items)):
        return f"returned {d['value']:.4g}: not the mean loss of the epoch's batches (unscaled)"
    return None


def judge_moved(d):
    if d["moved"] != d["tensors"]:
        return (f"{d['moved']} of the {d['tensors']} batch tensors were moved: move inputs and targets to the model's "
                "device inside the loop (.to(device))")
    return None


def observe_autocast_arguments(ns):
    import warnings

    import torch
    from torch import nn
    from gpucourse.checks import answer

    events, entered = [], []
    g = torch.Generator().manual_seed(6)
    loader = [(torch.randn(n, 5, generator=g), torch.randint(0, 2, (n,), generator=g)) for n in (4, 3)]

    class Recorded(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(5, 2)

        def forward(self, x):
            events[-1]["forwards"].append({"autocast": torch.is_autocast_enabled("cpu"),
                                           "dtype": str(torch.get_autocast_dtype("cpu")), "grad": torch.is_grad_enabled()})
            return self.net(x)

    autocast = torch.amp.autocast_mode.autocast
    real_init = autocast.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        entered.append([str(self.device), str(self.fast_dtype)])  # the dtype it runs in, given or by default

    torch.manual_seed(6)
    model = Recorded()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    autocast.__init__ = recording_init
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # autocast('cuda') without CUDA says it disables itself
            # each dtype is the one its device type does *not* default to
            for function, device_type, dtype in [("train_epoch", "cpu", torch.float16), ("evaluate", "cpu", torch.float16),
                                                 ("train_epoch", "cuda", torch.bfloat16), ("evaluate", "cuda", torch.bfloat16)]:
                events.append({"function": function, "device_type": device_type, "dtype": str(dtype), "forwards": []})
                entered.clear()
                if function == "train_epoch":
                    answer(ns, "train_epoch")(model, loader, optimizer, torch.amp.GradScaler("cpu", enabled=False), device_type, dtype)
                else:
                    answer(ns, "evaluate")(model, loader, device_type, dtype)
                events[-1]["autocast"] = [list(a) for a in entered]
    finally:
        autocast.__init__ = real_init
    return events


def judge_autocast_arguments(function):
    def judge(d):
        for run in d:
            if run["function"] != function:
                continue
            where = f"{function}(..., {run['device_type']!r}, {run['dtype']})"
            if not run["autocast"] or any(a != [run["device_type"], run["dtype"]] for a in run["autocast"]):
                return f"{where}: autocast must get the device type and dtype passed in, got {run['autocast']}"
            if run["device_type"] == "cpu" and not all(f["autocast"] and f["dtype"] == run["dtype"] for f in run["forwards"]):
                return f"{where}: the forward pass did not run under autocast to {run['dtype']}"
        return None
    return judge


def observe_evaluate_items(ns):
    import torch
    from torch import nn
    from gpucourse.checks import answer

    sizes, correct = [1, 6, 3], [1, 1, 0]  # 2 of 10 items right; the batches' own fractions average 0.39
    batches, forwards, moved = [], [], set()
    classes = iter([0, 1, 2, 3, 1, 2, 3, 0, 2, 1])
    for n, right in zip(sizes, correct):
        picked = [next(classes) for _ in range(n)]
        inputs = torch.eye(4)[picked]
        targets = torch.tensor([c if i < right else (c + 1) % 4 for i, c in enumerate(picked)])
        batches.append((inputs, targets))
    ids = {id(t) for batch in batches for t in batch}

    class Recorded(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 4)
            with torch.no_grad():
                self.net.weight.copy_(10 * torch.eye(4))
                self.net.bias.zero_()

        def forward(self, x):
            forwards.append({"autocast": torch.is_autocast_enabled("cpu"), "grad": torch.is_grad_enabled()})
            return self.net(x)

    real_to = torch.Tensor.to

    def recording_to(self, *args, **kwargs):
        if id(self) in ids and (kwargs.get("device") is not None or (args and isinstance(args[0], (str, torch.device)))):
            moved.add(id(self))
        return real_to(self, *args, **kwargs)

    torch.Tensor.to = recording_to
    try:
        result = answer(ns, "evaluate")(Recorded(), batches, "cpu", torch.float16)
    finally:
        torch.Tensor.to = real_to
    return {"type": type(result).__name__, "is_float": isinstance(result, float),
            "value": float(result) if isinstance(result, (int, float)) else None, "forwards": forwards,
            "moved": len(moved), "tensors": len(ids)}


def judge_evaluate_items(d):
    if not d["is_float"]:
        return f"evaluate must return a float, not a {d['type']}"
    if d["value"] is None or not abs(d["value"] - 0.2) <= 1e-6:
        return f"returned {d['value']}: not the fraction of correct predictions over all items (batches of 1, 6 and 3)"
    return None


HIDDEN = {"train_epoch": [
    Case("gradients zeroed between one update and the next backward", observe_amp_epoch, judge_zeroing),
    Case("the scaled loss backpropagated, then scaler.step, then scaler.update, once per batch", observe_amp_epoch,
         judge_scaler_order),
    Case("the loss: cross-entropy of the output, float32 under autocast", observe_amp_epoch, judge_loss),
    Case("returns the mean loss of batches of 5, 8 and 3, as a float", observe_amp_epoch, judge_mean_loss),
    Case("train_epoch: batches moved to the model's device inside the loop", observe_amp_epoch, judge_moved),
    Case("train_epoch: autocast with the device type and dtype given (float16 on 'cpu', bfloat16 on 'cuda')",
         observe_autocast_arguments, judge_autocast_arguments("train_epoch")),
    Case("evaluate: autocast with the device type and dtype given (float16 on 'cpu', bfloat16 on 'cuda')",
         observe_autocast_arguments, judge_autocast_arguments("evaluate")),
    Case("evaluate: the fraction of correct predictions over all items, as a float", observe_evaluate_items,
         judge_evaluate_items),
    Case("evaluate: batches moved to the model's device inside the loop", observe_evaluate_items, judge_moved),
]}

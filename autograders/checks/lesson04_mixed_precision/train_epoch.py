"""Hidden checks for lesson 4: train_epoch and evaluate (the package's docstring says how every part works)."""

# --- train_epoch and evaluate ---------------------------------------------------------------
# What the exercise text and answer lines require:
#  train_epoch(model, loader, optimizer, scaler, device_type, dtype), for each (inputs, targets) batch:
#  1. move the batch to the model's device, inside the loop (batch i moved after batch i-1's forward,
#     not every batch up front) -> "batches moved to the model's device inside the loop ..."
#  2. zero the gradients, in any way (zero_grad(), set_to_none, p.grad = None; before the backward
#     or after the update) -> "gradients zeroed between one update and the next backward"
#  3. the model's output and the cross-entropy loss under torch.autocast(device_type, dtype=dtype):
#     the device type and dtype given -> "autocast with the device type and dtype given ..."; the
#     loss itself cross-entropy, computed where autocast keeps it float32 -> "the loss: cross-entropy ..."
#  4. backpropagate scaler.scale(loss), outside autocast -> public "autocast around the forward ..."
#     and "the scaled loss backpropagated, then scaler.step, then scaler.update, once per batch"
#  5. then scaler.step(optimizer) and scaler.update() -> "the scaled loss backpropagated, ..."
#  6. return the epoch's mean loss (unscaled; over batches or over items) as a float -> "returns the
#     mean loss ..." (the scale changes at every step, so only the unscaled losses give it); large losses
#     too, whose total float16 cannot hold -> "returns the mean loss of an epoch of large losses ..."
#  evaluate(model, loader, device_type, dtype):
#  7. the fraction of correct predictions (argmax) over all items, as a float -> "evaluate: the
#     fraction of correct predictions over all items ..."
#  8. under autocast (device type and dtype given) and without gradients -> public "evaluate under
#     autocast and no_grad ..." and "autocast with the device type and dtype given ..."
#  9. batches moved to the model's device, inside the loop -> "batches moved to the model's device ..."

def draw_epoch(rng):
    """The epoch every train_epoch case observes, drawn at grading time: a seed for the model and the
    batches, and 2 to 5 batches of 1 to 12 items, not all the same size (a mean over batches and a mean
    over items then differ). The cases share this function, so they share one drawn epoch."""
    count = rng.randint(2, 5)
    sizes = [rng.randint(1, 12) for _ in range(count)]
    while len(set(sizes)) == 1:
        sizes[rng.randrange(count)] = rng.randint(1, 12)
    return {"seed": rng.randrange(1 << 30), "sizes": sizes}


def observe_amp_epoch(ns, drawn):
    import torch
    from torch import nn
    from gpucourse.checks import answer
    from gpucourse.checks.lesson04_mixed_precision import recording_scaler

    events, moved = [], set()
    g = torch.Generator().manual_seed(drawn["seed"])
    sizes = drawn["sizes"]  # unequal: a mean over batches and a mean over items differ
    batches = [(torch.randn(n, 6, generator=g) * 3, torch.randint(0, 3, (n,), generator=g)) for n in sizes]
    if "gain" in drawn:  # large losses: one-hot inputs of a class, scored `gain` by the model (set below)
        batches = [(torch.eye(6)[c], torch.tensor(t)) for c, t in zip(drawn["classes"], drawn["targets"])]
    ids = {id(t): number for number, batch in enumerate(batches) for t in batch}  # tensor -> its batch

    def zeroed(params):
        return all(p.grad is None or not bool(p.grad.any()) for p in params)

    class Recorded(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(6, 3)

        def forward(self, x):
            out = self.net(x)
            events.append({"e": "forward", "autocast": torch.is_autocast_enabled("cpu"),
                           "logits": out.detach().float().tolist()})
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
            events.append({"e": "to", "batch": ids[id(self)]})
        return real_to(self, *args, **kwargs)

    torch.manual_seed(drawn["seed"])
    model = Recorded()
    if "gain" in drawn:  # each item's loss: about `gain` where its target is not its input's class, else about 0
        with torch.no_grad():
            model.net.weight.copy_(drawn["gain"] * torch.eye(3, 6))
            model.net.bias.zero_()
    torch.Tensor.to = recording_to
    try:
        result = answer(ns, "train_epoch")(model, list(batches), RecordedSGD(model.parameters(), lr=0.05),
                                           # the scale doubles after every step (growth_interval=1): a mean taken
                                           # from the scaled losses and one scale is not the unscaled losses' mean
                                           RecordedScaler("cpu", init_scale=1024.0, growth_interval=1), "cpu", torch.float16)
    finally:
        torch.Tensor.to = real_to
    return {"events": events, "moved": len(moved),
            "type": type(result).__name__, "is_float": isinstance(result, float),
            "value": (float(result) if isinstance(result, (int, float, torch.Tensor))
                      and getattr(result, "numel", lambda: 1)() == 1 else None)}


def draw_large_losses(rng):
    """An epoch of large losses (a badly scaled model), drawn at grading time: 4 to 6 batches of 1 to 8
    one-hot items of a class, a model that scores an item's class at ``gain`` (20,000 to 30,000), each
    target that class or, mostly, another (a loss of about ``gain``). Each logit and loss fits in float16,
    their sum over the epoch does not (float16's largest value is 65,504): only a float32 or Python total
    gives the mean."""
    gain = rng.randint(20000, 30000)
    while True:
        sizes = [rng.randint(1, 8) for _ in range(rng.randint(4, 6))]
        classes = [[rng.randrange(3) for _ in range(n)] for n in sizes]
        targets = [[c if rng.random() < 0.2 else (c + rng.randint(1, 2)) % 3 for c in batch] for batch in classes]
        means = [sum(c != t for c, t in zip(cs, ts)) / len(cs) for cs, ts in zip(classes, targets)]
        if len(set(sizes)) > 1 and sum(means) * gain > 70000:
            return {"seed": rng.randrange(1 << 30), "sizes": sizes, "gain": gain, "classes": classes, "targets": targets}


def _per_batch(events):
    """The events of each batch: a new batch starts at each forward pass."""
    batches = []
    for event in events:
        if event["e"] == "forward":
            batches.append([])
        if batches:
            batches[-1].append(event)
    return batches


def _epoch_batches(drawn):
    """observe_amp_epoch's batches, rebuilt here from the drawn seed: the judges never take inputs from an
    observation."""
    import torch
    g = torch.Generator().manual_seed(drawn["seed"])
    return [(torch.randn(n, 6, generator=g) * 3, torch.randint(0, 3, (n,), generator=g)) for n in drawn["sizes"]]


def judge_zeroing(d, drawn):
    sizes = drawn["sizes"]
    backwards = [e for e in d["events"] if e["e"] == "backward"]
    if len(backwards) != len(sizes):
        return f"{len(sizes)} batches gave {len(backwards)} backward passes"
    if not all(e["zeroed"] for e in backwards):
        return "gradients from the previous batch were still there at the next backward: zero them every batch"
    return None


def judge_scaler_order(d, drawn):
    sizes = drawn["sizes"]
    batches = _per_batch(d["events"])
    if len(batches) != len(sizes):
        return f"{len(sizes)} batches gave {len(batches)} forward passes"
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


def _cross_entropy(logits, targets):
    import math
    total = 0.0
    for row, target in zip(logits, targets):
        top = max(row)
        total += top + math.log(sum(math.exp(v - top) for v in row)) - row[target]
    return total / len(targets)


def judge_loss(d, drawn):
    sizes = drawn["sizes"]
    batches = _per_batch(d["events"])
    if len(batches) != len(sizes):
        return f"{len(sizes)} batches gave {len(batches)} forward passes"
    for number, (events, (_, targets)) in enumerate(zip(batches, _epoch_batches(drawn))):
        forward = events[0]
        scaled = [e for e in events if e["e"] == "scale"]
        if not scaled:
            return f"batch {number + 1}: no loss went through scaler.scale"
        if scaled[0]["dtype"] != "torch.float32":
            return f"the loss came out in {scaled[0]['dtype']}: compute it under autocast, which keeps it in float32"
        logits = forward["logits"]  # the model's output as observed; the targets are the judge's own
        if len(logits) != len(targets):
            return f"batch {number + 1}: the model saw {len(logits)} items of a batch of {len(targets)}"
        expected = _cross_entropy(logits, targets.tolist())
        if not abs(scaled[0]["value"] - expected) <= 1e-3 * max(1.0, abs(expected)):
            return f"batch {number + 1}: the loss is not the cross-entropy of the model's output and the targets"
    return None


def judge_mean_loss(d, drawn):
    sizes = drawn["sizes"]
    if not d["is_float"]:
        return f"train_epoch must return a float, not a {d['type']}"
    losses = [e["value"] for e in d["events"] if e["e"] == "scale"]
    if len(losses) != len(sizes):
        return "one loss per batch expected"
    over_batches = sum(losses) / len(losses)
    over_items = sum(loss * n for loss, n in zip(losses, sizes)) / sum(sizes)
    if not any(abs(d["value"] - mean) <= 1e-3 * max(1.0, abs(mean)) for mean in (over_batches, over_items)):
        return f"returned {d['value']:.4g}: not the mean loss of the epoch's batches (unscaled)"
    return None


def _judge_moved_in_loop(tensors):
    """A judge of batches moved inside the loop: ``tensors`` is how many batch tensors there are, or a
    function of the drawn inputs that says it."""
    def judge(d, drawn=None):
        expected = tensors(drawn) if callable(tensors) else tensors
        if d["moved"] != expected:
            return (f"{d['moved']} of the {expected} batch tensors were moved: move inputs and targets to the model's "
                    "device inside the loop (.to(device))")
        forwards = 0
        for event in d["events"]:
            if event["e"] == "forward":
                forwards += 1
            elif event["e"] == "to" and event["batch"] > forwards:
                return (f"batch {event['batch'] + 1} was moved before batch {event['batch']}'s forward pass: move "
                        "each batch inside the loop, not every batch up front")
        return None
    return judge


judge_moved = _judge_moved_in_loop(lambda drawn: 2 * len(drawn["sizes"]))


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


AUTOCAST_RUNS = [("train_epoch", "cpu", "torch.float16"), ("evaluate", "cpu", "torch.float16"),
                 ("train_epoch", "cuda", "torch.bfloat16"), ("evaluate", "cuda", "torch.bfloat16")]


def judge_autocast_arguments(function):
    def judge(d):
        if [(r["function"], r["device_type"], r["dtype"]) for r in d] != AUTOCAST_RUNS:
            return "not every device type and dtype was tried"
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


def draw_evaluate(rng):
    """Batches for evaluate, drawn at grading time: 2 to 4 batches of 1 to 8 items, how many of each the
    model gets right, and each item's class; the fraction over all items is never the mean of the batches'
    own fractions, so that one cannot pass for the other."""
    while True:
        sizes = [rng.randint(1, 8) for _ in range(rng.randint(2, 4))]
        correct = [rng.randint(0, n) for n in sizes]
        over_items = sum(correct) / sum(sizes)
        over_batches = sum(c / n for c, n in zip(correct, sizes)) / len(sizes)
        if abs(over_items - over_batches) > 1e-3:
            return {"sizes": sizes, "correct": correct, "classes": [rng.randrange(4) for _ in range(sum(sizes))]}


def observe_evaluate_items(ns, drawn):
    import torch
    from torch import nn
    from gpucourse.checks import answer

    sizes, correct = drawn["sizes"], drawn["correct"]  # the first `correct` items of each batch are right
    batches, forwards, moved = [], [], set()
    classes = iter(drawn["classes"])
    for n, right in zip(sizes, correct):
        picked = [next(classes) for _ in range(n)]
        inputs = torch.eye(4)[picked]
        targets = torch.tensor([c if i < right else (c + 1) % 4 for i, c in enumerate(picked)])
        batches.append((inputs, targets))
    ids = {id(t): number for number, batch in enumerate(batches) for t in batch}  # tensor -> its batch
    events = []

    class Recorded(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 4)
            with torch.no_grad():
                self.net.weight.copy_(10 * torch.eye(4))
                self.net.bias.zero_()

        def forward(self, x):
            forwards.append({"autocast": torch.is_autocast_enabled("cpu"), "grad": torch.is_grad_enabled()})
            events.append({"e": "forward"})
            return self.net(x)

    real_to = torch.Tensor.to

    def recording_to(self, *args, **kwargs):
        if id(self) in ids and (kwargs.get("device") is not None or (args and isinstance(args[0], (str, torch.device)))):
            moved.add(id(self))
            events.append({"e": "to", "batch": ids[id(self)]})
        return real_to(self, *args, **kwargs)

    torch.Tensor.to = recording_to
    try:
        result = answer(ns, "evaluate")(Recorded(), batches, "cpu", torch.float16)
    finally:
        torch.Tensor.to = real_to
    return {"type": type(result).__name__, "is_float": isinstance(result, float),
            "value": float(result) if isinstance(result, (int, float)) else None, "forwards": forwards,
            "moved": len(moved), "events": events}


def judge_evaluate_items(d, drawn):
    if not d["is_float"]:
        return f"evaluate must return a float, not a {d['type']}"
    expected = sum(drawn["correct"]) / sum(drawn["sizes"])
    sizes = ", ".join(map(str, drawn["sizes"]))
    if d["value"] is None or not abs(d["value"] - expected) <= 1e-6:
        return f"returned {d['value']}: not the fraction of correct predictions over all items (batches of {sizes})"
    return None

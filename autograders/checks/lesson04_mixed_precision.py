"""Hidden checks for lesson 4 (mixed precision). Never released; see lesson01's file for the form.

The training loop is observed, not read: a model, optimizer and GradScaler that record what happens
to them (see gpucourse.checks.lesson04_mixed_precision), on a few tiny batches of unequal sizes, so that each case
costs milliseconds.
"""

import functools

from gpucourse.checks import Case


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
#     mean loss ..."
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
    torch.Tensor.to = recording_to
    try:
        result = answer(ns, "train_epoch")(model, list(batches), RecordedSGD(model.parameters(), lr=0.05),
                                           RecordedScaler("cpu", init_scale=1024.0), "cpu", torch.float16)
    finally:
        torch.Tensor.to = real_to
    return {"events": events, "moved": len(moved),
            "type": type(result).__name__, "is_float": isinstance(result, float),
            "value": (float(result) if isinstance(result, (int, float, torch.Tensor))
                      and getattr(result, "numel", lambda: 1)() == 1 else None)}


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


HIDDEN = {"train_epoch": [
    Case("gradients zeroed between one update and the next backward", observe_amp_epoch, judge_zeroing, draw=draw_epoch),
    Case("the scaled loss backpropagated, then scaler.step, then scaler.update, once per batch", observe_amp_epoch,
         judge_scaler_order, draw=draw_epoch),
    Case("the loss: cross-entropy of the output, float32 under autocast", observe_amp_epoch, judge_loss, draw=draw_epoch),
    Case("returns the mean loss of batches of unequal sizes, as a float", observe_amp_epoch, judge_mean_loss, draw=draw_epoch),
    Case("train_epoch: batches moved to the model's device inside the loop", observe_amp_epoch, judge_moved, draw=draw_epoch),
    Case("train_epoch: autocast with the device type and dtype given (float16 on 'cpu', bfloat16 on 'cuda')",
         observe_autocast_arguments, judge_autocast_arguments("train_epoch")),
    Case("evaluate: autocast with the device type and dtype given (float16 on 'cpu', bfloat16 on 'cuda')",
         observe_autocast_arguments, judge_autocast_arguments("evaluate")),
    Case("evaluate: the fraction of correct predictions over all items, as a float", observe_evaluate_items,
         judge_evaluate_items, draw=draw_evaluate),
    Case("evaluate: batches moved to the model's device inside the loop", observe_evaluate_items,
         _judge_moved_in_loop(lambda drawn: 2 * len(drawn["sizes"])), draw=draw_evaluate),
]}


# --- clipped_step ---------------------------------------------------------------------------
# What the exercise text and answer line require, for one step:
#  1. zero the gradients first (the step after another must not add the old gradients) -> "two steps
#     in a row ..." (the second step's parameters)
#  2. output and cross-entropy loss under torch.autocast(device_type, dtype=dtype), the device type and
#     dtype given (bfloat16 too, and 'cuda'); backward of scaler.scale(loss) outside it -> "autocast with
#     the device type and dtype given ..." and "generated sizes ..." (parameters equal the reference's)
#  3. scaler.unscale_(optimizer) after backward and before clipping, so that the clip sees the true
#     gradients -> public cases, and "generated sizes ..." with max_norm below and above the true norm
#  4. clip the total norm of all the model's gradients to max_norm -> "generated sizes ..."
#  5. scaler.step(optimizer), then scaler.update() -> public order case; "an overflowing step ..."
#     (the scale backs off, and the next step does not raise)
#  6. return the total norm before clipping, a float; on an overflowing step it is inf or nan and
#     the step is skipped -> "generated sizes ..." and "an overflowing step ..."

def draw_clipped(rng):
    """A seed for 4 models and their batches, and each model's autocast dtype (float16 or bfloat16 on the
    CPU), drawn at grading time: the judge rebuilds them from the same seed."""
    return {"seed": rng.randrange(1 << 30), "dtypes": [rng.choice(["float16", "bfloat16"]) for _ in range(4)]}


def observe_clipped_generated(ns, drawn):
    """The student's clipped_step twice in a row on 4 generated models: norms, parameters, scale. The
    judge runs a correct step on the same models itself (clipped_generated_expected, reference_clipped_step)."""
    import copy
    import random

    import torch
    from torch import nn
    from gpucourse.checks import answer

    # the judge computes in full float32 precision; the notebook may have set "high" (TF32 or bf16 passes)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        rng = random.Random(drawn["seed"])
        result = []
        for case in range(4):
            width, batch, classes = rng.randint(3, 12), rng.randint(2, 9), rng.randint(2, 5)
            torch.manual_seed(drawn["seed"] + case)
            model = nn.Sequential(nn.Linear(5, width), nn.GELU(), nn.Linear(width, classes))
            data = [(torch.randn(batch, 5) * rng.uniform(0.5, 4), torch.randint(0, classes, (batch,))) for _ in range(2)]
            probe = copy.deepcopy(model)
            nn.functional.cross_entropy(probe(data[0][0]), data[0][1]).backward()
            true_norm = float(torch.cat([p.grad.flatten() for p in probe.parameters()]).norm())
            max_norm = true_norm * (rng.uniform(0.05, 0.5) if case % 2 == 0 else rng.uniform(2, 5))
            init_scale = 2.0 ** rng.randint(6, 14)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
            scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1)
            norms, params, is_float = [], [], True
            for inputs, targets in data:
                dtype = getattr(torch, drawn["dtypes"][case])
                value = answer(ns, "clipped_step")(model, inputs, targets, optimizer, scaler, "cpu", dtype, max_norm)
                is_float = is_float and isinstance(value, float)
                norms.append(float(value) if isinstance(value, (int, float, torch.Tensor)) else None)
                params.append(torch.cat([p.detach().flatten() for p in model.parameters()]).double().tolist())
            result.append({"is_float": is_float, "norms": norms, "params": params, "scale": float(scaler.get_scale())})
        return result
    finally:
        torch.set_float32_matmul_precision(precision)


def reference_clipped_step(model, inputs, targets, optimizer, scaler, device_type, dtype, max_norm):
    import torch
    from torch import nn
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = nn.functional.cross_entropy(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return float(norm)


@functools.lru_cache(maxsize=64)  # the cases of one submission judge the same draw
def clipped_generated_expected(seed: int, dtypes: tuple[str, ...]) -> list[dict]:
    """observe_clipped_generated's models and batches, rebuilt here (the same seed), stepped twice by a
    correct clipped AMP step: what the student's steps must give. The grader's random state is kept."""
    import copy
    import random

    import torch
    from torch import nn

    rng = random.Random(seed)
    expected = []
    from gpucourse.checks.seeded import global_rng  # the grader's threads share torch's generator
    with global_rng():
        for case in range(4):
            width, batch, classes = rng.randint(3, 12), rng.randint(2, 9), rng.randint(2, 5)
            torch.manual_seed(seed + case)
            model = nn.Sequential(nn.Linear(5, width), nn.GELU(), nn.Linear(width, classes))
            data = [(torch.randn(batch, 5) * rng.uniform(0.5, 4), torch.randint(0, classes, (batch,))) for _ in range(2)]
            probe = copy.deepcopy(model)
            nn.functional.cross_entropy(probe(data[0][0]), data[0][1]).backward()
            true_norm = float(torch.cat([p.grad.flatten() for p in probe.parameters()]).norm())
            max_norm = true_norm * (rng.uniform(0.05, 0.5) if case % 2 == 0 else rng.uniform(2, 5))
            init_scale = 2.0 ** rng.randint(6, 14)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
            scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1)
            norms, params = [], []
            for inputs, targets in data:
                norms.append(reference_clipped_step(model, inputs, targets, optimizer, scaler, "cpu",
                                                    getattr(torch, dtypes[case]), max_norm))
                params.append(torch.cat([p.detach().flatten() for p in model.parameters()]).double().tolist())
            expected.append({"width": width, "batch": batch, "max_norm": max_norm, "clips": case % 2 == 0, "dtype": dtypes[case],
                             "norms": norms, "params": params, "scale": float(scaler.get_scale())})
    return expected


def _max_gap(got, want):
    if not isinstance(got, list) or len(got) != len(want):
        return float("inf")
    return max((abs(a - b) for a, b in zip(got, want)), default=0.0)


def judge_clipped_generated(d, drawn):
    expected = clipped_generated_expected(drawn["seed"], tuple(drawn["dtypes"]))
    if len(d) != len(expected):
        return f"{len(d)} of {len(expected)} models observed"
    for got, r in zip(d, expected):
        where = f"a {r['width']}-wide model in {r['dtype']}, batch {r['batch']}, max_norm {r['max_norm']:.3g}" + (
            " (below the gradients' norm)" if r["clips"] else " (above it)")
        if not got["is_float"]:
            return f"{where}: clipped_step must return a float"
        if len(got["norms"]) != 2 or len(got["params"]) != 2:
            return f"{where}: two steps expected"
        if got["norms"][0] is None or not abs(got["norms"][0] - r["norms"][0]) <= 1e-3 * r["norms"][0]:
            return f"{where}: returned {got['norms'][0]}, not the true gradient norm before clipping"
        if not _max_gap(got["params"][0], r["params"][0]) <= 1e-5:
            return f"{where}: the parameters after one step differ from a correct clipped AMP step"
        norm_close = abs((got["norms"][1] or 0) - r["norms"][1]) <= 1e-3 * r["norms"][1]
        if not _max_gap(got["params"][1], r["params"][1]) <= 1e-5 or not norm_close:
            return f"{where}: two steps in a row: the second step differs (are the gradients zeroed each step?)"
        if got["scale"] != r["scale"]:
            return f"{where}: the scale after two good steps is {got['scale']:g}, expected {r['scale']:g}"
    return None


def observe_clipped_overflow(ns):
    import math

    import torch
    from torch import nn
    from gpucourse.checks import answer

    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)  # scaled float16 gradients overflow to inf
    inputs, targets = torch.randn(5, 4), torch.randint(0, 3, (5,))
    before = [p.detach().clone() for p in model.parameters()]
    steps = []
    for _ in range(2):
        scale = float(scaler.get_scale())
        value = answer(ns, "clipped_step")(model, inputs, targets, optimizer, scaler, "cpu", torch.float16, 1.0)
        number = float(value) if isinstance(value, (int, float, torch.Tensor)) else None
        steps.append({"scale_before": scale, "scale_after": float(scaler.get_scale()),
                      "finite": None if number is None else math.isfinite(number),
                      "unchanged": all(torch.equal(a, b) for a, b in zip(before, model.parameters()))})
    return steps


def judge_clipped_overflow(d):
    if len(d) != 2:
        return f"{len(d)} of 2 overflowing steps observed"
    for number, s in enumerate(d, 1):
        if not s["unchanged"]:
            return f"overflowing step {number}: the parameters changed; scaler.step must skip a step with inf/NaN gradients"
        if s["finite"] is not False:
            return f"overflowing step {number}: the norm returned should be inf or nan (the gradients overflowed)"
        if s["scale_after"] != s["scale_before"] / 2:
            return f"overflowing step {number}: scale {s['scale_before']:g} became {s['scale_after']:g}, not halved"
    return None


CLIP_AUTOCAST_RUNS = [("cpu", "torch.bfloat16"), ("cpu", "torch.float16"), ("cuda", "torch.bfloat16")]


def observe_clipped_autocast(ns):
    """Where autocast was on, with which dtype, in the forward and in the backward; which autocast the
    answer made (device type, dtype). bfloat16 on the CPU costs little at these sizes."""
    import warnings

    import torch
    from torch import nn
    from gpucourse.checks import answer

    runs, entered = [], []

    class Recorded(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))

        def forward(self, x):
            runs[-1]["forwards"].append({"autocast": torch.is_autocast_enabled("cpu"),
                                         "dtype": str(torch.get_autocast_dtype("cpu"))})
            out = self.net(x)
            if out.requires_grad:
                out.register_hook(lambda grad: runs[-1]["backwards"].append(torch.is_autocast_enabled("cpu")))
            return out

    autocast = torch.amp.autocast_mode.autocast
    real_init = autocast.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        entered.append([str(self.device), str(self.fast_dtype)])

    g = torch.Generator().manual_seed(45)
    inputs, targets = torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)
    autocast.__init__ = recording_init
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # autocast('cuda') without CUDA says it disables itself
            for device_type, dtype in [("cpu", torch.bfloat16), ("cpu", torch.float16), ("cuda", torch.bfloat16)]:
                torch.manual_seed(45)
                model = Recorded()
                runs.append({"forwards": [], "backwards": []})
                entered.clear()
                answer(ns, "clipped_step")(model, inputs, targets, torch.optim.SGD(model.parameters(), lr=0.1),
                                           torch.amp.GradScaler("cpu", init_scale=256.0), device_type, dtype, 1.0)
                runs[-1]["autocast"] = [list(a) for a in entered]
    finally:
        autocast.__init__ = real_init
    return runs


def judge_clipped_autocast(d):
    if len(d) != len(CLIP_AUTOCAST_RUNS):
        return f"{len(d)} of {len(CLIP_AUTOCAST_RUNS)} steps observed"
    for (device_type, dtype), run in zip(CLIP_AUTOCAST_RUNS, d):
        where = f"clipped_step(..., {device_type!r}, {dtype}, ...)"
        if not run["autocast"] or any(a != [device_type, dtype] for a in run["autocast"]):
            return f"{where}: autocast must get the device type and dtype passed in, got {run['autocast']}"
        if device_type == "cpu":
            if len(run["forwards"]) != 1 or not all(f["autocast"] and f["dtype"] == dtype for f in run["forwards"]):
                return f"{where}: the forward pass did not run (once) under autocast to {dtype}"
        if len(run["backwards"]) != 1:
            return f"{where}: {len(run['backwards'])} backward passes through the model in one step"
        if any(run["backwards"]):
            return f"{where}: backward ran inside autocast: backpropagate scaler.scale(loss) outside it"
    return None


HIDDEN["clipped_step"] = [
    Case("autocast with the device type and dtype given (bfloat16 and float16 on 'cpu', bfloat16 on 'cuda'); "
         "backward outside it", observe_clipped_autocast, judge_clipped_autocast),
    Case("generated sizes and max_norm: the reference's norm, parameters and scale, over two steps",
         observe_clipped_generated, judge_clipped_generated, draw=draw_clipped),
    Case("an overflowing step is skipped, returns a non-finite norm and halves the scale, twice",
         observe_clipped_overflow, judge_clipped_overflow),
]


_TE = [case.name for case in HIDDEN["train_epoch"]]
_CS = [case.name for case in HIDDEN["clipped_step"]]
_TE_PUBLIC = ["autocast around the forward, scaled backward outside it, loss going down",
              "evaluate under autocast and no_grad, returning accuracy"]
_CS_PUBLIC = ["unscale_ between the scaled backward and scaler.step, then update",
              "the clip sees the true gradient norm and the optimizer gets clipped gradients"]
CLAUSES = {
    "train_epoch": {
        "zero the gradients every batch": [_TE[0]],
        "output and cross-entropy loss under torch.autocast(device_type, dtype=dtype), the device type and dtype given":
            [_TE[2], _TE[5], _TE_PUBLIC[0]],
        "backpropagate scaler.scale(loss) outside autocast": [_TE_PUBLIC[0], _TE[1]],
        "then scaler.step(optimizer) and scaler.update()": [_TE[1]],
        "return the mean (unscaled) loss of the epoch as a float": [_TE[3]],
        "evaluate: the fraction of correct predictions (argmax) over all items, as a float": [_TE[7], _TE_PUBLIC[1]],
        "evaluate: under autocast and without gradients": [_TE_PUBLIC[1], _TE[6]],
        "move each batch to the model's device inside the loops": [_TE[4], _TE[8]],
    },
    "clipped_step": {
        "zero the gradients": [_CS[1]],
        "output and cross-entropy loss under torch.autocast(device_type, dtype=dtype)": [_CS[0], _CS[1]],
        "backpropagate scaler.scale(loss) outside autocast": [_CS[0], _CS_PUBLIC[0]],
        "scaler.unscale_(optimizer), then clip the total norm of all gradients to max_norm": [_CS_PUBLIC[0], _CS_PUBLIC[1], _CS[1]],
        "scaler.step(optimizer) and scaler.update()": [_CS_PUBLIC[0], _CS[2]],
        "return the total norm before clipping, a float; inf or nan on an overflowing step, which is skipped":
            [_CS_PUBLIC[1], _CS[1], _CS[2]],
    },
}

"""Lesson 12's hidden checks for ``training_bytes``: the reference, what is drawn, the observer and the judge."""

import json

from gpucourse.checks.lesson12_memory import RECIPES, build_model, bytes_verdict, describe_spec, model_inputs
from gpucourse.checks.seeded import global_rng
from gpucourse.checks.values import rebuild

from autograders.differential import call


# --- training_bytes: the reference --------------------------------------------------------------------


def parameter_counts(model) -> tuple[int, int, int]:
    """(P, P_t, T_t): elements of every parameter (each once, as model.parameters() yields them), of the
    trainable ones, and the number of trainable tensors."""
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    return sum(p.numel() for p in params), sum(p.numel() for p in trainable), len(trainable)


def reference_training_bytes(model, recipe, stage=0, world_size=1):
    """The exercise's text: ValueError for a recipe other than the three strings (of any type); TypeError for a
    stage or world_size that is not an int (a bool, a float even if whole, a str, None, a NumPy integer);
    ValueError for an int stage other than 0-3 or an int world_size below 1."""
    if not isinstance(recipe, str) or recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}")
    for name, value in (("stage", stage), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size {world_size!r}")
    P, P_t, T_t = parameter_counts(model)

    def per_rank(n, sharded):  # the flat buffer padded to a multiple of world_size, as ZeRO pads it
        return -(-n // world_size) if sharded else n

    weight = 2 if recipe == "bf16" else 4
    state = 12 if recipe == "bf16" else 8
    return {"params": weight * per_rank(P, stage >= 3), "grads": weight * per_rank(P_t, stage >= 2),
            "optimizer": state * per_rank(P_t, stage >= 1) + 4 * T_t}


def measure_recipe(spec: dict, recipe: str) -> dict:
    """One measured Adam step of the spec's model (tests hold the reference to it): fp32 (Adam), amp
    (Adam, the forward under CPU autocast to bfloat16), bf16 (the model in bfloat16, MasterWeightAdam)."""
    import torch

    from gpucourse.memory import MasterWeightAdam, state_bytes

    with global_rng():
        model = build_model(spec)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if recipe == "bf16":
        model.to(torch.bfloat16)
        optimizer = MasterWeightAdam(trainable, lr=1e-3)
    else:
        optimizer = torch.optim.Adam(trainable, lr=1e-3)
    x = model_inputs(spec)
    if recipe == "bf16" and x.is_floating_point():
        x = x.to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe == "amp"):
        out = model(x)
    out.float().square().mean().backward()
    optimizer.step()
    return state_bytes(model, optimizer)


def _meta_model(spec):
    with global_rng():  # builds on the meta device draw nothing; the lock costs nothing and keeps it so
        return build_model(spec, device="meta")


# --- training_bytes: what is drawn ---------------------------------------------------------------------

def _spec(rng, *, tied=False, frozen=None, big=False):
    """A model spec: 1 to 4 Linear layers of widths 1 to 40 (big: up to 10^9 parameters), with or without
    biases, a LayerNorm or a BatchNorm (buffers are not parameters), a 0-d scale; tied: an Embedding whose
    weight the output layer shares; frozen: "first" or "all"."""
    depth = rng.randint(2 if tied else 1, 4 if not big else 2)
    if big:
        widths = [rng.randint(30, 40_000), rng.randint(3, 9_999), rng.randint(1, 999)][:depth + 1]
    else:
        widths = [rng.randint(1, 40) for _ in range(depth + 1)]
    if tied:
        widths[-2] = widths[0]  # the output layer's weight is (vocab, width): the embedding's shape
    spec = {"widths": widths, "bias": rng.random() < 0.7, "seed": rng.randint(0, 999)}
    norm = rng.random()
    if norm < 0.3:
        spec["norm"] = True
    elif norm < 0.5:
        spec["batchnorm"] = True
    if rng.random() < 0.2:
        spec["scalar"] = True
    if tied:
        spec["tied"] = True
    if frozen:
        spec["frozen"] = frozen
    return spec


def _unsharded_form(rng, recipe):
    """The arguments of a call whose answer is the unsharded state: the defaults, stage 0 on any number of
    ranks (DDP), or any stage on one rank; positional or by keyword."""
    stage, world = rng.choice([(0, rng.randint(1, 1000)), (rng.randint(0, 3), 1), (0, 1)])
    form = rng.randrange(5)
    if form == 0:
        return call(recipe)
    if form == 1:
        return call(recipe, stage, world)
    if form == 2:
        return call(recipe, stage=stage, world_size=world)
    if form == 3:
        return call(recipe=recipe, stage=stage, world_size=world)
    return call(recipe, stage) if world == 1 else call(recipe, world_size=world)


def _calls_on(rng, specs, device=None):
    calls = []
    for spec in specs:
        where = device or ("cpu" if sum(spec["widths"]) < 60 and rng.random() < 0.5 else "meta")
        for recipe in RECIPES:
            calls.append({"spec": spec, "device": where, **_unsharded_form(rng, recipe)})
    return calls


def draw_generated(rng):
    """Boundaries first (one Linear(1, 1); no parameter at all; only a 0-d parameter; a BatchNorm's buffers;
    no biases), then random models; every recipe, unsharded forms of the call."""
    named = [{"widths": [1, 1]}, {"widths": [3]}, {"widths": [3], "scalar": True},
             {"widths": [4, 5, 2], "batchnorm": True, "seed": 2}, {"widths": [7, 3, 5], "bias": False, "seed": 3}]
    return _calls_on(rng, named + [_spec(rng) for _ in range(6)])


def draw_tied(rng):
    """Models whose output layer shares the embedding's weight (with and without biases, norms)."""
    return _calls_on(rng, [{"widths": [4, 6, 4, 9], "tied": True}] + [_spec(rng, tied=True) for _ in range(3)])


def draw_frozen(rng):
    """The first layer frozen, every parameter frozen (no gradient, no optimizer state at all), with tied weights."""
    specs = [{"widths": [5, 3, 2], "frozen": "first"}, {"widths": [5, 3], "frozen": "all"},
             _spec(rng, frozen="first"), _spec(rng, frozen="all"), _spec(rng, tied=True, frozen="first"),
             _spec(rng, tied=True, frozen="all")]
    return _calls_on(rng, specs)


def draw_zero(rng):
    """Every stage; one rank, ranks that divide P_t exactly, more ranks than elements, random ranks up to
    1000; small and meta-device models up to 10^9 parameters, frozen and tied ones (P differs from P_t)."""
    specs = [{"widths": [6, 10, 4], "seed": 1}, {"widths": [1, 1]}, {"widths": [5, 3, 2], "frozen": "first"},
             {"widths": [5, 3], "frozen": "all"}]
    specs += [_spec(rng, big=True) for _ in range(4)] + [_spec(rng, big=True, frozen="first")]
    specs += [_spec(rng), _spec(rng, tied=True), _spec(rng, frozen="first")]
    calls = []
    for i, spec in enumerate(specs):
        P, P_t, _ = parameter_counts(_meta_model(spec))
        divisors = [d for d in range(2, min(P_t, 64) + 1) if P_t % d == 0]
        worlds = [1, 2, rng.randint(2, 1000), P_t + 1 + rng.randint(0, 5), 1000]
        if divisors:
            worlds.append(rng.choice(divisors))
        for stage in range(4):
            recipe = rng.choice(RECIPES)
            world = worlds[(i + stage) % len(worlds)] if stage else rng.choice(worlds)
            form = rng.randrange(3)
            args = (call(recipe, stage, world) if form == 0 else call(recipe, stage=stage, world_size=world)
                    if form == 1 else call(recipe=recipe, world_size=world, stage=stage))
            calls.append({"spec": spec, "device": "meta", **args})
    return calls


def draw_bad_arguments(rng):
    """Each way out of the domain, named values first: recipes other than the three strings (another case,
    spaces, 'fp16', None, a number, a list or a set holding a recipe: unhashable, ValueError all the same):
    ValueError; int stages other than 0-3 (4, -1, huge) and int world sizes below 1 (0, -2, huge): ValueError;
    stages and world sizes that are not ints (1.5, 2.0, '1', None, True, False, a NumPy integer): TypeError,
    even where a value check would also refuse them (False < 1); then random ones."""
    import numpy

    spec = {"widths": [5, 3], "seed": 0}
    bad = []
    for recipe in ("fp16", "FP32", "Amp", "bf16 ", "", None, 32, "float32", ["fp32"], {"fp32"}):
        bad.append(call(recipe, 0, 1))
    for stage in (4, -1, 1.5, "1", None, 10 ** 20, 3.5):
        bad.append(call(rng.choice(RECIPES), stage, 2))
    for world in (0, -2, 2.0, 0.5, "2", None, -(10 ** 20)):
        bad.append(call(rng.choice(RECIPES), rng.randint(0, 3), world))
    for _ in range(6):
        recipe = rng.choice(RECIPES)
        bad.append(call(rng.choice([recipe.upper(), recipe.capitalize(), f" {recipe}", recipe + "16"]), 0, 1))
        bad.append(call(recipe, rng.choice([rng.randint(4, 10 ** 6), -rng.randint(1, 100), rng.randint(0, 2) + 0.5]),
                        rng.randint(1, 64)))
        bad.append(call(recipe, stage=rng.randint(0, 3),
                        world_size=rng.choice([-rng.randint(0, 100), float(rng.randint(1, 64)), rng.random()])))
    calls = [{"spec": spec, "device": rng.choice(["cpu", "meta"]), **c} for c in bad]
    # not ints, though Python compares them equal to one (True == 1, 2.0 == 2): TypeError, as the text says
    for stage in (True, False, numpy.int64(2), 2.0):
        calls.append({"spec": spec, "device": "meta", **call("fp32", stage, 3)})
        calls.append({"spec": spec, "device": "meta", **call("amp", stage=stage, world_size=2)})
    # False is below 1 as well: the type is checked first, TypeError all the same
    for world in (True, False, numpy.int64(3), 4.0):
        calls.append({"spec": spec, "device": "meta", **call("bf16", 3, world)})
    calls.append({"spec": spec, "device": "meta", **call("fp32", stage=False, world_size=False)})
    return calls


def observe_training_bytes_calls(ns, calls):
    from gpucourse.checks.lesson12_memory import call_on_models

    return call_on_models(ns, "training_bytes", calls)


def _outcome(model, spec_call):
    try:
        return reference_training_bytes(model, *rebuild(spec_call["args"]), **rebuild(spec_call["kwargs"]))
    except (ValueError, TypeError) as error:
        return type(error).__name__


def _shown(c, model_words):
    args = rebuild(c["args"])
    kwargs = rebuild(c["kwargs"])
    text = ", ".join(["model"] + [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
    return f"training_bytes({text}) on a model of {model_words}"


def judge_training_bytes(label):
    """A judge ``judge(observed, calls)``: each outcome against the reference's (or an alternative reading's)."""
    def judge(observed, calls):
        if not isinstance(observed, list) or len(observed) != len(calls):
            return f"{len(observed) if isinstance(observed, list) else 'no'} outcomes for {len(calls)} calls"
        models = {}
        for c, got in zip(calls, observed):
            key = json.dumps(c["spec"], sort_keys=True)
            if key not in models:
                models[key] = _meta_model(c["spec"])
            model = models[key]
            P, P_t, T_t = parameter_counts(model)
            words = (f"{describe_spec(c['spec'])} ({P:,} parameters, {P_t:,} trainable in {T_t} tensors"
                     f"{', on the meta device' if c.get('device') == 'meta' else ''})")
            wants = [_outcome(model, c)]
            for other in c.get("also", []):
                wants.append(other if other in ("ValueError", "TypeError") else _outcome(model, other))
            found = bytes_verdict(got, wants, f"{label}: {_shown(c, words)}", numpy_ok=bool(c.get("numpy_ok")))
            if found:
                return found
        return None
    return judge

"""Hidden checks for lesson 12 (where the memory goes). Never released; see lesson 1's for the form.

Every hidden case draws its inputs at grading time (``Case.draw``, a generator seeded per submission on
the grader's side): model specs and arguments for ``training_bytes``, block stacks and budgets for
``choose_segments``, boundaries first, then random ones from the whole domain the exercise's text
states. The observers build the models and stacks the specs describe in the sandbox
(``gpucourse.checks.lesson12_memory``; ``observe_odd_stacks`` builds stacks of other blocks itself, and the
judges call it to build the same ones), call the answer and report what it returned or raised; the judges
rebuild the same models and stacks here and compute the expected values with the references below,
which exist on the grader's side only (the public module stores its few expected values as literals).
"""

import json

from gpucourse.checks import Case
from gpucourse.checks.lesson12_memory import (RECIPES, build_model, build_plan_inputs, bytes_verdict, describe_spec,
                                       describe_stack, model_inputs, plan_verdict)
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


HIDDEN = {"training_bytes": [
    Case("generated models, three recipes: the state one Adam step leaves, unsharded (stage 0, or one rank)",
         observe_training_bytes_calls, judge_training_bytes("generated model"), draw=draw_generated),
    Case("tied weights: a parameter shared by two modules counts once", observe_training_bytes_calls,
         judge_training_bytes("model with tied weights"), draw=draw_tied),
    Case("frozen layers: parameters, but no gradient and no optimizer state", observe_training_bytes_calls,
         judge_training_bytes("model with frozen parameters"), draw=draw_frozen),
    Case("ZeRO stages 0-3 on 1 to 1000 ranks, sizes not divisible (ceil), meta-device models up to 10^9 parameters",
         observe_training_bytes_calls, judge_training_bytes("sharded"), draw=draw_zero),
    Case("bad arguments: ValueError for a recipe other than the three strings, an int stage other than 0-3, "
         "an int world_size < 1; TypeError for a stage or world_size that is not an int (bool, float, str, NumPy)",
         observe_training_bytes_calls, judge_training_bytes("bad arguments"),
         draw=draw_bad_arguments),
]}


# --- choose_segments: the reference ---------------------------------------------------------------------

def reference_plan_bytes(spec: dict) -> list[int]:
    """The saved bytes of every plan k = 1..n of the spec's stack, as the text defines them: the distinct
    storages a saved_tensors_hooks pack hook receives during checkpoint_sequential(blocks, k, x,
    use_reentrant=False), each once, the blocks' parameters left out."""
    with global_rng():  # build_stack seeds torch's global generator
        blocks, x = build_plan_inputs(spec)
    return measured_plan_bytes(blocks, x)


def measured_plan_bytes(blocks, x, *, element_bytes=False) -> list[int]:
    """The saved bytes of every plan k = 1..n of ``blocks`` on ``x`` (see ``reference_plan_bytes``).
    ``element_bytes``: a misreading instead, numel * element_size of each distinct data pointer (a view of a
    wider tensor counts small), used only to find budgets where the two readings pick different plans."""
    import torch
    from torch.utils.checkpoint import checkpoint_sequential

    params = {(str(p.device), p.untyped_storage().data_ptr()) for p in blocks.parameters()}
    out = []
    for k in range(1, len(blocks) + 1):
        storages = {}

        def pack(t):
            key = (str(t.device), t.untyped_storage().data_ptr())
            if key not in params:
                if element_bytes:
                    storages[(str(t.device), t.data_ptr())] = t.numel() * t.element_size()
                else:
                    storages[key] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            checkpoint_sequential(blocks, k, x, use_reentrant=False)
        out.append(sum(storages.values()))
    return out


def recompute_cost(n: int, k: int) -> int:
    """The text's cost of a plan: the blocks recomputed in backward, (k - 1) * (n // k)."""
    return (k - 1) * (n // k)


def reference_choice(plan_bytes: list[int], budget):
    """The text's rule: among the plans whose bytes are <= budget, the lowest cost, then the fewest bytes,
    then the fewest segments; None (ValueError) when none fits."""
    n = len(plan_bytes)
    fits = [k for k in range(1, n + 1) if plan_bytes[k - 1] <= budget]
    return min(fits, key=lambda k: (recompute_cost(n, k), plan_bytes[k - 1], k)) if fits else None


def fewest_fitting(plan_bytes, budget):
    fits = [k for k in range(1, len(plan_bytes) + 1) if plan_bytes[k - 1] <= budget]
    return min(fits) if fits else None


def is_tie(plan_bytes, budget) -> bool:
    """Whether two fitting plans share the lowest cost (the text's tie-breaks decide)."""
    n = len(plan_bytes)
    fits = [k for k in range(1, n + 1) if plan_bytes[k - 1] <= budget]
    if not fits:
        return False
    low = min(recompute_cost(n, k) for k in fits)
    return sum(recompute_cost(n, k) == low for k in fits) > 1


# --- choose_segments: what is drawn ---------------------------------------------------------------------

def _stack_spec(rng, *, blocks=(1, 8), acts=("gelu", "relu", "tanh"), dtypes=("float32",), bulge=False):
    """A block stack: ``blocks`` = (fewest, most), widths 2 to 48, batch 1 to 12, an activation, a
    LayerNorm or not, the input requiring grad or not. ``bulge``: 9 to 12 GELU blocks, narrow at first and
    wide in the middle, where more segments can recompute fewer blocks than the fewest that fit."""
    n = rng.randint(*blocks)
    widths = [rng.randint(2, 48) for _ in range(n + 1)]
    if bulge:
        n = rng.randint(9, 12)
        widths = [rng.randint(2, 4) for _ in range(n // 2)] + [rng.randint(64, 96) for _ in range(2)]
        widths += [rng.randint(2, 16) for _ in range(n + 1 - len(widths))]
    return {"widths": widths, "batch": rng.randint(1, 12), "act": "gelu" if bulge else rng.choice(acts),
            "norm": rng.random() < 0.3, "dtype": rng.choice(dtypes), "x_grad": rng.random() < 0.5,
            "seed": rng.randint(0, 999)}


def _budgets_between(rng, plan_bytes, count):
    """``count`` budgets from: a plan's bytes exactly, a few bytes above one, between two, a float, above every
    plan (up to integers above 2**53)."""
    levels = sorted(set(plan_bytes))
    out = []
    for _ in range(count):
        kind = rng.randrange(5)
        level = rng.choice(levels)
        if kind == 0:
            out.append(level)
        elif kind == 1:
            out.append(level + rng.randint(1, 3))
        elif kind == 2 and len(levels) > 1:
            i = rng.randrange(len(levels) - 1)
            out.append(rng.randint(levels[i], levels[i + 1] - 1))
        elif kind == 3:
            out.append(level + 0.5)
        else:
            out.append(rng.choice([levels[-1], levels[-1] + rng.randint(1, 10 ** 6), 2 ** 53 + rng.randint(1, 10 ** 6)]))
    return out


def _stacks(specs, budgets_of):
    return [{"spec": spec, "budgets": budgets_of(spec, reference_plan_bytes(spec))} for spec in specs]


def draw_stacks(rng):
    """Random stacks of 1 to 12 blocks (GELU, ReLU, Tanh, LayerNorm or not), three budgets each."""
    specs = [_stack_spec(rng, blocks=(1, 8)) for _ in range(6)] + [_stack_spec(rng, blocks=(9, 12))]
    return _stacks(specs, lambda spec, plan_bytes: _budgets_between(rng, plan_bytes, 3))


def draw_exact(rng):
    """ReLU and Tanh stacks (their output is saved again as the next Linear's input: one storage, saved twice),
    every budget exactly at a plan's bytes."""
    specs = [_stack_spec(rng, blocks=(2, 8), acts=("relu", "tanh")) for _ in range(4)]
    return _stacks(specs, lambda spec, plan_bytes: sorted(set(plan_bytes)))


def _tie_spec(rng):
    """9 to 11 GELU blocks where 3 and 4 segments recompute the same 6 blocks but keep different inputs (of
    blocks 0 and 3, against 0, 2 and 4): the input of block 3 wide, those of 2 and 4 narrow, and block 5's
    wide too, so that no cheaper plan fits where both do. The rule then picks 4 segments, the fewer bytes."""
    n = rng.randint(9, 11)
    widths = [rng.randint(2, 6) for _ in range(n + 1)]
    widths[3], widths[5] = rng.randint(64, 96), rng.randint(64, 96)
    return {"widths": widths, "batch": rng.randint(2, 12), "act": "gelu", "norm": rng.random() < 0.3,
            "dtype": "float32", "x_grad": rng.random() < 0.5, "seed": rng.randint(0, 999)}


def _by_cost_then_segments(plan_bytes, budget):
    n = len(plan_bytes)
    fits = [k for k in range(1, n + 1) if plan_bytes[k - 1] <= budget]
    return min(fits, key=lambda k: (recompute_cost(n, k), k)) if fits else None


def draw_deep(rng):
    """Deep stacks, wide in the middle, under budgets where the fewest segments that fit is not the rule's
    plan; and stacks where two fitting plans cost the same, under budgets where the fewer bytes decide
    against the fewer segments, and where equal costs tie otherwise."""
    stacks = []
    for _ in range(2):
        for _ in range(4):  # most wide-in-the-middle stacks have such a budget; a few tries find one
            spec = _stack_spec(rng, bulge=True)
            plan_bytes = reference_plan_bytes(spec)
            levels = sorted(set(plan_bytes))
            split = [b for b in levels if fewest_fitting(plan_bytes, b) != reference_choice(plan_bytes, b)]
            if split:
                break
        stacks.append({"spec": spec, "budgets": sorted(rng.sample(split, min(2, len(split)))) or [rng.choice(levels)]})
    for _ in range(10):
        spec = _tie_spec(rng)
        plan_bytes = reference_plan_bytes(spec)
        levels = sorted(set(plan_bytes))
        broken = [b for b in levels if reference_choice(plan_bytes, b) != _by_cost_then_segments(plan_bytes, b)]
        if broken:
            ties = [b for b in levels if is_tie(plan_bytes, b) and b not in broken]
            stacks.append({"spec": spec, "budgets": sorted(set(rng.sample(broken, min(2, len(broken)))
                                                              + rng.sample(ties, min(1, len(ties)))))})
            break
    return stacks


def draw_nothing_fits(rng):
    """Budgets below every plan: a byte below the smallest, 0, negative, a float just below."""
    specs = [_stack_spec(rng) for _ in range(3)]
    return _stacks(specs, lambda spec, plan_bytes: [min(plan_bytes) - 1, rng.choice([0, -1, -rng.randint(2, 10 ** 6)]),
                                                    min(plan_bytes) - rng.randint(2, 100), min(plan_bytes) - 0.5])


def draw_one_block(rng):
    """One block: the only plan is 1 segment; at, above and below its bytes."""
    specs = [_stack_spec(rng, blocks=(1, 1), dtypes=("float32", "float64", "bfloat16")) for _ in range(3)]
    return _stacks(specs, lambda spec, plan_bytes: [plan_bytes[0], plan_bytes[0] + rng.randint(1, 1000), plan_bytes[0] - 1])


def draw_dtypes(rng):
    """float64 and bfloat16 stacks, inputs that require grad or not, two budgets each."""
    specs = [_stack_spec(rng, dtypes=("float64", "bfloat16")) for _ in range(2)]
    specs += [dict(_stack_spec(rng, dtypes=("float64",)), x_grad=True), dict(_stack_spec(rng, dtypes=("bfloat16",)), x_grad=False)]
    return _stacks(specs, lambda spec, plan_bytes: _budgets_between(rng, plan_bytes, 2))


def observe_odd_stacks(ns, stacks):
    """For each ``{"spec", "budgets"}`` of an odd stack (``spec["blocks"]``: ["mlp", a, h, b] a nested
    Sequential(Linear(a, h), GELU(), Linear(h, b)); ["id", w] an Identity; ["linear", a, b]; ["head", a, wide, w]
    a Linear(a, wide) and a GELU whose output's first w columns go on, a view of the wider tensor), in
    ``spec["mode"]``: "train", "eval", or "mixed" (train, the modules listed in ``spec["eval"]`` in eval mode):
    build it, call the answer with each budget and report, as ``observe_plans`` does, what it returned or
    raised, whether the parameters came back untouched and without gradients, and whether every module's
    training flag is what it was. With ``ns`` None (the judge's side) it returns the built (blocks, x) instead:
    the sandbox and the grader build the stacks with this one function."""
    import torch
    from torch import nn

    class Head(nn.Module):
        def __init__(self, a, wide, w):
            super().__init__()
            self.lin, self.w = nn.Linear(a, wide), w

        def forward(self, x):
            return nn.functional.gelu(self.lin(x))[:, :self.w]

    def build(spec):
        torch.manual_seed(spec["seed"])
        blocks = []
        for kind, *sizes in spec["blocks"]:
            if kind == "mlp":
                blocks.append(nn.Sequential(nn.Linear(sizes[0], sizes[1]), nn.GELU(), nn.Linear(sizes[1], sizes[2])))
            elif kind == "id":
                blocks.append(nn.Identity())
            elif kind == "linear":
                blocks.append(nn.Linear(sizes[0], sizes[1]))
            else:
                blocks.append(Head(*sizes))
        blocks = nn.Sequential(*blocks)
        if spec["mode"] == "eval":
            blocks.eval()
        for name in spec.get("eval", []):
            blocks.get_submodule(name).eval()
        g = torch.Generator().manual_seed(spec["seed"] + 1)
        x = torch.randn(spec["batch"], spec["blocks"][0][1], generator=g)
        return blocks, x.requires_grad_(bool(spec.get("x_grad")))

    if ns is None:
        return [build(stack["spec"]) for stack in stacks]

    from gpucourse.checks import AnswerError, answer
    from gpucourse.checks.values import describe, rebuild

    fn = answer(ns, "choose_segments")
    out = []
    for stack in stacks:
        blocks, x = build(stack["spec"])
        before = [p.detach().clone() for p in blocks.parameters()]
        modes = [(name, m.training) for name, m in blocks.named_modules()]
        rows = []
        for budget in stack["budgets"]:
            row = {}
            try:
                row["returned"] = describe(fn(blocks, x, rebuild(budget)))
            except (AnswerError, NotImplementedError):
                raise
            except Exception as error:  # noqa: BLE001 - reported by name
                row["raised"] = [k.__name__ for k in type(error).__mro__]
            row["unchanged"] = all(torch.equal(a, p) for a, p in zip(before, blocks.parameters()))
            row["no_grads"] = all(p.grad is None for p in blocks.parameters())
            row["modes_kept"] = [(name, m.training) for name, m in blocks.named_modules()] == modes
            rows.append(row)
        out.append(rows)
    return out


def odd_plan_bytes(spec, *, element_bytes=False) -> list[int]:
    with global_rng():  # the builder seeds torch's global generator
        [(blocks, x)] = observe_odd_stacks(None, [{"spec": spec}])
        return measured_plan_bytes(blocks, x, element_bytes=element_bytes)


def describe_odd(spec: dict) -> str:
    words = {"mlp": "Sequential(Linear, GELU, Linear)", "id": "Identity", "linear": "Linear",
             "head": "a view of a wider GELU output"}
    mode = (f"in {spec['mode']} mode" if spec["mode"] != "mixed"
            else f"in train mode but blocks {', '.join(spec['eval'])} in eval mode")
    return (f"{len(spec['blocks'])} blocks ({', '.join(words[b[0]] for b in spec['blocks'])}), batch {spec['batch']}, "
            f"{mode}{', x requires grad' if spec.get('x_grad') else ''}")


def _by_cost_bytes_then_more_segments(plan_bytes, budget):
    n = len(plan_bytes)
    fits = [k for k in range(1, n + 1) if plan_bytes[k - 1] <= budget]
    return min(fits, key=lambda k: (recompute_cost(n, k), plan_bytes[k - 1], -k)) if fits else None


def _odd_spec(rng, blocks, mode=None):
    spec = {"blocks": blocks, "batch": rng.randint(1, 12), "seed": rng.randint(0, 999), "x_grad": rng.random() < 0.5,
            "mode": mode or rng.choice(["train", "eval", "mixed"])}
    if spec["mode"] == "mixed":
        spec["eval"] = sorted(rng.sample([str(i) for i in range(len(blocks))], rng.randint(1, len(blocks))))
    return spec


def _tie_blocks(rng):
    """A nested block, an Identity (its output is its input: two plans keep the same storages), two more:
    2 and 3 segments recompute 2 blocks each and save the same bytes; more blocks behind them sometimes."""
    w, h = rng.randint(2, 24), rng.randint(32, 96)
    blocks = [["mlp", w, h, w], ["id", w], ["linear", w, w], ["linear", w, w]]
    return blocks + [["linear", w, w] for _ in range(rng.choice([0, 0, 1, 2]))]


def _view_blocks(rng):
    """Linear layers and blocks that pass on a view of a wider output (its storage is the wider tensor's)."""
    blocks, w = [], rng.randint(2, 16)
    for i in range(rng.randint(3, 7)):
        if i % 2:
            out = rng.randint(2, 16)
            blocks.append(["head", w, out + rng.randint(16, 64), out])
        else:
            out = rng.randint(2, 16)
            blocks.append(["linear", w, out])
        w = out
    return blocks


def draw_odd_blocks(rng):
    """Other blocks than Linear + activation: stacks where two plans of the lowest cost save the same bytes
    under budgets where they both fit (the fewest segments decide), and stacks whose blocks pass on views of
    wider tensors under budgets where a view's own elements and its storage's bytes pick different plans."""
    stacks = []
    for _ in range(2):
        for _ in range(10):
            spec = _odd_spec(rng, _tie_blocks(rng))
            plan_bytes = odd_plan_bytes(spec)
            ties = [b for b in sorted(set(plan_bytes))
                    if reference_choice(plan_bytes, b) != _by_cost_bytes_then_more_segments(plan_bytes, b)]
            if ties:
                break
        stacks.append({"spec": spec, "budgets": sorted(rng.sample(ties, min(2, len(ties)))) if ties
                       else sorted(set(plan_bytes))})
    for _ in range(2):
        for _ in range(10):
            spec = _odd_spec(rng, _view_blocks(rng))
            plan_bytes, small = odd_plan_bytes(spec), odd_plan_bytes(spec, element_bytes=True)
            levels = sorted(set(plan_bytes + small + [b - 1 for b in plan_bytes]))
            split = [b for b in levels if reference_choice(plan_bytes, b) != reference_choice(small, b)]
            if split:
                break
        stacks.append({"spec": spec, "budgets": sorted(rng.sample(split, min(3, len(split)))) if split
                       else sorted(set(plan_bytes))})
    return stacks


def draw_modes(rng):
    """Odd stacks in train mode, in eval mode and in train mode with some blocks in eval mode, under budgets at
    and between their plans' bytes: after the call every module is in the mode it was in."""
    stacks = []
    for mode in ["train", "eval", "mixed", rng.choice(["train", "eval", "mixed"])]:
        spec = _odd_spec(rng, rng.choice([_tie_blocks, _view_blocks])(rng), mode)
        stacks.append({"spec": spec, "budgets": _budgets_between(rng, odd_plan_bytes(spec), 2)})
    return stacks


def judge_odd_stacks(label):
    """A judge ``judge(observed, stacks)``: rebuild each odd stack here, measure its plans, apply the rule,
    then check that every module's training mode was left as it was."""
    def judge(observed, stacks):
        if not isinstance(observed, list) or len(observed) != len(stacks):
            return f"expected answers for {len(stacks)} stacks, got {len(observed) if isinstance(observed, list) else 'none'}"
        for i, (stack, rows) in enumerate(zip(stacks, observed)):
            budgets = [rebuild(b) for b in stack["budgets"]]
            if not isinstance(rows, list) or len(rows) != len(budgets):
                return f"{label} {i + 1}: expected {len(budgets)} answers"
            plan_bytes = odd_plan_bytes(stack["spec"])
            for budget, row in zip(budgets, rows):
                where = f"{label} {i + 1} ({describe_odd(stack['spec'])}), budget {budget} bytes"
                found = plan_verdict(row, reference_choice(plan_bytes, budget), where, len(plan_bytes))
                if found:
                    return found
                if row.get("modes_kept") is not True:
                    return (f"{where}: leave the blocks as they were: a module's training mode (train() or eval()) "
                            "is not what it was before the call")
        return None
    return judge


def observe_stack_calls(ns, stacks):
    from gpucourse.checks.lesson12_memory import observe_plans

    return observe_plans(ns, stacks)


def judge_stack_calls(label):
    """A judge ``judge(observed, stacks)``: rebuild each stack here, measure its plans, apply the rule."""
    def judge(observed, stacks):
        if not isinstance(observed, list) or len(observed) != len(stacks):
            return f"expected answers for {len(stacks)} stacks, got {len(observed) if isinstance(observed, list) else 'none'}"
        for i, (stack, rows) in enumerate(zip(stacks, observed)):
            budgets = [rebuild(b) for b in stack["budgets"]]
            if not isinstance(rows, list) or len(rows) != len(budgets):
                return f"{label} {i + 1}: expected {len(budgets)} answers"
            plan_bytes = reference_plan_bytes(stack["spec"])
            for budget, row in zip(budgets, rows):
                where = f"{label} {i + 1} ({describe_stack(stack['spec'])}), budget {budget} bytes"
                found = plan_verdict(row, reference_choice(plan_bytes, budget), where, len(plan_bytes))
                if found:
                    return found
        return None
    return judge


HIDDEN["choose_segments"] = [
    Case("generated stacks (1-12 blocks, other widths and activations): the rule's plan, measured",
         observe_stack_calls, judge_stack_calls("stack"), draw=draw_stacks),
    Case("budgets exactly at a plan's bytes, ReLU/Tanh stacks (a storage saved twice counts once)",
         observe_stack_calls, judge_stack_calls("stack"), draw=draw_exact),
    Case("deep stacks (9-12 blocks, wide in the middle): fewest recomputed blocks, not fewest segments; "
         "equal costs: fewer bytes, then fewer segments", observe_stack_calls, judge_stack_calls("deep stack"),
         draw=draw_deep),
    Case("nothing fits: ValueError", observe_stack_calls, judge_stack_calls("stack"), draw=draw_nothing_fits),
    Case("one block: one plan, or ValueError", observe_stack_calls, judge_stack_calls("one-block stack"),
         draw=draw_one_block),
    Case("other dtypes (float64, bfloat16), inputs with and without requires_grad", observe_stack_calls,
         judge_stack_calls("stack"), draw=draw_dtypes),
    Case("other blocks (nested, Identity, views of wider outputs): each storage's whole bytes; equal cost and "
         "bytes: the fewest segments", observe_odd_stacks, judge_odd_stacks("stack"), draw=draw_odd_blocks),
    Case("blocks in train mode, eval mode or a mix: each module left in its mode", observe_odd_stacks,
         judge_odd_stacks("stack"), draw=draw_modes),
]

_T, _C = HIDDEN["training_bytes"], HIDDEN["choose_segments"]
T_PUBLIC = ["a 6-10-4 MLP, three recipes: the bytes of one Adam step's state", "the same MLP on 2 ranks, stages 0 to 3 (fp32)"]
C_PUBLIC = "6 equal blocks: a tight budget, a budget everything fits, one nothing fits"
CLAUSES = {
    "training_bytes": {
        "returns a dict {'params', 'grads', 'optimizer'} of ints, bytes per rank": [T_PUBLIC[0], _T[0].name, _T[3].name],
        "model: any nn.Module of float32 parameters, also on the meta device (count, do not run)": [_T[0].name, _T[3].name],
        "each parameter once, as model.parameters() does (a weight shared by two modules is one parameter)":
            [_T[1].name],
        "P, P_t (requires_grad=True), T_t: frozen parameters are held but have no gradient and no optimizer state":
            [_T[2].name, _T[3].name],
        "fp32: 4 / 4 / 8 bytes per element": [T_PUBLIC[0], _T[0].name],
        "amp: the same as fp32": [T_PUBLIC[0], _T[0].name],
        "bf16: 2 / 2 / 12 bytes per element": [T_PUBLIC[0], _T[0].name],
        "Adam's step counters: 4 * T_t in 'optimizer', every recipe and stage, on every rank":
            [T_PUBLIC[0], _T[0].name, _T[3].name],
        "stage 0 (DDP): every rank holds everything; world_size=1: nothing changes": [T_PUBLIC[1], _T[0].name, _T[3].name],
        "stage 1 shards the optimizer's per-element state, 2 also the gradients, 3 also the parameters":
            [T_PUBLIC[1], _T[3].name],
        "a sharded quantity of n elements: ceil(n / world_size) per rank (params shard P, grads and state P_t)":
            [_T[3].name],
        "ValueError for a recipe other than the three strings 'fp32', 'amp', 'bf16' (of any type, unhashable too)":
            [_T[4].name],
        "ValueError for an int stage other than 0, 1, 2, 3": [_T[4].name],
        "ValueError for an int world_size below 1": [_T[4].name],
        "TypeError for a stage or world_size that is not an int: a bool (False too, although below 1), a float "
        "(even 2.0), a str, None, a NumPy integer": [_T[4].name],
        "sharding pads each quantity as one flat buffer (ZeRO's padding), not per parameter (FSDP2's)": [_T[3].name],
    },
    "choose_segments": {
        "blocks: an nn.Sequential of n >= 1 blocks (any modules: nested, Identity, views)": [_C[0].name, _C[4].name, _C[6].name],
        "x: float32, float64 or bfloat16, requiring grad or not": [_C[5].name, _C[0].name],
        "a plan: k = 1..n segments of checkpoint_sequential(blocks, k, x, use_reentrant=False)": [C_PUBLIC, _C[0].name],
        "saved bytes: distinct storages saved for backward, each once, the parameters' storages left out":
            [_C[1].name, _C[0].name],
        "each storage counted whole, untyped_storage().nbytes() (a view of a wider tensor counts the wider storage)":
            [_C[6].name],
        "cost, by the exercise's definition: (k - 1) * (n // k) blocks recomputed (a count, not a time)":
            [_C[2].name, _C[0].name],
        "fits: saved bytes <= budget_bytes": [_C[1].name, _C[0].name],
        "the lowest cost among the plans that fit, then fewer saved bytes, then the fewest segments": [_C[2].name, _C[6].name],
        "returns the number of segments, an int": [C_PUBLIC, _C[0].name],
        "ValueError when no plan fits": [C_PUBLIC, _C[3].name, _C[4].name],
        "leave the blocks as they were: no parameter changed, no gradient left": [C_PUBLIC, _C[0].name, _C[1].name, _C[3].name],
        "leave the blocks as they were: every module in the train or eval mode it was in": [_C[7].name],
    },
}

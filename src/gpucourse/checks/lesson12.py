"""Public checks for lesson 12 (where the memory goes). Observers are self-contained: see lesson01.py.

Both exercises are held against *measurement*. ``training_bytes`` predicts the bytes of the training
state; the observers build the model a spec describes (plain data: layers, widths, tied and frozen
parameters), train it one step with the recipe's optimizer and measure the storages
(``gpucourse.memory.state_bytes``). ``choose_segments`` picks a checkpointing plan under a budget;
the observers build the block stack a spec describes and measure each plan's saved activations
(``saved_bytes_per_plan``). Judges rebuild the same models and stacks from the same specs and
measure or count for themselves: they never read an expected value from an observation.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson12_memory"  # the course folder this module's exercises belong to

RECIPES = ("fp32", "amp", "bf16")


# --- Exercise 1: training_bytes ----------------------------------------------------------------

def build_model(spec: dict, device: str = "cpu"):
    """The model a spec describes: ``widths`` of a stack of Linear layers (``bias``: with biases), an
    optional LayerNorm after the first (``norm``), an Embedding in front whose weight the last Linear
    shares (``tied``: the last width equals the first), the first layer frozen (``frozen``)."""
    import torch
    from torch import nn

    torch.manual_seed(spec.get("seed", 0))
    widths = spec["widths"]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(widths[-1], widths[0]) if spec.get("tied") else None
            self.layers = nn.ModuleList(nn.Linear(a, b, bias=spec.get("bias", True)) for a, b in zip(widths, widths[1:]))
            self.norm = nn.LayerNorm(widths[1]) if spec.get("norm") else None
            if spec.get("tied"):  # the output layer reuses the embedding's (vocab, width) matrix
                self.layers[-1].weight = self.embed.weight
            if spec.get("frozen"):
                self.layers[0].requires_grad_(False)

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i == 0 and self.norm is not None:
                    x = self.norm(x)
                if i < len(self.layers) - 1:
                    x = torch.relu(x)
            return x

    with torch.device(device):
        return Net()


def model_inputs(spec: dict):
    import torch

    g = torch.Generator().manual_seed(spec.get("seed", 0))
    if spec.get("tied"):
        return torch.randint(0, spec["widths"][-1], (3,), generator=g)
    return torch.randn(3, spec["widths"][0], generator=g)


def measure_recipe(spec: dict, recipe: str) -> dict:
    """Train the spec's model one step with the recipe's optimizer and measure the state's storages:
    fp32 (Adam), amp (Adam, the forward under CPU autocast to bfloat16), bf16 (the model in bfloat16,
    ``MasterWeightAdam``)."""
    import torch

    from gpucourse.memory import MasterWeightAdam, state_bytes

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


def describe_bytes(got) -> dict:
    """A returned value as plain data: a dict's three values when they are ints, or what it was."""
    if not isinstance(got, dict):
        return {"type": type(got).__name__}
    out = {"type": "dict", "keys": sorted(map(str, got))}
    for key in ("params", "grads", "optimizer"):
        value = got.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            out[key] = f"<{type(value).__name__}>"
        else:
            out[key] = int(value)
    return out


def call_training_bytes(fn, model, recipe, stage=None, world_size=None) -> dict:
    try:
        if stage is None:
            return describe_bytes(fn(model, recipe))
        return describe_bytes(fn(model, recipe, stage=stage, world_size=world_size))
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - reported by name
        return {"error": type(error).__name__, "message": str(error)[:200]}


def observe_measured(ns, specs, recipes=RECIPES):
    """For each spec and recipe: the student's prediction (stage 0, one rank) and the measured storages."""
    from gpucourse.checks import answer
    from gpucourse.checks.lesson12 import build_model, call_training_bytes, measure_recipe

    fn = answer(ns, "training_bytes")
    out = []
    for spec in specs:
        for recipe in recipes:
            got = call_training_bytes(fn, build_model(spec), recipe)
            out.append({"recipe": recipe, "got": got, "measured": measure_recipe(spec, recipe)})
    return out


def counts(spec: dict) -> tuple[int, int, int]:
    """(P, P_trainable, T_trainable) of the spec's model, counted on the meta device."""
    model = build_model(spec, device="meta")
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    return sum(p.numel() for p in params), sum(p.numel() for p in trainable), len(trainable)


def judge_against_measurement(results, specs, expected_fn, recipes=RECIPES, label="model") -> str | None:
    """Each prediction must equal ``expected_fn(P, P_t, T_t, recipe)``, and so must the measurement
    (else the check itself is wrong, and says so)."""
    rows = [(spec, recipe) for spec in specs for recipe in recipes]
    if not isinstance(results, list) or len(results) != len(rows):
        return f"expected {len(rows)} predictions, got {len(results) if isinstance(results, list) else 'none'}"
    for i, ((spec, recipe), r) in enumerate(zip(rows, results)):
        where = f"{label} {i // len(recipes) + 1} ({describe_spec(spec)}), recipe {recipe!r}"
        want = expected_fn(*counts(spec), recipe)
        if not isinstance(r, dict) or not isinstance(r.get("got"), dict):
            return f"{where}: no answer was recorded"
        if r.get("measured") != want:
            return f"{where}: the measurement {r.get('measured')} disagrees with the memory model {want}: report this check"
        got = r["got"]
        if "error" in got:
            return f"{where}: raised {got['error']}: {got.get('message', '')}"
        if got.get("type") != "dict" or got.get("keys") != ["grads", "optimizer", "params"]:
            return f"{where}: return a dict with exactly the keys 'params', 'grads', 'optimizer', not {got}"
        for key in ("params", "grads", "optimizer"):
            if got[key] != want[key]:
                return f"{where}: {key!r} is {got[key]} bytes, but one training step measured {want[key]}"
    return None


def describe_spec(spec: dict) -> str:
    extras = [k for k in ("tied", "frozen", "norm") if spec.get(k)] + ([] if spec.get("bias", True) else ["no bias"])
    return f"widths {spec['widths']}" + (f", {', '.join(extras)}" if extras else "")


def reference_bytes(P: int, P_t: int, T_t: int, recipe: str) -> dict:
    """The unsharded state of the exercise's text, for the public judge (stage 0, one rank)."""
    low = recipe == "bf16"
    return {"params": (2 if low else 4) * P, "grads": (2 if low else 4) * P_t,
            "optimizer": (12 if low else 8) * P_t + 4 * T_t}


PUBLIC_MODEL = {"widths": [6, 10, 4], "seed": 1}


def observe_public_model(ns):
    from gpucourse.checks.lesson12 import PUBLIC_MODEL, observe_measured

    return observe_measured(ns, [PUBLIC_MODEL])


def observe_public_zero(ns):
    from gpucourse.checks import answer
    from gpucourse.checks.lesson12 import PUBLIC_MODEL, build_model, call_training_bytes

    fn = answer(ns, "training_bytes")
    return [call_training_bytes(fn, build_model(PUBLIC_MODEL), "fp32", stage=stage, world_size=2) for stage in range(4)]


def judge_public_zero(results):
    P, P_t, T_t = counts(PUBLIC_MODEL)  # 114 elements, 4 tensors: divisible by 2
    half = P_t // 2
    expected = [{"params": 4 * P, "grads": 4 * P_t, "optimizer": 8 * P_t + 4 * T_t},
                {"params": 4 * P, "grads": 4 * P_t, "optimizer": 8 * half + 4 * T_t},
                {"params": 4 * P, "grads": 4 * half, "optimizer": 8 * half + 4 * T_t},
                {"params": 4 * half, "grads": 4 * half, "optimizer": 8 * half + 4 * T_t}]
    if not isinstance(results, list) or len(results) != 4:
        return "expected 4 answers"
    for stage, (got, want) in enumerate(zip(results, expected)):
        if not isinstance(got, dict):
            return f"stage {stage}, 2 ranks: no answer was recorded"
        if "error" in got:
            return f"stage {stage}, 2 ranks: raised {got['error']}: {got.get('message', '')}"
        if got.get("type") != "dict":
            return f"stage {stage}, 2 ranks: return a dict, not a {got['type']}"
        for key in ("params", "grads", "optimizer"):
            if got.get(key) != want[key]:
                return f"stage {stage}, 2 ranks, fp32: {key!r} is {got.get(key)} bytes per rank, expected {want[key]}"
    return None


register("training_bytes",
         Case("a 6-10-4 MLP, three recipes: the prediction equals one measured Adam step", observe_public_model,
              lambda d: judge_against_measurement(d, [PUBLIC_MODEL], reference_bytes)),
         Case("the same MLP on 2 ranks, stages 0 to 3 (fp32)", observe_public_zero, judge_public_zero),
         answers=[Answer("training_bytes", "function",
                         "a function training_bytes(model, recipe, stage=0, world_size=1) returning a dict "
                         "{'params': int, 'grads': int, 'optimizer': int} of bytes per rank")],
         points=3)


# --- Exercise 2: choose_segments ------------------------------------------------------------------

def build_plan_inputs(spec: dict):
    """The block stack and input a spec describes (``gpucourse.memory.build_stack``)."""
    import torch

    from gpucourse.memory import build_stack

    dtype = getattr(torch, spec.get("dtype", "float32"))
    blocks = build_stack(spec["widths"], act=spec.get("act", "gelu"), norm=spec.get("norm", False),
                         seed=spec.get("seed", 0), dtype=dtype)
    g = torch.Generator().manual_seed(spec.get("seed", 0) + 1)
    x = torch.randn(spec["batch"], spec["widths"][0], generator=g).to(dtype)
    if spec.get("x_grad"):
        x.requires_grad_(True)
    return blocks, x


def saved_bytes_per_plan(blocks, x) -> list[int]:
    """Saved-activation bytes of ``checkpoint_sequential(blocks, k, x, use_reentrant=False)`` for k = 1..n."""
    from torch.utils.checkpoint import checkpoint_sequential

    from gpucourse.memory import SavedTensors

    out = []
    for k in range(1, len(blocks) + 1):
        with SavedTensors(exclude=blocks.parameters()) as saved:
            checkpoint_sequential(blocks, k, x, use_reentrant=False)
        out.append(saved.bytes)
    return out


def budget_for(spec: dict, plan_bytes: list[int]) -> int:
    """The spec's budget: ``pick`` = "none" (below every plan) or an index into the distinct byte
    counts, sorted, plus ``slack`` bytes (0: exactly at a plan's bytes); "split": the smallest plan size
    at which the fewest segments that fit is not the plan the exercise's rule picks."""
    levels = sorted(set(plan_bytes))
    if spec["pick"] == "none":
        return levels[0] - 1 - spec.get("slack", 0)
    if spec["pick"] == "split":  # the first budget where the fewest segments that fit is not the rule's plan
        for level in levels:
            fewest = min(k for k in range(1, len(plan_bytes) + 1) if plan_bytes[k - 1] <= level)
            if fewest != expected_plan(plan_bytes, level):
                return level
        return levels[len(levels) // 2]
    return levels[spec["pick"] % len(levels)] + spec.get("slack", 0)


def expected_plan(plan_bytes: list[int], budget: int):
    """The exercise's rule: among the plans that fit, fewest recomputed blocks, then fewest bytes, then
    fewest segments; None when none fits."""
    n = len(plan_bytes)
    fits = [k for k in range(1, n + 1) if plan_bytes[k - 1] <= budget]
    if not fits:
        return None
    return min(fits, key=lambda k: ((k - 1) * (n // k), plan_bytes[k - 1], k))


def observe_plans(ns, specs):
    """For each spec: the student's choice under the spec's budget (or the exception it raised), and
    whether the blocks came back untouched (same parameters, no gradients)."""
    import torch

    from gpucourse.checks import answer
    from gpucourse.checks.lesson12 import budget_for, build_plan_inputs, saved_bytes_per_plan

    fn = answer(ns, "choose_segments")
    out = []
    for spec in specs:
        blocks, x = build_plan_inputs(spec)
        budget = budget_for(spec, saved_bytes_per_plan(blocks, x))
        before = [p.detach().clone() for p in blocks.parameters()]
        row = {}
        try:
            got = fn(blocks, x, budget)
            row["type"] = type(got).__name__
            row["value"] = int(got) if isinstance(got, int) and not isinstance(got, bool) else None
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - reported by name
            row["error"] = type(error).__name__
        row["unchanged"] = all(torch.equal(a, p) for a, p in zip(before, blocks.parameters()))
        row["no_grads"] = all(p.grad is None for p in blocks.parameters())
        out.append(row)
    return out


def judge_plans(results, specs, label="stack") -> str | None:
    """Rebuild each stack, measure its plans here, work out the budget and the rule's plan, compare."""
    if not isinstance(results, list) or len(results) != len(specs):
        return f"expected {len(specs)} answers, got {len(results) if isinstance(results, list) else 'none'}"
    for i, (spec, got) in enumerate(zip(specs, results)):
        blocks, x = build_plan_inputs(spec)
        plan_bytes = saved_bytes_per_plan(blocks, x)
        budget = budget_for(spec, plan_bytes)
        want = expected_plan(plan_bytes, budget)
        where = f"{label} {i + 1} ({len(blocks)} blocks, widths {spec['widths']}, {spec.get('dtype', 'float32')}, budget {budget} bytes)"
        if not isinstance(got, dict):
            return f"{where}: no answer was recorded"
        if want is None:
            if got.get("error") != "ValueError":
                return f"{where}: no plan fits this budget: raise ValueError (got {got.get('error') or got.get('type')})"
        elif "error" in got:
            return f"{where}: raised {got['error']}, but a plan fits"
        elif got.get("value") is None:
            return f"{where}: return the number of segments, an int, not a {got.get('type')}"
        elif not 1 <= got["value"] <= len(blocks):
            return f"{where}: {got['value']} segments is not a plan of {len(blocks)} blocks"
        elif plan_bytes[got["value"] - 1] > budget:
            return f"{where}: {got['value']} segments save {plan_bytes[got['value'] - 1]} bytes, over the budget"
        elif got["value"] != want:
            n = len(blocks)
            cost = lambda k: (k - 1) * (n // k)  # noqa: E731
            return (f"{where}: {got['value']} segments fits ({plan_bytes[got['value'] - 1]} bytes, "
                    f"{cost(got['value'])} blocks recomputed), but it is not the plan the rule picks: fewest "
                    f"recomputed blocks, then fewest bytes, then fewest segments")
        if not got.get("unchanged") or not got.get("no_grads"):
            return f"{where}: leave the blocks as they were (their parameters changed, or gradients were left on them)"
    return None


PUBLIC_STACKS = [
    {"widths": [32] * 7, "batch": 16, "seed": 3, "pick": 1, "slack": 0},          # 6 GELU blocks, a tight budget
    {"widths": [32] * 7, "batch": 16, "seed": 3, "pick": -1, "slack": 0},         # everything fits: no checkpointing
    {"widths": [32] * 7, "batch": 16, "seed": 3, "pick": "none"},                 # nothing fits
]


def observe_public_plans(ns):
    from gpucourse.checks.lesson12 import PUBLIC_STACKS, observe_plans

    return observe_plans(ns, PUBLIC_STACKS)


register("choose_segments",
         Case("6 equal blocks: a tight budget, a budget everything fits, one nothing fits", observe_public_plans,
              lambda d: judge_plans(d, PUBLIC_STACKS)),
         answers=[Answer("choose_segments", "function",
                         "a function choose_segments(blocks, x, budget_bytes) returning the number of "
                         "segments (an int) of the plan to use, or raising ValueError")],
         points=3)


# --- generated inputs for the hidden checks (seeded: the judge regenerates the same ones) ---------

def model_specs(seed: int, count: int, *, tied: bool = False, frozen: bool = False) -> list[dict]:
    """``count`` random model specs: 1 to 4 Linear layers of widths 1 to 40, with or without biases and
    a LayerNorm; ``tied``: an Embedding whose weight the output layer shares; ``frozen``: the first
    layer frozen."""
    import random

    rng = random.Random(seed)
    specs = []
    for _ in range(count):
        depth = rng.randint(2 if tied else 1, 4)
        widths = [rng.randint(1, 40) for _ in range(depth + 1)]
        if tied:
            widths[-2] = widths[0]  # the output layer's weight is (vocab, width): the embedding's shape
        spec = {"widths": widths, "bias": rng.random() < 0.7, "norm": rng.random() < 0.4, "seed": rng.randint(0, 999)}
        if tied:
            spec["tied"] = True
        if frozen:
            spec["frozen"] = True
        specs.append(spec)
    return specs


def sharding_cases(seed: int, count: int) -> list[dict]:
    """Models of 10^3 to 10^9 parameters on the meta device (nothing allocated), a recipe, a stage 0-3 and
    a world size (1, and sizes that do not divide the parameter count)."""
    import random

    rng = random.Random(seed)
    cases = []
    for i in range(count):
        width = rng.randint(30, 40_000)
        spec = {"widths": [width, rng.randint(3, 9_999), rng.randint(1, 999)], "bias": rng.random() < 0.8,
                "norm": rng.random() < 0.5, "frozen": rng.random() < 0.3, "seed": i}
        cases.append({"spec": spec, "recipe": rng.choice(RECIPES), "stage": i % 4,
                      "world_size": 1 if i % 5 == 0 else rng.choice([2, 3, 5, 7, 8, 12, 64, 1000])})
    return cases


def observe_sharding(ns, cases):
    """The student's answers for meta-device models (built here from the cases' specs)."""
    from gpucourse.checks import answer
    from gpucourse.checks.lesson12 import build_model, call_training_bytes

    fn = answer(ns, "training_bytes")
    return [call_training_bytes(fn, build_model(c["spec"], device="meta"), c["recipe"], stage=c["stage"],
                                world_size=c["world_size"]) for c in cases]


def stack_specs(seed: int, count: int, *, pick: str = "any", dtypes=("float32",), acts=("gelu", "relu", "tanh"),
                blocks=(1, 8), bulge: bool = False) -> list[dict]:
    """``count`` random block stacks: ``blocks`` = (fewest, most) blocks, widths 2 to 48, batch 1 to 12, an
    activation, a LayerNorm or not, the input requiring grad or not; a budget ``pick``: "any" (one of the
    distinct plan sizes, exactly or with a few bytes to spare), "exact" (exactly a plan's bytes) or
    "none" (below every plan). ``bulge``: 9 to 12 GELU blocks, narrow at first and wide in the middle,
    where a plan with more segments can recompute fewer blocks than the fewest segments that fit, and
    the budget where that happens ("split")."""
    import random

    rng = random.Random(seed)
    specs = []
    for _ in range(count):
        n = rng.randint(*blocks)
        widths = [rng.randint(2, 48) for _ in range(n + 1)]
        if bulge:
            n = rng.randint(9, 12)
            widths = [rng.randint(2, 4) for _ in range(n // 2)] + [rng.randint(64, 96) for _ in range(2)]
            widths += [rng.randint(2, 16) for _ in range(n + 1 - len(widths))]
        spec = {"widths": widths, "batch": rng.randint(1, 12), "act": rng.choice(acts), "norm": rng.random() < 0.3,
                "dtype": rng.choice(dtypes), "x_grad": rng.random() < 0.5, "seed": rng.randint(0, 999)}
        if bulge:
            spec.update(act="gelu", pick="split", slack=0)
        elif pick == "none":
            spec.update(pick="none", slack=rng.choice([0, 1, 7]))
        else:
            spec.update(pick=rng.randint(0, n), slack=0 if pick == "exact" or rng.random() < 0.5 else rng.choice([1, 2, 3]))
        specs.append(spec)
    return specs

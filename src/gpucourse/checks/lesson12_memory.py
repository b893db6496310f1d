"""Public checks for lesson 12 (where the memory goes). Observers are self-contained: see lesson01_processes_threads.py.

``training_bytes`` predicts the bytes of the training state; ``choose_segments`` picks a checkpointing
plan under a budget. The observers build the models and block stacks that plain-data specs describe
(``build_model``, ``build_plan_inputs``: layers, widths, tied and frozen parameters, activations), call
the answer and report what it returned or raised (``gpucourse.checks.values.describe``). The public
judges compare with the expected values stored below (``TRAINING_PUBLIC``, ``PLANS_PUBLIC``): this
module holds no way to compute them. The grader's hidden checks draw other models, stacks and budgets
at grading time and compute the expected values on its side.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson12_memory"  # the course folder this module's exercises belong to

RECIPES = ("fp32", "amp", "bf16")


# --- Exercise 1: training_bytes ----------------------------------------------------------------

def build_model(spec: dict, device: str = "cpu"):
    """The model a spec describes: ``widths`` of a stack of Linear layers (``bias``: with biases; one
    width: no layer at all), an optional LayerNorm (``norm``) or BatchNorm1d (``batchnorm``: parameters
    and buffers) after the first, an Embedding in front whose weight the last Linear shares (``tied``:
    the last width equals the first), a learnable 0-d output scale (``scalar``), and ``frozen``: the first
    layer frozen (True or "first") or every parameter ("all"). On the meta device nothing is drawn
    (no seeding of torch's global generator: a judge builds meta models in the grader's threads)."""
    import torch
    from torch import nn

    if device != "meta":
        torch.manual_seed(spec.get("seed", 0))
    widths = spec["widths"]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(widths[-1], widths[0]) if spec.get("tied") else None
            self.layers = nn.ModuleList(nn.Linear(a, b, bias=spec.get("bias", True)) for a, b in zip(widths, widths[1:]))
            self.norm = None
            if len(widths) > 1 and spec.get("norm"):
                self.norm = nn.LayerNorm(widths[1])
            elif len(widths) > 1 and spec.get("batchnorm"):
                self.norm = nn.BatchNorm1d(widths[1])
            self.scale = nn.Parameter(torch.tensor(1.0)) if spec.get("scalar") else None
            if spec.get("tied"):  # the output layer reuses the embedding's (vocab, width) matrix
                self.layers[-1].weight = self.embed.weight
            if spec.get("frozen") == "all":
                self.requires_grad_(False)
            elif spec.get("frozen") and len(self.layers):
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
            return x if self.scale is None else x * self.scale

    with torch.device(device):
        return Net()


def model_inputs(spec: dict):
    """A batch of 3 inputs for the spec's model (token ids when it is tied to an embedding)."""
    import torch

    g = torch.Generator().manual_seed(spec.get("seed", 0))
    if spec.get("tied"):
        return torch.randint(0, spec["widths"][-1], (3,), generator=g)
    return torch.randn(3, spec["widths"][0], generator=g)


def describe_spec(spec: dict) -> str:
    """A spec in a few words, for messages."""
    extras = [k for k in ("tied", "norm", "batchnorm", "scalar") if spec.get(k)]
    if spec.get("frozen"):
        extras.append("everything frozen" if spec["frozen"] == "all" else "frozen")
    if not spec.get("bias", True):
        extras.append("no bias")
    return f"widths {spec['widths']}" + (f", {', '.join(extras)}" if extras else "")


def call_on_models(ns, name, calls):
    """For each call ``{"spec", "device", "args", "kwargs"}``: build the spec's model on ``device``, call
    the answer ``name(model, *args, **kwargs)`` (arguments as ``values.describe`` writes them) and report
    ``{"returned": <described value>}`` or ``{"raised": [the exception's classes, along its MRO]}``."""
    from gpucourse.checks import AnswerError, answer
    from gpucourse.checks.lesson12_memory import build_model
    from gpucourse.checks.values import describe, rebuild

    function = answer(ns, name)
    out = []
    for call in calls:
        model = build_model(call["spec"], device=call.get("device", "cpu"))
        args, kwargs = rebuild(call.get("args", [])), rebuild(call.get("kwargs", {"__dict__": []}))
        try:
            out.append({"returned": describe(function(model, *args, **kwargs))})
        except (AnswerError, NotImplementedError):
            raise
        except Exception as error:  # noqa: BLE001 - reported by name
            out.append({"raised": [k.__name__ for k in type(error).__mro__]})
    return out


def bytes_verdict(got, want_dicts, where: str, numpy_ok: bool = False) -> str | None:
    """What is wrong with the described outcome ``got`` of a call, when the text asks for one of
    ``want_dicts`` (each ``{"params", "grads", "optimizer"}`` of ints, or an exception's name, "ValueError" or
    "TypeError")."""
    from gpucourse.checks.values import type_words

    if not isinstance(got, dict) or ("returned" in got) == ("raised" in got):
        return f"{where}: no outcome was reported"
    values = [w for w in want_dicts if isinstance(w, dict)]
    errors = [w for w in want_dicts if isinstance(w, str)]
    must = " or ".join(errors)
    if "raised" in got:
        raised = got["raised"] if isinstance(got["raised"], list) else []
        if any(e in raised for e in errors):
            return None
        name = raised[0] if raised else "an exception"
        if not values:
            return f"{where}: raised {name}; it must raise {must}"
        return f"{where}: raised {name}" + ("" if errors else ", but these arguments are valid")
    if not values:
        return f"{where}: returned {type_words(got['returned'])}; it must raise {must}"
    returned = got["returned"]
    pairs = returned.get("__dict__") if isinstance(returned, dict) and set(returned) == {"__dict__"} else None
    if not isinstance(pairs, list):
        return f"{where}: returned {type_words(returned)}; return a dict {{'params': int, 'grads': int, 'optimizer': int}}"
    found = {k: v for k, v in pairs if isinstance(k, str)}
    if len(found) != len(pairs) or set(found) != {"params", "grads", "optimizer"}:
        keys = sorted(repr(k) for k, _ in pairs)
        return f"{where}: return a dict with exactly the keys 'params', 'grads', 'optimizer', not {keys}"
    for key in ("params", "grads", "optimizer"):
        value = found[key]
        if isinstance(value, dict) and numpy_ok and "__numpy__" in value and str(value["__numpy__"]).startswith(("int", "uint")):
            value = value["value"]
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{where}: {key!r} is {type_words(found[key])}; the bytes are an int"
        found[key] = value
    if any(all(found[k] == w[k] for k in found) for w in values):
        return None
    for key in ("params", "grads", "optimizer"):
        if all(found[key] != w[key] for w in values):
            return f"{where}: {key!r} is {found[key]} bytes, not what the text's rule gives"
    return f"{where}: the three numbers do not belong together"  # each matches a different reading


# The public model and what the text's rule gives for it, worked out by hand (stored: this module has no
# way to compute them). PUBLIC_MODEL: Linear(6, 10), ReLU, Linear(10, 4): P = P_t = 114, T_t = 4.
PUBLIC_MODEL = {"widths": [6, 10, 4], "seed": 1}
TRAINING_PUBLIC = {  # (recipe, stage, world_size) -> bytes per rank
    ("fp32", 0, 1): {"params": 456, "grads": 456, "optimizer": 928},
    ("amp", 0, 1): {"params": 456, "grads": 456, "optimizer": 928},
    ("bf16", 0, 1): {"params": 228, "grads": 228, "optimizer": 1384},
    ("fp32", 0, 2): {"params": 456, "grads": 456, "optimizer": 928},
    ("fp32", 1, 2): {"params": 456, "grads": 456, "optimizer": 472},
    ("fp32", 2, 2): {"params": 456, "grads": 228, "optimizer": 472},
    ("fp32", 3, 2): {"params": 228, "grads": 228, "optimizer": 472},
}


def observe_public_recipes(ns):
    from gpucourse.checks.lesson12_memory import PUBLIC_MODEL, call_on_models
    from gpucourse.checks.values import describe

    calls = [{"spec": PUBLIC_MODEL, "args": describe([recipe]), "kwargs": describe({})} for recipe in ("fp32", "amp", "bf16")]
    return call_on_models(ns, "training_bytes", calls)


def judge_public_recipes(observed):
    from gpucourse.checks.lesson12_memory import TRAINING_PUBLIC, bytes_verdict

    recipes = ("fp32", "amp", "bf16")
    if not isinstance(observed, list) or len(observed) != len(recipes):
        return "the answer was not called on every recipe"
    for recipe, got in zip(recipes, observed):
        found = bytes_verdict(got, [TRAINING_PUBLIC[(recipe, 0, 1)]], f"6-10-4 MLP (114 parameters), recipe {recipe!r}")
        if found:
            return found
    return None


def observe_public_zero(ns):
    from gpucourse.checks.lesson12_memory import PUBLIC_MODEL, call_on_models
    from gpucourse.checks.values import describe

    calls = [{"spec": PUBLIC_MODEL, "args": describe(["fp32"]), "kwargs": describe({"stage": stage, "world_size": 2})}
             for stage in range(4)]
    return call_on_models(ns, "training_bytes", calls)


def judge_public_zero(observed):
    from gpucourse.checks.lesson12_memory import TRAINING_PUBLIC, bytes_verdict

    if not isinstance(observed, list) or len(observed) != 4:
        return "expected 4 answers"
    for stage, got in enumerate(observed):
        found = bytes_verdict(got, [TRAINING_PUBLIC[("fp32", stage, 2)]], f"stage {stage}, 2 ranks, fp32")
        if found:
            return found
    return None


register("training_bytes",
         Case("a 6-10-4 MLP, three recipes: the bytes of one Adam step's state", observe_public_recipes,
              judge_public_recipes),
         Case("the same MLP on 2 ranks, stages 0 to 3 (fp32)", observe_public_zero, judge_public_zero),
         answers=[Answer("training_bytes", "function",
                         "a function training_bytes(model, recipe, stage=0, world_size=1) returning a dict "
                         "{'params': int, 'grads': int, 'optimizer': int} of bytes per rank")],
         points=3)


# --- Exercise 2: choose_segments ------------------------------------------------------------------

def build_plan_inputs(spec: dict):
    """The block stack and input a spec describes (``gpucourse.memory.build_stack``: ``widths``, ``act``,
    ``norm``, ``seed``, ``dtype``), a batch of ``batch`` rows, requiring grad when ``x_grad``."""
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


def describe_stack(spec: dict) -> str:
    extras = [spec.get("act", "gelu")] + (["LayerNorm"] if spec.get("norm") else [])
    extras += [spec.get("dtype", "float32")] + (["x requires grad"] if spec.get("x_grad") else [])
    return f"{len(spec['widths']) - 1} blocks, widths {spec['widths']}, batch {spec['batch']}, {', '.join(extras)}"


def observe_plans(ns, stacks):
    """For each ``{"spec", "budgets"}``: build the stack once, call the answer with each budget (a budget
    as ``values.describe`` writes it), and report what it returned or raised, and whether the blocks came
    back untouched (same parameters, no gradients)."""
    import torch

    from gpucourse.checks import AnswerError, answer
    from gpucourse.checks.lesson12_memory import build_plan_inputs
    from gpucourse.checks.values import describe, rebuild

    fn = answer(ns, "choose_segments")
    out = []
    for stack in stacks:
        blocks, x = build_plan_inputs(stack["spec"])
        before = [p.detach().clone() for p in blocks.parameters()]
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
            rows.append(row)
        out.append(rows)
    return out


def plan_verdict(row, want, where: str, n: int) -> str | None:
    """What is wrong with one observed call (``observe_plans``' row) when the text's rule picks ``want``
    (a number of segments, or None: no plan fits). ``n``: the stack's blocks."""
    from gpucourse.checks.values import type_words

    if not isinstance(row, dict) or ("returned" in row) == ("raised" in row):
        return f"{where}: no answer was recorded"
    raised = row.get("raised") if isinstance(row.get("raised"), list) else None
    if want is None:
        if raised is None or "ValueError" not in raised:
            got = (raised[0] if raised else "an exception") if "raised" in row else type_words(row["returned"])
            return f"{where}: no plan fits this budget: raise ValueError (got {got})"
    elif "raised" in row:
        return f"{where}: raised {raised[0] if raised else 'an exception'}, but a plan fits"
    else:
        value = row["returned"]
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{where}: return the number of segments, an int, not {type_words(value)}"
        if not 1 <= value <= n:
            return f"{where}: {value} segments is not a plan of {n} blocks"
        if value != want:
            return (f"{where}: {value} segments ({(value - 1) * (n // value)} blocks recomputed) is not the plan the "
                    "rule picks: among the plans whose saved bytes fit, fewest recomputed blocks, then fewest "
                    "bytes, then fewest segments")
    if not row.get("unchanged") or not row.get("no_grads"):
        return f"{where}: leave the blocks as they were (their parameters changed, or gradients were left on them)"
    return None


# The public stack: 6 GELU blocks of width 32, a batch of 16, float32. Its plans save, for k = 1..6
# segments: PUBLIC_PLAN_BYTES (measured once with gpucourse.memory.SavedTensors; stored, with the
# rule's answer for each budget, so that this module holds no way to compute them).
PUBLIC_STACK = {"widths": [32] * 7, "batch": 16, "seed": 3}
PUBLIC_PLAN_BYTES = [24576, 14336, 12288, 18432, 16384, 14336]
# (budget, the segments the rule picks, or None: no plan fits, ValueError). Recomputed blocks for k = 1..6:
# 0, 3, 4, 3, 4, 5. At 14336 bytes, k = 2, 3 and 6 fit and 2 recomputes fewest.
PLANS_PUBLIC = [(14336, 2), (24576, 1), (12287, None)]


def observe_public_plans(ns):
    from gpucourse.checks.lesson12_memory import PLANS_PUBLIC, PUBLIC_STACK, observe_plans

    return observe_plans(ns, [{"spec": PUBLIC_STACK, "budgets": [budget for budget, _ in PLANS_PUBLIC]}])


def judge_public_plans(observed):
    from gpucourse.checks.lesson12_memory import PLANS_PUBLIC, plan_verdict

    if not isinstance(observed, list) or len(observed) != 1 or not isinstance(observed[0], list) \
            or len(observed[0]) != len(PLANS_PUBLIC):
        return f"expected {len(PLANS_PUBLIC)} answers"
    for (budget, want), row in zip(PLANS_PUBLIC, observed[0]):
        found = plan_verdict(row, want, f"6 GELU blocks of width 32, batch 16, budget {budget} bytes", 6)
        if found:
            return found
    return None


register("choose_segments",
         Case("6 equal blocks: a tight budget, a budget everything fits, one nothing fits", observe_public_plans,
              judge_public_plans),
         answers=[Answer("choose_segments", "function",
                         "a function choose_segments(blocks, x, budget_bytes) returning the number of "
                         "segments (an int) of the plan to use, or raising ValueError")],
         points=3)

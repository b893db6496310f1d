"""Lesson 12's hidden checks for ``choose_segments``: the reference, what is drawn, the observers and the judges."""

from gpucourse.checks.lesson12_memory import build_plan_inputs, describe_stack, plan_verdict
from gpucourse.checks.seeded import global_rng
from gpucourse.checks.values import rebuild


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
    def modes_kept(row, where):
        if row.get("modes_kept") is not True:
            return (f"{where}: leave the blocks as they were: a module's training mode (train() or eval()) "
                    "is not what it was before the call")
        return None
    return _plans_judge(label, odd_plan_bytes, describe_odd, modes_kept)


def observe_stack_calls(ns, stacks):
    from gpucourse.checks.lesson12_memory import observe_plans

    return observe_plans(ns, stacks)


def judge_stack_calls(label):
    """A judge ``judge(observed, stacks)``: rebuild each stack here, measure its plans, apply the rule."""
    return _plans_judge(label, reference_plan_bytes, describe_stack)


def _plans_judge(label, plan_bytes_of, describe, also=None):
    """The judge of both kinds of stack: ``plan_bytes_of(spec)`` measures a stack's plans here, ``describe(spec)``
    names it, ``also(row, where)`` is a further check of each answer (None: none)."""
    def judge(observed, stacks):
        if not isinstance(observed, list) or len(observed) != len(stacks):
            return f"expected answers for {len(stacks)} stacks, got {len(observed) if isinstance(observed, list) else 'none'}"
        for i, (stack, rows) in enumerate(zip(stacks, observed)):
            budgets = [rebuild(b) for b in stack["budgets"]]
            if not isinstance(rows, list) or len(rows) != len(budgets):
                return f"{label} {i + 1}: expected {len(budgets)} answers"
            plan_bytes = plan_bytes_of(stack["spec"])
            for budget, row in zip(budgets, rows):
                where = f"{label} {i + 1} ({describe(stack['spec'])}), budget {budget} bytes"
                found = plan_verdict(row, reference_choice(plan_bytes, budget), where, len(plan_bytes))
                if found is None and also is not None:
                    found = also(row, where)
                if found:
                    return found
        return None
    return judge

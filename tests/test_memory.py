"""gpucourse.memory (lesson 12's helpers) and the models, stacks and budgets lesson 12's checks generate."""

from __future__ import annotations


import pytest
import torch
from torch import nn

from gpucourse import checks
from gpucourse import memory as M
from gpucourse.checks import lesson12_memory as L


def _hidden():
    """Lesson 12's hidden checks: one module per exercise (``autograders/checks/lesson12_memory/``), read as one."""
    import types

    from autograders.checks.lesson12_memory import choose_segments, training_bytes

    return types.SimpleNamespace(**{**vars(training_bytes), **vars(choose_segments)})


def test_storage_bytes_counts_each_storage_once():
    base = torch.zeros(100)                                   # 400 bytes
    assert M.storage_bytes([base, base[10:20], base.view(10, 10)]) == 400
    assert M.storage_bytes([base[:5]]) == 400                 # a view costs its whole storage
    assert M.storage_bytes([torch.zeros(3, dtype=torch.float64), torch.zeros(2, dtype=torch.bfloat16)]) == 28
    with torch.device("meta"):
        a, b = torch.empty(1000), torch.empty(10, dtype=torch.float16)
    assert M.storage_bytes([a, b, a[3:]]) == 4020             # meta storages: sizes without memory


@pytest.mark.parametrize("draw", ["draw_generated", "draw_tied", "draw_frozen"])
def test_one_measured_step_equals_the_reference_in_every_recipe(draw):
    """The grader's reference (the text's arithmetic) agrees with the storages of a real Adam step, for the
    models the hidden cases draw (those with something to train)."""
    import random

    hidden = _hidden()
    for seed in range(3):
        for c in hidden.__dict__[draw](random.Random(seed)):
            model = L.build_model(c["spec"], device="meta")
            if not any(p.requires_grad for p in model.parameters()):
                continue
            recipe = c["args"][0] if c["args"] else dict(c["kwargs"]["__dict__"])["recipe"]
            assert hidden.measure_recipe(c["spec"], recipe) == hidden.reference_training_bytes(model, recipe), (c, recipe)


def test_tied_and_frozen_specs_build_what_they_say():
    hidden = _hidden()
    tied = L.build_model({"widths": [6, 4, 6, 9], "tied": True})
    assert tied.layers[-1].weight is tied.embed.weight
    assert len(list(tied.parameters())) == len(list(tied.named_parameters(remove_duplicate=False))) - 1
    frozen = L.build_model({"widths": [5, 3, 2], "frozen": True})
    assert [p.requires_grad for p in frozen.parameters()] == [False, False, True, True]
    assert hidden.parameter_counts(L.build_model({"widths": [5, 3, 2], "frozen": True}, "meta")) == (5 * 3 + 3 + 3 * 2 + 2, 3 * 2 + 2, 2)
    assert hidden.parameter_counts(L.build_model({"widths": [5, 3, 2], "frozen": "all"}, "meta")) == (26, 0, 0)
    assert hidden.parameter_counts(L.build_model({"widths": [3]}, "meta")) == (0, 0, 0)
    assert hidden.parameter_counts(L.build_model({"widths": [3], "scalar": True}, "meta")) == (1, 1, 1)
    norm = L.build_model({"widths": [4, 5, 2], "batchnorm": True})
    assert hidden.parameter_counts(norm)[0] == 4 * 5 + 5 + 5 * 2 + 2 + 2 * 5 and len(list(norm.buffers())) == 3


def test_the_reference_pads_as_zero_pads_and_reads_the_arguments_as_the_text():
    hidden = _hidden()
    ref = hidden.reference_training_bytes
    model = L.build_model(L.PUBLIC_MODEL, "meta")
    for (recipe, stage, world), want in L.TRAINING_PUBLIC.items():  # the public table is the reference's
        assert ref(model, recipe, stage, world) == want
    big = L.build_model({"widths": [10, 10], "frozen": "first"}, "meta")  # frozen: nothing trainable
    assert ref(big, "bf16", 3, 7) == {"params": 2 * 16, "grads": 0, "optimizer": 0}
    one = L.build_model({"widths": [1, 1]}, "meta")  # 2 elements on 1000 ranks: one each, padded
    assert ref(one, "fp32", 3, 1000) == {"params": 4, "grads": 4, "optimizer": 8 + 8}
    # the text: ValueError for an unknown recipe or an int out of range; TypeError for a stage or world_size
    # that is not a plain int (a bool, a float even when whole, a str, None)
    for bad in [("fp16", 0, 1), ("FP32", 0, 1), ("fp32", 4, 1), ("fp32", -1, 1), ("fp32", 0, 0), (None, 0, 1)]:
        with pytest.raises(ValueError):
            ref(model, *bad)
    for bad in [("fp32", 1.5, 1), ("fp32", "1", 1), ("fp32", None, 1), ("fp32", True, 1), ("fp32", 2.0, 1),
                ("fp32", 0, 2.0), ("fp32", 0, True), ("fp32", 0, "2")]:
        with pytest.raises(TypeError):
            ref(model, *bad)


def test_training_bytes_judges_hold_the_type_rule_and_reject_floor_division():
    import random

    hidden = _hidden()
    judge = hidden.judge_training_bytes("x")
    for draw in (hidden.draw_zero, hidden.draw_bad_arguments, hidden.draw_generated):
        calls = draw(random.Random(5))
        right = checks.run_case(checks.Case("x", hidden.observe_training_bytes_calls, judge, draw=lambda rng: calls),
                                {"training_bytes": ref_answer(hidden)}, random.Random(0))
        assert right is None, right
    floor = [c for c in hidden.draw_zero(random.Random(5))]

    def floor_answer(model, recipe, stage=0, world_size=1):
        out = hidden.reference_training_bytes(model, recipe, stage, world_size)
        P, P_t, T_t = hidden.parameter_counts(model)
        return {**out, "optimizer": (12 if recipe == "bf16" else 8) * (P_t // world_size if stage else P_t) + 4 * T_t}

    found = checks.run_case(checks.Case("x", hidden.observe_training_bytes_calls, judge, draw=lambda rng: floor),
                            {"training_bytes": floor_answer}, random.Random(0))
    assert "'optimizer' is" in found and "not what the text's rule gives" in found
    assert "outcomes for" in judge([], floor)
    bad = hidden.draw_bad_arguments(random.Random(1))

    def accepts_bools(model, recipe, stage=0, world_size=1):  # True as stage 1: the text says TypeError
        if isinstance(stage, bool):
            stage = int(stage)
        return hidden.reference_training_bytes(model, recipe, stage, world_size)

    found = checks.run_case(checks.Case("x", hidden.observe_training_bytes_calls, judge, draw=lambda rng: bad),
                            {"training_bytes": accepts_bools}, random.Random(0))
    assert found is not None and "TypeError" in found, found


def ref_answer(hidden):
    return lambda model, recipe, stage=0, world_size=1: hidden.reference_training_bytes(model, recipe, stage, world_size)


def test_master_weight_adam_keeps_float32_masters_and_frees_their_gradients():
    torch.manual_seed(0)
    reference = nn.Linear(4, 3)
    model = nn.Linear(4, 3)
    model.load_state_dict(reference.state_dict())
    model.to(torch.bfloat16)
    optimizer = M.MasterWeightAdam(model.parameters(), lr=0.1)
    adam = torch.optim.Adam(reference.parameters(), lr=0.1)
    x = torch.randn(5, 4)
    model(x.to(torch.bfloat16)).float().square().mean().backward()
    reference(x).square().mean().backward()
    optimizer.step()
    adam.step()
    assert all(m.dtype == torch.float32 and m.grad is None for m in optimizer.master)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    for p, m, r in zip(model.parameters(), optimizer.master, reference.parameters()):
        assert torch.equal(p, m.to(torch.bfloat16))            # the model holds the masters, rounded
        assert torch.allclose(m, r, atol=0.02)                 # one Adam step of lr 0.1 moved both alike
    state = M.state_bytes(model, optimizer)
    assert state == {"params": 2 * 15, "grads": 2 * 15, "optimizer": 12 * 15 + 4 * 2}
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_saved_tensors_counts_storages_once_and_leaves_parameters_out():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(3, 8)
    with M.SavedTensors(exclude=net.parameters()) as saved:
        out = net(x)
    # x (first Linear's input), ReLU's output, saved again as the second Linear's input: 2 storages
    assert saved.bytes == 3 * 8 * 4 + 3 * 16 * 4
    assert saved.saves > len(saved.storages) == 2
    assert saved.by_dtype == {"float32": saved.bytes}
    out.sum().backward()                                       # the hooks handed back the tensors unchanged
    plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    plain.load_state_dict(net.state_dict())
    plain(x).sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(net.parameters(), plain.parameters()))
    with M.SavedTensors() as everything:
        net(x)
    assert everything.bytes > saved.bytes                      # without exclude, the weights count too


def test_checkpointed_plans_save_less_and_one_segment_is_the_plain_forward():
    hidden = _hidden()
    spec = {"widths": [16] * 7, "batch": 4, "norm": True, "seed": 2}
    blocks, x = L.build_plan_inputs(spec)
    plan_bytes = hidden.reference_plan_bytes(spec)
    with M.SavedTensors(exclude=blocks.parameters()) as plain:
        blocks(x)
    assert plan_bytes[0] == plain.bytes
    assert min(plan_bytes[1:]) < plan_bytes[0]
    # a ReLU stack saves each block's output anyway: one block per segment saves what the plain forward does
    relu_bytes = hidden.reference_plan_bytes({"widths": [8] * 5, "batch": 2, "act": "relu"})
    assert relu_bytes[-1] == relu_bytes[0]
    # the public table is what the reference measures
    assert hidden.reference_plan_bytes(L.PUBLIC_STACK) == L.PUBLIC_PLAN_BYTES
    assert [hidden.reference_choice(L.PUBLIC_PLAN_BYTES, b) for b, _ in L.PLANS_PUBLIC] == [k for _, k in L.PLANS_PUBLIC]


def test_budgets_and_the_rule():
    hidden = _hidden()
    choice = hidden.reference_choice
    assert choice([100, 60, 50, 70], 55) == 3
    assert choice([100, 60, 50, 70], 60) == 3             # 2 and 3 recompute 2 blocks each: fewer bytes
    assert choice([100, 60, 60, 70], 60) == 2             # equal cost, equal bytes: fewer segments
    assert choice([100, 60, 60, 40, 50, 30], 60) == 4     # 6 blocks: 2 and 4 segments recompute 3, 4 saves less
    assert choice([100, 60, 50, 70], 49) is None
    assert choice([100, 60, 50, 70], 100) == 1
    assert choice([100, 60, 50, 70], 2 ** 60) == 1 and choice([100, 60, 50, 70], 60.5) == 3
    import random

    for seed in range(3):  # the deep draw holds budgets where the fewest segments lose, and ties bytes decide
        stacks = hidden.draw_deep(random.Random(seed))
        decided = []
        for stack in stacks:
            plan_bytes = hidden.reference_plan_bytes(stack["spec"])
            decided += [(hidden.reference_choice(plan_bytes, b), hidden.fewest_fitting(plan_bytes, b),
                         hidden._by_cost_then_segments(plan_bytes, b)) for b in stack["budgets"]]
        assert any(rule != fewest for rule, fewest, _ in decided)
        assert any(rule != by_segments for rule, _, by_segments in decided)


def test_plan_judges_rebuild_and_reject():
    hidden = _hidden()
    stacks = [{"spec": L.PUBLIC_STACK, "budgets": [b for b, _ in L.PLANS_PUBLIC]}]
    right = [[({"raised": ["ValueError", "Exception"]} if k is None else {"returned": k}) | {"unchanged": True, "no_grads": True}
              for _, k in L.PLANS_PUBLIC]]
    assert L.judge_public_plans(right) is None
    assert hidden.judge_stack_calls("stack")(right, stacks) is None
    returned_none = {"returned": None, "unchanged": True, "no_grads": True}
    assert "raise ValueError" in L.judge_public_plans([right[0][:2] + [returned_none]])
    moved = [[dict(r) for r in right[0]]]
    moved[0][0]["no_grads"] = False
    assert "leave the blocks" in L.judge_public_plans(moved)
    assert "expected 3 answers" in L.judge_public_plans([])
    as_float = [[dict(right[0][0], returned=2.0)] + right[0][1:]]
    assert "an int, not a float" in hidden.judge_stack_calls("stack")(as_float, stacks)


def test_figures_have_titles_and_labelled_axes_with_units():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    state = {"fp32": {"params": 4 * 2**20, "grads": 4 * 2**20, "optimizer": 8 * 2**20}}
    fig = M.draw_state(state, state, hardware="a test CPU")
    ax = fig.axes[0]
    assert "a test CPU" in ax.get_title() and "(MiB)" in ax.get_ylabel() and ax.get_xlabel()
    assert [round(b.get_height(), 3) for b in ax.patches[:3]] == [4.0, 4.0, 8.0]
    plt.close(fig)

    fig = M.draw_per_rank(lambda stage, n: 2**30 * 16 / (n if stage == 3 else 1), [1, 2, 4], title="per rank")
    ax = fig.axes[0]
    assert "per rank" in ax.get_title() and "not measured" in ax.get_title()
    assert "(GiB)" in ax.get_ylabel() and "ranks" in ax.get_xlabel() and len(ax.lines) == 4
    assert list(ax.lines[3].get_ydata()) == [16.0, 8.0, 4.0]
    plt.close(fig)

    fig = M.draw_checkpointing([1, 2], [2**20, 2**19], [10.0, 12.0], hardware="a test CPU")
    left, right = fig.axes
    assert "(MiB)" in left.get_ylabel() and "(ms)" in right.get_ylabel() and "segments" in left.get_xlabel()
    assert "a test CPU" in fig._suptitle.get_text()
    plt.close(fig)
    with pytest.raises(ValueError):
        M.draw_checkpointing([], [], [], hardware="x")
    with pytest.raises(ValueError):
        M.draw_per_rank(lambda s, n: 0, [], title="t")


def test_judges_fail_on_missing_or_malformed_observations():
    hidden = _hidden()
    assert "not called on every recipe" in L.judge_public_recipes([])
    assert "no outcome was reported" in L.judge_public_recipes([None, None, None])
    assert "expected 4 answers" in L.judge_public_zero(None)
    assert "no outcome was reported" in L.judge_public_zero([None] * 4)
    assert "no answer was recorded" in L.judge_public_plans([[None, None, None]])
    calls = hidden.draw_bad_arguments(__import__("random").Random(0))
    assert "no outcome was reported" in hidden.judge_training_bytes("x")([None] * len(calls), calls)


def test_the_public_module_holds_no_reference():
    """The answers' arithmetic and the plan rule live on the grader's side only."""
    for name in ("reference_bytes", "expected_plan", "saved_bytes_per_plan", "budget_for", "counts", "measure_recipe",
                 "expected_bytes", "model_specs", "stack_specs", "sharding_cases"):
        assert not hasattr(L, name), name

"""gpucourse.memory (lesson 12's helpers) and the models, stacks and budgets lesson 12's checks generate."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from conftest import ROOT
from gpucourse import memory as M
from gpucourse.checks import lesson12 as L


def _hidden():
    spec = importlib.util.spec_from_file_location("hidden_lesson12", ROOT / "autograders" / "checks" / "lesson12_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_storage_bytes_counts_each_storage_once():
    base = torch.zeros(100)                                   # 400 bytes
    assert M.storage_bytes([base, base[10:20], base.view(10, 10)]) == 400
    assert M.storage_bytes([base[:5]]) == 400                 # a view costs its whole storage
    assert M.storage_bytes([torch.zeros(3, dtype=torch.float64), torch.zeros(2, dtype=torch.bfloat16)]) == 28
    with torch.device("meta"):
        a, b = torch.empty(1000), torch.empty(10, dtype=torch.float16)
    assert M.storage_bytes([a, b, a[3:]]) == 4020             # meta storages: sizes without memory


@pytest.mark.parametrize("kinds", [{}, {"tied": True}, {"frozen": True}, {"tied": True, "frozen": True}])
def test_one_measured_step_equals_the_memory_model_in_every_recipe(kinds):
    """The hidden checks' arithmetic agrees with the storages of a real Adam step, for every generated model."""
    hidden = _hidden()
    for spec in L.model_specs(99, 4, **kinds):
        P, P_t, T_t = L.counts(spec)
        for recipe in L.RECIPES:
            assert L.measure_recipe(spec, recipe) == hidden.expected_bytes(P, P_t, T_t, recipe), (spec, recipe)


def test_tied_and_frozen_specs_build_what_they_say():
    tied = L.build_model({"widths": [6, 4, 6, 9], "tied": True})
    assert tied.layers[-1].weight is tied.embed.weight
    assert len(list(tied.parameters())) == len(list(tied.named_parameters(remove_duplicate=False))) - 1
    frozen = L.build_model({"widths": [5, 3, 2], "frozen": True})
    assert [p.requires_grad for p in frozen.parameters()] == [False, False, True, True]
    assert L.counts({"widths": [5, 3, 2], "frozen": True}) == (5 * 3 + 3 + 3 * 2 + 2, 3 * 2 + 2, 2)


def test_sharding_judge_accepts_the_arithmetic_and_rejects_floor_division():
    hidden = _hidden()
    cases = L.sharding_cases(1205, 24)
    assert {c["stage"] for c in cases} == {0, 1, 2, 3} and any(c["world_size"] == 1 for c in cases)

    def answers(shard):
        out = []
        for c in cases:
            P, P_t, T_t = L.counts(c["spec"])
            w = 2 if c["recipe"] == "bf16" else 4
            s = 12 if c["recipe"] == "bf16" else 8
            out.append(L.describe_bytes({"params": w * shard(P, c["stage"] >= 3, c["world_size"]),
                                         "grads": w * shard(P_t, c["stage"] >= 2, c["world_size"]),
                                         "optimizer": s * shard(P_t, c["stage"] >= 1, c["world_size"]) + 4 * T_t}))
        return out

    assert hidden.judge_zero(answers(lambda n, on, N: -(-n // N) if on else n)) is None
    assert "expected" in hidden.judge_zero(answers(lambda n, on, N: n // N if on else n))
    assert "expected 24 answers" in hidden.judge_zero([])


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
    blocks, x = L.build_plan_inputs({"widths": [16] * 7, "batch": 4, "norm": True, "seed": 2})
    plan_bytes = L.saved_bytes_per_plan(blocks, x)
    with M.SavedTensors(exclude=blocks.parameters()) as plain:
        blocks(x)
    assert plan_bytes[0] == plain.bytes
    assert min(plan_bytes[1:]) < plan_bytes[0]
    # a ReLU stack saves each block's output anyway: one block per segment saves what the plain forward does
    relu, xr = L.build_plan_inputs({"widths": [8] * 5, "batch": 2, "act": "relu"})
    relu_bytes = L.saved_bytes_per_plan(relu, xr)
    assert relu_bytes[-1] == relu_bytes[0]


def test_budgets_and_the_rule():
    assert L.expected_plan([100, 60, 50, 70], 55) == 3
    assert L.expected_plan([100, 60, 50, 70], 60) == 3             # 2 and 3 recompute 2 blocks each: fewer bytes
    assert L.expected_plan([100, 60, 60, 70], 60) == 2             # equal cost, equal bytes: fewer segments
    assert L.expected_plan([100, 60, 60, 40, 50, 30], 60) == 4     # 6 blocks: 2 and 4 segments recompute 3, 4 saves less
    assert L.expected_plan([100, 60, 50, 70], 49) is None
    assert L.expected_plan([100, 60, 50, 70], 100) == 1
    spec = {"pick": 1, "slack": 0}
    assert L.budget_for(spec, [100, 60, 50, 60]) == 60
    assert L.budget_for({"pick": "none", "slack": 7}, [100, 60]) == 52
    # the deep ("bulge") stacks: in most of them, the fewest segments that fit is not the rule's plan
    splits = 0
    for spec in L.stack_specs(1213, 6, bulge=True):
        blocks, x = L.build_plan_inputs(spec)
        plan_bytes = L.saved_bytes_per_plan(blocks, x)
        budget = L.budget_for(spec, plan_bytes)
        fewest = min(k for k in range(1, len(blocks) + 1) if plan_bytes[k - 1] <= budget)
        splits += fewest != L.expected_plan(plan_bytes, budget)
    assert splits >= 3


def test_judge_plans_rebuilds_and_rejects():
    specs = L.PUBLIC_STACKS
    right = []
    for spec in specs:
        blocks, x = L.build_plan_inputs(spec)
        want = L.expected_plan(L.saved_bytes_per_plan(blocks, x), L.budget_for(spec, L.saved_bytes_per_plan(blocks, x)))
        right.append({"error": "ValueError"} if want is None else {"type": "int", "value": want})
        right[-1].update(unchanged=True, no_grads=True)
    assert L.judge_plans(right, specs) is None
    returned_none = {"type": "NoneType", "value": None, "unchanged": True, "no_grads": True}
    assert "raise ValueError" in L.judge_plans(right[:2] + [returned_none], specs)
    moved = [dict(r) for r in right]
    moved[0]["no_grads"] = False
    assert "leave the blocks" in L.judge_plans(moved, specs)
    assert "expected 3 answers" in L.judge_plans([], specs)


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
    specs = [L.PUBLIC_MODEL]
    assert "expected 3 predictions" in L.judge_against_measurement([], specs, L.reference_bytes)
    assert "no answer was recorded" in L.judge_against_measurement([None, None, None], specs, L.reference_bytes)
    assert "no answer was recorded" in L.judge_plans([None, None, None], L.PUBLIC_STACKS)
    assert "expected 4 answers" in L.judge_public_zero(None)
    assert "no answer was recorded" in L.judge_public_zero([None] * 4)
    assert "raise ValueError" in hidden.judge_bad_arguments([None] * 6)
    assert "no answer was recorded" in hidden.judge_zero([None] * 24)

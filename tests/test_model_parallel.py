"""Lesson 18's helpers (gpucourse.model_parallel) and the references of its hidden checks: the block and its
tensor-parallel plans, the saved-bytes counter, the bubble and in-flight readings of pipeline spans, the charts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from gpucourse import model_parallel as H  # noqa: E402
from gpucourse.checks import lesson18_model_parallel as L  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def hidden():
    spec = importlib.util.spec_from_file_location("hidden_lesson18", ROOT / "autograders" / "checks" / "lesson18_model_parallel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_block_keeps_its_shape_and_is_causal():
    block = H.make_block(16, 4, seed=0)
    x = torch.randn(2, 5, 16)
    out = block(x)
    assert out.shape == x.shape
    changed = x.clone()
    changed[:, -1] += 1.0  # the last position cannot change what the earlier ones see
    assert torch.allclose(block(changed)[:, :-1], out[:, :-1], atol=1e-6)
    assert not torch.allclose(block(changed)[:, -1], out[:, -1])


def test_saved_bytes_count_activations_once_and_leave_the_parameters_out():
    layer = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(5, 8, requires_grad=True)
    found = H.saved_activation_bytes(lambda: layer(x), layer.parameters())
    assert found["bytes"] == 5 * 8 * 4  # the input (float32); the weight is a parameter
    twice = H.saved_activation_bytes(lambda: layer(x) + layer(x), layer.parameters())
    assert twice["bytes"] == 5 * 8 * 4  # the same input saved twice is one storage


def test_the_unsplit_block_saves_what_the_paper_counts_in_float32_without_dropout():
    """16 elements per s*b*h (the paper's 34 bytes less the 2 dropout masks, at 2 bytes each), plus the norms'
    statistics and attention's log-sum-exp (s*b values each)."""
    s, b, h, heads = 8, 2, 32, 4
    block = H.make_block(h, heads)
    x = torch.randn(b, s, h, requires_grad=True)
    found = H.saved_activation_bytes(lambda: block(x), block.parameters())["bytes"]
    small = 4 * (4 * s * b + heads * s * b)  # two LayerNorms' mean and rstd, the log-sum-exp per head
    assert found == 4 * 16 * s * b * h + small


def test_the_tensor_parallel_plans_name_the_block_s_modules():
    block = H.Block(16, 4)
    names = {name for name, _ in block.named_modules()}
    for sequence_parallel in (False, True):
        plan = H.tp_plan(sequence_parallel)
        assert set(plan) <= names
    assert "attention_norm" in H.tp_plan(True) and "attention_norm" not in H.tp_plan(False)


def test_korthikanti_formula():
    assert H.korthikanti_bytes(1, 1, 1, 1, False) == 34
    assert H.korthikanti_bytes(1, 1, 1, 1, True) == 34
    assert H.korthikanti_bytes(2, 3, 4, 8, False) == 24 * (10 + 3)
    assert H.korthikanti_bytes(2, 3, 4, 8, True) == pytest.approx(24 * 34 / 8)


def spans_report(rank, spans, schedule="gpipe", m=2, v=1):
    return {"rank": rank, "stages": 2, "virtual": v, "microbatches": m, "schedule": schedule, "backend": "gloo",
            "spans": spans}


def test_bubble_and_in_flight_from_spans():
    # an ideal GPipe, p = 2, m = 2, forward 1 s, backward 2 s: each rank busy 6 s, idle 3 s = (p-1)(tf+tb)
    rank0 = [("forward", 0, 0, 0, 1), ("forward", 1, 0, 1, 2), ("backward", 1, 0, 5, 7), ("backward", 0, 0, 7, 9)]
    rank1 = [("forward", 0, 0, 1, 2), ("forward", 1, 0, 2, 3), ("backward", 1, 0, 3, 5), ("backward", 0, 0, 5, 7)]
    reports = [spans_report(0, rank0), spans_report(1, rank1)]
    measured = H.bubble_measured(reports)
    assert measured["window"] == 9
    assert [r["busy"] for r in measured["ranks"]] == [6, 6]
    assert measured["over_ideal"] == pytest.approx(0.5)  # (p - 1) / m
    assert measured["over_total"] == pytest.approx(1 / 3)  # (p - 1) / (m + p - 1)
    assert [H.in_flight_peak(r) for r in reports] == [2, 2]
    one_f_one_b = [("forward", 0, 0, 0, 1), ("backward", 0, 0, 2, 3), ("forward", 1, 0, 3, 4), ("backward", 1, 0, 5, 6)]
    assert H.in_flight_peak(spans_report(1, one_f_one_b)) == 1


def test_quickest_step_picks_the_shortest_window_over_all_ranks():
    slow = [("forward", 0, 0, 0, 5)]
    fast = [("forward", 0, 0, 0, 1)]
    reports = [{**spans_report(0, []), "steps": [slow, fast]}, {**spans_report(1, []), "steps": [fast, slow]}]
    reports.append({**spans_report(2, []), "steps": [fast, fast]})
    chosen = H.quickest_step(reports)
    assert all("steps" not in r for r in chosen)
    assert [r["spans"] for r in chosen] == [slow, fast, fast] or [r["spans"] for r in chosen] == [fast, slow, fast]


def test_charts_are_labelled():
    r = {"seq": 4, "batch": 1, "dim": 8, "backend": "gloo", "single": {"bytes": 64 * 32},
         "layouts": {"tensor parallel": {"saved": {"bytes": 40 * 32}},
                     "tensor + sequence parallel": {"saved": {"bytes": 36 * 32}}}}
    fig = H.plot_saved([r, {**r, "rank": 1}], "Test CPU 9000")
    ax = fig.axes[0]
    assert "Test CPU 9000" in ax.get_title() and ax.get_xlabel() and "(s·b·h)" in ax.get_ylabel()
    rank0 = [("forward", 0, 0, 0.0, 0.001), ("backward", 0, 0, 0.002, 0.004)]
    timeline = H.plot_schedules({"gpipe": [spans_report(0, rank0), spans_report(1, rank0)]}, "Test CPU 9000")
    assert "Test CPU 9000" in timeline._suptitle.get_text() and "(ms" in timeline.axes[-1].get_xlabel()
    rows = [{"schedule": "gpipe", "stages": 2, "microbatches": m, "virtual": 1, "measured": 1 / m, "formula": 1 / m,
             "backend": "gloo"} for m in (2, 4)]
    bubbles = H.plot_bubbles(rows, "Test CPU 9000")
    assert "Test CPU 9000" in bubbles.axes[0].get_title()
    for figure in (fig, timeline, bubbles):
        matplotlib.pyplot.close(figure)


@pytest.mark.slow  # a two-rank launch of every plan and schedule (about 25 s): `make test`, not `make test-fast`
def test_two_ranks_run_the_block_plans_and_the_three_schedules():
    """One real launch each (gloo, 2 CPU processes): outputs and gradients match the unsplit block, SP saves
    less than TP, and each schedule's spans read as the text says (GPipe holds m, 1F1B p - s)."""
    reports = H.run("tensor", nproc=2, batch=1, seq=8, dim=16, heads=2)
    for r in reports:
        for layout in r["layouts"].values():
            assert layout["output_error"] < 1e-5 and layout["grad_error"] < 1e-4
        assert r["layouts"]["tensor parallel"]["forward_comms"] == {"all_reduce": 2}
        assert set(r["layouts"]["tensor + sequence parallel"]["forward_comms"]) == {"all_gather_into_tensor",
                                                                                    "reduce_scatter_tensor"}
        tp, sp = (r["layouts"][k]["saved"]["bytes"] for k in ("tensor parallel", "tensor + sequence parallel"))
        assert sp < tp < r["single"]["bytes"]
    runs = H.run("pipeline", nproc=2, microbatches="4", rows=4, width=16, layers=2)
    held = {}
    for k in range(len(runs[0]["runs"])):
        step = H.quickest_step([r["runs"][k] for r in runs])
        held[step[0]["schedule"]] = [H.in_flight_peak(q) for q in step]
        assert all(len(q["spans"]) == 2 * 4 * q["virtual"] for q in step)  # every micro-batch forward and backward
    assert held["gpipe"] == [4, 4] and held["1f1b"] == [2, 1]


def test_references_follow_the_text():
    module = hidden()
    bubble, in_flight = module.reference_pipeline_bubble, module.reference_peak_in_flight
    for args, want in L.BUBBLE_PUBLIC:
        if isinstance(want, str):
            with pytest.raises({"ValueError": ValueError, "TypeError": TypeError}[want]):
                bubble(*args)
        else:
            assert bubble(*args) == want and type(bubble(*args)) is float
    for args, want in L.IN_FLIGHT_PUBLIC:
        if isinstance(want, str):
            with pytest.raises({"ValueError": ValueError, "TypeError": TypeError}[want]):
                in_flight(*args)
        else:
            assert in_flight(*args) == want
    assert bubble("gpipe", 2**80, 2**80) == pytest.approx(1.0)
    assert bubble("interleaved_1f1b", 3, 6, virtual_stages=2) == pytest.approx(2 / 12)

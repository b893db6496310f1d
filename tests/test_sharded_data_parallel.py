"""Lesson 13's helpers (gpucourse.sharded_data_parallel) and the judges of its exercise (gpucourse.checks.lesson13_sharded_data_parallel):
collectives, ZeRO-1 by hand, ZeroRedundancyOptimizer and FSDP2 against DDP, tensor and pipeline parallelism,
each on 2 or 3 gloo processes; the judges on records made here."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from gpucourse import checks

from gpucourse import sharded_data_parallel as H
from gpucourse.checks import lesson13_sharded_data_parallel as L


@pytest.fixture(scope="module")
def memory():
    return {r["rank"]: r for r in H.run("memory", nproc=2, width=32, steps=2)}


@pytest.mark.slow  # torchrun launches of two or more ranks (10-30 s each): `make test`, not `make test-fast`
def test_reduce_scatter_then_all_gather_is_all_reduce_with_padding():
    reports = H.run("collectives", nproc=3, numel=10)
    assert [r["rank"] for r in reports] == [0, 1, 2]
    total = [float(i) * (1 + 2 + 3) for i in range(10)]
    for r in reports:
        assert r["shard"] == 4 and r["all_reduce"] == total and r["after_all_gather"] == total and r["equal"]
    assert reports[2]["my_chunk"] == total[8:] + [0.0, 0.0]  # the padding, summed: still zero
    assert reports[1]["my_chunk"] == total[4:8]


@pytest.mark.slow  # torchrun launches of two or more ranks (10-30 s each): `make test`, not `make test-fast`
def test_zero_by_hand_and_zero_redundancy_equal_ddp_and_split_the_state(memory):
    ways = {rank: r["ways"] for rank, r in memory.items()}
    parameters = memory[0]["parameters"]
    assert parameters == sum(p.numel() for p in H.lesson_model(32).parameters())
    for rank in (0, 1):
        ddp = ways[rank]["DDP + Adam"]
        assert ddp["param_bytes"] == ddp["grad_bytes"] == 4 * parameters
        assert 8 * parameters <= ddp["optimizer_bytes"] <= 8 * parameters + 4 * 8  # + one step counter per tensor
        for way in ("ZeRO-1 by hand", "ZeroRedundancyOptimizer"):
            assert ways[rank][way]["bitwise_equal_to_ddp"], way  # 2 ranks: (a/2 + b/2) == (a + b)/2 exactly
            assert ways[rank][way]["param_bytes"] == ddp["param_bytes"]
            assert 0 < ways[rank][way]["optimizer_bytes"] < ddp["optimizer_bytes"]
    for way in ("ZeRO-1 by hand", "ZeroRedundancyOptimizer"):  # the two ranks' states add up to one full state
        split = sum(ways[rank][way]["optimizer_bytes"] for rank in (0, 1))
        assert abs(split - ways[0]["DDP + Adam"]["optimizer_bytes"]) <= 4 * 8
    assert sum(memory[0]["ways"]["ZeRO-1 by hand"]["owned_elements"]) == parameters


@pytest.mark.slow  # torchrun launches of two or more ranks (10-30 s each): `make test`, not `make test-fast`
def test_fsdp2_runs_on_gloo_and_shards_everything(memory):
    fsdp = memory[0]["ways"]["FSDP2 fully_shard"]
    assert "error" not in fsdp, fsdp.get("error")
    parameters = memory[0]["parameters"]
    assert fsdp["max_gap_to_ddp"] < 1e-6
    for rank in (0, 1):
        way = memory[rank]["ways"]["FSDP2 fully_shard"]
        assert 4 * parameters / 2 <= way["param_bytes"] < 4 * parameters * 0.6  # half, plus a little padding
        assert way["grad_bytes"] < 4 * parameters * 0.6 and way["optimizer_bytes"] < 8 * parameters * 0.6


@pytest.mark.slow  # torchrun launches of two or more ranks (10-30 s each): `make test`, not `make test-fast`
def test_tensor_parallel_mlp_by_hand_matches_unsplit_on_uneven_splits():
    for nproc in (2, 3):
        reports = H.run("tensor", nproc=nproc, hidden=64)
        assert sum(r["my_hidden_units"] for r in reports) == 64
        assert all(r["by_hand_gap"] < 1e-5 for r in reports)
        assert sum(r["my_weight_elements"] for r in reports) == reports[0]["full_weight_elements"] - 16  # b2 kept whole
        if nproc == 2:
            assert all(r["dtensor_gap"] < 1e-5 for r in reports)
            assert reports[0]["dtensor_local_shapes"][0] == [32, 16]


@pytest.mark.slow  # torchrun launches of two or more ranks (10-30 s each): `make test`, not `make test-fast`
def test_pipeline_records_every_span_in_gpipe_order():
    reports = H.run("pipeline", nproc=2, microbatches=3, rows=16, width=64)
    for r in reports:
        kinds = [(kind, i) for kind, i, _, _ in r["spans"]]
        assert kinds == [("forward", i) for i in range(3)] + [("backward", i) for i in (2, 1, 0)]
        assert all(end >= start for *_, start, end in r["spans"])
    first_forward = {r["stage"]: r["spans"][0] for r in reports}
    assert first_forward[1][2] >= first_forward[0][3]  # stage 1 starts after stage 0 finished micro-batch 0
    assert 0 < H.measured_idle_fraction(reports) < 1


def test_idle_fraction_of_an_ideal_gpipe_timeline_is_the_formula():
    for p, m in ((2, 4), (3, 5), (4, 8)):
        reports = []
        for s in range(p):  # forward of micro-batch i on stage s at step s + i; backward mirrored after all forwards
            spans = [("forward", i, float(s + i), float(s + i + 1)) for i in range(m)]
            start = m + p - 1
            spans += [("backward", i, start + (p - 1 - s) + (m - 1 - i), start + (p - 1 - s) + (m - i)) for i in reversed(range(m))]
            reports.append({"stage": s, "microbatches": m, "spans": spans})
        assert math.isclose(H.measured_idle_fraction(reports), H.bubble_fraction(p, m))
    assert H.bubble_fraction(4, 8) == 3 / 11


def test_held_bytes_counts_each_storage_once():
    a = torch.zeros(10)
    assert H.held_bytes([a, a[:5], None, torch.zeros(3, dtype=torch.float64)]) == 40 + 24
    adam = torch.optim.Adam([torch.nn.Parameter(torch.ones(6))])
    adam.param_groups[0]["params"][0].grad = torch.ones(6)
    adam.step()
    assert H.optimizer_state_bytes(adam) == 2 * 6 * 4 + 4  # exp_avg, exp_avg_sq and the float32 step


@pytest.mark.slow  # torchrun launches of two or more ranks (10-30 s each): `make test`, not `make test-fast`
def test_figures_have_titles_units_and_hardware(memory):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    spans = [{"stage": s, "microbatches": 1, "spans": [["forward", 0, s, s + 1.0], ["backward", 0, 3 - s, 4 - s]],
              "backend": "gloo"} for s in range(2)]
    for fig in (H.plot_memory(memory, "test CPU"), H.plot_pipeline(spans, "test CPU")):
        assert isinstance(fig, Figure)
        ax = fig.axes[0]
        assert "test CPU" in ax.get_title() and "measured" in ax.get_title()
        assert "gloo" in ax.get_title()  # the backend the reports say ran them
        assert "(" in ax.get_xlabel() or "(" in ax.get_ylabel()  # units named
        assert ax.get_xlabel() and ax.get_ylabel()
        plt.close(fig)


# --- the exercise's judges, on records made here ---------------------------------------------------

def _record(inputs, world, weights_of_rank, state_bytes=0):
    return {"returncode": 0, "tail": "", "ranks": {str(r): {"rank": r, "world_size": world, "runs": [
        {"widths": run["widths"], "weights": weights_of_rank(r, i), "state_bytes": state_bytes, "itemsize": 8}
        for i, run in enumerate(inputs["runs"])]} for r in range(world)}}


def _hidden():
    from autograders import engine

    return engine.load_checks("lesson13_sharded_data_parallel")


def test_judges_recompute_ddp_adam_and_catch_each_mistake():
    import random

    hidden = _hidden()
    drawn = hidden.draw_three_ranks(random.Random(5))
    inputs = drawn["launch"]
    truth = [hidden.reference_weights(inputs, run, 3) for run in inputs["runs"]]
    good = _record(inputs, 3, lambda r, i: truth[i])
    assert hidden.judge_drawn_launch(good, drawn) is None
    diverged = _record(inputs, 3, lambda r, i: [[w + r * 1e-3 for w in step] for step in truth[i]])
    assert "different weights" in hidden.judge_drawn_launch(diverged, drawn)
    off = _record(inputs, 3, lambda r, i: [[w + 1e-6 for w in step] for step in truth[i]])
    assert "differ from DDP + Adam's" in hidden.judge_drawn_launch(off, drawn)
    nan = _record(inputs, 3, lambda r, i: [[math.nan for w in step] for step in truth[i]])
    assert hidden.judge_drawn_launch(nan, drawn) is not None
    full = _record(inputs, 3, lambda r, i: truth[i], state_bytes=2 * 8 * L.parameter_count(inputs["runs"][0]["widths"]) + 10 ** 6)
    assert "optimizer state" in hidden.judge_drawn_launch(full, drawn)
    assert "did not finish" in hidden.judge_drawn_launch({**good, "returncode": 1}, drawn)
    assert "expected reports" in hidden.judge_drawn_launch(good, {**drawn, "world_size": 2})  # 3 reports for 2 ranks
    # the public launch: stored sums, no way to compute them in the public module
    public = L.SHARDED_INPUTS
    weights = hidden.reference_weights(None, public["runs"][0], 2)
    record = _record(public, 2, lambda r, i: weights)
    assert L.judge_weights(record) is None and L.judge_state(record) is None
    nudged = _record(public, 2, lambda r, i: [step[:-1] + [step[-1] + 1e-7] for step in weights])
    assert "layer 2's bias differ from DDP + Adam's" in L.judge_weights(nudged)
    assert "public 2-process launch already failed" in hidden.judge_drawn_launch({**nudged, "public_only": True}, drawn)
    assert "did not run" in hidden.judge_drawn_launch({**record, "public_only": True}, drawn)


def test_reference_weights_are_the_mean_gradient_adam_step():
    hidden = _hidden()
    inputs = {**L.SHARDED_INPUTS, "steps": 1}
    run = inputs["runs"][0]
    model = L.build_model(run["widths"], inputs["seed"])
    grads = []
    for rank in range(2):
        model.zero_grad()
        x, y = L.rank_rows(run["widths"], inputs["seed"], 0, rank, inputs["rows"])
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    b1, b2 = inputs["betas"]
    expected = []
    for p, g0, g1 in zip(model.parameters(), *grads):
        g = (g0 + g1) / 2
        m, v = (1 - b1) * g / (1 - b1), (1 - b2) * g * g / (1 - b2)
        expected += (p.detach() - inputs["lr"] * m / (v.sqrt() + inputs["eps"])).reshape(-1).tolist()
    got = hidden.reference_weights(inputs, run, 2)[0]
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-12
    # the stored public sums are the reference's, to rounding: a sum's last bit depends on the CPU's vector width
    # (this test saw 1 ulp between two x86 machines), far inside the public check's SUM_TOLERANCE
    full = hidden.reference_weights(None, run, 2)
    sums = [L.tensor_sums(step, run["widths"]) for step in full]
    flat = lambda nested: [x for step in nested for tensor in step for x in tensor]  # noqa: E731
    assert [[len(t) for t in step] for step in sums] == [[len(t) for t in step] for step in L.SHARDED_PUBLIC_SUMS]
    assert max(abs(a - b) for a, b in zip(flat(sums), flat(L.SHARDED_PUBLIC_SUMS))) < 1e-13 < L.SUM_TOLERANCE


def test_drawn_launches_cover_every_remainder_fewer_parameters_and_every_way_to_build():
    import random

    hidden = _hidden()
    for seed in range(5):
        two, three = hidden.draw_two_ranks(random.Random(seed)), hidden.draw_three_ranks(random.Random(seed))
        assert two["world_size"] == 2 and three["world_size"] == 3
        assert {L.parameter_count(r["widths"]) % 2 for r in two["launch"]["runs"]} == {0, 1}
        counts = [L.parameter_count(r["widths"]) for r in three["launch"]["runs"]]
        assert {c % 3 for c in counts} == {0, 1, 2} and min(counts) < 3
        for drawn in (two, three):
            hows = {r["call"] for r in drawn["launch"]["runs"]}
            assert {"keywords", "positional"} <= hows and hows & {"defaults", "lr_only"}
        assert json.dumps(three) == json.dumps(hidden.draw_three_ranks(random.Random(seed)))
    assert L.parameter_count(L.SHARDED_INPUTS["runs"][0]["widths"]) == 1082
    assert not hasattr(L, "expected_weights") and not hasattr(L, "generated_inputs")


def test_kept_tensor_bytes_sees_attributes_closures_and_globals_but_not_parameters():
    params = [torch.nn.Parameter(torch.zeros(10, dtype=torch.float64))]
    params[0].grad = torch.zeros(10, dtype=torch.float64)

    class Holder:
        def __init__(self):
            self.params = params
            self.state = {"m": torch.zeros(4, dtype=torch.float64), "view": params[0][:3]}

    holder = Holder()
    assert L.kept_tensor_bytes(holder, params + [params[0].grad]) == 32
    hidden = torch.zeros(100, dtype=torch.float64)
    holder.fn = lambda: hidden  # a closure holding state
    assert L.kept_tensor_bytes(holder, params + [params[0].grad]) == 32 + 800
    assert L.kept_tensor_bytes(object(), [], {"cache": [torch.zeros(5)], "__name__": "student"}) == 20


def test_reference_answer_passes_the_public_launch():
    import nbformat

    from conftest import SOLUTIONS
    from gpucourse.checks import exercises
    from gpucourse.checks import ddp
    from gpucourse.checks.ddp import run_exercise_script

    nb = nbformat.read(SOLUTIONS / "lesson13_sharded_data_parallel" / "sharded_data_parallel.ipynb", 4)
    source = next(c.source for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "sharded_adam")
    ns = {"__name__": "student"}
    exec(compile(source, "student", "exec"), ns)
    with ddp.launch_policy(dataclasses.replace(ddp.policy(), sources={"sharded_adam": source})):
        record = run_exercise_script(ns, "sharded_adam")
    exercise = next(e for e in exercises() if e.name == "sharded_adam")
    assert [case.judge(record) for case in exercise.cases] == [None, None], record["tail"]
    for rank in record["ranks"].values():  # the shard: 3 * 541 elements at most, not Adam's 2 * 1082
        assert rank["runs"][0]["state_bytes"] <= 2 * 541 * 8 + 64


def test_shard_range_judges_state_the_padding_rule_and_the_type():
    """The public judge holds stored ranges; the hidden ones call the grader's reference on drawn calls."""
    import random

    from autograders import engine

    hidden = engine.load_checks("lesson13_sharded_data_parallel")
    reference = hidden.reference_shard_range
    assert reference(10, 3, 4) == (9, 10) and reference(2, 4, 5) == (2, 2) and reference(0, 0, 3) == (0, 0)
    assert all(list(map(lambda r: reference(n, r, w), range(w))) == stored for (n, w), stored in L.SHARD_PUBLIC.items())

    def verdicts(function):
        ns = {"shard_range": function}
        return [checks.run_case(case, ns, random.Random(3)) for case in checks.public_cases("shard_range") + hidden.HIDDEN["shard_range"]]

    assert verdicts(reference) == [None] * 4
    floor = verdicts(lambda n, r, w: (r * (n // w), (r + 1) * (n // w)))
    assert "shard_range(10, 0, 4) returned a wrong range" in floor[0] and "(0, 3)" in floor[0]
    assert "tuple of two ints" in verdicts(lambda n, r, w: list(reference(n, r, w)))[0]
    loose = verdicts(lambda n, r, w: reference(n, r, w) if 0 <= r < w else (n, n))  # no ValueError for a bad rank
    assert loose[:3] == [None, None, None] and "it must raise ValueError" in loose[3]
    floats = verdicts(lambda n, r, w: tuple(float(v) for v in reference(n, r, w)))
    assert "returned a tuple" not in floats[1] and "wrong value" in floats[1]


def test_the_judges_model_does_not_depend_on_the_global_generator():
    """Judges run in threads of one grader: a model drawn from torch's global generator would change
    whenever another thread draws from it between the seeding and the drawing."""
    first = [p.clone() for p in L.build_model([5, 7, 2], 3).parameters()]
    torch.manual_seed(12345)
    torch.rand(100)
    again = list(L.build_model([5, 7, 2], 3).parameters())
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert all(p.dtype == torch.float64 for p in again)
    assert not torch.equal(first[0], L.build_model([5, 7, 2], 4)[0].weight)

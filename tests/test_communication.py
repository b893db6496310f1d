"""Lesson 14's helpers (gpucourse.communication) and its checks: collectives timed on 2 gloo processes, the step
plans of DDP and ZeRO, bus bandwidth, the figures; the grader's references (its hidden checks) on inputs
whose answers are known, the public tables against them, and the drawn inputs' reach."""

from __future__ import annotations

import math
import random

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from gpucourse import communication as C  # noqa: E402
from gpucourse.checks import lesson14_communication as L  # noqa: E402

from autograders.checks import lesson14_communication as H  # noqa: E402


@pytest.fixture(scope="module")
def sweep():
    return C.run("sweep", nproc=2, smallest=4096, largest=65536, repeats=2)


@pytest.mark.slow  # two-rank torchrun launches (about 10 s each): `make test`, not `make test-fast`
def test_a_two_rank_sweep_times_every_collective_and_size_the_same_on_every_rank(sweep):
    assert [r["rank"] for r in sweep] == [0, 1] and all(r["world_size"] == 2 for r in sweep)
    assert all(r["backend"] == "gloo" for r in sweep)
    rows = sweep[0]["rows"]
    assert [(r["collective"], r["bytes"]) for r in rows] == [(c, s) for c in C.COLLECTIVES for s in (4096, 16384, 65536)]
    for row in rows:
        assert len(row["times"]) == 2 and all(0 < t < 60 for t in row["times"])
        assert row["median"] == sorted(row["times"])[0] + (sorted(row["times"])[1] - sorted(row["times"])[0]) / 2
    assert sweep[0]["rows"] == sweep[1]["rows"]  # every rank reports the slowest rank's time per repetition


@pytest.mark.slow  # two-rank torchrun launches (about 10 s each): `make test`, not `make test-fast`
def test_the_plans_are_timed_as_sequences_on_two_ranks():
    reports = C.run("plans", nproc=2, widths="16", repeats=2)
    rows = reports[0]["rows"]
    assert [r["strategy"] for r in rows] == list(C.STRATEGIES)
    numels = C.layer_numels(16)
    for r in rows:
        assert r["parameters"] == sum(numels) and len(r["times"]) == 2 and r["median"] > 0
        assert [tuple(step) for step in r["plan"]] == C.step_plan(r["strategy"], numels, 2)


def test_layer_numels_are_lesson_13s_model():
    from gpucourse.sharded_data_parallel import lesson_model

    assert sum(C.layer_numels(256)) == sum(p.numel() for p in lesson_model(256).parameters()) == 142_602
    assert C.layer_numels(64, depth=2) == [32 * 64 + 64, 64 * 64 + 64, 64 * 10 + 10]


def test_step_plans_move_the_bytes_the_zero_paper_counts():
    numels = [1000, 2000, 3001]
    total = sum(numels)
    ddp = C.step_plan("ddp", numels, 4)
    assert ddp == [("all_reduce", 4 * 4 * math.ceil(total / 4))]  # one bucket under 1 MiB, padded
    for stage in ("zero1", "zero2"):
        assert C.step_plan(stage, numels, 4) == [("reduce_scatter", 24016), ("all_gather", 24016)]
    zero3 = C.step_plan("zero3", numels, 4)
    assert len(zero3) == 9 and [c for c, _ in zero3[:3]] == ["all_gather"] * 3
    assert zero3[3:5] == [("all_gather", 12016), ("reduce_scatter", 12016)]  # the last layer first in backward
    per_rank = {s: sum(size * (3 / 4 if c != "all_reduce" else 2 * 3 / 4) for c, size in C.step_plan(s, numels, 4))
                for s in C.STRATEGIES}
    assert per_rank["zero1"] == pytest.approx(per_rank["ddp"])
    assert per_rank["zero3"] == pytest.approx(1.5 * per_rank["ddp"], rel=1e-3)
    with pytest.raises(ValueError, match="unknown strategy"):
        C.step_plan("fsdp", numels, 2)


def test_ddp_buckets_follow_torchs_caps():
    mib = 2**20
    assert C.ddp_buckets([10]) == [40]
    # reversed order: 0.75 MiB, then + 0.5 MiB reaches the first cap (1 MiB); then 25 MiB buckets
    assert C.ddp_buckets([mib // 8, 10 * mib // 4, 10 * mib // 4, mib // 8, 3 * mib // 16]) == \
        [3 * mib // 4 + mib // 2, 20 * mib + mib // 2]
    assert sum(C.ddp_buckets(C.layer_numels(1024))) == 4 * sum(C.layer_numels(1024))


def test_bus_bandwidth_is_nccl_tests_correction():
    assert C.bus_bandwidth("all_reduce", 1e9, 1.0, 2) == 1e9
    assert C.bus_bandwidth("all_reduce", 1e9, 1.0, 8) == pytest.approx(1.75e9)
    assert C.bus_bandwidth("reduce_scatter", 1e9, 0.5, 4) == pytest.approx(1.5e9)
    assert C.bus_bandwidth("all_gather", 1e9, 1.0, 2) == 0.5e9
    with pytest.raises(ValueError):
        C.bus_bandwidth("broadcast", 1e9, 1.0, 2)


def test_predict_sums_alpha_and_bytes_over_beta():
    fits = {"all_reduce": (1e-4, 1e9), "reduce_scatter": (2e-4, 2e9), "all_gather": (3e-4, 4e9)}
    plan = [("all_reduce", 10**9), ("reduce_scatter", 2 * 10**9), ("all_gather", 4 * 10**9)]
    assert C.predict(plan, fits) == pytest.approx(6e-4 + 3)


def test_sizes_between():
    assert C.sizes_between(4096, 65536) == [4096, 16384, 65536]
    assert C.sizes_between(4096, 100_000, factor=2) == [4096, 8192, 16384, 32768, 65536]
    with pytest.raises(ValueError):
        C.sizes_between(0, 10)


def test_the_graders_fit_recovers_alpha_and_beta_of_a_synthetic_link():
    rng = random.Random(3)
    sizes = [2.0**k for k in range(10, 27) for _ in range(3)]
    alpha, beta = 250e-6, 3e9
    exact = H.reference_fit(sizes, [alpha + n / beta for n in sizes])
    assert exact[0] == pytest.approx(alpha, rel=1e-9) and exact[1] == pytest.approx(beta, rel=1e-9)
    noisy = H.reference_fit(sizes, [(alpha + n / beta) * (1 + rng.uniform(-0.02, 0.02)) for n in sizes])
    assert noisy[1] == pytest.approx(beta, rel=0.05)
    for sizes, seconds in ([1e3, 2e3], [2e-3, 1e-3]), ([1024, 2048, 3072], [2**-10, 2**-9, 2**-10]):
        with pytest.raises(ValueError):  # falling, and a slope of exactly 0: no bandwidth
            H.reference_fit(sizes, seconds)


def test_public_tables_are_the_graders_reference():
    for (sizes, seconds), want in zip(L.FIT_PUBLIC, L.FIT_PUBLIC_WANT):
        got = H.reference_fit(sizes, seconds)
        assert got[0] == pytest.approx(want[0], rel=1e-9) and got[1] == pytest.approx(want[1], rel=1e-9)
    assert [H.reference_comm_bytes(*args) for args in L.BYTES_PUBLIC] == L.BYTES_PUBLIC_WANT
    for args in L.BYTES_BAD_PUBLIC:
        with pytest.raises(ValueError):
            H.reference_comm_bytes(*args)
    for sizes, seconds in L.FIT_BAD_PUBLIC:
        with pytest.raises(ValueError):
            H.reference_fit(sizes, seconds)


def test_the_public_module_computes_no_answer():
    assert not any(hasattr(L, name) for name in ("expected_fit", "ring_bytes_per_rank", "STRATEGY_PHASES", "fit_inputs"))


def test_ring_bytes_per_rank():
    assert H.reference_comm_bytes("ddp", 1000, 4, 4) == 6000
    assert H.reference_comm_bytes("zero3", 1000, 4, 4) == 9000
    assert H.reference_comm_bytes("zero1", 1000, 4, 4) == H.reference_comm_bytes("zero2", 1000, 4, 4) == 6000
    assert H.reference_comm_bytes("ddp", 10, 3, 2) == 32 and H.reference_comm_bytes("ddp", 10, 1, 2) == 0
    big = 2**60 + 1  # above 2**53: exact, where a float division is not
    assert H.reference_comm_bytes("ddp", big, 3, 1) == 2 * 2 * (-(-big // 3))
    for bad in (("DDP", 10, 2, 4), ("ddp", 10, 0, 4), ("ddp", -1, 2, 4), ("ddp", 10, 2, 0)):
        with pytest.raises(ValueError):
            H.reference_comm_bytes(*bad)


def test_drawn_inputs_reach_the_whole_domain():
    from autograders.differential import outcome

    from gpucourse.checks.values import rebuild

    for seed in range(3):
        rng = random.Random(seed)
        links = H.draw_links(rng)
        args = [rebuild(c["args"]) for c in links]
        assert all(outcome(H.reference_fit, c).get("returned") for c in links)
        assert any(len(set(s)) == 2 for s, _ in args), "two distinct sizes"
        assert any(len(set(s)) < len(s) for s, _ in args), "repeated sizes"
        assert {tuple(c["numpy"]) for c in links} >= {(True, True), (False, False)}
        assert any(isinstance(s, tuple) for s, _ in args) and any(isinstance(s[0], int) for s, _ in args)
        assert any(H.reference_fit(*a)[0] < 0 for a in args), "a negative intercept"
        bad = H.draw_bad_fits(rng)
        assert all("raised" in outcome(H.reference_fit, c) for c in bad)
        grid = [rebuild(c["args"]) for c in H.draw_every_strategy(rng)]
        assert {a[0] for a in grid} == set(H.STRATEGIES) and any(a[1] > 2**53 for a in grid)
        assert any(a[2] == 1 for a in grid) and any(a[1] == 0 for a in grid)
        assert any(a[1] % a[2] for a in grid) and any(a[3] not in (1, 2, 4, 8) for a in grid)
        assert all("raised" in outcome(H.reference_comm_bytes, c) for c in H.draw_bad_bytes(rng))


def test_the_public_judges_accept_the_reference_and_say_what_is_wrong():
    ns = {"fit_alpha_beta": H.reference_fit}
    assert L.judge_fits(L.observe_fits(ns)) is None and L.judge_fit_errors(L.observe_fits(ns)) is None
    ns = {"fit_alpha_beta": lambda n, t: H.reference_fit(n, t)[::-1]}  # (beta, alpha)
    assert "beta" in L.judge_fits(L.observe_fits(ns))
    ns = {"comm_bytes_per_step": H.reference_comm_bytes}
    observed = L.observe_bytes(ns)
    assert L.judge_bytes(observed) is None and L.judge_bytes_errors(observed) is None
    ns = {"comm_bytes_per_step": lambda s, p, n, b: 2 * (n - 1) * -(-p // n) * b}  # no validation, zero3 as ddp
    observed = L.observe_bytes(ns)
    assert "must raise ValueError" in L.judge_bytes_errors(observed)
    assert "returned 6000" in L.judge_bytes(observed)


@pytest.mark.slow  # two-rank torchrun launches (about 10 s each): `make test`, not `make test-fast`
def test_figures_have_titles_and_labelled_axes_with_units(sweep):
    rows = sweep[0]["rows"]
    fits = {c: (1e-4, 1e9) for c in C.COLLECTIVES}
    compared = [{"width": w, "parameters": 100 * w, "strategy": s, "predicted": 1e-3, "measured": 2e-3, "backend": "gloo"}
                for w in (16, 64) for s in C.STRATEGIES]
    for fig in (C.plot_collective_times(rows, "a test CPU", 2, fits=fits), C.plot_bus_bandwidth(rows, "a test CPU", 2),
                C.plot_prediction(compared, "a test CPU", 2)):
        title = fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()
        assert "a test CPU" in title and "2" in title and "gloo" in title  # the backend the rows say ran them
        for ax in fig.axes:
            assert "(" in ax.get_xlabel() and "(" in ax.get_ylabel(), (ax.get_xlabel(), ax.get_ylabel())
    by_ranks = {2: fits, 3: {c: (2e-4, 8e8) for c in C.COLLECTIVES}, 4: {"all_reduce": (3e-4, 6e8)}}
    fig = C.plot_fits_against_ranks(by_ranks, "a test CPU", "gloo")
    assert "a test CPU" in fig._suptitle.get_text() and "gloo" in fig._suptitle.get_text()
    for ax in fig.axes:
        assert "(" in ax.get_xlabel() and "(" in ax.get_ylabel(), (ax.get_xlabel(), ax.get_ylabel())
        assert [list(line.get_xdata()) for line in ax.get_lines()] == [[2, 3, 4], [2, 3], [2, 3]]  # a missing fit left out
    ax = C.plot_collective_times(rows, "a test CPU", 2, fits=fits).axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert any("fit:" in t.get_text() for t in ax.get_legend().get_texts())

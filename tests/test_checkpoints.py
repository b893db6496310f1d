"""Lesson 16's helpers (gpucourse.checkpoints) and the judges of its exercises (gpucourse.checks.lesson16_checkpoints): a DCP
checkpoint saved on 2 gloo processes loads on 1 and 3, a rank that fails under torchrun --max-restarts resumes to
the uninterrupted run's weights, the save-time figure; the judges on answers written here."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest

from gpucourse import checkpoints as H
from gpucourse.checks import lesson16_checkpoints as L


@pytest.mark.slow  # torchrun launches of several ranks (15-45 s each): `make test`, not `make test-fast`
def test_dcp_checkpoint_from_2_ranks_loads_on_1_2_and_3_ranks_and_training_goes_on():
    with tempfile.TemporaryDirectory(prefix="test-resilience-") as folder:
        ckpt = Path(folder) / "step_3"
        saved, _ = H.run("save", nproc=2, ckpt=ckpt, width=32, steps=3, more=2)
        files = saved[0]["files"]
        assert set(files) == {".metadata", "__0_0.distcp", "__1_0.distcp"}, files  # one data file per rank
        assert saved[1]["files"] == {}  # listed by rank 0 only
        assert saved[0]["weights_saved"] == saved[1]["weights_saved"]
        parameters = len(saved[0]["weights_saved"])
        assert parameters == sum(p.numel() for p in H.lesson_model(32, 3).parameters())
        # the old way: rank 0 held every parameter whole (float64) and wrote the file; rank 1 held nothing
        # (every parameter and both Adam moments in float64, and one float32 step count per parameter tensor)
        assert saved[0]["old_way"]["bytes_held"] == 3 * 8 * parameters + 8 * 4
        assert saved[0]["old_way"]["file_bytes"] > 3 * 8 * parameters
        assert saved[1]["old_way"]["bytes_held"] == 0 and saved[1]["old_way"]["file_bytes"] == 0
        # the data files hold every parameter and both of Adam's moments once (3 x 8 bytes each), plus headers
        assert 3 * 8 * parameters < files["__0_0.distcp"] + files["__1_0.distcp"] < 3 * 8 * parameters + 200_000
        items = saved[0]["items"]
        assert set(items) == {"__0_0.distcp", "__1_0.distcp"}
        assert all(items[f]["model_shards"] == 8 for f in items)  # 4 Linear layers: a shard of each weight and bias
        assert sum(items[f]["bytes"] for f in items) == files["__0_0.distcp"] + files["__1_0.distcp"]
        for nproc in (1, 2, 3):
            loaded, _ = H.run("load", nproc=nproc, ckpt=ckpt, width=32, steps=3, more=2)
            assert [r["rank"] for r in loaded] == list(range(nproc))
            assert sum(r["local_parameters"] for r in loaded) >= parameters
            for r in loaded:
                assert r["step"] == 3
                assert r["weights_loaded"] == saved[0]["weights_saved"]  # bit for bit, resharded
                gap = max(abs(a - b) for a, b in zip(r["weights_after_more"], saved[0]["weights_after_more"]))
                assert gap < 1e-12  # float64: only the order of the gradient sums differs
            if nproc == 2:
                # the load really restores Adam's state: on the same world size the 2 more steps are the
                # saved run's bit for bit (a model that only loaded the weights would train to others),
                # and they did train
                assert loaded[0]["weights_after_more"] == saved[0]["weights_after_more"]
                assert loaded[0]["weights_after_more"] != loaded[0]["weights_loaded"]
        assert list(Path(folder).iterdir())  # written where asked (removed with the folder)


@pytest.mark.slow  # torchrun launches of several ranks (15-45 s each): `make test`, not `make test-fast`
def test_a_rank_failing_once_is_restarted_and_ends_with_the_uninterrupted_weights():
    with tempfile.TemporaryDirectory(prefix="test-resilience-") as folder:
        root = Path(folder)
        clean, _ = H.run("train", nproc=2, ckpt=root / "clean", width=16, steps=7, every=3)
        (root / "events").mkdir()
        resumed, launch = H.run("train", nproc=2, ckpt=root / "failing", out=root / "events", max_restarts=1,
                                width=16, steps=7, every=3, fail_rank=1, fail_at=5)
        assert "fails at step 5" in launch.output  # the failure happened, torchrun reported it
        assert [r["weights"] for r in resumed] == [r["weights"] for r in clean]  # bit for bit, on every rank
        assert all(r["attempt"] >= 1 for r in resumed) and clean[0]["attempt"] == 0
        events = H.read_events(root / "events")
        restarted = {e["rank"] for e in events if e["event"] == "started" and e["attempt"] >= 1}
        assert restarted == {0, 1}  # every rank, not only the one that failed
        cost = H.restart_cost(events)
        assert cost["failed_at"] == 5 and cost["resumed_from"] == 3 and cost["steps_redone"] == 2
        assert cost["seconds_to_resume"] > 0
        assert sorted(p.name for p in (root / "failing").iterdir()) == ["LATEST", "step_3", "step_6"]
        assert all((root / "failing" / s / ".metadata").is_file() for s in ("step_3", "step_6"))


def test_save_time_figure_has_title_labels_and_hardware():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [{"width": w, "parameters": 10 * w, "dcp_bytes": 2**20 * w, "blocking_seconds": 0.01 * w,
             "async_returned_seconds": 0.002 * w, "async_finished_seconds": 0.012 * w, "full_state_seconds": 0.02 * w}
            for w in (1, 4, 16)]
    fig = H.plot_save_times(rows, "a test CPU", world_size=2)
    ax = fig.axes[0]
    assert "a test CPU" in ax.get_title() and "2 gloo processes" in ax.get_title()
    assert "(MiB" in ax.get_xlabel() and "(s)" in ax.get_ylabel()
    assert len(ax.get_lines()) == 4
    plt.close(fig)


@pytest.mark.slow  # torchrun launches of several ranks (15-45 s each): `make test`, not `make test-fast`
def test_save_timing_demo_reports_every_width():
    with tempfile.TemporaryDirectory(prefix="test-resilience-") as folder:
        timing, _ = H.run("timing", nproc=2, ckpt=Path(folder), widths="16,64", depth=2)
        rows = timing[0]["rows"]
        assert [r["width"] for r in rows] == [16, 64]
        assert rows[0]["dcp_bytes"] < rows[1]["dcp_bytes"]
        for r in rows:
            assert 0 < r["async_returned_seconds"] <= r["async_finished_seconds"]
            assert r["blocking_seconds"] > 0 and r["full_state_seconds"] > 0


def test_resumable_sampler_shuffles_each_epoch_and_resumes_from_its_state():
    sampler = H.ResumableSampler(rows=12, batch=4, seed=3)
    epochs = [[sampler.next_batch() for _ in range(3)] for _ in range(2)]
    for batches in epochs:  # an epoch: every row once
        assert sorted(i for b in batches for i in b) == list(range(12))
    assert epochs[0] != epochs[1]  # a new order each epoch
    sampler = H.ResumableSampler(rows=12, batch=4, seed=3)
    for _ in range(2):
        sampler.next_batch()
    state = sampler.state_dict()
    assert state == {"epoch": 0, "position": 2}
    ahead = [sampler.next_batch() for _ in range(3)]  # crosses into epoch 1
    restored = H.ResumableSampler(rows=12, batch=4, seed=3)
    restored.load_state_dict(state)
    assert [restored.next_batch() for _ in range(3)] == ahead == [epochs[0][2], epochs[1][0], epochs[1][1]]
    assert [H.ResumableSampler(rows=12, batch=4, seed=3).next_batch() for _ in range(3)] != ahead  # fresh: from the start


def test_rank_rng_restores_this_ranks_generator_under_its_own_key():
    from torch.distributed.checkpoint.stateful import Stateful

    for stateful in (H.RankRNG(1), H.ResumableSampler(), H.AppState(None, None)):
        assert isinstance(stateful, Stateful)  # the protocol DCP checks for
    import torch

    torch.manual_seed(5)
    rng = H.RankRNG(1)
    state = rng.state_dict()
    assert list(state) == ["rank1"]
    drawn = torch.rand(4)
    torch.manual_seed(6)
    rng.load_state_dict(state)
    assert torch.equal(torch.rand(4), drawn)


@pytest.mark.slow  # torchrun launches of several ranks (15-45 s each): `make test`, not `make test-fast`
def test_resume_with_loader_and_rng_state_is_bit_identical_and_without_them_is_not():
    with tempfile.TemporaryDirectory(prefix="test-resilience-") as folder:
        ranks, _ = H.run("resume", nproc=2, ckpt=Path(folder) / "c", width=16, steps=8, stop_at=5)
    assert ranks[0]["saved_keys"] == ["loader.epoch", "loader.position", "rng.rank0.cpu", "rng.rank1.cpu", "step"]
    assert ranks[1]["rng_differs_from_rank0"]  # each rank its own generator: one key would not do
    for r in ranks:
        clean = r["uninterrupted"]
        assert len(clean["batches"]) == 3 and all(len(b) == H.LOADER_BATCH for b in clean["batches"])
        everything, no_rng, model_only = (r[name] for name in H.RESUME_VARIANTS)
        assert all(v["resumed_at"] == 5 for v in (everything, no_rng, model_only))
        assert everything["batches"] == clean["batches"] and everything["weights"] == clean["weights"]
        assert no_rng["batches"] == clean["batches"] and no_rng["weights"] != clean["weights"]  # dropout masks
        assert model_only["batches"] == clean["first_batches"] != clean["batches"]  # the epoch started again
        assert model_only["weights"] != clean["weights"]
    assert ranks[0]["uninterrupted"]["weights"] == ranks[1]["uninterrupted"]["weights"]


@pytest.mark.slow  # torchrun launches of several ranks (15-45 s each): `make test`, not `make test-fast`
def test_a_rank_that_skips_a_collective_fails_the_other_at_the_timeout_one_that_raises_at_once():
    faults = H.run_fault(timeout_seconds=3)
    assert faults["returncode"] not in (0, None)  # the raise ended the launch with an error
    assert "simulated crash" in faults["output"]
    skipped, raised = faults["skip"], faults["raise"]
    assert "Timed out" in skipped["error"]
    assert 3 <= skipped["seconds_to_error"] < 9  # not before the timeout
    if raised["seconds_to_error"] is not None:  # rank 0 saw the closed connection before torchrun stopped it
        assert "Connection closed" in raised["error"]
    assert raised["seconds_to_end"] < 30  # no timeout to wait for: the launch ended when the process did


# --- the judges ------------------------------------------------------------------------------------------

def _right(root):
    import re

    root = Path(root)
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if p.is_dir() and (m := re.fullmatch(r"step_([0-9]+)", p.name)) and (p / ".metadata").is_file()]
    return max(found)[1] if found else None


def _hidden():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "autograders" / "checks" / "lesson16_checkpoints.py"
    spec = importlib.util.spec_from_file_location("hidden_lesson16", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_public_layout_judge_accepts_the_rule_and_names_each_mistake():
    assert L.judge_public_layouts(L.observe_public_layouts({"latest_complete_checkpoint": _right})) is None
    as_text = lambda root: max((p for p in Path(root).glob("step_*") if (p / ".metadata").exists()),
                               key=lambda p: p.name, default=None)
    verdict = L.judge_public_layouts(L.observe_public_layouts({"latest_complete_checkpoint": as_text}))
    assert "step_9" in verdict and "compare N as numbers" in verdict
    relative = lambda root: "step_10"  # a bare name is not the folder's path
    verdict = L.judge_public_layouts(L.observe_public_layouts({"latest_complete_checkpoint": relative}))
    assert "not a folder under the root" in verdict


def test_the_public_module_holds_no_reference():
    for name in ("expected_checkpoint", "expected_interval", "STEP_NAME", "generated_layout", "interval_grid"):
        assert not hasattr(L, name), name


@pytest.mark.parametrize("seed", range(8))
def test_hidden_layout_draws_separate_the_rule_from_its_mistakes(seed):
    import random

    hidden = _hidden()
    for case in hidden.HIDDEN["latest_complete_checkpoint"]:
        layouts = case.draw(random.Random(seed))
        assert hidden.judge_layouts(L.observe_layouts({"latest_complete_checkpoint": _right}, layouts), layouts) is None
    # the largest as text, the most recently modified, int() of what follows step_: each caught by the generated draws
    generated = hidden.HIDDEN["latest_complete_checkpoint"][0].draw(random.Random(seed))
    as_text = lambda root: max((p for p in Path(root).glob("step_*") if p.name[5:].isdigit() and (p / ".metadata").exists()),
                               key=lambda p: p.name, default=None)
    assert "compared as numbers" in hidden.judge_layouts(L.observe_layouts({"latest_complete_checkpoint": as_text}, generated),
                                                         generated)


def test_leading_zeros_count_and_ties_accept_either_folder():
    hidden = _hidden()
    layout = {"entries": [["step_7", "dir", True, 5], ["step_007", "dir", True, 6], ["step_3", "dir", True, 1]],
              "root": "path", "missing": False}
    assert hidden.reference_latest(layout) == {"step_7", "step_007"}
    layout = {"entries": [["step_007", "dir", True, 5], ["step_-9", "dir", True, 1], ["old/step_99", "dir", True, 1]],
              "root": "str", "missing": False}
    assert hidden.reference_latest(layout) == {"step_007"}
    assert hidden.reference_latest({"entries": [["step_-1", "dir", True, 1]], "root": "str", "missing": False}) == {None}


def test_interval_reference_is_young_and_the_draws_stay_off_halves():
    import random

    hidden = _hidden()
    assert hidden.reference_checkpoint_every(60, 86400, 2.0) == 1610
    assert hidden.reference_checkpoint_every(0.5, 100, 60) == 1
    assert hidden.reference_checkpoint_every(2**60 + 1, 2**62 + 3, 2**55 + 5) in (90, 91)
    with pytest.raises(ValueError):
        hidden.reference_checkpoint_every(-0.0, 1, 1)
    good = lambda c, m, s: max(1, math.floor(math.sqrt(2 * c * m) / s + 0.5)) if all(
        math.isfinite(v) and v > 0 for v in (c, m, s)) else (_ for _ in ()).throw(ValueError("bad"))
    from gpucourse.checks import observe_calls

    for seed in range(5):
        for case in hidden.HIDDEN["checkpoint_every"]:
            calls = case.draw(random.Random(seed))
            assert hidden.judge_intervals(observe_calls({"checkpoint_every": good}, "checkpoint_every", calls), calls) is None
    assert L.judge_public_intervals(L.observe_public_intervals({"checkpoint_every": good})) is None
    floor = lambda c, m, s: max(1, int(math.sqrt(2 * c * m) / s))
    assert "the nearest whole number" in L.judge_public_intervals(L.observe_public_intervals({"checkpoint_every": floor}))


def test_rank_rng_saves_the_same_keys_whether_or_not_a_library_started_cuda(monkeypatch):
    """DCP loads into the keys ``state_dict()`` returns at load time: if they depended on whether CUDA happened to be
    started, a CPU run saved without a GPU generator could not be loaded after a library started CUDA (an H200 run
    of lesson 16: "Missing key in checkpoint state_dict: rng.rank0.cuda")."""
    import torch

    saved = H.RankRNG(0).state_dict()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: torch.zeros(8, dtype=torch.uint8))
    assert list(H.RankRNG(0).state_dict()["rank0"]) == list(saved["rank0"]) == ["cpu"]
    assert list(H.RankRNG(0, cuda=True).state_dict()["rank0"]) == ["cpu", "cuda"]  # a run whose tensors are on the GPU

"""Lesson 6's helpers: Lightning's own device parser, the removed Trainer arguments, the hooks' log."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from gpucourse import lightning_devices as L


@pytest.mark.parametrize("devices, available, expected", [
    (3, 4, [0, 1, 2]), (-1, 4, [0, 1, 2, 3]), ([1, 3], 4, [1, 3]), ("1, 3", 4, [1, 3]), ("3", 4, [0, 1, 2]),
    (0, 4, None), ("-1", 2, [0, 1]),
])
def test_lightning_parses_the_devices_table(devices, available, expected):
    assert L.lightning_device_ids(devices, available) == expected


def test_impossible_requests_come_back_as_errors():
    assert "only has" in str(L.lightning_device_ids(5, 4))
    assert isinstance(L.lightning_device_ids(None, 4), TypeError)
    assert "none are available" in str(L.lightning_device_ids(-1, 0))


def test_every_removed_argument_fails_on_the_installed_lightning():
    for old, why, new in L.REMOVED:
        outcome = L.try_trainer(**old)
        assert outcome.startswith(("TypeError", "ValueError")), (old, outcome)
        assert why and new
    assert L.try_trainer(accelerator="cpu", devices=1) == "ok: SingleDeviceStrategy"


def test_plain_loop_learns():
    torch.manual_seed(0)
    losses = L.train_plain(L.MLP(), DataLoader(L.regression_data(256), batch_size=32, shuffle=True), 8, 1e-2, "cpu")
    assert losses[-1] < losses[0] / 3


def test_lit_regressor_prepares_once_and_sets_up(tmp_path):
    model = L.LitRegressor(str(tmp_path), n=128)
    trainer = L.quiet_trainer(accelerator="cpu", devices=1, max_epochs=2)
    trainer.fit(model)
    log = L.read_hook_log(tmp_path)
    assert [line.split()[0] for line in log] == ["prepare_data", "setup(TrainerFn.FITTING)"]
    assert (tmp_path / "regression.pt").exists()
    assert {"train_loss", "val_loss"} <= set(trainer.callback_metrics)


@pytest.mark.parametrize("timings, smoke, says", [
    ({1: 2.0, 2: 3.0}, True, "too small to show DDP's scaling"),
    ({1: 3.0, 2: 2.0}, True, "too small to show DDP's scaling"),
    ({1: 2.0, 2: 3.0}, False, "1.50x SLOWER"),
    ({1: 3.0, 2: 2.0}, False, "1.50x faster"),
])
def test_ddp_timing_chart_says_what_was_measured_and_where(timings, smoke, says):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = L.plot_ddp_timings(timings, hardware="a test CPU, 2 logical CPUs", smoke=smoke)
    ax = fig.axes[0]
    assert "a test CPU" in ax.get_title() and "DDP" in ax.get_title()
    assert "(s)" in ax.get_ylabel() and ax.get_xlabel()
    notes = " ".join(t.get_text() for t in ax.texts)
    assert says in notes
    assert ("faster" in notes) == (timings[2] < timings[1])  # never a speedup that was not measured
    plt.close(fig)


def test_ddp_timing_chart_refuses_nonsense():
    with pytest.raises(ValueError):
        L.plot_ddp_timings({1: 0.0, 2: 1.0})


def test_fork_and_use_cuda_refuses_an_unknown_order():
    with pytest.raises(ValueError):
        L.fork_and_use_cuda("whenever")


def test_lesson06_public_stored_values_agree_with_the_graders_references():
    """The public cases' stored outputs, noise and loss are what the hidden references give; the public
    check module computes none of them."""
    from gpucourse.checks import lesson06_lightning_devices as C

    from autograders.checks.lesson06_lightning_devices.device_agnostic import reference_standardize
    from autograders.checks.lesson06_lightning_devices.effective_batch import (reference_effective_batch_size,
                                                                               reference_scaled_learning_rate)
    from autograders.checks.lesson06_lightning_devices.picklable import reference_augment, reference_loss
    config = {"x": C.AGNOSTIC_X, "mean": [1.0, -2.0, 0.5], "std": [2.0, 0.5, 1.0], "dtype": "float32",
              "weight": C.AGNOSTIC_READOUT["weight"], "bias": C.AGNOSTIC_READOUT["bias"]}
    out, tolerance = reference_standardize(config)
    assert all(abs(a - b) <= t for a, b, t in zip(out, C.AGNOSTIC_EXPECTED, tolerance))
    assert reference_augment([[0.0] * 4] * 2, 0.3, 1) == pytest.approx(C.PICKLE_AUGMENT, rel=1e-6)
    run = {"x": [[0.0] * 4] * 2, "y": C.PICKLE_Y, "noise": 0.3, "how": "name", "loss_seed": 2,
           "weight": C.PICKLE_NET["weight"], "bias": C.PICKLE_NET["bias"]}
    assert reference_loss(run) == pytest.approx(C.PICKLE_LOSS, rel=1e-6)
    assert [reference_effective_batch_size(**c) for c in C.BATCH_CASES] == [56, 560, 256]
    assert reference_scaled_learning_rate(**C.LR_CASES[0]) == pytest.approx(0.4)
    for name in ("standardize_expected", "readout_values"):
        assert not hasattr(C, name), f"the public module still holds {name}"
    with pytest.raises(ValueError):
        reference_effective_batch_size(0.5, 2)


@pytest.mark.parametrize("visible, blocked", [
    ("MIG-8c7a1f52-3b1e-5d0c-9a77-2f64c1d0e9b3", True), ("0,MIG-8c7a1f52-3b1e-5d0c-9a77-2f64c1d0e9b3", True),
    ("0,1", False), ("GPU-5e0c1d2a-77f4-4b3e-9f0a-1c2d3e4f5a6b", False), ("", False)])
def test_only_a_mig_slice_named_by_uuid_blocks_the_fork(visible, blocked):
    assert (L.fork_blocked_by(visible) is not None) is blocked


def test_the_trainer_spawns_where_the_fork_is_blocked_and_says_why(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-8c7a1f52-3b1e-5d0c-9a77-2f64c1d0e9b3")
    trainer = L.quiet_trainer(accelerator="cpu", devices=2, strategy="ddp_notebook")
    assert trainer.strategy._start_method == "spawn"
    assert 'strategy="ddp_spawn" instead of "ddp_notebook"' in capsys.readouterr().out
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert L.quiet_trainer(accelerator="cpu", devices=2, strategy="ddp_notebook").strategy._start_method == "fork"

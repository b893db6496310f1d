"""Lesson 7's helpers: data parallelism simulated in one process, and a real 2-process DDP run."""

from __future__ import annotations

import torch

from gpucourse import ddp_scripts as D


def test_shards_partition_the_global_batch():
    x, y = D.regression_batch(3, per_rank=5)
    shards = [D.regression_batch(3, rank, 2, per_rank=5) for rank in range(2)]
    whole = D.regression_batch(3, 0, 1, per_rank=10)
    assert x.shape == (5, 4) and y.shape == (5,)
    assert torch.equal(torch.cat([shards[0][0], shards[1][0]]).sort(0).values, whole[0].sort(0).values)
    assert not torch.equal(shards[0][0], shards[1][0])


def test_averaged_shard_gradients_equal_the_full_batch_gradient():
    torch.manual_seed(0)
    model = D.TinyNet()
    x, y = D.regression_batch(0, per_rank=16)
    sim = D.simulated_ranks(model, x, y, world_size=4)
    assert sim.max_difference < 1e-5
    summed = torch.stack(sim.per_rank_grads).sum(0)
    assert (summed - sim.full_batch_grad).abs().max() > 1e-3  # summing is not the same
    assert model.spare.weight.grad is None  # the unused layer never gets a gradient


def test_ddp_script_keeps_ranks_identical(tmp_path):
    launch = D.torchrun(["-m", "gpucourse.ddp_scripts", "--steps", "4", "--per-rank", "8", "--hidden", "16",
                         "--out", str(tmp_path)], nproc=2)
    assert launch.returncode == 0, launch.output[-2000:]
    reports = D.read_rank_reports(tmp_path)
    assert [r["rank"] for r in reports] == [0, 1] and {r["world_size"] for r in reports} == {2}
    assert reports[0]["weights_head"] == reports[1]["weights_head"]
    assert reports[0]["weights_checksum"] == reports[1]["weights_checksum"]
    assert reports[0]["final_loss"] != reports[1]["final_loss"]  # each rank saw its own shard


def test_script_refuses_to_run_without_torchrun(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        D.main(["--out", str(tmp_path)])
    assert "torchrun" in capsys.readouterr().err

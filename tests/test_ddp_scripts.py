"""Lesson 7's helpers: data parallelism simulated in one process, and a real 2-process DDP run."""

from __future__ import annotations

import pytest
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


@pytest.mark.slow  # a two-rank torchrun launch (about 15 s): `make test`, not `make test-fast`
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


def test_ring_all_reduce_sums_and_sends_2_n_minus_1_over_n():
    for n in (2, 3, 4, 5):
        tensors = [torch.randn(4 * n, generator=torch.Generator().manual_seed(i)) for i in range(n)]
        ring = D.ring_all_reduce(tensors)
        total = torch.stack(tensors).sum(0)
        assert all(torch.allclose(out, total, atol=1e-5) for out in ring.outputs)
        assert [phase for phase, _, _ in ring.steps] == ["reduce-scatter"] * (n - 1) + ["all-gather"] * (n - 1)
        assert all(receiver == (sender + 1) % n for _, _, moves in ring.steps for sender, receiver, _ in moves)
        assert ring.sent_per_rank == [2 * (n - 1) * 4] * n  # 2(N-1)/N of 4N elements
        assert all(torch.equal(t, tensors[i]) for i, t in enumerate(tensors))  # inputs untouched


def test_ddp_timeline_overlaps_backward():
    tl = D.ddp_timeline()
    assert [layer for layer, _, _ in tl.backward] == [5, 4, 3, 2, 1, 0]  # last layer first
    assert sorted(layer for group, *_ in tl.buckets for layer in group) == [0, 1, 2, 3, 4, 5]
    for group, ready, start, end in tl.buckets:
        assert start >= ready == max(e for layer, _, e in tl.backward if layer in group)
    assert tl.buckets[0][2] < tl.backward[-1][2]  # the first all-reduce runs while backward still computes
    assert tl.end < tl.no_overlap_end


def test_figures_have_titles_and_labelled_axes():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    for fig in (D.plot_ring_all_reduce(4), D.plot_ddp_overlap()):
        assert isinstance(fig, Figure)
        for ax in fig.axes:
            assert ax.get_title() and ax.get_xlabel() and (ax.get_ylabel() or ax.get_yticklabels())
        assert any("(" in ax.get_xlabel() for ax in fig.axes)  # units or scale named
        plt.close(fig)
    ring = D.plot_ring_all_reduce(4)
    assert "gradient size" in ring.axes[1].get_ylabel() and "N" in ring.axes[1].get_xlabel()
    plt.close(ring)


def test_set_epoch_reshuffles_and_its_absence_repeats():
    without = D.sampler_orders(12, 3, set_epoch=False)
    with_it = D.sampler_orders(12, 3, set_epoch=True)
    assert without[0] == without[1] == without[2]
    assert len({tuple(o) for o in with_it}) == 3
    assert with_it[0] == without[0]  # epoch 0 is the same either way
    ranks = [D.sampler_orders(12, 1, rank=r)[0] for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == list(range(12))  # the two ranks split each epoch


def _reports(device, backend, n=2):
    return [{"device": device, "backend": backend, "samples_per_second": 100.0 * (i + 1)} for i in range(n)]


def test_a_comparison_never_mixes_devices_or_backends():
    import pytest

    assert D.same_device_and_backend({1: _reports("cpu", "gloo", 1), 2: _reports("cpu", "gloo")}) == ("cpu", "gloo")
    assert D.same_device_and_backend({1: _reports("cuda:0", "nccl", 1), 2: _reports("cuda:1", "nccl")}) == ("cuda", "nccl")
    with pytest.raises(ValueError, match="different devices or backends"):
        D.same_device_and_backend({1: _reports("cuda:0", "nccl", 1), 2: _reports("cpu", "gloo")})  # the H100 bench's mix
    with pytest.raises(ValueError):
        D.plot_throughput({1: _reports("cuda:0", "nccl", 1), 2: _reports("cpu", "gloo")})


def test_throughput_chart_names_device_backend_and_hardware():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = D.plot_throughput({1: [{"device": "cpu", "backend": "gloo", "samples_per_second": 200.0}],
                             2: _reports("cpu", "gloo")}, hardware="a test CPU")
    ax = fig.axes[0]
    assert "cpu (gloo)" in ax.get_title() and "a test CPU" in ax.get_title()
    assert "samples / s" in ax.get_ylabel() and "gloo" in ax.get_xlabel()
    assert "SLOWER" in " ".join(t.get_text() for t in ax.texts)  # 100 samples/s for 2 vs 200 for 1
    plt.close(fig)


def test_auto_falls_back_out_loud(monkeypatch, capsys):
    import torch.distributed as dist

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(D.torch.cuda, "device_count", lambda: 1)  # one GPU, two processes
    monkeypatch.setattr(D, "init_process_group", lambda: D.torch.device("cpu"))  # what launch picks then
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    device, fallback = D.start_ranks("auto")
    assert device.type == "cpu" and "fell back to cpu/gloo" in fallback and "1 GPU" in fallback
    assert "fell back" in capsys.readouterr().err


def test_cuda_without_a_gpu_per_process_refuses_with_the_reason(monkeypatch):
    import pytest

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(D, "gpu_per_rank", lambda: False)
    with pytest.raises(SystemExit, match="one GPU per process"):
        D.start_ranks("cuda")
    with pytest.raises(ValueError):
        D.start_ranks("tpu")


@pytest.mark.slow  # a two-rank torchrun launch (about 15 s): `make test`, not `make test-fast`
def test_ddp_script_records_what_it_ran_on(tmp_path):
    launch = D.torchrun(["-m", "gpucourse.ddp_scripts", "--steps", "2", "--per-rank", "4", "--hidden", "8",
                         "--device", "cpu", "--out", str(tmp_path)], nproc=2)
    assert launch.returncode == 0, launch.output[-2000:]
    for r in D.read_rank_reports(tmp_path):
        assert (r["device"], r["backend"], r["requested_device"], r["fallback"]) == ("cpu", "gloo", "cpu", None)

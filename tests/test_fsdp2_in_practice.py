"""Lesson 17's helpers (gpucourse.fsdp2_in_practice) and its exercises' stored tables (gpucourse.checks.lesson17_fsdp2_in_practice)
against the grader's references (autograders/checks/lesson17_fsdp2_in_practice.py)."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from gpucourse import fsdp2_in_practice as H  # noqa: E402
from gpucourse.checks import lesson17_fsdp2_in_practice as L  # noqa: E402

from autograders.checks import lesson17_fsdp2_in_practice as R  # noqa: E402


def test_public_tables_agree_with_the_graders_references():
    for args, want in zip(L.TRAFFIC_PUBLIC, L.TRAFFIC_PUBLIC_WANT):
        assert R.reference_traffic(*args) == want, args
    for args, error in L.TRAFFIC_BAD_PUBLIC:
        with pytest.raises({"ValueError": ValueError, "TypeError": TypeError}[error]):
            R.reference_traffic(*args)
    for args, want in zip(L.MESH_PUBLIC, L.MESH_PUBLIC_WANT):
        assert R.reference_hsdp_mesh(*args) == want, args
    for args, error in L.MESH_BAD_PUBLIC:
        with pytest.raises({"ValueError": ValueError, "TypeError": TypeError}[error]):
            R.reference_hsdp_mesh(*args)


def test_hsdp_reference_matches_device_mesh_layout():
    """DeviceMesh lays ranks out row-major: arange(world).view(replicate, shard). Rows are shard groups."""
    for world, gpus in [(8, 4), (12, 3), (5, 5), (6, 1)]:
        grid = torch.arange(world).view(world // gpus, gpus)
        mesh = R.reference_hsdp_mesh(world, gpus)
        for rank in range(world):
            node, local = divmod(rank, gpus)
            assert mesh["shard_groups"][rank] == grid[node].tolist()
            assert mesh["replicate_groups"][rank] == grid[:, local].tolist()
    with pytest.raises(TypeError):
        R.reference_hsdp_mesh(True, 1)


def test_traffic_reference_treats_bools_as_settings_and_ints_as_group_sizes():
    shapes = [[30, 30], [30]]
    assert R.reference_traffic(shapes, 4, True, 4, 4) == R.reference_traffic(shapes, 4, 4, 4, 4)
    assert R.reference_traffic(shapes, 4, False, 4, 4) == R.reference_traffic(shapes, 4, 1, 4, 4)
    assert R.reference_traffic(shapes, 4, 2, 4, 4)["all_gather"] == 2976 + 1984
    assert R.reference_traffic([], 4, True, 2, 4) == {"all_gather": 0, "reduce_scatter": 0}
    for bad in (0, 3, 8):
        with pytest.raises(ValueError):
            R.reference_traffic(shapes, 4, bad, 4, 4)


def test_collective_log_counts_bytes_received_as_the_lesson_states():
    log = H.CollectiveLog()
    log.calls = [
        {"kind": "all_gather", "dtype": "bfloat16", "numel_in": 248, "numel_out": 992, "element_bytes": 2, "group": [0, 1, 2, 3]},
        {"kind": "all_gather", "dtype": "bfloat16", "numel_in": 496, "numel_out": 992, "element_bytes": 2, "group": [0, 1]},
        {"kind": "reduce_scatter", "dtype": "float32", "numel_in": 992, "numel_out": 248, "element_bytes": 4, "group": [0, 1, 2, 3]},
        {"kind": "all_reduce", "dtype": "float32", "numel_in": 248, "numel_out": 248, "element_bytes": 4, "group": [0, 2]},
    ]
    summary = log.summary()
    assert summary["all_gather"] == {"calls": 2, "bytes_received": 3 * 248 * 2 + 1 * 496 * 2}
    assert summary["reduce_scatter"] == {"calls": 1, "bytes_received": 3 * 248 * 4}
    assert summary["all_reduce"]["calls"] == 1


def test_collective_log_restores_torch_distributed():
    import torch.distributed as dist

    before = dist.all_gather_single
    with H.CollectiveLog().active():
        assert dist.all_gather_single is not before
    assert dist.all_gather_single is before


OLD_AND_NEW_NAMES = """
import json, os, warnings
import torch, torch.distributed as dist
from gpucourse import fsdp2_in_practice as H
warnings.simplefilter("ignore")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
x, out = torch.ones(4), torch.empty(4)
seen = {}
with H.CollectiveLog().active() as log:
    dist.all_gather_single(out, x)
    dist.all_gather_into_tensor(out, x)  # the old name: on this torch a deprecated wrapper of the new one
    dist.reduce_scatter_tensor(out, x)
seen["both"] = [c["kind"] for c in log.calls]
new = dist.all_gather_single
del dist.all_gather_single, dist.reduce_scatter_single  # a torch before 2.13 has only the old names
with H.CollectiveLog().active() as log:
    dist.all_gather_into_tensor(out, x)
seen["old_only"] = [c["kind"] for c in log.calls]
seen["names_back"] = not hasattr(dist, "all_gather_single")
dist.all_gather_single = new
dist.destroy_process_group()
print(json.dumps(seen))
"""


def test_collective_log_counts_each_call_once_under_the_old_and_the_new_names():
    """FSDP2 calls ``all_gather_single``/``reduce_scatter_single`` from torch 2.13 on and
    ``all_gather_into_tensor``/``reduce_scatter_tensor`` before (the edition runs on torch 2.10): every
    name is logged, and an old name forwarding to the new one counts once."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run([sys.executable, "-c", OLD_AND_NEW_NAMES], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PORT": str(port)})
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["both"] == ["all_gather", "all_gather", "reduce_scatter"], seen
    assert seen["old_only"] == ["all_gather"] and seen["names_back"], seen


def test_storage_bytes_counts_each_storage_once_and_meta_as_nothing():
    a = torch.zeros(10)
    assert H.storage_bytes([a, a[2:], torch.zeros(3, dtype=torch.bfloat16)]) == 40 + 6
    assert H.storage_bytes([torch.empty(100, device="meta")]) == 0


def test_overlap_counts_only_collectives_off_the_main_thread():
    events = [{"kind": "compute", "thread": 1, "start_us": 0, "end_us": 10, "name": "aten::mm"},
              {"kind": "all_gather", "thread": 1, "start_us": 0, "end_us": 10, "name": "FSDP::all_gather (0)"},
              {"kind": "all_gather", "thread": 2, "start_us": 5, "end_us": 20, "name": "gloo:all_gather"}]
    assert H.overlap_us(events) == 5


def test_figures_are_labelled():
    rows = [{"setting": s, "world_size": 4, "peak_parameter_bytes": p, "sharded_bytes": 2976,
             "collectives": {"all_gather": {"calls": 6, "bytes_received": b}}}
            for s, p, b in [(True, 6944, 17856), (False, 14880, 8928), (2, 10912, 14880)]]
    fig = H.plot_reshard(rows, "a test CPU", note="test")
    assert "4 gloo processes on a test CPU" in fig._suptitle.get_text()
    assert all("(B)" in ax.get_ylabel() for ax in fig.axes)
    events = [{"kind": "compute", "thread": 1, "start_us": 0, "end_us": 10, "name": "aten::mm"},
              {"kind": "all_gather", "thread": 2, "start_us": 5, "end_us": 20, "name": "gloo:all_gather"}]
    fig = H.plot_trace({"implicit": {"events": events}}, "a test CPU", note="test")
    ax = fig.axes[0]
    assert "a test CPU" in ax.get_title() and "(ms)" in ax.get_xlabel()


@pytest.mark.slow
def test_measured_traffic_and_memory_of_a_launch_match_the_graders_reference():
    """2 ranks, width 5 (padded to 6 rows): the collectives FSDP2 ran, as CollectiveLog counts them, are what the
    exercise's reference predicts for every setting; memory orders True < 2-free settings < False."""
    reports = H.run("reshard", 2, timeout=240, width=5, depth=2, settings="True,False,1,2")
    block = [[5, 5], [5]]
    for row in reports[0]["rows"]:
        want = R.reference_traffic(block, 2, row["setting"], 4, 4)
        got = {kind: row["collectives"][kind]["bytes_received"] for kind in want}
        assert got == {kind: 2 * value for kind, value in want.items()}, row["setting"]
    peaks = {str(row["setting"]): row["peak_parameter_bytes"] for row in reports[0]["rows"]}
    assert peaks["True"] == peaks["2"] < peaks["False"] == peaks["1"]


def test_shard_puts_its_mesh_on_the_cpu_even_where_torch_sees_a_gpu(monkeypatch, tmp_path):
    """FSDP2's default mesh is on the accelerator torch reports (``cuda:<rank>``): on an H200, lesson 17's demo of 4
    ranks failed with "invalid device ordinal". Its tensors live on the CPU, so ``shard`` builds a CPU mesh itself."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))  # what a GPU machine answers
        model = H.shard(H.stack(8, 2))
        weight = model[0][0].weight
        assert weight.device_mesh.device_type == "cpu" and weight.device.type == "cpu"
        model(torch.randn(3, 8)).sum().backward()  # and it trains there
        assert weight.grad is not None
    finally:
        dist.destroy_process_group()

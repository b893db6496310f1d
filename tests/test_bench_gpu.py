"""`make bench-gpu` (gpucourse.bench_gpu): refuses without CUDA, and every part runs and validates at tiny sizes.

The GPU sizes need a GPU; here the same code runs on the CPU in the test-only ``--tiny`` mode. No
assertion is on a time: only on what was written, what was left out and why, and the file's schema.
"""

from __future__ import annotations

import json

import pytest
import torch

from gpucourse import bench_gpu, reference


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny.json"
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = bench_gpu.main(["--device", "cpu", "--tiny", "--out", str(out)])
    return code, json.loads(out.read_text()), printed.getvalue()


@pytest.mark.bench
def test_tiny_cpu_run_writes_a_valid_reference(tiny_run):
    code, data, _ = tiny_run
    assert code == 0
    assert reference.validate(data) == []
    assert data["status"] == reference.STATUS and data["device"]["kind"] == "cpu"
    assert data["software"]["torch"] == torch.__version__ and data["commit"] and data["date"]
    assert "test mode" in data["note"]


@pytest.mark.bench
def test_names_match_the_shipped_reference_where_the_quantity_is_the_same(tiny_run):
    _, data, _ = tiny_run
    shipped = reference.load("h100").data["measurements"]
    for name in ("matmul_tflops", "resnet18_step_ms"):
        assert name in data["measurements"] and name in shipped
        assert shipped[name]["unit"] == data["measurements"][name]["unit"]
    labels = set(data["measurements"]["matmul_tflops"]["values"])
    assert {"float32 64", "float16 64", "bfloat16 64", "float32 63", "float32 72"} <= labels
    steps = set(data["measurements"]["resnet18_step_ms"]["values"])
    assert {"b2 32px fp32", "b2 32px amp bf16 channels_last", "b2 48px amp fp16"} <= steps
    assert "b2 32px fp32 item every step" in data["measurements"]["sync_loop_ms"]["values"]


@pytest.mark.bench
def test_what_a_cpu_cannot_measure_is_absent_with_a_reason_never_zero(tiny_run):
    _, data, _ = tiny_run
    absent = data["absent"]
    assert "tf32 64" in absent["matmul_tflops"] and "tf32 64" not in data["measurements"]["matmul_tflops"]["values"]
    for name in ("h2d_gbps", "copy_compute_overlap_ms", "resnet18_cuda_graph_ms", "resnet18_peak_mib"):
        assert name not in data["measurements"] and absent[name]
        assert all(isinstance(why, str) and why for why in absent[name].values())
    every_value = [v for m in data["measurements"].values() for v in m["values"].values()]
    assert every_value and all(v > 0 for v in every_value)


@pytest.mark.bench
def test_progress_names_every_part_as_it_starts_and_ends(tiny_run):
    _, _, printed = tiny_run
    for i, (title, _) in enumerate(bench_gpu.PARTS, 1):
        assert f"[{i}/{len(bench_gpu.PARTS)}] {title} ..." in printed
        assert f"[{i}/{len(bench_gpu.PARTS)}] {title} done in" in printed


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: bench-gpu would measure it")
def test_without_cuda_it_refuses_and_says_why(capsys, tmp_path):
    assert bench_gpu.main(["--out", str(tmp_path / "x.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_cpu_run_is_only_the_test_mode(capsys):
    assert bench_gpu.main(["--device", "cpu"]) == 2
    assert "--tiny" in capsys.readouterr().err


@pytest.mark.parametrize("name, short", [("NVIDIA H100 80GB HBM3", "H100"), ("Tesla T4", "T4"),
                                         ("NVIDIA GeForce RTX 4090", "4090"), ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB")])
def test_short_names(name, short):
    assert bench_gpu.short_name(name) == short

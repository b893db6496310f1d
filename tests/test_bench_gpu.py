"""`make bench-gpu` (gpucourse.bench_gpu): writes exactly the schema the lessons read, with each entry's
recipe; refuses without CUDA; gates TF32 and bfloat16 on the GPU's capability; every part runs at tiny sizes.

The GPU sizes need a GPU (`make test-gpu` runs `bench-gpu --quick`); here the same code runs on the CPU
in its ``--tiny`` dry run. No assertion is on a time: only on what was written, what was left
out and why, and the file's schema.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

import reference_fixture
from gpucourse import bench_gpu, reference


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = bench_gpu.main(["--device", "cpu", "--tiny", "--out", str(out)])
    return code, json.loads(out.read_text()), printed.getvalue()


@pytest.mark.bench
def test_tiny_cpu_run_writes_a_test_fixture_never_a_reference(tiny_run):
    code, data, _ = tiny_run
    assert code == 0
    assert reference.validate(data, fixture=True) == []
    assert any("only measured numbers" in p for p in reference.validate(data))  # never loads as a shipped file
    assert data["status"] == reference.FIXTURE_STATUS and data["device"]["kind"] == "cpu"
    assert data["software"]["torch"] == torch.__version__ and data["commit"] and data["date"]
    assert "test mode" in data["note"] and data["run"] == "tiny"


@pytest.mark.bench
def test_every_declared_measurement_is_measured_or_absent_with_a_reason(tiny_run):
    _, data, _ = tiny_run
    attempted = set(data["measurements"]) | set(data["absent"])
    assert attempted == set(reference.MEASUREMENTS)
    for name, m in data["measurements"].items():
        assert m["unit"] == reference.MEASUREMENTS[name].unit
        assert set(reference.RECIPE_KEYS) <= set(m["recipe"]), name
    assert "b2 32px fp32" in data["measurements"]["resnet18_step_ms"]["values"]
    assert "b2 32px fp32 item every step" in data["measurements"]["sync_loop_ms"]["values"]


@pytest.mark.bench
def test_what_a_cpu_cannot_measure_is_absent_with_a_reason_never_zero(tiny_run):
    _, data, _ = tiny_run
    absent = data["absent"]
    assert "tf32 64" in absent["matmul_tflops"] and "tf32 64" not in data["measurements"]["matmul_tflops"]["values"]
    for name in ("h2d_gbps", "copy_compute_overlap_ms", "resnet18_cuda_graph_ms", "resnet18_peak_mib",
                 "lesson11_gpu_profile_us", "lesson05_conv_ms"):
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


def test_the_fixture_holds_every_declared_label_through_the_writer(tmp_path):
    path = bench_gpu.write(reference_fixture.made_up(), tmp_path / "fixture.json")
    ref = reference.load(str(path))
    assert ref.fixture
    for name, declared in reference.MEASUREMENTS.items():
        assert set(ref.values(name)) == set(declared.labels), name
        assert ref.recipe(name) == bench_gpu.RECIPES[name]


def test_a_measured_file_with_an_unexplained_label_is_refused(tmp_path):
    data = reference_fixture.made_up()
    data["status"] = reference.STATUS
    data["device"] = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "short": "H100", "capability": "9.0"}
    data["measurements"]["h2d_gbps"]["values"].pop("pageable")
    with pytest.raises(RuntimeError, match=r"h2d_gbps\['pageable'\] was neither measured nor listed absent"):
        bench_gpu.write(data, tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()
    data["absent"] = {"h2d_gbps": {"pageable": "why not, in words"}}
    bench_gpu.write(data, tmp_path / "x.json")
    assert reference.load(str(tmp_path / "x.json")).missing("h2d_gbps", ["pageable"]).endswith("(why not, in words)")


def test_before_sm80_there_is_no_tf32_row_and_bfloat16_is_labelled_emulated(monkeypatch):
    """The capability gate, on a simulated T4 (sm 75): the matmul part's own labels and reasons."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    b = bench_gpu.Bench("cpu", bench_gpu.TINY)
    b.cuda, b.capability, b.has_tf32, b.bf16_native = True, (7, 5), False, False
    bench_gpu.matmul(b)
    values = b.measurements["matmul_tflops"]["values"]
    assert not any(label.startswith("tf32") for label in values)
    assert all("compute capability 8.0" in why and "sm 75" in why for why in b.absent["matmul_tflops"].values())
    assert {label for label in values if label.startswith("bfloat16")} == {f"bfloat16 {n} emulated" for n in (64, 63, 72)}
    assert "float16 64" in values and "float32 64" in values
    assert reference.MEASUREMENTS["matmul_tflops"].knows("bfloat16 8192 emulated")
    assert not reference.MEASUREMENTS["matmul_tflops"].knows("float16 8192 emulated")


def test_tf32_sets_matmul_and_cudnn_apart_and_restores_them():
    def read():
        return (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)

    before = read()
    with bench_gpu.tf32(False, True):
        assert read() == ("ieee", "tf32")
    with bench_gpu.tf32(True, False):
        assert read() == ("tf32", "ieee")
    assert read() == before


def test_pageable_sources_are_written_before_they_are_timed():
    from gpucourse import moving_data as transfer

    assert bench_gpu.filled_host is transfer.filled_host  # the bench's copies use lesson 5's buffers
    buffer = bench_gpu.filled_host(1, pinned=False)
    assert buffer.numel() == 2**20 and bool((buffer == 1).all())
    assert bool((transfer.filled_host(2) == 1).all())


def test_the_lessons_kernel_is_read_from_the_solutions_notebook():
    pytest.importorskip("triton")
    kernel = bench_gpu.lesson_kernel()
    assert callable(kernel) and kernel.__name__ == "scaled_add"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: bench-gpu would measure it")
def test_without_cuda_it_refuses_and_says_why(capsys, tmp_path):
    assert bench_gpu.main(["--out", str(tmp_path / "x.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_cpu_run_is_only_the_dry_run(capsys):
    assert bench_gpu.main(["--device", "cpu"]) == 2
    assert "--tiny" in capsys.readouterr().err


@pytest.mark.parametrize("name, short", [("NVIDIA H100 80GB HBM3", "H100"), ("Tesla T4", "T4"),
                                         ("NVIDIA GeForce RTX 4090", "4090"), ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB")])
def test_short_names(name, short):
    assert bench_gpu.short_name(name) == short


def test_keep_going_records_a_broken_part_and_still_measures_the_others(tmp_path, capsys):
    """On a short GPU lease one broken part must not lose the rest: with keep_going its traceback is kept
    under ``failed``, later parts run, and the partial file holds what was measured after every part."""
    def broken(b):
        raise ValueError("a part that breaks on this device")

    parts = [("broken part", broken), ("lesson 1: CPU processes", bench_gpu.lesson01)]
    partial = tmp_path / "ref.partial.json"
    data = bench_gpu.run("cpu", "tiny", parts=parts, keep_going=True, partial=partial)
    assert list(data["failed"]) == ["broken part"] and "ValueError: a part that breaks" in data["failed"]["broken part"]
    assert "lesson01_count_primes_speedup" in data["measurements"], "the part after the broken one did not run"
    assert json.loads(partial.read_text())["measurements"] == data["measurements"]
    with pytest.raises(ValueError, match="breaks on this device"):
        bench_gpu.run("cpu", "tiny", parts=parts)  # without keep_going a broken part stops the run, as before


def test_a_copy_without_git_names_its_commit(monkeypatch):
    monkeypatch.setenv("GPUCOURSE_COMMIT", "abc1234")
    assert bench_gpu.header({}, {}, "measured")["commit"].startswith("abc1234 ")


def test_full_timing_of_lesson_1_times_threads_at_1_2_and_every_core_only(monkeypatch):
    """On an H200 lease the full part (threads and processes at 6 worker counts, best of 3) outran its share of the
    time; held by the GIL, threads at other counts add nothing. Processes keep every count."""
    from gpucourse import processes_threads as P

    monkeypatch.setattr(P, "usable_cores", lambda: 16)
    calls = []
    monkeypatch.setattr(P, "time_run", lambda kind, fn, args, workers, repeats: calls.append((kind, workers, repeats)) or 1.0)
    b = bench_gpu.Bench("cpu", bench_gpu.MODES["full"], "full")
    bench_gpu.lesson01(b)
    measured = set(b.measurements["lesson01_count_primes_speedup"]["values"])
    assert measured == {"threads x1", "threads x2", "threads x16"} | {f"processes x{n}" for n in (1, 2, 4, 8, 16, 32)}
    assert set(b.absent["lesson01_count_primes_speedup"]) == {"threads x4", "threads x8", "threads x32"}
    assert {repeats for *_, repeats in calls} == {3}

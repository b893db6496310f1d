"""gpucourse.doctor and gpucourse.cuda (lesson 2's helpers)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from conftest import needs_cuda
from gpucourse import cuda as C
from gpucourse import doctor

BASE = dict(torch_version="2.x", cuda_build="12.8", hip_build=None, cuda_available=False, device_count=0)


def _problems(**facts) -> list[doctor.Finding]:
    return [f for f in doctor.diagnose(doctor.Facts(**{**BASE, **facts})) if f.level == "problem"]


@pytest.mark.parametrize("facts, says, fix", [
    (dict(cuda_build=None, driver_version="570.86"), "CPU-only build", "Install a CUDA build"),
    ({}, "no NVIDIA driver", "install the NVIDIA driver"),
    (dict(driver_version="470.57"), "driver is older", "Update the NVIDIA driver"),
    (dict(visible_devices=""), "hides every GPU", "Unset it"),
    (dict(visible_devices="-1", driver_version="570.86"), "hides every GPU", "Unset it"),
    (dict(cuda_build=None, xla_installed=True), "PJRT_DEVICE is not set", "PJRT_DEVICE=TPU"),
])
def test_each_problem_is_named_with_its_fix(facts, says, fix):
    problems = _problems(**facts)
    assert any(says in p.what and fix in p.fix for p in problems), problems


def test_a_working_gpu_and_a_cpu_only_laptop_are_not_problems():
    working = doctor.diagnose(doctor.Facts(**{**BASE, "cuda_available": True, "device_count": 1, "devices": ("NVIDIA L4",)}))
    assert [f.level for f in working] == ["ok"] and "NVIDIA L4" in working[0].what
    laptop = doctor.diagnose(doctor.Facts(**{**BASE, "cuda_build": None}))
    assert {f.level for f in laptop} == {"info"}
    mac = doctor.diagnose(doctor.Facts(**{**BASE, "cuda_build": None, "mps_built": True, "mps_available": True, "system": "Darwin"}))
    assert any(f.level == "ok" and "mps" in f.what for f in mac)


def test_gather_reads_this_machine(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    facts = doctor.gather()
    assert facts.torch_version == torch.__version__ and facts.visible_devices == ""
    assert "✗" in doctor.report(doctor.diagnose(facts)) or facts.cuda_available


def test_doctor_command_line():
    done = subprocess.run([sys.executable, "-m", "gpucourse", "doctor"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip()
    wrong = subprocess.run([sys.executable, "-m", "gpucourse", "nonsense"], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "usage" in wrong.stderr


def test_async_device_runs_in_order_and_in_the_background():
    device = C.AsyncDevice(cold_launches=1, cold_seconds=0.05)
    events = [device.launch(0.01) for _ in range(3)]
    assert not events[-1].is_set()  # launch returned before the work ran
    device.synchronize()
    assert all(e.is_set() for e in events) and device.launches == 3 and device.synchronizations == 1


def test_naive_timing_misses_the_work_that_a_synchronized_clock_sees():
    device = C.AsyncDevice()
    naive = C.naive_seconds(lambda: device.launch(0.02))
    device.synchronize()
    device = C.AsyncDevice(cold_launches=0)
    start = time.perf_counter()
    device.launch(0.02)
    device.synchronize()
    synced = time.perf_counter() - start
    assert naive < 0.02 <= synced  # the naive clock stops before the 20 ms of work; the synchronized one after


def test_sync_exercise_is_fourteen_lines_of_python():
    compile(C.SYNC_EXERCISE, "<exercise>", "exec")
    assert len(C.SYNC_EXERCISE.splitlines()) == 14


def test_tflops_arithmetic():
    assert C.matmul_tflops(1000, 2.0) == pytest.approx(1e-3)


@needs_cuda("CUDA events need a CUDA GPU")
def test_cuda_events_time_a_matmul():
    a = torch.randn(1024, 1024, device="cuda")
    assert C.cuda_event_ms(lambda: a @ a) > 0

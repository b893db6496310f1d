"""Which GPUs a process can really use (gpucourse.preamble.probe_cuda), the backend that follows the
tensors (gpucourse.launch.init_process_group, lessons 7, 13 and 14) and the doctor's old-driver finding
(lesson 2), on a CPU-only machine: 0, 1, 2 or 8 GPUs and the driver are pretended through NVML, the one
thing the probe asks in its own process."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from gpucourse import doctor, launch, preamble

NEW_DRIVER, OLD_DRIVER = ("580.65.06", "13.0", False), ("535.104.05", "12.2", False)  # version, CUDA, MIG


def pretend(monkeypatch, gpus: int, driver=NEW_DRIVER, build: str = "13.0"):
    """NVML reports ``gpus`` GPUs and ``driver`` (its version, the newest CUDA it runs, MIG mode); torch is built for
    ``build``. Asking the CUDA runtime itself would poison fork: here it fails the test instead."""
    monkeypatch.setattr(torch.version, "cuda", build)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: gpus)
    monkeypatch.setattr(preamble, "_nvml_facts", lambda: driver)

    def poisons_fork():
        raise AssertionError("the probe asked the CUDA runtime in this process: a later fork would be poisoned")

    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", poisons_fork)


# --- can this process really run CUDA ---------------------------------------------------------------

@pytest.mark.parametrize("gpus", [0, 1, 2, 8])
def test_the_probe_counts_what_nvml_sees_when_the_driver_is_new_enough(monkeypatch, gpus):
    pretend(monkeypatch, gpus)
    probe = preamble.probe_cuda()
    assert (probe.count, probe.seen) == (gpus, gpus)
    assert preamble.cuda_available() is (gpus > 0)
    assert preamble.accelerator_count("cuda") == gpus


def test_a_driver_too_old_for_the_torch_build_means_no_usable_gpu(monkeypatch):
    pretend(monkeypatch, 2, OLD_DRIVER, build="13.0")
    probe = preamble.probe_cuda()
    assert probe.count == 0 and probe.seen == 2
    assert "535.104.05" in probe.reason and "12.2" in probe.reason and "13.0" in probe.reason
    assert preamble.pick_device() == torch.device("cpu")


def test_a_newer_minor_version_runs_on_an_older_driver_of_the_same_major(monkeypatch):
    pretend(monkeypatch, 1, OLD_DRIVER, build="12.8")  # CUDA's minor-version compatibility
    assert preamble.probe_cuda().count == 1


@pytest.mark.parametrize("answer, count, words", [
    ({"library": True, "status": 0, "error": "", "driver_cuda": 13000, "count": 1}, 1, ""),  # a MIG slice
    ({"library": True, "status": 35, "error": "CUDA_ERROR_INSUFFICIENT_DRIVER", "driver_cuda": 12020, "count": 0},
     0, "12.2"),
    ({"library": True, "status": 0, "error": "", "driver_cuda": 12020, "count": 1}, 0, "12.2"),
    ({"library": True, "status": 100, "error": "CUDA_ERROR_NO_DEVICE", "driver_cuda": 13000, "count": 0}, 0, "no GPU"),
    ({"library": True, "status": 999, "error": "CUDA_ERROR_UNKNOWN", "driver_cuda": 13000, "count": 0}, 0, "UNKNOWN"),
    ({"library": False}, 0, "no NVIDIA driver"),
])
def test_where_nvml_cannot_count_a_child_process_asks_the_driver(monkeypatch, answer, count, words):
    pretend(monkeypatch, -1, (None, None, False))  # MIG device names in CUDA_VISIBLE_DEVICES: torch's NVML count gives up
    asked = []
    monkeypatch.setattr(preamble, "_ask_a_child", lambda visible: asked.append(visible) or answer)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-4f5e6d7c-0000-1111-2222-333344445555")
    probe = preamble.probe_cuda()
    assert asked == ["MIG-4f5e6d7c-0000-1111-2222-333344445555"]
    assert probe.count == count and words in probe.reason


def test_on_mig_nvml_counts_boards_so_the_driver_is_asked(monkeypatch):
    pretend(monkeypatch, 2, ("580.65.06", "13.0", True))  # two boards in MIG mode, no device names given
    monkeypatch.setattr(preamble, "_ask_a_child", lambda visible: {"library": True, "status": 0, "error": "",
                                                                    "driver_cuda": 13000, "count": 1})
    probe = preamble.probe_cuda()
    assert probe.count == 1 and probe.driver == "580.65.06"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert launch.gpu_per_rank() is False  # one slice cannot serve two ranks


def test_the_child_probe_really_runs_and_answers():
    found = preamble._ask_a_child.__wrapped__(os.environ.get("CUDA_VISIBLE_DEVICES"))
    assert isinstance(found.get("library"), bool)
    if found["library"]:  # a machine with the driver's library: it said how it went
        assert {"status", "driver_cuda", "count"} <= set(found)


def test_a_gpu_cell_skips_with_the_reason_when_the_driver_is_too_old(monkeypatch, capsys):
    pretend(monkeypatch, 2, OLD_DRIVER)
    here = preamble.Setup(seed=0, device=torch.device("cpu"), smoke=True)
    monkeypatch.delenv("GPUCOURSE_REQUIRE", raising=False)
    assert here.needs("cuda") is False
    out = capsys.readouterr().out
    assert out.startswith("Skipped:") and "535.104.05" in out and "gpucourse doctor" in out
    monkeypatch.setenv("GPUCOURSE_REQUIRE", "cuda")
    with pytest.raises(RuntimeError, match="runs CUDA up to 12.2"):
        here.needs("cuda")


def test_a_machine_without_gpus_skips_without_blaming_a_driver(monkeypatch, capsys):
    pretend(monkeypatch, 0)
    monkeypatch.delenv("GPUCOURSE_REQUIRE", raising=False)
    assert preamble.Setup(0, torch.device("cpu"), True).needs("cuda") is False
    assert "driver" not in capsys.readouterr().out


# --- the backend follows the tensors ------------------------------------------------------------------

@pytest.fixture
def started(monkeypatch):
    """Record what init_process_group would start (backend, GPU chosen) instead of starting it."""
    seen = {"set_device": []}
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(backend=backend))
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: seen["set_device"].append(index))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    return seen


@pytest.mark.parametrize("gpus", [0, 1, 2, 8])
def test_cpu_tensors_get_gloo_whatever_gpus_there_are(monkeypatch, started, gpus):
    pretend(monkeypatch, gpus)
    assert launch.init_process_group(device="cpu") == torch.device("cpu")
    assert started["backend"] == "gloo" and started["set_device"] == []


@pytest.mark.parametrize("gpus", [2, 8])
def test_cuda_tensors_get_nccl_and_a_gpu_per_rank(monkeypatch, started, gpus):
    pretend(monkeypatch, gpus)
    assert launch.init_process_group(device="cuda") == torch.device("cuda", 1)
    assert started["backend"] == "nccl" and started["set_device"] == [1]
    assert launch.init_process_group(device="cpu,cuda") == torch.device("cuda", 1)
    assert started["backend"] == "cpu:gloo,cuda:nccl"  # a demo with tensors on both: each device its backend


@pytest.mark.parametrize("gpus, driver", [(0, NEW_DRIVER), (1, NEW_DRIVER), (2, OLD_DRIVER)])
def test_cuda_with_fewer_usable_gpus_than_ranks_is_a_clear_error(monkeypatch, started, gpus, driver):
    pretend(monkeypatch, gpus, driver)
    with pytest.raises(RuntimeError, match="one usable GPU per rank") as error:
        launch.init_process_group(device="cuda")
    assert "2 rank(s)" in str(error.value) and "device='cpu'" in str(error.value)
    if driver is OLD_DRIVER:
        assert "535.104.05" in str(error.value)
    assert "backend" not in started  # nothing was started


@pytest.mark.parametrize("gpus, backend", [(0, "gloo"), (1, "gloo"), (2, "nccl"), (8, "nccl")])
def test_auto_takes_gpus_only_when_every_rank_has_one(monkeypatch, started, gpus, backend):
    pretend(monkeypatch, gpus)  # lessons 1 and 7: the driver moves its model to the device returned
    device = launch.init_process_group()
    assert started["backend"] == backend and device.type == ("cuda" if backend == "nccl" else "cpu")


def test_auto_falls_back_to_gloo_when_the_driver_is_too_old(monkeypatch, started):
    pretend(monkeypatch, 8, OLD_DRIVER)
    assert launch.init_process_group() == torch.device("cpu") and started["backend"] == "gloo"


def test_an_unknown_device_is_refused(started):
    with pytest.raises(ValueError, match="where the collectives' tensors live"):
        launch.init_process_group(device="tpu")


def test_labels_read_the_backend_from_the_records():
    assert launch.backend_of([{"backend": "gloo"}, {"backend": "gloo"}]) == "gloo"
    with pytest.raises(ValueError, match="different backends"):
        launch.backend_of([{"backend": "gloo"}, {"backend": "nccl"}])
    with pytest.raises(ValueError, match="dist.get_backend"):
        launch.backend_of([{"rank": 0}])


def test_lesson_13s_check_starts_gloo_for_its_cpu_model_with_gpus_present(monkeypatch):
    from gpucourse.checks.lesson13_sharded_data_parallel import drive_sharded_adam

    pretend(monkeypatch, 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")

    class Started(Exception):
        pass

    def record(backend, **kw):
        raise Started(backend)

    monkeypatch.setattr(dist, "init_process_group", record)
    with pytest.raises(Started, match="^gloo$"):
        drive_sharded_adam({})


# Two real ranks: every rank is told of 8 GPUs by NVML (and a driver new enough), as on a multi-GPU
# machine, then runs a lesson's demo. Before the backend followed the tensors they picked NCCL and died.
WITH_EIGHT_GPUS = """
import sys, torch
import gpucourse.preamble as P
torch.cuda.is_available = lambda: True  # what torch says on such a machine under PYTORCH_NVML_BASED_CUDA_CHECK=1
torch.cuda.device_count = lambda: 8
torch.cuda._device_count_nvml = lambda: 8
P._nvml_facts = lambda: ("580.65.06", "13.0", False)
torch.version.cuda = "13.0"
import {module} as demo
sys.exit(demo.main())
"""


@pytest.mark.parametrize("module, demo", [("gpucourse.sharded_data_parallel", ["collectives", "--numel", "10"]),
                                          ("gpucourse.communication", ["sweep", "--smallest", "4096", "--largest", "4096",
                                                               "--repeats", "1"])])
@pytest.mark.slow  # a torchrun launch per lesson demo (about 18 s each): `make test`, not `make test-fast`
def test_lesson_demos_run_on_gloo_with_cpu_tensors_when_gpus_are_reported(tmp_path, module, demo):
    script = tmp_path / "with_eight_gpus.py"
    script.write_text(WITH_EIGHT_GPUS.format(module=module))
    out = tmp_path / "out"
    run = launch.torchrun([str(script), *demo, "--out", str(out)], nproc=2, timeout=240)
    assert run.returncode == 0, run.output[-4000:]
    reports = list(launch.read_rank_reports(out).values())
    assert [r["backend"] for r in reports] == ["gloo", "gloo"]
    if module == "gpucourse.sharded_data_parallel":
        assert all(r["equal"] for r in reports)


# --- the doctor ---------------------------------------------------------------------------------------

def test_the_doctor_names_an_old_driver_the_cuda_it_needs_and_both_fixes():
    facts = doctor.Facts(torch_version="2.14.1+cu130", cuda_build="13.0", hip_build=None, cuda_available=False,
                         device_count=0, driver_version="535.104.05", driver_cuda="12.2", gpus_seen=2, nvidia_smi=True)
    findings = doctor.diagnose(facts)
    problem = findings[0]
    assert problem.level == "problem"
    assert "535.104.05" in problem.what and "12.2" in problem.what and "13.0" in problem.what
    assert "older torch" in problem.fix and "update the NVIDIA driver" in problem.fix and "CUDA 12.x" in problem.fix
    assert sum(f.level == "problem" for f in findings) == 1  # one diagnosis, not the generic one beside it


def test_the_doctor_gathers_an_old_driver_without_raising(monkeypatch, capsys):
    from gpucourse.__main__ import main

    pretend(monkeypatch, 2, OLD_DRIVER)
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # Lightning sets it: torch would then say "available"
    facts = doctor.gather()
    assert facts.cuda_available is False and facts.gpus_seen == 2 and facts.driver_cuda == "12.2"
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "✗ The NVIDIA driver 535.104.05 runs CUDA up to 12.2" in out and "fix:" in out


def test_the_doctor_reports_what_cuda_said_when_it_refuses_to_start(monkeypatch):
    pretend(monkeypatch, 1)

    def refuses(index):
        raise RuntimeError("CUDA error: system has unsupported display driver / cuda driver combination")

    monkeypatch.setattr(torch.cuda, "get_device_name", refuses)
    facts = doctor.gather()
    assert facts.cuda_available is False and "unsupported display driver" in facts.cuda_error
    problem = doctor.diagnose(facts)[0]
    assert problem.level == "problem" and "unsupported display driver" in problem.what


def test_the_doctor_says_what_the_driver_answered_where_cuda_does_not_start(monkeypatch):
    pretend(monkeypatch, -1, (None, None, False))
    monkeypatch.setattr(preamble, "_ask_a_child", lambda visible: {"library": True, "status": 999, "driver_cuda": 13000,
                                                                    "error": "CUDA_ERROR_UNKNOWN", "count": 0})
    facts = doctor.gather()
    assert facts.cuda_available is False and "CUDA_ERROR_UNKNOWN" in facts.cuda_error
    assert "CUDA_ERROR_UNKNOWN" in doctor.diagnose(facts)[0].what

"""Every device-dependent path of the course, on each machine students run it on (CI has no GPU).

``tests/cuda_fork_simulator.py`` pretends a machine (``PROFILES``: no GPU, 1, 2 or 8 GPUs, a T4 (sm_75),
an A100 (sm_80), an H100 (sm_90), a driver too old for this torch, MIG slices). Under each, the helpers
of ``gpucourse`` that branch on the device run in this process, and a few notebook cells that do run in
a kernel. A run fails on a crash (any error but the simulator's ``NoRealGPU``, raised where real GPU
work would start), on CUDA initialized before a fork (C++ initialization included), and on a label that
does not match what the device runs: no "TF32" or plain "bfloat16" row where the GPU has neither.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

import cuda_fork_simulator as sim
from conftest import SOLUTIONS, execute_notebook, read

TESTS = Path(__file__).resolve().parent
GPU_PROFILES = [name for name, p in sim.PROFILES.items() if p.cuda_gpus > 0]
# What each machine's torch answers: (is_available with the NVML check, device_count before and after
# CUDA initialization, compute capability major, native bfloat16 and TF32)
EXPECTED = {"cpu": (False, 0, 0, None, False), "1gpu": (True, 1, 1, 9, True), "2xT4": (True, 2, 2, 7, False),
            "8gpu": (True, 8, 8, 9, True), "sm_75": (True, 1, 1, 7, False), "sm_80": (True, 1, 1, 8, True),
            "sm_90": (True, 1, 1, 9, True), "old-driver": (True, 1, 0, None, False), "mig": (True, 2, 1, 8, True)}


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """``machine(profile)``: pretend it in this process until the test ends; returns the event log."""
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)  # restored after: install pops it
    log = tmp_path / "events.jsonl"

    def simulate(profile: str) -> Path:
        sim.install(str(log), profile=profile)
        log.touch()
        return log

    yield simulate
    sim.uninstall()


def nvml_checked() -> None:
    """What the preamble and Lightning do before asking: the NVML-based check, which leaves fork usable."""
    import os

    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"


def test_every_profile_is_checked_and_uninstall_puts_torch_back(machine):
    assert set(EXPECTED) == set(sim.PROFILES)
    originals = (torch.cuda.get_device_properties, torch.Tensor.pin_memory, torch.zeros, torch._C._cuda_getDeviceCount)
    machine("sm_75")
    assert torch.cuda.get_device_properties is not originals[0] and torch.zeros is not originals[2]
    sim.uninstall()
    assert (torch.cuda.get_device_properties, torch.Tensor.pin_memory, torch.zeros,
            torch._C._cuda_getDeviceCount) == originals
    assert "pin_memory" not in vars(torch.Tensor)  # inherited from TensorBase before, and again now
    with pytest.raises(ValueError, match="unknown profile"):
        sim.install("unused", profile="sm_70")


@pytest.mark.parametrize("profile", list(EXPECTED))
def test_the_simulated_torch_answers_as_the_machine_would(profile, machine):
    available, before, after, major, native = EXPECTED[profile]
    log = machine(profile)
    nvml_checked()
    assert torch.cuda.is_available() is available
    assert torch.cuda.device_count() == before
    assert sim.read_events(log) == []  # NVML only: no CUDA state yet
    if profile == "old-driver":
        with pytest.raises(RuntimeError, match=r"driver on your system is too old \(found version 12040\)"):
            torch.cuda.get_device_capability()
        with pytest.raises(RuntimeError, match="too old"):
            torch.zeros(1, device="cuda")
    elif major is None:
        assert not torch.cuda.is_bf16_supported()
    else:
        assert torch.cuda.get_device_capability()[0] == major
        assert torch.cuda.is_bf16_supported(including_emulation=False) is native
        assert torch.cuda.is_bf16_supported()  # emulated before sm_80: torch says yes all the same
        assert torch.cuda.is_tf32_supported() is native
        assert torch.cuda.device_count() == after  # after initialization: what CUDA can use (MIG: one slice)
        with pytest.raises(sim.NoRealGPU):
            torch.zeros(1, device="cuda")
        assert any(e["kind"] == "cuda_state" for e in sim.read_events(log))


# Each line leaves CUDA state in the process on a GPU without passing through torch.cuda._lazy_init.
CPP_PATHS = {
    "stream": "torch.cuda.Stream()",
    "pinned tensor": "torch.ones(4).pin_memory()",
    "pinned factory": "torch.empty(4, pin_memory=True)",
    "pinned DataLoader": ("list(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), "
                          "batch_size=2, pin_memory=True))"),
    "memory history": "torch.cuda.memory._record_memory_history(max_entries=10)",
    "rng state": "torch.cuda.get_rng_state()",
    "set_device": "torch.cuda.set_device(0)",
    "is_available without NVML": "torch.cuda.is_available()",
}
NVML_ONLY = "torch.cuda.is_available(); torch.cuda.device_count(); torch.manual_seed(0)"
FORK_CASES = [["1gpu", name, line] for name, line in CPP_PATHS.items()] + [
    [profile, f"NVML only, {profile}", NVML_ONLY] for profile in ("2xT4", "8gpu", "mig")]
FORK_SCRIPT = """
import contextlib, json, os, sys, torch
sys.path.insert(0, {tests!r})
import cuda_fork_simulator as sim
sim.install({log!r})
outcome = {{}}
for profile, name, line in json.loads({cases!r}):
    read, write = os.pipe()
    if os.fork() == 0:  # a fresh process without CUDA state, on its machine, for each case
        sim.install({log!r}, profile=profile)
        if name != "is_available without NVML":
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        with contextlib.suppress(sim.NoRealGPU):
            exec(line)
        if os.fork() == 0:  # its child touches CUDA, as a DataLoader worker or ddp_notebook rank does
            try:
                torch.zeros(1, device="cuda")
                said = "no error"
            except RuntimeError as error:
                said = str(error)
            os.write(write, said.encode()); os._exit(0)
        os.wait(); os._exit(0)
    os.wait(); os.close(write)
    outcome[name] = os.read(read, 4096).decode()
print(json.dumps(outcome))
"""


@pytest.fixture(scope="module")
def forks(tmp_path_factory) -> tuple[dict[str, str], list[dict]]:
    """Every case of ``FORK_CASES`` in one interpreter (one torch import): what each grandchild's CUDA
    call said, and the events."""
    log = tmp_path_factory.mktemp("forks") / "events.jsonl"
    script = FORK_SCRIPT.format(tests=str(TESTS), log=str(log), cases=json.dumps(FORK_CASES))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), sim.read_events(log)


def test_cuda_initialized_from_cpp_is_caught_before_a_fork(forks):
    said, events = forks
    assert set(said) == {name for _, name, _ in FORK_CASES}
    for name, line in CPP_PATHS.items():
        assert sim.REAL_ERROR in said[name], f"{name}: a fork after `{line}` was not caught ({said[name]!r})"
    violations = [e for e in events if e["kind"] == "violation"]
    assert len(violations) == len(CPP_PATHS) and all(e["child"] for e in violations)
    assert sum("pinned host memory" in e["what"] for e in events if e["kind"] == "cuda_state") >= 3


def test_a_fork_after_nvml_queries_alone_stays_usable_on_every_gpu_machine(forks):
    said, _ = forks
    for profile in ("2xT4", "8gpu", "mig"):
        answer = said[f"NVML only, {profile}"]  # the grandchild reached the (simulated) GPU, no fork error
        assert sim.REAL_ERROR not in answer and "simulated machine" in answer, (profile, answer)


# The gpucourse helpers that branch on the device ---------------------------------------------------------

@pytest.mark.parametrize("profile", list(EXPECTED))
def test_the_preamble_picks_a_device_that_can_run(profile, machine):
    """A driver too old for this torch: the CPU, though NVML sees the GPU. MIG: the slices CUDA can use
    (one), not NVML's boards (two). The preamble asks the driver outside torch; the simulator answers."""
    from gpucourse import preamble

    machine(profile)
    usable = sim.PROFILES[profile].cuda_gpus
    S = preamble.setup(seed=0, quiet=True)
    assert S.device.type == ("cuda" if usable else "cpu")
    assert preamble.accelerator_count("cuda") == usable
    assert S.needs("cuda", count=2) is (usable >= 2)


@pytest.mark.parametrize("profile", list(EXPECTED))
def test_autocast_and_recipes_are_labelled_with_what_the_device_runs(profile, machine):
    from gpucourse import mixed_precision as amp

    machine(profile)
    nvml_checked()
    usable = sim.PROFILES[profile].cuda_gpus
    device = torch.device("cuda" if usable else "cpu")
    choice = amp.autocast_choice(device)
    recipes = amp.recipes(choice.dtype)
    assert len(recipes) == 4 and recipes[3].channels_last  # lesson 4 indexes the list
    for recipe in recipes:
        assert ("TF32" in recipe.name) == recipe.tf32 or not recipe.tf32 and "no TF32" in recipe.name, recipe
        if recipe.amp_dtype is not None:
            assert str(recipe.amp_dtype).removeprefix("torch.") in recipe.name
    if not usable:
        assert choice.device_type == "cpu"
        return
    major, minor = sim.PROFILES[profile].capability
    assert f"compute capability {major}.{minor}" in choice.reason
    if major < 8:  # a T4: float16 with a scaler, no TF32 row
        assert choice.dtype == torch.float16 and choice.needs_scaler and "no native bfloat16" in choice.reason
        assert not any(r.tf32 for r in recipes) and recipes[1].name == "float32 (no TF32 on compute capability 7.5)"
    else:
        assert choice.dtype == torch.bfloat16 and not choice.needs_scaler
        assert [r.name for r in recipes][:2] == ["float32", "TF32"]


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_matmul_precisions_are_measured_only_as_labelled(profile, machine, monkeypatch, capsys):
    from gpucourse import tensor_cores as T

    machine(profile)
    nvml_checked()
    monkeypatch.setattr(T, "matmul_tflops", lambda m, n, k, dtype, device, min_seconds: {
        (torch.float32, "ieee"): 1.0, (torch.float32, "tf32"): 8.0}.get(
        (dtype, torch.backends.cuda.matmul.fp32_precision), 16.0))  # what ran: dtype and float32 precision
    rates = T.precision_rates(64, "cuda", min_seconds=0.01)
    native = sim.PROFILES[profile].capability[0] >= 8
    if native:
        assert rates == {"float32 (TF32 off)": 1.0, "TF32": 8.0, "float16": 16.0, "bfloat16": 16.0}
    else:
        assert rates == {"float32 (TF32 off)": 1.0, "float16": 16.0}
        printed = capsys.readouterr().out
        assert "Skipped TF32: no TF32 on Tesla T4 (compute capability 7.5)" in printed
        assert "Skipped bfloat16: bfloat16 is emulated" in printed
        with pytest.raises(ValueError, match="no TF32"):
            T.precision_rates(64, "cuda", names=["TF32"])


@pytest.mark.parametrize("profile", list(EXPECTED))
def test_the_other_helpers_that_ask_the_device(profile, machine):
    from gpucourse import bench, cpu_gpu_cuda as cuda, kernels, moving_data as transfer

    machine(profile)
    nvml_checked()
    p = sim.PROFILES[profile]
    cores = cuda.this_machine_cores()
    if p.cuda_gpus:
        assert cores[f"this machine: {p.name}\nSMs (multi_processor_count)"] == p.multi_processor_count
        assert kernels.cache_bytes("cuda") == p.L2_cache_size
        with pytest.raises(sim.NoRealGPU):  # past its own checks, at the first copy to the GPU
            transfer.overlap_ms(megabytes=1, batches=2, size=64, matmuls=1)
        assert bench.accelerator(quick=True, budget=None)["name"] == p.name
    else:  # no GPU, or one that CUDA cannot start: the CPU's cores only, and a clear refusal
        assert len(cores) == 1
        with pytest.raises(RuntimeError, match="need a CUDA GPU|driver on your system is too old"):
            transfer.overlap_ms(megabytes=1, batches=2, size=64, matmuls=1)


class PlanOnly:
    """A bench budget that records what it would run."""

    skipped: list = []

    def __init__(self):
        self.planned = []

    def run(self, label, work):
        self.planned.append(label)


@pytest.mark.parametrize("profile", ["1gpu", "2xT4", "8gpu", "mig"])
def test_the_benchmark_plans_runs_on_gpus_cuda_can_use(profile, machine):
    from gpucourse import bench

    machine(profile)
    nvml_checked()
    budget = PlanOnly()
    bench.lesson07(quick=True, budget=budget)
    usable = sim.PROFILES[profile].cuda_gpus
    expected = ["cpu 1 processes", "cpu 2 processes"] + (["cuda 1 processes", f"cuda {usable} processes"]
                                                          if usable >= 2 else [])
    assert budget.planned == expected


# Notebook cells that branch on the device, in a kernel under the machine ----------------------------------

# (notebook, cells run in order); the last cell of each branches on S.device and then starts GPU work
CELLS = {"lesson03": ("lesson03_tensor_cores/tensor_cores.ipynb", [1, 4, 10, 14]),
         "lesson04": ("lesson04_mixed_precision/mixed_precision.ipynb", [1, 3, 27])}
PROBE = ("import json; print('PROBE', json.dumps({'device': str(S.device), 'choice': str(choice.dtype), "
         "'recipes': [[r.name, r.tf32] for r in chosen]}))")


def run_cells(profile: str, tmp_path: Path) -> tuple[dict[str, tuple[str, list[str]]], list[dict]]:
    """One kernel: the simulator, then each notebook's chosen cells. Per cell its printed text and errors;
    and the simulator's events."""
    log = tmp_path / "events.jsonl"
    log.touch()
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(
        f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
        f"import cuda_fork_simulator; cuda_fork_simulator.install({str(log)!r}, profile={profile!r})"))
    where = []
    for key, (path, indices) in CELLS.items():
        source = read(SOLUTIONS / path)
        for index in indices:
            nb.cells.append(nbformat.v4.new_code_cell(source.cells[index].source))
            where.append(f"{key}[{index}]")
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    where.append("probe")
    execute_notebook(nb, tmp_path, timeout=300, allow_errors=True)
    result = {}
    for name, cell in zip(["install"] + where, nb.cells):
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        errors = [f"{o['ename']}: {o['evalue'][:300]}" for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        result[name] = (text, errors)
    return result, sim.read_events(log)


# One kernel per machine, about 35 s on 2 busy CPU cores: the two answers lessons 3 and 4 branch on (TF32
# and native bfloat16, or neither). The machines that differ in counts or drivers are judged above.
@pytest.mark.slow
@pytest.mark.parametrize("profile", ["sm_75", "sm_90"])
def test_device_cells_of_lessons_3_and_4_label_what_the_machine_runs(profile, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUCOURSE_REQUIRE", raising=False)
    cells, events = run_cells(profile, tmp_path)
    assert not cells["install"][1], cells["install"]
    crashes = {name: errors for name, (_, errors) in cells.items() if any(not e.startswith("NoRealGPU") for e in errors)}
    assert not crashes, f"cells that fail for another reason than wanting a real GPU: {crashes}"
    assert cells["lesson04[27]"][1], "lesson 4's timing cell never reached the GPU work: the check saw nothing"
    assert not [e for e in events if e["kind"] == "violation"]
    probe = json.loads(cells["probe"][0].split("PROBE", 1)[1])
    assert probe["device"] == "cuda"
    recipes = dict((name, tf32) for name, tf32 in probe["recipes"])
    precisions = cells["lesson03[14]"][0]
    if sim.PROFILES[profile].capability[0] < 8:
        assert probe["choice"] == "torch.float16" and not any(recipes.values())
        assert "TF32" not in " ".join(recipes).replace("no TF32", "")
        assert "Skipped TF32" in precisions and "Skipped bfloat16" in precisions
    else:
        assert probe["choice"] == "torch.bfloat16" and recipes["TF32"] is True
        assert "Skipped" not in precisions

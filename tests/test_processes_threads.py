"""gpucourse.preamble and gpucourse.processes_threads (lesson 1's helpers)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle

import pytest

from gpucourse import processes_threads as P
from gpucourse import preamble


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("0", False), ("", False), ("off", False)])
def test_smoke_mode_reads_the_variable(monkeypatch, value, expected):
    monkeypatch.setenv(preamble.SMOKE_ENV, value)
    assert preamble.smoke_mode() is expected


def test_smoke_mode_rejects_nonsense(monkeypatch):
    monkeypatch.setenv(preamble.SMOKE_ENV, "maybe")
    with pytest.raises(ValueError, match="GPUCOURSE_SMOKE"):
        preamble.smoke_mode()


def test_setup_seeds_and_picks_sizes(monkeypatch, capsys):
    import torch

    monkeypatch.setenv(preamble.SMOKE_ENV, "1")
    first = preamble.setup(seed=3)
    a = torch.rand(3)
    preamble.setup(seed=3)
    assert torch.equal(a, torch.rand(3))
    assert first.smoke and first.size(100, 2) == 2
    assert first.device.type in {"cpu", "cuda", "mps"}
    assert "smoke run" in capsys.readouterr().out


def test_needs_reports_missing_accelerators(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    here = preamble.Setup(seed=0, device=torch.device("cpu"), smoke=True)
    assert here.needs("cuda") is False
    assert "Skipped: this cell needs 1 CUDA device; this machine has 0" in capsys.readouterr().out
    assert here.needs("tpu", count=8) is False
    assert "8 TPU devices" in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown accelerator"):
        here.needs("gpu")


def test_needs_counts_visible_gpus(monkeypatch):
    import torch

    # the usable GPUs as preamble.probe_cuda counts them (NVML and the driver, never CUDA in this process)
    monkeypatch.setattr(preamble, "probe_cuda", lambda: preamble.CudaProbe(count=2, seen=2))
    here = preamble.Setup(seed=0, device=torch.device("cuda"), smoke=False)
    assert here.needs("cuda", count=2) and not here.needs("cuda", count=4)


def test_count_primes_counts():
    assert P.count_primes(2) == 0
    assert P.count_primes(30) == 10
    assert P.count_primes(1000) == 168


def test_hash_rounds_is_sha256_of_the_blocks():
    block = bytes(range(256)) * 4096
    assert P.hash_rounds(3) == hashlib.sha256(block * 3).hexdigest()


@pytest.mark.parametrize("kind", ["serial", "threads", "processes"])
def test_runners_keep_order(kind):
    assert P.RUNNERS[kind](P.square, [3, 1, 2], 2) == [9, 1, 4]


def test_threads_stay_in_process_and_processes_leave_it():
    in_threads = {pid for _, pid, _ in P.run_threads(P.worker_identity, range(4), 2)}
    in_processes = {pid for _, pid, _ in P.run_processes(P.worker_identity, range(4), 2)}
    assert in_threads == {os.getpid()}
    assert os.getpid() not in in_processes


def test_square_chain_squares_base_modulo_the_public_modulus_in_sequence():
    base = 3 ** 500 % P.MODULUS
    for squarings in (0, 1, 2, 37):
        assert P.square_chain((("a", 2 ** 70), base, squarings)) == (("a", 2 ** 70), pow(base, 2 ** squarings, P.MODULUS))
    assert P.MODULUS.bit_length() == 2048 and P.MODULUS % 2 == 1


def test_square_chain_spends_its_cpu_time_in_the_process_that_runs_it():
    import time

    start = time.process_time()
    chains = [P.square_chain((1, 5, 20_000)), P.square_chain((2, 7, 20_000))]
    in_this_process = time.process_time() - start
    start = time.process_time()
    assert P.run_processes(P.square_chain, [(1, 5, 20_000), (2, 7, 20_000)], 2) == chains
    assert time.process_time() - start < in_this_process / 2  # the pool's processes did the work


def test_asyncio_runner_works_inside_a_running_loop():
    async def inside():
        return P.run_asyncio(P.wait_io_async, [0.01, 0.02], 2)

    assert P.run_asyncio(P.wait_io_async, [0.01], 1) == [0.01]
    assert asyncio.run(inside()) == [0.01, 0.02]


def test_time_run_rejects_bad_input():
    with pytest.raises(ValueError, match="kind"):
        P.time_run("gpu", P.square, [1], 1)
    with pytest.raises(ValueError, match="at least 1"):
        P.time_run("threads", P.square, [1], 0)
    with pytest.raises(ValueError, match="coroutine"):
        P.time_run("asyncio", P.count_primes, [10], 1)


def test_measure_speedups_and_plot():
    import matplotlib

    matplotlib.use("Agg")
    rows = P.measure_speedups(P.wait_io, [0.02] * 4, ["threads", "asyncio"], [1, 4])
    assert [(r.kind, r.workers) for r in rows] == [("serial", 1), ("threads", 1), ("threads", 4), ("asyncio", 1), ("asyncio", 4)]
    assert all(r.seconds > 0 for r in rows)
    ax = P.plot_speedups(rows, cores=2)
    assert {line.get_label() for line in ax.get_lines()} >= {"threads", "asyncio", "2 usable cores"}
    with pytest.raises(ValueError):
        P.plot_speedups(rows[:1])


def test_interpreter_facts():
    facts = P.interpreter_facts()
    assert facts["usable_cores"] >= 1
    assert facts["default_start_method"] in facts["start_methods"]


def test_pool_startup_for_every_method():
    for method in P.mp.get_all_start_methods():
        assert P.pool_startup_seconds(method, workers=1, repeats=1) > 0


def test_datasets():
    primes = P.PrimeCountingDataset(3, 10)
    assert [primes[i] for i in range(3)] == [4, 4, 5]  # primes below 10, 11 and 12 (11 is prime)
    with pytest.raises(IndexError):
        primes[3]
    with pytest.raises(ValueError):
        P.PrimeCountingDataset(-1, 10)
    who = P.WhoLoadsDataset(2)
    assert who[1] == (1, os.getpid())
    assert pickle.loads(pickle.dumps(primes)).limit == 10


def test_open_file_dataset_cannot_be_pickled(tmp_path):
    path = P.write_int_lines(tmp_path / "n.txt", [1, 2])
    broken = P.OpenFileLinesDataset(path)
    assert broken[1] == 2
    with pytest.raises(TypeError):
        pickle.dumps(broken)
    broken.file.close()


def test_loader_seconds_runs_workers():
    assert P.loader_seconds(P.PrimeCountingDataset(4, 50), num_workers=2, epochs=2, persistent_workers=True) > 0


def test_run_python_script_reports_exit_code_and_output():
    code, output = P.run_python_script("import sys\nprint('hi')\nsys.exit(3)")
    assert (code, output.strip()) == (3, "hi")


@pytest.mark.bench
def test_bench_quick_writes_the_report(tmp_path, capsys):
    import json

    from gpucourse import bench

    assert bench.main(["--out", str(tmp_path), "--quick"]) == 0
    results = json.loads((tmp_path / "lesson01.json").read_text())
    assert {r["workload"] for r in results["speedups"]} == {"count_primes", "hash_rounds", "wait_io"}
    report = (tmp_path / "report.md").read_text()
    assert "| `count_primes` |" in report
    assert (tmp_path / "lesson01.png").stat().st_size > 0
    ddp = json.loads((tmp_path / "lesson07.json").read_text())
    cpu = ddp["comparisons"]["cpu/gloo"]  # every run of a comparison on one device and backend
    assert set(cpu) >= {"1", "2"} and all(r["identical_weights"] for r in cpu.values())
    assert all((r["device"], r["backend"]) == ("cpu", "gloo") for r in cpu.values())
    assert "### cpu/gloo" in report and "[bench] lesson01: started" in capsys.readouterr().out
    acc = json.loads((tmp_path / "accelerator.json").read_text())
    assert all(rate > 0 for rate in acc["matmul_tflops"].values())
    assert all(step["ms_per_step"] > 0 for step in acc["resnet18_steps"].values()) and len(acc["resnet18_steps"]) == 2
    assert "ResNet-18 training step" in report
    if acc["device"] == "cpu":
        assert acc["copy_gbps"].startswith("skipped") and "skipped" in report


def test_bench_parts_stop_starting_measurements_when_their_budget_is_spent():
    from gpucourse import bench

    spent = bench.Budget("lesson01", 0.0)
    results = bench.lesson01(quick=True, budget=spent)
    assert results["speedups"] == [] and results["pool_startup_ms"] == {} and results["loader_items_per_s"] == {}
    assert "count_primes serial" in results["skipped"] and any("DataLoader" in s for s in results["skipped"])
    assert "skipped for its time budget: count_primes serial" in bench.report(results, 0.0)

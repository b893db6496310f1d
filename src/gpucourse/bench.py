"""`make bench`: the course's performance report, measured on this machine.

Lesson 1 (processes, threads and the GIL): speedup against worker count for a GIL-holding,
a GIL-releasing and a waiting workload, pool start-up per start method, and DataLoader
throughput against ``num_workers``. Lesson 7 (DDP as scripts): samples per second of the same
DDP training script on 1 and 2 processes, every run on the CPU with gloo, and on 1 and every GPU with
NCCL when there are 2 or more (never a cuda/nccl run beside a cpu/gloo one). Lessons 3-5 on the CPU:
matmul TFLOP/s at aligned and misaligned sizes and a ResNet-18 training step in float32 and under
autocast; on a GPU machine this part points to ``make bench-gpu`` (``gpucourse.bench_gpu``), which
measures the GPU properly. Writes ``report.md``, ``lesson01.json``, ``lesson01.png``, ``lesson07.json``
and ``accelerator.json``.

Each part has a time budget (``BUDGETS``, ``QUICK_BUDGETS``) and prints a line as it starts and ends;
a part checks its budget between measurements, and what it had no time left for is listed as skipped
(in the JSON and the report), never measured short.

    python -m gpucourse.bench --out bench/results [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from gpucourse import processes_threads as P


# Seconds each part may start new measurements for (one already running finishes); --quick's sizes
# take seconds, and their budgets only catch a machine far slower than expected.
BUDGETS = {"lesson01": 240.0, "lesson07": 150.0, "accelerator": 90.0}
QUICK_BUDGETS = {"lesson01": 120.0, "lesson07": 120.0, "accelerator": 120.0}


class Budget:
    """A part's time budget: ``run`` measures while time is left, and notes what it skipped."""

    def __init__(self, part: str, seconds: float):
        self.part, self.seconds, self.start = part, seconds, time.perf_counter()
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def run(self, label: str, fn):
        if self.left() <= 0:
            self.skipped.append(label)
            return None
        return fn()


def lesson01(quick: bool, budget: Budget) -> dict:
    """Full-size versions of the lesson's measurements (``quick``: the notebook's smoke sizes)."""
    cores = P.usable_cores()
    workers = [1, 2, 4] if quick else sorted({1, 2, 4, 8, cores, 2 * cores})
    repeats = 1 if quick else 3
    tasks = 4 if quick else max(8, 2 * cores)
    rows = []
    plan = [(P.count_primes, [15_000 if quick else 150_000] * tasks, ["threads", "processes"], workers),
            (P.hash_rounds, [4 if quick else 48] * tasks, ["threads", "processes"], workers),
            (P.wait_io, [0.02 if quick else 0.1] * 16, ["threads", "processes", "asyncio"], [1, 4, 16])]
    for fn, args, kinds, counts in plan:
        serial = budget.run(f"{fn.__name__} serial", lambda: P.time_run("serial", fn, args, 1, repeats))
        if serial is None:
            continue
        rows.append(P.Measurement(fn.__name__, "serial", 1, serial, 1.0))
        for kind in kinds:
            for n in counts:
                seconds = budget.run(f"{fn.__name__} {kind} {n}", lambda: P.time_run(kind, fn, args, n, repeats))
                if seconds is not None:
                    rows.append(P.Measurement(fn.__name__, kind, n, seconds, serial / seconds))
    startup = {m: 1000 * s for m in P.mp.get_all_start_methods()
               if (s := budget.run(f"pool start-up {m}", lambda m=m: P.pool_startup_seconds(m))) is not None}
    dataset = P.PrimeCountingDataset(16 if quick else 96, 3_000 if quick else 20_000)
    loader = {w: len(dataset) / s for w in sorted({0, 1, 2, cores})
              if (s := budget.run(f"DataLoader num_workers={w}", lambda w=w: P.loader_seconds(dataset, w))) is not None}
    return {"facts": P.interpreter_facts(), "speedups": [r.as_dict() for r in rows],
            "pool_startup_ms": startup, "loader_items_per_s": loader, "skipped": budget.skipped}


def _ddp_run(nproc: int, device: str, steps: int, per_rank: int, hidden: int) -> dict:
    import tempfile

    from gpucourse.launch import read_rank_reports, torchrun

    with tempfile.TemporaryDirectory() as out:
        launch = torchrun(["-m", "gpucourse.ddp_scripts", "--steps", str(steps), "--per-rank", str(per_rank),
                           "--hidden", str(hidden), "--device", device, "--out", out], nproc=nproc)
        if launch.returncode != 0:
            raise RuntimeError(f"the DDP script failed on {nproc} processes ({device}):\n{launch.output[-2000:]}")
        reports = list(read_rank_reports(out).values())
    return {"device": reports[0]["device"].split(":")[0], "backend": reports[0]["backend"],
            "samples_per_second": reports[0]["samples_per_second"],
            "ms_per_step": 1000 * max(r["seconds_per_step"] for r in reports),
            "identical_weights": len({r["weights_checksum"] for r in reports}) == 1,
            "launch_seconds": launch.seconds}


def lesson07(quick: bool, budget: Budget) -> dict:
    """``python -m gpucourse.ddp_scripts`` under torchrun: samples/s and ms/step per process count, each
    comparison on one device and backend: cpu/gloo always, cuda/nccl on 1 and every GPU when there are 2+."""
    import torch

    steps, per_rank, hidden = (8, 16, 32) if quick else (60, 256, 1024)
    plan = {"cpu": [1, 2]}
    gpus = torch.cuda.device_count()  # NVML's count: with MIG, boards rather than the slices CUDA can use
    if gpus >= 2:
        torch.cuda.init()  # after initialization torch counts what CUDA can use (the runs are torchrun processes)
        gpus = torch.cuda.device_count()
    if gpus >= 2:
        plan["cuda"] = [1, gpus]
    comparisons = {}
    for device, counts in plan.items():
        for nproc in counts:
            run = budget.run(f"{device} {nproc} processes", lambda: _ddp_run(nproc, device, steps, per_rank, hidden))
            if run is not None:
                comparisons.setdefault(f"{run['device']}/{run['backend']}", {})[str(nproc)] = run
    return {"steps": steps, "per_rank": per_rank, "hidden": hidden, "comparisons": comparisons,
            "skipped": budget.skipped}


def accelerator(quick: bool, budget: Budget) -> dict:
    """Lessons 3-5's measurements on the CPU. On a CUDA machine: measured by ``make bench-gpu`` instead."""
    import torch
    import torchvision

    from gpucourse import mixed_precision as amp, tensor_cores
    from gpucourse.reference import this_machine

    if torch.cuda.is_available():
        return {"device": "cuda", "name": torch.cuda.get_device_name(0),
                "see": "make bench-gpu (python -m gpucourse.bench_gpu): matmul per dtype, ResNet-18 recipes, "
                       "copies, overlap, sync and CUDA graphs, written as a GPU reference file"}
    base = 128 if quick else 512
    aligned = budget.run("matmul", lambda: tensor_cores.alignment_benchmark(
        base, torch.float32, "cpu", min_seconds=0.05 if quick else 0.5))
    batch = 4 if quick else 32
    images, labels = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    steps = {}
    for label, step_dtype in (("float32", None), ("autocast bfloat16", torch.bfloat16)):
        def one(step_dtype=step_dtype):
            torch.manual_seed(0)
            model = torchvision.models.resnet18(num_classes=10)
            return {"ms_per_step": 1000 * amp.train_step_seconds(model, images, labels, step_dtype,
                                                                  steps=2 if quick else 10), "peak_mib": None}
        measured = budget.run(f"ResNet-18 {label}", one)
        if measured is not None:
            steps[label] = measured
    return {"device": "cpu", "name": this_machine("cpu"), "matmul_dtype": "torch.float32",
            "matmul_tflops": aligned or {}, "resnet18_batch": batch, "resnet18_steps": steps,
            "copy_gbps": "skipped: pinned memory and host-to-GPU copies need an NVIDIA GPU (make bench-gpu)",
            "skipped": budget.skipped}


def _best(rows: list[dict], workload: str, kind: str) -> dict:
    return max((r for r in rows if r["workload"] == workload and r["kind"] == kind), key=lambda r: r["speedup"])


def report(results: dict, seconds: float) -> str:
    facts, rows = results["facts"], results["speedups"]
    lines = [
        "# gpucourse benchmark report",
        "",
        f"Machine: {platform.platform()}, {facts['usable_cores']} usable cores, Python {facts['python']} "
        f"(GIL {'on' if facts['gil_enabled'] else 'off'}), default start method `{facts['default_start_method']}`. "
        f"Took {seconds:.0f} s.",
        "",
        "## Lesson 1: best speedup over serial (workers in brackets)",
        "",
        "| workload | threads | processes | asyncio |",
        "|---|---|---|---|",
    ]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        cells = []
        for kind in ("threads", "processes", "asyncio"):
            if any(r["workload"] == workload and r["kind"] == kind for r in rows):
                best = _best(rows, workload, kind)
                cells.append(f"{best['speedup']:.2f}x ({best['workers']})")
            else:
                cells.append("-")
        lines.append(f"| `{workload}` | " + " | ".join(cells) + " |")
    lines += ["", "Pool start-up (2 workers, first answers back): " + ", ".join(
        f"{m} {ms:.0f} ms" for m, ms in results["pool_startup_ms"].items()), "",
        "DataLoader items/s by num_workers: " + ", ".join(
        f"{w}: {v:.0f}" for w, v in results["loader_items_per_s"].items()), ""]
    if results.get("skipped"):
        lines += [f"Lesson 1, skipped for its time budget: {', '.join(results['skipped'])}", ""]
    if "lesson07" in results:
        ddp = results["lesson07"]
        lines += ["## Lesson 7: one DDP training script on N processes", "",
                  f"TinyNet (hidden {ddp['hidden']}), {ddp['per_rank']} samples per process per step, {ddp['steps']} steps. "
                  "Each table compares runs on one device and backend only.", ""]
        for pair, runs in ddp["comparisons"].items():
            lines += [f"### {pair}", "", "| processes | samples/s | ms/step | identical weights |", "|---|---|---|---|"]
            lines += [f"| {n} | {r['samples_per_second']:.0f} | {r['ms_per_step']:.1f} | "
                      f"{'yes' if r['identical_weights'] else 'NO'} |" for n, r in runs.items()]
            lines.append("")
        if ddp["skipped"]:
            lines += [f"Skipped for the time budget: {', '.join(ddp['skipped'])}", ""]
    if "accelerator" in results:
        acc = results["accelerator"]
        if "see" in acc:
            lines += [f"## Lessons 3-5 on {acc['name']}", "", f"Not measured here: see {acc['see']}.", ""]
        else:
            lines += [f"## Lessons 3-5 on {acc['device']} ({acc['name']})", "",
                      f"Matmul TFLOP/s, {acc['matmul_dtype']}, square sizes: " + (", ".join(
                          f"{n}: {t:.3f}" for n, t in acc["matmul_tflops"].items()) or "skipped (budget)"), "",
                      f"ResNet-18 training step, batch {acc['resnet18_batch']} of 32x32 images: " + (", ".join(
                          f"{k} {v['ms_per_step']:.1f} ms" for k, v in acc["resnet18_steps"].items()) or "skipped"), "",
                      f"Host-to-GPU copies: {acc['copy_gbps']}", ""]
            if acc["skipped"]:
                lines += [f"Skipped for the time budget: {', '.join(acc['skipped'])}", ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [P.Measurement(**r) for r in results["speedups"]]
    workloads = list(dict.fromkeys(r.workload for r in rows))
    if not workloads:
        return  # every speedup was skipped for the budget: the report says so
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for workload, ax in zip(workloads, axes[0]):
        P.plot_speedups([r for r in rows if r.workload == workload], ax=ax, cores=results["facts"]["usable_cores"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--quick", action="store_true", help="the notebooks' smoke sizes (seconds, not minutes)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()  # the whole bench, processes and all: a report line, not a measurement
    results: dict = {}
    for part, fn in (("lesson01", lesson01), ("lesson07", lesson07), ("accelerator", accelerator)):
        budget = Budget(part, (QUICK_BUDGETS if args.quick else BUDGETS)[part])
        print(f"[bench] {part}: started (budget {budget.seconds:.0f} s)", flush=True)
        measured = fn(args.quick, budget)
        if part == "lesson01":
            results.update(measured)
        else:
            results[part] = measured
        (args.out / f"{part}.json").write_text(json.dumps(measured, indent=2))
        skipped = f", skipped for the budget: {len(budget.skipped)}" if budget.skipped else ""
        print(f"[bench] {part}: done in {time.perf_counter() - budget.start:.0f} s{skipped}", flush=True)
    seconds = time.perf_counter() - start
    plot(results, args.out / "lesson01.png")
    text = report(results, seconds)
    (args.out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

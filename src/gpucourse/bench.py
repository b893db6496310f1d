"""`make bench`: the course's performance report, measured on this machine.

Lesson 1 (processes, threads and the GIL): speedup against worker count for a GIL-holding,
a GIL-releasing and a waiting workload, pool start-up per start method, and DataLoader
throughput against ``num_workers``. Lesson 7 (DDP as scripts): samples per second of the same
DDP training script on 1 and 2 processes, and on every GPU when there are 2 or more. Lessons 3-5
on the best device here (a CUDA GPU when there is one): matmul TFLOP/s at aligned and misaligned
sizes, a ResNet-18 training step in float32 and under autocast (with peak memory on a GPU), and
pageable vs pinned host-to-GPU bandwidth (GPU only). Writes ``report.md``, ``lesson01.json``,
``lesson01.png``, ``lesson07.json`` and ``accelerator.json``.

    python -m gpucourse.bench --out bench/results [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from gpucourse import parallel as P


def lesson01(quick: bool) -> dict:
    """Full-size versions of the lesson's measurements (``quick``: the notebook's smoke sizes)."""
    cores = P.usable_cores()
    workers = [1, 2, 4] if quick else sorted({1, 2, 4, 8, cores, 2 * cores})
    repeats = 1 if quick else 3
    tasks = 4 if quick else max(8, 2 * cores)
    rows = []
    rows += P.measure_speedups(P.count_primes, [15_000 if quick else 150_000] * tasks, ["threads", "processes"], workers, repeats)
    rows += P.measure_speedups(P.hash_rounds, [4 if quick else 48] * tasks, ["threads", "processes"], workers, repeats)
    rows += P.measure_speedups(P.wait_io, [0.02 if quick else 0.1] * 16, ["threads", "processes", "asyncio"],
                               [1, 4, 16], repeats)
    startup = {m: P.pool_startup_seconds(m) for m in P.mp.get_all_start_methods()}
    dataset = P.PrimeCountingDataset(16 if quick else 96, 3_000 if quick else 20_000)
    loader = {w: len(dataset) / P.loader_seconds(dataset, w) for w in sorted({0, 1, 2, cores})}
    return {
        "facts": P.interpreter_facts(),
        "speedups": [r.as_dict() for r in rows],
        "pool_startup_ms": {m: 1000 * s for m, s in startup.items()},
        "loader_items_per_s": loader,
    }


def lesson07(quick: bool) -> dict:
    """``python -m gpucourse.ddp_scripts`` under torchrun: samples/s and ms/step per process count."""
    import tempfile

    import torch

    from gpucourse.launch import read_rank_reports, torchrun

    steps, per_rank, hidden = (8, 16, 32) if quick else (60, 256, 1024)
    runs = {}
    counts = [1, 2] + ([torch.cuda.device_count()] if torch.cuda.device_count() > 2 else [])
    for nproc in counts:
        with tempfile.TemporaryDirectory() as out:
            launch = torchrun(["-m", "gpucourse.ddp_scripts", "--steps", str(steps), "--per-rank", str(per_rank),
                                 "--hidden", str(hidden), "--out", out], nproc=nproc)
            if launch.returncode != 0:
                raise RuntimeError(f"the DDP script failed on {nproc} processes:\n{launch.output[-2000:]}")
            reports = list(read_rank_reports(out).values())
        runs[str(nproc)] = {"device": reports[0]["device"], "backend": reports[0]["backend"],
                            "samples_per_second": reports[0]["samples_per_second"],
                            "ms_per_step": 1000 * max(r["seconds_per_step"] for r in reports),
                            "identical_weights": len({r["weights_checksum"] for r in reports}) == 1,
                            "launch_seconds": launch.seconds}
    return {"steps": steps, "per_rank": per_rank, "hidden": hidden, "runs": runs}


def accelerator(quick: bool) -> dict:
    """Lessons 3-5's measurements on the best device here; what needs CUDA says why it was skipped."""
    import torch
    import torchvision

    from gpucourse import amp, tensor_cores, transfer

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    name = torch.cuda.get_device_name(0) if cuda else (platform.processor() or platform.machine())
    dtype = torch.float16 if cuda else torch.float32
    base = (1024 if quick else 8192) if cuda else (128 if quick else 512)
    aligned = tensor_cores.alignment_benchmark(base, dtype, device, min_seconds=0.05 if quick else 0.5)

    batch = (16 if quick else 128) if cuda else (4 if quick else 32)
    images = torch.randn(batch, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)
    low = torch.float16 if cuda else torch.bfloat16
    steps = {}
    for label, step_dtype in (("float32", None), (f"autocast {str(low).removeprefix('torch.')}", low)):
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=10).to(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        seconds = amp.train_step_seconds(model, images, labels, step_dtype, steps=2 if quick else 10)
        steps[label] = {"ms_per_step": 1000 * seconds,
                        "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None}

    copies = ({str(pinned): transfer.copy_gbps(16 if quick else 256, pinned) for pinned in (False, True)}
              if cuda else "skipped: pinned memory and host-to-GPU copies need an NVIDIA GPU")
    return {"device": device, "name": name, "matmul_dtype": str(dtype), "matmul_tflops": aligned,
            "resnet18_batch": batch, "resnet18_steps": steps, "copy_gbps": copies}


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
    if "lesson07" in results:
        ddp = results["lesson07"]
        lines += ["## Lesson 7: one DDP training script on N processes", "",
                  f"TinyNet (hidden {ddp['hidden']}), {ddp['per_rank']} samples per process per step, {ddp['steps']} steps.", "",
                  "| processes | device (backend) | samples/s | ms/step | identical weights |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {r['device']} ({r['backend']}) | {r['samples_per_second']:.0f} | {r['ms_per_step']:.1f} | "
                  f"{'yes' if r['identical_weights'] else 'NO'} |" for n, r in ddp["runs"].items()]
        lines.append("")
    if "accelerator" in results:
        acc = results["accelerator"]
        lines += [f"## Lessons 3-5 on {acc['device']} ({acc['name']})", "",
                  f"Matmul TFLOP/s, {acc['matmul_dtype']}, square sizes: " + ", ".join(
                      f"{n}: {t:.3f}" for n, t in acc["matmul_tflops"].items()), "",
                  f"ResNet-18 training step, batch {acc['resnet18_batch']} of 32x32 images: " + ", ".join(
                      f"{k} {v['ms_per_step']:.1f} ms" + (f" ({v['peak_mib']:.0f} MiB peak)" if v["peak_mib"] else "")
                      for k, v in acc["resnet18_steps"].items()), "",
                  "Host-to-GPU copies: " + (acc["copy_gbps"] if isinstance(acc["copy_gbps"], str) else
                                            f"pageable {acc['copy_gbps']['False']:.1f} GB/s, pinned {acc['copy_gbps']['True']:.1f} GB/s"),
                  ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [P.Measurement(**r) for r in results["speedups"]]
    workloads = list(dict.fromkeys(r.workload for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4))
    for workload, ax in zip(workloads, axes):
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
    results = lesson01(args.quick)
    (args.out / "lesson01.json").write_text(json.dumps(results, indent=2))
    results["lesson07"] = lesson07(args.quick)
    (args.out / "lesson07.json").write_text(json.dumps(results["lesson07"], indent=2))
    results["accelerator"] = accelerator(args.quick)
    (args.out / "accelerator.json").write_text(json.dumps(results["accelerator"], indent=2))
    seconds = time.perf_counter() - start
    plot(results, args.out / "lesson01.png")
    text = report(results, seconds)
    (args.out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

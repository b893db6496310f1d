"""`make bench-gpu`: a new GPU reference, measured on this machine in a few minutes.

Writes one JSON file in the schema of ``gpucourse.reference`` (``validate()`` passes; status
"measured, not estimated"; device, versions, date and commit read from this machine), with the
measurements lessons 2-5 and 11 plot beside a learner's own, under the names the shipped H100 file
uses where the quantity is the same, so a lesson can read either file:

- ``matmul_tflops``: square matmul, float32 / TF32 / float16 / bfloat16 at 8192 (aligned), 8191 and 8200;
- ``resnet18_step_ms`` and ``resnet18_peak_mib``: one ResNet-18 training step (SGD momentum), float32,
  TF32, AMP float16 and AMP bfloat16, each with and without channels_last, batch 128 at 32x32 pixels
  (launch-bound) and at 224x224 (compute-bound);
- ``h2d_gbps``: host-to-GPU copies of 256 MiB, pageable and pinned;
- ``copy_compute_overlap_ms``: a pinned copy and a matmul, serial on one stream and with the copy on a side stream;
- ``sync_loop_ms``: the launch-bound step with ``loss.item()`` every step, and without any synchronization;
- ``resnet18_cuda_graph_ms``: the launch-bound step, eager and captured whole in one CUDA graph.

    python -m gpucourse.bench_gpu [--out FILE]

Every time is the median of ``torch.utils.benchmark`` (``blocked_autorange``) with a synchronize inside
the timed statement. Without CUDA it refuses. ``--device cpu --tiny`` exists for the test suite only: every
part at tiny sizes, what a CPU cannot measure (TF32, pinned copies, streams, CUDA graphs, GPU memory) left
out of ``values`` and listed under ``absent`` with the reason, never written as zero.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from gpucourse import reference


@dataclass(frozen=True)
class Sizes:
    matmul: tuple[int, ...]
    resnet: tuple[tuple[int, int], ...]  # (batch, pixels): launch-bound first
    copy_mib: int
    overlap_matmul: int
    loop_steps: int
    min_run_time: float
    warmup: int


FULL = Sizes(matmul=(8192, 8191, 8200), resnet=((128, 32), (128, 224)), copy_mib=256, overlap_matmul=8192,
             loop_steps=20, min_run_time=0.4, warmup=3)
TINY = Sizes(matmul=(64, 63, 72), resnet=((2, 32), (2, 48)), copy_mib=1, overlap_matmul=64,
             loop_steps=2, min_run_time=0.01, warmup=1)
MATMUL_DTYPES = {"float32": (torch.float32, False), "tf32": (torch.float32, True),
                 "float16": (torch.float16, False), "bfloat16": (torch.bfloat16, False)}
RECIPES = {"fp32": (None, False), "tf32": (None, True), "amp fp16": (torch.float16, False),
           "amp bf16": (torch.bfloat16, False)}  # each also run with channels_last


class Bench:
    """The measurements so far, what could not be measured and why, and the progress line."""

    def __init__(self, device: str, sizes: Sizes):
        self.device, self.sizes, self.cuda = device, sizes, device == "cuda"
        self.measurements: dict[str, dict] = {}
        self.absent: dict[str, dict[str, str]] = {}

    def seconds(self, fn: Callable[[], object]) -> float:
        """Median seconds per call of ``fn``, synchronized so that GPU work is inside the time."""
        from torch.utils import benchmark

        sync = torch.cuda.synchronize if self.cuda else (lambda: None)

        def run():
            fn()
            sync()

        for _ in range(self.sizes.warmup):
            run()
        timer = benchmark.Timer("run()", globals={"run": run})
        return timer.blocked_autorange(min_run_time=self.sizes.min_run_time).median

    def put(self, name: str, label: str, value: float, what: str, unit: str, method: str) -> None:
        entry = self.measurements.setdefault(name, {"what": what, "unit": unit, "method": method,
                                                    "source": "make bench-gpu (gpucourse.bench_gpu)", "values": {}})
        entry["values"][label] = round(float(value), 3)

    def skip(self, name: str, label: str, why: str) -> None:
        self.absent.setdefault(name, {})[label] = why


def tf32(enabled: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def matmul(b: Bench) -> None:
    for label, (dtype, use_tf32) in MATMUL_DTYPES.items():
        for n in b.sizes.matmul:
            if use_tf32 and not b.cuda:
                b.skip("matmul_tflops", f"{label} {n}", "TF32 is an NVIDIA Tensor Core format: no CPU has it")
                continue
            tf32(use_tf32)
            x = torch.randn(n, n, device=b.device, dtype=dtype)
            y = torch.randn(n, n, device=b.device, dtype=dtype)
            b.put("matmul_tflops", f"{label} {n}", 2 * n**3 / b.seconds(lambda: x @ y) / 1e12,
                  "square matmul n x n, TFLOP/s (2 n^3 / time); tf32 = float32 with allow_tf32", "TFLOP/s",
                  "torch.utils.benchmark median")
    tf32(False)


def resnet_step(b: Bench, batch: int, pixels: int, amp: torch.dtype | None, channels_last: bool):
    """A ResNet-18 training step (SGD momentum, as in the H100 probe) and its model, on ``b.device``."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).to(b.device)
    x = torch.randn(batch, 3, pixels, pixels, device=b.device)
    y = torch.randint(0, 10, (batch,), device=b.device)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(b.device, enabled=b.cuda and amp == torch.float16)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(b.device, dtype=amp or torch.float32, enabled=amp is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    return step


def resnet18(b: Bench) -> None:
    if b.cuda:
        torch.backends.cudnn.benchmark = True
    for batch, pixels in b.sizes.resnet:
        for recipe, (amp, use_tf32) in RECIPES.items():
            for channels_last in (False, True):
                label = f"b{batch} {pixels}px {recipe}{' channels_last' if channels_last else ''}"
                if use_tf32 and not b.cuda:
                    for name in ("resnet18_step_ms", "resnet18_peak_mib"):
                        b.skip(name, label, "TF32 is an NVIDIA Tensor Core format: no CPU has it")
                    continue
                tf32(use_tf32)
                step = resnet_step(b, batch, pixels, amp, channels_last)
                if b.cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                b.put("resnet18_step_ms", label, 1000 * b.seconds(step),
                      "ResNet-18 training step (SGD momentum), batch and image size in the label", "ms",
                      "torch.utils.benchmark median")
                if b.cuda:
                    b.put("resnet18_peak_mib", label, torch.cuda.max_memory_allocated() / 2**20,
                          "peak GPU memory allocated during the timed steps", "MiB", "torch.cuda.max_memory_allocated")
                else:
                    b.skip("resnet18_peak_mib", label, "peak memory is read from the CUDA caching allocator")
    tf32(False)


def copies(b: Bench) -> None:
    if not b.cuda:
        for label in ("pageable", "pinned"):
            b.skip("h2d_gbps", label, "a host-to-GPU copy needs a GPU")
        return
    for pinned in (False, True):
        host = torch.empty(b.sizes.copy_mib * 2**20 // 4, dtype=torch.float32, pin_memory=pinned)
        device = torch.empty_like(host, device="cuda")
        seconds = b.seconds(lambda: device.copy_(host, non_blocking=True))
        b.put("h2d_gbps", "pinned" if pinned else "pageable", host.numel() * 4 / seconds / 1e9,
              f"host-to-GPU copy bandwidth, {b.sizes.copy_mib} MiB", "GB/s", "torch.utils.benchmark median")


def overlap(b: Bench) -> None:
    labels = ("copy only", "matmul only", "serial, one stream", "copy on a side stream")
    if not b.cuda:
        for label in labels:
            b.skip("copy_compute_overlap_ms", label, "copy/compute overlap needs CUDA streams")
        return
    n = b.sizes.overlap_matmul
    host = torch.empty(b.sizes.copy_mib * 2**20 // 4, dtype=torch.float32, pin_memory=True)
    target = torch.empty_like(host, device="cuda")
    x = torch.randn(n, n, device="cuda")
    side = torch.cuda.Stream()

    def serial():
        target.copy_(host, non_blocking=True)  # queued on the default stream: the matmul waits for it
        x @ x

    def side_stream():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            target.copy_(host, non_blocking=True)
        x @ x  # runs while the copy engine copies
        torch.cuda.current_stream().wait_stream(side)

    runs = (lambda: target.copy_(host, non_blocking=True), lambda: x @ x, serial, side_stream)
    for label, fn in zip(labels, runs):
        b.put("copy_compute_overlap_ms", label, 1000 * b.seconds(fn),
              f"a pinned {b.sizes.copy_mib} MiB host-to-GPU copy and a float32 {n}x{n} matmul", "ms",
              "torch.utils.benchmark median")


def sync_loop(b: Bench) -> None:
    batch, pixels = b.sizes.resnet[0]
    step = resnet_step(b, batch, pixels, None, False)
    steps = b.sizes.loop_steps

    def every_step():
        return [step().item() for _ in range(steps)]  # .item() waits for the GPU each time

    def no_sync():
        return [step().detach() for _ in range(steps)]  # read later, once

    for label, fn in (("item every step", every_step), ("no sync", no_sync)):
        b.put("sync_loop_ms", f"b{batch} {pixels}px fp32 {label}", 1000 * b.seconds(fn) / steps,
              f"ResNet-18 training step in a loop of {steps}, ms per step", "ms", "torch.utils.benchmark median")


def cuda_graph(b: Bench) -> None:
    """The launch-bound step, eager and replayed from one CUDA graph (as probe_cuda_graphs.py did)."""
    batch, pixels = b.sizes.resnet[0]
    for recipe, amp, channels_last in (("fp32", None, False), ("amp bf16 channels_last", torch.bfloat16, True)):
        base = f"b{batch} {pixels}px {recipe}"
        if not b.cuda:
            for mode in ("eager", "cuda graph"):
                b.skip("resnet18_cuda_graph_ms", f"{base} {mode}", "CUDA graphs need CUDA")
            continue
        import torchvision

        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=10).cuda()
        x = torch.randn(batch, 3, pixels, pixels, device="cuda")
        y = torch.randint(0, 10, (batch,), device="cuda")
        if channels_last:
            model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            optimizer.zero_grad(set_to_none=False)  # a graph replays into the same gradient buffers
            with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None, cache_enabled=False):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            return loss

        warm = torch.cuda.Stream()  # capture needs warm-up iterations on a side stream
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(warm)
        b.put("resnet18_cuda_graph_ms", f"{base} eager", 1000 * b.seconds(step),
              "ResNet-18 training step at 32x32, eager vs captured whole in one CUDA graph", "ms",
              "torch.utils.benchmark median")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        b.put("resnet18_cuda_graph_ms", f"{base} cuda graph", 1000 * b.seconds(graph.replay),
              "ResNet-18 training step at 32x32, eager vs captured whole in one CUDA graph", "ms",
              "torch.utils.benchmark median")


PARTS: list[tuple[str, Callable[[Bench], None]]] = [
    ("matmul per dtype", matmul), ("ResNet-18 step", resnet18), ("host-to-GPU copies", copies),
    ("copy/compute overlap", overlap), ("synchronizing loop", sync_loop), ("CUDA graph", cuda_graph)]


def short_name(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``: the first word with a digit, after the vendor."""
    words = [w for w in name.replace("NVIDIA", "").split() if w not in ("Tesla", "GeForce")]
    return next((w for w in words if re.search(r"\d", w)), words[0] if words else "gpu")


def machine(device: str) -> tuple[dict, dict]:
    import torchvision

    software = {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__}
    if device != "cuda":
        return {"kind": "cpu", "name": reference.this_machine("cpu"), "short": "cpu",
                "cpu_cores": os.cpu_count()}, software
    props = torch.cuda.get_device_properties(0)
    software.update(cuda=torch.version.cuda, cudnn=str(torch.backends.cudnn.version()))
    found = {"kind": "cuda", "name": props.name, "short": short_name(props.name), "sms": props.multi_processor_count,
             "memory_mib": props.total_memory // 2**20, "cpu_cores": os.cpu_count()}
    try:
        found["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=20).stdout.split()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        pass  # no nvidia-smi here: the driver stays unnamed rather than guessed
    return found, software


def commit() -> str:
    try:
        run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=20,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return run.stdout.strip() if run.returncode == 0 and run.stdout.strip() else "unknown (not a git checkout)"


def progress(parts, device: str):
    """One line per part as it starts and ends (tqdm's bar over the parts where tqdm is installed)."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    bar = tqdm(total=len(parts), desc=f"bench-gpu on {device}", unit="part", file=sys.stdout) if tqdm else None
    for i, (title, fn) in enumerate(parts, 1):
        (bar.write if bar else print)(f"[{i}/{len(parts)}] {title} ...")
        start = time.perf_counter()
        yield fn
        (bar.write if bar else print)(f"[{i}/{len(parts)}] {title} done in {time.perf_counter() - start:.1f} s")
        if bar:
            bar.update(1)
    if bar:
        bar.close()


def run(device: str, tiny: bool) -> dict:
    """Measure every part and return the reference's data (not yet written)."""
    bench = Bench(device, TINY if tiny else FULL)
    for fn in progress(PARTS, device):
        fn(bench)
    found, software = machine(device)
    data = {"schema": reference.SCHEMA, "device": found, "software": software,
            "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), "commit": commit(),
            "status": reference.STATUS, "measurements": bench.measurements}
    if bench.absent:
        data["absent"] = bench.absent
    if tiny:
        data["note"] = "test mode (--tiny): every part at tiny sizes; not a reference for any lesson"
    return data


def main(argv: list[str] | None = None) -> int:
    import json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the file to write (default bench/results/reference-<gpu>.json)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: the test suite's mode, not a reference")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("make bench-gpu measures an NVIDIA GPU, and torch sees no CUDA device here: nothing was "
              "measured. Run it on a machine with a GPU (python -m gpucourse.doctor says what torch sees).",
              file=sys.stderr)
        return 2
    if args.device == "cpu" and not args.tiny:
        print("--device cpu exists only with --tiny, for the test suite: a CPU's numbers are no GPU reference.",
              file=sys.stderr)
        return 2
    start = time.perf_counter()
    data = run(args.device, args.tiny)
    problems = reference.validate(data)
    if problems:
        raise RuntimeError("the measured reference does not validate: " + "; ".join(problems))
    out = args.out or Path("bench/results") / f"reference-{data['device']['short'].lower()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out} ({sum(len(m['values']) for m in data['measurements'].values())} values, "
          f"{time.perf_counter() - start:.0f} s). To ship it: copy it to src/gpucourse/reference/<name>.json.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

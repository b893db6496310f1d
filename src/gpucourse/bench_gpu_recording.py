"""What a GPU reference file records and how (``make bench-gpu``, ``gpucourse.bench_gpu``): the sizes of
each mode, every measurement's description and recipe (TF32 for matmuls and for cuDNN, memory layout,
when the peak was reset, how host buffers were made), the ``Bench`` that collects values and the
reasons for what is absent, with the capability gate, and the file's provenance (device, software,
date, commit). ``gpucourse.bench_gpu`` holds what is measured and writes the file.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from gpucourse import reference
from gpucourse.reference import MEASUREMENTS


@dataclass(frozen=True)
class Sizes:
    matmul: tuple[int, ...]
    by_size_gpu: tuple[int, ...]  # lesson 2's float32 products on the GPU
    by_size_cpu: tuple[int, ...]  # ... and on one CPU thread
    timing_n: int  # lesson 2: one product timed four ways
    streams: tuple[int, int]  # lesson 2: (n, batches)
    scaled_add_n: int
    alignment_base: int
    resnet: tuple[tuple[int, int], ...]  # (batch, pixels): launch-bound first
    graph_batches: tuple[int, ...]
    bench_peak_batch: int  # lesson 12's step
    saved_batch: int  # lesson 4's bytes saved for backward
    copy_mib: int
    big_copy_mib: int
    side_stream: tuple[int, int, int]  # lesson 5: (MiB per copy, copies, matmul size)
    conv: tuple[int, int, int]  # lesson 5: (batch, channels, pixels)
    overlap_matmul: int
    loop_steps: int
    primes: tuple[int, int, tuple[int, ...]]  # lesson 1: (count_primes argument, tasks, worker counts)
    min_run_time: float
    warmup: int


FULL = Sizes(matmul=reference.MATMUL_SIZES, by_size_gpu=(128, 256, 4096), by_size_cpu=(128, 256), timing_n=4096,
             streams=(1024, 8), scaled_add_n=1 << 20, alignment_base=4096, resnet=reference.RESNET_SIZES,
             graph_batches=(128, 512), bench_peak_batch=128, saved_batch=8, copy_mib=256, big_copy_mib=1024,
             side_stream=(64, 8, 2048), conv=(64, 128, 56), overlap_matmul=8192, loop_steps=20,
             primes=(150_000, 32, reference.LESSON01_WORKERS), min_run_time=0.4, warmup=3)
QUICK = replace(FULL, min_run_time=0.05, warmup=1, loop_steps=5)  # the same labels, shorter timing
TINY = Sizes(matmul=(64, 63, 72), by_size_gpu=(16, 32), by_size_cpu=(16, 32), timing_n=32, streams=(32, 2),
             scaled_add_n=1 << 10, alignment_base=32, resnet=((2, 32), (2, 48)), graph_batches=(2,), bench_peak_batch=2,
             saved_batch=2, copy_mib=1, big_copy_mib=2, side_stream=(1, 2, 32), conv=(2, 8, 8), overlap_matmul=64,
             loop_steps=2, primes=(2_000, 4, (1, 2)), min_run_time=0.01, warmup=1)
MODES = {"full": FULL, "quick": QUICK, "tiny": TINY}


SOURCE = "make bench-gpu (gpucourse.bench_gpu)"
OFF = "off"
NA = "not used"
ROWS_TF32 = "on in the 'tf32' rows only (matmul and cuDNN fp32_precision \"tf32\"), off (\"ieee\") in every other row"
PER_LABEL = "channels_last (model and batch) in the rows labelled channels_last, contiguous NCHW in the others"
FILLED = "written (torch.randn or fill_) before the timing, so every page exists"


def _recipe(matmul=NA, cudnn=NA, layout="contiguous", peak="no peak measured", **more) -> dict[str, str]:
    return {"matmul_tf32": matmul, "cudnn_tf32": cudnn, "memory_format": layout, "peak_reset": peak, **more}


# How this command runs each measurement: written into every entry (gpucourse.reference.RECIPE_KEYS).
RECIPES: dict[str, dict[str, str]] = {
    "matmul_tflops": _recipe("on in the 'tf32' rows only (fp32_precision \"tf32\"), off (\"ieee\") in the others",
                             layout="contiguous n x n"),
    "h2d_gbps": _recipe(layout="contiguous 1-D buffers", host_buffer=FILLED),
    "resnet18_step_ms": _recipe(ROWS_TF32, ROWS_TF32, PER_LABEL, "no peak in this entry (see resnet18_peak_mib)"),
    "resnet18_peak_mib": _recipe(ROWS_TF32, ROWS_TF32, PER_LABEL,
                                 "reset after the warm-up steps, each recipe in a fresh model with every earlier part freed "
                                 "(the peak counts the model, its optimizer state, the batch and the step)"),
    "resnet18_cuda_graph_ms": _recipe(OFF, "on in every row (PyTorch's default): 'fp32 cudnn-tf32' is float32 weights with "
                                      "TF32 convolutions", PER_LABEL),
    "copy_compute_overlap_ms": _recipe(OFF, layout="contiguous", host_buffer="pinned, " + FILLED),
    "sync_loop_ms": _recipe(OFF, OFF, "contiguous NCHW"),
    "resnet18_bench_peak_mib": _recipe(OFF, "on (PyTorch's default)", "contiguous NCHW",
                                       "reset once the model and the batch were on the GPU, before the warm-up and the timed "
                                       "steps (plain SGD: no optimizer state; cuDNN benchmark mode off)"),
    "lesson01_count_primes_speedup": _recipe(layout="not a tensor measurement (Python processes and threads)"),
    "lesson02_matmul_tflops": _recipe(OFF + " (PyTorch's default)"),
    "lesson02_timing_ms": _recipe(OFF + " (PyTorch's default)"),
    "lesson02_streams_ms": _recipe(OFF + " (PyTorch's default)", host_buffer="pinned, " + FILLED),
    "lesson02_scaled_add_ms": _recipe(),
    "lesson03_alignment_tflops": _recipe("not used (float16)"),
    "lesson04_saved_mib": _recipe(OFF + "; bytes do not depend on it", "on (PyTorch's default); bytes do not depend on it",
                                  peak="no peak: bytes of the tensors saved for backward (saved_tensors_hooks)"),
    "lesson05_side_stream_ms": _recipe(OFF + " (PyTorch's default)", host_buffer=FILLED),
    "lesson05_conv_ms": _recipe(cudnn="not used (float16)", layout="NCHW (contiguous) or channels_last, as labelled"),
    "lesson11_gpu_profile_us": _recipe(OFF + " (PyTorch's default)"),
}


WHAT: dict[str, str] = {
    "matmul_tflops": "square matmul n x n, TFLOP/s (2 n^3 / time); tf32 = float32 with allow_tf32",
    "h2d_gbps": "host-to-GPU copy bandwidth (256 MiB; 'pinned 1GiB': 1 GiB)",
    "resnet18_step_ms": "torchvision ResNet-18 training step (forward, backward, SGD momentum), label 'b<batch> <size>px <recipe>'",
    "resnet18_peak_mib": "peak GPU memory of that step (torch.cuda.max_memory_allocated)",
    "resnet18_cuda_graph_ms": "ResNet-18 training step at 32x32 (SGD momentum), eager vs captured whole in one CUDA graph",
    "copy_compute_overlap_ms": "a pinned 256 MiB host-to-GPU copy and a float32 8192x8192 matmul",
    "sync_loop_ms": "ResNet-18 training step in a loop, ms per step, loss.item() every step vs never",
    "resnet18_bench_peak_mib": "peak GPU memory of a ResNet-18 training step (batch 128 of 32x32, plain SGD) as lesson 12 predicts it",
    "lesson01_count_primes_speedup": "lesson 1's count_primes(150,000) x 32 tasks on this machine's CPU cores: speedup over serial "
                                     "(pool start-up included)",
    "lesson02_matmul_tflops": "float32 square matmul n x n, TF32 off: 'GPU float32 <n>' on the GPU, 'CPU float32 <n>' on one CPU "
                              "thread of the same machine",
    "lesson02_timing_ms": "one float32 4096 x 4096 matmul timed four ways: a host clock without synchronizing ('naive'), a host "
                          "clock with a synchronize ('your measure', the lesson's solution), CUDA events, torch.utils.benchmark",
    "lesson02_streams_ms": "8 pinned 1024 x 1024 float32 batches copied to the GPU then multiplied: one stream with blocking "
                           "copies vs a copy stream + events",
    "lesson02_scaled_add_ms": "out = 2.0 * x + y on 2^20 float32: the lesson's compiled Triton kernel (block 1024) vs torch",
    "lesson03_alignment_tflops": "float16 square matmul n x n around 4096 (4096 and 4104 are multiples of 8)",
    "lesson04_saved_mib": "bytes one forward pass of ResNet-18 (batch 8, 32x32) keeps for backward: activations, and "
                          "autocast's float16 weight copies",
    "lesson05_side_stream_ms": "8 host-to-GPU copies of 64 MiB issued on a side stream next to 8 float32 2048x2048 matmuls "
                               "(and a division) on the default stream, one pipeline",
    "lesson05_conv_ms": "3x3 convolution, batch 64, 128 channels, 56x56, float16, forward only, NCHW vs channels_last",
    "lesson11_gpu_profile_us": "lesson 11's tiny regression model (32-64-1, batch 8) trained for 3 profiled steps with "
                               "loss.item() in each: the profiler's self CPU and self CUDA time totals",
}


class Bench:
    """The measurements so far, what could not be measured and why, and the capability gate."""

    def __init__(self, device: str, sizes: Sizes, mode: str = "full"):
        self.device, self.sizes, self.cuda, self.mode = device, sizes, device == "cuda", mode
        self.tiny = mode == "tiny"
        self.measurements: dict[str, dict] = {}
        self.absent: dict[str, dict[str, str]] = {}
        self.capability = torch.cuda.get_device_capability(0) if self.cuda else None
        # Before sm 80 there are no TF32 Tensor Cores (allow_tf32 runs float32) and bfloat16 is emulated.
        self.has_tf32 = bool(self.capability and self.capability >= (8, 0))
        self.bf16_native = self.has_tf32

    def seconds(self, fn: Callable[[], object]) -> float:
        """Median seconds per call of ``fn``, synchronized so that GPU work is inside the time."""
        from torch.utils import benchmark

        wait = torch.cuda.synchronize if self.cuda else (lambda: None)

        def run():
            fn()
            wait()

        for _ in range(self.sizes.warmup):
            run()
        timer = benchmark.Timer("run()", globals={"run": run})
        return timer.blocked_autorange(min_run_time=self.sizes.min_run_time).median

    def label(self, label: str, dtype: torch.dtype | None) -> str:
        """``label``, marked emulated where bfloat16 ran without bfloat16 hardware."""
        return label + reference.EMULATED if dtype == torch.bfloat16 and self.cuda and not self.bf16_native else label

    def put(self, name: str, label: str, value: float, method: str = "torch.utils.benchmark median") -> None:
        entry = self.measurements.setdefault(name, {"what": WHAT[name], "unit": MEASUREMENTS[name].unit, "method": method,
                                                    "source": SOURCE, "recipe": RECIPES[name], "values": {}})
        entry["values"][label] = round(float(value), 4)

    def skip(self, name: str, label: str, why: str) -> None:
        self.absent.setdefault(name, {})[label] = why

    def skip_all(self, name: str, labels, why: str) -> None:
        for label in labels:
            self.skip(name, label, why)

    def no_tf32(self, name: str, label: str) -> bool:
        """True (and the label recorded absent) where TF32 does not exist here."""
        if self.has_tf32:
            return False
        where = "no CPU has it" if not self.cuda else f"this GPU is sm {self.capability[0]}{self.capability[1]}"
        self.skip(name, label, f"TF32 needs compute capability 8.0 or later: {where}, where allow_tf32 runs plain float32")
        return True


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
    found = {"kind": "cuda", "name": props.name, "short": short_name(props.name), "capability": f"{props.major}.{props.minor}",
             "sms": props.multi_processor_count, "memory_mib": props.total_memory // 2**20, "cpu_cores": os.cpu_count()}
    try:
        found["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=20).stdout.split()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        pass  # no nvidia-smi here: the driver stays unnamed rather than guessed
    return found, software


def commit() -> str:
    """The checkout's commit; GPUCOURSE_COMMIT names it for a copy of the tree without its git history
    (a GPU machine the tree was sent to)."""
    if os.environ.get("GPUCOURSE_COMMIT"):
        return os.environ["GPUCOURSE_COMMIT"] + " (named by GPUCOURSE_COMMIT: a copy without git)"
    try:
        run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=20,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return run.stdout.strip() if run.returncode == 0 and run.stdout.strip() else "unknown (not a git checkout)"


def unexplained(data: dict) -> list[str]:
    """Declared labels a run neither measured nor listed absent with a reason (emulated labels count)."""
    found = {name: set(m["values"]) | set(data.get("absent", {}).get(name, {})) for name, m in data["measurements"].items()}
    for name, labels in data.get("absent", {}).items():
        found.setdefault(name, set()).update(labels)
    lacking = []
    for name, declared in MEASUREMENTS.items():
        have = {label.removesuffix(reference.EMULATED) for label in found.get(name, ())}
        if declared.pattern:  # labels that depend on the machine (its cores): at least one, each of the schema
            lacking += [] if have else [f"{name} (any label)"]
            continue
        lacking += [f"{name}[{label!r}]" for label in declared.labels if label not in have]
    return lacking


def header(device_block: dict, software: dict, status: str) -> dict:
    return {"schema": reference.SCHEMA, "device": device_block, "software": software,
            "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), "commit": commit(), "status": status}

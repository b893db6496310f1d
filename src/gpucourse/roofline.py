"""Lesson 15 (roofline and launch overhead): measuring a machine's roofs, placing kernels under them,
and timing what a single tiny operation costs.

A kernel's time is bounded three ways (Horace He's "Making Deep Learning Go Brrrr From First
Principles"): by its arithmetic (FLOPs / peak FLOP/s), by the bytes it must move (bytes / memory
bandwidth) and by the fixed cost of issuing it at all (Python, the dispatcher, a kernel launch).
These helpers measure each on any device: ``peak_flops`` (a large matmul), ``memory_bandwidth``
(a copy and an add far larger than the caches), ``Kernel`` with its FLOPs and bytes counted from the
tensors it really touches (``torch.utils.flop_counter.FlopCounterMode`` for matmuls and
convolutions), ``op_seconds`` (one eager op per tensor size) and ``chain_seconds`` (N tiny ops in a
row). Working the counts out by hand is the lesson's exercise, not a helper here; the figures take
measured points and roofs as arguments.

Times are the *fastest* block of ``torch.utils.benchmark`` (``best_seconds``): other programs on a
shared machine can only slow a block down, never speed one up.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch


def best_seconds(fn: Callable[[], object], min_seconds: float = 0.2) -> float:
    """Seconds per call of ``fn()``: the fastest block of ``Timer.blocked_autorange`` (synchronizes CUDA,
    warms up, repeats in blocks), with this process's thread count."""
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return min(timer.blocked_autorange(min_run_time=min_seconds).times)


@contextmanager
def threads(n: int):
    """Run the block with ``n`` intra-op threads, then restore the count (``torch.set_num_threads``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# The H100's memory roof is not measured by this course: NVIDIA's figure, labelled as such wherever drawn.
H100_SXM_BANDWIDTH_SPEC = {
    "bytes_per_s": 3.35e12,
    "status": "vendor spec, not measured by this course",
    "source": "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM (80 GB HBM3), GPU memory bandwidth 3.35 TB/s",
}


# --- the roofs -----------------------------------------------------------------------------------

def peak_flops(sizes=(256, 512, 1024), dtype=torch.float32, device="cpu", min_seconds: float = 0.3) -> float:
    """FLOP/s of the fastest ``n x n`` matmul for ``n`` in ``sizes`` (2 n^3 FLOPs each: a multiply and an
    add per term): the compute roof, the best this machine's matmul reached."""
    if isinstance(sizes, int):
        sizes = (sizes,)
    if not sizes or min(sizes) < 1:
        raise ValueError("give at least one size, each at least 1")
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        best = max(best, 2 * n**3 / best_seconds(lambda: torch.mm(a, b), min_seconds))
    return best


def memory_bandwidth(nbytes: int = 256 * 2**20, device="cpu", min_seconds: float = 0.3) -> dict[str, float]:
    """Bytes per second moved by two streaming kernels on float32 tensors of ``nbytes`` each (pick it
    well above the last-level cache, or the caches are measured): ``copy`` (read one, write one: 2
    ``nbytes``) and ``add`` (``torch.add(x, y, out=z)``: read two, write one, 3 ``nbytes``). Outputs
    are preallocated, so no allocation is timed."""
    n = nbytes // 4
    if n < 1:
        raise ValueError("nbytes must hold at least one float32")
    x, y, z = (torch.rand(n, device=device) for _ in range(3))
    return {"copy": 2 * 4 * n / best_seconds(lambda: z.copy_(x), min_seconds),
            "add": 3 * 4 * n / best_seconds(lambda: torch.add(x, y, out=z), min_seconds)}


# --- kernels under the roofs ---------------------------------------------------------------------

@dataclass
class Kernel:
    """One operation to place on a roofline: its FLOPs and the bytes of the tensors it reads and writes
    (each once: the least traffic any implementation needs), and ``run`` to time it."""
    name: str
    flops: int
    bytes: int
    run: Callable[[], object]

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    def measure(self, min_seconds: float = 0.2) -> dict:
        """Time ``run`` and return the point: name, flops, bytes, intensity, seconds, flops_per_s, bytes_per_s."""
        seconds = best_seconds(self.run, min_seconds)
        return {"name": self.name, "flops": self.flops, "bytes": self.bytes, "intensity": self.intensity,
                "seconds": seconds, "flops_per_s": self.flops / seconds, "bytes_per_s": self.bytes / seconds}


def copy_kernel(numel: int, dtype=torch.float32, device="cpu") -> Kernel:
    """``out.copy_(x)`` on ``numel`` elements: no FLOPs, 2 arrays of traffic (for the memory roof only:
    an intensity of 0 has no place on a log axis)."""
    x = torch.rand(numel, device=device).to(dtype)
    out = torch.empty_like(x)
    return Kernel(f"copy {numel:,}", 0, touched_bytes(x, out), lambda: out.copy_(x))


def measure_rounds(kernels: list[Kernel], rounds: int = 3, min_seconds: float = 0.1) -> list[dict]:
    """Each kernel's point (``Kernel.measure``) from its fastest of ``rounds`` rounds over all the kernels:
    a busy moment slows every kernel of a round alike instead of one kernel for good."""
    if rounds < 1 or not kernels:
        raise ValueError("measure at least one kernel in at least one round")
    best = [None] * len(kernels)
    for _ in range(rounds):
        for i, kernel in enumerate(kernels):
            seconds = best_seconds(kernel.run, min_seconds)
            best[i] = seconds if best[i] is None else min(best[i], seconds)
    return [{"name": k.name, "flops": k.flops, "bytes": k.bytes, "intensity": k.intensity, "seconds": s,
             "flops_per_s": k.flops / s, "bytes_per_s": k.bytes / s} for k, s in zip(kernels, best)]


def counted_flops(fn: Callable[[], object]) -> int:
    """FLOPs of ``fn()`` as PyTorch counts them (``FlopCounterMode``: matmuls and convolutions, 2 per
    multiply-add; elementwise operations count 0 there)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def touched_bytes(*tensors: torch.Tensor) -> int:
    """Bytes of the tensors given (the inputs and the output of one operation), each counted once."""
    return sum(t.numel() * t.element_size() for t in tensors)


def matmul_kernel(m: int, k: int, n: int, dtype=torch.float32, device="cpu") -> Kernel:
    """``(m x k) @ (k x n)``, counted from the tensors."""
    a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
    out = torch.mm(a, b)
    return Kernel(f"matmul {m}x{k}x{n}", counted_flops(lambda: torch.mm(a, b)), touched_bytes(a, b, out),
                  lambda: torch.mm(a, b, out=out))


def add_kernel(numel: int, dtype=torch.float32, device="cpu") -> Kernel:
    """``x + y`` on ``numel`` elements: one FLOP per output element (FlopCounterMode does not count
    elementwise operations, so the count is the output's size)."""
    x, y = torch.rand(numel, device=device).to(dtype), torch.rand(numel, device=device).to(dtype)
    out = torch.empty_like(x)
    return Kernel(f"add {numel:,}", out.numel(), touched_bytes(x, y, out), lambda: torch.add(x, y, out=out))


def conv_kernel(batch: int, channels: int, size: int, out_channels: int, kernel: int = 3, stride: int = 1,
                padding: int = 1, dtype=torch.float32, device="cpu") -> Kernel:
    """``F.conv2d`` without bias on ``batch x channels x size x size``, counted from the tensors."""
    import torch.nn.functional as F

    x = torch.randn(batch, channels, size, size, device=device).to(dtype)
    w = torch.randn(out_channels, channels, kernel, kernel, device=device).to(dtype)
    conv = lambda: F.conv2d(x, w, stride=stride, padding=padding)  # noqa: E731
    out = conv()
    name = f"conv {channels}->{out_channels} {kernel}x{kernel} on {size}x{size}, batch {batch}"
    return Kernel(name, counted_flops(conv), touched_bytes(x, w, out), conv)


# --- overhead ------------------------------------------------------------------------------------

def op_seconds(sizes, device="cpu", min_seconds: float = 0.1) -> list[float]:
    """Seconds of one eager ``x + y`` (a new output each call, as a model's forward allocates one) for
    each number of elements in ``sizes``."""
    out = []
    for n in sizes:
        x, y = torch.rand(n, device=device), torch.rand(n, device=device)
        out.append(best_seconds(lambda: x + y, min_seconds))
    return out


def chain(x: torch.Tensor, n_ops: int) -> torch.Tensor:
    """``n_ops`` elementwise operations in a row (``x = x * 0.5 + 1.0`` counts 2): each one an op of its
    own in eager mode, one fused loop after ``torch.compile``."""
    for _ in range(n_ops // 2):
        x = x * 0.5 + 1.0
    if n_ops % 2:
        x = x * 0.5
    return x


def chain_seconds(op_counts, numel: int = 16, device="cpu", min_seconds: float = 0.1) -> list[float]:
    """Seconds of ``chain(x, n)`` in eager mode on ``numel`` elements, for each ``n`` in ``op_counts``."""
    x = torch.rand(numel, device=device)
    return [best_seconds(lambda: chain(x, n), min_seconds) for n in op_counts]


# --- figures -------------------------------------------------------------------------------------

def _rate(flops_per_s: float) -> str:
    """FLOP/s in the unit that reads best: GFLOP/s or TFLOP/s."""
    return f"{flops_per_s / 1e12:,.4g} TFLOP/s" if flops_per_s >= 1e12 else f"{flops_per_s / 1e9:,.4g} GFLOP/s"


def draw_roofline(peaks: dict[str, float], bandwidth: float | None, points: list[dict], *, hardware: str,
                  bandwidth_label: str = "memory roof (measured)", bandwidth_measured: bool = True,
                  title: str = "Roofline", ax=None, intensity_range: tuple[float, float] = (0.01, 10_000)):
    """Attainable FLOP/s against arithmetic intensity, log-log: a flat compute roof per entry of
    ``peaks`` (label -> FLOP/s, black, from its ridge point on), the memory roof ``bandwidth`` (bytes/s,
    blue; dotted when ``bandwidth_measured`` is False, e.g. a vendor's figure; ``None``: not drawn) and
    the measured ``points`` (dicts with ``name``, ``intensity``, ``flops_per_s``; an optional ``marker``)."""
    import matplotlib.pyplot as plt
    import numpy as np

    if not peaks:
        raise ValueError("draw at least one compute roof")
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 4.8), layout="constrained")
    else:
        fig = ax.figure
    lo, hi = intensity_range
    top = max(peaks.values())
    for (label, peak), style in zip(peaks.items(), ("-", "--", "-.", ":", "-")):
        start = max(lo, peak / bandwidth) if bandwidth else lo
        ax.plot([start, hi], [peak, peak], style, color="black", lw=1.3, label=f"compute roof, {label}: {_rate(peak)}")
        if bandwidth:
            ax.axvline(peak / bandwidth, color="grey", lw=0.5, ls=":")
    if bandwidth:
        xs = np.array([lo, min(hi, top / bandwidth)])
        ax.plot(xs, xs * bandwidth, ":" if not bandwidth_measured else "-", color="tab:blue", lw=1.6,
                label=f"{bandwidth_label}: {bandwidth / 1e9:,.4g} GB/s")
    for i, p in enumerate(points):
        ax.scatter(p["intensity"], p["flops_per_s"], marker=p.get("marker", "o"), s=40, zorder=3,
                   color=plt.cm.tab10(i % 10), label=p["name"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    bottom = min([top / 1e4] + [p["flops_per_s"] / 2 for p in points])
    ax.set_ylim(bottom, top * 3)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attainable FLOP/s (FLOP per second)")
    ax.set_title(f"{title}\nmeasured on {hardware}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def draw_op_overhead(sizes, seconds, *, hardware: str, title: str = "One eager op: time against tensor size"):
    """Microseconds per eager ``x + y`` against its number of elements (log-log), and the bytes per
    second the op moves (3 float32 arrays) on a second panel."""
    import matplotlib.pyplot as plt
    import numpy as np

    if not len(sizes) or len(sizes) != len(seconds):
        raise ValueError("sizes and seconds must be non-empty and of the same length")
    sizes, seconds = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.8), layout="constrained")
    left.loglog(sizes, seconds * 1e6, marker="o")
    left.axhline(seconds.min() * 1e6, color="grey", ls=":", lw=0.8)
    left.set_xlabel("elements per tensor")
    left.set_ylabel("time per op (µs)")
    right.loglog(sizes, 3 * 4 * sizes / seconds / 1e9, marker="o", color="tab:green")
    right.set_xlabel("elements per tensor")
    right.set_ylabel("useful traffic (GB/s)")
    fig.suptitle(f"{title}\nmeasured on {hardware}", fontsize=10)
    return fig


def draw_chain(op_counts, eager_seconds, *, hardware: str, compiled: dict[int, float] | None = None,
               title: str = "A chain of tiny ops: each op pays its own overhead"):
    """Microseconds for a chain of N elementwise ops on a tiny tensor, eager, and ``compiled`` (N ->
    seconds of the ``torch.compile``d chain) where measured."""
    import matplotlib.pyplot as plt

    if not len(op_counts) or len(op_counts) != len(eager_seconds):
        raise ValueError("op_counts and eager_seconds must be non-empty and of the same length")
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    ax.plot(op_counts, [s * 1e6 for s in eager_seconds], marker="o", label="eager: one op after another")
    if compiled:
        ax.scatter(list(compiled), [s * 1e6 for s in compiled.values()], marker="s", s=50, color="tab:red",
                   zorder=3, label="torch.compile: the chain as one generated kernel")
    ax.set_xlabel("operations in the chain (N)")
    ax.set_ylabel("time per chain (µs)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title}\nmeasured on {hardware}", fontsize=10)
    ax.legend(fontsize=8)
    return fig

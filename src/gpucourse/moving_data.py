"""Lesson 5 (moving data): pinned vs pageable copies, overlapping copies with compute, memory formats.

A copy from pageable host memory to a GPU goes through a pinned staging buffer, and makes the CPU
wait; a copy from pinned (page-locked) memory can be asynchronous (``non_blocking=True``) and run
while the GPU computes. Pinning needs an NVIDIA driver, so the GPU parts skip on a CPU; memory
formats (channels-first NCHW vs channels-last NHWC) are measurable anywhere.
"""

from __future__ import annotations

import torch
from torch import nn

from gpucourse.mixed_precision_figures import beside  # noqa: F401 - lesson 5 plots its numbers beside the reference's too
from gpucourse.timing import seconds_per_call


def copy_gbps(megabytes: int = 256, pinned: bool = False, repeats: int = 10) -> float:
    """Host-to-GPU bandwidth in GB/s from pageable or pinned memory (needs CUDA)."""
    host = filled_host(megabytes, pinned)
    device = torch.empty_like(host, device="cuda")
    return host.numel() / seconds_per_call(lambda: device.copy_(host, non_blocking=pinned), calls=repeats) / 1e9


def filled_host(megabytes: int, pinned: bool = False) -> torch.Tensor:
    """A host buffer of ``megabytes`` MiB, written before any timing: the pages of a fresh pageable
    buffer (``torch.empty``) are made on first touch, so an unwritten source does not cost what a
    copy of real data costs."""
    return torch.empty(megabytes << 20, dtype=torch.uint8, pin_memory=pinned).fill_(1)


def host_copy_gbps(megabytes: int = 64, min_seconds: float = 0.2) -> float:
    """GB/s of a copy between two tensors in this machine's RAM: what a CPU-only machine can measure of
    lesson 5's copies (no GPU to copy to), for comparison with a GPU's host-to-device link."""
    source = torch.ones(megabytes << 20, dtype=torch.uint8)  # written once: its pages exist before the timing
    target = torch.zeros_like(source)
    return source.numel() / seconds_per_call(lambda: target.copy_(source), min_seconds=min_seconds) / 1e9


def overlap_ms(megabytes: int = 64, batches: int = 8, size: int = 2048, matmuls: int | None = None,
               calls: int = 5) -> dict[str, float]:
    """Copies to the GPU overlapping with compute, or not (lesson 5, needs CUDA); ms per pipeline.

    Each of ``batches`` batches is one host-to-GPU copy of ``megabytes`` from pinned memory and
    ``matmuls`` float32 matrix products of ``size``; ``matmuls=None`` picks the number whose time is
    closest to one copy's, measured first on this GPU: overlap can only hide the shorter of the two,
    so it shows where they are comparable. Measured: the copies alone, the compute alone, both on one
    stream (they run one after the other), and the copies on a side stream (they can run during the
    products). Returns those four times in ms, and ``matmuls`` per copy.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("host-to-GPU copies need a CUDA GPU; this machine has none")
    hosts = [filled_host(megabytes, pinned=True) for _ in range(batches)]
    targets = [torch.empty_like(host, device="cuda") for host in hosts]  # allocated once: no allocator in the timing
    a = torch.randn(size, size, device="cuda")
    side = torch.cuda.Stream()
    if matmuls is None:
        copy = seconds_per_call(lambda: targets[0].copy_(hosts[0], non_blocking=True), min_seconds=0.1)
        product = seconds_per_call(lambda: a @ a, min_seconds=0.1)
        matmuls = max(1, round(copy / product))

    def copies() -> None:
        for host, target in zip(hosts, targets):
            target.copy_(host, non_blocking=True)

    def compute() -> None:
        for _ in range(batches * matmuls):
            a @ a

    def one_stream() -> None:
        for host, target in zip(hosts, targets):
            target.copy_(host, non_blocking=True)
            for _ in range(matmuls):
                a @ a

    def side_stream() -> None:
        side.wait_stream(torch.cuda.current_stream())
        for host, target in zip(hosts, targets):
            with torch.cuda.stream(side):
                target.copy_(host, non_blocking=True)
            for _ in range(matmuls):
                a @ a
        torch.cuda.current_stream().wait_stream(side)  # whoever reads the batches waits for their copies

    timed = {name: 1000 * seconds_per_call(fn, calls=calls) for name, fn in
             (("copies alone", copies), ("compute alone", compute), ("one stream", one_stream), ("side stream", side_stream))}
    return {**timed, "matmuls per copy": matmuls}


def overlap_figure(ms: dict[str, float], hardware: str, setting: str, note: str | None = None):
    """Lesson 5's overlap chart: the copies alone, the compute alone, both on one stream and with the
    copies on a side stream, ms per pipeline (``ms`` from :func:`overlap_ms`). Returns the Figure."""
    import matplotlib.pyplot as plt

    names = [n for n in ("copies alone", "compute alone", "one stream", "side stream") if n in ms]
    if not names:
        raise ValueError("nothing to plot: no time was measured")
    fig, ax = plt.subplots(figsize=(6.5, 3.8), layout="constrained")
    bars = ax.bar(names, [ms[n] for n in names], color=["tab:orange", "tab:purple", "tab:gray", "tab:green"][:len(names)])
    ax.bar_label(bars, fmt="%.3g", fontsize=8)
    ax.set_ylabel("time per pipeline (ms)")
    ax.set_xlabel("what ran (copies: pinned host memory to the GPU)")
    ax.set_title(f"Copies overlapping compute: {setting}\nmeasured on {hardware}" + (f"\n{note}" if note else ""), fontsize=9)
    return fig


def bandwidth_figure(megabytes: list[int], gbps: dict[str, list[float]], hardware: str):
    """Host-to-GPU bandwidth by copy size, one line per kind of host memory (lesson 5). Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), layout="constrained")
    for label, rates in gbps.items():
        ax.plot(megabytes, rates, "o-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("MB per copy")
    ax.set_ylabel("host → GPU bandwidth (GB/s)")
    ax.legend(fontsize=8, title="host memory", title_fontsize=8)
    ax.set_title(f"Host-to-GPU copies, pageable vs pinned\nmeasured on {hardware}", fontsize=9)
    return fig


def describe_layout(t: torch.Tensor) -> str:
    """Shape, strides and which memory formats ``t`` is contiguous in."""
    formats = [name for name, fmt in [("contiguous (NCHW)", torch.contiguous_format), ("channels_last (NHWC)", torch.channels_last)]
               if t.is_contiguous(memory_format=fmt)]
    return f"shape {tuple(t.shape)}, strides {t.stride()}: {', '.join(formats) or 'neither'}"


def conv_seconds(channels_last: bool, batch: int = 16, channels: int = 64, size: int = 56,
                 device: str = "cpu", dtype: torch.dtype = torch.float32, min_seconds: float = 0.3) -> float:
    """Median seconds of a 3×3 convolution in channels-first or channels-last memory format."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    conv = nn.Conv2d(channels, channels, 3, padding=1).to(device=device, dtype=dtype, memory_format=fmt)
    x = torch.randn(batch, channels, size, size, device=device, dtype=dtype).to(memory_format=fmt)

    def forward() -> None:
        with torch.no_grad():
            conv(x)

    return seconds_per_call(forward, min_seconds=min_seconds)


def layout_figure(ms: dict[str, float], hardware: str, setting: str):
    """ms per 3x3 convolution in each memory format (lesson 5), ``ms = {"NCHW": ..., "NHWC": ...}``.
    Returns the Figure."""
    import matplotlib.pyplot as plt

    if not ms:
        raise ValueError("nothing to plot: no format was timed")
    fig, ax = plt.subplots(figsize=(4.8, 3.4), layout="constrained")
    bars = ax.bar(list(ms), list(ms.values()), color=["tab:gray", "tab:green"][:len(ms)])
    ax.bar_label(bars, fmt="%.3g", fontsize=8)
    ax.set_ylabel("time per 3x3 convolution (ms)")
    ax.set_xlabel("memory format")
    ax.set_title(f"Channels first vs channels last: {setting}\nmeasured on {hardware}", fontsize=9)
    return fig


def staging_figure():
    """Lesson 5's diagram of a host-to-GPU copy: from pageable memory the CPU first copies the data into
    a pinned staging buffer that the driver keeps, then the GPU's copy engine (DMA) reads that buffer; from
    memory allocated pinned, the copy engine reads the tensor itself, with no staging step and no CPU work.
    Returns the matplotlib Figure (a diagram: no measured numbers)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    rows = [
        ("from pageable memory (pin_memory=False)",
         [("pageable tensor\n(host RAM; the OS\nmay move it)", "#f4cccc"),
          ("pinned staging\nbuffer (host RAM,\nthe driver's)", "#fff2cc"),
          ("GPU memory", "#d9ead3")],
         ["CPU copies\n(memcpy, CPU busy)", "DMA by the\ncopy engine"]),
        ("from pinned memory (pin_memory=True)",
         [("pinned tensor\n(host RAM,\npage-locked)", "#fff2cc"), ("GPU memory", "#d9ead3")],
         ["DMA by the copy engine;\nnon_blocking=True lets the\nCPU go on meanwhile"]),
    ]
    for ax, (title, boxes, arrows) in zip(axes, rows):
        xs = [0.1 + i * 0.8 / (len(boxes) - 1) for i in range(len(boxes))]
        for x, (label, colour) in zip(xs, boxes):
            ax.add_patch(FancyBboxPatch((x - 0.1, 0.35), 0.2, 0.3, boxstyle="round,pad=0.02", facecolor=colour,
                                        edgecolor="black"))
            ax.text(x, 0.5, label, ha="center", va="center", fontsize=8)
        for (x0, x1), label in zip(zip(xs, xs[1:]), arrows):
            ax.add_patch(FancyArrowPatch((x0 + 0.12, 0.5), (x1 - 0.12, 0.5), arrowstyle="-|>", mutation_scale=15))
            ax.text((x0 + x1) / 2, 0.72, label, ha="center", va="bottom", fontsize=8)
        ax.axhline(0.2, xmin=0.0, xmax=1.0, color="grey", lw=0.5)
        ax.text(0.0, 0.12, "host (CPU side)", fontsize=8, color="grey")
        ax.text(1.0, 0.12, "device (GPU side)", fontsize=8, color="grey", ha="right")
        ax.set_xlim(-0.05, 1.05)
        ax.set_ylim(0, 1)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("where the bytes are, step by step")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("A host-to-GPU copy: pageable memory is staged through a pinned buffer, pinned memory is not")
    fig.tight_layout()
    return fig

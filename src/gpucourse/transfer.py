"""Lesson 5 (moving data): pinned vs pageable copies, overlapping copies with compute, memory formats.

A copy from pageable host memory to a GPU goes through a pinned staging buffer, and makes the CPU
wait; a copy from pinned (page-locked) memory can be asynchronous (``non_blocking=True``) and run
while the GPU computes. Pinning needs an NVIDIA driver, so the GPU parts skip on a CPU; memory
formats (channels-first NCHW vs channels-last NHWC) are measurable anywhere.
"""

from __future__ import annotations

import torch
from torch import nn

from gpucourse.timing import seconds_per_call


def copy_gbps(megabytes: int = 256, pinned: bool = False, repeats: int = 10) -> float:
    """Host-to-GPU bandwidth in GB/s from pageable or pinned memory (needs CUDA)."""
    host = torch.empty(megabytes << 20, dtype=torch.uint8, pin_memory=pinned)
    device = torch.empty_like(host, device="cuda")
    return host.numel() / seconds_per_call(lambda: device.copy_(host, non_blocking=pinned), calls=repeats) / 1e9


def overlap_seconds(batches: int = 8, megabytes: int = 64, size: int = 2048, pinned: bool = True) -> float:
    """Seconds to copy ``batches`` host buffers to the GPU while multiplying matrices (needs CUDA).

    Copies go on a side stream; with pinned memory they overlap the matrix products on the default
    stream, with pageable memory they cannot.
    """
    hosts = [torch.empty(megabytes << 20, dtype=torch.uint8, pin_memory=pinned) for _ in range(batches)]
    first = torch.randn(size, size, device="cuda")
    copy_stream = torch.cuda.Stream()

    def pipeline() -> None:
        a = first
        for host in hosts:
            with torch.cuda.stream(copy_stream):
                host.to("cuda", non_blocking=pinned)
            a = a @ a
            a = a / a.norm()

    return seconds_per_call(pipeline, calls=1)


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

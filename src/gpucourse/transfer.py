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

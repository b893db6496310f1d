"""Lesson 3 (Tensor Cores): alignment rules, a linter for misaligned layers, TF32 settings, benchmarks.

Tensor Cores multiply and accumulate small matrix tiles (one warp-level MMA instruction works on tiles of
a fixed shape, e.g. 16×16 by 16×8 in float16 on Ampere and Hopper). Since cuBLAS 11 and cuDNN 7.6.3 they
are used for any shape, so the "multiple of 8" rules are speed guidance, not requirements: a dimension
that is not a multiple leaves part of a tile (and of the GPU) doing padding work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gpucourse.timing import seconds_per_call

# Elements per dimension for full-speed tiles: 16 bytes of data (NVIDIA's "multiple of 8 for FP16").
ALIGNMENT = {
    torch.float16: 8,
    torch.bfloat16: 8,
    torch.float32: 4,  # TF32: 4 × 4 bytes
    torch.int8: 16,
    torch.float8_e4m3fn: 16,
    torch.float8_e5m2: 16,
}


def multiple_for(dtype: torch.dtype) -> int:
    if dtype not in ALIGNMENT:
        raise ValueError(f"no Tensor Core guidance for {dtype}; known: {', '.join(map(str, ALIGNMENT))}")
    return ALIGNMENT[dtype]


def pad_to(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``n``."""
    if n < 0 or multiple < 1:
        raise ValueError("n must be >= 0 and multiple >= 1")
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class Issue:
    layer: str
    attribute: str
    value: int
    suggestion: int

    def __str__(self) -> str:
        return f"{self.layer}.{self.attribute} = {self.value}: pad to {self.suggestion}"


_DIMENSIONS = {
    nn.Linear: ("in_features", "out_features"),
    nn.Conv1d: ("in_channels", "out_channels"),
    nn.Conv2d: ("in_channels", "out_channels"),
    nn.Conv3d: ("in_channels", "out_channels"),
    nn.ConvTranspose2d: ("in_channels", "out_channels"),
    nn.Embedding: ("num_embeddings", "embedding_dim"),
    nn.LSTM: ("input_size", "hidden_size"),
    nn.GRU: ("input_size", "hidden_size"),
}


def lint(model: nn.Module, dtype: torch.dtype = torch.float16, batch_size: int | None = None) -> list[Issue]:
    """Every layer dimension (and the batch size, if given) that is not a multiple for ``dtype``.

    The first layer's input channels (3 for RGB images) and a classifier's class count often cannot be
    changed: pad them when the layer is a real cost, or leave them and accept one slower layer.
    """
    multiple = multiple_for(dtype)
    issues = []
    if batch_size is not None and batch_size % multiple:
        issues.append(Issue("batch", "size", batch_size, pad_to(batch_size, multiple)))
    for name, module in model.named_modules():
        for kind, attributes in _DIMENSIONS.items():
            if isinstance(module, kind):
                for attribute in attributes:
                    value = getattr(module, attribute)
                    if value % multiple:
                        issues.append(Issue(name or type(module).__name__, attribute, value, pad_to(value, multiple)))
    return issues


def example_mlp(widths: list[int], activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Linear layers of the given widths with ``activation`` between them (not after the last)."""
    if len(widths) < 2:
        raise ValueError("an MLP needs at least an input and an output width")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


def tf32_settings() -> dict[str, Any]:
    """How float32 matrix products and convolutions run on this torch (only Ampere+ GPUs use TF32)."""
    settings = {"torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision()}
    owners = {"torch.backends": torch.backends, "torch.backends.cuda.matmul": torch.backends.cuda.matmul,
              "torch.backends.cudnn.conv": getattr(torch.backends.cudnn, "conv", None)}
    for owner, target in owners.items():
        if hasattr(target, "fp32_precision"):  # the PyTorch 2.9+ API
            settings[f"{owner}.fp32_precision"] = target.fp32_precision
    return settings


def matmul_tflops(m: int, n: int, k: int, dtype: torch.dtype, device: str, min_seconds: float = 0.3) -> float:
    """TFLOP/s of an (m×k) @ (k×n) product, timed by ``torch.utils.benchmark`` for ``min_seconds``."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    return 2 * m * n * k / seconds_per_call(lambda: a @ b, min_seconds=min_seconds) / 1e12


def alignment_benchmark(base: int, dtype: torch.dtype, device: str, offsets=(0, 1, 4, 7, 8),
                        min_seconds: float = 0.3) -> dict[int, float]:
    """TFLOP/s of square products of size ``base + offset``: aligned sizes against their neighbours."""
    return {base + o: matmul_tflops(base + o, base + o, base + o, dtype, device, min_seconds) for o in offsets}


def activation_throughput(size: int, device: str = "cpu", min_seconds: float = 0.2) -> dict[str, float]:
    """Elements per second through ReLU, GELU, Tanh and Sigmoid on a tensor of ``size`` elements."""
    x = torch.randn(size, device=device)
    return {name: size / seconds_per_call(lambda: fn(x), min_seconds=min_seconds)
            for name, fn in [("relu", torch.relu), ("gelu", nn.functional.gelu), ("tanh", torch.tanh),
                             ("sigmoid", torch.sigmoid)]}


# The seed's three cases, graded as sets of these codes per case.
CODES = {
    "dims_not_multiple_of_8": "a layer's feature/channel size is not a multiple of 8 (Tensor Core guideline, fp16)",
    "batch_not_multiple_of_8": "some batch is not a multiple of 8 (Tensor Core guideline, fp16)",
    "input_shape_mismatch": "the data's feature size does not match the first layer's input size",
    "output_size_mismatch": "the model's output does not match the target (number of classes, or the mask's size)",
    "dataloader_passed_to_model": "the loop passes the DataLoader, not the batch, to the model",
    "missing_comma": "a missing comma between layers: a SyntaxError",
    "no_activation_between_linears": "stacked Linear layers with nothing in between collapse into one linear map",
}

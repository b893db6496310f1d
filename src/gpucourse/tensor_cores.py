"""Lesson 3 (Tensor Cores): alignment rules, a linter for misaligned layers, TF32 settings, benchmarks.

Tensor Cores multiply and accumulate small matrix tiles (one warp-level MMA instruction works on tiles of
a fixed shape, e.g. 16×16 by 16×8 in float16 on Ampere and Hopper). Since cuBLAS 11 and cuDNN 7.6.3 they
are used for any shape, so the "multiple of 8" rules are speed guidance, not requirements: a dimension
that is not a multiple leaves part of a tile (and of the GPU) doing padding work.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

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
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:  # torch 2.9+ refuses to answer once the new per-backend settings say "tf32"
        legacy = "(set through the per-backend fp32_precision settings below)"
    settings = {"torch.get_float32_matmul_precision()": legacy}
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


@contextlib.contextmanager
def tf32(matmul: bool | None = None, cudnn: bool | None = None) -> Iterator[None]:
    """Within the block, float32 matrix products (``matmul``) and cuDNN convolutions (``cudnn``) run in
    TF32 (True: Tensor Cores, Ampere and newer) or in true float32 (False: "ieee"); None leaves a switch
    as it is. Both are restored after (lessons 3 and 4, and ``make bench-gpu``).

    Today's API (PyTorch 2.9+) is the per-backend ``torch.backends.cuda.matmul.fp32_precision`` and
    ``torch.backends.cudnn.conv.fp32_precision``; on an older torch this falls back to the flags they
    replace, ``allow_tf32`` (torch 2.9+ refuses to read either spelling once the two are mixed)."""
    owners = [(torch.backends.cuda.matmul, matmul), (getattr(torch.backends.cudnn, "conv", None), cudnn)]
    if not all(hasattr(owner, "fp32_precision") for owner, _ in owners):
        owners = [(torch.backends.cuda.matmul, matmul), (torch.backends.cudnn, cudnn)]
    changed = []
    for owner, on in owners:
        if on is None:
            continue
        name = "fp32_precision" if hasattr(owner, "fp32_precision") else "allow_tf32"
        changed.append((owner, name, getattr(owner, name)))
        setattr(owner, name, ("tf32" if on else "ieee") if name == "fp32_precision" else on)
    try:
        yield
    finally:
        for owner, name, before in changed:
            setattr(owner, name, before)


@contextlib.contextmanager
def float32_matmul(precision: str) -> Iterator[None]:
    """Within the block, float32 matrix products on CUDA run in ``precision``: ``"ieee"`` (true float32,
    PyTorch's default) or ``"tf32"`` (Tensor Cores, Ampere and newer); the setting is restored after
    (``tf32``, for matrix products only)."""
    if precision not in ("ieee", "tf32"):
        raise ValueError(f"precision must be 'ieee' or 'tf32', not {precision!r}")
    with tf32(matmul=precision == "tf32"):
        yield


@contextlib.contextmanager
def cpu_threads(count: int) -> Iterator[None]:
    """Within the block, PyTorch's CPU operators use ``count`` threads (``torch.set_num_threads``); the
    previous count is restored after. One thread gives steady CPU timings of small products, which
    a thread pool's start-up, or other programs on the same cores, otherwise swamp."""
    if count < 1:
        raise ValueError("count must be >= 1")
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# What each precision of an n x n matrix product is: (dtype of the tensors, float32 matmul precision).
PRECISIONS = {
    "float32 (TF32 off)": (torch.float32, "ieee"),
    "TF32": (torch.float32, "tf32"),
    "float16": (torch.float16, "ieee"),
    "bfloat16": (torch.bfloat16, "ieee"),
}


def unavailable_precisions(device: str | torch.device) -> dict[str, str]:
    """The precisions of ``PRECISIONS`` that ``device`` does not run as labelled, each with the reason.

    A CUDA GPU before compute capability 8.0 (Volta, Turing: a T4) has no TF32 (torch quietly runs full
    float32 instead) and no native bfloat16 (``torch.cuda.is_bf16_supported()`` still says True: it
    emulates it); a row labelled "TF32" or "bfloat16" there would time something else. A CPU has no
    TF32 and emulates 16-bit products unless it has the instructions; it runs float32 only here.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return {name: f"a {device.type.upper()} has no Tensor Cores: float32 only"
                for name in PRECISIONS if name != "float32 (TF32 off)"}
    major, minor = torch.cuda.get_device_capability(device)
    if major >= 8:  # Ampere and newer: all four
        return {}
    where = f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"
    return {"TF32": f"no TF32 on {where}: it starts at 8.0, and float32 runs in full precision",
            "bfloat16": f"bfloat16 is emulated on {where}: native from 8.0, so its rate would not be the format's"}


def precision_rates(n: int, device: str, names=None, min_seconds: float = 0.3) -> dict[str, float]:
    """TFLOP/s of an n x n @ n x n product in each precision of ``PRECISIONS`` (or of ``names``).

    By default every precision the device runs as labelled (``unavailable_precisions`` says which it
    does not, and why, and this prints that): all four on an Ampere or newer GPU, float32 and float16
    on an older one, float32 only on a CPU. Naming one the device cannot run raises ValueError.
    """
    device = torch.device(device)
    unknown = [name for name in names or () if name not in PRECISIONS]
    if unknown:
        raise ValueError(f"unknown precision(s) {unknown}; known: {', '.join(PRECISIONS)}")
    missing = unavailable_precisions(device)
    if names is None:
        names = [name for name in PRECISIONS if name not in missing]
        for name, why in missing.items():
            if device.type == "cuda":
                print(f"Skipped {name}: {why}.")
    refused = {name: missing[name] for name in names if name in missing}
    if refused:
        raise ValueError("not measurable as labelled here: " + "; ".join(f"{k}: {v}" for k, v in refused.items()))
    rates = {}
    for name in names:
        dtype, fp32 = PRECISIONS[name]
        with float32_matmul(fp32):
            rates[name] = matmul_tflops(n, n, n, dtype, str(device), min_seconds)
    return rates


def plot_precisions(mine: Mapping[str, float], mine_label: str, reference: Mapping[str, float],
                    reference_label: str, note: str | None = None):
    """Bars of matrix-product TFLOP/s by precision, this machine beside a reference (log scale);
    the labels say the hardware and the size each side ran at. Returns the Figure."""
    from gpucourse.reference import plot_beside

    fig = plot_beside(mine, reference, title="Square matrix product by precision", unit="TFLOP/s (log scale)",
                      mine_label=mine_label, reference_label=reference_label, note=note, log=True)
    fig.axes[0].set_xlabel("precision of the product (float32 with TF32 off is PyTorch's default)")
    _legend_below(fig)
    return fig


def reference_precisions(reference, sizes) -> dict[int, dict[str, float]]:
    """The reference GPU's ``matmul_tflops`` for each size in ``sizes``, by the names of ``PRECISIONS``
    (``{8192: {"float32 (TF32 off)": 51.3, "TF32": 356.6, ...}}``); a size it lacks maps to {}."""
    names = {"float32 (TF32 off)": "float32", "TF32": "tf32", "float16": "float16", "bfloat16": "bfloat16"}
    measured = reference.values("matmul_tflops")
    found: dict[int, dict[str, float]] = {}
    for n in sizes:
        found[n] = {name: measured[f"{label} {n}"] for name, label in names.items() if f"{label} {n}" in measured}
        if f"bfloat16 {n} emulated" in measured:  # a GPU before sm 80: bfloat16 without its hardware
            found[n]["bfloat16 (emulated)"] = measured[f"bfloat16 {n} emulated"]
    return found


def alignment_labels(rates: Mapping[int, Mapping[str, float]], aligned: int) -> dict[str, float]:
    """``{n: {precision: rate}}`` as one dict keyed "<precision>, aligned" (n == ``aligned``) or
    "<precision>, misaligned" (any other n), precision by precision, so that machines measured at
    different sizes line up."""
    names = list(dict.fromkeys(name for by_name in rates.values() for name in by_name))
    return {f"{name}, {'aligned' if n == aligned else 'misaligned'}": rates[n][name]
            for name in names for n in rates if name in rates[n]}


def plot_alignment(rates: Mapping[int, float], hardware: str, multiple: int = 8,
                   reference: Mapping[int, float] | None = None, reference_label: str | None = None):
    """Throughput of n x n products at sizes around an aligned one, as a percentage of the first
    (aligned) size: green where n is a multiple of ``multiple``, red where not. With ``reference``, a
    second panel for the reference GPU's own sizes. Percentages let machines of any speed compare;
    the titles name the hardware. Returns the Figure."""
    import matplotlib.pyplot as plt

    if not rates:
        raise ValueError("nothing to plot: no measurements")
    panels = [(rates, hardware)]
    if reference:
        panels.append((reference, reference_label or "reference"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), layout="constrained", squeeze=False)
    for ax, (values, label) in zip(axes[0], panels):
        sizes = sorted(values)
        base = values[sizes[0]]
        percent = [100 * values[n] / base for n in sizes]
        bars = ax.bar([str(n) for n in sizes], percent,
                      color=["tab:green" if n % multiple == 0 else "tab:red" for n in sizes])
        ax.bar_label(bars, fmt="%.0f%%", fontsize=7, padding=1)
        ax.set_xlabel("n (n×n @ n×n)")
        ax.set_ylabel(f"throughput (% of n = {sizes[0]})")
        ax.set_title(label, fontsize=9)
    fig.suptitle(f"Aligned (green: multiple of {multiple}) vs misaligned (red) matrix sizes", fontsize=10)
    return fig


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


def _legend_below(fig) -> None:
    """Move a one-axes figure's legend below the axes: hardware names are long."""
    ax = fig.axes[0]
    handles, labels = ax.get_legend_handles_labels()
    ax.get_legend().remove()
    fig.legend(handles, labels, loc="outside lower center", fontsize=8, title="hardware", title_fontsize=8)

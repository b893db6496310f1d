"""Lesson 4's figures (automatic mixed precision): float formats' bits, memory when backward begins,
ms per step per recipe, eager against CUDA graphs, float16 gradients with and without loss scaling,
and this machine's numbers beside the GPU reference's. Each names the hardware it ran on. Lesson 4
reaches these through ``gpucourse.mixed_precision``; lesson 5 uses ``beside`` too.
"""

from __future__ import annotations

import torch

def _machine_in_title(ax, title: str, hardware: str, note: str | None) -> None:
    ax.set_title(f"{title}\nmeasured on {hardware}" + (f"\n{note}" if note else ""), fontsize=9)


def beside(mine: dict[str, float], reference: dict[str, float], **labels):
    """``gpucourse.reference.plot_beside`` (this machine's numbers next to the GPU reference's, both
    machines named) with the legend under the chart, where long machine names fit (lessons 4 and 5).
    Returns the Figure."""
    from gpucourse.reference import plot_beside

    fig = plot_beside(mine, reference, **labels)
    fig.set_size_inches(max(7.0, fig.get_size_inches()[0]), 4.8)
    ax = fig.axes[0]
    handles, names = ax.get_legend_handles_labels()
    ax.get_legend().remove()
    fig.legend(handles, names, loc="outside lower center", fontsize=8, title="hardware", title_fontsize=8)
    return fig


def memory_figure(rows: dict[int, dict[str, dict[str, int]]], image_size: int, hardware: str, note: str | None = None):
    """Lesson 4's memory chart: for each batch (``rows[batch] = {"float32": parts, "AMP ...": parts}``,
    parts from :func:`memory_at_backward`), one stacked bar per precision, every part in MiB.
    Returns the Figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    if not rows:
        raise ValueError("nothing to plot: no batch was measured")
    batches = sorted(rows)
    variants = list(rows[batches[0]])
    parts = list(rows[batches[0]][variants[0]])
    colours = dict(zip(parts, ["#9fc5e8", "#b4a7d6", "#ffe599", "#e06666", "#93c47d"]))
    fig, ax = plt.subplots(figsize=(max(6.5, 1.6 * len(batches) + 2), 4.2), layout="constrained")
    width = 0.8 / len(variants)
    x = np.arange(len(batches))
    for i, variant in enumerate(variants):
        bottom = np.zeros(len(batches))
        offset = (i - (len(variants) - 1) / 2) * width
        for part in parts:
            mib = np.array([rows[b][variant][part] / 2**20 for b in batches])
            ax.bar(x + offset, mib, width * 0.95, bottom=bottom, color=colours[part], edgecolor="white",
                   hatch="//" if i else None, label=part if i == 0 else None)
            bottom += mib
        for xi, total in zip(x + offset, bottom):
            ax.text(xi, total, f"{variant}\n{total:.0f}", ha="center", va="bottom", fontsize=6.5)
    ax.set_xticks(x, [str(b) for b in batches])
    ax.set_xlabel(f"batch size (images of {image_size}x{image_size})")
    ax.set_ylabel("memory when backward begins (MiB)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="held by (hatched: autocast)",
              title_fontsize=7)
    ax.margins(y=0.15)
    _machine_in_title(ax, f"ResNet-18 training step: float32 vs autocast, {image_size}x{image_size} images",
                      hardware, note)
    return fig


def step_time_figure(timings: list, note: str | None = None):
    """ms per training step of each recipe on one machine (lesson 4; ``timings``: ``gpucourse.mixed_precision.StepTiming``
    rows), the peak memory written above each bar where it was measured (CUDA). Returns the Figure."""
    import matplotlib.pyplot as plt

    if not timings:
        raise ValueError("nothing to plot: no recipe was timed")
    fig, ax = plt.subplots(figsize=(max(5.5, 1.5 * len(timings) + 1), 3.8), layout="constrained")
    bars = ax.bar([t.recipe for t in timings], [t.ms for t in timings], color="tab:blue")
    ax.bar_label(bars, labels=[f"{t.ms:.3g} ms" + (f"\n{t.peak_mib:.0f} MiB peak" if t.peak_mib else "") for t in timings],
                 fontsize=7)
    ax.set_ylabel("time per training step (ms)")
    ax.set_xlabel("recipe")
    ax.tick_params(axis="x", labelsize=8, rotation=15)
    ax.margins(y=0.2)
    first = timings[0]
    _machine_in_title(ax, f"ResNet-18 training step, batch {first.batch} of {first.image_size}x{first.image_size} images",
                      first.hardware, note)
    return fig


def cuda_graph_figure(ms: dict[str, dict[str, float]], hardware: str, note: str | None = None):
    """Eager vs CUDA-graph ms per step, one pair of bars per setting (``ms[setting] = {"eager": ...,
    "CUDA graph": ...}``; lesson 4's launch-bound step). Returns the Figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    if not ms:
        raise ValueError("nothing to plot: no setting was measured")
    settings = list(ms)
    x = np.arange(len(settings))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * len(settings) + 2), 3.8), layout="constrained")
    for offset, mode, colour in ((-0.2, "eager", "tab:gray"), (0.2, "CUDA graph", "tab:green")):
        bars = ax.bar(x + offset, [ms[s][mode] for s in settings], 0.38, label=mode, color=colour)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks(x, settings, fontsize=8, rotation=10)
    ax.set_xlabel("setting (batch, image size, recipe)")
    ax.set_ylabel("time per training step (ms)")
    ax.legend(fontsize=8, title="how the step is launched", title_fontsize=8)
    _machine_in_title(ax, "ResNet-18 training step: one launch per operation (eager) vs one CUDA graph",
                      hardware, note)
    return fig


BIT_LAYOUTS = {  # name: (sign, exponent, mantissa bits, torch dtype name or None)
    "float32": (1, 8, 23, "float32"),
    "TF32": (1, 8, 10, None),  # a Tensor Core compute format on Ampere and newer, not a storage dtype
    "float16": (1, 5, 10, "float16"),
    "bfloat16": (1, 8, 7, "bfloat16"),
    "float8 e4m3": (1, 4, 3, "float8_e4m3fn"),
    "float8 e5m2": (1, 5, 2, "float8_e5m2"),
}


def bit_layout_rows() -> list[dict]:
    """Bits, range and precision of each format in ``BIT_LAYOUTS``, from ``torch.finfo`` (TF32, which is
    not a storage dtype, has float32's exponent and float16's mantissa: its range is float32's)."""
    rows = []
    for name, (sign, exponent, mantissa, dtype) in BIT_LAYOUTS.items():
        info = torch.finfo(getattr(torch, dtype or "float32"))
        eps = info.eps if dtype else 2.0 ** -mantissa
        rows.append({"format": name, "sign": sign, "exponent": exponent, "mantissa": mantissa, "max": info.max,
                     "smallest_normal": info.tiny, "epsilon": eps})
    return rows


def bit_layout_figure():
    """Lesson 4's figure: the sign, exponent and mantissa bits of float32, TF32, float16, bfloat16 and
    the two float8 formats, one box per bit, with each format's range and precision written beside it."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows = bit_layout_rows()
    colours = {"sign": "#e06666", "exponent": "#6fa8dc", "mantissa": "#93c47d"}
    fig, ax = plt.subplots(figsize=(12, 0.75 * len(rows) + 1.2))
    for y, row in enumerate(reversed(rows)):
        x = 0
        for part in ("sign", "exponent", "mantissa"):
            for _ in range(row[part]):
                ax.add_patch(Rectangle((x, y + 0.15), 1, 0.7, facecolor=colours[part], edgecolor="white", lw=0.8))
                x += 1
        ax.text(-0.6, y + 0.5, f"{row['format']} ({row['sign'] + row['exponent'] + row['mantissa']} bits)",
                ha="right", va="center", fontsize=9)
        ax.text(33, y + 0.5, f"max {row['max']:.3g}, smallest normal {row['smallest_normal']:.2g}, "
                f"epsilon {row['epsilon']:.2g}", va="center", fontsize=8.5)
    for part, colour in colours.items():
        ax.bar(0, 0, color=colour, label={"sign": "sign", "exponent": "exponent (range)",
                                          "mantissa": "mantissa (precision)"}[part])
    ax.legend(loc="upper center", bbox_to_anchor=(0.35, -0.12), ncol=3, frameon=False, fontsize=9)
    ax.set_xlim(-12, 56)
    ax.set_ylim(0, len(rows))
    ax.set_yticks([])
    ax.set_xticks(range(0, 33, 8))
    ax.set_xlabel("bit position (bits, from the sign bit)")
    ax.set_title("Floating-point formats: exponent bits set the range, mantissa bits the precision")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def gradient_histogram_figure(reference: torch.Tensor, unscaled: torch.Tensor, scaled: torch.Tensor, scale: float):
    """Histograms of log2 |gradient| (lesson 4): float32, float16 without loss scaling and float16 after
    scaling by ``scale``, with float16's smallest subnormal (2^-24) and smallest normal (2^-14) marked.
    Gradients that are exactly 0 cannot go on a log axis: their count is in each panel's legend."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    panels = [("float32 (reference)", reference), ("float16, no loss scaling", unscaled),
              (f"float16, loss scaled by {scale:g} (= 2^{torch.tensor(scale).log2().item():.0f})", scaled)]
    nonzero = [p[p != 0].abs().log2() for _, p in panels]
    low = min(float(v.min()) for v in nonzero if v.numel())
    high = max(float(v.max()) for v in nonzero if v.numel())
    bins = torch.linspace(min(low, -27) - 0.5, high + 0.5, 60).tolist()
    for ax, (title, values), logs in zip(axes, panels, nonzero):
        zeros = int((values == 0).sum())
        ax.hist(logs.numpy(), bins=bins, color="#6fa8dc", label=f"{zeros} of {values.numel()} are exactly 0")
        ax.axvline(-24, color="#cc0000", ls="--", label="float16 smallest subnormal 2^-24")
        ax.axvline(-14, color="#e69138", ls=":", label="float16 smallest normal 2^-14")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("count")
        ax.legend(fontsize=8, loc="upper left")
    axes[-1].set_xlabel("log2 |gradient| (of the loss w.r.t. each layer's output)")
    fig.suptitle("Real gradients of a small confident classifier, one backward pass")
    fig.tight_layout()
    return fig

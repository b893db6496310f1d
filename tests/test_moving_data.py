"""gpucourse.moving_data (lesson 5's helpers)."""

from __future__ import annotations

import pytest
import torch

from conftest import needs_cuda
from gpucourse import moving_data as X


def test_layouts_are_described_by_strides():
    x = torch.randn(2, 3, 4, 5)
    assert X.describe_layout(x) == "shape (2, 3, 4, 5), strides (60, 20, 5, 1): contiguous (NCHW)"
    assert X.describe_layout(x.to(memory_format=torch.channels_last)).endswith("strides (60, 1, 15, 3): channels_last (NHWC)")
    assert X.describe_layout(x.permute(0, 2, 3, 1)).endswith(": neither")


@pytest.mark.parametrize("channels_last", [False, True])
def test_conv_timing_runs_in_both_formats(channels_last):
    assert X.conv_seconds(channels_last, batch=1, channels=8, size=8, min_seconds=0.01) > 0


@needs_cuda("pinned memory and host-to-GPU copies need an NVIDIA driver")
def test_copies_and_overlap_on_a_gpu():
    assert X.copy_gbps(4, pinned=True, repeats=2) > 0 and X.copy_gbps(4, pinned=False, repeats=2) > 0
    ms = X.overlap_ms(megabytes=4, batches=2, size=256, calls=2)
    assert all(ms[name] > 0 for name in ("copies alone", "compute alone", "one stream", "side stream"))
    assert ms["matmuls per copy"] >= 1


def test_overlap_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA"):
        X.overlap_ms()


def test_a_copy_in_ram_is_measured_on_any_machine():
    assert X.host_copy_gbps(1, min_seconds=0.01) > 0


def _labelled(fig, hardware):
    ax = fig.axes[0]
    return hardware in ax.get_title() and ax.get_xlabel() and "(" in ax.get_ylabel() and ")" in ax.get_ylabel()


def test_lesson5_figures_have_titles_units_and_hardware():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = {"copies alone": 10.0, "compute alone": 9.0, "one stream": 19.0, "side stream": 11.0}
    fig = X.overlap_figure(ms, "Test GPU", "8 pinned copies of 64 MiB")
    assert _labelled(fig, "Test GPU") and "ms" in fig.axes[0].get_ylabel() and "64 MiB" in fig.axes[0].get_title()
    assert [round(p.get_height()) for p in fig.axes[0].patches] == [10, 9, 19, 11]
    plt.close(fig)
    fig = X.bandwidth_figure([4, 16], {"pageable": [15.0, 16.0], "pinned": [50.0, 52.0]}, "Test GPU")
    assert _labelled(fig, "Test GPU") and "GB/s" in fig.axes[0].get_ylabel() and "MB" in fig.axes[0].get_xlabel()
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["pageable", "pinned"]
    plt.close(fig)
    fig = X.layout_figure({"NCHW": 2.0, "NHWC": 1.0}, "Test CPU", "float32, batch 2")
    assert _labelled(fig, "Test CPU") and "ms" in fig.axes[0].get_ylabel() and "batch 2" in fig.axes[0].get_title()
    plt.close(fig)
    for empty in (lambda: X.overlap_figure({}, "x", "y"), lambda: X.layout_figure({}, "x", "y")):
        with pytest.raises(ValueError):
            empty()


def test_staging_figure_is_a_titled_diagram():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = X.staging_figure()
    assert fig._suptitle is not None and "pinned" in fig._suptitle.get_text()
    titles = [ax.get_title() for ax in fig.axes]
    assert any("pageable" in t for t in titles) and any("pinned" in t for t in titles)
    assert all(ax.get_xlabel() for ax in fig.axes)
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "staging\nbuffer" in texts and "DMA" in texts
    plt.close(fig)

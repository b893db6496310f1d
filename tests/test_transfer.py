"""gpucourse.transfer (lesson 5's helpers)."""

from __future__ import annotations

import pytest
import torch

from conftest import needs_cuda
from gpucourse import transfer as X


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
    assert X.overlap_seconds(batches=2, megabytes=4, size=256) > 0


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

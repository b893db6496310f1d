"""gpucourse.kernels (lesson 2's Triton section): the plain-Python launch model, the isolated runner and
the guarded probe the lesson's checks use, on Triton's CPU interpreter."""

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from gpucourse import kernels as K

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def test_cdiv_and_block_table():
    assert [K.cdiv(n, 4) for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
    rows = K.block_table(10, 4)
    assert [r["pid"] for r in rows] == [0, 1, 2]
    assert rows[2]["offsets"] == [8, 9, 10, 11] and rows[2]["mask"] == [True, True, False, False]
    with pytest.raises(ValueError):
        K.cdiv(3, 0)


def test_simulate_runs_every_program_once():
    seen = []
    K.simulate(lambda pid, out, BLOCK: out.append((pid, BLOCK)), 3, seen, BLOCK=4)
    assert seen == [(0, 4), (1, 4), (2, 4)]


def test_importing_the_module_does_not_import_triton():
    code = "import sys, gpucourse.kernels; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_run_isolated_passes_rows_and_reports_errors():
    def rows():
        yield {"a": 1}
        raise RuntimeError("boom")
    assert K.run_isolated(rows) == [{"a": 1}, {"error": "RuntimeError: boom"}]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_run_isolated_survives_a_crash_and_a_hang():
    def crash():
        yield {"before": True}
        os.kill(os.getpid(), signal.SIGKILL)
    assert K.run_isolated(crash) == [{"before": True}, {"crashed": "SIGKILL"}]

    def hang():
        yield {"started": True}
        time.sleep(60)
    assert K.run_isolated(hang, timeout=1.0) == [{"started": True}, {"timeout": 1.0}]


def test_probe_problem_words():
    base = {"n": 5, "block_size": 16, "dtype": "float32", "returned_out": True, "unwritten": 0,
            "first_unwritten": None, "wrong": 0, "past_end": False, "inputs_changed": False}
    assert K.probe_problem([base], configs=1) is None
    assert "wrote past the end of out" in K.probe_problem([{**base, "past_end": True}])
    assert "never written" in K.probe_problem([{**base, "unwritten": 2, "first_unwritten": 3}])
    assert "differ from alpha * x + y" in K.probe_problem([{**base, "wrong": 1}])
    assert "did not return out" in K.probe_problem([{**base, "returned_out": False}])
    assert "died" in K.probe_problem([{"crashed": "SIGKILL"}])
    assert "only 1 of 2" in K.probe_problem([base], configs=2)


# Kernels in this file (Triton needs their source), made in compiled mode: the probe interprets them.
if importlib.util.find_spec("triton") is not None:
    import triton
    import triton.language as tl

    @triton.jit
    def _masked(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK_SIZE: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n
        tl.store(out_ptr + offsets, alpha * tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
                 mask=mask)

    @triton.jit
    def _unmasked(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK_SIZE: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        tl.store(out_ptr + offsets, alpha * tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))

    def _launch(kernel, floor=False):
        def scaled_add(x, y, alpha, out, block_size=128):
            n = out.numel()
            kernel[(n // block_size if floor else triton.cdiv(n, block_size),)](x, y, out, n, alpha, BLOCK_SIZE=block_size)
            return out
        return scaled_add


CONFIGS = [(1, 16, "float32"), (64, 16, "float32"), (70, 16, "float32"), (37, 16, "float16")]


@needs_triton
def test_probe_passes_a_masked_kernel_in_compiled_mode():
    assert "TRITON_INTERPRET" not in os.environ or os.environ["TRITON_INTERPRET"] != "1"
    rows = K.probe_launch(_launch(_masked), CONFIGS, alpha=-1.5)
    assert K.probe_problem(rows, configs=len(CONFIGS)) is None, rows


@needs_triton
def test_probe_catches_a_missing_mask_and_a_floor_grid():
    rows = K.probe_launch(_launch(_unmasked), CONFIGS)
    assert [r["past_end"] for r in rows] == [True, False, True, True]
    rows = K.probe_launch(_launch(_masked, floor=True), CONFIGS)
    assert [r["unwritten"] for r in rows] == [1, 0, 6, 5]
    assert "never written" in K.probe_problem(rows)


@needs_triton
def test_kernels_as_swaps_and_restores():
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    space = {"k": _masked, "other": 3}
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        with K.kernels_as("interpreted", space):
            assert isinstance(space["k"], InterpretedFunction)
            interpreted = space["k"]
        with K.kernels_as("compiled", {"k": interpreted}) as _:
            assert "TRITON_INTERPRET" not in os.environ
        assert os.environ["TRITON_INTERPRET"] == "1"
        assert isinstance(K.compiled(interpreted), JITFunction)
    finally:
        os.environ.pop("TRITON_INTERPRET", None)
    assert space == {"k": _masked, "other": 3}
    x = torch.arange(5.0)
    out = torch.empty_like(x)
    K.interpreted(_masked)[(1,)](x, x, out, 5, 2.0, BLOCK_SIZE=8)
    assert torch.equal(out, 3 * x)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_run_isolated_after_the_parent_used_intra_op_threads():
    # A forked copy has none of the parent's OpenMP threads: a parallel op there would hang without the fix.
    a = torch.randn(512, 512)
    (a @ a).sum()
    torch.full((1 << 20,), 1.0).sum()

    def rows():
        yield {"sum": float((torch.full((1 << 20,), 1.0) * 2).sum())}
    assert K.run_isolated(rows, timeout=30) == [{"sum": float(1 << 21)}]


def test_cache_size_and_the_sizes_around_it():
    from gpucourse import kernels as K
    assert K.cache_bytes("cpu") >= 1 << 16
    sizes = K.sizes_around(50 * 2**20)
    assert sizes[0] == 1 << 16 and sizes[-1] * 4 >= 8 * 50 * 2**20 > sizes[-2] * 4
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert K.sizes_around(1, smallest=4) == [4]
    with pytest.raises(ValueError):
        K.sizes_around(0)


def test_fused_vs_eager_times_both_at_each_size_and_the_figure_marks_the_cache():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch
    from gpucourse import kernels as K
    results = K.fused_vs_eager([256, 1024], "cpu", lambda x, y, out: torch.add(y, x, alpha=2.0, out=out),
                               lambda x, y: 2.0 * x + y, min_seconds=0.01)
    assert set(results) == {256, 1024} and all(t["fused"] > 0 and t["eager"] > 0 for t in results.values())
    fig = K.plot_fused_vs_eager(results, "AMD EPYC", cache=4096, reference={1 << 20: {"fused": 2.2e-5, "eager": 2.2e-5}},
                                reference_label="NVIDIA H100 (measured)")
    times, ratio = fig.axes
    assert "AMD EPYC" in fig._suptitle.get_text()
    assert "MiB" in times.get_xlabel() and "µs" in times.get_ylabel() and "ratio" in ratio.get_ylabel()
    legend = [t.get_text() for t in times.get_legend().get_texts()]
    assert "fused: AMD EPYC" in legend and "eager: NVIDIA H100 (measured)" in legend
    assert any(line.get_ydata()[0] == 0.6 for line in ratio.get_lines() if len(line.get_ydata()) == 2)
    plt.close(fig)
    with pytest.raises(ValueError):
        K.plot_fused_vs_eager({}, "x", 1)


def test_scaled_add_beside_names_both_machines():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from gpucourse import kernels as K
    fig = K.plot_scaled_add_beside({"Triton scaled_add (fused)": 100.0}, "AMD EPYC: interpreter",
                                   {"Triton scaled_add (fused)": 0.022, "torch 2.0 * x + y": 0.022}, "NVIDIA H100 (measured)")
    ax = fig.axes[0]
    assert "scaled_add" in ax.get_title() and "ms" in ax.get_ylabel() and ax.get_xlabel()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["AMD EPYC: interpreter", "NVIDIA H100 (measured)"]
    plt.close(fig)

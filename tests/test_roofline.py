"""gpucourse.roofline (lesson 15's helpers) and the inputs and judges of lesson 15's checks."""

from __future__ import annotations

import importlib.util

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from conftest import ROOT  # noqa: E402
from gpucourse import reference  # noqa: E402
from gpucourse import roofline as RL  # noqa: E402
from gpucourse.checks import lesson15_roofline as L  # noqa: E402


def _hidden():
    spec = importlib.util.spec_from_file_location("hidden_lesson15", ROOT / "autograders" / "checks" / "lesson15_roofline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- counts: the helpers, the hand counts and the hidden judge agree -------------------------------

def test_kernels_count_flops_and_bytes_by_hand():
    mm = RL.matmul_kernel(6, 5, 3)
    assert (mm.flops, mm.bytes) == (2 * 6 * 5 * 3, 4 * (6 * 5 + 5 * 3 + 6 * 3))   # 180 FLOPs, 252 bytes
    assert mm.intensity == pytest.approx(180 / 252)
    half = RL.matmul_kernel(4, 4, 4, dtype=torch.bfloat16)
    assert half.bytes == 2 * 3 * 16 and half.intensity == pytest.approx(2 * 64 / 96)
    add = RL.add_kernel(10)
    assert (add.flops, add.bytes) == (10, 120) and add.intensity == pytest.approx(1 / 12)
    # 2 images, 3 channels, 9x9, 5 filters 3x3, stride 2, padding 1: P = Q = (9 + 2 - 3) // 2 + 1 = 5
    conv = RL.conv_kernel(2, 3, 9, 5, kernel=3, stride=2, padding=1)
    assert conv.flops == 2 * 2 * 5 * 5 * 5 * 3 * 3 * 3
    assert conv.bytes == 4 * (2 * 3 * 81 + 5 * 3 * 9 + 2 * 5 * 25)
    copy = RL.copy_kernel(8)
    assert (copy.flops, copy.bytes) == (0, 64)


def test_hidden_arithmetic_matches_what_pytorch_counts():
    """The grader's reference against FlopCounterMode and the tensors' sizes, on drawn shapes small enough to run."""
    import random

    from gpucourse.checks.values import rebuild

    hidden = _hidden()
    rng = random.Random(7)
    for spec in hidden.draw_matmul(rng)[:12]:
        op, shape, _ = rebuild(spec["args"])
        if op != "matmul":
            continue
        m, k, n = (min(int(v), 96) for v in shape)
        for dtype, b in ((torch.float32, 4), (torch.float16, 2)):
            kernel = RL.matmul_kernel(m, k, n, dtype=dtype)
            got = hidden.reference_intensity("matmul", (m, k, n), b)
            assert (got["flops"], got["bytes"]) == (kernel.flops, kernel.bytes), (m, k, n, dtype)
    for spec in hidden.draw_conv(rng):
        op, shape, _ = rebuild(spec["args"])
        if op != "conv2d":
            continue
        n, c, h, w, k, r, s, stride, pad = (int(v) for v in shape)
        n, c, k = min(n, 2), min(c, 8), min(k, 8)
        x, weight = torch.zeros(n, c, h, w), torch.zeros(k, c, r, s)
        out = F.conv2d(x, weight, stride=stride, padding=pad)
        flops = RL.counted_flops(lambda: F.conv2d(x, weight, stride=stride, padding=pad))
        got = hidden.reference_intensity("conv2d", (n, c, h, w, k, r, s, stride, pad), 4)
        assert (got["flops"], got["bytes"]) == (flops, 4 * (x.numel() + weight.numel() + out.numel())), shape


def test_public_hand_counts_equal_the_hidden_arithmetic():
    hidden = _hidden()
    for calls, wanted in ((L.PUBLIC_MATMUL, L.PUBLIC_MATMUL_WANT), (L.PUBLIC_ADD, L.PUBLIC_ADD_WANT),
                          (L.PUBLIC_CONV, L.PUBLIC_CONV_WANT)):
        for (op, shape, b), want in zip(calls, wanted):
            got = hidden.reference_intensity(op, tuple(shape), b)
            assert (got["flops"], got["bytes"]) == want, (op, shape)
    for args, want in zip(L.PUBLIC_ROOF, L.PUBLIC_ROOF_WANT):
        if want is None:
            with pytest.raises(ValueError):
                hidden.reference_bound(*args)
        else:
            assert (hidden.reference_attainable(*args), hidden.reference_bound(*args)) == want


def test_drawn_inputs_cover_what_the_text_states():
    import random

    import numpy as np

    from autograders.differential import outcome
    from gpucourse.checks.values import rebuild

    hidden = _hidden()
    for seed in range(3):
        rng = random.Random(seed)
        convs = [a for a in (rebuild(c["args"]) for c in hidden.draw_conv(rng)) if a[0] == "conv2d"]
        assert any((sh[2] + 2 * sh[8] - sh[5]) % sh[7] for _, sh, _ in convs), "a stride that does not divide"
        assert any(sh[5] != sh[6] for _, sh, _ in convs) and any(sh[8] > 0 for _, sh, _ in convs)
        assert any(sh[2] + 2 * sh[8] == sh[5] for _, sh, _ in convs), "a kernel exactly as large as the padded input"
        good = hidden.draw_matmul(rng) + hidden.draw_add(rng) + hidden.draw_conv(rng)
        assert all("returned" in outcome(hidden.reference_intensity, c) for c in good)
        calls = [rebuild(c["args"]) for c in good]
        assert any(1 in sh for op, sh, _ in calls if op == "matmul"), "a matrix-vector product"
        assert any(isinstance(v, np.integer) for _, sh, _ in calls for v in sh), "NumPy ints in a shape"
        assert any(isinstance(b, np.integer) for _, _, b in calls), "a NumPy int bytes_per_elem"
        assert any(b not in (1, 2, 4, 8) for _, _, b in calls), "any other bytes per element"
        assert any(hidden.reference_intensity(*c)["flops"] > 2**53 for c in calls), "counts above 2**53"
        assert all("raised" in outcome(hidden.reference_intensity, c) for c in hidden.draw_bad(rng))
        roofs = [rebuild(c["args"]) for c in hidden.draw_roofs(rng)]
        assert {hidden.reference_bound(*a) for a in roofs} == {"memory", "compute"}
        assert any(isinstance(a[1], int) and a[1] > 2**53 for a in roofs), "ints above 2**53"
        for a in [rebuild(c["args"]) for c in hidden.draw_ridge(rng)]:
            assert a[0] * a[2] == a[1] and hidden.reference_bound(*a) == "compute", a
        for c in hidden.draw_roof_bad(rng):
            assert "raised" in outcome(hidden.reference_attainable, c) and "raised" in outcome(hidden.reference_bound, c)


def _reference_answers():
    ns = {}
    exec(_hidden_free_source("arithmetic_intensity"), ns)
    exec(_hidden_free_source("roofline_bound"), ns)
    return ns


def _hidden_free_source(exercise):
    import nbformat

    nb = nbformat.read(ROOT / "solutions" / "lesson15_roofline" / "roofline.ipynb", 4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == exercise)
    return cell.source


@pytest.mark.parametrize("exercise", ["arithmetic_intensity", "roofline_bound"])
def test_the_solution_passes_every_case_and_a_miscount_fails(exercise):
    import random

    import numpy as np

    from gpucourse import checks

    hidden = _hidden()
    ns = _reference_answers()
    if exercise == "arithmetic_intensity":  # the text allows any integer: NumPy's too
        assert ns["arithmetic_intensity"]("add", (np.int64(2),), 4) == {"flops": 2, "bytes": 24, "intensity": 2 / 24}
    cases = checks.public_cases(exercise) + hidden.HIDDEN[exercise]
    for case in cases:
        assert checks.run_case(case, ns, random.Random(0)) is None, case.name
    if exercise == "arithmetic_intensity":
        wrong = dict(ns, arithmetic_intensity=lambda op, shape, b: {**ns["arithmetic_intensity"](op, shape, b), "flops": 1})
    else:
        wrong = dict(ns, bound=lambda i, p, b: "memory" if i * b <= p else "compute")
    assert any(checks.run_case(c, wrong, random.Random(0)) for c in cases)


def test_judges_report_a_missing_or_malformed_observation():
    assert "expected 2 answers" in L.judge_counts(None, L.PUBLIC_MATMUL, lambda *a: (1, 1))
    assert "no answer was recorded" in L.judge_counts([None, None], L.PUBLIC_MATMUL, lambda *a: (1, 1))
    assert "exactly the keys" in L.judge_counts([{"type": "tuple"}] * 2, L.PUBLIC_MATMUL, lambda *a: (1, 1))
    assert "no answer was recorded" in L.judge_roof([None] * 4, L.PUBLIC_ROOF, lambda *a: (1.0, "memory"))


# --- measurements on tiny sizes --------------------------------------------------------------------

def test_roofs_and_overheads_measure_positive_numbers():
    assert RL.peak_flops((16, 32), min_seconds=0.01) > 0
    streams = RL.memory_bandwidth(2**16, min_seconds=0.01)
    assert set(streams) == {"copy", "add"} and all(v > 0 for v in streams.values())
    with RL.threads(1):
        assert torch.get_num_threads() == 1
        assert all(s > 0 for s in RL.op_seconds([1, 64], min_seconds=0.01))
    assert all(s > 0 for s in RL.chain_seconds([1, 3], numel=4, min_seconds=0.01))
    points = RL.measure_rounds([RL.matmul_kernel(8, 8, 8), RL.add_kernel(100)], rounds=2, min_seconds=0.01)
    assert [p["name"] for p in points] == ["matmul 8x8x8", "add 100"]
    assert all(p["seconds"] > 0 and p["flops_per_s"] == p["flops"] / p["seconds"] for p in points)
    point = RL.add_kernel(50).measure(min_seconds=0.01)
    assert point["bytes_per_s"] == point["bytes"] / point["seconds"] > 0


def test_chain_runs_n_ops_and_bad_inputs_are_refused():
    x = torch.ones(3)
    assert torch.allclose(RL.chain(x, 2), x * 0.5 + 1.0) and torch.allclose(RL.chain(x, 3), (x * 0.5 + 1.0) * 0.5)
    with pytest.raises(ValueError):
        RL.peak_flops(())
    with pytest.raises(ValueError):
        RL.memory_bandwidth(2)
    with pytest.raises(ValueError):
        RL.measure_rounds([], rounds=1)


def test_h100_spec_is_labelled_as_not_measured_and_reference_names_exist():
    spec = RL.H100_SXM_BANDWIDTH_SPEC
    assert spec["status"] == "vendor spec, not measured by this course" and "datasheet" in spec["source"]
    ref = reference.load()
    for name, label in (("matmul_tflops", "float16 8192"), ("matmul_tflops", "float32 8192"), ("matmul_tflops", "tf32 8192"),
                        ("lesson02_matmul_tflops", "GPU float32 128"), ("lesson02_scaled_add_ms", "torch 2.0 * x + y"),
                        ("resnet18_cuda_graph_ms", "b512 32px fp32 cudnn-tf32 cuda graph"),
                        ("lesson11_gpu_profile_us", "self CPU time, 3 steps")):
        assert ref.value(name, label) > 0


# --- figures ---------------------------------------------------------------------------------------

def test_roofline_figure_names_hardware_axes_and_units():
    points = [{"name": "a", "intensity": 0.1, "flops_per_s": 1e9}, {"name": "b", "intensity": 100, "flops_per_s": 5e10}]
    fig = RL.draw_roofline({"float32": 1e11}, 2e10, points, hardware="Test CPU, 1 thread", title="Roofline")
    ax = fig.axes[0]
    assert "Roofline" in ax.get_title() and "Test CPU" in ax.get_title()
    assert "FLOP per byte" in ax.get_xlabel() and "FLOP/s" in ax.get_ylabel()
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert any("GB/s" in t.get_text() for t in ax.get_legend().get_texts())
    no_memory = RL.draw_roofline({"fp16": 6e14, "fp32": 5e13}, None, points, hardware="H100")
    assert not any("GB/s" in t.get_text() for t in no_memory.axes[0].get_legend().get_texts())
    with pytest.raises(ValueError):
        RL.draw_roofline({}, 1e9, points, hardware="x")
    plt.close("all")


def test_overhead_and_chain_figures_name_hardware_axes_and_units():
    fig = RL.draw_op_overhead([1, 10, 100], [1e-6, 1e-6, 2e-6], hardware="Test CPU")
    left, right = fig.axes
    assert "Test CPU" in fig.get_suptitle() and "(µs)" in left.get_ylabel() and "(GB/s)" in right.get_ylabel()
    assert "elements" in left.get_xlabel()
    fig = RL.draw_chain([1, 2], [1e-6, 2e-6], hardware="Test CPU", compiled={2: 5e-7})
    ax = fig.axes[0]
    assert "Test CPU" in ax.get_title() and "(µs)" in ax.get_ylabel() and "operations" in ax.get_xlabel()
    assert len(ax.get_legend().get_texts()) == 2
    with pytest.raises(ValueError):
        RL.draw_chain([1], [], hardware="x")
    with pytest.raises(ValueError):
        RL.draw_op_overhead([], [], hardware="x")
    plt.close("all")

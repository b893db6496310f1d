"""gpucourse.tensor_cores (lesson 3's helpers)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpucourse import tensor_cores as T


@pytest.mark.parametrize("n, multiple, padded", [(0, 8, 0), (1, 8, 8), (8, 8, 8), (30, 8, 32), (9, 4, 12), (17, 16, 32)])
def test_pad_to(n, multiple, padded):
    assert T.pad_to(n, multiple) == padded


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        T.pad_to(-1, 8)
    with pytest.raises(ValueError, match="no Tensor Core guidance"):
        T.multiple_for(torch.int64)
    with pytest.raises(ValueError):
        T.example_mlp([4])


def test_alignment_rules_are_sixteen_bytes():
    for dtype, multiple in T.ALIGNMENT.items():
        assert multiple * torch.tensor([], dtype=dtype).element_size() == 16


def test_lint_finds_the_misaligned_dimensions():
    model = nn.Sequential(nn.Linear(15, 64), nn.ReLU(), nn.Linear(64, 5), nn.Conv2d(3, 16, 3), nn.Embedding(1000, 30))
    found = {(i.layer, i.attribute, i.value, i.suggestion) for i in T.lint(model, torch.float16, batch_size=123)}
    assert found == {("batch", "size", 123, 128), ("0", "in_features", 15, 16), ("2", "out_features", 5, 8),
                     ("3", "in_channels", 3, 8), ("4", "embedding_dim", 30, 32)}
    assert T.lint(nn.Linear(8, 16), torch.float16) == [] and len(T.lint(nn.Linear(8, 16), torch.int8)) == 1
    assert str(T.Issue("fc", "out_features", 5, 8)) == "fc.out_features = 5: pad to 8"


def test_example_mlp_shape():
    model = T.example_mlp([15, 30, 3], nn.Tanh)
    assert [type(m).__name__ for m in model] == ["Linear", "Tanh", "Linear"]
    assert model(torch.zeros(2, 15)).shape == (2, 3)


def test_tf32_settings_name_both_apis():
    settings = T.tf32_settings()
    assert settings["torch.get_float32_matmul_precision()"] in {"highest", "high", "medium"}
    assert "torch.backends.cuda.matmul.fp32_precision" in settings


def test_benchmarks_return_positive_rates():
    rates = T.alignment_benchmark(64, torch.float32, "cpu", offsets=(0, 1), min_seconds=0.01)
    assert set(rates) == {64, 65} and all(r > 0 for r in rates.values())
    assert set(T.activation_throughput(1 << 10, min_seconds=0.01)) == {"relu", "gelu", "tanh", "sigmoid"}


def test_case_codes_are_described():
    assert all(isinstance(v, str) and v for v in T.CODES.values()) and len(T.CODES) == 7


def _agg():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def test_float32_matmul_sets_todays_setting_and_restores_it():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    with T.float32_matmul("tf32"):
        assert matmul.fp32_precision == "tf32"
    assert matmul.fp32_precision == before
    with pytest.raises(RuntimeError), T.float32_matmul("ieee"):
        raise RuntimeError("restored on the way out too")
    assert matmul.fp32_precision == before
    with pytest.raises(ValueError, match="'ieee' or 'tf32'"), T.float32_matmul("high"):
        pass


def test_cpu_threads_restores_the_count():
    before = torch.get_num_threads()
    with T.cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError):
        with T.cpu_threads(0):
            pass


def test_precision_rates_on_a_cpu_time_float32_only_and_refuse_unknown_names():
    rates = T.precision_rates(32, "cpu", min_seconds=0.01)
    assert list(rates) == ["float32 (TF32 off)"] and rates["float32 (TF32 off)"] > 0
    with pytest.raises(ValueError, match="unknown precision"):
        T.precision_rates(32, "cpu", names=["float8"])
    assert set(T.PRECISIONS) == {"float32 (TF32 off)", "TF32", "float16", "bfloat16"}


def test_reference_precisions_and_alignment_labels_line_machines_up():
    from gpucourse import reference as R

    ref = T.reference_precisions(R.load("h100"), (8192, 8191))
    assert ref[8192] == {"float32 (TF32 off)": 51.3, "TF32": 356.6, "float16": 635.4, "bfloat16": 665.2}
    labelled = T.alignment_labels(ref, 8192)
    assert labelled["TF32, aligned"] == 356.6 and labelled["TF32, misaligned"] == 134.4 and len(labelled) == 8
    with pytest.raises(KeyError):
        T.reference_precisions(R.load("h100"), (4096,))[4096]["TF32"]


def test_precision_figure_names_both_machines_and_its_unit():
    plt = _agg()
    fig = T.plot_precisions({"float32 (TF32 off)": 0.05}, "this CPU, n = 256", {"float32 (TF32 off)": 51.3, "TF32": 356.6},
                            "NVIDIA H100 (measured), n = 8192", note="TF32 is 7x")
    ax = fig.axes[0]
    assert "precision" in ax.get_title().lower() and "7x" in ax.get_title()
    assert "TFLOP/s" in ax.get_ylabel() and "precision" in ax.get_xlabel()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["this CPU, n = 256", "NVIDIA H100 (measured), n = 8192"]
    plt.close(fig)


def test_alignment_figure_is_relative_to_the_aligned_size_and_colours_by_multiple():
    plt = _agg()
    fig = T.plot_alignment({256: 2.0, 257: 1.0, 264: 2.2}, "AMD EPYC, float32", multiple=8,
                           reference={4096: 625.3, 4097: 83.2}, reference_label="NVIDIA H100, float16")
    mine, ref = fig.axes
    assert "Aligned" in fig._suptitle.get_text()
    assert mine.get_title() == "AMD EPYC, float32" and ref.get_title() == "NVIDIA H100, float16"
    assert "%" in mine.get_ylabel() and "n" in mine.get_xlabel()
    assert [round(p.get_height()) for p in mine.patches] == [100, 50, 110]
    assert [round(p.get_height(), 1) for p in ref.patches] == [100.0, 13.3]
    colours = [p.get_facecolor()[:3] for p in mine.patches]
    assert colours[0] == colours[2] != colours[1]
    plt.close(fig)
    with pytest.raises(ValueError):
        T.plot_alignment({}, "x")

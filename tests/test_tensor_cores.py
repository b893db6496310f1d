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

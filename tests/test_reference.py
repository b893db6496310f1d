"""The shipped GPU reference (gpucourse.reference): one schema for every file, and the chart beside it."""

from __future__ import annotations

import copy
import json

import matplotlib

matplotlib.use("Agg")
import pytest

from gpucourse import reference as R


def test_every_shipped_reference_keeps_the_schema_and_its_provenance():
    assert R.names(), "no reference shipped"
    for name in R.names():
        ref = R.load(name)
        assert R.validate(dict(ref.data)) == []
        assert ref.data["status"] == "measured, not estimated"
        assert ref.data["device"]["kind"] == "cuda"
        assert ref.data["date"] and ref.data["commit"]


def test_bench_reference_is_the_package_folder():
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "bench" / "reference"
    assert bench.resolve() == R.FOLDER.resolve()


@pytest.mark.parametrize("breakage, message", [
    (lambda d: d.pop("commit"), "'commit'"),
    (lambda d: d.update(status="estimated"), "only measured numbers"),
    (lambda d: d["device"].pop("name"), "device.name"),
    (lambda d: d["measurements"]["h2d_gbps"].pop("unit"), "no 'unit'"),
    (lambda d: d["measurements"]["h2d_gbps"]["values"].update(pinned=float("nan")), "non-negative number"),
    (lambda d: d["measurements"]["h2d_gbps"]["values"].update(pinned="fast"), "non-negative number"),
    (lambda d: d.update(measurements={}), "at least one measurement"),
])
def test_validate_names_what_is_wrong(breakage, message):
    data = copy.deepcopy(dict(R.load("h100").data))
    breakage(data)
    problems = R.validate(data)
    assert any(message in p for p in problems), problems


def test_load_refuses_an_invalid_file_and_names_the_missing_measurement(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": R.SCHEMA}))
    with pytest.raises(ValueError, match="not a valid reference"):
        R.load(str(bad))
    with pytest.raises(KeyError, match="no measurement 'nope'"):
        R.load("h100").values("nope")
    with pytest.raises(FileNotFoundError, match="shipped: h100"):
        R.load("a100")


def test_reference_values_read_back():
    ref = R.load("h100")
    assert ref.unit("matmul_tflops") == "TFLOP/s"
    assert ref.value("matmul_tflops", "float16 8192") > ref.value("matmul_tflops", "float16 8191")
    assert "H100" in ref.label() and "measured" in ref.label()


def test_plot_beside_labels_both_machines_and_skips_what_was_not_measured():
    ref = R.load("h100")
    fig = R.plot_beside({"float32": 0.2}, {"float32": 51.3, "float16": 635.4}, title="Matmul 8192",
                        unit="TFLOP/s", mine_label="this CPU", reference_label=ref.label(),
                        note="the reference GPU is 250x faster", log=True)
    ax = fig.axes[0]
    assert "Matmul 8192" in ax.get_title() and "250x" in ax.get_title()
    assert ax.get_ylabel() == "TFLOP/s"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["this CPU", ref.label()]
    assert len(ax.patches) == 3  # no bar for the float16 this machine did not measure
    with pytest.raises(ValueError, match="nothing to plot"):
        R.plot_beside({}, {}, title="t", unit="u", mine_label="a", reference_label="b")

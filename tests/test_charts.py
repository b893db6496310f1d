"""The charts of lessons 1, 8, 9 and 10, drawn by their modules' helpers: a title, labelled axes with
units, and the hardware a measurement ran on (or, for data and diagrams, what stands in its place);
a measurement too small to show the lesson's point says so on the chart."""

from __future__ import annotations

import logging
import re

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gpucourse import processes_threads as P  # noqa: E402
from gpucourse import reference  # noqa: E402

HARDWARE = "Test CPU 9000, 2 logical CPUs"
UNIT = re.compile(r"\((s|×|count|items / s|thousands|[^()]*\bs\b[^()]*)\)")


def texts(fig) -> str:
    found = [fig._suptitle.get_text() if fig._suptitle else ""]
    for ax in fig.axes:
        found += [ax.get_title(), *(t.get_text() for t in ax.texts)]
    return "\n".join(found)


def assert_labelled(fig, hardware: str | None = HARDWARE):
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel(), ax
        assert UNIT.search(ax.get_xlabel()) or UNIT.search(ax.get_ylabel()), (ax.get_xlabel(), ax.get_ylabel())
    assert any(ax.get_title() for ax in fig.axes) or fig._suptitle is not None
    if hardware:
        assert hardware in texts(fig)


def rows(workload, kind_speedups, serial_s=0.4):
    found = [P.Measurement(workload, "serial", 1, serial_s, 1.0)]
    for kind, speedups in kind_speedups.items():
        found += [P.Measurement(workload, kind, w, serial_s / s, s) for w, s in speedups.items()]
    return found


def test_lesson1_a_run_where_processes_lose_says_why_on_the_chart_with_the_reference_beside_it():
    slow = rows("count_primes", {"threads": {1: 0.9, 2: 0.8}, "processes": {1: 0.3, 2: 0.6}})
    fast = rows("wait_io", {"threads": {1: 1.0, 4: 3.9}, "processes": {1: 0.9, 4: 3.5}})
    fig = P.plot_speedup_panels([slow, fast], hardware=HARDWARE, cores=2, smoke=True)
    assert_labelled(fig)
    notes = [t.get_text().replace("\n", " ") for t in fig.axes[0].texts]
    assert len(notes) == 1 and "never beat serial at smoke size" in notes[0]
    ref = reference.load().values(P.REFERENCE_SPEEDUP)
    assert f"16 processes {ref['processes x16']:.1f}×" in notes[0] and "16-core" in notes[0]
    assert len(fig.axes[1].texts) == 0, "a panel that shows the speedup needs no note"
    assert "smoke size" in fig._suptitle.get_text()
    plt.close(fig)
    loaded = P.speedup_note(slow, smoke=False)
    assert "this machine's load" in loaded
    assert P.speedup_note(rows("count_primes", {"processes": {2: 1.7}})) is None
    assert P.speedup_note(rows("wait_io", {"processes": {2: 0.5}})) is None, "there threads make the point"


def test_lesson1_loader_chart():
    fig = P.plot_loader_throughput({0: 50.0, 2: 90.0}, hardware=HARDWARE, cores=2)
    assert_labelled(fig)
    assert "(items / s)" in fig.axes[0].get_ylabel()
    plt.close(fig)
    with pytest.raises(ValueError):
        P.plot_loader_throughput({}, hardware=HARDWARE)


def test_lesson8_recompilation_chart_names_what_was_not_measured_yet():
    from gpucourse import tpus_xla as X

    runs = [X.CompileRun(graphs=k, seconds=0.1 * k) for k in (1, 2, 4)]
    fig = X.plot_recompilation([1, 2, 4], {"pad to longest": runs, "pad to buckets": []}, 16, hardware=HARDWARE)
    assert_labelled(fig)
    assert "not measured yet: pad to buckets" in fig._suptitle.get_text()
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["pad to longest"]
    plt.close(fig)


def test_lesson10_rank_grid_says_it_is_simulated():
    from gpucourse import beyond_one_machine as C

    fig = C.draw_rank_grid(2, 2)
    assert "simulated" in fig.axes[0].get_title()
    plt.close(fig)


@pytest.fixture(scope="module")
def air():
    pytest.importorskip("darts")
    from gpucourse import darts_forecasting as F

    F.write_air_passengers()
    from darts.datasets import AirPassengersDataset

    return AirPassengersDataset().load()


def test_lesson9_series_and_fit_time_charts(air):
    from gpucourse import darts_forecasting as F

    fig = F.plot_air_passengers(air)
    assert_labelled(fig, hardware=None)
    assert "(thousands)" in fig.axes[0].get_ylabel() and "not a measurement" in fig.axes[0].get_title()
    plt.close(fig)
    fig = F.plot_fit_times({"1 process x 2 threads": (1.0, 2.0), "2 processes x 1 thread(s)": (3.0, 1.5)}, 2, HARDWARE)
    assert_labelled(fig)
    plt.close(fig)


def test_lesson9_a_flat_forecast_says_why_and_a_seasonal_one_does_not(air):
    from darts import TimeSeries

    from gpucourse import darts_forecasting as F

    _, val = air.split_after(0.8)
    flat = TimeSeries.from_times_and_values(val.time_index, val.values() * 0 + float(val.values().mean()))
    fig = F.plot_forecast(air, flat, epochs=2, full_epochs=300, mape=20.0, hardware=HARDWARE)
    assert_labelled(fig)
    assert any("2 epochs (the smoke setting) are too few" in t.get_text().replace("\n", " ") and "300" in t.get_text()
               for t in fig.axes[0].texts)
    plt.close(fig)
    fig = F.plot_forecast(air, val * 1.05, epochs=300, full_epochs=300, mape=5.0, hardware=HARDWARE)
    assert len(fig.axes[0].texts) == 0
    plt.close(fig)


def test_lesson9_darts_errors_caught_on_purpose_are_not_logged(air, caplog):
    import numpy as np
    from darts import TimeSeries
    from darts.metrics import mape

    from gpucourse import darts_forecasting as F

    zero = TimeSeries.from_values(np.array([1.0, 0.0, 2.0]))

    def logged_errors():
        return [r for r in caplog.records if r.name.startswith("darts") and r.levelno >= logging.ERROR]

    before = logging.getLogger("darts").level
    with pytest.raises(ValueError), F.darts_errors_unlogged():
        mape(zero, zero + 1, zero_division="raise")
    assert logged_errors() == []
    assert logging.getLogger("darts").level == before
    with pytest.raises(ValueError):
        mape(zero, zero + 1, zero_division="raise")
    assert [r.getMessage() for r in logged_errors()] == \
        ["ValueError: Cannot compute metric: the denominator is zero for some entries."], "outside the block, as before"


def test_a_beside_chart_says_the_runs_size_and_load_and_where_it_contradicts_its_text(monkeypatch):
    """Lessons 4 and 5 label their ratio charts with gpucourse.timing.chart_note: the smoke size and the
    load average over this machine's CPUs, and, where this run's ratio says the opposite of the text, so."""
    import os

    from gpucourse import mixed_precision as amp, timing

    monkeypatch.setattr(os, "getloadavg", lambda: (7.5, 1.0, 1.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert timing.conditions(smoke=True) == "smoke size, load 7.5 on 2 CPUs (busy: other programs share them)"
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 1.0, 1.0))
    assert timing.conditions(smoke=False) == "full size, load 0.5 on 2 CPUs"
    monkeypatch.setenv("GPUCOURSE_SMOKE", "1")
    agreeing = timing.chart_note("this CPU has bfloat16 instructions.")
    assert agreeing.startswith("this CPU has bfloat16") and "smoke size, load 0.5 on 2 CPUs" in agreeing
    assert "otherwise" not in agreeing
    contradicted = timing.chart_note("this CPU has bfloat16 instructions.", "AMP bfloat16 ran at 0.80x float32's speed")
    assert "This run shows otherwise (AMP bfloat16 ran at 0.80x float32's speed) at smoke size" in contradicted
    fig = amp.beside({"float32": 1.0, "AMP bfloat16": 0.8}, {"float32": 1.0, "AMP bfloat16": 1.9}, title="speed",
                     unit="x float32's speed", mine_label=HARDWARE, reference_label="the reference GPU", note=contradicted)
    assert "shows otherwise" in texts(fig).replace("\n", " ")
    assert HARDWARE in [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    plt.close(fig)

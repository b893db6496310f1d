"""Tests of lesson 9's helpers: AirPassengers offline through Darts' own loader, the ddp script, the checks' maths."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import json
import warnings
from pathlib import Path

import pytest

from gpucourse import darts_forecasting as F

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def darts_cache(tmp_path, monkeypatch):
    """Point Darts' dataset cache at a fresh folder (the override Darts reads when a loader is created)."""
    from darts.datasets.dataset_loaders import DatasetLoader

    monkeypatch.setattr(DatasetLoader, "_DEFAULT_DIRECTORY", tmp_path / "datasets")
    return tmp_path / "datasets"


def test_csv_bytes_have_the_md5_darts_checks():
    from darts.datasets import AirPassengersDataset

    data = F.air_passengers_csv()
    assert hashlib.md5(data).hexdigest() == F.AIR_PASSENGERS_MD5 == AirPassengersDataset()._metadata.hash
    lines = data.decode().splitlines()
    assert lines[:3] == ["Month,#Passengers", "1949-01,112", "1949-02,118"] and lines[-1] == "1960-12,432"
    assert len(lines) == 145 and data.endswith(b"\n") and b"\r" not in data


def test_written_file_loads_through_darts_unchanged(darts_cache):
    from darts.datasets import AirPassengersDataset

    path = F.write_air_passengers()
    assert path == darts_cache / "air_passengers.csv" == F.darts_air_passengers_path()
    assert hashlib.md5(path.read_bytes()).hexdigest() == "167ffa96204a2b47339c21eea25baf32"
    series = AirPassengersDataset().load()  # would try the network if the file were missing, and raise if bad
    values = series.values().ravel()
    assert len(series) == 144 and values[0] == 112 and values[-1] == 432 and values.sum() == sum(F.AIR_PASSENGERS)
    assert str(series.start_time().date()) == "1949-01-01" and str(series.end_time().date()) == "1960-12-01"
    assert series.freq_str == "MS"


def test_good_file_is_left_alone_and_damaged_one_replaced(darts_cache):
    path = F.write_air_passengers()
    before = path.stat().st_mtime_ns, path.stat().st_ino
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a good file: no warning, no rewrite
        assert F.write_air_passengers() == path
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before
    path.write_bytes(F.air_passengers_csv()[:100])  # a cut download
    with pytest.warns(UserWarning, match="wrong md5"):
        F.write_air_passengers()
    assert path.read_bytes() == F.air_passengers_csv()


def test_refuses_bytes_with_another_md5(tmp_path):
    wrong = F.air_passengers_csv().replace(b"\n", b"\r\n")
    with pytest.raises(ValueError, match="md5"):
        F.write_air_passengers(tmp_path, data=wrong)
    assert not any(tmp_path.iterdir())
    assert F.write_air_passengers(tmp_path) == tmp_path / F.AIR_PASSENGERS_FILE


def test_ddp_process_count():
    assert F.ddp_process_count(2, 4) | {"cores": 0} == {"trainers": 2, "loader_workers": 8, "total": 10, "cores": 0}
    assert F.ddp_process_count(1, 0)["total"] == 1
    with pytest.raises(ValueError):
        F.ddp_process_count(0, 1)


def test_first_line():
    assert F.first_line(TypeError("bad key\nmore detail")) == "TypeError: bad key"


def test_script_has_the_main_guard_with_freeze_support():
    tree = ast.parse((ROOT / "src/gpucourse/darts_ddp.py").read_text())
    guards = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "__name__ == '__main__'"]
    assert len(guards) == 1
    calls = [ast.unparse(s.value) for s in guards[0].body if isinstance(s, ast.Expr)]
    assert calls == ["torch.multiprocessing.freeze_support()", "main()"]


def test_script_trains_and_reports_one_process(darts_cache, tmp_path):
    from gpucourse import darts_ddp

    out = tmp_path / "result.json"
    result = darts_ddp.main(["--devices", "1", "--epochs", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["strategy"] == "auto" and result["world_size"] == 1
    [rank] = result["ranks"]
    assert rank["rank"] == 0 and rank["batches_per_epoch"] >= 1 and rank["loop_s"] > 0
    assert 0 < result["mape"] < 200 and result["fit_s"] <= result["wall_s"]


def test_trainer_parameters_read_from_source_match_the_signature():
    import pytorch_lightning as pl

    from gpucourse.checks.lesson09_darts_forecasting import trainer_parameters

    expected = sorted(p for p in inspect.signature(pl.Trainer.__init__).parameters if p != "self")
    assert trainer_parameters() == expected
    assert "devices" in expected and not {"gpus", "tpu_cores", "auto_select_gpus"} & set(expected)


def test_hidden_reference_mape_matches_darts():
    """The grader's reference_mape equals darts' mape(..., zero_division="raise") on every hidden case's
    draws (month starts and ends, float32, tiny and negative actual values, zeros), over a few seeds."""
    import random

    import numpy as np
    import pandas as pd
    from darts import TimeSeries
    from darts.metrics import mape

    spec = importlib.util.spec_from_file_location("hidden09", ROOT / "autograders/checks/lesson09_darts_forecasting.py")
    hidden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hidden)

    def series(start, values, freq, dtype):
        first = pd.Timestamp("2000-01-01" if freq == "MS" else "2000-01-31") + pd.DateOffset(months=start)
        index = pd.date_range(first, periods=len(values), freq=freq)
        return TimeSeries.from_times_and_values(index, np.asarray(values, dtype=dtype))

    cases = [c for seed in range(3) for case in hidden.HIDDEN["mape"] for c in case.inputs(random.Random(seed))]
    assert any(c["forecast_start"] < 0 for c in cases) and any(c["forecast_start"] > 0 for c in cases)
    assert {c["freq"] for c in cases} == {"MS", "ME"} and {c["dtype"] for c in cases} == {"float64", "float32"}
    raised = 0
    for case in cases:
        actual = series(case["actual_start"], case["actual"], case["freq"], case["dtype"])
        forecast = series(case["forecast_start"], case["forecast"], case["freq"], case["dtype"])
        want = hidden.reference_mape(case)
        if want == "ValueError":
            raised += 1
            with pytest.raises(ValueError):
                mape(actual, forecast, zero_division="raise")
        else:
            assert float(mape(actual, forecast, zero_division="raise")) == pytest.approx(want, rel=1e-5)
    assert raised >= 8


def test_public_stored_values_agree_with_the_graders_references():
    """The public cases' stored results are what the hidden references give; the public module has none."""
    from gpucourse.checks import lesson09_darts_forecasting as L

    spec = importlib.util.spec_from_file_location("hidden09_ref", ROOT / "autograders/checks/lesson09_darts_forecasting.py")
    hidden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hidden)
    got = [hidden.reference_mape(case) for case in L.PUBLIC_MAPE_CASES]
    assert got[2] == L.PUBLIC_MAPE_EXPECTED[2] and got[:2] == pytest.approx(L.PUBLIC_MAPE_EXPECTED[:2], rel=1e-12)
    assert [hidden.reference_modern_trainer_kwargs(d) for d in L.PUBLIC_TRAINER_INPUTS] == L.PUBLIC_TRAINER_EXPECTED
    for name in ("mape_inputs", "trainer_inputs", "expected_mape", "expected_trainer_kwargs"):
        assert not hasattr(L, name), f"the public module still holds {name}"

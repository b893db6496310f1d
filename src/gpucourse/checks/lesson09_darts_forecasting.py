"""Public checks for lesson 9 (the Darts forecasting case study). Observers are self-contained: see lesson01_processes_threads.py.

``mape`` is called on Darts ``TimeSeries`` built from plain lists (a case's start months, values,
frequency and dtype), so judges never need the series; the public judges compare with stored values. ``modern_trainer_kwargs`` is
called on 2021-era ``pl_trainer_kwargs`` dicts; its answers are checked against the installed
Lightning's ``Trainer`` signature, read from its source with ``ast`` (importing Lightning takes
seconds). The hidden checks draw their inputs at grading time and hold their reference on the grader's side.
"""

from __future__ import annotations

import functools

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson09_darts_forecasting"  # the course folder this module's exercises belong to


# --- Exercise 1: mape ------------------------------------------------------------------------

def observe_mape_cases(ns, cases):
    """Call ``ns["mape"]`` on each case's two series; record a number or the exception's type name."""
    import numbers

    from gpucourse.checks import answer

    mape = answer(ns, "mape")  # before importing Darts (seconds): a missing answer is reported at once

    import numpy as np
    import pandas as pd
    from darts import TimeSeries

    def series(start, values, freq, dtype):
        """Monthly dates from January 2000 (+ ``start`` months): month starts ("MS") or month ends ("ME")."""
        first = pd.Timestamp("2000-01-01" if freq == "MS" else "2000-01-31") + pd.DateOffset(months=start)
        index = pd.date_range(first, periods=len(values), freq=freq)
        return TimeSeries.from_times_and_values(index, np.asarray(values, dtype=dtype))

    results = []
    for case in cases:
        freq, dtype = case.get("freq", "MS"), case.get("dtype", "float64")
        actual = series(case["actual_start"], case["actual"], freq, dtype)
        forecast = series(case["forecast_start"], case["forecast"], freq, dtype)
        try:
            value = mape(actual, forecast)
        except NotImplementedError:
            raise
        except Exception as error:  # an exception is an answer here: zeros must raise ValueError
            results.append({"error": type(error).__name__, "mro": [k.__name__ for k in type(error).__mro__]})
            continue
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            results.append({"value": float(value)})
        else:  # an array of shape (1,), a tensor, a list: not "a number"
            shape = getattr(value, "shape", None)
            results.append({"type": type(value).__name__ + (f" of shape {tuple(shape)}" if shape is not None else "")})
    return results


PUBLIC_MAPE_CASES = [
    # same span: |10-12|/10, |20-15|/20, |40-40|/40 -> 100 * (0.2 + 0.25 + 0) / 3
    {"actual_start": 0, "actual": [10.0, 20.0, 40.0], "forecast_start": 0, "forecast": [12.0, 15.0, 40.0]},
    # the forecast covers the last two months only: (|20-30|/20 + |40-20|/40) / 2 = 0.5
    {"actual_start": 0, "actual": [10.0, 20.0, 40.0], "forecast_start": 1, "forecast": [30.0, 20.0]},
    # a zero in the common span: ValueError
    {"actual_start": 0, "actual": [5.0, 0.0, 5.0], "forecast_start": 0, "forecast": [5.0, 1.0, 5.0]},
]
PUBLIC_MAPE_EXPECTED = [100 * (0.2 + 0.25) / 3, 50.0, "ValueError"]


def observe_public_mape(ns):
    from gpucourse.checks.lesson09_darts_forecasting import PUBLIC_MAPE_CASES, observe_mape_cases

    return observe_mape_cases(ns, PUBLIC_MAPE_CASES)


def judge_mape_results(results, expected) -> str | None:
    """Compare recorded results with expected numbers (relative 1e-5) or exception names."""
    if len(results) != len(expected):
        return f"expected {len(expected)} results, got {len(results)}"

    def close(a, b):  # relative 1e-5: a computation in float32 is as right as one in float64
        return abs(a - b) <= 1e-5 * max(1.0, abs(b))

    for i, (got, want) in enumerate(zip(results, expected)):
        if isinstance(want, str):
            if want not in got.get("mro", [got.get("error")]):
                return f"case {i}: a zero in the actual values of the common span must raise {want}, got {got}"
        elif "type" in got:
            return f"case {i}: return a number (a float), not a {got['type']}"
        elif "error" in got:
            return (f"case {i}: raised {got['error']}, but no actual value in the common span is 0 "
                    f"(zeros elsewhere, or in the forecast, are no error)")
        elif close(100 * got["value"], want) and not close(got["value"], want):
            return f"case {i}: got {got['value']:.6g}: the MAPE is in percent, not a fraction"
        elif not close(got["value"], want):
            return f"case {i}: got {got['value']:.6g}, which is not the MAPE of these two series"
    return None


register("mape", Case("three small cases: same span, a shorter forecast, a zero", observe_public_mape,
                      lambda d: judge_mape_results(d, PUBLIC_MAPE_EXPECTED)),
         answers=[Answer("mape", "function",
                         "a function mape(actual, forecast) of two Darts TimeSeries returning the MAPE in percent, "
                         "a float")], points=2)


# --- Exercise 2: modern_trainer_kwargs --------------------------------------------------------

@functools.lru_cache(maxsize=None)  # one parse per process: several cases call it
def trainer_parameters() -> list[str]:
    """The keyword arguments the installed ``pytorch_lightning.Trainer.__init__`` accepts, from its source."""
    import ast
    import importlib.util
    from pathlib import Path

    source = Path(importlib.util.find_spec("pytorch_lightning").origin).parent / "trainer" / "trainer.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "Trainer":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = item.args
                    return sorted(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg != "self")
    raise RuntimeError(f"no Trainer.__init__ in {source}")


def observe_trainer_kwargs_cases(ns, inputs):
    """Call ``ns["modern_trainer_kwargs"]`` on copies of ``inputs``; record results, rejected keys, mutation."""
    import copy

    from gpucourse.checks import answer
    from gpucourse.checks.lesson09_darts_forecasting import trainer_parameters

    modern_trainer_kwargs = answer(ns, "modern_trainer_kwargs")
    accepted = set(trainer_parameters())
    results = []
    for old in inputs:
        given = copy.deepcopy(old)
        new = modern_trainer_kwargs(given)
        if not isinstance(new, dict):
            results.append({"type": type(new).__name__})
            continue
        results.append({"result": {str(k): (v if isinstance(v, (int, float, str, list, type(None))) else repr(v))
                                   for k, v in new.items()},
                        "rejected": sorted(str(k) for k in new if k not in accepted),
                        "input_changed": given != old, "same_object": new is given})
    return results


PUBLIC_TRAINER_INPUTS = [
    {"accelerator": "gpu", "devices": -1, "auto_select_gpus": True},  # the seed's multi-GPU dict
    {"accelerator": "tpu", "tpu_cores": [4]},  # the seed's TPU dict
    {"gpus": 2, "max_epochs": 5},
]
PUBLIC_TRAINER_EXPECTED = [
    {"accelerator": "gpu", "devices": -1},
    {"accelerator": "tpu", "devices": [3]},  # 1.x numbered TPU cores from 1, devices counts from 0
    {"accelerator": "gpu", "devices": 2, "max_epochs": 5},
]


def observe_public_trainer_kwargs(ns):
    from gpucourse.checks.lesson09_darts_forecasting import PUBLIC_TRAINER_INPUTS, observe_trainer_kwargs_cases

    return observe_trainer_kwargs_cases(ns, PUBLIC_TRAINER_INPUTS)


def judge_trainer_kwargs(results, inputs, expected) -> str | None:
    """Every answer must be a new dict, accepted by today's Trainer, equal to the rules' result."""
    for old, got, want in zip(inputs, results, expected):
        if "type" in got:
            return f"return a dict, not a {got['type']}"
        if got["input_changed"] or got["same_object"]:
            return f"for {old}: build a new dict and leave the caller's dict unchanged"
        if got["rejected"]:
            return f"for {old}: today's pytorch_lightning.Trainer has no argument(s) {got['rejected']}"
        if got["result"] != want:
            return f"for {old}: got {got['result']}, which does not follow {_broken_rule(old, got['result'], want)}"
    return None if len(results) == len(expected) else "missing results"


def _broken_rule(old: dict, got: dict, want: dict) -> str:
    """Which row of the rules' table a wrong result breaks, in the table's words (not the expected dict)."""
    differ = {k for k in set(got) | set(want) if got.get(k, "<absent>") != want.get(k, "<absent>")}
    if differ & {"accelerator", "devices"}:
        if "gpus" in old:
            return ("the rule for gpus=0 or gpus=None" if old["gpus"] is None or old["gpus"] == 0
                    else "the rule for gpus=n (n not 0 or None)")
        if "tpu_cores" in old:
            return "the rule for tpu_cores=[i]" if isinstance(old["tpu_cores"], list) else "the rule for tpu_cores=n"
        if "num_processes" in old:
            return "the rule for num_processes=n"
    if "strategy" in differ and old.get("strategy") == "dp":
        return 'the rule for strategy="dp"'
    return "the rule that any other key stays unchanged"


register("modern_trainer_kwargs", Case("the seed's two dicts and gpus=2", observe_public_trainer_kwargs,
                                       lambda d: judge_trainer_kwargs(d, PUBLIC_TRAINER_INPUTS, PUBLIC_TRAINER_EXPECTED)),
         answers=[Answer("modern_trainer_kwargs", "function",
                         "a function modern_trainer_kwargs(old) returning a new dict of Trainer arguments")],
         points=2)

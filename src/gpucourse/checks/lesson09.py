"""Public checks for lesson 9 (the Darts forecasting case study). Observers are self-contained: see lesson01.py.

``mape`` is called on Darts ``TimeSeries`` built from plain lists (``mape_inputs`` regenerates the
same inputs wherever it runs, so judges never need the series). ``modern_trainer_kwargs`` is
called on 2021-era ``pl_trainer_kwargs`` dicts; its answers are checked against the installed
Lightning's ``Trainer`` signature, read from its source with ``ast`` (importing Lightning takes
seconds). ``trainer_inputs`` generates such dicts from a seed, as plain data, for the grader's own cases.
"""

from __future__ import annotations

import functools

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson09_darts_forecasting"  # the course folder this module's exercises belong to


# --- Exercise 1: mape ------------------------------------------------------------------------

def mape_inputs(seed: int, count: int, negatives: bool = False) -> list[dict]:
    """``count`` (actual, forecast) pairs as plain data: monthly starts (offsets in months) and values.

    The two spans always share at least one month; a forecast may start before or after the
    actual series and end before or after it. Values are rounded to 3 decimals, never 0.
    """
    import random

    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        n_actual = rng.randint(2, 30)
        actual = [round(rng.uniform(5, 500) * (rng.choice([-1, 1]) if negatives else 1), 3) for _ in range(n_actual)]
        start = rng.randint(-6, n_actual - 1)  # the forecast's first month, relative to the actual's first
        end = rng.randint(max(start, 0), n_actual - 1 + rng.randint(0, 6))  # last month, at least one in common
        forecast = []
        for t in range(start, end + 1):
            base = actual[t] if 0 <= t < n_actual else rng.uniform(5, 500)
            forecast.append(round(base * rng.uniform(0.6, 1.5), 3) or 1.0)
        cases.append({"actual_start": 0, "actual": actual, "forecast_start": start, "forecast": forecast})
    return cases


def observe_mape_cases(ns, cases):
    """Call ``ns["mape"]`` on each case's two series; record a number or the exception's type name."""
    import numbers

    from gpucourse.checks import answer

    mape = answer(ns, "mape")  # before importing Darts (seconds): a missing answer is reported at once

    import numpy as np
    import pandas as pd
    from darts import TimeSeries

    def series(start, values):
        index = pd.date_range(pd.Timestamp("2000-01-01") + pd.DateOffset(months=start), periods=len(values), freq="MS")
        return TimeSeries.from_times_and_values(index, np.asarray(values, dtype=np.float64))

    results = []
    for case in cases:
        actual, forecast = series(case["actual_start"], case["actual"]), series(case["forecast_start"], case["forecast"])
        try:
            value = mape(actual, forecast)
        except NotImplementedError:
            raise
        except Exception as error:  # an exception is an answer here: zeros must raise ValueError
            results.append({"error": type(error).__name__})
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
    from gpucourse.checks.lesson09 import PUBLIC_MAPE_CASES, observe_mape_cases

    return observe_mape_cases(ns, PUBLIC_MAPE_CASES)


def judge_mape_results(results, expected) -> str | None:
    """Compare recorded results with expected numbers (relative 1e-5) or exception names."""
    if len(results) != len(expected):
        return f"expected {len(expected)} results, got {len(results)}"

    def close(a, b):  # relative 1e-5: a computation in float32 is as right as one in float64
        return abs(a - b) <= 1e-5 * max(1.0, abs(b))

    for i, (got, want) in enumerate(zip(results, expected)):
        if isinstance(want, str):
            if got.get("error") != want:
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


def trainer_inputs(seed: int, count: int) -> list[dict]:
    """``count`` random 2021-era ``pl_trainer_kwargs`` dicts (plain data), keys in random order: at most one of
    ``gpus`` (ints, -1, lists, strings, 0, None), ``tpu_cores`` (an int or ``[i]``) and ``num_processes``; an
    ``accelerator`` that agrees with it or none; ``auto_select_gpus`` with any value; a ``strategy``; other keys.
    """
    import random

    rng = random.Random(seed)
    others = {"max_epochs": [1, 30, 300], "precision": [16, 32, "bf16-true", "16-mixed"], "gradient_clip_val": [0.5, 1.0],
              "enable_progress_bar": [False, True], "accumulate_grad_batches": [2, 4], "num_nodes": [1, 2],
              "logger": [False], "deterministic": [True], "limit_train_batches": [0.25, 10], "callbacks": [[]]}
    dicts = []
    for _ in range(count):
        items = []
        device = rng.choice(["gpus", "gpus", "no gpu", "tpu int", "tpu core", "num_processes", "devices", None])
        if device == "gpus":
            items.append(("gpus", rng.choice([1, 2, 4, 8, -1, [0], [1, 3], [2, 0, 1], "0,1", "1,3", "0,1,2,3"])))
            items += [("accelerator", "gpu")] if rng.random() < 0.3 else []
        elif device == "no gpu":
            items.append(("gpus", rng.choice([0, None])))
            items += [("accelerator", "cpu")] if rng.random() < 0.3 else []
        elif device == "tpu int":
            items.append(("tpu_cores", rng.choice([1, 8])))
            items += [("accelerator", "tpu")] if rng.random() < 0.3 else []
        elif device == "tpu core":
            items.append(("tpu_cores", [rng.randint(1, 8)]))
            items += [("accelerator", "tpu")] if rng.random() < 0.3 else []
        elif device == "num_processes":
            items.append(("num_processes", rng.randint(1, 8)))
            items += [("accelerator", rng.choice(["cpu", "gpu"]))] if rng.random() < 0.5 else []
        elif device == "devices":
            items += [("accelerator", rng.choice(["cpu", "gpu", "tpu"])), ("devices", rng.choice([1, 2, -1, [0]]))]
        if rng.random() < 0.4:
            items.append(("auto_select_gpus", rng.choice([True, False, None])))
        if rng.random() < 0.5:
            items.append(("strategy", rng.choice(["dp", "dp", "ddp", "ddp_spawn", "auto", "ddp_notebook"])))
        for key in rng.sample(sorted(others), rng.randint(0, 3)):
            items.append((key, rng.choice(others[key])))
        rng.shuffle(items)
        dicts.append(dict(items))
    return dicts


def observe_trainer_kwargs_cases(ns, inputs):
    """Call ``ns["modern_trainer_kwargs"]`` on copies of ``inputs``; record results, rejected keys, mutation."""
    import copy

    from gpucourse.checks import answer
    from gpucourse.checks.lesson09 import trainer_parameters

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
    from gpucourse.checks.lesson09 import PUBLIC_TRAINER_INPUTS, observe_trainer_kwargs_cases

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

"""Hidden checks for lesson 9 (the Darts forecasting case study). Never released; see lesson01's file for the form.

The expected MAPEs are computed here, in the grader, in plain Python from the same generated
inputs the observer builds its series from (``gpucourse.checks.lesson09.mape_inputs``); a test
(tests/test_forecasting.py) keeps this arithmetic equal to ``darts.metrics.mape(..., zero_division="raise")``.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson09 import judge_mape_results, judge_trainer_kwargs, mape_inputs



def expected_mape(case):
    """100 * mean |(a - f) / a| over the months both series cover; "ValueError" for a zero there."""
    actual = {case["actual_start"] + i: v for i, v in enumerate(case["actual"])}
    forecast = {case["forecast_start"] + i: v for i, v in enumerate(case["forecast"])}
    common = sorted(set(actual) & set(forecast))
    if any(actual[t] == 0 for t in common):
        return "ValueError"
    return 100.0 * sum(abs((actual[t] - forecast[t]) / actual[t]) for t in common) / len(common)


def with_zeros():
    """Zeros inside the common span must raise; a zero outside it must not matter."""
    inside = {"actual_start": 0, "actual": [3.0, 4.0, 0.0, 6.0, 7.0], "forecast_start": 1, "forecast": [4.0, 1.0, 6.0]}
    outside = {"actual_start": 0, "actual": [0.0, 4.0, 5.0, 8.0], "forecast_start": 1, "forecast": [5.0, 5.0, 6.0]}
    both_zero = {"actual_start": 2, "actual": [2.0, 0.0], "forecast_start": 0, "forecast": [9.0, 9.0, 2.0, 0.0, 1.0]}
    return [inside, outside, both_zero]


MAPE_SETS = {
    "random spans, positive values": mape_inputs(seed=9, count=12),
    "random spans, negative values too": mape_inputs(seed=90, count=8, negatives=True),
    "zeros inside and outside the common span": with_zeros(),
}


def observe_mape_positive(ns):
    from gpucourse.checks.lesson09 import mape_inputs, observe_mape_cases
    return observe_mape_cases(ns, mape_inputs(seed=9, count=12))


def observe_mape_negative(ns):
    from gpucourse.checks.lesson09 import mape_inputs, observe_mape_cases
    return observe_mape_cases(ns, mape_inputs(seed=90, count=8, negatives=True))


def observe_mape_zeros(ns):
    from gpucourse.checks.lesson09 import observe_mape_cases
    return observe_mape_cases(ns, [
        {"actual_start": 0, "actual": [3.0, 4.0, 0.0, 6.0, 7.0], "forecast_start": 1, "forecast": [4.0, 1.0, 6.0]},
        {"actual_start": 0, "actual": [0.0, 4.0, 5.0, 8.0], "forecast_start": 1, "forecast": [5.0, 5.0, 6.0]},
        {"actual_start": 2, "actual": [2.0, 0.0], "forecast_start": 0, "forecast": [9.0, 9.0, 2.0, 0.0, 1.0]},
    ])


def _mape_judge(cases):
    expected = [expected_mape(c) for c in cases]
    return lambda data: judge_mape_results(data, expected)


# --- modern_trainer_kwargs: the rules' table, every row ------------------------------------------------

TRAINER_EXPECTED = [
    {"accelerator": "gpu", "devices": 1},
    {"accelerator": "gpu", "devices": [1, 3], "precision": 16},
    {"accelerator": "gpu", "devices": "0,1", "strategy": "ddp"},
    {"accelerator": "gpu", "devices": -1, "strategy": "ddp_spawn"},
    {"accelerator": "cpu", "max_epochs": 3},
    {"accelerator": "cpu"},
    {"accelerator": "gpu", "devices": 4},
    {"accelerator": "tpu", "devices": 8},
    {"accelerator": "tpu", "devices": [3], "max_epochs": 300},
    {"accelerator": "tpu", "devices": [4]},
    {"accelerator": "tpu", "devices": [0], "precision": "bf16-true"},
    {"accelerator": "tpu", "devices": 1},
    {"accelerator": "cpu", "devices": 2},
    {"accelerator": "cpu", "devices": 3, "strategy": "ddp_spawn"},
    {"strategy": "ddp_spawn", "accelerator": "gpu", "devices": 2},
    {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "gradient_clip_val": 0.5},
    {},
]


def observe_trainer_table(ns):
    from gpucourse.checks.lesson09 import observe_trainer_kwargs_cases
    inputs = [
        {"gpus": 1},
        {"gpus": [1, 3], "precision": 16},
        {"gpus": "0,1", "strategy": "ddp"},
        {"gpus": -1, "auto_select_gpus": True, "strategy": "dp"},
        {"gpus": 0, "max_epochs": 3},
        {"gpus": None},
        {"accelerator": "gpu", "gpus": 4, "auto_select_gpus": False},
        {"tpu_cores": 8},
        {"tpu_cores": [4], "max_epochs": 300},
        {"tpu_cores": [5]},
        {"tpu_cores": [1], "precision": "bf16-true"},
        {"tpu_cores": 1, "accelerator": "tpu"},
        {"num_processes": 2},
        {"num_processes": 3, "accelerator": "cpu", "strategy": "ddp_spawn"},
        {"strategy": "dp", "accelerator": "gpu", "devices": 2},
        {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "gradient_clip_val": 0.5},
        {},
    ]
    return {"inputs": inputs, "results": observe_trainer_kwargs_cases(ns, inputs)}


HIDDEN = {
    "mape": [
        Case("12 random spans, positive values", observe_mape_positive, _mape_judge(MAPE_SETS["random spans, positive values"])),
        Case("8 random spans, negative values too", observe_mape_negative,
             _mape_judge(MAPE_SETS["random spans, negative values too"])),
        Case("zeros inside and outside the common span", observe_mape_zeros,
             _mape_judge(MAPE_SETS["zeros inside and outside the common span"])),
    ],
    "modern_trainer_kwargs": [
        Case("every rule: gpus (int, list, string, -1, 0, None), tpu_cores (count and [core]), num_processes, auto_select_gpus, dp, others",
             observe_trainer_table, lambda d: judge_trainer_kwargs(d["results"], d["inputs"], TRAINER_EXPECTED)),
    ],
}

"""Hidden checks for lesson 9 (the Darts forecasting case study). Never released; see lesson01's file for the form.

The expected MAPEs are computed here, in the grader, in plain Python from the same inputs the
observer builds its series from (a literal, or ``gpucourse.checks.lesson09.mape_inputs`` with a
seed); a test (tests/test_forecasting.py) keeps this arithmetic equal to
``darts.metrics.mape(..., zero_division="raise")``. The expected Trainer arguments follow the
rules' table (``expected_trainer_kwargs``), on literal dicts and on ``trainer_inputs``.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson09 import judge_mape_results, judge_trainer_kwargs, mape_inputs, trainer_inputs


# --- mape ------------------------------------------------------------------------------------
# What the exercise's text states, and the hidden case that checks it:
#  1. two univariate monthly TimeSeries whose spans overlap by at least one step .. "clause 1: ..."
#  2. the result is a number (a Python or NumPy float) ............................ every case
#  3. in percent: 100 x the mean ................................................. every case ("in percent" verdict)
#  4. over the time steps both series cover, matched by date ...................... "clause 4: ..." and the random spans
#  5. |(actual - forecast) / actual|: divided by the actual value, the absolute
#     value of the whole ratio (actual values may be negative) .................... "clause 5: ..."
#  6. an actual value of 0 at a common step raises ValueError ..................... "clause 6: ..."
#  7. zeros outside the common span do not matter (nor do zeros in the forecast) .. "clause 7: ..."

def expected_mape(case):
    """100 * mean |(a - f) / a| over the months both series cover; "ValueError" for a zero there."""
    actual = {case["actual_start"] + i: v for i, v in enumerate(case["actual"])}
    forecast = {case["forecast_start"] + i: v for i, v in enumerate(case["forecast"])}
    common = sorted(set(actual) & set(forecast))
    if any(actual[t] == 0 for t in common):
        return "ValueError"
    return 100.0 * sum(abs((actual[t] - forecast[t]) / actual[t]) for t in common) / len(common)


def _case(actual_start, actual, forecast_start, forecast):
    return {"actual_start": actual_start, "actual": actual, "forecast_start": forecast_start, "forecast": forecast}


def with_zeros():
    """Zeros inside the common span must raise (clause 6)."""
    return [_case(0, [3.0, 4.0, 0.0, 6.0, 7.0], 1, [4.0, 1.0, 6.0]),
            _case(2, [2.0, 0.0], 0, [9.0, 9.0, 2.0, 0.0, 1.0]),
            _case(0, [0.0, 5.0, 6.0], -2, [1.0, 1.0, 2.0, 4.0]),  # the zero is the first common month
            _case(0, [8.0, 9.0, 0.0], 2, [1.0, 5.0])]  # ... the last one, a single common month


def zeros_elsewhere():
    """Zeros outside the common span and zeros in the forecast are no error (clause 7)."""
    return [_case(0, [0.0, 4.0, 5.0, 8.0], 1, [5.0, 5.0, 6.0]),
            _case(0, [6.0, 2.0, 0.0, 0.0], -1, [1.0, 3.0, 2.0]),
            _case(0, [10.0, 20.0, 40.0], 0, [0.0, 15.0, 0.0]),
            _case(0, [0.0, 5.0, -4.0, 0.0], 1, [0.0, 0.0])]


def by_date():
    """Forecasts that start before, end after, sit inside or around the actual series (clause 4)."""
    return [_case(0, [10.0, 20.0, 40.0, 80.0, 5.0, 2.0], -3, [1.0, 2.0, 3.0, 12.0, 18.0]),
            _case(0, [10.0, 20.0, 40.0, 80.0, 5.0, 2.0], 4, [6.0, 1.0, 7.0, 7.0, 7.0, 7.0]),
            _case(0, [10.0, 20.0, 40.0, 80.0, 5.0, 2.0], 2, [30.0, 100.0]),
            _case(0, [10.0, 20.0, 40.0, 80.0], -2, [1.0, 1.0, 9.0, 25.0, 20.0, 60.0, 3.0, 3.0]),
            _case(3, [50.0, 60.0, 70.0], 0, [1.0, 2.0, 3.0, 40.0, 66.0])]


def one_common_month():
    """Spans that share exactly one month, at either end (clause 1)."""
    return [_case(0, [4.0, 5.0, 6.0], -4, [9.0, 9.0, 9.0, 9.0, 5.0]),
            _case(0, [4.0, 5.0, 6.0], 2, [3.0, 100.0, 100.0]),
            _case(0, [2.5], 0, [3.0])]


def with_negative_actuals():
    """Negative actual values: the absolute value of the whole ratio (clause 5)."""
    return [_case(0, [-10.0, -20.0, 5.0], 0, [-12.0, -10.0, 10.0]),
            _case(0, [-4.0, 8.0, -2.0, 1.0], 1, [4.0, -2.0])]


MAPE_SETS = {
    "random spans, positive values": mape_inputs(seed=9, count=12),
    "random spans, negative values too": mape_inputs(seed=90, count=8, negatives=True),
    "zeros inside": with_zeros(),
    "zeros elsewhere": zeros_elsewhere(),
    "by date": by_date(),
    "one common month": one_common_month(),
    "negatives": with_negative_actuals(),
}


def observe_mape_positive(ns):
    from gpucourse.checks.lesson09 import mape_inputs, observe_mape_cases
    return observe_mape_cases(ns, mape_inputs(seed=9, count=12))


def observe_mape_negative(ns):
    from gpucourse.checks.lesson09 import mape_inputs, observe_mape_cases
    return observe_mape_cases(ns, mape_inputs(seed=90, count=8, negatives=True))


# Each literal set is repeated inside its observer (the observer's source is all that reaches the
# sandbox) and returned with the results, so that the judge notices if the two copies drift apart.

def observe_mape_zeros_inside(ns):
    from gpucourse.checks.lesson09 import observe_mape_cases

    def c(a0, a, f0, f):
        return {"actual_start": a0, "actual": a, "forecast_start": f0, "forecast": f}
    cases = [c(0, [3.0, 4.0, 0.0, 6.0, 7.0], 1, [4.0, 1.0, 6.0]), c(2, [2.0, 0.0], 0, [9.0, 9.0, 2.0, 0.0, 1.0]),
             c(0, [0.0, 5.0, 6.0], -2, [1.0, 1.0, 2.0, 4.0]), c(0, [8.0, 9.0, 0.0], 2, [1.0, 5.0])]
    return {"cases": cases, "results": observe_mape_cases(ns, cases)}


def observe_mape_zeros_elsewhere(ns):
    from gpucourse.checks.lesson09 import observe_mape_cases

    def c(a0, a, f0, f):
        return {"actual_start": a0, "actual": a, "forecast_start": f0, "forecast": f}
    cases = [c(0, [0.0, 4.0, 5.0, 8.0], 1, [5.0, 5.0, 6.0]), c(0, [6.0, 2.0, 0.0, 0.0], -1, [1.0, 3.0, 2.0]),
             c(0, [10.0, 20.0, 40.0], 0, [0.0, 15.0, 0.0]), c(0, [0.0, 5.0, -4.0, 0.0], 1, [0.0, 0.0])]
    return {"cases": cases, "results": observe_mape_cases(ns, cases)}


def observe_mape_by_date(ns):
    from gpucourse.checks.lesson09 import observe_mape_cases

    def c(a0, a, f0, f):
        return {"actual_start": a0, "actual": a, "forecast_start": f0, "forecast": f}
    six = [10.0, 20.0, 40.0, 80.0, 5.0, 2.0]
    cases = [c(0, six, -3, [1.0, 2.0, 3.0, 12.0, 18.0]), c(0, six, 4, [6.0, 1.0, 7.0, 7.0, 7.0, 7.0]),
             c(0, six, 2, [30.0, 100.0]), c(0, six[:4], -2, [1.0, 1.0, 9.0, 25.0, 20.0, 60.0, 3.0, 3.0]),
             c(3, [50.0, 60.0, 70.0], 0, [1.0, 2.0, 3.0, 40.0, 66.0])]
    return {"cases": cases, "results": observe_mape_cases(ns, cases)}


def observe_mape_one_month(ns):
    from gpucourse.checks.lesson09 import observe_mape_cases

    def c(a0, a, f0, f):
        return {"actual_start": a0, "actual": a, "forecast_start": f0, "forecast": f}
    cases = [c(0, [4.0, 5.0, 6.0], -4, [9.0, 9.0, 9.0, 9.0, 5.0]), c(0, [4.0, 5.0, 6.0], 2, [3.0, 100.0, 100.0]),
             c(0, [2.5], 0, [3.0])]
    return {"cases": cases, "results": observe_mape_cases(ns, cases)}


def observe_mape_negatives(ns):
    from gpucourse.checks.lesson09 import observe_mape_cases

    def c(a0, a, f0, f):
        return {"actual_start": a0, "actual": a, "forecast_start": f0, "forecast": f}
    cases = [c(0, [-10.0, -20.0, 5.0], 0, [-12.0, -10.0, 10.0]), c(0, [-4.0, 8.0, -2.0, 1.0], 1, [4.0, -2.0])]
    return {"cases": cases, "results": observe_mape_cases(ns, cases)}


def _mape_judge(cases):
    expected = [expected_mape(c) for c in cases]

    def judge(data):
        if isinstance(data, dict):  # a literal set: the observer's copy must be the judge's
            if data["cases"] != cases:
                return "the observer's inputs differ from the judge's (a grader error)"
            data = data["results"]
        return judge_mape_results(data, expected)
    return judge


# --- modern_trainer_kwargs ---------------------------------------------------------------------
# The rules' table (each row a clause), the text around it, and the hidden case that checks it:
#  1. gpus=n, n not 0 or None (an int, -1, a list, a string): accelerator="gpu", devices=n .. "clause 1: ..."
#  2. gpus=0 or gpus=None: accelerator="cpu", no devices key ................................ "clause 2: ..."
#  3. tpu_cores=n, an int: accelerator="tpu", devices=n ...................................... "clause 3: ..."
#  4. tpu_cores=[i]: accelerator="tpu", devices=[i - 1] ...................................... "clause 4: ..."
#  5. num_processes=n: devices=n, accelerator="cpu" unless old has an accelerator ............ "clause 5: ..."
#  6. auto_select_gpus, whatever its value: removed ......................................... "clause 6: ..."
#  7. strategy="dp": strategy="ddp_spawn" (other strategies stay) ........................... "clause 7: ..."
#  8. any other key unchanged ................................................................ "clause 8: ..."
#  9. the old keys themselves never appear; today's Trainer accepts every key ................ every case
# 10. a new dict; old unchanged (nested lists too) .......................................... "clause 10: ..." (every case)
# 1-10 together on 40 generated dicts (trainer_inputs) ....................................... "clauses 1-10: ..."

def expected_trainer_kwargs(old):
    """The rules' table applied to ``old`` (the inputs never mix the device keys in contradictory ways)."""
    new = {k: v for k, v in old.items() if k not in ("gpus", "tpu_cores", "num_processes", "auto_select_gpus")}
    if "gpus" in old:
        gpus = old["gpus"]
        if gpus is None or (type(gpus) is int and gpus == 0):
            new["accelerator"] = "cpu"
        else:
            new["accelerator"], new["devices"] = "gpu", gpus
    if "tpu_cores" in old:
        cores = old["tpu_cores"]
        new["accelerator"], new["devices"] = "tpu", [cores[0] - 1] if isinstance(cores, list) else cores
    if "num_processes" in old:
        new["devices"] = old["num_processes"]
        new.setdefault("accelerator", "cpu")
    if new.get("strategy") == "dp":
        new["strategy"] = "ddp_spawn"
    return new


TRAINER_SETS = {
    "gpus": [{"gpus": 3}, {"gpus": -1}, {"gpus": [0]}, {"gpus": [2, 0]}, {"gpus": "1,3"}, {"gpus": 1, "accelerator": "gpu"},
             {"precision": 16, "gpus": "0,1,2,3"}],
    "no gpu": [{"gpus": 0}, {"gpus": None}, {"gpus": 0, "accelerator": "cpu"}, {"max_epochs": 3, "gpus": None}],
    "tpu int": [{"tpu_cores": 8}, {"tpu_cores": 1}, {"tpu_cores": 8, "accelerator": "tpu", "precision": "bf16-true"}],
    "tpu core": [{"tpu_cores": [1]}, {"tpu_cores": [8]}, {"tpu_cores": [5], "accelerator": "tpu"},
                 {"max_epochs": 300, "tpu_cores": [2]}],
    "num_processes": [{"num_processes": 2}, {"num_processes": 4, "accelerator": "gpu"},
                      {"accelerator": "cpu", "num_processes": 3, "strategy": "ddp_spawn"}, {"gpus": 0, "num_processes": 2}],
    "auto_select_gpus": [{"auto_select_gpus": True}, {"auto_select_gpus": False, "gpus": 2},
                         {"gpus": -1, "auto_select_gpus": None}, {"accelerator": "gpu", "devices": -1, "auto_select_gpus": True}],
    "strategy": [{"strategy": "dp"}, {"gpus": 2, "strategy": "dp"}, {"strategy": "ddp"},
                 {"strategy": "ddp_spawn", "accelerator": "cpu", "devices": 2}, {"strategy": "ddp_notebook", "max_epochs": 1}],
    "others": [{}, {"max_epochs": 10, "precision": "16-mixed", "gradient_clip_val": 0.5},
               {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "limit_train_batches": 0.25},
               {"callbacks": [], "logger": False, "deterministic": True, "accumulate_grad_batches": 4}],
    "new dict": [{"tpu_cores": [3]}, {"gpus": [1, 2]}, {"max_epochs": 1}, {}, {"strategy": "dp", "auto_select_gpus": True}],
}


def observe_trainer_gpus(ns):
    from gpucourse.checks.lesson09 import observe_trainer_kwargs_cases
    inputs = [{"gpus": 3}, {"gpus": -1}, {"gpus": [0]}, {"gpus": [2, 0]}, {"gpus": "1,3"}, {"gpus": 1, "accelerator": "gpu"},
              {"precision": 16, "gpus": "0,1,2,3"}]
    return {"inputs": inputs, "results": observe_trainer_kwargs_cases(ns, inputs)}


def observe_trainer_no_gpu(ns):
    from gpucourse.checks.lesson09 import observe_trainer_kwargs_cases
    inputs = [{"gpus": 0}, {"gpus": None}, {"gpus": 0, "accelerator": "cpu"}, {"max_epochs": 3, "gpus": None}]
    return {"inputs": inputs, "results": observe_trainer_kwargs_cases(ns, inputs)}


def observe_trainer_tpu_int(ns):
    from gpucourse.checks.lesson09 import observe_trainer_kwargs_cases
    inputs = [{"tpu_cores": 8}, {"tpu_cores": 1}, {"tpu_cores": 8, "accelerator": "tpu", "precision": "bf16-true"}]
    return {"inputs": inputs, "results": observe_trainer_kwargs_cases(ns, inputs)}


def observe_trainer_tpu_core(ns):
    from gpucourse.checks.lesson09 import observe_trainer_kwargs_cases
    inputs = [{"tpu_cores": [1]}, {"tpu_cores": [8]}, {"tpu_cores": [5], "accelerator": "tpu"}, {"max_epochs": 300, "tpu_cores": [2]}]
    return {"inputs": inputs, "results": observe_trainer_kwargs_cases(ns, inputs)}


def observe_trainer_num_processes(ns):
    from gpucourse.checks.lesson09 import observe_trainer_kwargs_cases
    inputs = [{"num_processes": 2}, {"num_processes": 4, "accelerator": "gpu"},
              {"accelerator": "cpu", "num_processes": 3, "strategy": "ddp_spawn"}, {"gpus": 0, "num_processes": 2}]
    return {"inputs": inputs, "results": observe_trainer_kwargs_cases(ns, inputs)}


def observe_trainer_auto_select(ns):
    from gpucourse.checks.lesson09 import observe_trainer_kwargs_cases
    inputs = [{"auto_select_gpus": True}, {"auto_select_gpus": False, "gpus": 2},
              {"gpus": -1, "auto_select_gpus": None}, {"accelerator": "gpu", "devices": -1, "auto_select_gpus": True}]
    return {"inputs": inputs, "results": observe_trainer_kwargs_cases(ns, inputs)}


def observe_trainer_strategy(ns):
    from gpucourse.checks.lesson09 import observe_trainer_kwargs_cases
    inputs = [{"strategy": "dp"}, {"gpus": 2, "strategy": "dp"}, {"strategy": "ddp"},
              {"strategy": "ddp_spawn", "accelerator": "cpu", "devices": 2}, {"strategy": "ddp_notebook", "max_epochs": 1}]
    return {"inputs": inputs, "results": observe_trainer_kwargs_cases(ns, inputs)}


def observe_trainer_others(ns):
    from gpucourse.checks.lesson09 import observe_trainer_kwargs_cases
    inputs = [{}, {"max_epochs": 10, "precision": "16-mixed", "gradient_clip_val": 0.5},
              {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "limit_train_batches": 0.25},
              {"callbacks": [], "logger": False, "deterministic": True, "accumulate_grad_batches": 4}]
    return {"inputs": inputs, "results": observe_trainer_kwargs_cases(ns, inputs)}


def observe_trainer_new_dict(ns):
    from gpucourse.checks.lesson09 import observe_trainer_kwargs_cases
    inputs = [{"tpu_cores": [3]}, {"gpus": [1, 2]}, {"max_epochs": 1}, {}, {"strategy": "dp", "auto_select_gpus": True}]
    return {"inputs": inputs, "results": observe_trainer_kwargs_cases(ns, inputs)}


def observe_trainer_random(ns):
    from gpucourse.checks.lesson09 import observe_trainer_kwargs_cases, trainer_inputs
    return {"inputs": trainer_inputs(909, 40), "results": observe_trainer_kwargs_cases(ns, trainer_inputs(909, 40))}


def _trainer_judge(inputs):
    expected = [expected_trainer_kwargs(old) for old in inputs]

    def judge(d):
        if d["inputs"] != inputs:
            return "the observer's inputs differ from the judge's (a grader error)"
        return judge_trainer_kwargs(d["results"], inputs, expected)
    return judge


HIDDEN = {
    "mape": [
        Case("clauses 3-5: 12 random spans, positive values", observe_mape_positive,
             _mape_judge(MAPE_SETS["random spans, positive values"])),
        Case("clause 5: 8 random spans, negative values too", observe_mape_negative,
             _mape_judge(MAPE_SETS["random spans, negative values too"])),
        Case("clause 5: negative actual values, the absolute value of the whole ratio", observe_mape_negatives,
             _mape_judge(MAPE_SETS["negatives"])),
        Case("clause 4: forecasts before, after, inside and around the actual series, matched by date",
             observe_mape_by_date, _mape_judge(MAPE_SETS["by date"])),
        Case("clause 1: spans sharing a single month, at either end", observe_mape_one_month,
             _mape_judge(MAPE_SETS["one common month"])),
        Case("clause 6: an actual 0 in the common span, first, last or inside", observe_mape_zeros_inside,
             _mape_judge(MAPE_SETS["zeros inside"])),
        Case("clause 7: zeros outside the common span, zeros in the forecast", observe_mape_zeros_elsewhere,
             _mape_judge(MAPE_SETS["zeros elsewhere"])),
    ],
    "modern_trainer_kwargs": [
        Case("clause 1: gpus=n (an int, -1, a list, a string)", observe_trainer_gpus, _trainer_judge(TRAINER_SETS["gpus"])),
        Case("clause 2: gpus=0 and gpus=None", observe_trainer_no_gpu, _trainer_judge(TRAINER_SETS["no gpu"])),
        Case("clause 3: tpu_cores=n", observe_trainer_tpu_int, _trainer_judge(TRAINER_SETS["tpu int"])),
        Case("clause 4: tpu_cores=[i]", observe_trainer_tpu_core, _trainer_judge(TRAINER_SETS["tpu core"])),
        Case("clause 5: num_processes, with and without an accelerator", observe_trainer_num_processes,
             _trainer_judge(TRAINER_SETS["num_processes"])),
        Case("clause 6: auto_select_gpus=True, False, None", observe_trainer_auto_select,
             _trainer_judge(TRAINER_SETS["auto_select_gpus"])),
        Case('clause 7: strategy="dp" and other strategies', observe_trainer_strategy, _trainer_judge(TRAINER_SETS["strategy"])),
        Case("clause 8: other keys", observe_trainer_others, _trainer_judge(TRAINER_SETS["others"])),
        Case("clause 10: a new dict, the caller's dict unchanged", observe_trainer_new_dict,
             _trainer_judge(TRAINER_SETS["new dict"])),
        Case("clauses 1-10: 40 generated 2021-era dicts", observe_trainer_random, _trainer_judge(trainer_inputs(909, 40))),
    ],
}

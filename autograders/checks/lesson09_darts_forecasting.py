"""Hidden checks for lesson 9 (the Darts forecasting case study). Never released.

Every case draws its inputs at grading time (``Case.draw``: the text's boundaries first, then random
ones from the whole domain it states). The expected MAPEs are computed here, in the grader, in plain
Python (``reference_mape``; tests/test_darts_forecasting.py keeps it equal to
``darts.metrics.mape(..., zero_division="raise")``), and the expected Trainer arguments follow the
rules' table (``reference_modern_trainer_kwargs``): neither exists in the public package.
"""

import math

from gpucourse.checks import Case
from gpucourse.checks.lesson09_darts_forecasting import _broken_rule, judge_mape_results, trainer_parameters
from gpucourse.checks.values import describe, rebuild, type_words

from autograders.differential import same, shown

# --- mape ------------------------------------------------------------------------------------
# What the exercise's text states (CLAUSES below names the cases):
#  1. two univariate TimeSeries of the same monthly frequency (month starts or month ends, float64
#     or float32) whose spans overlap by at least one step (one only, at either end)
#  2. the result is a number (a Python or NumPy float)
#  3. in percent: 100 x the mean
#  4. over the time steps both series cover, matched by date
#  5. |(actual - forecast) / actual|: divided by the actual value, the absolute value of the whole
#     ratio (actual values may be negative); any non-zero actual value, however small (many tiny ones
#     together too: a product of them underflows to 0 although none is 0)
#  6. an actual value of 0 (or -0.0) at a common step raises ValueError
#  7. zeros outside the common span do not matter (nor do zeros in the forecast)


def reference_mape(case):
    """100 * mean |(a - f) / a| over the months both series cover; "ValueError" for a zero there. Values
    as the series hold them (float32 ones rounded to float32)."""
    import numpy

    def held(values):
        return [float(numpy.float32(v)) for v in values] if case.get("dtype") == "float32" else list(values)

    actual = {case["actual_start"] + i: v for i, v in enumerate(held(case["actual"]))}
    forecast = {case["forecast_start"] + i: v for i, v in enumerate(held(case["forecast"]))}
    common = sorted(set(actual) & set(forecast))
    if any(actual[t] == 0 for t in common):
        return "ValueError"
    return 100.0 * math.fsum(abs((actual[t] - forecast[t]) / actual[t]) for t in common) / len(common)


def _mape_case(actual_start, actual, forecast_start, forecast, freq="MS", dtype="float64"):
    return {"actual_start": actual_start, "actual": actual, "forecast_start": forecast_start, "forecast": forecast,
            "freq": freq, "dtype": dtype}


def _values(rng, n, negatives=False, tiny=False):
    def one():
        scale = rng.choice([1e-9, 3e-12, 1e-6]) if tiny and rng.random() < 0.4 else rng.uniform(5, 500)
        return round(scale, 3) if scale > 1 else scale
    return [one() * (rng.choice([-1, 1]) if negatives else 1) for _ in range(n)]


def _random_mape(rng, negatives=False, tiny=False, where=None, n_actual=None):
    """One (actual, forecast) pair: the forecast starts before, at, or after the actual series, ends before
    or after it; at least one month in common; forecasts near the actual values (never 0 unless drawn)."""
    n_actual = n_actual or rng.randint(1, 30)
    actual = _values(rng, n_actual, negatives, tiny)
    kind = where or rng.choice(["any", "before", "after", "inside", "around"])
    if kind == "before":
        start = rng.randint(-6, -1)
        end = rng.randint(0, n_actual - 1)
    elif kind == "after":
        start = rng.randint(0, n_actual - 1)
        end = n_actual - 1 + rng.randint(1, 6)
    elif kind == "inside":
        start = rng.randint(0, n_actual - 1)
        end = rng.randint(start, n_actual - 1)
    elif kind == "around":
        start, end = -rng.randint(1, 6), n_actual - 1 + rng.randint(1, 6)
    else:
        start = rng.randint(-6, n_actual - 1)
        end = rng.randint(max(start, 0), n_actual - 1 + rng.randint(0, 6))
    forecast = []
    for t in range(start, end + 1):
        base = actual[t] if 0 <= t < n_actual else rng.uniform(5, 500)
        forecast.append(round(base * rng.uniform(0.6, 1.5), 3) or 1.0)
    return _mape_case(0, actual, start, forecast, rng.choice(["MS", "MS", "ME"]), rng.choice(["float64", "float64", "float32"]))


def draw_mape_positive(rng):
    return [_random_mape(rng) for _ in range(12)]


def draw_mape_negative(rng):
    return [_random_mape(rng, negatives=True) for _ in range(8)]


def draw_mape_negatives_fixed(rng):
    """Negative actual values (and forecasts of the other sign): the absolute value of the whole ratio."""
    cases = [_mape_case(0, [-10.0, -20.0, 5.0], 0, [-12.0, -10.0, 10.0]), _mape_case(0, [-4.0, 8.0, -2.0, 1.0], 1, [4.0, -2.0])]
    for _ in range(3):
        n = rng.randint(1, 8)
        actual = [-abs(v) for v in _values(rng, n)]
        forecast = [round(v * rng.uniform(-1.5, 1.5), 3) or 1.0 for v in actual]
        cases.append(_mape_case(0, actual, 0, forecast, rng.choice(["MS", "ME"])))
    return cases


def draw_mape_by_date(rng):
    """Forecasts that start before, end after, sit inside or around the actual series; the actual series
    starting later than the forecast too."""
    six = [10.0, 20.0, 40.0, 80.0, 5.0, 2.0]
    cases = [_mape_case(0, six, -3, [1.0, 2.0, 3.0, 12.0, 18.0]), _mape_case(0, six, 4, [6.0, 1.0, 7.0, 7.0, 7.0, 7.0]),
             _mape_case(0, six, 2, [30.0, 100.0]), _mape_case(0, six[:4], -2, [1.0, 1.0, 9.0, 25.0, 20.0, 60.0, 3.0, 3.0]),
             _mape_case(3, [50.0, 60.0, 70.0], 0, [1.0, 2.0, 3.0, 40.0, 66.0])]
    for where in ("before", "after", "inside", "around"):
        case = _random_mape(rng, where=where, n_actual=rng.randint(2, 20))
        shift = rng.randint(0, 5)  # the whole pair moved: neither series starts in January 2000
        cases.append(dict(case, actual_start=case["actual_start"] + shift, forecast_start=case["forecast_start"] + shift))
    return cases


def draw_mape_one_month(rng):
    """Spans sharing exactly one month: the actual's first or last, single-month series."""
    cases = [_mape_case(0, [4.0, 5.0, 6.0], -4, [9.0, 9.0, 9.0, 9.0, 5.0]), _mape_case(0, [4.0, 5.0, 6.0], 2, [3.0, 100.0, 100.0]),
             _mape_case(0, [2.5], 0, [3.0])]
    for _ in range(3):
        n, m = rng.randint(1, 10), rng.randint(1, 10)
        actual, forecast = _values(rng, n, negatives=rng.random() < 0.3), _values(rng, m)
        start = rng.choice([n - 1, -(m - 1)])  # the forecast's first month is the actual's last, or its last the actual's first
        cases.append(_mape_case(0, actual, start, forecast, rng.choice(["MS", "ME"]), rng.choice(["float64", "float32"])))
    return cases


def draw_mape_zeros_inside(rng):
    """An actual 0 (or -0.0) in the common span: first, last, inside, the only common month."""
    cases = [_mape_case(0, [3.0, 4.0, 0.0, 6.0, 7.0], 1, [4.0, 1.0, 6.0]), _mape_case(2, [2.0, 0.0], 0, [9.0, 9.0, 2.0, 0.0, 1.0]),
             _mape_case(0, [0.0, 5.0, 6.0], -2, [1.0, 1.0, 2.0, 4.0]), _mape_case(0, [8.0, 9.0, -0.0], 2, [1.0, 5.0])]
    for _ in range(4):
        case = _random_mape(rng, negatives=rng.random() < 0.5)
        common = [t for t in range(len(case["actual"])) if 0 <= t - case["forecast_start"] < len(case["forecast"])]
        actual = list(case["actual"])
        actual[rng.choice(common)] = rng.choice([0.0, -0.0])
        cases.append(dict(case, actual=actual))
    return cases


def draw_mape_zeros_elsewhere(rng):
    """Zeros in the actual series outside the common span, and zeros in the forecast: no error."""
    cases = [_mape_case(0, [0.0, 4.0, 5.0, 8.0], 1, [5.0, 5.0, 6.0]), _mape_case(0, [6.0, 2.0, 0.0, 0.0], -1, [1.0, 3.0, 2.0]),
             _mape_case(0, [10.0, 20.0, 40.0], 0, [0.0, 15.0, 0.0]), _mape_case(0, [0.0, 5.0, -4.0, 0.0], 1, [0.0, 0.0])]
    for _ in range(4):
        case = _random_mape(rng, where="inside", n_actual=rng.randint(3, 20))
        first, last = case["forecast_start"], case["forecast_start"] + len(case["forecast"]) - 1
        actual = [0.0 if (t < first or t > last) and rng.random() < 0.5 else v for t, v in enumerate(case["actual"])]
        forecast = [0.0 if rng.random() < 0.3 else v for v in case["forecast"]]
        cases.append(dict(case, actual=actual, forecast=forecast))
    return cases


def draw_mape_domain(rng):
    """float32 series, month-end dates, tiny actual values (not 0: 1e-9, 3e-12), a single month each; many tiny
    actual values together (their product underflows to 0, none of them is 0)."""
    many = [1e-9 * (1 + i % 5) for i in range(40)]
    cases = [_mape_case(0, [1e-9, 2.0], 0, [5.0, 2.5]), _mape_case(0, [-3e-12], 0, [1e-12], "ME"),
             _mape_case(0, many, 0, [2 * v for v in many]),
             _mape_case(0, [10.0, 20.0, 40.0], 1, [30.0, 20.0], "ME", "float32")]
    return cases + [_random_mape(rng, negatives=rng.random() < 0.5, tiny=True) for _ in range(5)]


def observe_mape_drawn(ns, cases):
    from gpucourse.checks.lesson09_darts_forecasting import observe_mape_cases

    return observe_mape_cases(ns, cases)


def judge_mape_drawn(results, cases):
    expected = [reference_mape(c) for c in cases]
    if not isinstance(results, list) or len(results) != len(cases):
        return f"expected {len(cases)} results, got {len(results) if isinstance(results, list) else 'none'}"
    for i, (case, got, want) in enumerate(zip(cases, results, expected)):
        wrong = judge_mape_results([got], [want])
        if wrong:
            where = (f"actual {len(case['actual'])} month(s) from month {case['actual_start']}, forecast "
                     f"{len(case['forecast'])} from month {case['forecast_start']} ({case['freq']}, {case['dtype']})")
            return wrong.replace("case 0", f"case {i} ({where})", 1)
    return None


# --- modern_trainer_kwargs ---------------------------------------------------------------------
# The rules' table (each row a clause) and the text around it (CLAUSES below names the cases):
#  1. gpus=n, n not 0 or None (an int, -1, a list, a string, any size): accelerator="gpu", devices=n
#  2. gpus=0 or gpus=None: accelerator="cpu", no devices key
#  3. tpu_cores=n, an int: accelerator="tpu", devices=n
#  4. tpu_cores=[i]: accelerator="tpu", devices=[i - 1]
#  5. num_processes=n (1 too): devices=n, accelerator="cpu" unless old has an accelerator (whichever)
#  6. auto_select_gpus, whatever its value: removed
#  7. strategy="dp": strategy="ddp_spawn" (other strategies stay)
#  8. any other key unchanged, whatever its value (None, a nested list, a dict)
#  9. the old keys themselves never appear; today's Trainer accepts every key
# 10. a new dict; old unchanged (nested lists too)

OLD_KEYS = ("gpus", "tpu_cores", "num_processes", "auto_select_gpus")


def reference_modern_trainer_kwargs(old):
    """The rules' table applied to ``old`` (the draws never mix the device keys in contradictory ways)."""
    import copy

    new = {k: copy.deepcopy(v) for k, v in old.items() if k not in OLD_KEYS}
    if "gpus" in old:
        gpus = old["gpus"]
        if gpus is None or (type(gpus) is int and gpus == 0):
            new["accelerator"] = "cpu"
        else:
            new["accelerator"], new["devices"] = "gpu", copy.deepcopy(gpus)
    if "tpu_cores" in old:
        cores = old["tpu_cores"]
        new["accelerator"], new["devices"] = "tpu", [cores[0] - 1] if isinstance(cores, list) else cores
    if "num_processes" in old:
        new["devices"] = old["num_processes"]
        new.setdefault("accelerator", "cpu")
    if new.get("strategy") == "dp":
        new["strategy"] = "ddp_spawn"
    return new


OTHERS = {"max_epochs": [1, 30, 300, None, -1], "precision": [16, 32, "bf16-true", "16-mixed", None],
          "gradient_clip_val": [0.5, 1.0, None], "enable_progress_bar": [False, True], "accumulate_grad_batches": [2, 4],
          "num_nodes": [1, 2], "logger": [False, None, True], "deterministic": [True, None], "callbacks": [[], None],
          "limit_train_batches": [0.25, 10, None], "default_root_dir": ["runs", None], "max_time": [{"hours": 1}, None],
          "log_every_n_steps": [1, 50], "benchmark": [None, False]}


def _others(rng, count=None):
    keys = rng.sample(sorted(OTHERS), rng.randint(0, 3) if count is None else count)
    return [(k, rng.choice(OTHERS[k])) for k in keys]


def _gpus(rng):
    return rng.choice([1, 2, 4, 8, -1, rng.randint(1, 64), 2 ** 53 + rng.randint(1, 99), [0], [1, 3], [2, 0, 1],
                       [rng.randint(0, 7)], "0,1", "1,3", "0,1,2,3", "2", "-1", "0"])


def _device_items(rng, device):
    items = []
    if device == "gpus":
        items.append(("gpus", _gpus(rng)))
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
        items.append(("num_processes", rng.choice([1, 1, 2, rng.randint(1, 64), 2 ** 53 + rng.randint(1, 9)])))
        items += [("accelerator", rng.choice(["cpu", "gpu", "tpu", "mps", "cuda"]))] if rng.random() < 0.5 else []
    elif device == "devices":
        items += [("accelerator", rng.choice(["cpu", "gpu", "tpu"])), ("devices", rng.choice([1, 2, -1, [0], "auto"]))]
    return items


def _trainer_dict(rng, device=None, auto=None, strategy=None, others=None):
    device = device or rng.choice(["gpus", "gpus", "no gpu", "tpu int", "tpu core", "num_processes", "devices", "none"])
    items = _device_items(rng, device)
    if auto or (auto is None and rng.random() < 0.4):
        items.append(("auto_select_gpus", rng.choice([True, False, None, 0, 1, "yes"])))
    if strategy or (strategy is None and rng.random() < 0.5):
        items.append(("strategy", strategy if isinstance(strategy, str) else
                      rng.choice(["dp", "dp", "ddp", "ddp_spawn", "auto", "ddp_notebook", "fsdp", "deepspeed"])))
    items += _others(rng, others)
    rng.shuffle(items)
    return dict(items)


def _calls(dicts):
    return [{"args": describe([d]), "kwargs": describe({})} for d in dicts]


def draw_trainer_gpus(rng):
    fixed = [{"gpus": 3}, {"gpus": -1}, {"gpus": [0]}, {"gpus": [2, 0]}, {"gpus": "1,3"}, {"gpus": 1, "accelerator": "gpu"},
             {"precision": 16, "gpus": "0,1,2,3"}, {"gpus": "0"}, {"gpus": 2 ** 53 + 1}]
    return _calls(fixed + [_trainer_dict(rng, "gpus") for _ in range(5)])


def draw_trainer_no_gpu(rng):
    fixed = [{"gpus": 0}, {"gpus": None}, {"gpus": 0, "accelerator": "cpu"}, {"max_epochs": 3, "gpus": None}]
    return _calls(fixed + [_trainer_dict(rng, "no gpu") for _ in range(4)])


def draw_trainer_tpu_int(rng):
    fixed = [{"tpu_cores": 8}, {"tpu_cores": 1}, {"tpu_cores": 8, "accelerator": "tpu", "precision": "bf16-true"}]
    return _calls(fixed + [_trainer_dict(rng, "tpu int") for _ in range(3)])


def draw_trainer_tpu_core(rng):
    fixed = [{"tpu_cores": [1]}, {"tpu_cores": [8]}, {"tpu_cores": [5], "accelerator": "tpu"}, {"max_epochs": 300, "tpu_cores": [2]}]
    return _calls(fixed + [_trainer_dict(rng, "tpu core") for _ in range(4)])


def draw_trainer_num_processes(rng):
    fixed = [{"num_processes": 2}, {"num_processes": 1}, {"num_processes": 4, "accelerator": "gpu"},
             {"accelerator": "cpu", "num_processes": 3, "strategy": "ddp_spawn"}, {"gpus": 0, "num_processes": 2},
             {"num_processes": 1, "accelerator": "mps"}]
    return _calls(fixed + [_trainer_dict(rng, "num_processes") for _ in range(4)])


def draw_trainer_auto_select(rng):
    fixed = [{"auto_select_gpus": True}, {"auto_select_gpus": False, "gpus": 2}, {"gpus": -1, "auto_select_gpus": None},
             {"accelerator": "gpu", "devices": -1, "auto_select_gpus": True}, {"auto_select_gpus": 0}]
    return _calls(fixed + [_trainer_dict(rng, auto=True) for _ in range(3)])


def draw_trainer_strategy(rng):
    fixed = [{"strategy": "dp"}, {"gpus": 2, "strategy": "dp"}, {"strategy": "ddp"},
             {"strategy": "ddp_spawn", "accelerator": "cpu", "devices": 2}, {"strategy": "ddp_notebook", "max_epochs": 1}]
    return _calls(fixed + [_trainer_dict(rng, strategy=rng.choice(["dp", "ddp", "fsdp", "auto", "ddp_spawn"])) for _ in range(4)])


def draw_trainer_others(rng):
    fixed = [{}, {"max_epochs": 10, "precision": "16-mixed", "gradient_clip_val": 0.5},
             {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "limit_train_batches": 0.25},
             {"callbacks": [], "logger": False, "deterministic": True, "accumulate_grad_batches": 4},
             {"max_epochs": None, "logger": None, "gpus": 1}]
    return _calls(fixed + [_trainer_dict(rng, "none", auto=False, strategy=False, others=rng.randint(1, 4)) for _ in range(4)])


def draw_trainer_new_dict(rng):
    fixed = [{"tpu_cores": [3]}, {"gpus": [1, 2]}, {"max_epochs": 1}, {}, {"strategy": "dp", "auto_select_gpus": True},
             {"callbacks": [], "max_time": {"hours": 2}}]
    return _calls(fixed + [_trainer_dict(rng) for _ in range(3)])


def draw_trainer_random(rng):
    return _calls([_trainer_dict(rng) for _ in range(30)])


def observe_trainer_drawn(ns, calls):
    """modern_trainer_kwargs on a copy of each drawn dict: what it returned (described), the keys today's
    Trainer rejects, and whether the caller's dict was changed or returned itself."""
    import copy

    from gpucourse.checks import answer
    from gpucourse.checks.lesson09_darts_forecasting import trainer_parameters
    from gpucourse.checks.values import describe, rebuild

    modern_trainer_kwargs = answer(ns, "modern_trainer_kwargs")
    accepted = set(trainer_parameters())
    found = []
    for spec in calls:
        (old,) = rebuild(spec["args"])
        given = copy.deepcopy(old)
        try:
            new = modern_trainer_kwargs(given)
        except NotImplementedError:
            raise
        except Exception as error:
            found.append({"raised": [k.__name__ for k in type(error).__mro__]})
            continue
        found.append({"returned": describe(new),
                      "rejected": sorted(str(k) for k in new if k not in accepted) if isinstance(new, dict) else [],
                      "input_changed": given != old, "same_object": new is given})
    return found


def judge_trainer_drawn(observed, calls):
    if not isinstance(observed, list) or len(observed) != len(calls):
        return f"{len(observed) if isinstance(observed, list) else 'no'} outcomes for {len(calls)} calls"
    accepted = set(trainer_parameters())
    for spec, got in zip(calls, observed):
        (old,) = rebuild(spec["args"])
        where = shown(spec, "modern_trainer_kwargs", 200)
        if not isinstance(got, dict) or "raised" in got:
            raised = got["raised"][0] if isinstance(got, dict) and got.get("raised") else "an exception"
            return f"{where} raised {raised}"
        if type_words(got["returned"]) != "a dict":
            return f"{where}: return a dict, not {type_words(got['returned'])}"
        if got["input_changed"] or got["same_object"]:
            return f"{where}: build a new dict and leave the caller's dict unchanged"
        want = reference_modern_trainer_kwargs(old)
        assert set(want) <= accepted, f"a draw with keys today's Trainer rejects: {sorted(set(want) - accepted)}"
        if got["rejected"]:
            return f"{where}: today's pytorch_lightning.Trainer has no argument(s) {got['rejected']}"
        if not same(got["returned"], describe(want)):
            result = rebuild(got["returned"])
            return f"{where} returned {result}, which does not follow {_broken_rule(old, result, want)}"
    return None


def _case(name, draw, observe, judge):
    return Case(name, observe, judge, draw=draw)


HIDDEN = {
    "mape": [
        _case("clauses 3-5: 12 random spans, positive values", draw_mape_positive, observe_mape_drawn, judge_mape_drawn),
        _case("clause 5: 8 random spans, negative values too", draw_mape_negative, observe_mape_drawn, judge_mape_drawn),
        _case("clause 5: negative actual values, the absolute value of the whole ratio", draw_mape_negatives_fixed,
              observe_mape_drawn, judge_mape_drawn),
        _case("clause 4: forecasts before, after, inside and around the actual series, matched by date",
              draw_mape_by_date, observe_mape_drawn, judge_mape_drawn),
        _case("clause 1: spans sharing a single month, at either end", draw_mape_one_month, observe_mape_drawn, judge_mape_drawn),
        _case("clause 6: an actual 0 (or -0.0) in the common span, first, last or inside", draw_mape_zeros_inside,
              observe_mape_drawn, judge_mape_drawn),
        _case("clause 7: zeros outside the common span, zeros in the forecast", draw_mape_zeros_elsewhere,
              observe_mape_drawn, judge_mape_drawn),
        _case("clauses 1, 5: float32 series, month-end dates, tiny actual values (not 0), many of them together", draw_mape_domain,
              observe_mape_drawn, judge_mape_drawn),
    ],
    "modern_trainer_kwargs": [
        _case("clause 1: gpus=n (an int, -1, a list, a string)", draw_trainer_gpus, observe_trainer_drawn, judge_trainer_drawn),
        _case("clause 2: gpus=0 and gpus=None", draw_trainer_no_gpu, observe_trainer_drawn, judge_trainer_drawn),
        _case("clause 3: tpu_cores=n", draw_trainer_tpu_int, observe_trainer_drawn, judge_trainer_drawn),
        _case("clause 4: tpu_cores=[i]", draw_trainer_tpu_core, observe_trainer_drawn, judge_trainer_drawn),
        _case("clause 5: num_processes (1 too), with and without an accelerator", draw_trainer_num_processes,
              observe_trainer_drawn, judge_trainer_drawn),
        _case("clause 6: auto_select_gpus, whatever its value", draw_trainer_auto_select, observe_trainer_drawn,
              judge_trainer_drawn),
        _case('clause 7: strategy="dp" and other strategies', draw_trainer_strategy, observe_trainer_drawn, judge_trainer_drawn),
        _case("clause 8: other keys, whatever their values (None too)", draw_trainer_others, observe_trainer_drawn,
              judge_trainer_drawn),
        _case("clause 10: a new dict, the caller's dict unchanged", draw_trainer_new_dict, observe_trainer_drawn,
              judge_trainer_drawn),
        _case("clauses 1-10: 30 dicts drawn from the whole table", draw_trainer_random, observe_trainer_drawn,
              judge_trainer_drawn),
    ],
}

_M = {case.name.split(":")[0]: case.name for case in HIDDEN["mape"]}
_M5 = [case.name for case in HIDDEN["mape"] if case.name.startswith("clause 5")]
_T = {case.name.split(":")[0]: case.name for case in HIDDEN["modern_trainer_kwargs"]}
PUBLIC_MAPE = "three small cases: same span, a shorter forecast, a zero"
PUBLIC_TRAINER = "the seed's two dicts and gpus=2"
CLAUSES = {
    "mape": {
        "two univariate TimeSeries of the same monthly frequency, overlapping by at least one step":
            [_M["clause 1"], _M["clauses 1, 5"]],
        "return a number (a Python or NumPy float)": [PUBLIC_MAPE, _M["clauses 3-5"]],
        "the MAPE in percent": [PUBLIC_MAPE, _M["clauses 3-5"]],
        "over the time steps both series cover": [PUBLIC_MAPE, _M["clause 4"], _M["clauses 3-5"]],
        "the absolute value of the whole ratio (actual values may be negative)": _M5 + [_M["clauses 1, 5"]],
        "ValueError if the actual value is 0 at any common time step": [PUBLIC_MAPE, _M["clause 6"]],
        "zeros outside the common span do not matter": [_M["clause 7"]],
    },
    "modern_trainer_kwargs": {
        "gpus=n, n not 0 or None: accelerator='gpu', devices=n": [PUBLIC_TRAINER, _T["clause 1"], _T["clauses 1-10"]],
        "gpus=0 or gpus=None: accelerator='cpu', no devices key": [_T["clause 2"], _T["clauses 1-10"]],
        "tpu_cores=n, an int: accelerator='tpu', devices=n": [_T["clause 3"], _T["clauses 1-10"]],
        "tpu_cores=[i]: accelerator='tpu', devices=[i - 1]": [PUBLIC_TRAINER, _T["clause 4"], _T["clauses 1-10"]],
        "num_processes=n: devices=n, accelerator='cpu' unless old has an accelerator": [_T["clause 5"], _T["clauses 1-10"]],
        "auto_select_gpus (any value): removed": [PUBLIC_TRAINER, _T["clause 6"]],
        "strategy='dp': strategy='ddp_spawn'": [_T["clause 7"], _T["clauses 1-10"]],
        "any other key unchanged": [_T["clause 8"], _T["clauses 1-10"]],
        "the old keys do not appear; today's Trainer accepts the result": [PUBLIC_TRAINER, _T["clauses 1-10"]],
        "a new dict; old unchanged": [_T["clause 10"]],
    },
}

"""Public checks for lesson 18 (tensor, sequence and pipeline parallel). Observers are self-contained: see
lesson01.py.

``pipeline_bubble`` and ``peak_in_flight`` are plain functions of their arguments: the observers call the
answer on the public calls (``observe_calls``) and the judges compare with the values the exercise's text
gives for them, worked out by hand and stored here (``BUBBLE_PUBLIC``, ``IN_FLIGHT_PUBLIC``): this module
holds no way to compute either. Grading draws other calls and compares with the grader's own reference.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson18_model_parallel"  # the course folder this module's exercises belong to

# (args, what the text gives: a float, or the name of the exception it must raise), worked by hand
BUBBLE_PUBLIC = [
    (["gpipe", 4, 8], 0.375),                      # (4 - 1) / 8
    (["1f1b", 4, 8], 0.375),                       # the same bubble: 1F1B changes the memory, not the idle time
    (["interleaved_1f1b", 4, 8, 2], 0.1875),       # (4 - 1) / (2 * 8)
    (["gpipe", 1, 3], 0.0),                        # one stage: no bubble
    (["interleaved_1f1b", 4, 6, 2], "ValueError"),  # 6 micro-batches are not a multiple of 4 stages
    (["gpipe", 4, 8, 2], "ValueError"),            # virtual stages are the interleaved schedule's only
    (["zero_bubble", 4, 8], "ValueError"),         # not one of the three schedules
    (["gpipe", 4.0, 8], "TypeError"),              # 4.0 is not an int
]

IN_FLIGHT_PUBLIC = [
    (["gpipe", 4, 8, 0], 8),   # GPipe: every micro-batch's forward before any backward
    (["gpipe", 4, 8, 3], 8),
    (["1f1b", 4, 8, 0], 4),    # the first stage: p - 0 forwards before its first backward
    (["1f1b", 4, 8, 3], 1),    # the last stage: one forward, then its backward
    (["1f1b", 4, 4, 1], 3),
    (["1f1b", 4, 3, 0], "ValueError"),  # fewer micro-batches than stages: 1F1B refuses
    (["1f1b", 4, 8, 4], "ValueError"),  # stages are numbered 0 to 3
    (["gpipe", 2, 4, True], "TypeError"),  # a bool is not accepted as an int
]


def _observe(ns, name, table):
    from gpucourse.checks import observe_calls
    from gpucourse.checks.values import describe

    return observe_calls(ns, name, [{"args": describe(list(args)), "kwargs": describe({})} for args, _ in table])


def _judge_against_table(observed, name, table, exact: bool) -> str | None:
    from gpucourse.checks.values import type_words

    if not isinstance(observed, list) or len(observed) != len(table):
        return "the answer was not called on every public case"
    for (args, want), got in zip(table, observed):
        where = f"{name}({', '.join(map(repr, args))})"
        if not isinstance(got, dict) or ("returned" in got) == ("raised" in got):
            return f"{where}: no outcome was reported"
        if isinstance(want, str):
            if "raised" not in got:
                return f"{where} returned {type_words(got['returned'])}; it must raise {want}"
            if want not in got["raised"]:
                return f"{where} raised {got['raised'][0]}; it must raise {want}"
            continue
        if "raised" in got:
            return f"{where} raised {got['raised'][0]}"
        value = got["returned"]
        if exact:
            if type(value) is not int:
                return f"{where} returned {type_words(value)}: return an int"
            if value != want:
                return f"{where} returned {value}; the text gives {want}"
        else:
            if type(value) is not float:
                return f"{where} returned {type_words(value)}: return a float"
            if abs(value - want) > 1e-12:
                return f"{where} returned {value!r}; the text gives {want!r}"
    return None


def observe_public_bubbles(ns):
    """``pipeline_bubble`` on the public calls (``BUBBLE_PUBLIC``), as ``observe_calls`` reports it."""
    from gpucourse.checks.lesson18_model_parallel import BUBBLE_PUBLIC, _observe

    return _observe(ns, "pipeline_bubble", BUBBLE_PUBLIC)


def judge_public_bubbles(observed):
    from gpucourse.checks.lesson18_model_parallel import BUBBLE_PUBLIC, _judge_against_table

    return _judge_against_table(observed, "pipeline_bubble", BUBBLE_PUBLIC, exact=False)


def observe_public_in_flight(ns):
    """``peak_in_flight`` on the public calls (``IN_FLIGHT_PUBLIC``), as ``observe_calls`` reports it."""
    from gpucourse.checks.lesson18_model_parallel import IN_FLIGHT_PUBLIC, _observe

    return _observe(ns, "peak_in_flight", IN_FLIGHT_PUBLIC)


def judge_public_in_flight(observed):
    from gpucourse.checks.lesson18_model_parallel import IN_FLIGHT_PUBLIC, _judge_against_table

    return _judge_against_table(observed, "peak_in_flight", IN_FLIGHT_PUBLIC, exact=True)


register("pipeline_bubble",
         Case("p = 4, m = 8: GPipe, 1F1B, interleaved with v = 2; one stage; the errors", observe_public_bubbles,
              judge_public_bubbles),
         answers=[Answer("pipeline_bubble", "function",
                         "a function pipeline_bubble(schedule, stages, microbatches, virtual_stages=1) returning the "
                         "bubble time over the ideal time, a float")],
         points=3)

register("peak_in_flight",
         Case("p = 4: GPipe holds m, 1F1B holds p - stage; the errors", observe_public_in_flight,
              judge_public_in_flight),
         answers=[Answer("peak_in_flight", "function",
                         "a function peak_in_flight(schedule, stages, microbatches, stage) returning the most "
                         "micro-batches whose activations that stage holds at once, an int")],
         points=2)

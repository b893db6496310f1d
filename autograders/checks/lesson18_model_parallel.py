"""Hidden checks for lesson 18 (tensor, sequence and pipeline parallel). Never released; see lesson 1's
for the form.

Both exercises are plain functions: each case draws its calls at grading time (``Case.draw``: boundaries
first, every named value and "any other", then random ones from the whole domain the exercise's text
states), the sandbox calls the answer on them, and the judge calls the reference below, which exists on the
grader's side only, on the same calls (``autograders.differential``). Every drawn call has at most one fault,
so the exception the text names for it is the only right one.
"""

from __future__ import annotations

from autograders.differential import judge_calls
from autograders.differential import call as c
from gpucourse.checks import Case

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def reference_pipeline_bubble(schedule, stages, microbatches, virtual_stages=1):
    """(p - 1) / (v m): the bubble over the ideal time (Narayanan et al. 2021; the Ultra-Scale Playbook)."""
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}")
    for value in (stages, microbatches, virtual_stages):
        if not _whole(value):
            raise TypeError(f"{value!r} is not an int")
    if min(stages, microbatches, virtual_stages) < 1:
        raise ValueError("stages, microbatches and virtual_stages must be at least 1")
    if schedule != "interleaved_1f1b" and virtual_stages != 1:
        raise ValueError("virtual stages belong to the interleaved schedule")
    if schedule == "1f1b" and microbatches < stages:
        raise ValueError("1F1B needs at least as many micro-batches as stages")
    if schedule == "interleaved_1f1b" and microbatches % stages:
        raise ValueError("the interleaved schedule needs a multiple of stages micro-batches")
    return (stages - 1) / (virtual_stages * microbatches)  # int / int: correctly rounded at any size


def reference_peak_in_flight(schedule, stages, microbatches, stage):
    """GPipe holds every micro-batch; 1F1B's stage s runs p - s forwards before its first backward."""
    if not isinstance(schedule, str) or schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"unknown schedule {schedule!r}")
    for value in (stages, microbatches, stage):
        if not _whole(value):
            raise TypeError(f"{value!r} is not an int")
    if stages < 1 or microbatches < 1:
        raise ValueError("stages and microbatches must be at least 1")
    if not 0 <= stage < stages:
        raise ValueError("stage must be in range(stages)")
    if schedule == "1f1b" and microbatches < stages:
        raise ValueError("1F1B needs at least as many micro-batches as stages")
    return microbatches if schedule == "gpipe" else min(microbatches, stages - stage)


# --- pipeline_bubble ---------------------------------------------------------------------------------------

def _size(rng):
    """A positive int of any scale: 1 and 2 often, up to far above 2**53."""
    return rng.choice([1, 2, rng.randint(1, 16), rng.randint(1, 1000), rng.randint(2**53, 2**80)])


def _valid_bubble(rng, schedule):
    p = rng.choice([1, 2, 3, 4, 8, rng.randint(1, 64), rng.randint(2**40, 2**70)])
    if schedule == "gpipe":
        return c(schedule, p, _size(rng)) if rng.random() < 0.5 else c(schedule, p, _size(rng), 1)
    if schedule == "1f1b":
        return c(schedule, p, p + rng.choice([0, 1, rng.randint(0, 100), rng.randint(0, 2**70)]))
    v = rng.choice([1, 2, 3, 4, rng.randint(1, 10**6)])
    m = p * rng.choice([1, 2, rng.randint(1, 50), rng.randint(2**20, 2**60)])
    return c(schedule, p, m, v) if rng.random() < 0.8 else c(schedule, p, m, virtual_stages=v)


def draw_bubble_values(rng):
    """Every schedule; one stage (0.0), m = p for 1F1B and the interleaved one, v = 1 for the interleaved one,
    virtual_stages given by name and left out, sizes up to 2**80, and ints past the largest float (10**309
    and more) where the bubble itself is an ordinary float."""
    calls = [c("gpipe", 1, 1), c("1f1b", 1, 1), c("interleaved_1f1b", 1, 1, 1), c("gpipe", 2, 1),
             c("1f1b", 3, 3), c("interleaved_1f1b", 3, 3, 2), c("interleaved_1f1b", 4, 8, 1),
             c("interleaved_1f1b", 2, 4, virtual_stages=3), c("gpipe", 2**60 + 1, 3), c("1f1b", 5, 2**70 + 11),
             c("interleaved_1f1b", 7, 7 * (2**55 + 3), 2**30)]
    # any size: ints above 2**53 that a float does not hold, and ints past the largest float (the result is not)
    calls += [c("gpipe", 2**53 + 3, 3), c("1f1b", 2**54 + 7, 2**55 + 3), c("interleaved_1f1b", 10**300, 10**309, 1),
              c("gpipe", 10**320, 10**330), c("1f1b", 10**310, 10**310 + 1),
              c("interleaved_1f1b", 10**200, 10**400, 10**100 + 1)]
    huge = rng.randint(10**309, 10**330)
    calls.append(c("interleaved_1f1b", huge, huge * rng.randint(1, 9), rng.randint(1, 9)))
    for _ in range(30):
        calls.append(_valid_bubble(rng, rng.choice(SCHEDULES)))
    return calls


def draw_bubble_errors(rng):
    """One fault per call: an unknown schedule (another name, a case or spacing variant, None, a list, a
    dict), a non-int (float, bool, str, None) in each numeric place, zero or negative in each, virtual_stages
    other than 1 for GPipe and 1F1B, fewer micro-batches than stages for 1F1B, m not a multiple of p for the
    interleaved one."""
    calls = [c(name, 4, 8) for name in ("zero_bubble", "GPipe", "1F1B", "interleaved-1f1b", "interleaved", " gpipe",
                                        "looped_bfs", "")]
    calls.append(c(None, 4, 8))
    # not one of the strings, and not hashable either: still a ValueError
    calls += [c(["gpipe"], 4, 8), c({"gpipe": 1}, 4, 8), c(rng.choice([["1f1b"], [], {}, {"interleaved_1f1b"}]), 4, 8)]
    for position in range(3):
        for bad in (4.0, True, "4", None, 2.5):
            args = ["interleaved_1f1b", 2, 4, 2]
            args[position + 1] = bad
            calls.append(c(*args))
        for bad in (0, -1, -rng.randint(2, 2**70)):
            args = ["interleaved_1f1b", 2, 4, 2]
            args[position + 1] = bad
            calls.append(c(*args))
    calls += [c("gpipe", 4, 8, 2), c("1f1b", 4, 8, 2), c("gpipe", 3, 9, rng.randint(2, 10**6)),
              c("1f1b", 4, 3), c("1f1b", 2**60, 2**60 - 1), c("1f1b", rng.randint(3, 100), 2),
              c("interleaved_1f1b", 4, 6, 2), c("interleaved_1f1b", 4, 2, 2), c("interleaved_1f1b", 3, 10, 1),
              c("interleaved_1f1b", 2**40, 2**41 + 1, 2)]
    for _ in range(6):
        p = rng.randint(2, 40)
        calls.append(c("interleaved_1f1b", p, p * rng.randint(1, 20) + rng.randint(1, p - 1), rng.randint(1, 4)))
    return calls


def observe_bubble_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "pipeline_bubble", calls)


# --- peak_in_flight ----------------------------------------------------------------------------------------

def draw_in_flight_values(rng):
    """GPipe and 1F1B on every stage: first and last stage, one stage, m = p, m far above p, sizes up to 2**80."""
    calls = [c("gpipe", 1, 1, 0), c("1f1b", 1, 1, 0), c("1f1b", 1, 5, 0), c("gpipe", 3, 1, 2), c("1f1b", 3, 3, 0),
             c("1f1b", 3, 3, 2), c("1f1b", 4, 100, 1), c("gpipe", 2**70, 5, 2**70 - 1), c("1f1b", 2**60, 2**61, 3)]
    for _ in range(25):
        p = rng.choice([2, 3, 4, 8, rng.randint(1, 64), rng.randint(2**40, 2**70)])
        m = rng.choice([p, p + 1, p + rng.randint(0, 100), rng.randint(1, 2 * p + 1) if rng.random() < 0.3 else p * 3])
        s = rng.choice([0, p - 1, rng.randint(0, p - 1)])
        schedule = rng.choice(["gpipe", "1f1b"])
        if schedule == "1f1b" and m < p:
            m = p
        calls.append(c(schedule, p, m, s))
    return calls


def draw_in_flight_errors(rng):
    """One fault per call: an unknown schedule (the interleaved one included, a list, a dict), a non-int in
    each numeric place, stages or microbatches below 1, a stage outside 0..stages-1, fewer micro-batches than
    stages for 1F1B."""
    calls = [c(name, 4, 8, 0) for name in ("interleaved_1f1b", "zero_bubble", "GPipe", "1F1B", "", "1f1b ")]
    calls.append(c(None, 4, 8, 0))
    # not one of the strings, and not hashable either: still a ValueError
    calls += [c(["gpipe"], 4, 8, 0), c({"1f1b": 1}, 4, 8, 0), c(rng.choice([["1f1b"], [], {}, {"gpipe"}]), 4, 8, 0)]
    for position in range(3):
        for bad in (4.0, True, "2", None, 1.5):
            args = ["gpipe", 4, 8, 1]
            args[position + 1] = bad
            calls.append(c(*args))
    calls += [c("gpipe", 0, 4, 0), c("gpipe", -2, 4, 0), c("1f1b", 2, 0, 0), c("gpipe", 2, -rng.randint(1, 2**70), 0),
              c("gpipe", 4, 8, 4), c("1f1b", 4, 8, -1), c("gpipe", 4, 8, rng.randint(5, 2**70)),
              c("1f1b", 3, 9, -rng.randint(2, 100)), c("1f1b", 4, 3, 0), c("1f1b", 4, 3, 3),
              c("1f1b", 2**60, 2**60 - 1, 0), c("1f1b", rng.randint(3, 100), 2, 1)]
    return calls


def observe_in_flight_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "peak_in_flight", calls)


HIDDEN = {
    "pipeline_bubble": [
        Case("generated schedules, stages, micro-batches and virtual stages: (p-1)/(v m), a float",
             observe_bubble_calls, judge_calls(reference_pipeline_bubble, "pipeline_bubble", rel=1e-12, abs_tol=0.0),
             draw=draw_bubble_values),
        Case("bad input raises the error the text names: schedule, types, sizes, virtual stages, divisibility",
             observe_bubble_calls, judge_calls(reference_pipeline_bubble, "pipeline_bubble"), draw=draw_bubble_errors),
    ],
    "peak_in_flight": [
        Case("generated GPipe and 1F1B pipelines, every stage: the peak micro-batches held, an int",
             observe_in_flight_calls, judge_calls(reference_peak_in_flight, "peak_in_flight"),
             draw=draw_in_flight_values),
        Case("bad input raises the error the text names: schedule, types, sizes, stage index, 1F1B's m >= p",
             observe_in_flight_calls, judge_calls(reference_peak_in_flight, "peak_in_flight"),
             draw=draw_in_flight_errors),
    ],
}

PUBLIC_BUBBLE = "p = 4, m = 8: GPipe, 1F1B, interleaved with v = 2; one stage; the errors"
PUBLIC_IN_FLIGHT = "p = 4: GPipe holds m, 1F1B holds p - stage; the errors"
_B, _F = [k.name for k in HIDDEN["pipeline_bubble"]], [k.name for k in HIDDEN["peak_in_flight"]]
CLAUSES = {
    "pipeline_bubble": {
        "the bubble over the ideal time: (p - 1) / m for 'gpipe' and '1f1b'": [PUBLIC_BUBBLE, _B[0]],
        "(p - 1) / (v m) for 'interleaved_1f1b'": [PUBLIC_BUBBLE, _B[0]],
        "returns a float (0.0 for one stage)": [PUBLIC_BUBBLE, _B[0]],
        "virtual_stages defaults to 1 and may be given by name": [_B[0]],
        "the ints may be of any size": [_B[0]],
        "ValueError for a schedule other than the three names": [PUBLIC_BUBBLE, _B[1]],
        "TypeError for a stages, microbatches or virtual_stages that is not an int (a bool is not)": [PUBLIC_BUBBLE, _B[1]],
        "ValueError for stages, microbatches or virtual_stages below 1": [_B[1]],
        "ValueError for virtual_stages other than 1 with 'gpipe' or '1f1b'": [PUBLIC_BUBBLE, _B[1]],
        "ValueError for '1f1b' with fewer micro-batches than stages": [_B[1]],
        "ValueError for 'interleaved_1f1b' when microbatches is not a multiple of stages": [PUBLIC_BUBBLE, _B[1]],
    },
    "peak_in_flight": {
        "'gpipe': every stage holds all m micro-batches": [PUBLIC_IN_FLIGHT, _F[0]],
        "'1f1b': stage s holds min(m, p - s)": [PUBLIC_IN_FLIGHT, _F[0]],
        "stages are numbered from 0 (the first) to stages - 1 (the last)": [PUBLIC_IN_FLIGHT, _F[0]],
        "returns an int; the ints may be of any size": [PUBLIC_IN_FLIGHT, _F[0]],
        "ValueError for a schedule other than 'gpipe' and '1f1b'": [_F[1]],
        "TypeError for a stages, microbatches or stage that is not an int (a bool is not)": [PUBLIC_IN_FLIGHT, _F[1]],
        "ValueError for stages or microbatches below 1, or a stage outside 0..stages - 1": [PUBLIC_IN_FLIGHT, _F[1]],
        "ValueError for '1f1b' with fewer micro-batches than stages": [PUBLIC_IN_FLIGHT, _F[1]],
    },
}

"""Judges pass only on a student's evidence: forged observations fail every case of every exercise.

An observation is what an observer returned in the sandbox, where the student's code also ran; a judge
must rebuild the inputs and expected values itself (seeded) and treat empty or missing data as a
failure. Each case's judge is fed observations no answer produced: empty structures, and structures
claiming their own expected values (``expected`` equal to ``got``, rows with nothing wrong, ranks that
agree). It must fail each of them, as the grader counts it: a message, or an exception (``engine._judge``
turns a judge's exception into a failed check).
"""

from __future__ import annotations

import pytest

from gpucourse import checks

EMPTY = [None, {}, [], "", 0, 0.0, True, {"ok": True}, {"data": {}}, [{}], [[]], {"": {}}]

# structures shaped like the course's observations, claiming what a judge might expect; each fills every
# key a judge might read with an empty or self-consistent value
CLAIMS = [
    {"expected": [], "values": [], "inputs": []},
    {"expected": [1, 2], "values": [1, 2], "inputs": [1, 2], "got": [1, 2]},
    {"expected": {"a": 1}, "got": {"a": 1}, "values": {"a": 1}, "inputs": {"a": 1}},
    {"configs": 0, "rows": []},
    {"returncode": 0, "ranks": {}, "tail": ""},
    {"returncode": 0, "ranks": {"0": {"rank": 0}, "1": {"rank": 1}}, "tail": ""},
    {"returncode": 0, "ranks": {"0": {"rank": 0, "world_size": 2, "runs": [], "per_epoch": [], "grad_gaps": [],
                                      "no_grad": [], "weights": [], "logged": {}},
                                "1": {"rank": 1, "world_size": 2, "runs": [], "per_epoch": [], "grad_gaps": [],
                                      "no_grad": [], "weights": [], "logged": {}}}, "tail": ""},
    {"events": [], "losses": [], "batches": 0, "sizes": [], "tensors": 0, "moved": 0},
    {"requests": [], "texts": []},
    {"envs": [], "results": []},
    {"results": [], "expected": []},
    {"lines": [], "not_ints": []},
    {"seconds": 0.0, "launches": 0},
]
FORGERIES = [pytest.param(f, id=f"empty{i}") for i, f in enumerate(EMPTY)] + \
            [pytest.param(f, id=f"claim{i}") for i, f in enumerate(CLAIMS)]


def _every_case():
    import engine

    params = []
    for exercise in checks.exercises():
        hidden = engine.load_checks(exercise.assignment)
        for case_id, case in engine.cases_for(hidden, exercise.name):
            params.append(pytest.param(case, id=f"{exercise.assignment}/{case_id}"))
    return params


def _fails(case, data) -> bool:
    import copy

    import engine

    return engine._judge(case, {"ok": True, "data": copy.deepcopy(data)}) is not None


@pytest.mark.parametrize("case", _every_case())
def test_a_forged_observation_fails_every_case(case):
    passed = []
    for forgery in [*EMPTY, *CLAIMS]:
        if not _fails(case, forgery):
            passed.append(forgery)
    assert not passed, f"{case.name}: passed on forged observations {passed}"

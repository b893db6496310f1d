"""Points come from outputs on inputs the grader draws at grading time: a forger gains nothing by replaying.

For every function exercise whose hidden cases draw their inputs (``Case.draw``), the reference answer
(the solution notebook's cell) is observed on the inputs of one grading (one seed): judged on those
inputs it passes every case, and judged as if the grader had drawn another grading's inputs it fails
at least one: the exercise's points need every case. That is the position of every forgery that does not
compute the answer: a forged exchange, a poisoned check or a rank's own report can only carry what was
computed before the grader's inputs were known, or replay another grading's outputs.
"""

from __future__ import annotations

import sys
import types

import pytest

from conftest import SOLUTIONS, nbgrader_meta, read
from gpucourse import checks


def _solution_sources() -> dict[str, str]:
    found = {}
    for path in sorted(SOLUTIONS.glob("*/*.ipynb")):
        for cell in read(path).cells:
            if cell.cell_type == "code" and nbgrader_meta(cell).get("solution"):
                found[nbgrader_meta(cell)["grade_id"]] = cell.source
    return found


def _drawing_exercises():
    from autograders import engine

    found = []
    for exercise in checks.exercises():
        if exercise.kind != "function":
            continue  # scripts launch ranks (their drawn launches: tests/test_checks.py's fixtures); answers draw nothing
        named = engine.cases_for(engine.load_checks(exercise.assignment), exercise.name)
        if any(case.draw is not None for _, case in named):
            found.append(pytest.param(exercise.name, named, id=exercise.name))
    return found


EXERCISES = _drawing_exercises()


@pytest.fixture(scope="module")
def solutions():
    return _solution_sources()


def _observe_all(named, ns, inputs) -> dict:
    """Each case's data, with what the grader's supervisor would see meanwhile (``Case.observe_seen``)."""
    observed = {}
    for ref, case in named:
        data, seen = case.observe_seen(ns, inputs.get(ref))
        observed[ref] = (checks.as_data(data), seen)
    return observed


def _failures(named, observed, inputs) -> list[str]:
    return [f"{ref}: {verdict}" for ref, case in named
            if (verdict := case.judge_with(observed[ref][0], inputs.get(ref), observed[ref][1])) is not None]


@pytest.mark.skipif(not EXERCISES, reason="no hidden case of a function exercise draws its inputs yet")
@pytest.mark.parametrize("exercise, named", EXERCISES)
def test_outputs_for_another_gradings_inputs_score_nothing(exercise, named, solutions, tmp_path):
    from autograders import engine

    source = tmp_path / "answer.py"  # a file: Triton's @jit reads its kernel's source
    source.write_text(solutions[exercise])
    main = types.ModuleType("__main__")  # as in the runner: classes defined in the cell pickle by reference
    saved, sys.modules["__main__"] = sys.modules["__main__"], main
    try:
        exec(compile(source.read_text(), str(source), "exec"), main.__dict__)
        for seed in range(2):
            mine, theirs = engine.draw_inputs(2 * seed, named), engine.draw_inputs(2 * seed + 1, named)
            assert mine != theirs, f"{exercise}: the same inputs whatever the seed: they can be computed in advance"
            replayed = _observe_all(named, main.__dict__, theirs)
            assert _failures(named, replayed, theirs) == [], f"{exercise}: the reference fails its own inputs"
            assert _failures(named, replayed, mine), \
                f"{exercise}: every case passed on outputs computed for another grading's inputs"
    finally:
        sys.modules["__main__"] = saved

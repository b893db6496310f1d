"""Every clause of an exercise's text names the cases that hold it, and the drawn inputs reach the
whole domain: the hidden check files' ``CLAUSES`` kept in step with their cases.

Each hidden check file (``autograders/checks/<assignment>.py``) declares, per exercise of code or
script, ``CLAUSES = {exercise: {clause: [case names]}}``: every clause of the exercise's text, and
the public or hidden cases (by name) whose failure a violating answer meets. A clause without a case,
a case name that does not exist, a hidden case that holds no clause, or an exercise left out fails here. A differential
case (its inputs drawn at grading time as ``observe_calls`` calls) probes every parameter with at
least two values.
"""

from __future__ import annotations

import random

import pytest

from gpucourse import checks


def _graded_exercises():
    return [e for e in checks.exercises() if e.kind != "answer"]


def _hidden(assignment):
    from autograders import engine

    return engine.load_checks(assignment)


def _covered(module) -> dict:
    return getattr(module, "CLAUSES", None) or {}


@pytest.mark.parametrize("exercise", [pytest.param(e, id=e.name) for e in _graded_exercises()])
def test_every_clause_names_existing_cases_and_every_hidden_case_holds_a_clause(exercise):
    from autograders import engine

    module = _hidden(exercise.assignment)
    clauses = _covered(module).get(exercise.name)
    assert clauses is not None, f"autograders/checks/{exercise.assignment}.py: CLAUSES does not list {exercise.name}"
    names = {case.name for _, case in engine.cases_for(module, exercise.name)}
    assert clauses, f"{exercise.name}: no clause listed"
    for clause, cases in clauses.items():
        assert isinstance(cases, (list, tuple)) and cases, f"{exercise.name}: clause {clause!r} names no case"
        unknown = sorted(set(cases) - names)
        assert not unknown, f"{exercise.name}: clause {clause!r} names cases that do not exist: {unknown}"
    used = {name for cases in clauses.values() for name in cases}
    idle = sorted(case.name for case in module.HIDDEN.get(exercise.name, []) if case.name not in used)
    assert not idle, f"{exercise.name}: hidden cases that hold no clause of the text: {idle}"


def _drawn_calls(case, seed):
    calls = case.inputs(random.Random(seed))
    if isinstance(calls, list) and calls and all(isinstance(c, dict) and "args" in c for c in calls):
        return calls
    return None


@pytest.mark.parametrize("exercise", [pytest.param(e, id=e.name) for e in _graded_exercises()])
def test_differential_cases_probe_every_parameter_with_two_values(exercise):
    """Across a few seeds, each positional argument and keyword of a drawn call takes two values at least."""
    from autograders import engine

    module = _hidden(exercise.assignment)
    for ref, case in engine.cases_for(module, exercise.name):
        if case.draw is None or _drawn_calls(case, 0) is None:
            continue
        seen: dict = {}
        for seed in range(5):
            for call in _drawn_calls(case, seed):
                for position, value in enumerate(call["args"]):
                    seen.setdefault(position, set()).add(repr(value))
                for key, value in call["kwargs"].get("__dict__", []):
                    seen.setdefault(key, set()).add(repr(value))
        single = sorted(str(k) for k, values in seen.items() if len(values) < 2)
        assert not single, f"{ref} ({case.name}): parameters drawn with one value only: {single}"


def test_drawn_inputs_depend_on_the_seed_and_only_on_it():
    """The same seed draws the same inputs, in any order of the cases; another seed draws others."""
    from autograders import engine

    named = [(ref, case) for e in _graded_exercises() for ref, case in engine.cases_for(_hidden(e.assignment), e.name)
             if case.draw is not None]
    if not named:
        pytest.skip("no case draws its inputs")
    first = engine.draw_inputs(7, named)
    assert engine.draw_inputs(7, list(reversed(named))) == first
    assert engine.draw_inputs(8, named) != first

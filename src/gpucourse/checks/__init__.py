"""Exercise checks, used by every lesson's exercises: observe the student's code, then judge data.

A check is a list of cases. A case's ``observe(ns)`` calls the student's code (``ns`` is the
notebook's namespace) and returns plain data: numbers, strings, lists and dicts, as JSON has
them. Its ``judge(data)`` returns ``None`` when the data is right, or a message saying what is
wrong. Nothing a judge sees can pretend to be something else: an object whose ``__eq__`` always
says yes is not plain data, so it never reaches a judge.

In a notebook, ``check("parallel_map")`` runs an exercise's public cases right there (this is what
the test cell under each exercise does, in JupyterLab and on Colab). The course's grader runs the
observers, public and hidden, in a sandbox, and the judges in its own process.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass
from typing import Any, Callable

LESSONS = tuple(f"gpucourse.checks.{name}" for name in (  # modules that register public cases
    "lesson01", "lesson02", "lesson03", "lesson04", "lesson05", "quiz",
    "lesson06", "lesson07", "lesson08", "lesson09", "lesson10"))


@dataclass(frozen=True)
class Case:
    name: str
    observe: Callable[[dict], Any]
    judge: Callable[[Any], "str | None"]


PUBLIC: dict[str, list[Case]] = {}


def register(exercise: str, *cases: Case) -> None:
    PUBLIC.setdefault(exercise, []).extend(cases)


def public_cases(exercise: str) -> list[Case]:
    for module in LESSONS:
        importlib.import_module(module)
    if exercise not in PUBLIC:
        raise KeyError(f"no exercise {exercise!r}; known: {', '.join(sorted(PUBLIC))}")
    return PUBLIC[exercise]


def as_data(value: Any) -> Any:
    """``value`` as plain JSON data, or TypeError: what crosses from student code to a judge."""
    return json.loads(json.dumps(value))


def run_case(case: Case, namespace: dict) -> str | None:
    """Observe and judge in this process; the failure message, or None."""
    try:
        data = as_data(case.observe(namespace))
    except Exception as error:  # the student's code raising is a failed case, not a crash
        return f"{case.name}: raised {type(error).__name__}: {error}"
    verdict = case.judge(data)
    return None if verdict is None else f"{case.name}: {verdict}"


def check(exercise: str, namespace: dict | None = None) -> None:
    """Run ``exercise``'s public cases on the caller's namespace; raise AssertionError on failure."""
    namespace = namespace if namespace is not None else sys._getframe(1).f_globals
    cases = public_cases(exercise)
    failures = []
    for case in cases:
        message = run_case(case, namespace)
        print(("✗ " + message) if message else f"✓ {case.name}")
        if message:
            failures.append(message)
    if failures:
        raise AssertionError(f"{exercise}: {len(failures)} of {len(cases)} public checks failed:\n" + "\n".join(failures))
    print(f"{exercise}: all {len(cases)} public checks passed (grading runs more)")

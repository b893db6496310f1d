"""The self-check key (src/gpucourse/checks/self_check.json), written by `make release` from solutions/.

For every answer exercise (``kind="answer"``): run its answer cell from the solution notebook (an
answer cell of that kind is plain assignments), and collect every answer the grader gives full
marks. Where the grader accepts several (a range of worker counts, a code that counts either
way), they are found by trying, part by part, every value of the form the exercise asks for (its
declaration's ``choices``: each tool for each workload, each set of codes for each case, ...) with the solution's other parts,
keeping those that pass every public and hidden case, then confirming each combination. Each
accepted answer is read as the grader reads it (``gpucourse.checks.self_check.normalized``) and
stored as a salted sha256 only: the key file holds no answer in plain text.

Salts are random per exercise and kept from the key already there, so that releasing the same
solutions again writes the same file (tests/test_release.py compares it with a fresh build).
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
from pathlib import Path
from typing import Any, Callable

import nbformat

import gpucourse.checks as public
from gpucourse.checks import self_check

from .course import PACKAGE, SOLUTIONS
from .settings import SelfCheckKey

KEY = PACKAGE / "checks" / "self_check.json"
ABOUT = ("Self-check keys for the answer exercises, written by `make release`: "
         "per exercise a random salt and the sha256 of salt + the canonical JSON of each accepted answer. "
         "No answer is stored in plain text; see gpucourse/checks/self_check.py for what this does and does not hide.")
MAX_ANSWERS = SelfCheckKey.max_answers.default_value  # unless release passes c.SelfCheckKey.max_answers (settings.py)
SOLUTION_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.M)


def answer_cell_source(solutions: Path, exercise: public.Exercise) -> str:
    """The source of ``exercise``'s answer cell in its solution notebook, without the solution markers."""
    found = []
    for path in sorted((solutions / exercise.assignment).glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell.cell_type == "code" and meta.get("solution") and meta.get("grade_id") == exercise.name:
                found.append(cell.source)
    if len(found) != 1:
        raise SystemExit(f"{exercise.assignment}: expected one answer cell {exercise.name!r} in solutions/, found {len(found)}")
    return SOLUTION_MARKERS.sub("", found[0])


def solution_namespace(solutions: Path, exercise: public.Exercise) -> dict:
    ns: dict = {"__name__": "__main__"}
    exec(compile(answer_cell_source(solutions, exercise), f"<{exercise.name} solution>", "exec"), ns)
    return ns


def _grader(exercise: public.Exercise) -> Callable[[dict], bool]:
    """Whether the grader gives full marks to the answers in a namespace: every public and hidden case passes."""
    from .engine import cases_for, load_checks

    cases = [case for _, case in cases_for(load_checks(exercise.assignment), exercise.name)]
    return lambda ns: all(public.run_case(case, ns) is None for case in cases)


def accepted_answers(solutions: Path, exercise: public.Exercise, max_answers: int = MAX_ANSWERS) -> list[Any]:
    """Every accepted answer of ``exercise``, normalized, sorted by canonical JSON; the solution's among them.
    More than ``max_answers`` combinations of its parts' accepted values stop the release (SystemExit)."""
    ns = solution_namespace(solutions, exercise)
    full_marks = _grader(exercise)
    if not full_marks(ns):
        raise SystemExit(f"{exercise.name}: the solution's answer does not pass its own checks")
    names = [a.name for a in exercise.answers]
    accepted = [ns]
    if exercise.choices is not None and len(names) == 1 and isinstance(ns[names[0]], dict):
        name, solution = names[0], ns[names[0]]
        parts = {}
        for key, candidates in exercise.choices(solution).items():
            parts[key] = [value for value in candidates if full_marks({**ns, name: {**solution, key: value}})]
            if not parts[key]:
                raise SystemExit(f"{exercise.name}: no candidate for part {key!r} passes; the candidates miss the solution's form")
        combinations = 1
        for values in parts.values():
            combinations *= len(values)
        if combinations > max_answers:
            raise SystemExit(f"{exercise.name}: {combinations} accepted answers, more than c.SelfCheckKey.max_answers = "
                             f"{max_answers}; the grader accepts too much to list")
        accepted = []
        for values in itertools.product(*parts.values()):
            candidate = {**ns, name: dict(zip(parts, values))}
            if full_marks(candidate):  # the parts are judged apart; confirm each whole answer
                accepted.append(candidate)
    found = {self_check.canonical(v): v for v in (self_check.normalized(exercise.name, a) for a in accepted)}
    if self_check.canonical(self_check.normalized(exercise.name, ns)) not in found:
        raise SystemExit(f"{exercise.name}: the solution's own answer is not among those accepted")
    return [found[k] for k in sorted(found)]


def build_key(solutions: Path = SOLUTIONS, salts: dict[str, str] | None = None, only: str | None = None,
              old: dict | None = None, max_answers: int = MAX_ANSWERS) -> dict:
    """The key for every answer exercise declared in ``gpucourse.checks`` whose assignment is in ``solutions``.

    ``salts`` (exercise -> salt) are kept; an exercise without one gets a new random salt. ``only``
    rebuilds one assignment's entries and keeps the other exercises' entries of the key ``old``.
    ``max_answers``: the most accepted answers per exercise (``accepted_answers``).
    """
    salts = salts or {}
    exercises = {}
    for exercise in public.exercises():
        if exercise.kind != "answer" or not (solutions / exercise.assignment).is_dir():
            continue
        if only is not None and exercise.assignment != only:
            if exercise.name in (old or {}).get("exercises", {}):
                exercises[exercise.name] = old["exercises"][exercise.name]
            continue
        salt = salts.get(exercise.name) or secrets.token_hex(16)
        hashes = sorted(self_check.digest(salt, value) for value in accepted_answers(solutions, exercise, max_answers))
        exercises[exercise.name] = {"salt": salt, "hashes": hashes}
    return {"about": ABOUT, "format": 1, "exercises": dict(sorted(exercises.items()))}


def render(key: dict) -> str:
    return json.dumps(key, indent=1, sort_keys=False) + "\n"


def salts_of(path: Path = KEY) -> dict[str, str]:
    """The salts of the key file at ``path`` (none when there is none)."""
    if not path.is_file():
        return {}
    return {name: entry["salt"] for name, entry in json.loads(path.read_text()).get("exercises", {}).items()}


def write_key(solutions: Path = SOLUTIONS, path: Path = KEY, only: str | None = None,
              max_answers: int = MAX_ANSWERS) -> bool:
    """Write the key for ``solutions`` (``only`` one assignment's part of it) to ``path``, keeping its
    salts; True if the file changed. ``max_answers``: see ``build_key``."""
    old = json.loads(path.read_text()) if path.is_file() else None
    text = render(build_key(solutions, salts_of(path), only=only, old=old, max_answers=max_answers))
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True

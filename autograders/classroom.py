"""A class of submissions built from the course's own material, for tests and benchmarks.

Students: ``reference`` (the solution notebook), ``unanswered`` (the release as handed out), and
one student per answer fixture in ``tests/fixtures/<assignment>/{wrong,right}/<exercise>__<name>.py``:
the release with that one answer cell filled in. ``expected`` says what each should score.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from assemble import nbgrader_meta
from course import COURSE, ROOT, SOLUTIONS

FIXTURES = ROOT / "tests" / "fixtures"


def fixtures() -> list[tuple[str, str, str, Path]]:
    """(assignment, "wrong" or "right", exercise, file) for every fixture file."""
    found = []
    for assignment_dir in sorted(p for p in FIXTURES.iterdir() if p.is_dir() and (SOLUTIONS / p.name).is_dir()):
        for kind in ("wrong", "right"):
            for path in sorted((assignment_dir / kind).glob("*.py")):
                found.append((assignment_dir.name, kind, path.stem.split("__")[0], path))
    return found


def auto_graded_cells(nb: dict) -> list[str]:
    return [nbgrader_meta(c)["grade_id"] for c in nb["cells"] if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")]


def build(folder: Path, limit: int | None = None) -> dict[tuple[str, str], dict[str, str]]:
    """Write the class into ``folder``; returns {(student, assignment): {test cell: "full" | "zero"}}."""
    expected = {}
    for source in sorted(SOLUTIONS.glob("*/*.ipynb")):
        assignment = source.parent.name
        released = COURSE / assignment / source.name
        cells = auto_graded_cells(json.loads(source.read_text()))
        shutil.copytree(source.parent, folder / "reference" / assignment)
        shutil.copytree(released.parent, folder / "unanswered" / assignment)
        expected[("reference", assignment)] = {c: "full" for c in cells}
        expected[("unanswered", assignment)] = {c: "zero" for c in cells}
        for fixture_assignment, kind, exercise, path in fixtures():
            if fixture_assignment != assignment:
                continue
            nb = json.loads(released.read_text())
            targets = [c for c in nb["cells"] if nbgrader_meta(c).get("grade_id") == exercise]
            if len(targets) != 1:
                raise ValueError(f"{released.name} has no solution cell {exercise!r} (fixture {path.name})")
            targets[0]["source"] = path.read_text()
            student = f"{kind}-{exercise}-{path.stem.split('__')[1]}"
            (folder / student / assignment).mkdir(parents=True)
            (folder / student / assignment / released.name).write_text(json.dumps(nb, indent=1))
            expected[(student, assignment)] = {f"test_{exercise}": "zero" if kind == "wrong" else "full"}
    if limit is not None:
        for student, assignment in list(expected)[limit:]:
            shutil.rmtree(folder / student / assignment)
            if not any((folder / student).iterdir()):
                (folder / student).rmdir()
            del expected[(student, assignment)]
    return expected

"""The grading round trip through `make grade`, on one class of submissions:

- the solution notebooks score full marks on every auto-graded cell;
- the released notebooks, unanswered, score 0 on every auto-graded cell;
- each wrong-answer fixture scores 0 on its exercise, each alternative correct answer full marks
  (one of them writes warnings to stderr, which must cost nothing);
- a stray folder is reported, and does not stop the batch;
- grades.csv, feedback and logs land in RESULTS, and one student can be regraded alone.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from conftest import COURSE, FIXTURES, ROOT, SOLUTIONS, nbgrader_meta, notebooks, read


def _fixtures() -> list[tuple[str, str, str, Path]]:
    """(assignment, "wrong" or "right", exercise, file) for every fixture file."""
    found = []
    for assignment_dir in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        for kind in ("wrong", "right"):
            for path in sorted((assignment_dir / kind).glob("*.py")):
                found.append((assignment_dir.name, kind, path.stem.split("__")[0], path))
    return found


FIXTURE_FILES = _fixtures()


def _student(kind: str, exercise: str, path: Path) -> str:
    return f"{kind}-{exercise}-{path.stem.split('__')[1]}"


def _auto_cells(nb) -> list[str]:
    return [nbgrader_meta(c)["grade_id"] for c in nb.cells
            if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")]


def _submit(folder: Path, student: str, assignment: str, nb) -> None:
    target = folder / student / assignment
    target.mkdir(parents=True)
    nbformat.write(nb, target / "submission.ipynb")


def _with_answer(released: Path, exercise: str, source: str):
    nb = read(released)
    cells = [c for c in nb.cells if nbgrader_meta(c).get("grade_id") == exercise]
    assert len(cells) == 1, f"{released.name} has no solution cell {exercise!r}"
    cells[0].source = source
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    submissions = tmp_path_factory.mktemp("submitted")
    results = tmp_path_factory.mktemp("results")
    expected = {}
    for source in notebooks(SOLUTIONS):
        assignment = source.parent.name
        released = COURSE / assignment / source.name
        nb_name = source.stem
        shutil.copytree(source.parent, submissions / "reference" / assignment)
        shutil.copytree(released.parent, submissions / "unanswered" / assignment)
        cells = _auto_cells(read(source))
        expected[("reference", assignment)] = {c: "full" for c in cells}
        expected[("unanswered", assignment)] = {c: "zero" for c in cells}
        for fixture_assignment, kind, exercise, path in FIXTURE_FILES:
            if fixture_assignment != assignment:
                continue
            student = _student(kind, exercise, path)
            nb = _with_answer(released, exercise, path.read_text())
            target = submissions / student / assignment
            target.mkdir(parents=True)
            nbformat.write(nb, target / f"{nb_name}.ipynb")
            expected[(student, assignment)] = {f"test_{exercise}": "zero" if kind == "wrong" else "full"}
    (submissions / "stray" / "no_such_assignment").mkdir(parents=True)
    (submissions / "stray" / "no_such_assignment" / "x.ipynb").write_text("{}")
    run = subprocess.run(["make", "-s", "grade", f"SUBMISSIONS={submissions}", f"RESULTS={results}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert run.returncode == 0, f"make grade failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return submissions, results, expected


def _score(results: Path, student: str, assignment: str, notebook: str, grade_id: str):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{results / 'nbgrader' / 'gradebook.db'}") as gb:
        grade = gb.find_grade(grade_id, notebook, assignment, student)
        return grade.score, grade.max_score


def test_every_exercise_has_both_kinds_of_fixture():
    for source in notebooks(SOLUTIONS):
        nb = read(source)
        exercises = [nbgrader_meta(c)["grade_id"] for c in nb.cells
                     if nbgrader_meta(c).get("solution") and c.cell_type == "code"]
        for exercise in exercises:
            assert f"test_{exercise}" in _auto_cells(nb), f"{exercise}: no test_{exercise} cell"
            kinds = {k for a, k, e, _ in FIXTURE_FILES if a == source.parent.name and e == exercise}
            assert kinds == {"wrong", "right"}, f"{exercise}: fixtures of kinds {kinds}, need wrong and right"


def test_scores(graded):
    _, results, expected = graded
    notebook_of = {p.parent.name: p.stem for p in notebooks(SOLUTIONS)}
    wrong = []
    for (student, assignment), cells in expected.items():
        for grade_id, want in cells.items():
            score, max_score = _score(results, student, assignment, notebook_of[assignment], grade_id)
            assert max_score > 0
            if score != (max_score if want == "full" else 0):
                wrong.append(f"{student}/{grade_id}: {score}/{max_score}, expected {want}")
    assert not wrong, "\n".join(wrong)


def test_grades_csv_in_nbgrader_export_format(graded):
    _, results, expected = graded
    with open(results / "grades.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {"assignment", "student_id", "score", "max_score"} <= set(rows[0])
    assert {(r["student_id"], r["assignment"]) for r in rows} == set(expected)
    reference = next(r for r in rows if r["student_id"] == "reference")
    unanswered = next(r for r in rows if r["student_id"] == "unanswered")
    assert float(unanswered["score"]) == 0
    written = 3  # the hand-graded answer is not scored yet
    assert float(reference["score"]) == float(reference["max_score"]) - written


def test_feedback_and_logs_per_submission(graded):
    _, results, expected = graded
    for student, assignment in expected:
        pages = list((results / "feedback" / student / assignment).glob("*.html"))
        assert pages, f"no feedback for {student}/{assignment}"
        assert (results / "logs" / f"{student}__{assignment}.log").exists()


def test_stray_folder_is_reported_not_fatal(graded):
    _, results, _ = graded
    problems = (results / "problems.txt").read_text()
    assert "stray/no_such_assignment: unknown assignment" in problems


def test_one_student_can_be_regraded(graded):
    submissions, results, expected = graded
    before = (results / "grades.csv").read_text()
    run = subprocess.run(["make", "-s", "grade", f"SUBMISSIONS={submissions}", f"RESULTS={results}",
                          "GRADE_ARGS=--student unanswered"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "graded 1 submission(s)" in run.stdout
    assert (results / "grades.csv").read_text() == before  # same scores, nobody else touched


def test_grade_without_arguments_explains_itself():
    run = subprocess.run(["make", "-s", "grade"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode != 0 and "usage: make grade SUBMISSIONS=<dir> RESULTS=<dir>" in run.stdout


def test_validate_button_passes_correct_code_that_warns(tmp_path):
    """The students' Validate button runs the same executor: warnings are not failures there either."""
    from course import load_config
    from nbgrader.validator import Validator

    source = SOLUTIONS / "lesson01_processes_threads" / "processes_threads.ipynb"
    warns = FIXTURES / "lesson01_processes_threads" / "right" / "parallel_map__with_warnings.py"
    nb = read(source)
    next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == "parallel_map").source = warns.read_text()
    nbformat.write(nb, tmp_path / "warns.ipynb")
    result = Validator(config=load_config()).validate(str(tmp_path / "warns.ipynb"))
    assert "failed" not in result, result.get("failed")

    broken = FIXTURES / "lesson01_processes_threads" / "wrong" / "parallel_map__always_threads.py"
    next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == "parallel_map").source = broken.read_text()
    nbformat.write(nb, tmp_path / "broken.ipynb")
    result = Validator(config=load_config()).validate(str(tmp_path / "broken.ipynb"))
    assert len(result.get("failed", [])) == 1, "Validate must still report a real failure"

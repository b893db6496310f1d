"""Grading the course's class of submissions (classroom.py):

- the solution notebooks score full marks on every auto-graded cell;
- the released notebooks, unanswered, score 0 on every auto-graded cell;
- each wrong-answer fixture scores 0 on its exercise, each alternative correct answer full marks
  (one of them writes warnings to stderr, which must cost nothing); fixtures of different exercises
  share a submission (classroom.py packs them), each answer cell judged on its own;
- a stray folder is reported, and does not stop the batch;
- grades.csv, feedback and logs land in RESULTS, and one student can be regraded alone.

The solutions, the unanswered notebooks and one fixture student take the whole round trip through
`make grade` (nbgrader's gradebook, feedback, CSV export, a regrade); the other fixture students are
graded by the same engine and sandbox without the nbgrader bookkeeping (grade.engine_only), which
the round trip already covers.
Every fixture is judged in-process by tests/test_checks.py; here the first two right fixtures and the first
wrong one of each exercise also go through the sandbox (``--every-fixture-sandboxed``: all of them).
"""

from __future__ import annotations

import csv
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from autograders import classroom
from conftest import FIXTURES, ROOT, SOLUTIONS, nbgrader_meta, notebooks, read

pytestmark = pytest.mark.slow  # grades the whole class of fixtures and `make grade`'s round trip: `make test`, not `make test-fast`


ROUND_TRIP = ("reference", "unanswered")


@pytest.fixture(scope="module")
def whole_class(tmp_path_factory, request) -> tuple[Path, dict, dict]:
    """The class, built once: (folder, round trip, engine only). The fixture students but the quickest
    to regrade go to the engine alone (those ``sandboxed_by_default`` unless the run asks for all)."""
    folder = tmp_path_factory.mktemp("class")
    expected = classroom.build(folder)
    counts: dict[str, int] = {}
    for student, _ in expected:
        counts[student] = counts.get(student, 0) + 1
    quickest = min((s for s in counts if s not in ROUND_TRIP), key=lambda s: (counts[s], s))
    trip = {pair: cells for pair, cells in expected.items() if pair[0] in ROUND_TRIP or pair[0] == quickest}
    engine = {pair: cells for pair, cells in expected.items() if pair not in trip}
    if not request.config.getoption("every_fixture_sandboxed"):
        engine = {pair: cells for pair, cells in engine.items() if sandboxed_by_default(pair[0])}
    return folder, trip, engine


SANDBOXED = ("right-1", "right-2", "wrong-1")  # the fixture students graded in the sandbox by default


def sandboxed_by_default(student: str) -> bool:
    """Which fixture students the suite grades in the sandbox: the first two right ones, and the first wrong one.

    tests/test_checks.py judges every fixture's observations in-process (both tiers), each wrong one
    against the reason its first line names. What the sandbox can add is a difference between the two
    paths, and the costly one is an honest answer losing points there. ``right-1`` and ``right-2`` answer
    every exercise with two different correct answers (each has at least two), beside the reference
    (which carries every honest pattern of ``classroom.with_honest_patterns``); ``wrong-1`` answers
    every exercise wrongly (each has at least three). The other right students (up to ``right-7``) answer
    only the exercises that have more right fixtures: each is one more sandboxed run for answers that both
    tiers judge in-process anyway. ``pytest --every-fixture-sandboxed`` grades them all.
    """
    return not student.startswith(("right-", "wrong-")) or student in SANDBOXED


def _copy(source: Path, pairs, folder: Path) -> Path:
    for student, assignment in pairs:
        shutil.copytree(source / student / assignment, folder / student / assignment)
    return folder


@pytest.fixture(scope="module")
def engine_graded(whole_class, tmp_path_factory):
    from autograders import grade

    source, _, expected = whole_class
    batch, graded = grade.engine_only(_copy(source, expected, tmp_path_factory.mktemp("engine-submitted")))
    assert not batch.problems, batch.problems
    return expected, graded


@pytest.fixture(scope="module")
def graded(whole_class, tmp_path_factory):
    source, expected, _ = whole_class
    submissions = _copy(source, expected, tmp_path_factory.mktemp("submitted"))
    results = tmp_path_factory.mktemp("results")
    (submissions / "stray" / "no_such_assignment").mkdir(parents=True)
    (submissions / "stray" / "no_such_assignment" / "x.ipynb").write_text("{}")
    _submit_late(submissions, results, *_late(expected))
    run = subprocess.run(["make", "-s", "grade", f"SUBMISSIONS={submissions}", f"RESULTS={results}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert run.returncode == 0, f"make grade failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return submissions, results, expected


def _late(expected) -> tuple[str, str]:
    """The submission handed in late: the quickest student's (the one regraded below)."""
    counts: dict[str, int] = {}
    for student, _ in expected:
        counts[student] = counts.get(student, 0) + 1
    student = min(counts, key=lambda s: (counts[s], s))
    return next(pair for pair in expected if pair[0] == student)


def _submit_late(submissions: Path, results: Path, student: str, assignment: str) -> None:
    """nbgrader's exchange stamps a submission in timestamp.txt; the due date is in the gradebook, as
    `nbgrader db assignment add --duedate` (or c.DueDates in nbgrader_config.py, via make grade) puts it."""
    import os
    import sys

    from nbgrader.api import Gradebook

    (submissions / student / assignment / "timestamp.txt").write_text("2030-01-02 00:00:00.000000 UTC")
    (results / "nbgrader").mkdir()
    path = os.environ["PATH"]
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + path  # nbgrader runs `alembic` to create it
    try:
        with Gradebook(f"sqlite:///{results / 'nbgrader' / 'gradebook.db'}") as gb:
            gb.update_or_create_assignment(assignment, duedate="2030-01-01 00:00:00 UTC")
    finally:
        os.environ["PATH"] = path


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
            assert f"test_{exercise}" in classroom.auto_graded_cells(nb), f"{exercise}: no test_{exercise} cell"
            kinds = {k for a, k, e, _ in classroom.fixtures() if a == source.parent.name and e == exercise}
            assert kinds == {"wrong", "right"}, f"{exercise}: fixtures of kinds {kinds}, need wrong and right"


def test_enough_fixtures_and_each_says_why():
    """Every exercise: at least 3 wrong answers, each naming the ✗ it must cause, and 2 right ones that
    say how they differ from the reference."""
    counts: dict[tuple[str, str, str], int] = {}
    for assignment, kind, exercise, path in classroom.fixtures():
        counts[(assignment, exercise, kind)] = counts.get((assignment, exercise, kind), 0) + 1
        assert classroom.intended(path)[0] == ("fails" if kind == "wrong" else "approach"), path
    for source in notebooks(SOLUTIONS):
        for exercise in [nbgrader_meta(c)["grade_id"] for c in read(source).cells
                         if nbgrader_meta(c).get("solution") and c.cell_type == "code"]:
            wrong, right = (counts.get((source.parent.name, exercise, k), 0) for k in ("wrong", "right"))
            assert wrong >= 3 and right >= 2, f"{source.parent.name}/{exercise}: {wrong} wrong, {right} right fixtures"


def test_wrong_fixtures_fail_for_their_own_reason(graded, engine_graded):
    """Scoring 0 is not enough: the ✗ line must be the one the fixture's first line names."""
    _, results, expected = graded
    fixtures_expected, fixtures_graded = engine_graded
    missed = []
    for pair in {**expected, **fixtures_expected}:
        for test, path in classroom.fixture_paths.get(pair, {}).items():
            kind, reason = classroom.intended(path)
            if kind != "fails":
                continue
            if pair in fixtures_graded:
                lines = [line for line in fixtures_graded[pair].submission.report[test] if line.startswith("✗")]
            else:  # the round trip's student: its log lists every check's result under its test cell
                log = (results / "logs" / f"{pair[0]}__{pair[1]}.log").read_text().split("--- sandbox output ---")[0]
                section = log.split(f"\n{test} (", 1)[-1].split("\ntest_", 1)[0] if f"\n{test} (" in log else ""
                lines = [line.strip() for line in section.splitlines() if line.strip().startswith("✗")]
            if not any(reason in line for line in lines):
                missed.append(f"{path.relative_to(FIXTURES)}: no ✗ line with {reason!r}; got {lines}")
    assert not missed, "\n".join(missed)


def test_scores(graded, engine_graded):
    _, results, expected = graded
    notebook_of = {p.parent.name: p.stem for p in notebooks(SOLUTIONS)}
    fixtures_expected, fixtures_graded = engine_graded
    wrong = []
    for (student, assignment), cells in {**expected, **fixtures_expected}.items():
        for grade_id, want in cells.items():
            if (student, assignment) in expected:  # from the gradebook, as Formgrader and the export read it
                score, max_score = _score(results, student, assignment, notebook_of[assignment], grade_id)
            else:
                result = fixtures_graded[(student, assignment)]
                score, max_score = result.submission.scores[grade_id], result.submission.max_scores[grade_id]
            assert max_score > 0
            if score != (max_score if want == "full" else 0):
                wrong.append(f"{student}/{grade_id}: {score}/{max_score}, expected {want}")
    assert not wrong, "\n".join(wrong)


def test_grades_csv_in_nbgrader_export_format(graded):
    _, results, expected = graded
    with open(results / "grades.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {"assignment", "student_id", "score", "max_score"} <= set(rows[0])
    pairs = {(r["student_id"], r["assignment"]): r for r in rows}
    assert set(expected) <= set(pairs), "every graded submission has its row"
    # nbgrader exports every student for every assignment; what a student did not submit scores 0
    assert all(float(r["score"]) == 0 for pair, r in pairs.items() if pair not in expected)
    for source in notebooks(SOLUTIONS):
        assignment = source.parent.name
        reference = next(r for r in rows if r["student_id"] == "reference" and r["assignment"] == assignment)
        unanswered = next(r for r in rows if r["student_id"] == "unanswered" and r["assignment"] == assignment)
        assert float(unanswered["score"]) == 0
        written = sum(nbgrader_meta(c)["points"] for c in read(source).cells  # hand-graded: not scored yet
                      if nbgrader_meta(c).get("grade") and nbgrader_meta(c).get("solution"))
        assert float(reference["score"]) == float(reference["max_score"]) - written


def test_a_late_submission_gets_nbgraders_penalty(graded):
    _, results, expected = graded
    student, assignment = _late(expected)
    with open(results / "grades.csv") as handle:
        rows = {(r["student_id"], r["assignment"]): r for r in csv.DictReader(handle)}
    late = rows[(student, assignment)]
    assert late["timestamp"].startswith("2030-01-02 00:00:00") and late["duedate"].startswith("2030-01-01")
    assert float(late["late_submission_penalty"]) == float(late["raw_score"]) and float(late["score"]) == 0  # "zero"
    assert "late: 86400 s after the due date" in (results / "logs" / f"{student}__{assignment}.log").read_text()
    assert all(float(r["late_submission_penalty"]) == 0 for pair, r in rows.items() if pair != (student, assignment))


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
    counts: dict[str, int] = {}
    for student, _ in expected:
        counts[student] = counts.get(student, 0) + 1
    student = min(counts, key=lambda s: (counts[s], s))  # the quickest to regrade
    before = {name: (results / name).read_text() for name in ("grades.csv", "flagged.txt", "problems.txt")}
    run = subprocess.run(["make", "-s", "grade", f"SUBMISSIONS={submissions}", f"RESULTS={results}",
                          f"GRADE_ARGS=--student {student}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"graded {counts[student]} submission(s)" in run.stdout  # that student's, nobody else's
    # same scores and late penalty, same flags; nobody else's lines touched (the stray folder's problem stays)
    assert {name: (results / name).read_text() for name in before} == before


def test_grade_without_arguments_explains_itself():
    run = subprocess.run(["make", "-s", "grade"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode != 0 and "usage: make grade SUBMISSIONS=<dir> RESULTS=<dir>" in run.stdout


def test_validate_button_passes_correct_code_that_warns(tmp_path):
    """The students' Validate button runs the same executor: warnings are not failures there either."""
    from autograders.course import load_config
    from nbgrader.validator import Validator

    source = SOLUTIONS / "quiz_gpu_data_parallel" / "quiz.ipynb"  # the quickest notebook to run twice
    right = sorted((FIXTURES / "quiz_gpu_data_parallel" / "right").glob("q1__*.py"))[0].read_text()
    warns = ("import sys, warnings\nwarnings.warn('a warning, as torch and Lightning print them')\n"
             "print('and a line on stderr', file=sys.stderr)\n" + right)
    nb = read(source)
    next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == "q1").source = warns
    nbformat.write(nb, tmp_path / "warns.ipynb")
    result = Validator(config=load_config()).validate(str(tmp_path / "warns.ipynb"))
    assert "failed" not in result, result.get("failed")

    # the quiz's public checks judge the form of an answer (its hidden ones, the content)
    next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == "q1").source = 'q1 = "none of these"'
    nbformat.write(nb, tmp_path / "broken.ipynb")
    result = Validator(config=load_config()).validate(str(tmp_path / "broken.ipynb"))
    assert len(result.get("failed", [])) == 1, "Validate must still report a real failure"


@pytest.mark.bench
def test_grading_bench_reports_a_ratio(tmp_path):
    import json

    from autograders import bench_grading

    assert bench_grading.main(["--out", str(tmp_path), "--limit", "2", "--only", "quiz_gpu_data_parallel"]) == 0
    results = json.loads((tmp_path / "grading.json").read_text())
    assert results["submissions"] == 2 and results["problems"] == 0
    assert results["ratio"] == pytest.approx(results["nbgrader_sequential_s"] / results["engine_s"])
    steps = results["nbgrader_steps_s"]  # nbgrader makes the engine's steps too: the ratio compares the same work
    assert set(steps) == {"register", "autograde", "feedback", "export"} and all(v > 0 for v in steps.values())
    assert results["nbgrader_sequential_s"] == pytest.approx(sum(steps.values()))
    assert results["ratio_autograde_only"] == pytest.approx(steps["autograde"] / results["engine_s"])
    assert results["engine_started_s"] > 0  # the engine without its preloaded Python, for comparison
    assert "| engine (sandboxed" in (tmp_path / "grading.md").read_text()


def test_written_answers_wait_for_a_person_and_count_once_graded(graded, tmp_path):
    """What Formgrader does: a manual score on the written answer, then `nbgrader export` counts it."""
    from nbgrader.api import Gradebook

    from autograders.course import load_config
    from autograders.grade import export

    _, results, _ = graded
    work = results / "nbgrader"
    db = f"sqlite:///{work / 'gradebook.db'}"
    with Gradebook(db) as gb:
        written = gb.find_grade("explain_speedups", "processes_threads", "lesson01_processes_threads", "reference")
        assert written.needs_manual_grade and written.auto_score is None
        blank = gb.find_grade("explain_speedups", "processes_threads", "lesson01_processes_threads", "unanswered")
        assert blank.auto_score == 0 and not blank.needs_manual_grade
        written.manual_score = 2.5
        gb.db.commit()
    assert (work / "autograded" / "reference" / "lesson01_processes_threads" / "processes_threads.ipynb").exists()
    export(load_config(root=work, db=work / "gradebook.db", source="source", release="release"), tmp_path / "grades.csv")
    with open(tmp_path / "grades.csv") as handle:
        reference = next(r for r in csv.DictReader(handle)
                         if r["student_id"] == "reference" and r["assignment"] == "lesson01_processes_threads")
    assert float(reference["score"]) == 8 + 2.5


def test_honest_answers_keep_their_points_under_load(tmp_path):
    """A small class graded while busy processes take every core (two per core), as a grading server
    under load: the reference answers of lesson 1 and of lesson 7 (three 2-process torchrun scripts,
    whose start-up is what fails under load) keep every point, and nothing is flagged or a problem."""
    import os
    import sys

    from autograders import grade
    from autograders import sandbox

    lessons = ["lesson01_processes_threads", "lesson07_ddp_scripts"]
    for student in ("ada", "bo"):
        for lesson in lessons:
            shutil.copytree(SOLUTIONS / lesson, tmp_path / student / lesson)
    busy = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        batch, graded = grade.engine_only(tmp_path, jobs=2, limits=sandbox.Limits())
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert not batch.problems, batch.problems
    assert len(graded) == 4
    for (student, lesson), result in graded.items():
        sub = result.submission
        lost = {test: (sub.scores[test], sub.max_scores[test]) for test in sub.scores
                if sub.scores[test] != sub.max_scores[test]}
        assert not lost, (student, lesson, lost, sub.report)
        assert not sub.flags and not sub.notes, (student, lesson, sub.flags, sub.notes)

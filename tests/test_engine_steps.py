"""The grading engine's steps one at a time, notebook in and notebook out, on the quiz, no sandbox:

- take_answers takes the answers and nothing else from a submission;
- flag puts the flags and the reasons that void a submission on the notebook;
- judge scores each test cell from observations (made here from the quiz's plain answers, as the
  runner would report them), and zeroes every score of a forged submission, saying why;
- save_grades and late_penalty write the gradebook; a submission stamped (timestamp.txt) after the
  due date the course config sets gets nbgrader's LateSubmissionPlugin penalty in grades.csv, an
  on-time or unstamped one none;
- a regrade replaces one student's lines of flagged.txt and problems.txt and keeps everyone else's.

The sandboxed step, observe, runs in tests/test_grading.py and tests/test_adversarial.py.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import json
import shutil
from pathlib import Path
from unittest import mock

import nbformat
import pytest

from conftest import COURSE, SOLUTIONS, nbgrader_meta

from autograders import engine, grade, record
from autograders.context import CaseRef, Submission
from autograders.course import stamp_new_gradebook
from autograders.settings import Grading

ASSIGNMENT = "quiz_gpu_data_parallel"
RELEASED = COURSE / ASSIGNMENT / "quiz.ipynb"
QUESTIONS = [f"q{n}" for n in range(1, 27)]


def released():
    return nbformat.reads(RELEASED.read_text(), as_version=4)


def _cell(nb, grade_id: str):
    return next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == grade_id)


def reference_answers() -> dict[str, str]:
    nb = nbformat.read(SOLUTIONS / ASSIGNMENT / "quiz.ipynb", as_version=4)
    return {q: _cell(nb, q).source for q in QUESTIONS}


def submit(folder: Path, student: str, answers: dict[str, str], timestamp: str | None = None, edit=None) -> Path:
    """The released quiz with ``answers``, as ``folder/<student>/<assignment>/quiz.ipynb``."""
    nb = released()
    for grade_id, source in answers.items():
        _cell(nb, grade_id).source = source
    if edit is not None:
        edit(nb)
    path = folder / student / ASSIGNMENT / "quiz.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    if timestamp is not None:
        (path.parent / "timestamp.txt").write_text(timestamp)
    return path


def start(path: Path, student: str) -> tuple:
    return released(), Submission(student, ASSIGNMENT, "quiz", submitted=path, checks=engine.load_checks(ASSIGNMENT),
                                  grading=Grading())


def observe_here(nb, sub):
    """What ``observe`` finds, without a sandbox, for answers that are plain values (the quiz's): the
    answer cells run here, then every case's observer; its records go through ``apply_records``."""
    engine.apply_records(nb, sub, records_here(nb, sub))
    return nb, sub


def records_here(nb, sub) -> list[dict]:
    """The records the runner would write for the quiz's answers, in the protocol's order."""
    namespace, records = {}, []
    for index, cell in enumerate(sub.plan.cells):
        error = None
        if cell["grade_id"]:
            try:
                exec(cell["source"], namespace)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        records.append({"type": "cell", "index": index, "output": "", "error": error})
    for named in engine.cases_of(nb, sub.checks, ASSIGNMENT).values():
        for ref, case in named:
            data = json.loads(json.dumps(case.observe(namespace)))
            records.append({"type": "observation", "case": str(ref), "ok": True, "data": data})
    return records + [{"type": "done"}]


STEPS_HERE = (engine.take_answers, engine.flag, observe_here, engine.judge)


def test_take_answers_takes_only_the_answers(tmp_path):
    def tamper(nb):
        _cell(nb, "test_q1").source = "print('all good')"
        _cell(nb, "q2_question").source = "## 2. an easier question"

    path = submit(tmp_path, "ada", {"q1": 'q1 = "c"'}, edit=tamper)
    nb, sub = engine.take_answers(*start(path, "ada"))
    assert _cell(nb, "q1").source == 'q1 = "c"'
    assert _cell(nb, "test_q1").source == _cell(released(), "test_q1").source
    assert _cell(nb, "q2_question").source == _cell(released(), "q2_question").source
    assert _cell(nb, "q2").source == _cell(released(), "q2").source  # unanswered: the release's stub
    assert sub.answers["q1"] == 'q1 = "c"'
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code")
    assert any("test_q1: changed" in f for f in sub.plan.flags)


def test_flag_puts_flags_and_forgery_on_the_notebook(tmp_path):
    path = submit(tmp_path, "ada", {"q1": "import atexit\nq1 = 'c'"})
    nb, sub = engine.take_answers(*start(path, "ada"))
    sub.plan.forgery = ["imports the course's checks"]
    nb, sub = engine.flag(nb, sub)
    assert nb.metadata["gpucourse"]["forgery"] == ["imports the course's checks"]
    assert "imports the course's checks" in sub.flags and sub.forgery == nb.metadata["gpucourse"]["forgery"]
    assert any(f.startswith("answer q1: hard exits") for f in _cell(nb, "q1").metadata["gpucourse"]["flags"])
    assert "gpucourse" not in _cell(nb, "q2").metadata


def test_judge_scores_each_test_cell(tmp_path):
    answers = {**reference_answers(), "q2": 'q2 = "a"'}
    nb, sub = engine.run(*start(submit(tmp_path, "ada", answers), "ada"), STEPS_HERE)
    assert sub.scores == {f"test_{q}": (0.0 if q == "q2" else 1.0) for q in QUESTIONS}
    assert sub.max_scores == {f"test_{q}": 1.0 for q in QUESTIONS}
    assert set(sub.observations) == {ref for named in engine.cases_of(nb, sub.checks, ASSIGNMENT).values()
                                     for ref, _ in named}
    right, wrong = _cell(nb, "test_q1"), _cell(nb, "test_q2")
    assert [o.output_type for o in right.outputs] == ["stream"] and right.outputs[0].text.startswith("✓")
    assert [o.output_type for o in wrong.outputs] == ["stream", "error"] and "✗ hidden check:" in wrong.outputs[0].text
    assert wrong.metadata["gpucourse"] == {"score": 0.0, "max_score": 1.0}
    nbformat.validate(nb)


def test_judge_zeroes_every_score_of_a_forgery(tmp_path):
    nb, sub = engine.run(*start(submit(tmp_path, "ada", reference_answers()), "ada"), STEPS_HERE[:1])
    sub.plan.forgery = ["patches gpucourse.checks", "imports the hidden checks"]
    nb, sub = engine.run(nb, sub, STEPS_HERE[1:])
    assert set(sub.scores.values()) == {0.0}
    for test, lines in sub.report.items():
        assert lines[0] == "scored 0: patches gpucourse.checks; imports the hidden checks", test
        assert _cell(nb, test).outputs[-1].output_type == "error"


def _forged(records: list[dict]) -> dict[str, list[dict]]:
    """Ways a run's records can break the protocol, each made from an honest run's records."""
    cells = [r for r in records if r["type"] == "cell"]
    seen = [r for r in records if r["type"] == "observation"]
    done = [{"type": "done"}]
    return {
        "an observation before the last cell": cells[:-1] + seen[:1] + cells[-1:] + seen[1:] + done,
        "a duplicated observation": cells + seen[:1] + seen + done,
        "observations out of order": cells + seen[1:2] + seen[:1] + seen[2:] + done,
        "a cell record twice": cells[:1] + cells + seen + done,
        "a record after done": cells + seen + done + [seen[0]],
        "a line that is not JSON": cells + ["not json"] + seen + done,
        "the supervisor saw the worker write out of turn": cells + [{"type": "flag", "forgery": True,
                                                                    "reason": "the run's messages were forged"}] + done,
    }


def test_records_out_of_turn_are_forgery(tmp_path):
    """Cell records, then exactly one observation per case in the job's order, after the last cell:
    anything else (a record before its time, a duplicate, out of order, after done) zeroes and flags."""
    nb, sub = engine.run(*start(submit(tmp_path, "ada", reference_answers()), "ada"), STEPS_HERE[:2])
    honest = records_here(nb, sub)

    def fresh() -> Submission:
        return dataclasses.replace(sub, flags=list(sub.flags), forgery=[], observations={})

    _, checked = engine.run(copy.deepcopy(nb), fresh(),
                            (lambda n, s: (engine.apply_records(n, s, honest), (n, s))[1], engine.judge))
    assert checked.forgery == [] and set(checked.scores.values()) == {1.0}
    for name, records in _forged(honest).items():
        _, found = engine.run(copy.deepcopy(nb), fresh(),
                              (lambda n, s: (engine.apply_records(n, s, records), (n, s))[1], engine.judge))
        assert found.forgery, name
        assert set(found.scores.values()) == {0.0}, name
        assert all(reason in found.flags for reason in found.forgery), name


def test_a_run_the_runner_could_not_judge_is_flagged_for_a_person_not_zeroed_as_forgery(tmp_path):
    """Not quiet after the cells twice: the checks did not run (no observation, no points for them), and a
    person is told why; nothing is forgery, so answers observed before it keep their points."""
    nb, sub = engine.run(*start(submit(tmp_path, "ada", reference_answers()), "ada"), STEPS_HERE[:2])
    honest = records_here(nb, sub)
    cells = [r for r in honest if r["type"] == "cell"]
    seen = [r for r in honest if r["type"] == "observation"]
    reason = "the checks after this one could not be run: the process was not quiet after a check (1 threads ...)"
    first_cases = len(next(iter(engine.cases_of(nb, sub.checks, ASSIGNMENT).values())))  # every case of the first test
    records = cells + seen[:first_cases] + [{"type": "flag", "reason": reason}, {"type": "done"}]
    engine.apply_records(nb, sub, records)
    nb, sub = engine.judge(nb, sub)
    assert sub.forgery == [] and reason in sub.flags
    first = next(iter(sub.report))
    assert sub.scores[first] == 1.0 and set(list(sub.scores.values())[1:]) == {0.0}


def test_a_check_the_machine_kept_from_judging_scores_nothing_and_tells_a_person_to_grade_it_again(tmp_path, monkeypatch):
    """A judge that raises NotJudged (lesson 10's, when the local Slurm cluster failed on every try): that test
    scores 0 for now, its line says why, and a note for flagged.txt names the exercise to grade again, once;
    no forgery, and the other tests keep their points."""
    from gpucourse.checks import NotJudged

    nb, sub = engine.run(*start(submit(tmp_path, "ada", reference_answers()), "ada"), STEPS_HERE[:3])
    real = engine.cases_of

    def machine_failed(data, *rest):
        raise NotJudged("the local Slurm cluster failed, not the script: srun: error: Unable to confirm allocation")

    def cases_of(*args):
        cases = real(*args)
        first = next(iter(cases))
        cases[first] = [(ref, dataclasses.replace(case, judge=machine_failed)) for ref, case in cases[first]]
        return cases

    monkeypatch.setattr(engine, "cases_of", cases_of)
    nb, sub = engine.judge(nb, sub)
    first = next(iter(sub.report))
    assert sub.scores[first] == 0.0 and set(list(sub.scores.values())[1:]) == {1.0} and sub.forgery == []
    assert all("not judged: the local Slurm cluster failed" in line and "grade it again" in line
               for line in sub.report[first])
    assert [n for n in sub.notes if "could not be judged" in n] == [
        "q1: a check could not be judged (the local Slurm cluster failed, not the script: srun: error: Unable to "
        "confirm allocation): grade it again"]


def test_a_run_without_observations_scores_zero(tmp_path):
    nb, sub = engine.run(*start(submit(tmp_path, "ada", reference_answers()), "ada"), STEPS_HERE[:2])
    nb, sub = engine.judge(nb, sub)  # observe never reported (the sandbox died first)
    assert set(sub.scores.values()) == {0.0}
    assert all("no observation" in line for lines in sub.report.values() for line in lines)


def test_judges_in_two_threads_never_draw_between_each_others_seed_and_model():
    """The pool judges submissions in threads that share torch's global generator. A judge that seeds it and
    builds a model (lesson 7's reference) got another model when a judge in another thread built an nn.Linear
    in between (seen once in CI: a right answer scored 0, its weights 0.43 from the reference's). ``_judge``
    holds the generator for the whole judge: the second thread's draws wait until the first judge is done."""
    import threading
    import time

    import torch

    from gpucourse.checks import Case

    def seeded_model() -> list[float]:
        torch.manual_seed(7)
        time.sleep(0.2)  # the GIL goes to the other thread here, as it may between any two bytecodes
        return torch.nn.Linear(3, 2).weight.reshape(-1).tolist()

    quiet = seeded_model()
    got = {}
    slow = Case("seeds, then builds", lambda ns: None, lambda data: got.setdefault("weights", seeded_model()) and None)
    busy = Case("builds layers", lambda ns: None, lambda data: [torch.nn.Linear(8, 8) for _ in range(20)] and None)
    first = threading.Thread(target=engine._judge, args=(slow, {"ok": True, "data": 1}))
    first.start()
    time.sleep(0.05)  # the first judge has seeded and sleeps
    second = threading.Thread(target=engine._judge, args=(busy, {"ok": True, "data": 1}))
    second.start()
    first.join()
    second.join()
    assert got["weights"] == quiet


def test_case_refs_travel_as_strings_and_parse_back():
    ref = CaseRef("choose_tools", "hidden", 3)
    assert str(ref) == "choose_tools/hidden/3" and ref.hidden
    assert CaseRef.parse(str(ref)) == ref
    assert not CaseRef.parse("choose_tools/public/0").hidden
    for malformed in ("choose_tools/hidden", "choose_tools/secret/0", "choose_tools/hidden/-1", "choose_tools/hidden/01",
                      "/public/0", "a/b/public/0", "choose_tools/public/0 ", 7):
        with pytest.raises(ValueError, match="malformed case id"):
            CaseRef.parse(malformed)
    with pytest.raises(ValueError, match="not a case"):
        CaseRef("choose_tools", "secret", 0)


@pytest.fixture(scope="module")
def quiz_gradebook(tmp_path_factory) -> Path:
    """A gradebook that knows the quiz's cells, as generate_assignment leaves it (copied per test)."""
    import nbgrader.api
    from nbgrader.api import Gradebook

    path = tmp_path_factory.mktemp("gradebook") / "gradebook.db"
    assert stamp_new_gradebook(path)  # as `grade` makes it: no `alembic` subprocess
    with mock.patch.object(nbgrader.api, "get_alembic_version", side_effect=AssertionError("not stamped")):
        with Gradebook(f"sqlite:///{path}") as gb:
            gb.add_assignment(ASSIGNMENT)
            gb.add_notebook("quiz", ASSIGNMENT)
            for cell in released().cells:
                meta = nbgrader_meta(cell)
                if meta.get("grade"):
                    gb.add_grade_cell(meta["grade_id"], "quiz", ASSIGNMENT, max_score=meta["points"], cell_type=cell.cell_type)
                if meta.get("solution"):
                    gb.add_solution_cell(meta["grade_id"], "quiz", ASSIGNMENT)
    return path


def test_a_new_gradebook_is_stamped_as_nbgrader_stamps_it_without_starting_alembic(tmp_path):
    """``grade`` stamps a new gradebook in-process (course.stamp_new_gradebook); nbgrader runs the
    ``alembic`` command for it. Once ``Gradebook`` has opened each, both hold the same schema and revision,
    and the stamp leaves an existing gradebook as it is."""
    import sqlite3

    import nbgrader.api
    from nbgrader.api import Gradebook

    def contents(path: Path):
        with contextlib.closing(sqlite3.connect(path)) as db:
            schema = sorted(db.execute("SELECT type, name, sql FROM sqlite_master").fetchall())
            return schema, db.execute("SELECT version_num FROM alembic_version").fetchall()

    theirs, ours = tmp_path / "nbgrader", tmp_path / "engine"
    theirs.mkdir(), ours.mkdir()
    Gradebook(record.db_url(theirs)).close()  # nbgrader's way: its `alembic heads` subprocess
    assert stamp_new_gradebook(ours / "gradebook.db")
    with mock.patch.object(nbgrader.api, "get_alembic_version", side_effect=AssertionError("alembic started")):
        Gradebook(record.db_url(ours)).close()
    assert contents(ours / "gradebook.db") == contents(theirs / "gradebook.db")
    assert len(contents(ours / "gradebook.db")[1]) == 1

    before = (ours / "gradebook.db").read_bytes()
    assert not stamp_new_gradebook(ours / "gradebook.db")
    assert (ours / "gradebook.db").read_bytes() == before


def test_late_penalty_through_nbgrader_plugin(tmp_path, quiz_gradebook):
    from autograders.course import load_config

    work = tmp_path / "nbgrader"
    work.mkdir()
    shutil.copy(quiz_gradebook, work / "gradebook.db")
    config = load_config(root=work, db=work / "gradebook.db", source="source", release="release")
    assert config.LateSubmissionPlugin.penalty_method == "zero"  # the course's policy (nbgrader_config.py)
    config.DueDates.duedates = {ASSIGNMENT: "2026-10-05 23:59:00 Europe/Berlin", "not_graded_now": "tomorrow?"}
    grade.set_due_dates(record.db_url(work), grade.due_dates(config, [ASSIGNMENT]))

    stamps = {"late": "2026-10-06 09:00:00.000000 UTC", "on-time": "2026-10-05 21:00:00.000000 UTC",
              "unstamped": None, "garbled": "yesterday-ish"}
    logs, found = tmp_path / "logs", {}
    for student, stamp in stamps.items():
        path = submit(work / "submitted", student, reference_answers(), timestamp=stamp)
        nb, sub = engine.run(*start(path, student), STEPS_HERE)
        sub.work, sub.logs, sub.config = work, logs, config
        nb, sub = engine.run(nb, sub, record.STEPS)
        found[student] = sub
    assert (work / "autograded" / "late" / ASSIGNMENT / "quiz.ipynb").exists()

    assert found["late"].seconds_late == pytest.approx(11 * 3600 + 60)  # Berlin is UTC+2 in October
    assert found["late"].late_penalty == len(QUESTIONS)  # the "zero" policy: every point, one per question
    assert f"late: 39660 s after the due date; penalty {len(QUESTIONS)} point(s)" in (logs / f"late__{ASSIGNMENT}.log").read_text()
    assert all(found[s].late_penalty == 0 and found[s].seconds_late == 0 for s in ("on-time", "unstamped", "garbled"))
    assert "timestamp.txt holds no timestamp (ignored)" in found["garbled"].flags

    grade.export(config, tmp_path / "grades.csv")
    with open(tmp_path / "grades.csv") as handle:
        rows = {r["student_id"]: r for r in csv.DictReader(handle)}
    assert rows["late"]["duedate"].startswith("2026-10-05 21:59:00")
    late = rows["late"]
    assert (float(late["raw_score"]), float(late["late_submission_penalty"]), float(late["score"])) == (len(QUESTIONS), len(QUESTIONS), 0)
    for student in ("on-time", "unstamped", "garbled"):
        assert (float(rows[student]["late_submission_penalty"]), float(rows[student]["score"])) == (0, len(QUESTIONS))


def test_formgrader_shows_the_configured_due_dates(tmp_path, quiz_gradebook, monkeypatch):
    """`make formgrader` writes the course config's due dates into the course gradebook, as `make grade` does."""
    from autograders import formgrader
    from autograders.course import load_config
    from nbgrader.api import Gradebook

    db = tmp_path / "gradebook.db"
    shutil.copy(quiz_gradebook, db)
    config = load_config()
    config.DueDates.duedates = {ASSIGNMENT: "2026-10-05 23:59:00 Europe/Berlin"}
    monkeypatch.setattr(formgrader, "load_config", lambda: config)
    monkeypatch.setattr(formgrader, "assignments", lambda solutions: [ASSIGNMENT])
    registered = []
    monkeypatch.setattr(formgrader, "generated", lambda solutions, ids, db: registered.append(ids) or mock.MagicMock())
    formgrader.register(db=db)
    with Gradebook(f"sqlite:///{db}") as gradebook:
        assert str(gradebook.find_assignment(ASSIGNMENT).duedate).startswith("2026-10-05 21:59:00")


def test_a_due_date_nbgrader_cannot_read_stops_grading():
    from autograders.course import load_config

    config = load_config()
    config.DueDates.duedates = {ASSIGNMENT: "the fifth of October"}
    with pytest.raises(SystemExit, match="not a date nbgrader reads"):
        grade.due_dates(config, [ASSIGNMENT])


def test_a_regrade_keeps_everyone_elses_lines(tmp_path):
    flagged = tmp_path / "flagged.txt"
    flagged.write_text("ada/quiz: old flag\nbob/quiz: answer q1: patches builtins\nbo/quiz: x\n")
    grade.merge_lines(flagged, ["ada/lesson01: new flag"], "ada", sort=True)
    assert flagged.read_text() == "ada/lesson01: new flag\nbo/quiz: x\nbob/quiz: answer q1: patches builtins\n"
    grade.merge_lines(flagged, [], "bob", sort=True)  # bob's flags are gone: his regrade found none
    assert flagged.read_text() == "ada/lesson01: new flag\nbo/quiz: x\n"
    problems = tmp_path / "problems.txt"
    problems.write_text("stray/x: unknown assignment\nada/-: not a folder\n")
    grade.merge_lines(problems, [], "ada")
    assert problems.read_text() == "stray/x: unknown assignment\n"
    grade.merge_lines(problems, ["new/-: whole batch"], None)  # a whole class graded: written afresh
    assert problems.read_text() == "new/-: whole batch\n"


def test_submissions_that_launch_scripts_are_graded_first(tmp_path):
    lesson = "lesson01_processes_threads"
    for student, source in (("reference", SOLUTIONS), ("unanswered", COURSE)):
        shutil.copytree(source / lesson, tmp_path / "submitted" / student / lesson)
    order = grade.longest_first(tmp_path, [("unanswered", lesson), ("reference", lesson)],
                                lambda aid: COURSE / aid / "processes_threads.ipynb")
    assert order == [("reference", lesson), ("unanswered", lesson)]


def test_feedback_is_made_as_each_submission_is_saved_and_what_failed_is_made_again_or_reported(tmp_path):
    """Step 5 runs while the others are graded (``autograde``'s ``then``): one page per saved submission,
    copied out at once; at the end, what could not be made is tried again, and what still fails is a
    problem of the batch, with nbgrader's error in the submission's log. A page an earlier run left is
    never taken for a new one."""
    calls = []

    class Nbgrader:  # nbgrader's generate_feedback: writes the page, or says it failed (it never raises)
        def generate_feedback(self, aid, student, force):
            calls.append(student)
            if student == "broken" or (student == "flaky" and calls.count(student) == 1):
                return {"success": False, "error": f"Traceback: no page for {student}"}
            page = tmp_path / "work" / "feedback" / student / aid / "quiz.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(f"{student}'s page")
            return {"success": True}

    stale = tmp_path / "work" / "feedback" / "broken" / "quiz" / "quiz.html"  # an earlier run's page
    stale.parent.mkdir(parents=True)
    stale.write_text("an old score")
    results, batch = tmp_path / "results", grade.Batch()
    pages = grade.Feedback(Nbgrader(), tmp_path / "work", results, batch)
    assert [pages.one(student, "quiz") for student in ("ada", "flaky", "broken")] == [True, False, False]
    assert (results / "feedback" / "ada" / "quiz" / "quiz.html").read_text() == "ada's page"
    assert not (results / "feedback" / "broken").exists() and not stale.exists()
    pages.rest([("ada", "quiz"), ("flaky", "quiz"), ("broken", "quiz")])
    assert calls == ["ada", "flaky", "broken", "flaky", "broken"]  # ada's page is not made twice
    assert (results / "feedback" / "flaky" / "quiz" / "quiz.html").read_text() == "flaky's page"
    assert batch.problems == ["broken/quiz: feedback could not be generated (see its log)"]
    assert "Traceback: no page for broken" in (results / "logs" / "broken__quiz.log").read_text()
    assert not (results / "logs" / "flaky__quiz.log").exists()
    assert batch.seconds["feedback"] > 0

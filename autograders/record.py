"""The engine's last steps: write a graded submission down, then apply nbgrader's late penalty.

Both are ``step(nb, submission) -> (nb, submission)`` like the engine's (engine.py, on a
``context.Submission``), run by the grader's main thread only: it is the gradebook's one writer.

- ``save_grades``: the autograded notebook (the engine's notebook: the *released* one with the
  student's answers and the check results, so no solution or hidden check), nbgrader's gradebook
  (the submission and its ``timestamp.txt``, scores under the notebooks' grade-cell ids) and the log.
  Formgrader (manual grading of written answers), ``nbgrader generate_feedback`` and ``nbgrader
  export`` then work as usual.
- ``late_penalty``: nbgrader's own ``AssignLatePenalties`` with the course's configuration: the
  ``LateSubmissionPlugin`` (or the subclass ``c.AssignLatePenalties.plugin_class`` names) decides
  the penalty of a submission stamped after its assignment's due date.

Fields they read, besides the engine's: ``work`` (the nbgrader course folder), ``logs`` (the
folder of the logs), ``config`` (the course's nbgrader configuration) and, optionally,
``gradebook``: an open ``Gradebook`` of ``work`` kept for a whole class (SQLAlchemy then compiles
each query once instead of once per submission).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import warnings
from pathlib import Path

import nbformat
from sqlalchemy.exc import SAWarning

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.utils import compute_checksum, parse_utc

from .assemble import nbgrader_meta
from .context import Submission

QUIET = logging.getLogger("gpucourse.late")
QUIET.setLevel(logging.ERROR)
TIMESTAMP_BYTES = 200  # nbgrader writes one line such as "2026-11-23 17:00:00.000000 UTC"


def db_url(work: Path) -> str:
    return f"sqlite:///{work / 'gradebook.db'}"


@contextlib.contextmanager
def _gradebook(sub: Submission):
    if sub.gradebook is not None:
        try:
            yield sub.gradebook
        except BaseException:  # this submission's half-done changes must not reach the next one's commit
            sub.gradebook.db.rollback()
            raise
    else:
        with Gradebook(db_url(sub.work)) as gradebook:
            yield gradebook


def submitted_at(folder: Path) -> tuple[datetime.datetime | None, str | None]:
    """The submission time nbgrader's exchange wrote to ``folder/timestamp.txt`` (UTC), or None; and
    why it was not used, when the file is there but is not a timestamp (never followed if a symlink)."""
    path = folder / "timestamp.txt"
    if not path.exists() and not path.is_symlink():
        return None, None
    if path.is_symlink() or not path.is_file() or path.stat().st_size > TIMESTAMP_BYTES:
        return None, "timestamp.txt is not a one-line file (ignored)"
    try:
        return parse_utc(path.read_text().strip()), None
    except (ValueError, OverflowError, UnicodeDecodeError):
        return None, "timestamp.txt holds no timestamp (ignored)"


def _log_lines(sub: Submission) -> list[str]:
    scores, max_scores = sub.scores, sub.max_scores
    lines = [f"{sub.student}/{sub.assignment}: {sum(scores.values()):g}/{sum(max_scores.values()):g} "
             f"auto-graded points in {sub.seconds:.1f} s"]
    lines += [f"flag: {f}" for f in sub.flags] + [f"note: {n}" for n in sub.notes]
    for test, report in sub.report.items():
        lines += [f"{test} ({scores[test]:g}/{max_scores[test]:g}):"] + [f"  {r}" for r in report]
    return lines + ["--- sandbox output ---", sub.log]


def save_grades(nb, sub: Submission):
    """Writes the autograded notebook, the gradebook (the submission, stamped with its timestamp.txt
    as ``nbgrader autograde`` does; auto scores; written answers left to a person unless blank; the
    flag) and the log. A timestamp.txt that is not one becomes a flag."""
    work, student, assignment, notebook = sub.work, sub.student, sub.assignment, sub.notebook
    timestamp, why = submitted_at(sub.submitted.parent)
    if why:
        sub.flags = sub.flags + [why]
    sub.timestamp = timestamp
    target = work / "autograded" / student / assignment
    target.mkdir(parents=True, exist_ok=True)
    (target / f"{notebook}.ipynb").write_text(nbformat.v4.writes(nb))  # valid by construction: not validated per submission
    with _gradebook(sub) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore", SAWarning)  # nbgrader's add_submission autoflushes noisily
        gb.update_or_create_student(student)
        try:
            submission = gb.find_submission(assignment, student)
        except MissingEntry:
            submission = gb.add_submission(assignment, student)
        if timestamp is not None:  # as nbgrader's autograde: without a file, what the gradebook had stays
            submission.timestamp = timestamp
        for cell in nb["cells"]:
            meta = nbgrader_meta(cell)
            if not meta.get("grade"):
                continue
            grade = gb.find_grade(meta["grade_id"], notebook, assignment, student)
            if meta["grade_id"] in sub.scores:
                grade.auto_score = sub.scores[meta["grade_id"]]
            else:  # a written answer: a person grades it, unless it was left blank
                answer = sub.answers.get(meta["grade_id"])
                blank = answer is None or compute_checksum(nbformat.from_dict({**cell, "source": answer})) == meta.get("checksum")
                grade.auto_score = 0.0 if blank else None
            grade.needs_manual_grade = grade.manual_score is not None or grade.auto_score is None
        gb.find_submission_notebook(notebook, assignment, student).flagged = bool(sub.flags)
        gb.db.commit()
    sub.logs.mkdir(parents=True, exist_ok=True)
    (sub.logs / f"{student}__{assignment}.log").write_text("\n".join(_log_lines(sub)))
    return nb, sub


def late_penalty(nb, sub: Submission):
    """nbgrader's AssignLatePenalties on the saved submission: no penalty unless it is stamped after
    the assignment's due date (``DueDates`` in nbgrader_config.py), then the configured plugin's.
    Sets ``late_penalty`` (points) and ``seconds_late``; a late submission's log says both."""
    from nbgrader.preprocessors import AssignLatePenalties

    student, assignment, notebook = sub.student, sub.assignment, sub.notebook

    def found() -> tuple[float, float | None]:
        with _gradebook(sub) as gb:
            late = gb.find_submission(assignment, student).total_seconds_late
            penalty = gb.find_submission_notebook(notebook, assignment, student).late_submission_penalty
            gb.db.commit()  # no transaction left open while nbgrader's own connection writes
        return late, penalty

    late, penalty = found()
    if late > 0 or penalty is not None:  # otherwise it would only set the penalty to None again
        step = AssignLatePenalties(config=sub.config, log=QUIET)  # the log file says it below
        step.preprocess(nb, {"nbgrader": {"notebook": notebook, "assignment": assignment, "student": student,
                                          "db_url": db_url(sub.work)}})
        late, penalty = found()
    sub.seconds_late, sub.late_penalty = late, penalty or 0.0
    if late > 0:
        log = sub.logs / f"{student}__{assignment}.log"
        first, _, rest = log.read_text().partition("\n")
        log.write_text(f"{first}\nlate: {late:.0f} s after the due date; penalty {penalty or 0:g} point(s)\n{rest}")
    return nb, sub


STEPS = (save_grades, late_penalty)

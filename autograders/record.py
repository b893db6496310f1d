"""Write a graded submission down: nbgrader's gradebook, the autograded notebook, the log.

Scores land under the notebooks' grade-cell ids, so Formgrader (manual grading of written
answers), ``nbgrader generate_feedback`` and ``nbgrader export`` work as usual. The autograded
notebook is built from the *released* notebook: it can hold the student's answers and the
check results, but no solution or hidden check.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

from sqlalchemy.exc import SAWarning

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.utils import compute_checksum
from nbformat import from_dict

from assemble import nbgrader_meta
from engine import Graded


def autograded_notebook(released: dict, graded: Graded) -> dict:
    nb = copy.deepcopy(released)
    for index, cell in enumerate(nb["cells"]):
        meta = nbgrader_meta(cell)
        grade_id = meta.get("grade_id")
        if meta.get("solution") and graded.answers.get(grade_id) is not None:
            cell["source"] = graded.answers[grade_id]
        if cell["cell_type"] != "code":
            continue
        cell["outputs"], cell["execution_count"] = [], None
        if grade_id in graded.report:
            text = "\n".join(graded.report[grade_id]) + "\n"
            cell["outputs"].append({"output_type": "stream", "name": "stdout", "text": text})
            if graded.scores[grade_id] < graded.max_scores[grade_id]:
                cell["outputs"].append({"output_type": "error", "ename": "CheckFailed",
                                        "evalue": "some checks failed (see above)", "traceback": []})
            continue
        record = graded.cell_records.get(index)
        if record:
            if record.get("output"):
                cell["outputs"].append({"output_type": "stream", "name": "stdout", "text": str(record["output"])})
            if record.get("error"):
                cell["outputs"].append({"output_type": "error", "ename": "Error", "evalue": str(record["error"])[:2000],
                                        "traceback": [str(record["error"])[:2000]]})
    return nb


def write(work: Path, released_path: Path, graded: Graded, logs: Path) -> None:
    released = json.loads(released_path.read_text())
    nb = autograded_notebook(released, graded)
    target = work / "autograded" / graded.student / graded.assignment
    target.mkdir(parents=True, exist_ok=True)
    (target / released_path.name).write_text(json.dumps(nb, indent=1))
    db = f"sqlite:///{work / 'gradebook.db'}"
    with Gradebook(db) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore", SAWarning)  # nbgrader's add_submission autoflushes noisily
        gb.update_or_create_student(graded.student)
        try:
            gb.find_submission(graded.assignment, graded.student)
        except MissingEntry:
            gb.add_submission(graded.assignment, graded.student)
        for cell in released["cells"]:
            meta = nbgrader_meta(cell)
            if not meta.get("grade"):
                continue
            grade = gb.find_grade(meta["grade_id"], graded.notebook, graded.assignment, graded.student)
            if meta["grade_id"] in graded.scores:
                grade.auto_score = graded.scores[meta["grade_id"]]
            else:  # a written answer: a person grades it, unless it was left blank
                answer = graded.answers.get(meta["grade_id"])
                blank = answer is None or compute_checksum(from_dict({**cell, "source": answer})) == meta.get("checksum")
                grade.auto_score = 0.0 if blank else None
            grade.needs_manual_grade = grade.manual_score is not None or grade.auto_score is None
        notebook = gb.find_submission_notebook(graded.notebook, graded.assignment, graded.student)
        notebook.flagged = bool(graded.flags)
        gb.db.commit()
    logs.mkdir(parents=True, exist_ok=True)
    lines = [f"{graded.student}/{graded.assignment}: {sum(graded.scores.values()):g}/{sum(graded.max_scores.values()):g} "
             f"auto-graded points in {graded.seconds:.1f} s"]
    lines += [f"flag: {f}" for f in graded.flags] + [f"note: {n}" for n in graded.notes]
    for test, report in graded.report.items():
        lines += [f"{test} ({graded.scores[test]:g}/{graded.max_scores[test]:g}):"] + [f"  {r}" for r in report]
    lines += ["--- sandbox output ---", graded.log]
    (logs / f"{graded.student}__{graded.assignment}.log").write_text("\n".join(lines))

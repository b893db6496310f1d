"""autograders/assemble.py's plan and reading of a submission: only answers come from it, measurements are
skipped and scaffolding kept, and an unreadable or linked notebook is a reason, not a crash."""

from __future__ import annotations

import json

import pytest

from autograders import assemble
from conftest import COURSE, SOLUTIONS, nbgrader_meta, notebooks, read


def _released() -> dict:
    return json.loads((COURSE / "lesson01_processes_threads" / "processes_threads.ipynb").read_text())


def test_plan_takes_only_answers_from_the_submission():
    released = _released()
    submission = json.loads(json.dumps(released))
    for cell in submission["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("grade_id") == "choose_tools":
            cell["source"] = "choices = {}"
        elif meta.get("grade_id") == "test_choose_tools":
            cell["source"] = "pass"
    plan = assemble.plan(released, submission)
    assert plan.answers["choose_tools"] == "choices = {}"
    assert not any("check(" in c["source"] for c in plan.cells), "test cells are never run"
    assert not any(c["source"].startswith("demo") for c in plan.cells)
    assert "locked cell test_choose_tools: changed (the released one was used)" in plan.flags


def test_plan_skips_measurements_and_keeps_scaffolding():
    released = _released()
    plan = assemble.plan(released, json.loads(json.dumps(released)))
    skipped = [c for c in released["cells"] if assemble.SKIP_TAG in c["metadata"].get("tags", [])]
    assert skipped and not any(c["source"] == "".join(s["source"]) for c in plan.cells for s in skipped)
    assert any("S = setup(seed=0)" in c["source"] for c in plan.cells)
    assert plan.flags == []


def test_no_cell_after_the_last_graded_one_runs_when_grading():
    """Grading runs every code cell up to the checks, each submission again: a measurement after the last
    answer and check (lesson 4's timings took 50-140 s there, eight lesson 4 submissions in the class) is
    work no check reads, so it carries the skip-when-grading tag."""
    untagged = []
    for path in notebooks(SOLUTIONS):
        cells = read(path).cells
        graded = [i for i, c in enumerate(cells) if nbgrader_meta(c).get("solution") or nbgrader_meta(c).get("grade")]
        untagged += [f"{path.parent.name} cell {i}" for i, c in enumerate(cells)
                     if graded and i > graded[-1] and c.cell_type == "code"
                     and assemble.SKIP_TAG not in c.metadata.get("tags", [])]
    assert not untagged, f"tag these {assemble.SKIP_TAG!r}: {untagged}"


@pytest.mark.parametrize("content, reason", [
    (b"{not json", "not valid JSON"),
    (b'{"x": "\xff"}', "not UTF-8"),
    (b'{"nbformat": 3, "cells": []}', "not an nbformat 4 notebook"),
])
def test_unreadable_submissions_are_reasons_not_crashes(tmp_path, content, reason):
    path = tmp_path / "nb.ipynb"
    path.write_bytes(content)
    nb, flags = assemble.read_submission(path)
    assert nb is None and reason in flags[0]
    plan = assemble.plan(_released(), nb, flags)
    assert not plan.readable and all(v is None for v in plan.answers.values())


def test_symlinks_are_not_followed(tmp_path):
    target = tmp_path / "real.ipynb"
    target.write_text(json.dumps(_released()))
    (tmp_path / "link.ipynb").symlink_to(target)
    nb, flags = assemble.read_submission(tmp_path / "link.ipynb")
    assert nb is None and "symlink" in flags[0]

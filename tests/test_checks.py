"""gpucourse.checks (the notebooks' check()), its sandbox runner, and autograders/assemble.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import assemble
from conftest import COURSE
from gpucourse import checks
from gpucourse.checks import ddp


def _parallel_map(fn, items, kind, workers=None):
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    if kind not in ("cpu", "io"):
        raise ValueError(kind)
    with {"cpu": ProcessPoolExecutor, "io": ThreadPoolExecutor}[kind](workers) as pool:
        return list(pool.map(fn, items))


def test_check_passes_and_prints(capsys):
    checks.check("parallel_map", {"parallel_map": _parallel_map})
    out = capsys.readouterr().out
    assert "✓ kind='cpu' runs in other processes" in out and "all 3 public checks passed" in out


def test_check_fails_with_every_reason():
    def threads_only(fn, items, kind, workers=None):
        return [fn(x) for x in items]

    with pytest.raises(AssertionError, match="1 of 3 public checks failed") as failure:
        checks.check("parallel_map", {"parallel_map": threads_only})
    assert "use processes for GIL-bound work" in str(failure.value)


def test_check_reports_a_missing_answer_and_unknown_exercises():
    with pytest.raises(AssertionError, match="raised KeyError"):
        checks.check("choose_tools", {})
    with pytest.raises(KeyError, match="known: "):
        checks.check("no_such_exercise", {})


def test_only_plain_data_crosses():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    with pytest.raises(TypeError):
        checks.as_data([AlwaysEqual()])
    assert checks.as_data({"a": [1, 2.5, "x", None]}) == {"a": [1, 2.5, "x", None]}


def test_script_exercise_is_not_launched_without_its_functions():
    result = ddp.run_exercise_script({}, "average_across_ranks", ["shard_indices", "average_across_ranks"])
    assert result["returncode"] == "not run" and "shard_indices" in result["tail"]


def test_script_exercise_is_not_launched_while_unanswered():
    placeholder = "def average_gradients(model):\n    \"\"\"doc\"\"\"\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
    ns = {"average_gradients": lambda model: None, "__exercise_sources__": {"average_gradients": placeholder}}
    result = ddp.run_exercise_script(ns, "average_gradients", ["average_gradients"])
    assert result == {"returncode": "not run", "ranks": {}, "tail": "not answered yet: average_gradients"}
    answered = placeholder.replace("raise NotImplementedError()", "if model is None:\n        raise NotImplementedError()")
    assert ddp.unanswered(answered, ["average_gradients"]) == []


def test_script_source_comes_from_the_notebook_cells_that_define_it():
    cell = "import torch\n\nclass Model:\n    pass\n\ndef make_trainer(n):\n    return n\n"
    ns = {"In": ["", "x = 1", cell.replace("return n", "return 0"), cell, "check('x')"], "Model": object,
          "make_trainer": print}
    source = ddp.exercise_source(ns, "synced", ["Model", "make_trainer"])
    assert source == ddp.HEADER + cell  # the latest cell defining both, once, with its imports


def _run_runner(job: dict) -> list[dict]:
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "gpucourse.checks.runner", str(write_end)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write_end,))
    os.close(write_end)
    proc.communicate(json.dumps(job).encode(), timeout=120)
    with os.fdopen(read_end) as pipe:
        return [json.loads(line) for line in pipe]


def test_runner_runs_cells_restores_modules_and_reports_json():
    observer = "def observe(ns):\n    import os\n    return {'pid_is_real': os.getpid() > 0, 'answer': ns['answer']()}\n"
    records = _run_runner({
        "cells": [{"source": "import os\nos.getpid = lambda: -1\ndef answer():\n    return 42", "grade_id": "x"},
                  {"source": "import sys\nprint('before exit')\nsys.exit(3)", "grade_id": None},
                  {"source": "print('still running')", "grade_id": None}],
        "observers": [{"case": "c1", "source": observer, "function": "observe"},
                      {"case": "c2", "source": "def boom(ns):\n    raise ValueError('no')", "function": "boom"}],
        "cell_seconds": 30, "observe_seconds": 30})
    cells = [r for r in records if r["type"] == "cell"]
    assert [c["error"] is None for c in cells] == [True, False, True]
    assert "before exit" in cells[1]["output"] and "SystemExit" in cells[1]["error"]
    assert cells[2]["output"] == "still running\n"
    observations = {r["case"]: r for r in records if r["type"] == "observation"}
    assert observations["c1"] == {"type": "observation", "case": "c1", "ok": True, "data": {"pid_is_real": True, "answer": 42}}
    assert observations["c2"]["ok"] is False and "ValueError: no" in observations["c2"]["error"]
    assert records[-1] == {"type": "done"}


def test_runner_times_out_a_stuck_cell():
    records = _run_runner({"cells": [{"source": "while True:\n    pass", "grade_id": None}, {"source": "x = 1", "grade_id": None}],
                           "observers": [], "cell_seconds": 1, "observe_seconds": 5})
    assert "CellTimeout" in records[0]["error"] and records[1]["error"] is None and records[-1]["type"] == "done"


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

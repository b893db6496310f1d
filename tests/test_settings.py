"""The grader's settings (autograders/settings.py) are all listed in nbgrader_config.py with their
defaults, and a value set in a configuration file reaches the run: the engine's cell budget and the
runner's output limit (through ``grade.engine_only``), and the supervisor's restarts, the launch and
collective timeouts in the sandbox's own modules (through the job, ``autograders.worker.runner``)."""

from __future__ import annotations

import ast
import re
from datetime import timedelta

import nbformat
import pytest
from traitlets.config.loader import PyFileConfigLoader

from conftest import AUTOGRADERS, COURSE, nbgrader_meta
from test_runner import _run_runner
from test_engine_steps import reference_answers

from autograders import settings
from autograders.course import load_config

from gpucourse import environment, launch
from autograders.worker import runner, supervisor
from gpucourse.checks import ddp

CONFIG = AUTOGRADERS / "nbgrader_config.py"
LISTED = re.compile(r"^# c\.(\w+)\.(\w+) = (.+?)  # (.+)$", re.M)


def test_every_setting_is_listed_with_its_default_and_documented():
    listed = {(cls, name): (value, why) for cls, name, value, why in LISTED.findall(CONFIG.read_text())}
    for cls in settings.CLASSES:
        for name, trait in cls.class_traits(config=True).items():
            assert trait.help.strip(), f"{cls.__name__}.{name} has no help"
            assert (cls.__name__, name) in listed, f"nbgrader_config.py does not list c.{cls.__name__}.{name}"
            value, why = listed[(cls.__name__, name)]
            default = trait.default_value if name != "smoke" else True  # smoke's default: GPUCOURSE_SMOKE, else true
            assert eval(compile(ast.parse(value, mode="eval"), "<listed>", "eval")) == pytest.approx(default), name
            assert why.strip(), name
    assert {cls for cls, _ in listed} == {c.__name__ for c in settings.CLASSES}


def test_the_listing_in_nbgrader_config_is_the_one_the_settings_write():
    """nbgrader_config.py's list of settings is generated (``make release``: ``settings.write_listing``)."""
    text = CONFIG.read_text()
    start, end = text.index(settings.LISTING_START), text.index(settings.LISTING_END) + len(settings.LISTING_END)
    assert text[start:end] == settings.listing(), "stale: run `make release` (settings.write_listing)"


def test_the_job_declares_each_sandbox_setting_once_and_refuses_what_it_does_not_know():
    """The traits' defaults are the job's (autograders/worker/job.py); the job the grader sends is checked
    as the sandbox reads it: unknown fields, wrong types and non-positive budgets are refused by name."""
    from autograders.worker.job import DEFAULTS, Job

    grading = settings.Grading()
    sent = grading.job_settings(600)
    assert set(sent) == set(DEFAULTS.settings())
    for trait, field in [("output_limit", "output_limit"), ("grace_seconds", "grace"), ("restarts", "restarts"),
                         ("setup_seconds", "setup_seconds"), ("max_ranks", "max_ranks"),
                         ("script_seconds", "script_seconds"), ("collective_seconds", "collective_seconds"),
                         ("launch_tries", "launch_tries"), ("message_bytes", "message_bytes"),
                         ("alarm_retry_seconds", "alarm_retry_seconds")]:
        assert getattr(grading, trait) == getattr(DEFAULTS, field) == sent[field], trait
    assert Job.parse({"cells": [], "restarts": 0}).restarts == 0
    for bad, words in [({"cells": [], "grace": "10"}, "grace must be a number"),
                       ({"cells": [], "max_ranks": 2.5}, "max_ranks must be an integer"),
                       ({"cells": [], "launch_tries": 0}, "launch_tries must be positive"),
                       ({"cells": [], "restarts": -1}, "restarts must be at least 0"),
                       ({"cells": [], "graze": 10}, "unknown fields ['graze']"),
                       ({"cells": "print(1)"}, "cells must be a list"),
                       ([], "expected an object with cells")]:
        with pytest.raises(ValueError, match=re.escape(words)):
            Job.parse(bad)


def test_the_defaults_are_the_sandbox_sides_constants():
    """A run without a job's settings (a student's own check) keeps the values the grader passes by default."""
    grading, limits = settings.Grading(), settings.SandboxLimits().limits()
    assert limits == settings.sandbox.Limits()
    assert grading.output_limit == runner.OUTPUT_LIMIT
    assert (grading.grace_seconds, grading.restarts, grading.setup_seconds, grading.max_ranks) == \
        (supervisor.GRACE, supervisor.RESTARTS, supervisor.SETUP_SECONDS, supervisor.MAX_RANKS)
    assert (grading.script_seconds, grading.launch_tries) == (ddp.DEFAULT_POLICY.script_seconds, ddp.DEFAULT_POLICY.tries)
    assert timedelta(seconds=grading.collective_seconds) == launch.COLLECTIVE_TIMEOUT
    assert grading.cell_budget(600) == 100 and grading.cell_budget(3000) == 300
    assert grading.observe_budget(600) == 240 and grading.observe_budget(100) == 50


def test_smoke_follows_the_graders_environment_unless_configured(monkeypatch):
    monkeypatch.delenv(environment.SMOKE, raising=False)
    assert settings.Grading().smoke is True
    monkeypatch.setenv(environment.SMOKE, "0")
    assert settings.Grading().smoke is False
    config = load_config()
    config.Grading.smoke = True
    assert settings.Grading(config=config).smoke is True


def _quiz_submission(folder, answers: dict[str, str]):
    path = COURSE / "quiz_gpu_data_parallel" / "quiz.ipynb"
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if nbgrader_meta(cell).get("grade_id") in answers:
            cell.source = answers[nbgrader_meta(cell)["grade_id"]]
    target = folder / "ada" / "quiz_gpu_data_parallel" / "quiz.ipynb"
    target.parent.mkdir(parents=True)
    nbformat.write(nb, target)
    return folder


@pytest.mark.slow  # grades a submission in the sandbox (10-18 s): `make test`, not `make test-fast`
def test_a_configuration_file_sets_the_cell_budget_and_the_output_limit(tmp_path):
    """c.Grading.cell_seconds = 3 stops a cell that sleeps; c.Grading.output_limit = 40 cuts a long print."""
    from autograders import grade

    (tmp_path / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"load_subconfig({str(CONFIG)!r})\n"
        "c.Grading.cell_seconds = 3\n"
        "c.Grading.output_limit = 40\n")
    config = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    answers = reference_answers()
    answers["q1"] = "print('x' * 1000)\n" + answers["q1"]
    answers["q2"] = "import time\ntime.sleep(120)\n" + answers["q2"]
    batch, graded = grade.engine_only(_quiz_submission(tmp_path / "submitted", answers), jobs=1, config=config)
    assert not batch.problems, batch.problems
    result = graded[("ada", "quiz_gpu_data_parallel")]
    cells = {nbgrader_meta(c).get("grade_id"): c for c in result.nb.cells}
    assert [o.text for o in cells["q1"].outputs if o.output_type == "stream"] == ["x" * 40]
    errors = [o.evalue for o in cells["q2"].outputs if o.output_type == "error"]
    assert errors and errors[0].startswith("CellTimeout: the cell ran longer than 3 s"), errors
    assert result.submission.scores["test_q1"] == 1.0 and result.submission.scores["test_q3"] == 1.0
    assert result.submission.scores["test_q2"] == 0.0  # its answer was never defined


@pytest.mark.slow  # grades a submission in the sandbox (10-18 s): `make test`, not `make test-fast`
def test_the_job_sets_the_sandbox_sides_settings():
    """What the grader passes in the job replaces the runner's and the supervisor's constants, reaches the
    script launches as the worker's launch policy and every process as the collectives' timeout; the
    course's module constants are left as they are."""
    observer = ("def observe(ns):\n    from gpucourse import launch\n    from gpucourse.checks import ddp\n"
                "    p = ddp.policy()\n"
                "    return [p.script_seconds, launch.collective_timeout().total_seconds(), p.tries,\n"
                "            launch.COLLECTIVE_TIMEOUT.total_seconds(), sorted(p.sources), p.launcher is not None]\n")
    records = _run_runner({"cells": [{"source": "print('y' * 500)", "grade_id": None}],
                           "observers": [{"case": "c", "source": observer, "function": "observe"}],
                           "cell_seconds": 30, "observe_seconds": 30, "output_limit": 25,
                           "script_seconds": 17, "collective_seconds": 5, "launch_tries": 1})
    assert records[0]["output"] == "y" * 25
    observation = next(r for r in records if r["type"] == "observation")
    assert observation["ok"] and observation["data"] == [17, 5, 1, 45, [], True], observation


@pytest.mark.slow  # grades a submission in the sandbox (10-18 s): `make test`, not `make test-fast`
def test_the_job_sets_how_often_a_stuck_cell_is_restarted_after():
    """restarts = 0: a cell that swallows its timeout is stopped from outside and nothing runs after it
    (by default a fresh worker runs the next cell: tests/test_adversarial.py, swallows_its_timeout), and a
    person is told why the run stopped there."""
    swallows = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass\n"
    records = _run_runner({"cells": [{"source": swallows, "grade_id": None}, {"source": "print('after')", "grade_id": None}],
                           "observers": [], "cell_seconds": 1, "observe_seconds": 5, "grace": 1, "restarts": 0})
    assert [r["type"] for r in records] == ["flag", "done"], records
    assert records[0]["reason"].startswith("the run stopped: cell 0 had to be stopped from outside, and the process that runs "
                                           "the cells was started again 0 times, the most a run allows"), records[0]
    assert "a person should look" in records[0]["reason"] and not records[0].get("forgery")

"""`make lab` serves students their own copy of the course, with nbgrader's Validate button only;
`make formgrader` serves instructors the repository with Formgrader on the released course."""

from __future__ import annotations

import json
import re
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import COURSE, ROOT, SOLUTIONS, notebooks
from labserver import serve

sys.path.insert(0, str(ROOT / "lab"))
import copy_course  # noqa: E402 - a script of lab/, like autograders' scripts

pytestmark = pytest.mark.slow  # starts `make lab` and `make formgrader` servers: `make test`, not `make test-fast`

STUDENT_OFF = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
               "@jupyter/nbgrader:course-list", "@jupyter/nbgrader:assignment-list", "@jupyter/nbgrader:menu"]
QUIZ = "quiz_gpu_data_parallel/quiz.ipynb"
MINE = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5, "mine": true}\n'


def _page_config(page: str) -> dict:
    found = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S)
    assert found, "no page config in JupyterLab's page"
    return json.loads(found.group(1))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A student's work folder that already holds one answered notebook."""
    folder = tmp_path_factory.mktemp("work")
    (folder / QUIZ).parent.mkdir(parents=True)
    (folder / QUIZ).write_text(MINE)
    return folder


@pytest.fixture(scope="module")
def student_lab(work):
    with serve("lab", WORK=work) as server:
        yield server


@pytest.fixture(scope="module")
def instructor_lab():
    with serve("formgrader") as server:
        yield server


def test_lab_copies_the_course_into_the_students_folder(student_lab, work):
    for notebook in notebooks(COURSE):
        rel = notebook.relative_to(COURSE).as_posix()
        assert (work / rel).exists(), f"{rel} was not copied"
        assert (rel in student_lab.output) == (rel != QUIZ), f"`make lab` must say what it copied:\n{student_lab.output}"
    assert (work / QUIZ).read_text() == MINE, "a student's own file was overwritten"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _redirect(url: str) -> str | None:
    try:
        urllib.request.build_opener(_NoRedirect).open(url, timeout=30)
    except urllib.error.HTTPError as redirect:
        return redirect.headers.get("Location", "")
    return None


def test_lab_opens_on_the_students_copy(student_lab, work):
    location = _redirect(student_lab.url("/"))
    assert location and location.split("?")[0].endswith("/lab"), f"/ redirects to {location!r}"
    status, listing = student_lab.get("/api/contents")
    assert status == 200
    names = {item["name"] for item in json.loads(listing)["content"]}
    assert {p.parent.name for p in notebooks(COURSE)} <= names
    assert not names & {"solutions", "autograders", "course", "tests"}, f"students see {sorted(names)}"
    config = _page_config(student_lab.get("/lab")[1])
    assert Path(config["serverRoot"]).expanduser().resolve() == work.resolve()


def test_student_lab_has_validate_but_no_formgrader(student_lab):
    config = _page_config(student_lab.get("/lab")[1])
    assert "@jupyter/nbgrader" in {e["name"] for e in config["federated_extensions"]}
    disabled = set(config["disabledExtensions"])
    assert set(STUDENT_OFF) <= disabled, f"still enabled for students: {set(STUDENT_OFF) - disabled}"
    assert "@jupyter/nbgrader:validate-assignment" not in disabled
    assert student_lab.get("/nbgrader_version?version=0")[0] == 200  # the Validate button's server side
    for path in ("/formgrader", "/formgrader/api/assignments", "/assignments", "/formgraders"):
        assert student_lab.get(path)[0] == 404, f"{path} is served to students"


def test_copy_course_adds_what_is_new_and_never_overwrites(tmp_path):
    course, work = tmp_path / "course", tmp_path / "work"
    (course / "lesson01").mkdir(parents=True)
    (course / "lesson01" / "a.ipynb").write_text("v1")
    assert copy_course.copy(course, work) == (["lesson01/a.ipynb"], [])
    (work / "lesson01" / "a.ipynb").write_text("the student's answers")
    (course / "lesson01" / "a.ipynb").write_text("v2")  # a fix arrives with `git pull`
    (course / "lesson02").mkdir()
    (course / "lesson02" / "b.ipynb").write_text("new lesson")
    (course / "lesson02" / ".ipynb_checkpoints").mkdir()
    (course / "lesson02" / ".ipynb_checkpoints" / "b-checkpoint.ipynb").write_text("skip me")
    assert copy_course.copy(course, work) == (["lesson02/b.ipynb"], ["lesson01/a.ipynb"])
    assert (work / "lesson01" / "a.ipynb").read_text() == "the student's answers"
    assert not (work / "lesson02" / ".ipynb_checkpoints").exists()
    shutil.rmtree(course / "lesson02")
    assert copy_course.copy(course, work) == ([], ["lesson01/a.ipynb"])  # nothing of the student's is removed
    assert (work / "lesson02" / "b.ipynb").exists()


def test_instructor_lab_serves_the_repository(instructor_lab):
    status, listing = instructor_lab.get("/api/contents")
    assert status == 200
    names = {item["name"] for item in json.loads(listing)["content"]}
    assert {"solutions", "course", "autograders"} <= names
    config = _page_config(instructor_lab.get("/lab")[1])
    assert not set(STUDENT_OFF) & set(config["disabledExtensions"])


def test_formgrader_lists_the_course_as_released(instructor_lab):
    status, page = instructor_lab.get("/formgrader/manage_assignments")
    assert status == 200, f"Formgrader answered {status}"
    assert 'id="warning-exchange"' not in page, "Formgrader shows the exchange warning"
    status, body = instructor_lab.get("/formgrader/api/assignments")
    assert status == 200, body[:500]
    listed = {a["name"]: a for a in json.loads(body)}
    for source in notebooks(SOLUTIONS):
        assignment = listed.get(source.parent.name)
        assert assignment, f"{source.parent.name} is not in Formgrader"
        assert assignment["status"] == "released", f"{source.parent.name}: {assignment['status']}"
        assert assignment["max_score"] > 0, f"{source.parent.name} is not registered in the gradebook"


def test_formgrader_preparation_is_idempotent(instructor_lab):
    from autograders import formgrader

    formgrader.register(), formgrader.publish()  # up to date, even if course/ changed since the server started
    assert formgrader.register() == [] and formgrader.publish() == [], "a second run redid the work"

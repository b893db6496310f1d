"""JupyterLab in a real browser (headless Chromium, tests/browser.py), as students and instructors use it.

A student opens the quiz in `make lab`, runs the setup cell, answers a question, runs its
`check("...")` cell and reads ✓, then presses Validate and reads the result. An instructor opens
Formgrader from `make formgrader RESULTS=<dir>` on a small graded class, sees the submissions and
opens one on the manual-grading page. Skips without Chromium, unless GPUCOURSE_REQUIRE_BROWSER=1 (CI).
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from autograders import classroom
from browser import chrome, chromium_paths, screenshot_on_failure
from conftest import ROOT
from labserver import serve

pytestmark = pytest.mark.slow  # drives JupyterLab in headless Chromium: `make test`, not `make test-fast`

QUIZ = "quiz_gpu_data_parallel"
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook in the current tab
NOTEBOOK = f"{PANEL} .jp-Notebook"
TIMEOUT = 180  # seconds for one step: a kernel start or a Validate run on a busy 2-core machine


@pytest.fixture(scope="module")
def browser():
    chromium_paths()  # skip (or, in CI, fail) before anything is started


@pytest.fixture(scope="module")
def grading(browser, tmp_path_factory):
    """Two quiz submissions, the reference answers and the unanswered release, graded by `make grade`
    in the background while the student's test runs."""
    submissions, results = tmp_path_factory.mktemp("submitted"), tmp_path_factory.mktemp("results")
    expected = classroom.build(submissions, only=QUIZ, limit=2)
    log = results.parent / f"{results.name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["make", "-s", "grade", f"SUBMISSIONS={submissions}", f"RESULTS={results}"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    yield proc, results, log, sorted(student for student, _ in expected)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


@pytest.fixture(scope="module")
def graded_class(grading):
    proc, results, log, students = grading
    proc.wait(timeout=900)
    assert proc.returncode == 0, f"make grade failed:\n{log.read_text()[-5000:]}"
    return results, students


@pytest.fixture(scope="module")
def student_lab(grading, tmp_path_factory):
    with serve("lab", WORK=tmp_path_factory.mktemp("work")) as server:
        yield server


@pytest.fixture(scope="module")
def class_formgrader(graded_class):
    results, _ = graded_class
    with serve("formgrader", RESULTS=results) as server:
        yield server


def _wait(driver, condition, timeout: float = TIMEOUT):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # a page that re-renders (Formgrader fills its tables by script) leaves stale elements: look again
    return WebDriverWait(driver, timeout, poll_frequency=0.25,
                         ignored_exceptions=(StaleElementReferenceException,)).until(condition)


def _cells(driver):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, f"{NOTEBOOK} .jp-WindowedPanel-viewport > .jp-Cell")


def _cell(driver, grade_id: str):
    """The notebook's cell whose nbgrader grade_id is ``grade_id`` (read from the saved notebook's order)."""
    import json

    cells = json.loads((ROOT / "course" / QUIZ / "quiz.ipynb").read_text())["cells"]
    index = next(i for i, c in enumerate(cells) if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    return _cells(driver)[index]


def _prompt(cell) -> str:
    from selenium.webdriver.common.by import By

    return cell.find_element(By.CSS_SELECTOR, ".jp-InputArea-prompt").text


def _output(cell) -> str:
    from selenium.webdriver.common.by import By

    return "\n".join(o.text for o in cell.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output"))


def _open_lab(driver, url: str) -> None:
    """Load JupyterLab; its corner notifications (the news question) are hidden, never in the way of a click."""
    from selenium.webdriver.common.by import By

    driver.get(url)
    _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel"))
    driver.execute_script("const s = document.createElement('style');"
                          "s.textContent = '.Toastify { display: none !important; }';"
                          "document.head.appendChild(s);")


def _click(driver, element) -> None:
    """A real click, on the element scrolled to the middle (clear of JupyterLab's corner notifications)."""
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def _run(driver, cell, typed: str | None = None) -> None:
    """Click into the cell's editor, optionally replace its text by typing, and press Shift+Enter."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _click(driver, cell.find_element(By.CSS_SELECTOR, ".cm-content"))
    keys = ActionChains(driver)
    if typed is not None:
        keys.key_down(Keys.CONTROL).send_keys("a").key_up(Keys.CONTROL).send_keys(typed)
    keys.key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()


def test_student_answers_checks_and_validates(student_lab):
    from selenium.webdriver.common.by import By

    with chrome() as driver, screenshot_on_failure(driver, "student_lab"):
        _open_lab(driver, student_lab.url(f"/lab/tree/{QUIZ}/quiz.ipynb"))
        _wait(driver, lambda d: len(_cells(d)) > 30)
        _wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, f"{PANEL} .jp-Notebook-ExecutionIndicator")
              .get_attribute("data-status") == "idle")
        assert not [m for m in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel") if m.text == "Nbgrader"]

        setup = _cell(driver, "preamble")
        _run(driver, setup)
        _wait(driver, lambda d: "[1]" in _prompt(setup))
        assert "gpucourse" in _output(setup) and "device: cpu" in _output(setup), _output(setup)

        answer, check = _cell(driver, "q1"), _cell(driver, "test_q1")
        _run(driver, answer, typed='q1 = "c"')
        _wait(driver, lambda d: "[2]" in _prompt(answer))
        _run(driver, check)
        _wait(driver, lambda d: "[3]" in _prompt(check))
        assert "✓" in _output(check) and "✗" not in _output(check), _output(check)

        _click(driver, driver.find_element(By.CSS_SELECTOR, f"{PANEL} .validate-button"))
        result = _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-Dialog #validation-message"))[0]
        text = result.text
        # q1 is answered; q2..q10 still raise NotImplementedError, and Validate names their checks
        assert "validation-failed" in result.get_attribute("class"), text[:2000]
        assert 'check("q2")' in text and 'check("q10")' in text, text[:2000]
        assert 'check("q1")' not in text, text[:2000]


def test_instructor_sees_submissions_and_grades_by_hand(class_formgrader, graded_class):
    from selenium.webdriver.common.by import By

    _, students = graded_class

    def link(driver, text: str):
        return [a for a in driver.find_elements(By.TAG_NAME, "a") if a.text.strip() == text and a.is_displayed()]

    def row(driver, name: str):
        return [r for r in driver.find_elements(By.CSS_SELECTOR, "tbody tr") if name in r.text.split()]

    with chrome() as driver, screenshot_on_failure(driver, "formgrader"):
        _open_lab(driver, class_formgrader.url("/lab"))
        _wait(driver, lambda d: [m for m in d.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel")
                                 if m.text == "Nbgrader"])[0].click()
        _wait(driver, lambda d: [m for m in d.find_elements(By.CSS_SELECTOR, ".lm-Menu-itemLabel")
                                 if m.text == "Formgrader"])[0].click()
        driver.switch_to.frame(_wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "iframe[src*='formgrader']"))[0])

        quiz = _wait(driver, lambda d: row(d, QUIZ))[0]
        assert "released" in quiz.text, quiz.text
        assert not driver.find_elements(By.ID, "warning-exchange")
        _click(driver, quiz.find_element(By.CSS_SELECTOR, "td.num-submissions a"))
        _wait(driver, lambda d: all(row(d, s) for s in students))

        _click(driver, _wait(driver, lambda d: link(d, "Manual Grading"))[0])
        _click(driver, _wait(driver, lambda d: link(d, QUIZ))[0])
        _click(driver, _wait(driver, lambda d: link(d, "quiz"))[0])
        _wait(driver, lambda d: len(link(d, "Submission #2")) == 1)
        _click(driver, link(driver, "Submission #1")[0])
        _wait(driver, lambda d: "/formgrader/submissions/" in d.execute_script("return location.pathname"))
        _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".nbgrader_cell input.score"))
        assert f"Submission 1 / {len(students)}" in driver.find_element(By.TAG_NAME, "body").text

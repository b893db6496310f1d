"""CONTRIBUTING.md's worked example, followed literally in a copy of the repository.

Every code block of the document whose first line names a path (```python path=...```) is written to
that path in a copy of the tracked files; the example's lesson is then released with the copy's own
`python -m autograders release`, and the copy's own tests hold its declaration, notebook, observers and fixtures
(each wrong fixture fails for the reason its first line names, each right one passes every case), as
they would in a repository where an author followed the document.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT

DOCUMENT = ROOT / "CONTRIBUTING.md"
BLOCK = re.compile(r"^```(\w+) path=(\S+)[^\n]*\n(.*?)^```$", re.M | re.S)


def blocks() -> dict[str, str]:
    """{path: content} of every path-annotated code block of CONTRIBUTING.md."""
    found = {}
    for match in BLOCK.finditer(DOCUMENT.read_text()):
        path = match.group(2)
        assert path not in found, f"CONTRIBUTING.md writes {path} twice"
        found[path] = match.group(3)
    return found


def example_assignment(files: dict[str, str]) -> str:
    notebooks = [p for p in files if p.startswith("solutions/") and p.endswith(".ipynb")]
    assert len(notebooks) == 1, f"the example writes one notebook, not {notebooks}"
    return Path(notebooks[0]).parts[1]


MAX_MODULE_LINES = 600  # CONTRIBUTING.md: past it, a module is split by what it holds


def test_no_python_file_of_the_project_is_over_the_line_limit():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert len(tracked) > 100, tracked  # the project's files, not an empty listing
    lines = {path: len((ROOT / path).read_text().splitlines()) for path in tracked}
    assert not {path: n for path, n in lines.items() if n > MAX_MODULE_LINES}, "split these by what they hold"


def test_every_file_the_example_names_is_written_out_whole():
    files = blocks()
    aid = example_assignment(files)
    slug = aid.split("_", 1)[1]
    wanted = [f"src/gpucourse/checks/{aid}.py", f"autograders/checks/{aid}.py", f"src/gpucourse/{slug}.py",
              f"tests/test_{slug}.py", f"solutions/{aid}/{slug}.ipynb"]
    assert all(p in files for p in wanted), f"missing blocks: {set(wanted) - set(files)}"
    fixtures = [Path(p) for p in files if p.startswith(f"tests/fixtures/{aid}/")]
    assert sum(p.parent.name == "wrong" for p in fixtures) >= 3 and sum(p.parent.name == "right" for p in fixtures) >= 2
    for path, content in files.items():
        if path.endswith(".py"):  # a whole module: it compiles, and no body is left as `...`
            tree = ast.parse(content, path)
            elided = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Expr) and getattr(n.value, "value", None) is Ellipsis]
            assert not elided, f"{path}: an excerpt (`...` on line {elided}), not the whole file"
        else:
            nbformat.validate(nbformat.reads(content, as_version=4))
        assert f"`{path}`" in DOCUMENT.read_text() or path.startswith("tests/"), f"{path}: the text never names it"


def test_the_example_collides_with_no_lesson():
    """Its number is one no real lesson takes (20 or more, and free), so following it overwrites nothing."""
    files = blocks()
    aid = example_assignment(files)
    number = int(re.match(r"lesson(\d+)_", aid).group(1))
    assert number >= 20, f"lesson {number}: lessons below 20 are real or being written"
    taken = {int(m.group(1)) for p in (ROOT / "solutions").iterdir() if (m := re.match(r"lesson(\d+)_", p.name))}
    taken |= {int(m.group(1)) for p in (ROOT / "src/gpucourse/checks").glob("lesson*.py") if (m := re.match(r"lesson(\d+)_", p.stem))}
    taken |= {int(m.group(1)) for p in (ROOT / "tests/fixtures").iterdir() if (m := re.match(r"lesson(\d+)_", p.name))}
    assert number not in taken, f"lesson {number} exists"
    existing = [p for p in files if (ROOT / p).exists()]
    assert not existing, f"following CONTRIBUTING.md would overwrite {existing}"


def test_every_lesson_is_named_after_itself():
    """CONTRIBUTING.md's one naming scheme holds for every lesson: the assignment ``lessonNN_<slug>`` names its
    folders and check modules, the slug its notebook, helper module and tests."""
    from autograders import engine

    lessons = sorted(p.name for p in (ROOT / "solutions").iterdir() if re.match(r"lesson\d\d_", p.name))
    assert len(lessons) >= 19
    for aid in lessons:
        slug = aid.split("_", 1)[1]
        wanted = [f"solutions/{aid}/{slug}.ipynb", f"src/gpucourse/{slug}.py", f"tests/test_{slug}.py",
                  f"src/gpucourse/checks/{aid}.py", engine.hidden_path(aid).relative_to(ROOT), f"tests/fixtures/{aid}"]
        missing = [w for w in wanted if not (ROOT / w).exists()]
        assert not missing, f"{aid}: CONTRIBUTING.md's names are missing: {missing}"
    checks = {p.stem for p in (ROOT / "src/gpucourse/checks").glob("lesson*.py")}
    assert checks == set(lessons), f"check modules named after no lesson: {checks ^ set(lessons)}"


def test_a_notebook_from_before_the_rename_still_imports_its_helper_and_is_told_the_new_name():
    import gpucourse

    with pytest.warns(FutureWarning, match=r"gpucourse.parallel is now gpucourse.processes_threads"):
        from gpucourse import parallel
    assert parallel.__name__ == "gpucourse.processes_threads"
    assert all((ROOT / "src/gpucourse" / f"{new}.py").exists() and not (ROOT / "src/gpucourse" / f"{old}.py").exists()
               for old, new in gpucourse.RENAMED.items())
    with pytest.raises(ImportError):
        from gpucourse import no_such_lesson  # noqa: F401


def _copy_tracked(to: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in listed.decode().split("\0"):
        source = ROOT / name
        if name and source.is_file() and not source.is_symlink():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)


def _run(args: list[str], repo: Path, timeout: int) -> subprocess.CompletedProcess:
    """Run in the copy, importing the copy's gpucourse (PYTHONPATH comes before the venv's editable install)."""
    env = {**os.environ, "PYTHONPATH": str(repo / "src"), "GPUCOURSE_OFFLINE": "1", "GPUCOURSE_SMOKE": "1"}
    return subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # releases, grades and tests a new lesson end to end (about 40 s): `make test`, not `make test-fast`
def test_the_example_followed_literally_releases_grades_and_passes(tmp_path):
    files = blocks()
    aid = example_assignment(files)
    repo = tmp_path / "repo"
    _copy_tracked(repo)
    for path, content in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(content)
    notebook = nbformat.read(repo / next(p for p in files if p.endswith(".ipynb")), as_version=4)
    nbformat.validate(notebook)

    where = _run(["-c", "import gpucourse; print(gpucourse.__file__)"], repo, 60)
    assert where.stdout.strip() == str(repo / "src/gpucourse/__init__.py"), where.stdout + where.stderr

    released = _run(["-m", "autograders", "release", "--only", aid], repo, 300)
    assert released.returncode == 0, released.stdout + released.stderr
    student = nbformat.read(next((repo / "course" / aid).glob("*.ipynb")), as_version=4)
    stub = next(c.source for c in student.cells if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    assert "NotImplementedError" in stub and "BEGIN SOLUTION" not in stub
    assert f"| `{aid}` |" in (repo / "README.md").read_text(), "README's table of exercises lists the example"

    fixtures = sorted(Path(p) for p in files if p.startswith(f"tests/fixtures/{aid}/"))
    tests = [p for p in files if p.startswith("tests/test_")]
    # the copy's own tests of the example: its fixtures, its declaration against the notebook and README, its
    # observers, its release (preamble, no solution or output in course/), its notebook run headless, ruff, its
    # helper (tests, imports); not the runner's tests, which hold PYTHONPATH unset inside the sandbox
    selected = " or ".join([aid, "drives_notebooks", "answers_are_named", "self_contained", "declares_its_answers",
                            "python_files_pass_ruff", "no_lesson_module_imports_the_checks", *(Path(t).stem for t in tests)])
    suites = ["tests/test_checks.py", "tests/test_release.py", "tests/test_lint.py", "tests/test_launch.py", "tests/test_notebooks.py",
              *tests]
    result = _run(["-m", "pytest", "-v", "-p", "no:cacheprovider", *suites, "-k", selected], repo, 600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    for fixture in fixtures:
        test_id = f"test_fixture_judged_in_process_as_its_first_line_says[{aid}/{fixture.parent.name}/{fixture.stem}] PASSED"
        assert test_id in result.stdout, f"{fixture} was not judged: {result.stdout[-3000:]}"
    for name in ("drives_notebooks_hidden_checks_and_readme", "answers_are_named_in_every_released_exercise_text_and_stub",
                 "every_observer_is_self_contained", f"opens_with_the_same_preamble[{aid}]", f"answer_in_course[{aid}]",
                 f"carry_no_outputs[course/{aid}/", "python_files_pass_ruff", "no_lesson_module_imports_the_checks",
                 f"test_solution_notebook_executes[{aid}]",
                 *(f"{Path(t).name}::" for t in tests)):
        assert re.search(rf"{re.escape(name)}\S* PASSED", result.stdout), f"{name} did not pass: {result.stdout[-3000:]}"


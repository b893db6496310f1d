"""course/ is exactly what `make release` makes from solutions/, and nothing hidden leaks into it."""

from __future__ import annotations

import re
import tomllib

import pytest

from conftest import COURSE, ROOT, SOLUTIONS, nbgrader_meta, notebooks, read

SOURCES = notebooks(SOLUTIONS)
REGIONS = re.compile(r"### BEGIN (SOLUTION|HIDDEN TESTS)(.*?)### END \1", re.S)
MARKERS = ["BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "BEGIN MARK SCHEME"]


def test_there_is_something_to_release():
    assert SOURCES, "no notebooks in solutions/"
    assert notebooks(COURSE) == [COURSE / p.relative_to(SOLUTIONS) for p in SOURCES]


def test_course_equals_a_fresh_release(tmp_path):
    from release import release

    release(SOLUTIONS, tmp_path / "course")
    fresh = sorted(p.relative_to(tmp_path / "course") for p in (tmp_path / "course").rglob("*") if p.is_file())
    committed = sorted(p.relative_to(COURSE) for p in COURSE.rglob("*") if p.is_file())
    assert committed == fresh, "course/ has other files than a release: run `make release`"
    for rel in fresh:
        assert (COURSE / rel).read_bytes() == (tmp_path / "course" / rel).read_bytes(), \
            f"course/{rel} differs from a fresh release: run `make release`"


def _lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if len(line.strip()) >= 6}


def _hidden_lines(source_nb) -> set[str]:
    """Distinctive lines of solutions, hidden tests and model answers that the source never shows openly."""
    hidden, open_lines = set(), set()
    for cell in source_nb.cells:
        if cell.cell_type == "markdown" and nbgrader_meta(cell).get("solution"):
            hidden |= _lines(cell.source)
            continue
        for match in REGIONS.finditer(cell.source):
            hidden |= _lines(match.group(2))
        open_lines |= _lines(REGIONS.sub("", cell.source))
    return hidden - open_lines


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.parent.name)
def test_no_solution_hidden_test_or_answer_in_course(source):
    released = (COURSE / source.relative_to(SOLUTIONS)).read_text()
    released_nb = read(COURSE / source.relative_to(SOLUTIONS))
    for marker in MARKERS:
        assert marker not in released, f"{marker!r} left in the released notebook"
    visible = _lines("\n".join(c.source for c in released_nb.cells))
    leaked = sorted(_hidden_lines(read(source)) & visible)
    assert not leaked, f"hidden lines appear in course/: {leaked[:5]}"
    assert _hidden_lines(read(source)), "the leak check found nothing to look for"


@pytest.mark.parametrize("path", SOURCES + notebooks(COURSE), ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_notebooks_carry_no_outputs(path):
    nb = read(path)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"cells {dirty} carry outputs: clear them before committing"


def _repo_slug() -> str:
    url = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    return url.removeprefix("https://github.com/")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.parent.name)
def test_every_notebook_opens_with_the_same_preamble(source):
    nb = read(source)
    first, preamble = nb.cells[0], nb.cells[1]
    rel = source.relative_to(SOLUTIONS)
    badge = f"https://colab.research.google.com/github/{_repo_slug()}/blob/main/course/{rel.as_posix()}"
    assert badge in first.source, "the Colab badge must open this notebook's released copy"
    assert "**Hardware:**" in first.source, "each notebook declares the hardware it needs"
    reference = read(SOURCES[0]).cells[1].source
    assert preamble.source == reference, "the preamble cell differs from the other notebooks'"
    assert f"git+https://github.com/{_repo_slug()}" in preamble.source
    assert "S = setup(seed=0)" in preamble.source
    assert nbgrader_meta(preamble).get("locked"), "the preamble is a locked cell"


def test_hidden_checks_stay_out_of_course():
    """Hidden checks live in autograders/checks/, and nothing of them reaches the released notebooks."""
    released = "\n".join(p.read_text() for p in notebooks(COURSE))
    names = []
    for check_file in (ROOT / "autograders" / "checks").glob("*.py"):
        names += re.findall(r"^def (\w+)", check_file.read_text(), re.M)
    assert names, "no hidden checks found"
    assert not [n for n in names if re.search(rf"\b{re.escape(n)}\b", released)]
    assert "autograders" not in released

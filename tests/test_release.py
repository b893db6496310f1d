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
    from autograders.release import release

    release(SOLUTIONS, tmp_path / "course")
    fresh = sorted(p.relative_to(tmp_path / "course") for p in (tmp_path / "course").rglob("*") if p.is_file())
    committed = sorted(p.relative_to(COURSE) for p in COURSE.rglob("*") if p.is_file())
    assert committed == fresh, "course/ has other files than a release: run `make release`"
    for rel in fresh:
        assert (COURSE / rel).read_bytes() == (tmp_path / "course" / rel).read_bytes(), \
            f"course/{rel} differs from a fresh release: run `make release`"


def test_self_check_key_equals_a_fresh_build():
    """src/gpucourse/checks/self_check.json is what `make release` derives from solutions/ (keeping its salts)."""
    from autograders.self_check_key import KEY, build_key, render, salts_of

    assert KEY.is_file(), "no self-check key: run `make release`"
    assert KEY.read_text() == render(build_key(SOLUTIONS, salts_of(KEY))), \
        f"{KEY.relative_to(ROOT)} is stale (answers, answer exercises or their checks changed): run `make release`"


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


def _edition():
    from autograders.course import load_edition

    return load_edition()


def test_edition_ref_is_the_package_version():
    """Notebooks install the tag of the package they were released with: v + gpucourse.__version__."""
    import gpucourse

    edition = _edition()
    assert edition.ref == f"v{gpucourse.__version__}"
    assert edition.version == gpucourse.__version__
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["urls"]["Repository"] == edition.url, "pyproject's Repository must be the student edition"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.parent.name)
def test_every_notebook_opens_with_the_same_preamble(source):
    nb = read(source)
    first, preamble = nb.cells[0], nb.cells[1]
    rel = source.relative_to(SOLUTIONS).as_posix()
    edition = _edition()
    badge = f"https://colab.research.google.com/github/{edition.home}/blob/{edition.ref}/course/{rel}"
    assert f"]({badge})" in first.source.splitlines()[0], "the Colab badge must open this notebook's released copy"
    assert "**Hardware:**" in first.source, "each notebook declares the hardware it needs"
    assert re.search(r"\*\*Time to run:\*\* (under a minute|up to about \d+ min) on a 2-core CPU .*measured \d{4}-\d\d-\d\d",
                     first.source), "each notebook states how long it takes to run, and when that was measured"
    reference = read(SOURCES[0]).cells[1].source
    assert preamble.source == reference, "the preamble cell differs from the other notebooks'"
    assert f'"git+https://github.com/{edition.home}@{edition.ref}"' in preamble.source
    assert "--no-deps" in preamble.source and "GPUCOURSE_INSTALL_URL" in preamble.source
    assert "S = setup(seed=0)" in preamble.source
    assert nbgrader_meta(preamble).get("locked"), "the preamble is a locked cell"


SIZE_DEPENDENT = re.compile(r"\bS\.size\(|\bS\.smoke\b|smoke_mode\(|GPUCOURSE_SMOKE")
FULL_SIZE = re.compile(r"at full size (under a minute|about (\d+) min) \((\d+) s of cells, `make full-run`, measured (\d{4}-\d\d-\d\d) "
                       r"with nothing else running: `(bench/full-runs/[\w.-]+\.json)`")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.parent.name)
def test_each_notebooks_full_size_time_is_read_from_a_recorded_run(source):
    """The time a lesson states for its full size is its entry in a committed `make full-run` record (wall time
    of its cells, on the 2-core machine with nothing else running), rounded as the text says; a run that failed
    states no time. A notebook none of whose cells reads the smoke setting has one size, and says so."""
    import json
    import math

    nb = read(source)
    found = FULL_SIZE.search(nb.cells[0].source)
    if found is None and not any(SIZE_DEPENDENT.search(c.source) for c in nb.cells[2:] if c.cell_type == "code"):
        # no cell after the preamble reads the smoke setting (CONTRIBUTING's worked example): one size only
        assert "the full size is the same" in nb.cells[0].source, "a notebook of one size says so"
        return
    assert found, "each notebook states its full-size time from a recorded `make full-run`"
    span, seconds, date, record = found[1], int(found[3]), found[4], found[5]
    runs = json.loads((ROOT / record).read_text())
    run = runs["lessons"][source.parent.name]
    assert run["error"] is None and runs["machine"]["cpus"] == 2
    assert seconds == round(run["wall_s"])
    assert span == ("under a minute" if run["wall_s"] < 60 else f"about {math.ceil(run['wall_s'] / 60)} min")
    assert date == run["finished_utc"][:10]


def test_only_lesson_9_installs_darts():
    for source in SOURCES:
        installs = [c for c in read(source).cells if c.cell_type == "code" and 'install_missing("darts")' in c.source]
        if source.parent.name == "lesson09_darts_forecasting":
            assert len(installs) == 1 and nbgrader_meta(installs[0]).get("locked")
            assert read(source).cells.index(installs[0]) == 2, "Darts is installed right after the setup cell"
        else:
            assert not installs, "only lesson 9 needs Darts"


def test_a_fork_retargets_every_badge_and_setup_cell(tmp_path):
    """Change edition.toml's home, release: every notebook in solutions/ and course/ follows."""
    import shutil

    from autograders.course import load_edition
    from autograders.release import release

    config = tmp_path / "edition.toml"
    config.write_text('[student-edition]\nhome = "someone-else/their-course"\nref = "v{version}"\n')
    fork = load_edition(config)
    solutions = tmp_path / "solutions"
    shutil.copytree(SOLUTIONS, solutions, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    before = {p: read(p) for p in notebooks(solutions)}
    release(solutions, tmp_path / "course", edition=fork, stamp_sources=True)
    old = _edition().home
    for folder in (solutions, tmp_path / "course"):
        for path in notebooks(folder):
            nb, rel = read(path), path.relative_to(folder).as_posix()
            assert nb.cells[0].source.startswith(
                f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({fork.badge_url(rel)})")
            assert f'"{fork.install_url}"' in nb.cells[1].source
            assert old not in path.read_text(), f"{path} still points at {old}"
    for path, original in before.items():
        assert read(path).cells[2:] == original.cells[2:], "stamping changes the badge and setup cell only"
    from autograders.release import stamp_pyproject

    pyproject = tmp_path / "pyproject.toml"
    shutil.copy(ROOT / "pyproject.toml", pyproject)
    assert stamp_pyproject(pyproject, fork)
    assert tomllib.loads(pyproject.read_text())["project"]["urls"]["Repository"] == fork.url


def test_hidden_checks_stay_out_of_course():
    """Hidden checks live in autograders/checks/, and nothing of them reaches the released notebooks."""
    released = "\n".join(p.read_text() for p in notebooks(COURSE))
    names = []
    for check_file in (ROOT / "autograders" / "checks").rglob("*.py"):
        names += re.findall(r"^def (\w+)", check_file.read_text(), re.M)
    assert names, "no hidden checks found"
    assert not [n for n in names if re.search(rf"\b{re.escape(n)}\b", released)]
    assert "autograders" not in released

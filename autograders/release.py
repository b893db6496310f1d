"""`make release`: regenerate course/ from solutions/ with nbgrader's generate_assignment.

Before nbgrader runs, every notebook's Colab badge and setup cell are stamped from edition.toml
(the public student edition's home and ref), and every test cell's points from its exercise's
declaration (gpucourse.checks.register), in solutions/ and so in course/. README.md's table of
exercises is rewritten from the same declarations, and the self-check key of the answer exercises
(src/gpucourse/checks/self_check.json: salted hashes, no answer in plain text) from the solutions'
answer cells (self_check_key.py).
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import nbformat

import gpucourse.checks as declarations

from . import settings
from .course import COURSE, EDITION, ROOT, SOLUTIONS, Edition, assignments, generated, load_config, load_edition, stamp
from .self_check_key import KEY, write_key

TABLE_START, TABLE_END = "<!-- exercises: written by make release -->", "<!-- end of exercises -->"


def stamp_notebooks(solutions: Path, edition: Edition, ids: list[str]) -> list[Path]:
    """Stamp the badge and setup cell of ``ids``' notebooks in ``solutions`` in place; returns those changed."""
    changed = []
    for aid in ids:
        for path in sorted((solutions / aid).glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)  # read, stamp, write: nothing held in between
            if stamp(nb, path.relative_to(solutions).as_posix(), edition) | stamp_points(nb, aid):
                nbformat.write(nb, path)
                changed.append(path)
    return changed


def stamp_points(nb, assignment: str) -> bool:
    """Give every test cell of ``nb`` the points its exercise declares; True if one changed."""
    points = {e.test_id: e.points for e in declarations.exercises(assignment)}
    changed = False
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution") and meta.get("grade_id") in points:
            if meta.get("points") != points[meta["grade_id"]]:
                meta["points"] = points[meta["grade_id"]]
                changed = True
    return changed


def stamp_readme(readme: Path) -> bool:
    """Rewrite README.md's table of exercises from the declarations; True if it changed."""
    text = readme.read_text()
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme}: expected the lines {TABLE_START} and {TABLE_END} around the table of exercises")
    new = text[:start + len(TABLE_START)] + "\n" + declarations.exercise_table() + "\n" + text[end:]
    if new != text:
        readme.write_text(new)
    return new != text


def stamp_pyproject(pyproject: Path, edition: Edition) -> bool:
    """Point pyproject.toml's ``Repository`` URL at ``edition``; True if it changed."""
    text = pyproject.read_text()
    new, count = re.subn(r'^Repository = ".*"$', f'Repository = "{edition.url}"', text, flags=re.M)
    if count != 1:
        raise SystemExit(f"{pyproject}: expected one Repository = \"...\" line under [project.urls]")
    if new != text:
        pyproject.write_text(new)
    return new != text


def release(solutions: Path = SOLUTIONS, course: Path = COURSE, only: str | None = None,
            edition: Edition | None = None, stamp_sources: bool = False) -> list[str]:
    """Write ``course/<assignment>/`` for every assignment in ``solutions``; returns their ids.

    The result replaces ``course`` only when every assignment succeeded (see ``course.generated``). ``only``
    regenerates one assignment and leaves the others' releases as they are. The release is
    always stamped from ``edition`` (edition.toml by default); ``stamp_sources`` stamps the
    notebooks in ``solutions`` too (`make release` does, so both folders carry it).
    """
    edition = edition or load_edition()
    ids = assignments(solutions)
    if not ids:
        raise SystemExit(f"no assignments (folders with notebooks) in {solutions}")
    if only is not None:
        if only not in ids:
            raise SystemExit(f"no assignment {only!r} in {solutions}; there are: {', '.join(ids)}")
        ids = [only]
    if stamp_sources:
        stamp_notebooks(solutions, edition, ids)
    with generated(solutions, ids, prepare=lambda source: stamp_notebooks(source, edition, ids)) as released:
        course.mkdir(parents=True, exist_ok=True)
        for old in course.iterdir():
            if old.is_dir() and (only is None or old.name == only):
                shutil.rmtree(old)
        for aid in ids:
            shutil.copytree(released / aid, course / aid)
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS)
    parser.add_argument("--course", type=Path, default=COURSE)
    parser.add_argument("--only", help="regenerate this assignment only")
    parser.add_argument("--edition", type=Path, default=EDITION, help="the student edition's config (edition.toml)")
    args = parser.parse_args(argv)
    edition = load_edition(args.edition)
    ids = release(args.solutions, args.course, args.only, edition=edition, stamp_sources=True)
    stamp_pyproject(ROOT / "pyproject.toml", edition)
    stamp_readme(ROOT / "README.md")
    settings.write_listing()  # nbgrader_config.py's list of every grading setting, from the settings themselves
    key = settings.SelfCheckKey(config=load_config())  # nbgrader_config.py's c.SelfCheckKey, as grading reads its own
    write_key(args.solutions, KEY, only=args.only, max_answers=key.max_answers)  # --only: that assignment's entries, the others kept
    where = args.course.relative_to(ROOT) if args.course.is_relative_to(ROOT) else args.course
    print(f"released {len(ids)} assignment(s) into {where}: {', '.join(ids)}")
    print(f"badges, setup cells and pyproject's URL point at {edition.url} @ {edition.ref}")
    print(f"self-check key of the answer exercises: {KEY.relative_to(ROOT)}")
    return 0

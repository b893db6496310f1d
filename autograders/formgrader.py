"""`make formgrader`: get the course ready for Formgrader, idempotently, before JupyterLab opens.

For the course (the repository): every assignment in ``solutions/`` is registered in
``autograders/gradebook.db`` (its notebooks, cells and points, as ``nbgrader generate_assignment``
records them; generated in a temporary root, so ``course/`` is never written) with the due dates of
the course config (``c.DueDates.duedates``), and every release in
``course/`` is published to the course's exchange, ``exchange/`` (gitignored; the course's
nbgrader_config.py points ``Exchange.root`` there). Formgrader then lists each assignment as
*released*, with its points, and shows no exchange warning. Nothing is redone when nothing changed.

For a graded class (``--results RESULTS``): ``RESULTS/nbgrader`` is already a complete course folder
with its gradebook (`make grade` wrote it); only the exchange is made ready.
"""

from __future__ import annotations

import argparse
import filecmp
from pathlib import Path

from .course import COURSE, ROOT, SOLUTIONS, api, assignments, generated, load_config
from .grade import due_dates, set_due_dates

GRADEBOOK = ROOT / "autograders" / "gradebook.db"


def _registered(db: Path) -> set[str]:
    if not db.exists():
        return set()
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db}") as gradebook:
        return {a.name for a in gradebook.assignments if a.notebooks}


def register(solutions: Path = SOLUTIONS, db: Path = GRADEBOOK) -> list[str]:
    """Put every assignment whose sources changed since the gradebook was written into the gradebook."""
    ids = assignments(solutions)
    known = _registered(db)
    written = db.stat().st_mtime if db.exists() else 0.0
    stale = [aid for aid in ids if aid not in known
             or any(p.stat().st_mtime > written for p in (solutions / aid).rglob("*") if p.is_file())]
    if stale:
        with generated(solutions, stale, db=db):
            pass  # the gradebook is what this is for; the release is thrown away
    # the course config's due dates (c.DueDates.duedates), as `make grade` writes them: Formgrader shows them
    set_due_dates(f"sqlite:///{db}", due_dates(load_config(), ids))
    if stale:
        db.touch()
    return stale


def _same_tree(a: Path, b: Path) -> bool:
    if not b.is_dir():
        return False
    compared = filecmp.dircmp(a, b, ignore=[".ipynb_checkpoints", "__pycache__"])

    def same(c: filecmp.dircmp) -> bool:
        if c.left_only or c.right_only or c.funny_files:
            return False
        _, mismatch, errors = filecmp.cmpfiles(c.left, c.right, c.common_files, shallow=False)
        return not mismatch and not errors and all(same(sub) for sub in c.subdirs.values())

    return same(compared)


def publish(course: Path = COURSE) -> list[str]:
    """Release every assignment of ``course/`` to the exchange where its copy there differs."""
    config = load_config()
    config.ExchangeReleaseAssignment.force = True
    nbgrader = api(config)
    outbound = Path(config.Exchange.root) / config.CourseDirectory.course_id / "outbound"
    changed = [aid for aid in assignments(course) if not _same_tree(course / aid, outbound / aid)]
    for aid in changed:
        result = nbgrader.release_assignment(aid)
        if not result["success"]:
            raise SystemExit(f"cannot release {aid} to {outbound}:\n{result['error']}\n{result['log']}")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, help="a folder `make grade` wrote: open its class instead")
    args = parser.parse_args(argv)
    if args.results is not None:
        folder = args.results / "nbgrader"
        if not (folder / "gradebook.db").exists() or not (folder / "nbgrader_config.py").exists():
            raise SystemExit(f"{folder} is not a graded class: run `make grade SUBMISSIONS=<dir> RESULTS={args.results}` first")
    registered = register() if args.results is None else []
    if registered:
        print(f"registered in {GRADEBOOK.relative_to(ROOT)}: {', '.join(registered)}")
    released = publish()
    if released:
        print(f"released to the exchange: {', '.join(released)}")
    print("Formgrader: open the Nbgrader menu → Formgrader, or /formgrader in this server")
    return 0

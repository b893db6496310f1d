"""`make release`: regenerate course/ from solutions/ with nbgrader's generate_assignment."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from course import COURSE, ROOT, SOLUTIONS, api, assignments, load_config


def release(solutions: Path = SOLUTIONS, course: Path = COURSE, only: str | None = None) -> list[str]:
    """Write ``course/<assignment>/`` for every assignment in ``solutions``; returns their ids.

    nbgrader needs one course root holding both folders, so the work happens in a temporary
    root and the result replaces ``course`` only when every assignment succeeded. ``only``
    regenerates one assignment and leaves the others' releases as they are.
    """
    ids = assignments(solutions)
    if not ids:
        raise SystemExit(f"no assignments (folders with notebooks) in {solutions}")
    if only is not None:
        if only not in ids:
            raise SystemExit(f"no assignment {only!r} in {solutions}; there are: {', '.join(ids)}")
        ids = [only]
    with tempfile.TemporaryDirectory(prefix="gpucourse-release-") as tmp:
        work = Path(tmp)
        shutil.copytree(solutions, work / "source", ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        nbgrader = api(load_config(root=work, db=work / "gradebook.db", source="source", release="release"))
        for aid in ids:
            result = nbgrader.generate_assignment(aid, force=True, create=True)
            if not result["success"]:
                raise SystemExit(f"generate_assignment failed for {aid}:\n{result['error']}\n{result['log']}")
        course.mkdir(parents=True, exist_ok=True)
        for old in course.iterdir():
            if old.is_dir() and (only is None or old.name == only):
                shutil.rmtree(old)
        for aid in ids:
            shutil.copytree(work / "release" / aid, course / aid)
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS)
    parser.add_argument("--course", type=Path, default=COURSE)
    parser.add_argument("--only", help="regenerate this assignment only")
    args = parser.parse_args(argv)
    ids = release(args.solutions, args.course, args.only)
    print(f"released {len(ids)} assignment(s) into {args.course.relative_to(ROOT) if args.course.is_relative_to(ROOT) else args.course}: {', '.join(ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`make lab`: copy the course into the student's own work folder, never over the student's files.

Students work in ``work/`` (gitignored), never in ``course/``: ``git pull`` updates ``course/`` and
cannot collide with a notebook the student has open. Each run copies what the work folder lacks: the
whole course the first time, a lesson added to ``course/`` later, a file added to a lesson. A file the
student already has is never overwritten; when ``course/`` holds a newer version of it than the one
copied, the run says so, and the student can compare the two (or rename theirs to get a fresh copy).
``work/.course-copy.json`` remembers what each copied file was, to tell the two cases apart.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

SKIPPED = {".ipynb_checkpoints", "__pycache__"}
MANIFEST = ".course-copy.json"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(course: Path) -> list[Path]:
    return sorted(p.relative_to(course) for p in course.rglob("*")
                  if p.is_file() and not SKIPPED & set(p.relative_to(course).parts))


def copy(course: Path, work: Path) -> tuple[list[str], list[str]]:
    """Copy into ``work`` what it lacks; returns (copied, updated in course since copied) as paths."""
    work.mkdir(parents=True, exist_ok=True)
    manifest_path = work / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    copied, updated = [], []
    for rel in _files(course):
        source, target, key = course / rel, work / rel, rel.as_posix()
        if target.exists() or target.is_symlink():
            if key in manifest and manifest[key] != _digest(source):
                updated.append(key)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        manifest[key] = _digest(source)
        copied.append(key)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return copied, updated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("course", type=Path, help="the released course (course/)")
    parser.add_argument("work", type=Path, help="the student's work folder (work/)")
    args = parser.parse_args(argv)
    copied, updated = copy(args.course, args.work)
    if copied:
        print(f"copied into {args.work}/ (your copy: edit it there):")
        print("".join(f"  {path}\n" for path in copied), end="")
    else:
        print(f"{args.work}/ already has every file of {args.course}/; nothing copied")
    if updated:
        print(f"updated in {args.course}/ since you copied them (your copies are kept; compare, or rename "
              f"yours and run `make lab` again for a fresh copy):")
        print("".join(f"  {path}\n" for path in updated), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared paths and helpers for the test suite (run by `make test`, on CPU)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
COURSE = ROOT / "course"
AUTOGRADERS = ROOT / "autograders"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

os.environ.setdefault("GPUCOURSE_OFFLINE", "1")  # never download a dataset in tests; kernels inherit this
sys.path.insert(0, str(AUTOGRADERS))  # release.py, grade.py and course.py are scripts, not a package


def notebooks(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def read(path: Path):
    return nbformat.read(path, as_version=4)


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})

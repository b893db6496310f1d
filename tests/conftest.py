"""Shared paths and helpers for the test suite (run by `make test`, on CPU)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
COURSE = ROOT / "course"
AUTOGRADERS = ROOT / "autograders"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# tests/test_notebooks.py saves each executed solution notebook here; tests/test_site.py builds the
# rendered course from them (book/make_book.py reads the same folder).
EXECUTED = ROOT / "build" / "executed"
SESSION_START = time.time()  # executed notebooks older than this were not made by this pytest run

os.environ.setdefault("GPUCOURSE_OFFLINE", "1")  # never download a dataset in tests; kernels inherit this
sys.path.insert(0, str(AUTOGRADERS))  # release.py, grade.py and course.py are scripts, not a package


def needs_cuda(reason: str):
    """Skip a test without CUDA, unless ``GPUCOURSE_REQUIRE=cuda`` (``make test-gpu``) makes that a failure."""
    import pytest
    import torch

    from gpucourse.preamble import required_kinds

    return pytest.mark.skipif(not torch.cuda.is_available() and "cuda" not in required_kinds(), reason=reason)


def notebooks(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def read(path: Path):
    return nbformat.read(path, as_version=4)


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def save_executed(source: Path, nb) -> Path:
    """Write an executed notebook to ``EXECUTED/<assignment>/<name>.ipynb`` (atomically: runs may overlap)."""
    target = EXECUTED / source.relative_to(SOLUTIONS)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    nbformat.write(nb, partial)
    os.replace(partial, target)
    return target

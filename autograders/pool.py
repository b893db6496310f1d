"""The local pool: every submission of a class through the engine's steps, each in its own sandbox,
N at a time on this machine, longest first. ``grade.py`` grades with it, and so does each task of a
Slurm job array (``slurm_grade.py``) on its node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import nbformat

from . import engine, sandbox
from .context import SandboxOptions
from .settings import Grading


def longest_first(work: Path, pairs: list[tuple[str, str]], released) -> list[tuple[str, str]]:
    """``pairs`` with those that launch the most multi-process scripts first (engine.cost), the
    order otherwise kept."""
    templates: dict[str, nbformat.NotebookNode] = {}

    def cost(pair: tuple[str, str]) -> int:
        student, aid = pair
        try:
            if aid not in templates:
                templates[aid] = nbformat.reads(released(aid).read_text(), as_version=4)
            return engine.cost(templates[aid], work / "submitted" / student / aid / released(aid).name, aid)
        except Exception:  # the engine's steps say what is wrong with it
            return 0

    return sorted(pairs, key=cost, reverse=True)


def sandboxed(work: Path, pairs: list[tuple[str, str]], released, hide: list[Path], jobs: int,
              limits: sandbox.Limits, preload: bool = True, preloads: engine.Preloads | None = None,
              grading: Grading | None = None):
    """Every pair through the engine's steps, each in its own sandbox, ``jobs`` at a time, longest
    first: yields (student, assignment, Graded or the grader's exception) as each one ends.
    ``released(assignment)`` is the released notebook's path; ``grading`` the settings (defaults
    without one).

    ``preload``: fork each sandbox from a preloaded Python per worker (engine.Preloads; ``preloads``
    when the caller started them ahead) instead of starting Python and importing torch for every submission."""
    grading = grading or Grading()
    isolate = sandbox.namespaces_available()
    if grading.require_isolation and not isolate:
        raise SystemExit(f"c.Grading.require_isolation is set, and {sandbox.probe().describe()}")
    # one user per sandbox running at a time (sandbox.Limits.user, used under namespaces): a fork bomb
    # exhausts its own processes only
    free = queue.SimpleQueue()
    for user in sandbox.users(jobs):
        free.put(user)

    def one(student: str, aid: str, preloads) -> engine.Graded:
        user = free.get()
        try:
            options = SandboxOptions(work, hide, dataclasses.replace(limits, user=user), isolate, preloads)
            return engine.grade_submission(work, student, aid, released(aid), options, grading)
        finally:
            free.put(user)

    own = engine.Preloads(grading) if preload and preloads is None else contextlib.nullcontext(preloads if preload else None)
    with own as preloads, ThreadPoolExecutor(max_workers=jobs) as pool:  # every worker done before the preloaded Pythons stop
        futures = {pool.submit(one, student, aid, preloads): (student, aid)
                   for student, aid in longest_first(work, pairs, released)}
        for future in as_completed(futures):
            student, aid = futures[future]
            try:
                yield student, aid, future.result()
            except Exception as error:  # a grader fault on one submission never stops the batch
                yield student, aid, error

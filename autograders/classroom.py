"""A class of submissions built from the course's own material, for tests and benchmarks.

Students: ``reference`` (the solution notebook, its first answer cell followed by ``HONEST``, what an
honest student's code may leave running), ``unanswered`` (the release as handed out), and
the answer fixtures in ``tests/fixtures/<assignment>/{wrong,right}/<exercise>__<name>.py``, packed:
student ``wrong-1`` answers every exercise with its first wrong fixture, ``wrong-2`` with its second,
and so on (``right-N`` likewise), so a class needs as many students as the longest list of fixtures,
not one per fixture; each answer cell is still judged on its own. ``packed=False`` (``--one-per-fixture``)
gives one student per fixture instead, named after it. ``expected`` says what each should score.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gpucourse.checks as declarations

from .assemble import nbgrader_meta
from .course import COURSE, ROOT, SOLUTIONS

FIXTURES = ROOT / "tests" / "fixtures"


def fixtures() -> list[tuple[str, str, str, Path]]:
    """(assignment, "wrong" or "right", exercise, file) for every fixture file."""
    found = []
    for assignment_dir in sorted(p for p in FIXTURES.iterdir() if p.is_dir() and (SOLUTIONS / p.name).is_dir()):
        for kind in ("wrong", "right"):
            for path in sorted((assignment_dir / kind).glob("*.py")):
                found.append((assignment_dir.name, kind, path.stem.split("__")[0], path))
    return found


def auto_graded_cells(nb: dict) -> list[str]:
    return [nbgrader_meta(c)["grade_id"] for c in nb["cells"] if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")]


# Honest code that leaves threads and processes behind, as students' code does: none of it may cost a
# point or raise a flag (the grader's quiet check looks for code of the cells running, not for threads).
# Appended to the reference's first answer cell (of a function or answer exercise when there is one), so
# every assignment's graded run keeps each of these alive through its checks.
HONEST = """

# --- honest patterns that leave threads and processes behind (autograders.classroom.HONEST) ---
import concurrent.futures as _futures, multiprocessing as _mp, queue as _queue, subprocess as _subprocess
import sys as _sys, threading as _threading
import torch as _torch
_POOL = _futures.ThreadPoolExecutor(2)  # a module-level thread pool: its idle threads stay
assert list(_POOL.map(abs, [-1, -2])) == [1, 2]
_torch.set_num_threads(2)  # OpenMP/BLAS keep a second thread after a matmul
_torch.ones(96, 96) @ _torch.ones(96, 96)
with _mp.get_context("forkserver").Pool(1) as _pool:  # the forkserver process stays for the next pool
    assert _pool.map(abs, [-3]) == [3]
with _mp.get_context("spawn").Pool(1) as _pool:  # so does the resource tracker
    assert _pool.map(abs, [-4]) == [4]
_LOADER = _torch.utils.data.DataLoader(list(range(4)), batch_size=2, num_workers=1, persistent_workers=True)
assert [b.tolist() for b in _LOADER] == [[0, 1], [2, 3]]  # its worker process stays for the next epoch
_WAITING = _queue.Queue()
_threading.Thread(target=_WAITING.get, daemon=True).start()  # a daemon thread blocked in a library call
_subprocess.run([_sys.executable, "-c", "pass"], check=True)  # a child that ends cleanly
"""


def with_honest_patterns(nb: dict, assignment: str) -> dict:
    """``nb`` with ``HONEST`` after its first answer cell's code (of a function or answer exercise when the
    assignment has one: a script exercise's cell also runs in every rank)."""
    scripts = {e.name for e in declarations.exercises(assignment) if isinstance(e.kind, declarations.Script)}
    answers = [c for c in nb["cells"] if nbgrader_meta(c).get("solution") and c["cell_type"] == "code"]
    target = next((c for c in answers if nbgrader_meta(c)["grade_id"] not in scripts), answers[0])
    source = target["source"] if isinstance(target["source"], str) else "".join(target["source"])
    target["source"] = source + HONEST
    return nb


fixture_names: dict[tuple[str, str], list[str]] = {}  # what the last build put in each submission
fixture_paths: dict[tuple[str, str], dict[str, Path]] = {}  # ... and which fixture answers which test cell


def intended(path: Path) -> tuple[str, str]:
    """A fixture's first line, ``# fails: <text>`` (wrong) or ``# approach: <how>`` (right), as (kind, text).

    ``<text>`` must appear in one of the ✗ lines the grader reports for the fixture's exercise: the
    fixture fails for that reason, not for another one."""
    first = path.read_text().split("\n", 1)[0]
    for kind in ("fails", "approach"):
        if first.startswith(f"# {kind}: ") and first[len(kind) + 4:].strip():
            return kind, first[len(kind) + 4:].strip()
    raise ValueError(f"{path}: the first line must be '# fails: <text in the ✗ line it causes>' (wrong/) "
                     "or '# approach: <how it differs from the reference>' (right/)")


def build(folder: Path, limit: int | None = None, only: str | None = None,
          packed: bool = True) -> dict[tuple[str, str], dict[str, str]]:
    """Write the class into ``folder``; returns {(student, assignment): {test cell: "full" | "zero"}}.

    ``only``: one assignment's students (while writing a lesson's fixtures); ``limit``: the first few.
    """
    expected = {}
    sources = sorted(SOLUTIONS.glob("*/*.ipynb"))
    if only is not None:
        sources = [s for s in sources if s.parent.name == only]
        if not sources:
            raise SystemExit(f"no assignment {only!r} in {SOLUTIONS}")
    for source in sources:
        assignment = source.parent.name
        released = COURSE / assignment / source.name
        cells = auto_graded_cells(json.loads(source.read_text()))
        shutil.copytree(source.parent, folder / "reference" / assignment)
        honest = with_honest_patterns(json.loads(source.read_text()), assignment)
        (folder / "reference" / assignment / source.name).write_text(json.dumps(honest, indent=1))
        shutil.copytree(released.parent, folder / "unanswered" / assignment)
        expected[("reference", assignment)] = {c: "full" for c in cells}
        expected[("unanswered", assignment)] = {c: "zero" for c in cells}
        packs: dict[tuple[str, int], list[tuple[str, Path]]] = {}  # (student, assignment) -> answers
        counters: dict[tuple[str, str], int] = {}
        for fixture_assignment, kind, exercise, path in fixtures():
            if fixture_assignment != assignment:
                continue
            if packed:
                index = counters[(kind, exercise)] = counters.get((kind, exercise), 0) + 1
                student = f"{kind}-{index}"
            else:
                student = f"{kind}-{exercise}-{path.stem.split('__')[1]}"
            packs.setdefault((kind, student), []).append((exercise, path))
        for (kind, student), answers in sorted(packs.items()):
            nb = json.loads(released.read_text())
            for exercise, path in answers:
                targets = [c for c in nb["cells"] if nbgrader_meta(c).get("grade_id") == exercise]
                if len(targets) != 1:
                    raise ValueError(f"{released.name} has no solution cell {exercise!r} (fixture {path.name})")
                targets[0]["source"] = path.read_text()
            (folder / student / assignment).mkdir(parents=True)
            (folder / student / assignment / released.name).write_text(json.dumps(nb, indent=1))
            test_of = {e.name: e.test_id for e in declarations.exercises(assignment)}
            expected[(student, assignment)] = {test_of[exercise]: "zero" if kind == "wrong" else "full"
                                               for exercise, _ in answers}
            fixture_names[(student, assignment)] = [path.name for _, path in answers]
            fixture_paths[(student, assignment)] = {test_of[exercise]: path for exercise, path in answers}
    if limit is not None:
        for student, assignment in list(expected)[limit:]:
            shutil.rmtree(folder / student / assignment)
            if not any((folder / student).iterdir()):
                (folder / student).rmdir()
            del expected[(student, assignment)]
    return expected


def main(argv: list[str] | None = None) -> int:
    """Write a class and print what each student should score: ``python -m autograders classroom OUT [--only A]``.

    Then ``make grade SUBMISSIONS=OUT RESULTS=...`` and compare with ``RESULTS/grades.csv`` and the logs.
    """
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--only", help="one assignment")
    parser.add_argument("--one-per-fixture", action="store_true", help="one student per fixture, named after it")
    args = parser.parse_args(argv)
    if args.folder.exists() and any(args.folder.iterdir()):
        raise SystemExit(f"{args.folder} is not empty")
    for (student, assignment), cells in build(args.folder, only=args.only, packed=not args.one_per_fixture).items():
        print(student, assignment, " ".join(f"{cell}={want}" for cell, want in cells.items()),
              "#", " ".join(fixture_names.get((student, assignment), [])))
    return 0

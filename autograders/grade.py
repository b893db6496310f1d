"""`make grade`: grade a class of submissions in sandboxes, in parallel, into nbgrader's gradebook.

SUBMISSIONS is nbgrader's submitted layout, ``<student>/<assignment>/<notebook>.ipynb``.
RESULTS receives:

- ``grades.csv``: nbgrader's CSV export (assignment, student_id, score, max_score, ...);
- ``feedback/<student>/<assignment>/<notebook>.html``: what each student gets back (check names
  and what failed; never the hidden checks' code);
- ``logs/<student>__<assignment>.log``: scores, flags, every check's result, the sandbox output;
- ``flagged.txt``: submissions a person should look at, and why; ``problems.txt``: what could not
  be graded at all;
- ``nbgrader/``: a complete nbgrader course folder (gradebook included) for Formgrader's manual
  grading: ``cd RESULTS/nbgrader && jupyter lab``, then ``nbgrader export`` there.

Each submission runs in its own sandbox (autograders/sandbox.py) and is judged here
(autograders/engine.py); see autograders/THREAT_MODEL.md. Kernels run with GPUCOURSE_SMOKE=1
unless it is already set: grading needs the exercises' answers, not the lessons' measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import engine
import record
import sandbox
from course import COURSE, HERE, ROOT, SOLUTIONS, api, assignments, load_config

IGNORED = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")


@dataclass
class Batch:
    """What one grading run found and did."""

    pairs: list[tuple[str, str]] = field(default_factory=list)  # (student, assignment) to grade
    problems: list[str] = field(default_factory=list)
    flagged: list[str] = field(default_factory=list)

    def problem(self, student: str, assignment: str, why: str) -> None:
        self.problems.append(f"{student}/{assignment}: {why}")


def discover(submissions: Path, known: list[str], only_student: str | None = None) -> Batch:
    """Step 1: list gradeable (student, assignment) pairs; note everything else as a problem."""
    if not submissions.is_dir():
        raise SystemExit(f"SUBMISSIONS={submissions} is not a folder")
    batch = Batch()
    for student_dir in sorted(p for p in submissions.iterdir() if not p.name.startswith(".")):
        student = student_dir.name
        if only_student is not None and student != only_student:
            continue
        if not student_dir.is_dir() or student_dir.is_symlink():
            batch.problem(student, "-", "not a folder; expected <student>/<assignment>/<notebook>.ipynb")
            continue
        for assignment_dir in sorted(p for p in student_dir.iterdir() if not p.name.startswith(".")):
            aid = assignment_dir.name
            if aid not in known:
                batch.problem(student, aid, f"unknown assignment (known: {', '.join(known)})")
            elif not assignment_dir.is_dir() or not any(assignment_dir.glob("*.ipynb")):
                batch.problem(student, aid, "no notebook found")
            else:
                batch.pairs.append((student, aid))
    if only_student is not None and not batch.pairs and not batch.problems:
        raise SystemExit(f"no submission from student {only_student!r} in {submissions}")
    return batch


def prepare(work: Path, submissions: Path, batch: Batch, solutions: Path) -> None:
    """Step 2: an nbgrader course folder: the sources, and a copy of each submission to grade."""
    if (work / "source").exists():
        shutil.rmtree(work / "source")
    shutil.copytree(solutions, work / "source", ignore=IGNORED)
    for student, aid in batch.pairs:
        target = work / "submitted" / student / aid
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(submissions / student / aid, target, ignore=IGNORED, symlinks=True)
    # Formgrader and `nbgrader export` run from this folder read this file.
    (work / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"load_subconfig({str(HERE / 'nbgrader_config.py')!r})\n"
        f"c.CourseDirectory.root = {str(work)!r}\n"
        "c.CourseDirectory.source_directory = 'source'\n"
        "c.CourseDirectory.release_directory = 'release'\n"
        f"c.CourseDirectory.db_url = {'sqlite:///' + str(work / 'gradebook.db')!r}\n"
    )


def register(nbgrader, batch: Batch) -> None:
    """Step 3: generate each assignment once: its cells enter the gradebook, its release is the template."""
    for aid in sorted({aid for _, aid in batch.pairs}):
        result = nbgrader.generate_assignment(aid, force=True, create=True)
        if not result["success"]:
            raise SystemExit(f"cannot generate {aid} from the sources:\n{result['error']}")


def _released(work: Path, aid: str) -> Path:
    return _notebook(work / "release" / aid, aid)


def _notebook(folder: Path, aid: str) -> Path:
    notebooks = sorted(folder.glob("*.ipynb"))
    if len(notebooks) != 1:
        raise SystemExit(f"{aid}: the engine grades one notebook per assignment, found {len(notebooks)}")
    return notebooks[0]


def _eta(done: int, total: int, started: float) -> str:
    remaining = (time.perf_counter() - started) / done * (total - done)
    return f"{int(remaining // 60)}:{int(remaining % 60):02d}"


def sandboxed(work: Path, pairs: list[tuple[str, str]], released, hide: list[Path], jobs: int,
              limits: sandbox.Limits, preload: bool = True):
    """Every pair in its own sandbox, ``jobs`` at a time: yields (student, assignment, Graded or the
    grader's exception) as each one ends. ``released(assignment)`` is the released notebook's path.

    ``preload``: fork each sandbox from a preloaded Python per worker (engine.Preloads) instead of
    starting Python and importing torch for every submission."""
    isolate = sandbox.namespaces_available()
    with (engine.Preloads() if preload else contextlib.nullcontext()) as preloads, \
            ThreadPoolExecutor(max_workers=jobs) as pool:  # every worker done before the preloaded Pythons stop
        futures = {pool.submit(engine.grade_submission, work, student, aid, released(aid), hide, limits, isolate,
                               preloads): (student, aid) for student, aid in pairs}
        for future in as_completed(futures):
            student, aid = futures[future]
            try:
                yield student, aid, future.result()
            except Exception as error:  # a grader fault on one submission never stops the batch
                yield student, aid, error


def autograde(work: Path, batch: Batch, results: Path, submissions: Path, jobs: int,
              limits: sandbox.Limits, preload: bool = True) -> list[tuple[str, str]]:
    """Step 4: every pair in its own sandbox, ``jobs`` at a time; grades written as each one ends."""
    hide = [work, results, submissions, ROOT / "solutions", ROOT / "autograders", ROOT / "tests", ROOT / ".git"]
    graded, started, total = [], time.perf_counter(), len(batch.pairs)
    ended = sandboxed(work, batch.pairs, lambda aid: _released(work, aid), hide, jobs, limits, preload)
    for done, (student, aid, result) in enumerate(ended, 1):
        try:
            if isinstance(result, Exception):
                raise result
            record.write(work, _released(work, aid), result, results / "logs")
        except Exception as error:  # a grader fault on one submission never stops the batch
            batch.problem(student, aid, f"could not be graded: {type(error).__name__}: {error}")
            continue
        graded.append((student, aid))
        if result.flags or result.notes:
            batch.flagged.append(f"{student}/{aid}: " + "; ".join(result.flags + result.notes))
        score = f"{sum(result.scores.values()):g}/{sum(result.max_scores.values()):g}"
        bar = "#" * (20 * done // total) + "." * (20 - 20 * done // total)
        print(f"[{bar}] {done}/{total} {student}/{aid} {score}{' FLAGGED' if result.flags else ''}"
              f"  ETA {_eta(done, total, started)}", flush=True)
    return graded


def engine_only(submissions: Path, jobs: int | None = None, limits: sandbox.Limits = sandbox.Limits(),
                preload: bool = True) -> tuple[Batch, dict[tuple[str, str], engine.Graded]]:
    """The engine alone on a class: each submission sandboxed and judged exactly as ``grade`` does,
    against course/'s released notebooks, without nbgrader (no gradebook, feedback or CSV export).
    For checking many answers quickly (the test suite's fixtures); ``grade`` is the instructors' tool."""
    submissions = submissions.resolve()
    batch = discover(submissions, assignments(SOLUTIONS))
    graded: dict[tuple[str, str], engine.Graded] = {}
    with tempfile.TemporaryDirectory(prefix="gpucourse-engine-") as folder:
        work = Path(folder)
        for student, aid in batch.pairs:
            shutil.copytree(submissions / student / aid, work / "submitted" / student / aid, ignore=IGNORED, symlinks=True)
        hide = [work, submissions, ROOT / "solutions", ROOT / "autograders", ROOT / "tests", ROOT / ".git"]
        released = {aid: _notebook(COURSE / aid, aid) for _, aid in batch.pairs}
        for student, aid, result in sandboxed(work, batch.pairs, released.__getitem__, hide,
                                              jobs or os.cpu_count() or 1, limits, preload):
            if isinstance(result, Exception):
                batch.problem(student, aid, f"could not be graded: {type(result).__name__}: {result}")
            else:
                graded[(student, aid)] = result
    return batch, graded


def feedback(nbgrader, graded: list[tuple[str, str]], work: Path, out: Path, batch: Batch) -> None:
    """Step 4: HTML feedback per student and assignment, copied to RESULTS/feedback/."""
    for student, aid in graded:
        result = nbgrader.generate_feedback(aid, student, force=True)
        source = work / "feedback" / student / aid
        if not result["success"] or not source.is_dir():
            batch.problem(student, aid, "feedback could not be generated (see its log)")
            continue
        target = out / student / aid
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target)


def export(config, destination: Path) -> None:
    """Step 5: nbgrader's own CSV export of the whole gradebook."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    plugin = CsvExportPlugin(config=config)
    plugin.to = str(destination)
    with Gradebook(config.CourseDirectory.db_url) as gradebook:
        plugin.export(gradebook)


def grade(submissions: Path, results: Path, solutions: Path = SOLUTIONS, only_student: str | None = None,
          jobs: int | None = None, limits: sandbox.Limits = sandbox.Limits(), preload: bool = True) -> Batch:
    """Run the steps; returns what was graded, flagged and could not be graded."""
    submissions, results = submissions.resolve(), results.resolve()
    os.environ.setdefault("GPUCOURSE_SMOKE", "1")
    work = results / "nbgrader"
    work.mkdir(parents=True, exist_ok=True)
    batch = discover(submissions, assignments(solutions), only_student)
    prepare(work, submissions, batch, solutions)
    config = load_config(root=work, db=work / "gradebook.db", source="source", release="release")
    nbgrader = api(config)
    register(nbgrader, batch)
    graded = autograde(work, batch, results, submissions, jobs or os.cpu_count() or 1, limits, preload)
    feedback(nbgrader, graded, work, results / "feedback", batch)
    export(config, results / "grades.csv")
    (results / "problems.txt").write_text("".join(f"{p}\n" for p in batch.problems))
    if only_student is None or not (results / "flagged.txt").exists():
        (results / "flagged.txt").write_text("".join(f"{f}\n" for f in sorted(batch.flagged)))
    return batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submissions", type=Path, required=True)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--student", help="regrade only this student")
    parser.add_argument("--jobs", type=int, help="submissions graded at once (default: one per core)")
    parser.add_argument("--no-preload", action="store_true",
                        help="start Python for every submission instead of forking it from a preloaded one")
    args = parser.parse_args(argv)
    batch = grade(args.submissions, args.results, only_student=args.student, jobs=args.jobs, preload=not args.no_preload)
    print(f"graded {len(batch.pairs)} submission(s); grades in {args.results / 'grades.csv'}")
    for line in sorted(batch.flagged):
        print(f"  flagged: {line}")
    for problem in batch.problems:
        print(f"  could not grade: {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

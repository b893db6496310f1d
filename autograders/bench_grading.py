"""`make bench`, grading part: one class graded by sequential `nbgrader autograde` and by the engine.

    python -m autograders bench --out bench/results [--limit N]

Writes ``grading.json`` and ``grading.md``: both wall times, their ratio, seconds per submission,
the engine's time when it starts a Python per submission instead of forking a preloaded one, and
the sandbox's own start-up cost (an empty program, isolated or not, as the engine would run it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from . import classroom, grade, sandbox
from .course import SOLUTIONS, api, load_config
from .settings import Grading

from gpucourse import environment


def nbgrader_sequential(submissions: Path, work: Path) -> float:
    """Plain nbgrader: the hidden checks are not in the notebooks any more, so it runs the public ones."""
    batch = grade.discover(submissions, [p.name for p in SOLUTIONS.iterdir() if p.is_dir()])
    grade.prepare(work, submissions, batch, SOLUTIONS)
    nbgrader = api(load_config(root=work, db=work / "gradebook.db", source="source", release="release"))
    grade.register(nbgrader, batch)
    start = time.perf_counter()
    for student, aid in batch.pairs:
        result = nbgrader.autograde(aid, student, force=True, create=True)
        if not result["success"]:
            raise SystemExit(f"nbgrader autograde failed for {student}/{aid}:\n{result['error']}")
    return time.perf_counter() - start


def sandbox_overhead(repeats: int = 5) -> float:
    """Seconds to start and tear down the sandbox around an empty Python program."""
    best = float("inf")
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            sandbox.run([sys.executable, "-c", "pass"], Path(folder), limits=sandbox.Limits(wall_seconds=60))
            best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--limit", type=int, help="grade only the first N submissions of the class")
    parser.add_argument("--only", help="one assignment's submissions")
    args = parser.parse_args(argv)
    # the sandboxes get the smoke setting from c.Grading.smoke; nbgrader's own kernels (the baseline)
    # inherit this process's environment, so it says the same to them
    os.environ[environment.SMOKE] = "1" if Grading(config=load_config()).smoke else "0"
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpucourse-bench-") as folder:
        submissions = Path(folder) / "submitted"
        submissions.mkdir()
        count = len(classroom.build(submissions, args.limit, only=args.only))
        baseline = nbgrader_sequential(submissions, Path(folder) / "nbgrader-course")
        jobs = os.cpu_count() or 1
        start = time.perf_counter()
        grade.grade(submissions, Path(folder) / "engine-started-results", jobs=jobs, preload=False)
        started = time.perf_counter() - start
        start = time.perf_counter()
        batch = grade.grade(submissions, Path(folder) / "engine-results", jobs=jobs)
        engine = time.perf_counter() - start
    results = {
        "submissions": count, "jobs": jobs, "isolated": sandbox.namespaces_available(),
        "nbgrader_sequential_s": baseline, "engine_s": engine, "ratio": baseline / engine,
        "nbgrader_s_per_submission": baseline / count, "engine_s_per_submission": engine / count,
        "engine_started_s": started, "engine_started_s_per_submission": started / count,
        "sandbox_overhead_s": sandbox_overhead(), "flagged": len(batch.flagged), "problems": len(batch.problems),
        "engine_phases_s": batch.seconds,
    }
    (args.out / "grading.json").write_text(json.dumps(results, indent=2))
    text = "\n".join([
        "## Grading: sequential `nbgrader autograde` vs the engine",
        "",
        f"{count} submissions of the course's own class (tests/fixtures), {jobs} worker(s), "
        f"sandbox {'isolated (namespaces, nobody)' if results['isolated'] else 'not isolated (limits only)'}.",
        "",
        "| grader | wall time | per submission |",
        "|---|---|---|",
        f"| nbgrader autograde, one after another (public checks only) | {baseline:.1f} s | {baseline / count:.2f} s |",
        f"| engine, a Python started per submission (`--no-preload`) | {started:.1f} s | {started / count:.2f} s |",
        f"| engine (sandboxed, public + hidden checks; forked from a preloaded Python) | {engine:.1f} s | {engine / count:.2f} s |",
        "",
        f"Ratio: **{results['ratio']:.2f}x**. Sandbox start-up and teardown around an empty program: "
        f"{1000 * results['sandbox_overhead_s']:.0f} ms.",
        "",
        "Where the engine's time went (wall seconds; the sandboxed runs overlap, one per worker, and the",
        "grades are saved while they run):",
        "",
        "| phase | seconds |",
        "|---|---|",
        *[f"| {phase} | {seconds:.1f} |" for phase, seconds in batch.seconds.items()],
        "",
    ])
    (args.out / "grading.md").write_text(text)
    print(text)
    return 0

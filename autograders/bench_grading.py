"""`make bench`, grading part: one class graded by nbgrader, one submission after another, and by the engine.

    python -m autograders bench --out bench/results [--limit N]

Both make the same steps (register the assignments, autograde, feedback, CSV export). Writes
``grading.json`` and ``grading.md``: both wall times and each side's steps, their ratio (and nbgrader's
autograde step alone against the engine's every step), seconds per submission,
the engine's time when it starts a Python per submission instead of forking a preloaded one, and
the sandbox's own start-up cost (an empty program, isolated or not, as the engine would run it).

    python -m autograders bench --slurm [--shard-size N] --out bench/results [--limit N]

grades the same class with the local pool and as one Slurm job array (autograders/slurm_grade.py) on
the same machine, and writes ``grading-slurm.json`` and ``grading-slurm.md``: both wall times, the
array's overhead, the load average around each run (another program on the machine slows either)
and whether both gave the same grades. On lesson 10's local cluster (started for the run where it is
down and can start), whose nodes share this machine's cores, each task grades
``cores / nodes`` submissions at once, so that both runs keep the same number of sandboxes busy.
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


def nbgrader_sequential(submissions: Path, work: Path) -> dict[str, float]:
    """Plain nbgrader, one submission after another, through the steps the engine's ``grade`` makes too:
    register the assignments (generate_assignment), autograde, generate the feedback, export the CSV.
    Seconds per step. The hidden checks are not in the notebooks any more, so it runs the public ones."""
    batch = grade.discover(submissions, [p.name for p in SOLUTIONS.iterdir() if p.is_dir()])
    grade.prepare(work, submissions, batch, SOLUTIONS)
    config = load_config(root=work, db=work / "gradebook.db", source="source", release="release")
    with batch.timed("register"):
        nbgrader = api(config)
        grade.register(nbgrader, batch)
    with batch.timed("autograde"):
        for student, aid in batch.pairs:
            result = nbgrader.autograde(aid, student, force=True, create=True)
            if not result["success"]:
                raise SystemExit(f"nbgrader autograde failed for {student}/{aid}:\n{result['error']}")
    with batch.timed("feedback"):
        for aid in sorted({aid for _, aid in batch.pairs}):
            result = nbgrader.generate_feedback(aid, force=True)
            if not result["success"]:
                raise SystemExit(f"nbgrader generate_feedback failed for {aid}:\n{result['error']}")
    with batch.timed("export"):
        grade.export(config, work / "grades.csv")
    return batch.seconds


def sandbox_overhead(repeats: int = 5) -> float:
    """Seconds to start and tear down the sandbox around an empty Python program."""
    best = float("inf")
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            sandbox.run([sys.executable, "-c", "pass"], Path(folder), limits=sandbox.Limits(wall_seconds=60))
            best = min(best, time.perf_counter() - start)
    return best


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def slurm_vs_pool(submissions: Path, folder: Path, count: int, shard_size: int | None) -> dict:
    """The class graded by the local pool, then as one Slurm job array, on this machine: wall times,
    overhead, load averages (1, 5, 15 min) before and after each run, and whether the grades agree."""
    import csv

    from traitlets.config import Config

    from gpucourse import local_slurm

    from .settings import SlurmGrading

    config = Config()
    if shard_size:
        config.SlurmGrading.shard_size = shard_size
    local_cluster = "SLURM_CONF" not in os.environ
    jobs = os.cpu_count() or 1
    if local_cluster:  # emulated nodes share these cores: the same sandboxes at once as the pool
        config.SlurmGrading.cpus_per_task = max(1, jobs // len(local_slurm.NODES))
    runs = {}
    for name, on_slurm in (("pool", False), ("slurm", True)):
        before = _load()
        start = time.perf_counter()
        batch = grade.grade(submissions, folder / f"{name}-results", jobs=jobs, slurm=on_slurm, config_overrides=config)
        runs[name] = {"s": time.perf_counter() - start, "load_before": before, "load_after": _load(),
                      "flagged": len(batch.flagged), "problems": len(batch.problems), "phases_s": batch.seconds}
    grades = []
    for name in runs:
        with open(folder / f"{name}-results" / "grades.csv") as f:
            grades.append(sorted((r["student_id"], r["assignment"], r["score"]) for r in csv.DictReader(f)))
    size = SlurmGrading(config=config).shard_size
    return {"submissions": count, "jobs": jobs, "shard_size": size, "tasks": -(-count // size),
            "cpus_per_task": SlurmGrading(config=config).cpus_per_task, "local_cluster": local_cluster,
            "cores": os.cpu_count(), "pool_s": runs["pool"]["s"], "slurm_s": runs["slurm"]["s"],
            "overhead": runs["slurm"]["s"] / runs["pool"]["s"] - 1, "same_grades": grades[0] == grades[1],
            "runs": runs}


def slurm_report(results: dict) -> str:
    pool, slurm = results["runs"]["pool"], results["runs"]["slurm"]
    return "\n".join([
        "## Grading: the local pool vs one Slurm job array, on the same machine",
        "",
        f"{results['submissions']} submissions of the course's own class (tests/fixtures), {results['cores']} cores; "
        f"the pool grades {results['jobs']} at once; the array has {results['tasks']} task(s) of at most "
        f"{results['shard_size']} submissions, each grading {results['cpus_per_task'] or results['jobs']} at once"
        + (" on lesson 10's local cluster (2 emulated nodes on these cores)." if results["local_cluster"] else "."),
        "",
        "| grader | wall time | load average before (1, 5, 15 min) | after |",
        "|---|---|---|---|",
        f"| local pool | {results['pool_s']:.1f} s | {pool['load_before']} | {pool['load_after']} |",
        f"| Slurm job array | {results['slurm_s']:.1f} s | {slurm['load_before']} | {slurm['load_after']} |",
        "",
        f"Overhead of the array: **{100 * results['overhead']:+.0f}%**; same grades: {results['same_grades']}.",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--limit", type=int, help="grade only the first N submissions of the class")
    parser.add_argument("--only", help="one assignment's submissions")
    parser.add_argument("--slurm", action="store_true", help="the local pool vs one Slurm job array instead")
    parser.add_argument("--shard-size", type=int, help="with --slurm: submissions per array task "
                        "(default: c.SlurmGrading.shard_size)")
    args = parser.parse_args(argv)
    if args.slurm:
        return _main_slurm(args)
    # the sandboxes get the smoke setting from c.Grading.smoke; nbgrader's own kernels (the baseline)
    # inherit this process's environment, so it says the same to them
    os.environ[environment.SMOKE] = "1" if Grading(config=load_config()).smoke else "0"
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpucourse-bench-") as folder:
        submissions = Path(folder) / "submitted"
        submissions.mkdir()
        count = len(classroom.build(submissions, args.limit, only=args.only))
        steps = nbgrader_sequential(submissions, Path(folder) / "nbgrader-course")
        baseline = sum(steps.values())
        jobs = os.cpu_count() or 1
        start = time.perf_counter()
        grade.grade(submissions, Path(folder) / "engine-started-results", jobs=jobs, preload=False)
        started = time.perf_counter() - start
        start = time.perf_counter()
        batch = grade.grade(submissions, Path(folder) / "engine-results", jobs=jobs)
        engine = time.perf_counter() - start
    results = {
        "submissions": count, "jobs": jobs, "isolated": sandbox.namespaces_available(),
        "nbgrader_sequential_s": baseline, "nbgrader_steps_s": steps, "engine_s": engine, "ratio": baseline / engine,
        "ratio_autograde_only": steps["autograde"] / engine,
        "nbgrader_s_per_submission": baseline / count, "engine_s_per_submission": engine / count,
        "engine_started_s": started, "engine_started_s_per_submission": started / count,
        "sandbox_overhead_s": sandbox_overhead(), "flagged": len(batch.flagged), "problems": len(batch.problems),
        "engine_phases_s": batch.seconds,
    }
    (args.out / "grading.json").write_text(json.dumps(results, indent=2))
    text = "\n".join([
        "## Grading: nbgrader, one submission after another, vs the engine",
        "",
        f"{count} submissions of the course's own class (tests/fixtures), {jobs} worker(s), "
        f"sandbox {'isolated (namespaces, nobody)' if results['isolated'] else 'not isolated (limits only)'}.",
        "",
        "| grader | wall time | per submission |",
        "|---|---|---|",
        f"| nbgrader, one submission after another (public checks only): register, autograde, feedback, export "
        f"| {baseline:.1f} s | {baseline / count:.2f} s |",
        f"| engine, a Python started per submission (`--no-preload`) | {started:.1f} s | {started / count:.2f} s |",
        f"| engine (sandboxed, public + hidden checks; forked from a preloaded Python) | {engine:.1f} s | {engine / count:.2f} s |",
        "",
        f"Ratio, the same steps on both sides: **{results['ratio']:.2f}x**. nbgrader's autograde step alone "
        f"({steps['autograde']:.1f} s) against the engine's every step: {results['ratio_autograde_only']:.2f}x.",
        "",
        "nbgrader's steps (seconds): " + ", ".join(f"{step} {seconds:.1f}" for step, seconds in steps.items()) + ".",
        f"Sandbox start-up and teardown around an empty program: {1000 * results['sandbox_overhead_s']:.0f} ms.",
        "",
        "Where the engine's time went (wall seconds; the sandboxed runs overlap, one per worker, and the",
        "grades are saved and the feedback pages made while they run):",
        "",
        "| phase | seconds |",
        "|---|---|",
        *[f"| {phase} | {seconds:.1f} |" for phase, seconds in batch.seconds.items()],
        "",
    ])
    (args.out / "grading.md").write_text(text)
    print(text)
    return 0


def _main_slurm(args) -> int:
    from gpucourse import local_slurm

    started = False
    if "SLURM_CONF" not in os.environ and not local_slurm.is_up():
        try:
            local_slurm.start()
        except RuntimeError as error:
            raise SystemExit(f"no Slurm cluster to grade on: {error}")
        started = True
    os.environ[environment.SMOKE] = "1" if Grading(config=load_config()).smoke else "0"
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix="gpucourse-bench-") as folder:
            submissions = Path(folder) / "submitted"
            submissions.mkdir()
            count = len(classroom.build(submissions, args.limit, only=args.only))
            results = slurm_vs_pool(submissions, Path(folder), count, args.shard_size)
    finally:
        if started:
            local_slurm.stop(quiet=True)
    (args.out / "grading-slurm.json").write_text(json.dumps(results, indent=2))
    text = slurm_report(results)
    (args.out / "grading-slurm.md").write_text(text)
    print(text)
    return 0

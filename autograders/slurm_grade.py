"""`make grade GRADE_ARGS=--slurm`: the class graded as one Slurm job array, merged into one gradebook.

The grader submits ONE job array first, one task per shard of ``c.SlurmGrading.shard_size``
submissions; each task runs this module (``python -m autograders.slurm_grade task FOLDER INDEX
ATTEMPT``) on its node, starts its preloaded Pythons (``FOLDER/settings.json``) while the grader
registers the assignments, then waits for the plan (``FOLDER/plan.json``, FOLDER being
``<RESULTS>/nbgrader/slurm``): the class dealt into the shards longest first, round the class, so that
every shard gets its share of the multi-process exercises. Each task then runs the engine's steps on
its shard, each submission in the same sandbox as the local pool
(``pool.sandboxed``), saving each result as it ends into the task's own folder
(``slurm/task-<index>/<k>.json``, written whole then renamed). The grader, meanwhile, reads the
results as they land and runs record.py's steps on each: it stays the gradebook's one writer, so the
gradebook, feedback, logs, ``grades.csv``, ``flagged.txt`` and ``problems.txt`` are written exactly as
a local run writes them.

A task that ends without every result of its shard (a non-zero exit, a node failure, Slurm's time
limit) is submitted again (``c.SlurmGrading.retries`` times, as an array of the failed indexes); it
resumes after the submissions it saved. After the last try, each submission it left ungraded is
flagged, with what Slurm said about every try, and listed as not graded: never silently missing, and
never scored 0.

The folders must be on a filesystem the nodes share (the results folder, this repository and its
``.venv``), as they are on one machine and on a cluster's shared home. On this course's own machine,
``make cluster`` starts lesson 10's local cluster (gpucourse.local_slurm), and the grader submits to it
while it is up and ``SLURM_CONF`` names no other; anywhere else, to the cluster the machine's Slurm
commands reach.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from . import engine, pool, sandbox
from .context import Submission
from .course import ROOT
from .settings import Grading, SlurmGrading

from gpucourse import local_slurm

# what the task keeps of each graded submission: the fields record.py's steps read
KEPT = ("answers", "flags", "forgery", "seed", "notes", "log", "seconds", "scores", "max_scores", "report")


UNANSWERED_SECONDS = 300  # squeue failing this long (the controller gone): the grader stops, cancelling the array


class NotGraded(Exception):
    """A submission its array task never graded, after every try (the reason says what Slurm reported)."""


def _faulted(kind: str, message: str) -> Exception:
    """A grader fault raised in a task, rebuilt here under its own class name, so that problems.txt reads as
    a local run's ("could not be graded: ValueError: ...")."""
    return type(kind, (Exception,), {})(message)


# --- the grader's side ----------------------------------------------------------------------------

def slurm_env() -> dict:
    """The environment of Slurm's commands: lesson 10's local cluster while it is up and ``SLURM_CONF`` names
    no other cluster, else the machine's own Slurm configuration."""
    if "SLURM_CONF" not in os.environ and local_slurm.is_up():
        return local_slurm.env()
    return dict(os.environ)


def shards(pairs: list[tuple[str, str]], size: int) -> list[list[tuple[str, str]]]:
    """``pairs`` (longest first) dealt into ``ceil(len / size)`` shards of at most ``size``, round the class:
    each shard gets its share of the long ones."""
    count = max(1, math.ceil(len(pairs) / size))
    return [pairs[i::count] for i in range(count) if pairs[i::count]]


def time_limit(slurm: SlurmGrading, shard_size: int, workers: int, wall_seconds: float) -> int:
    """Minutes of Slurm's time limit per task: the configured one, else the shard at its slowest (every
    submission taking its whole wall time, ``workers`` at a time) plus 10 minutes."""
    if slurm.time_minutes:
        return slurm.time_minutes
    return math.ceil(math.ceil(shard_size / workers) * wall_seconds / 60) + 10


def _task_dir(work: Path, index: int) -> Path:
    return work / "slurm" / f"task-{index}"


class Array:
    """One class on Slurm: the job array, submitted first so that its tasks start (and preload) while the
    grader registers the assignments; then the plan; then the results read back as they land, and retries."""

    def __init__(self, work: Path, count: int, jobs: int, limits: sandbox.Limits, preload: bool, grading: Grading,
                 slurm: SlurmGrading):
        self.work, self.slurm, self.env, self.grading = work, slurm, slurm_env(), grading
        self.folder = work / "slurm"
        if self.folder.exists():
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        self.count = max(1, math.ceil(count / slurm.shard_size))  # shards() deals this many
        self.workers = slurm.cpus_per_task or jobs
        # what a task needs before the plan: enough to start its preloaded Pythons
        _write(self.folder / "settings.json", {
            "work": str(work), "workers": self.workers, "preload": preload, "limits": dataclasses.asdict(limits),
            "grading": {name: getattr(grading, name) for name in grading.trait_names(config=True)}})
        self.minutes = time_limit(slurm, math.ceil(count / self.count), self.workers, limits.wall_seconds)
        self.shards: list[list[tuple[str, str]]] = []
        self.jobs: dict[int, list[int]] = {}  # running array job -> its indexes
        self.tries: dict[int, list[str]] = {i: [] for i in range(self.count)}  # index -> each try's end
        self.failed: dict[tuple[str, str], str] = {}  # ungraded after every try -> why
        self.unanswered_since: float | None = None  # when squeue began failing, while it does

    def plan(self, pairs: list[tuple[str, str]], released, hide: list[Path]) -> None:
        """Deal the class into the array's shards (longest first) and tell the tasks, which wait for it."""
        self.shards = shards(pool.longest_first(self.work, pairs, released), self.slurm.shard_size)
        assert len(self.shards) == self.count, (len(self.shards), self.count)
        _write(self.folder / "plan.json", {
            "shards": self.shards, "hide": [str(p) for p in hide],
            "released": {aid: str(released(aid)) for aid in sorted({aid for _, aid in pairs})}})

    def close(self) -> None:  # contextlib.closing: whatever happened, nothing of the array outlives the grader
        self.cancel()

    def cancel(self) -> None:
        """Cancel what is still queued or running (the grader stopped: an error, ^C)."""
        for job in self.jobs:
            subprocess.run(["scancel", str(job)], capture_output=True, timeout=30, env=self.env)
        self.jobs.clear()

    def script(self) -> Path:
        path = self.folder / "array.sbatch"
        path.write_text("#!/bin/bash\n"
                        "# written by autograders/slurm_grade.py: one shard of the class per array task\n"
                        f"exec {sys.executable} -m autograders.slurm_grade task {self.folder} "
                        '"$SLURM_ARRAY_TASK_ID" "$1"\n')
        return path

    def submit(self, indexes: list[int]) -> int:
        """One job array of ``indexes``, at their next attempt; returns its job id."""
        attempt = len(self.tries[indexes[0]]) + 1
        options = [f"--array={','.join(map(str, indexes))}", "--job-name=grade", "--nodes=1", "--ntasks=1",
                   f"--time={self.minutes}", f"--chdir={ROOT}",
                   f"--output={self.folder}/task-%a-try{attempt}.out"]
        options += [f"--partition={self.slurm.partition}"] * bool(self.slurm.partition)
        options += [f"--gres={self.slurm.gres}"] * bool(self.slurm.gres)
        options += [f"--cpus-per-task={self.slurm.cpus_per_task}"] * bool(self.slurm.cpus_per_task)
        done = subprocess.run(["sbatch", "--parsable", *options, str(self.script()), str(attempt)],
                              capture_output=True, text=True, timeout=60, env=self.env)
        if done.returncode:
            raise SystemExit(f"sbatch refused the grading array: {done.stderr.strip() or done.returncode}")
        job = int(done.stdout.strip().split(";")[0].split("_")[0])
        self.jobs[job] = indexes
        return job

    def running(self, job: int) -> bool:
        """Whether any task of ``job`` is still queued or running (Slurm forgetting it means it ended)."""
        states, why = local_slurm.queue_states(job, timeout=30, environment=self.env)
        if states is None:  # the controller restarting or too busy: look again later, but not forever
            self.unanswered_since = self.unanswered_since or time.monotonic()
            if time.monotonic() - self.unanswered_since > UNANSWERED_SECONDS:
                raise SystemExit(f"squeue has failed for {UNANSWERED_SECONDS} s, the grading array's state is unknown: {why}")
            return True
        self.unanswered_since = None
        return bool(states - local_slurm.FINAL_STATES)

    def ended(self, job: int, index: int) -> str:
        """What Slurm says about array task ``job_index`` (state, exit code, node), and its output's last line."""
        out = subprocess.run(["scontrol", "show", "job", "-o", str(job)], capture_output=True, text=True,
                             timeout=30, env=self.env)
        fields = {}
        for line in out.stdout.splitlines():
            found = dict(part.split("=", 1) for part in line.split() if "=" in part)
            if found.get("ArrayTaskId") == str(index):
                fields = found
        attempt = len(self.tries[index]) + 1
        output = self.folder / f"task-{index}-try{attempt}.out"
        last = [line for line in output.read_text(errors="replace").splitlines() if line.strip()][-1:] \
            if output.exists() else []
        what = (f"{fields.get('JobState', 'state unknown')}, exit code {fields.get('ExitCode', '?')}"
                f"{' on ' + fields['NodeList'] if fields.get('NodeList') not in (None, '(null)') else ''}"
                if fields else "Slurm kept no record of it")
        return f"job {job}_{index}: {what}" + (f" ({last[0][:200]})" if last else "")

    def results(self):
        """Yield (student, assignment, engine.Graded or an exception) for every pair of the plan as its result
        lands; a task that ended short is retried, and what it never graded ends as NotGraded."""
        waiting = {i: set(range(len(shard))) for i, shard in enumerate(self.shards)}
        try:
            while self.jobs:
                yield from self._landed(waiting)
                for job in [j for j in self.jobs if not self.running(j)]:
                    yield from self._landed(waiting)  # what the tasks saved before they ended
                    short = [i for i in self.jobs.pop(job) if waiting[i]]
                    for index in short:
                        self.tries[index].append(self.ended(job, index))
                    again = [i for i in short if len(self.tries[i]) <= self.slurm.retries]
                    if again:
                        try:
                            self.submit(again)
                        except SystemExit as refused:  # no retry: those submissions are flagged below
                            for index in again:
                                self.tries[index].append(str(refused))
                            again = []
                    for index in (i for i in short if i not in again):
                        why = "; ".join(f"try {n}: {end}" for n, end in enumerate(self.tries[index], 1))
                        for k in sorted(waiting.pop(index)):
                            student, aid = self.shards[index][k]
                            reason = (f"its Slurm array task {index} failed "
                                      f"{len(self.tries[index])} time(s) ({why}; the tasks' output: "
                                      f"{self.folder}/task-{index}-try*.out)")
                            self.failed[(student, aid)] = reason
                            yield student, aid, NotGraded(reason)
                if self.jobs:
                    time.sleep(self.slurm.poll_seconds)
        finally:
            self.cancel()  # nothing left when all ended; else the grader stopped, and its tasks stop too

    def _landed(self, waiting: dict[int, set[int]]):
        for index, left in waiting.items():
            for k in sorted(left):
                path = _task_dir(self.work, index) / f"{k}.json"
                if path.exists():
                    left.discard(k)
                    student, aid = self.shards[index][k]
                    yield student, aid, self._read(path, student, aid)

    def _read(self, path: Path, student: str, aid: str):
        try:
            data = json.loads(path.read_text())
            if (data["student"], data["assignment"]) != (student, aid):
                raise ValueError(f"{path.name} holds {data['student']}/{data['assignment']}")
        except (OSError, ValueError, KeyError, TypeError) as error:
            return _faulted("UnreadableResult", f"its array task's result is unreadable: {error}")
        if "error" in data:
            return _faulted(str(data["error"]["type"]), str(data["error"]["message"]))
        submitted = self.work / "submitted" / student / aid / f"{data['notebook']}.ipynb"
        sub = Submission(student, aid, data["notebook"], submitted=submitted, checks=None, grading=self.grading)
        for name in KEPT:
            setattr(sub, name, data[name])
        return engine.Graded(nbformat.from_dict(data["nb"]), sub)


def submitted(work: Path, count: int, jobs: int, limits: sandbox.Limits, preload: bool, grading: Grading,
              slurm: SlurmGrading) -> Array:
    """The array for a class of ``count`` submissions, submitted now: its tasks start their preloaded Pythons
    and wait for the plan (``graded`` writes it)."""
    array = Array(work, count, jobs, limits, preload, grading, slurm)
    array.submit(list(range(array.count)))
    return array


def graded(array: Array, pairs, released, hide, batch):
    """``pool.sandboxed``'s contract on Slurm: writes the plan, then yields (student, assignment, Graded or
    exception); what the array never graded is also flagged in ``batch`` with its reason."""
    array.plan(pairs, released, hide)
    for student, aid, result in array.results():
        if isinstance(result, NotGraded):
            batch.flagged.append(f"{student}/{aid}: not graded: {result}")
        yield student, aid, result
    if not array.failed:  # every result is in the gradebook now: RESULTS holds what a local run writes
        shutil.rmtree(array.folder, ignore_errors=True)


# --- the array task's side ------------------------------------------------------------------------

def _saved(student: str, aid: str, result) -> dict:
    if isinstance(result, Exception):
        return {"student": student, "assignment": aid,
                "error": {"type": type(result).__name__, "message": str(result)}}
    sub = result.submission
    return {"student": student, "assignment": aid, "notebook": sub.notebook, "nb": result.nb,
            **{name: getattr(sub, name) for name in KEPT}}


def _write(path: Path, data: dict) -> None:
    """Whole or not at all: the grader reads a result as soon as its name appears."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)


PLAN_WAIT_SECONDS = 900  # a task whose grader never wrote the plan (it stopped) ends after this


def _wait_for(path: Path, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no {path.name} after {seconds:.0f} s: the grader stopped before writing it")
        time.sleep(0.2)
    return json.loads(path.read_text())


def task(folder: Path, index: int, attempt: int) -> int:
    """One array task: start the preloaded Pythons, wait for the plan, grade shard ``index`` (what an earlier
    attempt saved is kept), each submission in its sandbox, ``workers`` at a time, saving each as it ends."""
    import contextlib

    settings = json.loads((folder / "settings.json").read_text())
    work, workers, preload = Path(settings["work"]), settings["workers"], settings["preload"]
    grading = Grading(**settings["grading"])
    limits = sandbox.Limits(**settings["limits"])
    with (engine.Preloads(grading) if preload else contextlib.nullcontext()) as preloads:
        if preloads is not None and engine.forks():  # their imports overlap the wait for the plan
            preloads.start(workers)
        plan = _wait_for(folder / "plan.json", PLAN_WAIT_SECONDS)
        out = _task_dir(work, index)
        out.mkdir(parents=True, exist_ok=True)
        shard = [tuple(pair) for pair in plan["shards"][index]]
        position = {pair: k for k, pair in enumerate(shard)}
        todo = [pair for pair in shard if not (out / f"{position[pair]}.json").exists()]
        print(f"array task {index}, try {attempt}, on {os.environ.get('SLURMD_NODENAME', os.uname().nodename)}: "
              f"{len(todo)} of {len(shard)} submission(s) to grade", flush=True)
        released = {aid: Path(path) for aid, path in plan["released"].items()}
        hide = [Path(p) for p in plan["hide"]]
        for student, aid, result in pool.sandboxed(work, todo, released.__getitem__, hide, workers, limits, preload,
                                                    preloads=preloads, grading=grading):
            _write(out / f"{position[(student, aid)]}.json", _saved(student, aid, result))
            print(f"{student}/{aid} saved", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("task", help="grade one shard of the plan (what each array task runs)")
    one.add_argument("folder", type=Path, help="the array's folder: settings.json, then plan.json")
    one.add_argument("index", type=int)
    one.add_argument("attempt", type=int, nargs="?", default=1)
    args = parser.parse_args(argv)
    return task(args.folder, args.index, args.attempt)


if __name__ == "__main__":
    sys.exit(main())

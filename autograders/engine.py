"""Grade one submission: plan it, run it in the sandbox, judge the observations here.

Only this (trusted) process judges and writes grades. From the sandbox it accepts JSON lines on a
pipe of its own and nothing else; a line that is not JSON, or any record after the runner's
``done``, is ignored.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import queue
import shutil
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import assemble
import sandbox
from course import AUTOGRADERS, ROOT

import gpucourse.checks as public

RESULTS_LIMIT = 8 << 20  # bytes accepted from the results pipe


@dataclass
class Graded:
    student: str
    assignment: str
    notebook: str
    scores: dict[str, float] = field(default_factory=dict)  # test grade id -> score
    max_scores: dict[str, float] = field(default_factory=dict)
    report: dict[str, list[str]] = field(default_factory=dict)  # test grade id -> ✓/✗ lines
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    answers: dict[str, str | None] = field(default_factory=dict)
    cell_records: dict[int, dict] = field(default_factory=dict)  # released index -> {"output", "error"}
    log: str = ""
    seconds: float = 0.0


def load_checks(assignment: str):
    """autograders/checks/<assignment>.py: HIDDEN, the hidden cases of each exercise the assignment's
    public check module declares (gpucourse.checks.register)."""
    path = AUTOGRADERS / "checks" / f"{assignment}.py"
    if not path.is_file():
        raise SystemExit(f"no check file {path.relative_to(ROOT)} for assignment {assignment}")
    spec = importlib.util.spec_from_file_location(f"checks_{assignment}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    declared = {e.name for e in public.exercises(assignment)}
    unknown = sorted(set(module.HIDDEN) - declared)
    if unknown:
        raise SystemExit(f"{path.relative_to(ROOT)}: hidden cases for {unknown}, which {assignment} does not declare")
    module.EXERCISES = {e.test_id: e.name for e in public.exercises(assignment)}
    return module


def cases_for(checks, exercise: str) -> list[tuple[str, public.Case]]:
    named = [(f"{exercise}/public/{i}", c) for i, c in enumerate(public.public_cases(exercise))]
    return named + [(f"{exercise}/hidden/{i}", c) for i, c in enumerate(checks.HIDDEN.get(exercise, []))]


def _observer(case_id: str, case: public.Case) -> dict:
    return {"case": case_id, "source": inspect.getsource(case.observe), "function": case.observe.__name__}


def _env() -> dict[str, str]:
    return {"PATH": os.defpath, "HOME": "/tmp", "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1",
            "GPUCOURSE_SMOKE": os.environ.get("GPUCOURSE_SMOKE", "1"), "GPUCOURSE_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _read_results(fd: int, sink: list[bytes]) -> None:
    total = 0
    with os.fdopen(fd, "rb") as pipe:
        for chunk in iter(lambda: pipe.read(65536), b""):
            if total < RESULTS_LIMIT:
                sink.append(chunk[:RESULTS_LIMIT - total])
            total += len(chunk)


def _records(raw: bytes) -> tuple[list[dict], bool]:
    records = []
    for line in raw.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if record.get("type") == "done":
            return records, True
        records.append(record)
    return records, False


def _judge(case: public.Case, observation: dict | None) -> str | None:
    if observation is None:
        return "no observation (the run ended before this check)"
    if not observation.get("ok"):
        if observation.get("answer") is True:  # a missing or mistyped answer: "define `choices` (...)"
            return str(observation.get("error", "an answer is missing"))
        return f"raised {observation.get('error', 'an error')}"
    try:
        return case.judge(observation.get("data"))
    except Exception as error:  # malformed data is a failed check, not a grader crash
        return f"unexpected data ({type(error).__name__})"


class Preloads:
    """Preloaded Pythons (sandbox.Preloaded) for the sandboxes, one per grading worker at a time,
    started on first use: a submission's run is forked from one instead of starting Python and
    importing torch and Lightning again. ``with Preloads() as preloads:`` stops them afterwards."""

    def __init__(self):
        self._idle: queue.SimpleQueue[sandbox.Preloaded] = queue.SimpleQueue()
        self._started: list[sandbox.Preloaded] = []
        self._lock = threading.Lock()

    def take(self) -> sandbox.Preloaded:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            server = sandbox.Preloaded(_env())
            with self._lock:
                self._started.append(server)
            return server

    def give(self, server: sandbox.Preloaded) -> None:
        self._idle.put(server)

    def __enter__(self) -> "Preloads":
        return self

    def __exit__(self, *exc) -> None:
        for server in self._started:
            server.close()


def grade_submission(work: Path, student: str, assignment: str, released_path: Path, hide: list[Path],
                     limits: sandbox.Limits, isolate: bool | None = None, preloads: Preloads | None = None) -> Graded:
    """Everything about one submission except writing it down (see record.py)."""
    checks = load_checks(assignment)
    released = json.loads(released_path.read_text())
    graded = Graded(student, assignment, released_path.stem)
    submission, read_flags = assemble.read_submission(work / "submitted" / student / assignment / released_path.name)
    plan = assemble.plan(released, submission, read_flags)
    graded.flags, graded.answers = plan.flags, plan.answers

    tests = {assemble.nbgrader_meta(c)["grade_id"]: float(assemble.nbgrader_meta(c).get("points", 0)) for c in released["cells"]
             if assemble.nbgrader_meta(c).get("grade") and not assemble.nbgrader_meta(c).get("solution")}
    graded.max_scores = tests
    unknown = sorted(set(tests) - set(checks.EXERCISES))
    if unknown:
        raise SystemExit(f"{assignment}: test cells {unknown} grade no exercise its check module declares")
    cases = {test: cases_for(checks, checks.EXERCISES[test]) for test in tests}

    observations: dict[str, dict] = {}
    if plan.readable:
        job = {"cells": [{"source": c["source"], "grade_id": c["grade_id"]} for c in plan.cells],
               "observers": [_observer(cid, case) for named in cases.values() for cid, case in named],
               # one stuck cell or check costs a fraction of the wall time, not the whole run
               "cell_seconds": min(300, limits.wall_seconds / 6), "observe_seconds": min(240, limits.wall_seconds / 2)}
        box = work / ".sandbox" / f"{student}__{assignment}"
        if box.exists():
            shutil.rmtree(box)
        box.mkdir(parents=True)
        read_end, write_end = os.pipe()
        sink: list[bytes] = []
        reader = threading.Thread(target=_read_results, args=(read_end, sink), daemon=True)
        reader.start()
        server = preloads.take() if preloads is not None else None
        try:
            outcome = sandbox.run([sys.executable, "-m", "gpucourse.checks.runner", str(write_end)], box,
                                  env=_env(), hide=hide, limits=limits, isolate=isolate,
                                  stdin=json.dumps(job).encode(), pass_fds=(write_end,), preloaded=server)
        finally:
            if server is not None:
                preloads.give(server)
        reader.join(timeout=30)
        shutil.rmtree(box, ignore_errors=True)
        records, finished = _records(b"".join(sink))
        graded.seconds = outcome.seconds
        graded.notes += outcome.notes
        if not finished:
            graded.notes.append("the run ended before all checks ran" + (" (out of time)" if outcome.timed_out else
                                                                           f" (exit code {outcome.returncode})"))
        for record in records:
            if record.get("type") == "cell" and isinstance(record.get("index"), int) and 0 <= record["index"] < len(plan.cells):
                graded.cell_records[plan.cells[record["index"]]["template_index"]] = record
            elif record.get("type") == "observation" and isinstance(record.get("case"), str):
                observations.setdefault(record["case"], record)
        graded.log = outcome.output

    for test, named in cases.items():
        lines, passed = [], True
        for case_id, case in named:
            verdict = _judge(case, observations.get(case_id))
            label = ("hidden check: " if "/hidden/" in case_id else "") + case.name
            lines.append(f"✓ {label}" if verdict is None else f"✗ {label}: {verdict}")
            passed = passed and verdict is None
        graded.report[test] = lines
        graded.scores[test] = tests[test] if passed else 0.0
    return graded

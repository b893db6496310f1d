"""Grade one submission: a chain of small steps, each a notebook in and a notebook out.

Like an nbconvert preprocessor, every step is ``step(nb, submission) -> (nb, submission)`` with one
job; the notebook is the *released* one (nbformat), which the steps turn into the autograded
notebook, and ``submission`` (``context.Submission``, made once by ``start``) carries what a step
needs and what it found, in named fields. A test can hand a step a notebook and a Submission with
the fields it reads without running the others.

1. ``take_answers``: the student's answers, and nothing else, from the submission into the answer
   cells (``assemble.plan``: matched by grade id; tampering and suspicious code become flags);
2. ``flag``: those flags, and the reasons that void the whole submission (``plan.forgery``), onto
   the notebook (``metadata.gpucourse``) for a person to read;
3. ``observe``: the answers and the release's code cells run in the sandbox with every check's
   observer; each cell's output lands on its cell, the observations (plain JSON) in the submission;
4. ``judge``: the judges, here, on those observations: a ✓/✗ report and a score on each test cell.

``record.py`` goes on with ``save_grades`` and ``late_penalty`` (the gradebook's only writer).

Only this (trusted) process judges and writes grades. From the sandbox it accepts JSON lines on a
pipe of its own and nothing else, in the runner's protocol (``protocol``): one record per cell in
order, then exactly one observation per case in the job's order, then ``done``; anything else (a
record before its time, a duplicate, out of order, not JSON, after ``done``) is forgery. The
observers go to the sandbox on a second pipe, which the runner reads only after the cells.

Each check is a ``context.CaseRef`` (exercise, public or hidden, index); its string form
``<exercise>/<kind>/<index>`` is what travels to the sandbox and back. The budgets and limits come
from ``settings.Grading`` (nbgrader_config.py).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import queue
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import nbformat

import gpucourse.checks as public
from gpucourse import environment
from gpucourse.checks.seeded import global_rng

from . import assemble, sandbox
from .context import CaseRef, SandboxOptions, Submission
from .course import AUTOGRADERS, ROOT
from .settings import Grading

META = "gpucourse"  # the steps' findings in notebook and cell metadata
WORKER = "autograders.worker"  # the sandboxed program: python -m WORKER RESULTS_FD OBSERVERS_FD < job.json


@dataclass
class Graded:
    """One submission after the engine's steps: the autograded notebook so far, and what they found."""

    nb: nbformat.NotebookNode
    submission: Submission


def hidden_path(assignment: str) -> Path:
    """The file that holds ``assignment``'s HIDDEN: ``autograders/checks/<assignment>.py``, or its package's
    ``__init__.py``."""
    package = AUTOGRADERS / "checks" / assignment / "__init__.py"
    return package if package.is_file() else AUTOGRADERS / "checks" / f"{assignment}.py"


def load_checks(assignment: str):
    """The hidden checks of ``assignment``: the module ``autograders.checks.<assignment>`` (a file, or a package
    of one module per exercise), whose HIDDEN holds the hidden cases of each exercise the assignment's public
    check module declares (gpucourse.checks.register)."""
    path = hidden_path(assignment)
    if not path.is_file():
        raise SystemExit(f"no check file {path.relative_to(ROOT)} for assignment {assignment}")
    module = importlib.import_module(f"autograders.checks.{assignment}")
    declared = {e.name for e in public.exercises(assignment)}
    unknown = sorted(set(module.HIDDEN) - declared)
    if unknown:
        raise SystemExit(f"{path.relative_to(ROOT)}: hidden cases for {unknown}, which {assignment} does not declare")
    return module


def exercise_of_test(assignment: str) -> dict[str, str]:
    """The test cells the assignment's notebook must have, each with the exercise it grades (from the
    declarations: gpucourse.checks.EXERCISES is the registry, exercise name -> its declaration)."""
    return {e.test_id: e.name for e in public.exercises(assignment)}


def cases_for(checks, exercise: str) -> list[tuple[CaseRef, public.Case]]:
    """The exercise's public cases, then its hidden ones (``checks``: ``load_checks``)."""
    named = [(CaseRef(exercise, "public", i), c) for i, c in enumerate(public.public_cases(exercise))]
    return named + [(CaseRef(exercise, "hidden", i), c) for i, c in enumerate(checks.HIDDEN.get(exercise, []))]


def tests_of(nb) -> dict[str, float]:
    """The notebook's auto-graded test cells: grade id -> points (from the release, never the submission)."""
    return {assemble.nbgrader_meta(c)["grade_id"]: float(assemble.nbgrader_meta(c).get("points", 0)) for c in nb["cells"]
            if assemble.nbgrader_meta(c).get("grade") and not assemble.nbgrader_meta(c).get("solution")}


def cases_of(nb, checks, assignment: str) -> dict[str, list[tuple[CaseRef, public.Case]]]:
    """Every test cell's cases, public then hidden."""
    tests, graded = tests_of(nb), exercise_of_test(assignment)
    unknown = sorted(set(tests) - set(graded))
    if unknown:
        raise SystemExit(f"{assignment}: test cells {unknown} grade no exercise its check module declares")
    return {test: cases_for(checks, graded[test]) for test in tests}


def _meta(node) -> dict:
    return node.setdefault("metadata", {}).setdefault(META, {})


# --- 1. take the answers -----------------------------------------------------------------------------

def take_answers(nb, sub: Submission):
    """Released notebook in; out, the same notebook with the student's answers in its answer cells
    and no outputs. Reads ``sub.submitted``; sets ``plan`` and ``answers``. Nothing but the answers'
    sources is taken from the submission."""
    submitted, read_flags = assemble.read_submission(sub.submitted, sub.grading.notebook_bytes)
    plan = assemble.plan(nb, submitted, read_flags)
    for cell in nb["cells"]:
        grade_id = assemble.nbgrader_meta(cell).get("grade_id")
        if assemble.nbgrader_meta(cell).get("solution") and plan.answers.get(grade_id) is not None:
            cell["source"] = plan.answers[grade_id]
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    sub.plan, sub.answers = plan, plan.answers
    return nb, sub


# --- 2. flag -----------------------------------------------------------------------------------------

def flag(nb, sub: Submission):
    """Puts what a person should look at on the notebook: ``metadata.gpucourse.flags`` (and each
    answer's own on its cell), and ``forgery``, the reasons that zero every score of the submission.
    Both go to ``sub.flags`` and ``sub.forgery`` too; a forgery reason is always a flag."""
    plan = sub.plan
    forgery = [str(reason) for reason in getattr(plan, "forgery", [])]
    flags = list(plan.flags) + [reason for reason in forgery if reason not in plan.flags]
    _meta(nb).update(flags=flags, forgery=forgery)
    for cell in nb["cells"]:
        grade_id = assemble.nbgrader_meta(cell).get("grade_id")
        own = [f for f in flags if grade_id and f.startswith(f"answer {grade_id}:")]
        if own:
            _meta(cell)["flags"] = own
    sub.flags, sub.forgery = flags, forgery
    return nb, sub


# --- 3. observe, in the sandbox ----------------------------------------------------------------------

def _observer(ref: CaseRef, case: public.Case, inputs) -> dict:
    observer = {"case": str(ref), "source": inspect.getsource(case.observe), "function": case.observe.__name__}
    return observer if case.draw is None else {**observer, "inputs": inputs}


def draw_inputs(seed: int, named) -> dict[CaseRef, object]:
    """The inputs of every case that draws them (``Case.draw``), each from its own generator seeded by
    ``seed``, the exercise and the draw function: the same seed gives the same inputs whatever the
    order or the cases around it (a regrade with ``c.Grading.seed`` sees what the first grading saw),
    and the cases of one exercise that share a draw function share its inputs (so a multi-process
    exercise's cases share one launch: ``gpucourse.checks.ddp`` launches a source once per inputs)."""
    import random

    def rng(ref, case):
        draw = getattr(case.draw, "__qualname__", None) or repr(case.draw)
        return random.Random(f"{seed}/{ref.exercise}/{draw}")

    return {ref: case.inputs(rng(ref, case)) for ref, case in named if case.draw is not None}


def grading_seed(grading: Grading) -> int:
    """The seed of one submission's inputs: ``c.Grading.seed`` when set (to reproduce a grading), else
    drawn here, from the operating system, for this submission alone."""
    import secrets

    return grading.seed if grading.seed is not None else secrets.randbits(63)


def _env(grading: Grading) -> dict[str, str]:
    """The sandbox's whole environment; the course's variables (gpucourse.environment) cross into it here."""
    return {"PATH": os.defpath, "HOME": "/tmp", "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1",
            environment.SMOKE: "1" if grading.smoke else "0", environment.OFFLINE: "1", **sandbox.ONE_THREAD_ENV,
            "PYTHONPATH": str(ROOT)}  # where the sandbox imports autograders.worker (visible: it alone)


def _read_results(fd: int, sink: list[bytes], limit: int) -> None:
    total = 0
    with os.fdopen(fd, "rb") as pipe:
        for chunk in iter(lambda: pipe.read(65536), b""):
            if total < limit:
                sink.append(chunk[:limit - total])
            total += len(chunk)


def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to a pipe and close it; stops when the reader is gone."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass
    finally:
        os.close(fd)


def _records(raw: bytes) -> tuple[list, bool]:
    """The runner's records, each line parsed (a line that is not a JSON object stays as it is, for
    ``protocol`` to refuse), up to its ``done``; whether ``done`` came. What follows ``done`` is kept
    too: the runner writes nothing after it."""
    records, finished = [], False
    lines = raw.split(b"\n")[:-1]  # the runner ends every record with a newline: a cut last line is left out
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            record = line[:200]
        records.append(record)
        finished = finished or (isinstance(record, dict) and record.get("type") == "done")
    return records, finished


def protocol(records: list, cell_count: int, case_ids: list[str]) -> tuple[list[dict], list[str], list[str]]:
    """The records as the runner writes them, or why not: one record per cell, in order; then, after
    the last cell, exactly one observation per case in the job's order (the run may end early: the
    rest have none); ``flag`` records from the runner's supervisor anywhere; nothing after ``done``.
    Returns (the records to apply, the runner's flags, what broke the protocol: a forgery)."""
    accepted, flags, broken = [], [], []
    cells = observed = 0
    finished = False
    for record in records:
        kind = record.get("type") if isinstance(record, dict) else None
        if finished:
            broken.append(f"a record after done ({str(kind or record)[:60]})")
        elif kind == "flag":
            flags.append((str(record.get("reason", "flagged by the runner"))[:1000], record.get("forgery") is True))
        elif kind == "done":
            finished = True
        elif kind == "cell" and record.get("index") == cells and cells < cell_count:
            accepted.append(record)
            cells += 1
        elif kind == "observation" and cells == cell_count and observed < len(case_ids) and record.get("case") == case_ids[observed]:
            accepted.append(record)
            observed += 1
        elif kind == "cell":
            broken.append(f"cell record {str(record.get('index'))[:20]} out of turn (cell {cells} was due)")
        elif kind == "observation":
            due = f"case {case_ids[observed]}" if cells == cell_count and observed < len(case_ids) else "none"
            broken.append(f"observation of {str(record.get('case'))[:80]} out of turn ({due} was due)")
        else:
            broken.append(f"a record that is not the runner's ({str(kind or record)[:60]})")
    return accepted, flags, broken[:5]


def _cell_outputs(record: dict) -> list[dict]:
    outputs = []
    if record.get("output"):
        outputs.append(nbformat.v4.new_output("stream", name="stdout", text=str(record["output"])))
    if record.get("error"):
        error = str(record["error"])[:2000]
        outputs.append(nbformat.v4.new_output("error", ename="Error", evalue=error, traceback=[error]))
    return outputs


def apply_records(nb, sub: Submission, records: list) -> None:
    """The runner's records, checked against the protocol (``protocol``), onto the notebook (each
    cell's output and error on the cell it ran) and into ``sub.observations``. A record out of turn
    is a forgery (it zeroes the submission), and so is the supervisor's flag that the worker wrote out
    of turn; its other flags (a run it could not judge: not quiet after the cells, twice) are for a
    person to read, and zero nothing."""
    plan = sub.plan
    refs = [ref for named in cases_of(nb, sub.checks, sub.assignment).values() for ref, _ in named]
    by_text = {str(ref): ref for ref in refs}
    records, flags, broken = protocol(records, len(plan.cells), list(by_text))
    reasons = flags + ([(f"the run's records broke the grader's protocol: {'; '.join(broken)}", True)] if broken else [])
    for reason, forgery in reasons:
        if forgery:
            sub.forgery = sub.forgery + [reason]
            _meta(nb).setdefault("forgery", []).append(reason)
        sub.flags = sub.flags + [reason]
        _meta(nb).setdefault("flags", []).append(reason)
    for record in records:
        if record.get("type") == "cell" and isinstance(record.get("index"), int) and 0 <= record["index"] < len(plan.cells):
            nb["cells"][plan.cells[record["index"]]["template_index"]]["outputs"] = _cell_outputs(record)
        elif record.get("type") == "observation":  # protocol accepted only the job's cases, in its order
            sub.observations.setdefault(by_text[record["case"]], record)


def observe(nb, sub: Submission):
    """Runs the plan's cells, then every public and hidden case's observer, in a fresh sandbox
    (``sub.sandbox``, with ``sub.grading``'s budgets); sets ``observations``, ``notes``, ``log`` and
    ``seconds`` and puts each cell's output on it. An unreadable submission runs nothing (every case
    has no observation)."""
    plan, options, grading = sub.plan, sub.sandbox, sub.grading
    if not plan.readable:
        return nb, sub
    limits, preloads = options.limits, options.preloads
    cases = cases_of(nb, sub.checks, sub.assignment)
    named = [pair for pairs in cases.values() for pair in pairs]
    # the inputs of the cases that draw them: chosen now, from a seed of this submission's, and sent
    # with the observers, after the last cell; the judges compare with references only this side holds
    sub.seed = grading_seed(grading)
    sub.inputs = draw_inputs(sub.seed, named)
    _meta(nb)["seed"] = sub.seed
    job = {"cells": [{"source": c["source"], "grade_id": c["grade_id"]} for c in plan.cells],
           # one stuck cell or check costs a fraction of the wall time, not the whole run; the sandbox
           # side reads the grader's other settings from here too (settings.Grading.job_settings)
           **grading.job_settings(limits.wall_seconds)}
    # the observers (hidden ones' source and inputs) on a pipe of their own, which the runner reads
    # only once the cells are done: no cell can read them
    observers = json.dumps([_observer(ref, case, sub.inputs.get(ref)) for ref, case in named]).encode()
    box = options.work / ".sandbox" / f"{sub.student}__{sub.assignment}"
    if box.exists():
        shutil.rmtree(box)
    box.mkdir(parents=True)
    read_end, write_end = os.pipe()
    observers_r, observers_w = os.pipe()
    sink: list[bytes] = []
    reader = threading.Thread(target=_read_results, args=(read_end, sink, grading.results_bytes), daemon=True)
    reader.start()
    threading.Thread(target=_write_all, args=(observers_w, observers), daemon=True).start()
    server = preloads.take() if preloads is not None else None
    try:
        outcome = sandbox.run([sys.executable, "-m", WORKER, str(write_end), str(observers_r)], box,
                              env=_env(grading), hide=options.hide, limits=limits, isolate=options.isolate,
                              stdin=json.dumps(job).encode(), pass_fds=(write_end, observers_r), preloaded=server)
    finally:
        if server is not None:
            preloads.give(server)
    reader.join(timeout=30)
    shutil.rmtree(box, ignore_errors=True)
    records, finished = _records(b"".join(sink))
    sub.seconds = outcome.seconds
    sub.notes += outcome.notes
    if not finished:
        sub.notes.append("the run ended before all checks ran" + (" (out of time)" if outcome.timed_out else
                                                                 f" (exit code {outcome.returncode})"))
    apply_records(nb, sub, records)
    sub.notes += infrastructure(sub.observations)
    sub.log = outcome.output
    return nb, sub


def infrastructure(observations: dict[CaseRef, dict]) -> list[str]:
    """Why launches failed for reasons of the machine's, not the answer's (``gpucourse.checks.ddp``
    tried each again first): notes a person reads in flagged.txt, never a silent 0."""
    found = []
    for ref, observation in observations.items():
        data = observation.get("data")
        if isinstance(data, dict) and data.get("infrastructure"):
            reason = (f"a multi-process launch failed for reasons of the machine ({str(data['infrastructure'])[:200]}): "
                      f"regrade {ref.exercise}")
            if reason not in found:
                found.append(reason)
    return found


# --- 4. judge, here ----------------------------------------------------------------------------------

def _judge(case: public.Case, observation: dict | None, inputs=None) -> str | None:
    if observation is None:
        return "no observation (the run ended before this check)"
    if not observation.get("ok"):
        if observation.get("answer") is True:  # a missing or mistyped answer: "define `choices` (...)"
            return str(observation.get("error", "an answer is missing"))
        return f"raised {observation.get('error', 'an error')}"
    try:
        # One judge at a time holds torch's global generator (gpucourse.checks.seeded): the pool judges in several
        # threads, and a judge that seeds it and rebuilds a model must see no other judge's draws in between
        # (one that builds an nn.Linear consumes it too). ``seen``: the supervisor's own measurement of the worker,
        # from outside it (Case.seen).
        with global_rng():
            return case.judge_with(observation.get("data"), inputs, observation.get("seen"))
    except public.NotJudged:  # the machine failed, not the answer: ``judge`` tells a person
        raise
    except Exception as error:  # malformed data is a failed check, not a grader crash
        return f"unexpected data ({type(error).__name__})"


def judge(nb, sub: Submission):
    """Judges every case's observation; on each test cell, its ✓/✗ lines as output (and an error
    output when a check failed) and ``metadata.gpucourse`` ``score``/``max_score``. A test scores
    its points when every case passed, else 0; any ``forgery`` reason scores every test 0 and says so
    on its first line. Sets ``scores``, ``max_scores`` and ``report``."""
    cases = cases_of(nb, sub.checks, sub.assignment)
    tests, observations, forgery = tests_of(nb), sub.observations, sub.forgery
    scores, report = {}, {}
    for test, named in cases.items():
        lines = [f"scored 0: {'; '.join(forgery)}"] if forgery else []
        passed = not forgery
        for ref, case in named:
            try:
                verdict = _judge(case, observations.get(ref), sub.inputs.get(ref))
            except public.NotJudged as error:  # scored 0 for now, never silently: flagged.txt says why
                verdict = f"not judged: {error}; the instructor is told, to grade it again"
                note = f"{ref.exercise}: a check could not be judged ({error}): grade it again"
                if note not in sub.notes:
                    sub.notes.append(note)
            label = ("hidden check: " if ref.hidden else "") + case.name
            lines.append(f"✓ {label}" if verdict is None else f"✗ {label}: {verdict}")
            passed = passed and verdict is None
        report[test], scores[test] = lines, tests[test] if passed else 0.0
    for cell in nb["cells"]:
        test = assemble.nbgrader_meta(cell).get("grade_id")
        if test not in report or cell["cell_type"] != "code":
            continue
        cell["outputs"] = [nbformat.v4.new_output("stream", name="stdout", text="\n".join(report[test]) + "\n")]
        if scores[test] < tests[test]:
            cell["outputs"].append(nbformat.v4.new_output("error", ename="CheckFailed",
                                                          evalue="some checks failed (see above)", traceback=[]))
        _meta(cell).update(score=scores[test], max_score=tests[test])
    sub.scores, sub.max_scores, sub.report = scores, tests, report
    return nb, sub


STEPS = (take_answers, flag, observe, judge)


def run(nb, sub: Submission, steps=STEPS):
    for step in steps:
        nb, sub = step(nb, sub)
    return nb, sub


def forks() -> bool:
    """Whether runs here can be forked from a preloaded Python: not under bubblewrap, which must
    start the program it confines (sandbox.py)."""
    probe = getattr(sandbox, "probe", None)
    return probe is None or probe().method != "bwrap"


class Preloads:
    """Preloaded Pythons (sandbox.Preloaded) for the sandboxes, one per grading worker at a time,
    started on first use or ahead (``start``): a submission's run is forked from one instead of
    starting Python and importing torch and Lightning again. ``with Preloads() as preloads:`` stops
    them afterwards. ``grading``: the settings the sandboxes' environment comes from (``_env``)."""

    def __init__(self, grading: Grading | None = None):
        self._env = _env(grading or Grading())
        self._idle: queue.SimpleQueue[sandbox.Preloaded] = queue.SimpleQueue()
        self._started: list[sandbox.Preloaded] = []
        self._lock = threading.Lock()

    def _new(self) -> sandbox.Preloaded:
        server = sandbox.Preloaded(self._env)
        with self._lock:
            self._started.append(server)
        return server

    def start(self, count: int) -> None:
        """Start ``count`` now: their imports run while the caller does something else."""
        for _ in range(count):
            self._idle.put(self._new())

    def take(self) -> sandbox.Preloaded | None:
        if not forks():
            return None
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return self._new()

    def give(self, server: sandbox.Preloaded | None) -> None:
        if server is not None:
            self._idle.put(server)

    def __enter__(self) -> "Preloads":
        return self

    def __exit__(self, *exc) -> None:
        for server in self._started:
            server.close()


def start(work: Path, student: str, assignment: str, released_path: Path, options: SandboxOptions,
          grading: Grading | None = None) -> tuple[nbformat.NotebookNode, Submission]:
    """The chain's input for one submission: the released notebook, and the Submission the steps fill."""
    nb = nbformat.reads(released_path.read_text(), as_version=4)
    return nb, Submission(student, assignment, released_path.stem,
                          submitted=work / "submitted" / student / assignment / released_path.name,
                          checks=load_checks(assignment), grading=grading or Grading(), sandbox=options)


def grade_submission(work: Path, student: str, assignment: str, released_path: Path, options: SandboxOptions,
                     grading: Grading | None = None) -> Graded:
    """Every step about one submission up to its grades (``STEPS``); writing them down is record.py's."""
    return Graded(*run(*start(work, student, assignment, released_path, options, grading)))


def cost(nb, submitted: Path, assignment: str) -> int:
    """How many multi-process exercises a submission answered: each is a ``torchrun`` launch of
    three Pythons importing torch, far more than anything else a run does. Graded most first, a
    class ends with quick submissions instead of one long one on a single worker."""
    scripts = {e.name for e in public.exercises(assignment) if isinstance(e.kind, public.Script)}
    submission, _ = assemble.read_submission(submitted) if scripts else (None, [])
    if submission is None:
        return 0
    stubs = {assemble.nbgrader_meta(c).get("grade_id"): c["source"] for c in nb["cells"]}
    answers = assemble.plan(nb, submission).answers
    return sum(1 for grade_id in scripts if answers.get(grade_id) not in (None, stubs.get(grade_id)))

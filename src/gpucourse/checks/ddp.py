"""Run a multi-process exercise the way real training runs: a script, launched by torchrun.

Taught in lesson 1, exercise 5, and lesson 7 (multi-GPU exercises as scripts). The student's
exercise cell becomes ``student.py``; ``torchrun --standalone --nproc-per-node=2`` starts two ranks
of ``gpucourse.checks.ddp_harness`` (gloo on CPU, NCCL when there are GPUs) on a free port; each
rank runs the exercise's *driver* on the student's code and writes what it found to
``rank<N>.json``; a judge then compares all ranks' files, not a line that rank 0 printed. The launch
and the reading are the lessons' own (``gpucourse.launch``): a launch that runs out of time takes
every rank with it. How a launch is made is a frozen ``LaunchPolicy``: the defaults outside grading;
while grading, the grader's, installed for its whole run with ``launch_policy(...)``: its launcher
forks the launcher and ranks from a clean copy of its runner instead of starting Pythons, and
protects each rank as it protects the cells (same harness, environment and reports), with the
exercise sources as the grader read them from the submission. This module imports nothing of the grader.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping

from gpucourse.launch import read_rank_reports, torchrun

WORLD_SIZE = 2
HEADER = "import os\nimport torch\nimport torch.distributed as dist\n\n"


@dataclass(frozen=True)
class LaunchPolicy:
    """How ``run_exercise_script`` launches an exercise's script.

    ``launcher``: None starts ``torchrun -m gpucourse.checks.ddp_harness`` (a student's own check);
    else ``launcher(target, nproc=, timeout=, cwd=, source=)`` returning a ``gpucourse.launch.Launch``
    (the grader's: forked from its runner's clean copy, or torchrun on its protected rank).
    ``tries``: launches that failed for a reason of the machine's (``INFRASTRUCTURE``) are tried again,
    up to this many in all. ``script_seconds``: the whole launch's time; collectives time out sooner
    (``gpucourse.launch.collective_timeout``). ``sources``: each exercise's source as the grader read it
    from the submission (exercise name -> text); an exercise not in it is read from the notebook.
    """

    launcher: Callable | None = None
    tries: int = 3
    script_seconds: float = 180.0
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if int(self.tries) < 1 or not self.script_seconds > 0:
            raise ValueError(f"a launch policy needs tries >= 1 and script_seconds > 0, not {self.tries}, {self.script_seconds}")
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))


DEFAULT_POLICY = LaunchPolicy()
_policy = DEFAULT_POLICY  # written only by launch_policy(), below


def policy() -> LaunchPolicy:
    """The launch policy in force: ``DEFAULT_POLICY`` unless ``launch_policy`` installed another."""
    return _policy


@contextmanager
def launch_policy(chosen: LaunchPolicy):
    """Launch with ``chosen`` inside the ``with`` block (the grader's worker: its whole run), then as before."""
    global _policy
    if not isinstance(chosen, LaunchPolicy):
        raise TypeError(f"launch_policy needs a LaunchPolicy, not {type(chosen).__name__}")
    previous, _policy = _policy, chosen
    try:
        yield chosen
    finally:
        _policy = previous


def _defined_names(source: str) -> set[str]:
    try:
        return {node.name for node in ast.parse(source).body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    except SyntaxError:
        return set()


def exercise_source(ns: dict, exercise: str, names: list[str]) -> str:
    """The exercise cell's source: the launch policy's (what the grader read from the submission); in a
    notebook, the latest cells that define ``names`` (IPython keeps them in ``In``: whole cells, so their
    imports come along); else the definitions themselves (``inspect``, which cannot find classes
    defined in a notebook)."""
    given = _policy.sources.get(exercise)
    if given is not None:
        return given
    history = ns.get("In")
    if isinstance(history, list):
        cells: list[str] = []
        for name in names:
            cell = next((c for c in reversed(history) if isinstance(c, str) and name in _defined_names(c)), None)
            if cell is None:
                break
            if cell not in cells:
                cells.append(cell)
        else:
            return HEADER + "\n\n".join(cells)
    return HEADER + "\n\n".join(inspect.getsource(ns[name]) for name in names)


def unanswered(source: str, names: list[str]) -> list[str]:
    """The functions among ``names`` whose body is still the release's ``raise NotImplementedError``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0]):
                found.append(node.name)
    return found


_LAUNCHED: dict[tuple[str, int, str, str], dict] = {}  # one launch per source and inputs: cases share it


def forget_launches() -> None:
    """Launch again from now on (the grader's worker, once the cells are done: launches are the checks' own)."""
    _LAUNCHED.clear()


def run_exercise_script(ns: dict, exercise: str, inputs=None, world_size: int | None = None) -> dict:
    """Launch the exercise as its declared script (``register(..., kind=Script(names, world_size, driver))``):
    every rank's record, exit code and log tail.

    ``driver`` ("module:function") is what each rank does with the student's code (see ddp_harness);
    ``inputs`` (plain JSON data, e.g. sizes a hidden case generated) reach it as ``drive(ns, inputs)``;
    ``world_size`` launches another number of ranks than the declaration's (a hidden case's 3 ranks).
    """
    from gpucourse.checks import answer_problem, exercises

    script = next(e.kind for e in exercises() if e.name == exercise)
    names, world_size, driver = list(script.names), world_size or script.world_size, script.driver

    problems = [problem for problem in (answer_problem(ns, name) for name in names) if problem]
    if problems:  # the same words as every other check: "define `shard_indices` (a function ...)"
        return {"returncode": "not run", "ranks": {}, "tail": "; ".join(problems)}
    source = exercise_source(ns, exercise, names)
    todo = unanswered(source, names)
    if todo:  # launching two processes to meet a NotImplementedError costs seconds and says nothing
        return {"returncode": "not run", "ranks": {}, "tail": f"not answered yet: {', '.join(todo)}"}
    key = (source, world_size, driver, json.dumps(inputs, sort_keys=True))
    if key not in _LAUNCHED:
        try:
            _LAUNCHED[key] = _launch(source, world_size, driver, inputs)
        except BaseException:  # interrupted (a check's time ran out): never launch this source again
            _LAUNCHED[key] = {"returncode": "interrupted", "ranks": {}, "tail": "the launch was interrupted"}
            raise
    return _LAUNCHED[key]


# A launch that failed on its way up, not in the student's code: the rendezvous could not be reached
# or a thread or process could not start (a loaded machine). Tried again, then reported.
INFRASTRUCTURE = re.compile(r"Rendezvous(Connection|Timeout|Closed)Error|DistNetworkError|cannot join thread before it is started|"
                            r"can't start new thread|Resource temporarily unavailable")


def _launch(source: str, world_size: int, driver: str, inputs=None) -> dict:
    """``_launch_once``, again when it failed for a reason of the machine's (``INFRASTRUCTURE``), up to
    the policy's ``tries``; still failing, the record says so (``infrastructure``) and the grader flags it."""
    chosen = _policy
    for _ in range(chosen.tries):
        record, output = _launch_once(source, world_size, driver, inputs, chosen)
        failed = record["returncode"] not in (0, "timeout")
        why = INFRASTRUCTURE.search(output) if failed else None
        if why is None:
            return record
    return {**record, "infrastructure": f"{why.group(0)} in each of {chosen.tries} launches"}


def _launch_once(source: str, world_size: int, driver: str, inputs, chosen: LaunchPolicy) -> tuple[dict, str]:
    with tempfile.TemporaryDirectory(prefix="gpucourse-ddp-") as folder:
        work = Path(folder)
        (work / "student.py").write_text(source)
        if inputs is not None:
            (work / "inputs.json").write_text(json.dumps(inputs))
        target = [str(work / "student.py"), str(work), driver]
        if chosen.launcher is not None:  # grading: the grader's launcher
            launch = chosen.launcher(target, nproc=world_size, timeout=chosen.script_seconds, cwd=str(work), source=source)
        else:
            launch = torchrun(["-m", "gpucourse.checks.ddp_harness", *target], nproc=world_size,
                              timeout=chosen.script_seconds, cwd=work)
        reports = launch.reports if launch.reports is not None else read_rank_reports(work, strict=False)
        ranks = {str(rank): report for rank, report in reports.items()}
    tail = "\n".join(line for line in launch.output.splitlines() if line.strip())[-1500:]
    return {"returncode": "timeout" if launch.timed_out else launch.returncode, "ranks": ranks, "tail": tail}, launch.output


# What gloo says on a rank whose peer left the group while it waited in a collective (``settle``).
LOST_PEER = ("Connection closed by peer", "Connection reset by peer")


def settle(failed: bool) -> bool:
    """A driver's step between two runs of the student's code on every rank: whether all ranks may go on.
    A rank whose answer raised leaves the process group at once (``failed``): a peer may be waiting in a
    collective this rank will never join, and gloo ends that wait within milliseconds ("Connection closed
    by peer") instead of at the collective timeout (45 s). The other ranks meet at a barrier, which fails
    the same way when a peer has left. Afterwards ``leave()`` ends the group wherever it is still open."""
    import torch.distributed as dist

    if not failed:
        try:
            dist.barrier()
            return True
        except Exception:  # a peer raised and left: the group is broken for every later collective
            pass
    leave()
    return False


def leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def first_raised(ranks: dict, runs: int) -> tuple[int, str, str] | None:
    """The first run, by index, in which a rank's answer raised: (run, rank, error). A rank whose peer raised
    and left (``settle``) fails in its next collective with gloo's "Connection closed by peer": its error is
    the one given only when no rank has one of its own."""
    for i in range(runs):
        raised = [(rank, str(r["runs"][i]["error"])) for rank, r in sorted(ranks.items())
                  if isinstance(r.get("runs"), list) and i < len(r["runs"]) and isinstance(r["runs"][i], dict)
                  and "error" in r["runs"][i]]
        own = [(rank, error) for rank, error in raised if not any(words in error for words in LOST_PEER)]
        if raised:
            return (i, *(own or raised)[0])
    return None


def judge_script_ran(d: dict, world_size: int = WORLD_SIZE) -> str | None:
    """Judge of a launch (``run_exercise_script``'s record): every rank finished and reported, or why not."""
    if d["returncode"] == "not run":
        return d["tail"]
    if d["returncode"] != 0:
        return f"the {world_size}-process script did not finish (exit {d['returncode']}):\n{d['tail']}"
    expected = [str(r) for r in range(world_size)]
    if sorted(d["ranks"]) != expected or any("rank" not in r for r in d["ranks"].values()):
        return f"expected reports from ranks {', '.join(expected)}, got {sorted(d['ranks'])}"
    return None

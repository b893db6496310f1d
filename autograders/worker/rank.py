"""One rank of a graded multi-process launch: ``gpucourse.checks.ddp_harness`` with the runner's protection.

    torchrun --standalone --nproc-per-node=N -m autograders.worker.rank STUDENT OUT DRIVER

The zygote's forked ranks call ``main`` (``zygote._rank``); where the runner could not fork its
clean copy, graded launches start real ``torchrun`` on this module instead (``torchrun``, which the
worker passes in its ``gpucourse.checks.ddp.LaunchPolicy``). Either way a graded rank protects what it
observes as the runner does: the student's source runs with the modules of ``gpucourse.checks`` and
``autograders`` closed (``snapshot.Gate``), and whatever it or the student's functions patch in the
course, torch, Lightning, numpy or the standard library is put back (``snapshot.Snapshot``) before
the driver runs and again before the record is written.

A student's own ``check()`` in a notebook launches ``gpucourse.checks.ddp_harness`` directly,
unprotected: there is no adversary there, only the student's own code.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from gpucourse.checks import ddp_harness
from gpucourse.launch import exit_rank
from gpucourse.launch import torchrun as start_torchrun

from . import audit
from .snapshot import Gate, Snapshot

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding autograders/: on the ranks' path


class Protection:
    """Gate and snapshot around one rank's student source (``source``) and its driver (``driver``).
    Made after the driver's module is imported: the snapshot holds it and what it imported.
    ``base``: a snapshot taken earlier by the grader's own code (``base()``), brought up to date by
    the rank (``Snapshot.rebase``) before the student's code runs, instead of a new one."""

    def __init__(self, base: Snapshot | None = None):
        self.gate = Gate()
        self.gate.close()
        self.taken = Snapshot(closed=self.gate.modules) if base is None else base

    @contextlib.contextmanager
    def source(self):
        try:
            yield
        finally:
            self.taken.restore()
            self.gate.open()

    @contextlib.contextmanager
    def driver(self):
        try:
            yield
        finally:
            self.taken.restore()  # the student's functions ran inside the driver


def base() -> Snapshot:
    """A snapshot of the clean copy, with the modules a rank closes closed as they will be: taken once
    per copy (``zygote.serve``, while the cells run in the worker), so that a launch's ranks only read
    again what changed since (``Snapshot.rebase``: about 50 ms) instead of each taking its own
    (about 0.4 s of CPU where Lightning is loaded, on the same cores as the other ranks)."""
    gate = Gate()
    gate.close()
    try:
        return Snapshot(closed=gate.modules)
    finally:
        gate.open()


def prepare(driver: str, out: str, taken: Snapshot | None = None) -> tuple:
    """What a rank needs before the student's source runs: the driver, its inputs and the
    ``Protection`` (made after the driver's import). The forked launcher makes it once per launch
    from the copy's ``base()`` (``taken``), before it forks the ranks, which inherit it and
    ``rebase`` it; nothing of the student's has run in the launcher or the copy."""
    drive_, inputs = ddp_harness.load_driver(driver, out)
    return drive_, inputs, Protection(taken)


def main(student: str, out: str, driver: str, report: int | None = None, prepared: tuple | None = None) -> None:
    """``ddp_harness``'s steps with ``Protection`` around the student's source and the driver; the
    record goes to ``report`` (the pipe the forked launcher handed this rank alone), else to
    ``OUT/rank<RANK>.json`` as the harness writes it. ``prepared``: ``prepare(driver, out)``, made
    by the launcher (made here when None)."""
    dumps, write = json.dumps, Path(out, f"rank{os.environ['RANK']}.json").write_text  # before the student's code
    if prepared is None:
        drive_, inputs, guard = prepare(driver, out)
    else:  # the launcher's: what the grader's code changed since (multiprocessing's state of this child,
        drive_, inputs, guard = prepared  # the launcher's imports), read before this rank's student code
        guard.taken.rebase(closed=guard.gate.modules)
    audit.watch(student, f"the script on rank {os.environ['RANK']}")
    with guard.source():
        namespace = ddp_harness.run_source(student)
    with guard.driver():
        record = ddp_harness.drive(drive_, namespace, inputs)
    if report is None:
        write(dumps(record))
        return
    # with what the audit hook saw the script do (for a person: the supervisor flags it)
    data = memoryview((dumps({"report": record, "tampering": audit.findings()}) + "\n").encode())
    while data:
        data = data[os.write(report, data):]
    os.close(report)


def torchrun(target: list[str], nproc: int, timeout: float, cwd: str, source: str | None = None):
    """A graded launch without the clean copy: real ``torchrun`` on this module (a
    ``gpucourse.checks.ddp.LaunchPolicy`` launcher; ``source`` is already in ``target[0]``)."""
    path = os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))
    return start_torchrun(["-m", "autograders.worker.rank", *target], nproc=nproc,
                          timeout=timeout, cwd=cwd, env={"PYTHONPATH": path})

if __name__ == "__main__":
    main(*sys.argv[1:4])
    exit_rank()  # its report written: skips the interpreter's shutdown, where a rank can abort (launch.exit_rank)

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
from gpucourse.launch import torchrun as start_torchrun

from .snapshot import Gate, Snapshot

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding autograders/: on the ranks' path


class Protection:
    """Gate and snapshot around one rank's student source (``source``) and its driver (``driver``).
    Made after the driver's module is imported: the snapshot holds it and what it imported."""

    def __init__(self):
        self.gate = Gate()
        self.gate.close()
        self.taken = Snapshot(closed=self.gate.modules)

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


def main(student: str, out: str, driver: str, report: int | None = None) -> None:
    """``ddp_harness``'s steps with ``Protection`` around the student's source and the driver; the
    record goes to ``report`` (the pipe the forked launcher handed this rank alone), else to
    ``OUT/rank<RANK>.json`` as the harness writes it."""
    drive_, inputs = ddp_harness.load_driver(driver, out)
    dumps, write = json.dumps, Path(out, f"rank{os.environ['RANK']}.json").write_text  # before the student's code
    guard = Protection()  # after the driver's import: its snapshot holds the driver
    with guard.source():
        namespace = ddp_harness.run_source(student)
    with guard.driver():
        record = ddp_harness.drive(drive_, namespace, inputs)
    if report is None:
        write(dumps(record))
        return
    data = memoryview((dumps(record) + "\n").encode())
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

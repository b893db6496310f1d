"""One rank of a multi-process exercise (see gpucourse.checks.ddp). Started by torchrun, never by hand.

    torchrun --standalone --nproc-per-node=2 -m gpucourse.checks.ddp_harness student.py OUT DRIVER

``DRIVER`` (``module:function``) says what every rank does with the student's code: it gets the
namespace the student's source ran in (and ``OUT/inputs.json``, when the check wrote one, as a second
argument) and returns this rank's record (plain data), written to
``OUT/rank<RANK>.json``, or, when the grader's forked launcher started the rank, to the pipe it
handed this rank alone (``report``). Drivers that use torch.distributed directly start the process group with
``init_process_group()`` (the lessons' own, from gpucourse.launch); Lightning drivers let the Trainer start it.

A rank protects what it observes as the runner does (gpucourse.checks.runner): the student's source
runs with the modules of ``gpucourse.checks`` closed, and whatever it or the student's functions
patch in the course, torch, Lightning, numpy or the standard library is put back before the driver
runs and again before the record is written.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

# drivers import these from here: a collective waits COLLECTIVE_TIMEOUT, then fails every rank
from gpucourse.launch import COLLECTIVE_TIMEOUT, gpu_per_rank, init_process_group  # noqa: F401


def main(student: str, out: str, driver: str, report: int | None = None) -> None:
    from gpucourse.checks import runner

    module, function = driver.split(":")
    drive = getattr(importlib.import_module(module), function)
    inputs = Path(out, "inputs.json")  # what the case generated for the driver, when it did
    given = json.loads(inputs.read_text()) if inputs.is_file() else None
    dumps, write = json.dumps, Path(out, f"rank{os.environ['RANK']}.json").write_text
    gate = runner.Gate()  # the snapshot holds what is loaded now: the driver's module and what it imported
    gate.close()
    taken = runner.Snapshot(closed=gate.modules)
    namespace = {"__name__": "student"}
    try:
        exec(compile(Path(student).read_text(), student, "exec"), namespace)
    finally:
        taken.restore()
        gate.open()
    try:
        record = drive(namespace) if given is None else drive(namespace, given)
    finally:
        taken.restore()  # the student's functions ran inside the driver
    if report is None:
        write(dumps(record))
        return
    data = memoryview((dumps(record) + "\n").encode())
    while data:
        data = data[os.write(report, data):]
    os.close(report)


if __name__ == "__main__":
    main(*sys.argv[1:4])

"""One rank of a multi-process exercise (see gpucourse.checks.ddp). Started by torchrun, never by hand.

    torchrun --standalone --nproc-per-node=2 -m gpucourse.checks.ddp_harness student.py OUT DRIVER

``DRIVER`` (``module:function``) says what every rank does with the student's code: it gets the
namespace the student's source ran in (and ``OUT/inputs.json``, when the check wrote one, as a second
argument) and returns this rank's record (plain data), written to
``OUT/rank<RANK>.json``, or, when the grader's forked launcher started the rank, to the pipe it
handed this rank alone (``report``). Drivers that use torch.distributed directly start the process group with
``init_process_group()`` (the lessons' own, from gpucourse.launch); Lightning drivers let the Trainer start it.
Either way this module ends it after the driver (``close_process_group``), so that every rank exits cleanly.

``protect``: while grading, the grader's own rank entry point (which wraps this one) passes a
factory, called once the driver's module is imported; the object it makes has two context managers,
``source()`` around running the student's source and ``driver()`` around the driver. The grader's
closes the checks' modules while the source runs and puts back whatever the student's code patched,
as its runner does around every cell. A student's own ``check()`` runs this module unprotected: no
adversary there. This module imports nothing of the grader.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
from pathlib import Path

# drivers import these from here: a collective waits COLLECTIVE_TIMEOUT, then fails every rank
from gpucourse.launch import COLLECTIVE_TIMEOUT, close_process_group, gpu_per_rank, init_process_group  # noqa: F401


def main(student: str, out: str, driver: str, report: int | None = None, protect=None) -> None:
    module, function = driver.split(":")
    drive = getattr(importlib.import_module(module), function)
    inputs = Path(out, "inputs.json")  # what the case generated for the driver, when it did
    given = json.loads(inputs.read_text()) if inputs.is_file() else None
    dumps, write = json.dumps, Path(out, f"rank{os.environ['RANK']}.json").write_text
    guard = protect() if protect is not None else None  # after the driver's import: its snapshot holds the driver
    namespace = {"__name__": "student"}
    with guard.source() if guard else contextlib.nullcontext():
        exec(compile(Path(student).read_text(), student, "exec"), namespace)
    with guard.driver() if guard else contextlib.nullcontext():
        record = drive(namespace) if given is None else drive(namespace, given)
    # A Lightning driver's Trainer leaves its gloo group to interpreter shutdown, where it can abort the
    # rank (SIGABRT): every rank ends torch.distributed here, whatever started it (a no-op when closed).
    close_process_group()
    if report is None:
        write(dumps(record))
        return
    data = memoryview((dumps(record) + "\n").encode())
    while data:
        data = data[os.write(report, data):]
    os.close(report)


if __name__ == "__main__":
    main(*sys.argv[1:4])

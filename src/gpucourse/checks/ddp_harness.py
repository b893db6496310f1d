"""One rank of a multi-process exercise (see gpucourse.checks.ddp). Started by torchrun, never by hand.

    torchrun --standalone --nproc-per-node=2 -m gpucourse.checks.ddp_harness student.py OUT DRIVER

``DRIVER`` (``module:function``) says what every rank does with the student's code: it gets the
namespace the student's source ran in (and ``OUT/inputs.json``, when the check wrote one, as a second
argument) and returns this rank's record (plain data), written to ``OUT/rank<RANK>.json``. Drivers
that use torch.distributed directly start the process group with ``init_process_group()`` (the
lessons' own, from gpucourse.launch); Lightning drivers let the Trainer start it. Either way this
module ends it after the driver (``close_process_group``), and the rank's process after its report
(``exit_rank``), so that every rank exits cleanly.

``main`` is three steps (``load_driver``, ``run_source``, ``drive``) and a write. The grader's own
rank entry point composes the same steps with its protection around
them and its own way of reporting; this module imports nothing of the grader.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

# drivers import these from here: a collective waits collective_timeout(), then fails every rank
from gpucourse.launch import close_process_group, exit_rank, gpu_per_rank, init_process_group  # noqa: F401


def load_driver(driver: str, out: str):
    """The driver function (``module:function``) and the inputs the check wrote for it (None if none)."""
    module, function = driver.split(":")
    drive_ = getattr(importlib.import_module(module), function)
    inputs = Path(out, "inputs.json")  # what the case generated for the driver, when it did
    return drive_, (json.loads(inputs.read_text()) if inputs.is_file() else None)


def run_source(student: str) -> dict:
    """The namespace the student's script leaves after running it."""
    namespace = {"__name__": "student"}
    exec(compile(Path(student).read_text(), student, "exec"), namespace)
    return namespace


def drive(drive_, namespace: dict, inputs) -> object:
    """This rank's record: the driver on the student's namespace (and its inputs), then the process
    group closed (a Lightning driver's Trainer leaves its gloo group to interpreter shutdown, where it
    can abort the rank with SIGABRT; a no-op when already closed)."""
    record = drive_(namespace) if inputs is None else drive_(namespace, inputs)
    close_process_group()
    return record


def main(student: str, out: str, driver: str) -> None:
    drive_, inputs = load_driver(driver, out)
    record = drive(drive_, run_source(student), inputs)
    Path(out, f"rank{os.environ['RANK']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:4])
    exit_rank()  # its report written: skips the interpreter's shutdown, where a rank can abort (launch.exit_rank)

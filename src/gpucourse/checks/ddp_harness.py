"""One rank of a multi-process exercise (see gpucourse.checks.ddp). Started by torchrun, never by hand.

    torchrun --standalone --nproc-per-node=2 -m gpucourse.checks.ddp_harness student.py OUT DRIVER

``DRIVER`` (``module:function``) says what every rank does with the student's code: it gets the
namespace the student's source ran in (and ``OUT/inputs.json``, when the check wrote one, as a second
argument) and returns this rank's record (plain data), written to
``OUT/rank<RANK>.json``. Drivers that use torch.distributed directly start the process group with
``init_process_group()`` (the lessons' own, from gpucourse.launch); Lightning drivers let the Trainer start it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

# drivers import these from here: a collective waits COLLECTIVE_TIMEOUT, then fails every rank
from gpucourse.launch import COLLECTIVE_TIMEOUT, gpu_per_rank, init_process_group  # noqa: F401


def main(student: str, out: str, driver: str) -> None:
    module, function = driver.split(":")
    drive = getattr(importlib.import_module(module), function)
    namespace = {"__name__": "student"}
    exec(compile(Path(student).read_text(), student, "exec"), namespace)
    inputs = Path(out, "inputs.json")  # what the case generated for the driver, when it did
    record = drive(namespace, json.loads(inputs.read_text())) if inputs.is_file() else drive(namespace)
    Path(out, f"rank{os.environ['RANK']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:4])

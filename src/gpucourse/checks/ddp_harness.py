"""One rank of a multi-process exercise (see gpucourse.checks.ddp). Started by torchrun, never by hand.

    torchrun --standalone --nproc-per-node=2 -m gpucourse.checks.ddp_harness student.py OUT DRIVER

``DRIVER`` (``module:function``) says what every rank does with the student's code: it gets the
namespace the student's source ran in (and ``OUT/inputs.json``, when the check wrote one, as a second
argument) and returns this rank's record (plain data), written to
``OUT/rank<RANK>.json``. Drivers that use torch.distributed directly start the process group with
``init_process_group()`` below; Lightning drivers let the Trainer start it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

COLLECTIVE_TIMEOUT = timedelta(seconds=45)  # a rank that skips a collective fails the others by then


def gpu_per_rank() -> bool:
    """Whether every local rank can have a GPU of its own (NCCL refuses two ranks on one GPU)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def init_process_group():
    """Start torch.distributed for this rank: NCCL with one GPU per rank when there are enough, else gloo."""
    import torch
    import torch.distributed as dist

    use_cuda = gpu_per_rank()
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    return torch.device("cuda") if use_cuda else torch.device("cpu")


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

"""One rank of a multi-process exercise (see gpucourse.checks.ddp). Started by torchrun, never by hand.

    torchrun --standalone --nproc-per-node=2 -m gpucourse.checks.ddp_harness student.py OUT
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = timedelta(seconds=45)  # a rank that skips a collective fails the others by then


def main(student: str, out: str) -> None:
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if use_cuda else torch.device("cpu")

    namespace = {"__name__": "student"}
    exec(compile(Path(student).read_text(), student, "exec"), namespace)

    shards = {str(n): [int(i) for i in namespace["shard_indices"](n, rank, world)] for n in (10, 7)}
    x = torch.tensor([rank + 1.0, 10.0 * rank], device=device)
    before = x.clone()
    average = namespace["average_across_ranks"](x)
    record = {
        "rank": rank,
        "world_size": world,
        "shards": shards,
        "average": [float(v) for v in torch.as_tensor(average).detach().cpu().reshape(-1).tolist()],
        "input_unchanged": bool(torch.equal(x, before)),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])

"""What DistributedDataParallel does, by hand and for real. Taught in lesson 7 (multi-GPU exercises as scripts).

- ``regression_batch``: deterministic data where every rank gets its own shard of each step's batch;
- ``TinyNet``: a small model with one layer that ``forward`` never uses (DDP must be told about it);
- ``simulated_ranks``: data parallelism in one process, in plain Python, before the real thing;
- ``torchrun`` and ``read_rank_reports`` (from ``gpucourse.launch``): launch a script or module on N
  processes, as on a GPU machine, and read the report each rank wrote;
- ``python -m gpucourse.ddp_scripts``: a DDP training script (raw torch.distributed) that reports each
  rank's step time and a checksum of its weights, to run under torchrun on CPUs or GPUs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from gpucourse.launch import Launch, torchrun  # noqa: F401 (lesson 7 calls them from here: D.torchrun)
from gpucourse.launch import gpu_per_rank, init_process_group
from gpucourse.launch import read_rank_reports as _rank_reports

FEATURES = 4
TRUE_WEIGHTS = torch.tensor([1.5, -2.0, 0.5, 3.0])


def regression_batch(step: int, rank: int = 0, world_size: int = 1, per_rank: int = 8, seed: int = 0):
    """``(x, y)``: rank ``rank``'s shard of step ``step``'s global batch (``per_rank * world_size`` rows).

    Every rank computes the same global batch from the seed and keeps its own rows, the way a
    ``DistributedSampler`` hands each rank every ``world_size``-th sample.
    """
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    x = torch.randn(per_rank * world_size, FEATURES, generator=g)
    y = x @ TRUE_WEIGHTS + 0.1 * torch.randn(per_rank * world_size, generator=g)
    return x[rank::world_size], y[rank::world_size]


class TinyNet(nn.Module):
    """A two-layer regressor, plus ``spare``: a layer ``forward`` never uses, so its gradient stays None."""

    def __init__(self, hidden: int = 8):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.spare = nn.Linear(2, 2)

    def forward(self, x):
        return self.body(x).squeeze(-1)


def flat_grads(model: nn.Module) -> torch.Tensor:
    """All gradients in one vector (zeros where a parameter has none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()])


@dataclass
class Simulation:
    full_batch_grad: torch.Tensor
    averaged_grad: torch.Tensor
    per_rank_grads: list

    @property
    def max_difference(self) -> float:
        return float((self.full_batch_grad - self.averaged_grad).abs().max())


def simulated_ranks(model: nn.Module, x: torch.Tensor, y: torch.Tensor, world_size: int) -> Simulation:
    """Data parallelism in one process: each "rank" (a copy of the model) takes every ``world_size``-th
    row, computes its gradient, and the gradients are averaged. With a mean loss and equal shards
    the average equals the gradient of the whole batch: that is why DDP averages (not sums)."""
    loss_fn = nn.MSELoss()
    model.zero_grad()
    loss_fn(model(x), y).backward()
    full = flat_grads(model)
    grads = []
    for rank in range(world_size):
        replica = copy.deepcopy(model)
        replica.zero_grad()
        loss_fn(replica(x[rank::world_size]), y[rank::world_size]).backward()
        grads.append(flat_grads(replica))
    return Simulation(full, torch.stack(grads).mean(0), grads)


def read_rank_reports(folder: Path) -> list[dict]:
    """The ``rank<N>.json`` files a run of this module's script wrote, in rank order."""
    return list(_rank_reports(folder).values())


def train(steps: int, per_rank: int, hidden: int, out: Path) -> dict:
    """One rank of a DDP run: same initial weights everywhere, own shard each step, DDP averages gradients."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)  # different on purpose: DDP broadcasts rank 0's weights when it wraps the model
    model = DDP(TinyNet(hidden).to(device), device_ids=[device.index] if gpu_per_rank() else None,
                find_unused_parameters=True)  # `spare` gets no gradient: without this, step 2 raises
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()
    timings = []
    for step in range(steps):
        x, y = (t.to(device) for t in regression_batch(step, rank, world, per_rank))
        # a host clock per step of a real run: each step differs (DDP's buckets, all-reduce with the other
        # ranks), so it is timed as it happens, not repeated by a benchmark Timer; CUDA synchronized below
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()  # gradients are all-reduced in buckets while backward runs
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        timings.append(time.perf_counter() - start)
    weights = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()]).cpu()
    kept = timings[1:] or timings  # the first step also builds DDP's buckets
    median = sorted(kept)[len(kept) // 2]
    report = {"rank": rank, "world_size": world, "device": str(device), "backend": dist.get_backend(),
              "seconds_per_step": median, "samples_per_second": world * per_rank / median,
              "final_loss": float(loss), "weights_checksum": float(weights.double().sum()),
              "weights_head": [float(w) for w in weights[:4]]}
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A DDP training run; start it with torchrun "
                                                 "(python -m torch.distributed.run --nproc-per-node=N -m gpucourse.ddp_scripts).")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--per-rank", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<N>.json")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("start this script with torchrun: it needs RANK, WORLD_SIZE and MASTER_ADDR from it")
    train(args.steps, args.per_rank, args.hidden, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

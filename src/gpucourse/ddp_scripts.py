"""What DistributedDataParallel does, by hand and for real. Taught in lesson 7 (multi-GPU exercises as scripts).

- ``regression_batch``: deterministic data where every rank gets its own shard of each step's batch;
- ``TinyNet``: a small model with one layer that ``forward`` never uses (DDP must be told about it);
- ``simulated_ranks``: data parallelism in one process, in plain Python, before the real thing;
- ``torchrun`` and ``read_rank_reports`` (from ``gpucourse.launch``): launch a script or module on N
  processes, as on a GPU machine, and read the report each rank wrote;
- ``python -m gpucourse.ddp_scripts``: a DDP training script (raw torch.distributed) that reports each
  rank's step time and a checksum of its weights, to run under torchrun on CPUs or GPUs;
- ``ring_all_reduce`` and ``plot_ring_all_reduce``: the ring algorithm in one process, step by step, and
  its per-rank traffic 2(N-1)/N against N;
- ``ddp_timeline`` and ``plot_ddp_overlap``: a model of DDP's bucketed all-reduce overlapping backward;
- ``sampler_orders``: what DistributedSampler hands one rank each epoch, with and without ``set_epoch``;
- ``same_device_and_backend`` and ``plot_throughput``: 1 vs N processes, only ever on one device and backend.
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
from gpucourse.launch import close_process_group, collective_timeout, exit_rank, gpu_per_rank, init_process_group
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


DEVICES = ("auto", "cpu", "cuda")


def start_ranks(device: str = "auto") -> tuple[torch.device, str | None]:
    """Start torch.distributed on ``device``: "cuda" (NCCL, one GPU per process, or an error saying why
    not), "cpu" (gloo) or "auto" (NCCL when every process can have a GPU, else gloo). Returns the device
    and, when "auto" fell back from GPUs to the CPU, the reason, which rank 0 also prints: a comparison
    must never mix a cuda/nccl run with a cpu/gloo one without saying so."""
    import torch.distributed as dist

    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
    processes, gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), torch.cuda.device_count()
    if device == "cuda" and not gpu_per_rank():
        raise SystemExit(f"--device cuda needs one GPU per process (NCCL refuses two processes on one GPU): "
                         f"{processes} processes, {gpus} GPU(s) here")
    if device == "cpu":
        dist.init_process_group("gloo", timeout=collective_timeout())
        return torch.device("cpu"), None
    chosen = init_process_group()
    fallback = None
    if chosen.type == "cpu" and gpus > 0:
        fallback = (f"fell back to cpu/gloo: {processes} processes but {gpus} GPU(s), and NCCL needs one GPU "
                    "per process")
        if dist.get_rank() == 0:
            print(f"NOTE: {fallback}", file=sys.stderr, flush=True)
    return chosen, fallback


def train(steps: int, per_rank: int, hidden: int, out: Path, device: str = "auto") -> dict:
    """One rank of a DDP run: same initial weights everywhere, own shard each step, DDP averages gradients."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    requested = device
    device, fallback = start_ranks(requested)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)  # different on purpose: DDP broadcasts rank 0's weights when it wraps the model
    model = DDP(TinyNet(hidden).to(device), device_ids=[torch.cuda.current_device()] if device.type == "cuda" else None,
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
              "requested_device": requested, "fallback": fallback,
              "seconds_per_step": median, "samples_per_second": world * per_rank / median,
              "final_loss": float(loss), "weights_checksum": float(weights.double().sum()),
              "weights_head": [float(w) for w in weights[:4]]}
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(report))
    close_process_group()  # a barrier, then destroyed while Python is whole: the rank exits cleanly
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A DDP training run; start it with torchrun "
                                                 "(python -m torch.distributed.run --nproc-per-node=N -m gpucourse.ddp_scripts).")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--per-rank", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<N>.json")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="cuda (NCCL, one GPU per process), cpu (gloo), or auto: cuda when every process can "
                             "have a GPU, else cpu, saying so")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("start this script with torchrun: it needs RANK, WORLD_SIZE and MASTER_ADDR from it")
    train(args.steps, args.per_rank, args.hidden, args.out, args.device)
    return 0


if __name__ == "__main__":
    exit_rank(main())  # skips the interpreter's shutdown, where a rank can abort (launch.exit_rank)


# --- How the all-reduce works: ring all-reduce, and DDP's buckets overlapping backward ---------------

@dataclass
class Ring:
    outputs: list            # every rank's result: the element-wise sum of all ranks' tensors
    steps: list              # (phase, step, [(sender, receiver, chunk), ...]) in order
    sent_per_rank: list      # elements each rank sent in all


def ring_all_reduce(tensors: list) -> Ring:
    """Sum ``tensors`` (one per rank, same shape) the way NCCL's and gloo's ring algorithm does, in one
    process. Each tensor is cut into N chunks; rank r only ever sends to rank (r + 1) % N.

    - reduce-scatter, N - 1 steps: at step s rank r sends chunk (r - s) % N, the receiver adds it to its
      own; afterwards rank r holds the complete sum of chunk (r + 1) % N;
    - all-gather, N - 1 steps: at step s rank r sends chunk (r + 1 - s) % N, complete, and the receiver
      keeps it; afterwards every rank holds every complete chunk.

    Each rank sends 2 (N - 1) chunks of size/N: 2 (N - 1) / N times the tensor's size, whatever N is.
    """
    n = len(tensors)
    chunks = [list(t.detach().reshape(-1).clone().tensor_split(n)) for t in tensors]
    steps, sent = [], [0] * n
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            moves = [(r, (r + 1) % n, (r - s) % n if phase == "reduce-scatter" else (r + 1 - s) % n) for r in range(n)]
            payload = [chunks[sender][chunk].clone() for sender, _, chunk in moves]  # all sends happen at once
            for (sender, receiver, chunk), data in zip(moves, payload):
                sent[sender] += data.numel()
                chunks[receiver][chunk] = chunks[receiver][chunk] + data if phase == "reduce-scatter" else data
            steps.append((phase, s + 1, moves))
    outputs = [torch.cat(c).reshape(tensors[0].shape) for c in chunks]
    return Ring(outputs, steps, sent)


def plot_ring_all_reduce(n: int = 4, max_ranks: int = 64):
    """Left: who sends which chunk at each step of a ring all-reduce on ``n`` ranks. Right: the data each
    rank sends, 2 (N - 1) / N times the gradient's size, against the number of processes N."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ring = ring_all_reduce([torch.zeros(n) for _ in range(n)])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1.3, 1]})
    colors = {"reduce-scatter": "tab:blue", "all-gather": "tab:orange"}
    for column, (phase, step, moves) in enumerate(ring.steps):
        for sender, receiver, chunk in moves:
            left.add_patch(plt.Rectangle((column, sender), 0.94, 0.9, color=colors[phase], alpha=0.35))
            left.text(column + 0.47, sender + 0.45, f"c{chunk}→r{receiver}", ha="center", va="center", fontsize=8)
    left.set_xlim(0, len(ring.steps)); left.set_ylim(n, 0)
    left.set_xticks([i + 0.47 for i in range(len(ring.steps))], [str(i + 1) for i in range(len(ring.steps))])
    left.set_yticks([r + 0.45 for r in range(n)], [f"rank {r}" for r in range(n)])
    left.set_xlabel("step (reduce-scatter: N-1 steps, then all-gather: N-1 steps)")
    left.set_ylabel("sending rank")
    left.set_title(f"Ring all-reduce on {n} ranks: chunk c sent to rank r")
    left.legend(handles=[Patch(color=c, alpha=0.35, label=p) for p, c in colors.items()], loc="upper center",
                bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8)
    ranks = list(range(2, max_ranks + 1))
    right.plot(ranks, [2 * (k - 1) / k for k in ranks], label="ring: 2(N-1)/N")
    right.axhline(2, color="gray", linestyle="--", label="limit: 2")
    right.set_xscale("log", base=2)
    right.set_ylim(0, 2.3)
    right.set_xlabel("number of processes N (log scale)")
    right.set_ylabel("data sent per rank (× gradient size)")
    right.set_title("Per-rank traffic barely grows with N")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


@dataclass
class Timeline:
    backward: list   # (layer, start, end): gradients computed from the last layer to the first
    buckets: list    # (layers in the bucket, ready, all-reduce start, all-reduce end)
    no_overlap_end: float  # when the step would end if every all-reduce waited for the whole backward

    @property
    def end(self) -> float:
        return max(self.backward[-1][2], self.buckets[-1][3])


def ddp_timeline(layer_sizes=(4, 8, 8, 8, 8, 6), bucket_cap: float = 14, compute_per_unit: float = 1.0,
                 reduce_per_unit: float = 0.6) -> Timeline:
    """A model of one DDP backward pass (not a measurement). Layer i's gradient takes
    ``compute_per_unit * size`` to compute, last layer first. Gradients fill buckets in that order (a new
    bucket once ``bucket_cap`` is reached, like ``bucket_cap_mb``); a bucket is ready when its last gradient
    is, and its all-reduce (``reduce_per_unit * size``) starts then, or when the previous one finishes:
    one communication stream, running while backward computes the layers before it."""
    t, backward = 0.0, []
    for layer in reversed(range(len(layer_sizes))):
        backward.append((layer, t, t + compute_per_unit * layer_sizes[layer]))
        t += compute_per_unit * layer_sizes[layer]
    finished = {layer: end for layer, _, end in backward}
    groups, current, filled = [], [], 0.0
    for layer, _, _ in backward:
        current.append(layer)
        filled += layer_sizes[layer]
        if filled >= bucket_cap:
            groups.append(current)
            current, filled = [], 0.0
    if current:
        groups.append(current)
    buckets, free = [], 0.0
    for group in groups:
        ready = max(finished[layer] for layer in group)
        start = max(ready, free)
        free = start + reduce_per_unit * sum(layer_sizes[layer] for layer in group)
        buckets.append((group, ready, start, free))
    return Timeline(backward, buckets, t + reduce_per_unit * sum(layer_sizes))


def plot_ddp_overlap(timeline: Timeline | None = None):
    """The timeline of ``ddp_timeline()``: backward from the last layer to the first, each bucket's
    all-reduce starting as soon as the bucket is ready, and below it the same work without overlap."""
    import matplotlib.pyplot as plt

    tl = timeline or ddp_timeline()
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for layer, start, end in tl.backward:
        ax.barh(2, end - start, left=start, color="tab:blue", alpha=0.6, edgecolor="white")
        ax.text((start + end) / 2, 2, f"layer {layer + 1}", ha="center", va="center", fontsize=8)
    for i, (group, ready, start, end) in enumerate(tl.buckets):
        ax.barh(1, end - start, left=start, color="tab:orange", alpha=0.7, edgecolor="white")
        ax.text((start + end) / 2, 1, f"bucket {i}\n(layers {', '.join(str(g + 1) for g in group)})",
                ha="center", va="center", fontsize=8)
        ax.axvline(ready, ymin=0.38, ymax=0.85, color="gray", linestyle=":", linewidth=1)
    backward_end = tl.backward[-1][2]
    ax.barh(0, backward_end, color="tab:blue", alpha=0.25)
    ax.barh(0, tl.no_overlap_end - backward_end, left=backward_end, color="tab:orange", alpha=0.4)
    ax.text(backward_end / 2, 0, "backward", ha="center", va="center", fontsize=8)
    ax.text((backward_end + tl.no_overlap_end) / 2, 0, "one all-reduce after it", ha="center", va="center", fontsize=8)
    ax.set_yticks([0, 1, 2], ["without overlap", "all-reduce\n(communication)", "backward\n(compute)"])
    ax.set_xlabel("time (arbitrary units: a model, not a measurement)")
    ax.set_title("DDP: gradient buckets are all-reduced while backward computes earlier layers "
                 "(dotted: bucket ready)")
    fig.tight_layout()
    return fig


def sampler_orders(n: int, epochs: int, rank: int = 0, world_size: int = 2, set_epoch: bool = True,
                   seed: int = 0) -> list[list[int]]:
    """The indices ``DistributedSampler(shuffle=True)`` hands rank ``rank`` of ``world_size`` in each
    epoch of a dataset of ``n`` samples. The shuffle is seeded by ``seed + epoch``; without
    ``sampler.set_epoch(epoch)`` the epoch stays 0, and every epoch repeats the same order."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    orders = []
    for epoch in range(epochs):
        if set_epoch:
            sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


# --- Comparing runs: like with like -------------------------------------------------------------------

def same_device_and_backend(results: dict[int, list[dict]]) -> tuple[str, str]:
    """The one (device, backend) every rank of every run used; ValueError, naming them, when they differ
    (a cuda/nccl run beside a cpu/gloo one measures the hardware, not the number of processes)."""
    pairs = {(r["device"].split(":")[0], r["backend"]) for reports in results.values() for r in reports}
    if len(pairs) != 1:
        raise ValueError(f"these runs used different devices or backends, {sorted(pairs)}: compare runs on one "
                         "(pass --device cpu or --device cuda to every run)")
    return pairs.pop()


def plot_throughput(results: dict[int, list[dict]], hardware: str | None = None):
    """Samples per second (all ranks) per process count, for runs on one device and backend (checked),
    titled with both and the hardware; says whether more processes were faster in this measurement."""
    import matplotlib.pyplot as plt

    from gpucourse.reference import this_machine

    device, backend = same_device_and_backend(results)
    counts = sorted(results)
    speed = [results[n][0]["samples_per_second"] for n in counts]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.bar([f"{n} process{'es' if n > 1 else ''}" for n in counts], speed, color="tab:green")
    ax.set_xlabel(f"torchrun processes, each on {device} ({backend})")
    ax.set_ylabel("samples / s, all ranks")
    ax.set_title(f"DDP script on {device} ({backend}), every run alike\n{hardware or this_machine(device)}", fontsize=9)
    ratio = speed[-1] / speed[0]
    note = (f"measured: {counts[-1]} processes {ratio:.2f}x the samples/s of 1" if ratio > 1 else
            f"measured: {counts[-1]} processes {1 / ratio:.2f}x SLOWER than 1"
            + (": they share this machine's CPU cores" if device == "cpu" else ""))
    ax.text(0.5, 0.97, note, transform=ax.transAxes, ha="center", va="top", fontsize=8,
            bbox=dict(facecolor="white", alpha=0.85, edgecolor="none"))
    ax.set_ylim(0, 1.4 * max(speed))
    fig.tight_layout()
    return fig

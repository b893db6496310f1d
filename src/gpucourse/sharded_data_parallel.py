"""Sharded data parallelism: ZeRO, FSDP, tensor and pipeline parallelism. Taught in lesson 13.

Everything here runs as ranks of ``torchrun``, started from the notebook by ``torchrun`` (from
``gpucourse.launch``), with every tensor on the CPU: gloo, also on a machine with GPUs (NCCL has no CPU
collectives); each rank writes ``rank<N>.json``, with the backend that ran (``dist.get_backend()``):

    torchrun --standalone --nproc-per-node=2 -m gpucourse.sharded_data_parallel collectives --out DIR

- ``collectives``: reduce-scatter then all-gather gives what all-reduce gives;
- ``memory``: the lesson's model trained the same steps with DDP + Adam, a hand-written ZeRO-1
  (``PartitionedOptimizer``), ``ZeroRedundancyOptimizer`` and FSDP2 (``fully_shard``); every rank
  measures the bytes of its parameters, gradients and optimizer state (``held_bytes``) and how far its
  weights are from DDP's;
- ``tensor``: an MLP split column-parallel then row-parallel by hand (one all-reduce), and with DTensor's
  ``parallelize_module``, against the unsplit MLP;
- ``pipeline``: a GPipe schedule by hand (``send``/``recv``), each stage's busy spans timed with
  ``time.perf_counter``, drawn by ``plot_pipeline`` and compared to the bubble (p-1)/(m+p-1).

The arithmetic of bytes per parameter is lesson 12's; this lesson measures it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
from torch import nn

from gpucourse.launch import Launch, read_rank_reports, torchrun  # noqa: F401 (the lesson calls them from here)
from gpucourse.launch import backend_of, close_process_group, exit_rank, init_process_group, run_demo

IN_FEATURES, OUT_FEATURES = 32, 10


def lesson_model(width: int = 256, depth: int = 3, seed: int = 0) -> nn.Sequential:
    """The lesson's MLP: ``depth`` hidden layers of ``width``; the same weights on every rank (seeded)."""
    torch.manual_seed(seed)
    layers, features = [], IN_FEATURES
    for _ in range(depth):
        layers += [nn.Linear(features, width), nn.GELU()]
        features = width
    return nn.Sequential(*layers, nn.Linear(features, OUT_FEATURES))


def rank_batch(step: int, rank: int, rows: int = 16, seed: int = 0):
    """``(x, y)``: rank ``rank``'s own rows of step ``step``: a regression target, deterministic per rank."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    return torch.randn(rows, IN_FEATURES, generator=g), torch.randn(rows, OUT_FEATURES, generator=g)


def held_bytes(tensors) -> int:
    """Bytes of the storages behind ``tensors`` (each storage once; a DTensor counts its local shard):
    what this rank really holds, padding included."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "to_local"):  # DTensor: only the local shard lives on this rank
            t = t.to_local()
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def optimizer_state_bytes(optimizer) -> int:
    """The sum of the storage bytes of every tensor in ``optimizer.state`` (Adam: exp_avg, exp_avg_sq, step)."""
    return held_bytes(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))


class PartitionedOptimizer:
    """ZeRO-1 written out: every rank keeps optimizer state only for the parameters it owns.

    Ownership is by whole parameter, the largest first, each to the rank that owns the fewest elements
    so far (``ZeroRedundancyOptimizer`` partitions the same way). A step: average the gradients over
    the ranks (divided first, then summed: DDP's order), let each rank's inner optimizer update the
    parameters it owns, then every owner broadcasts its parameters to the others."""

    def __init__(self, params, optimizer_class=torch.optim.Adam, **defaults):
        import torch.distributed as dist

        self.params = [p for p in params if p.requires_grad]
        self.world = dist.get_world_size()
        loads = [0] * self.world
        self.owner = {}
        for p in sorted(self.params, key=lambda p: -p.numel()):
            rank = loads.index(min(loads))
            self.owner[p] = rank
            loads[rank] += p.numel()
        self.owned_elements = loads
        mine = [p for p in self.params if self.owner[p] == dist.get_rank()]
        self.optimizer = optimizer_class(mine, **defaults) if mine else None

    def step(self):
        import torch.distributed as dist

        for p in self.params:
            if p.grad is not None:
                p.grad.div_(self.world)
                dist.all_reduce(p.grad)
        if self.optimizer is not None:
            self.optimizer.step()
        for p in self.params:  # the same order on every rank: collectives must match
            dist.broadcast(p.data, src=self.owner[p])

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def _train(model, optimizer, steps: int, rank: int, rows: int, seed: int, ddp=None):
    for step in range(steps):
        x, y = rank_batch(step, rank, rows, seed)
        optimizer.zero_grad()
        nn.functional.mse_loss((ddp or model)(x), y).backward()
        optimizer.step()


def _weights(model) -> torch.Tensor:
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)
                      for p in model.parameters()])


def measure_memory(width: int, depth: int, steps: int, rows: int = 16, lr: float = 1e-3, seed: int = 0) -> dict:
    """One rank: train the lesson's model ``steps`` steps four ways; per way, this rank's bytes of
    parameters, gradients and optimizer state, and the largest difference of its weights from DDP's."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    found = {}

    def record(name, model, optimizer_state, reference=None, **extra):
        weights = _weights(model)
        found[name] = {"param_bytes": held_bytes(model.parameters()),
                       "grad_bytes": held_bytes(p.grad for p in model.parameters()),
                       "optimizer_bytes": optimizer_state,
                       "max_gap_to_ddp": 0.0 if reference is None else float((weights - reference).abs().max()),
                       "bitwise_equal_to_ddp": reference is None or bool(torch.equal(weights, reference)), **extra}
        return weights

    model = lesson_model(width, depth, seed)
    ddp = DDP(model)
    adam = torch.optim.Adam(model.parameters(), lr=lr)
    _train(model, adam, steps, rank, rows, seed, ddp)
    reference = record("DDP + Adam", model, optimizer_state_bytes(adam))

    model = lesson_model(width, depth, seed)
    hand = PartitionedOptimizer(model.parameters(), torch.optim.Adam, lr=lr)
    _train(model, hand, steps, rank, rows, seed)
    record("ZeRO-1 by hand", model, optimizer_state_bytes(hand.optimizer) if hand.optimizer else 0, reference,
           owned_elements=hand.owned_elements)

    model = lesson_model(width, depth, seed)
    ddp = DDP(model)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
    _train(model, zero, steps, rank, rows, seed, ddp)
    record("ZeroRedundancyOptimizer", model, optimizer_state_bytes(zero.optim), reference)

    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model = lesson_model(width, depth, seed)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)  # one all-gather / reduce-scatter group per layer
        fully_shard(model, mesh=mesh)
        adam = torch.optim.Adam(model.parameters(), lr=lr)
        _train(model, adam, steps, rank, rows, seed)
        record("FSDP2 fully_shard", model, optimizer_state_bytes(adam), reference)
    except Exception as error:  # reported, not hidden: the notebook prints it
        found["FSDP2 fully_shard"] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    parameters = sum(p.numel() for p in lesson_model(width, depth, seed).parameters())
    return {"parameters": parameters, "ways": found}


def collectives(numel: int = 10) -> dict:
    """One rank: reduce-scatter then all-gather, against all-reduce, on a tensor that differs per rank.
    ``numel`` need not divide by the world size: the tensor is padded to a multiple of it."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    shard = math.ceil(numel / world)
    x = torch.arange(numel, dtype=torch.float32) * (rank + 1)
    padded = torch.zeros(shard * world)
    padded[:numel] = x
    # the _single names since torch 2.13; before, reduce_scatter_tensor and all_gather_into_tensor (deprecated now)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    mine = torch.empty(shard)
    reduce_scatter(mine, padded)  # rank r gets the sum of every rank's chunk r
    gathered = torch.empty(shard * world)
    all_gather(gathered, mine)  # every rank gets every chunk
    reduced = x.clone()
    dist.all_reduce(reduced)
    return {"numel": numel, "shard": shard, "my_chunk": mine.tolist(), "after_all_gather": gathered[:numel].tolist(),
            "all_reduce": reduced.tolist(), "equal": bool(torch.equal(gathered[:numel], reduced))}


def tensor_parallel_mlp(rows: int = 8, dim: int = 16, hidden: int = 64, seed: int = 0) -> dict:
    """One rank: the MLP ``dim -> hidden -> dim`` split by hand (first layer by output rows: column
    parallel; second by input columns: row parallel; one all-reduce of the output), then with DTensor
    (``ColwiseParallel`` / ``RowwiseParallel``), each against the unsplit MLP."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
    x = torch.randn(rows, dim)
    with torch.no_grad():
        full = mlp(x)
        columns = torch.tensor_split(torch.arange(hidden), world)[rank]  # uneven splits are fine by hand
        w1, b1 = mlp[0].weight[columns], mlp[0].bias[columns]   # this rank's hidden units
        w2 = mlp[2].weight[:, columns]                          # and the columns of layer 2 that read them
        partial = nn.functional.gelu(x @ w1.T + b1) @ w2.T      # a partial sum of the output
        dist.all_reduce(partial)                                # the one collective of the forward pass
        by_hand = partial + mlp[2].bias
    found = {"hidden": hidden, "my_hidden_units": len(columns), "by_hand_gap": float((by_hand - full).abs().max()),
             "my_weight_elements": w1.numel() + b1.numel() + w2.numel(),
             "full_weight_elements": sum(p.numel() for p in mlp.parameters())}
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,))
        parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        with torch.no_grad():
            found["dtensor_gap"] = float((mlp(x) - full).abs().max())
        found["dtensor_local_shapes"] = [list(p.to_local().shape) for p in mlp.parameters()]
    except Exception as error:
        found["dtensor_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return found


def gpipe(microbatches: int = 4, rows: int = 32, width: int = 512, layers: int = 4) -> dict:
    """One rank = one pipeline stage (``layers`` Linear+GELU of ``width``). GPipe: every micro-batch
    forward through all stages, then every backward; activations travel with ``isend``/``recv``.
    Returns this stage's busy spans ``(kind, micro-batch, start, end)`` in ``time.perf_counter``
    seconds (one clock for every process of one machine) and the stage's first and last moment."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    stage = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.GELU())])
    spans, kept, sending = [], [], []
    for _ in range(2):  # warm-up outside the timeline: the first backward here takes ~0.3 s of one-off set-up
        out = stage(torch.randn(rows, width))
        out.backward(torch.randn_like(out))
    stage.zero_grad()
    dist.barrier()
    begin = time.perf_counter()
    for i in range(microbatches):
        if rank == 0:
            x = torch.randn(rows, width, generator=torch.Generator().manual_seed(i))
        else:
            x = torch.empty(rows, width)
            dist.recv(x, src=rank - 1)  # waiting here is idle time: the bubble
            x.requires_grad_(True)
        start = time.perf_counter()
        out = stage(x)
        spans.append(("forward", i, start, time.perf_counter()))
        if rank < world - 1:  # isend: the stage goes on computing while the activation travels
            sending.append(dist.isend(out.detach(), dst=rank + 1))
        kept.append((x, out))  # GPipe keeps every micro-batch's activations until its backward
    for i in reversed(range(microbatches)):
        x, out = kept[i]
        if rank == world - 1:
            start = time.perf_counter()
            out.pow(2).mean().backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=rank + 1)
            start = time.perf_counter()
            out.backward(grad)
        spans.append(("backward", i, start, time.perf_counter()))
        if rank > 0:
            sending.append(dist.isend(x.grad, dst=rank - 1))
    for request in sending:
        request.wait()
    dist.barrier()
    return {"stage": rank, "stages": world, "microbatches": microbatches, "spans": spans, "begin": begin,
            "end": max(end for *_, end in spans)}


def bubble_fraction(stages: int, microbatches: int) -> float:
    """GPipe's idle fraction with equal stages and free communication: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (microbatches + stages - 1)


def measured_idle_fraction(reports: list[dict]) -> float:
    """From every stage's report: the share of the schedule (first span's start to last span's end, over
    all stages) that stages spent not computing, averaged over the stages."""
    start = min(s[2] for r in reports for s in r["spans"])
    end = max(s[3] for r in reports for s in r["spans"])
    busy = [sum(e - b for _, _, b, e in r["spans"]) for r in reports]
    return 1 - sum(busy) / (len(reports) * (end - start))


def plot_pipeline(reports: list[dict], hardware: str):
    """The measured GPipe timeline: one row per stage, forward and backward spans per micro-batch."""
    import matplotlib.pyplot as plt

    start = min(s[2] for r in reports for s in r["spans"])
    fig, ax = plt.subplots(figsize=(10, 0.7 * len(reports) + 1.8))
    colors = {"forward": "tab:blue", "backward": "tab:orange"}
    for r in reports:
        for kind, i, b, e in r["spans"]:
            ax.barh(r["stage"], 1000 * (e - b), left=1000 * (b - start), color=colors[kind], alpha=0.75, edgecolor="white")
            ax.text(1000 * ((b + e) / 2 - start), r["stage"], str(i), ha="center", va="center", fontsize=7)
    ax.set_yticks([r["stage"] for r in reports], [f"stage {r['stage']}" for r in reports])
    ax.invert_yaxis()
    ax.set_xlabel("time since the first span (ms, time.perf_counter)")
    ax.set_ylabel("pipeline stage (one process)")
    p, m = len(reports), reports[0]["microbatches"]
    ax.set_title(f"GPipe, {p} stages x {m} micro-batches ({backend_of(reports)}), measured on {hardware}\n"
                 f"idle {measured_idle_fraction(reports):.0%} measured, (p-1)/(m+p-1) = {bubble_fraction(p, m):.0%}; "
                 "blue forward, orange backward, number = micro-batch", fontsize=9)
    fig.tight_layout()
    return fig


def plot_memory(reports: dict, hardware: str):
    """Bytes each rank holds (parameters, gradients, optimizer state), stacked, per way of training:
    ``reports`` maps rank to ``measure_memory``'s record."""
    import matplotlib.pyplot as plt

    ranks = sorted(reports)
    ways = [w for w in reports[ranks[0]]["ways"] if "error" not in reports[ranks[0]]["ways"][w]]
    parts = [("param_bytes", "parameters", "tab:blue"), ("grad_bytes", "gradients", "tab:green"),
             ("optimizer_bytes", "optimizer state", "tab:orange")]
    fig, ax = plt.subplots(figsize=(10, 3.8))
    bar = 0.8 / len(ranks)
    for k, rank in enumerate(ranks):
        bottom = [0.0] * len(ways)
        for key, label, color in parts:
            values = [reports[rank]["ways"][w][key] / 2**20 for w in ways]
            xs = [i + (k - (len(ranks) - 1) / 2) * bar for i in range(len(ways))]
            ax.bar(xs, values, bar * 0.95, bottom=bottom, color=color, alpha=0.5 + 0.5 * k / max(1, len(ranks) - 1),
                   label=label if k == 0 else None, edgecolor="white")
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(ways)), ways)
    ax.set_xlabel(f"way of training (bars left to right: ranks {', '.join(map(str, ranks))})")
    ax.set_ylabel("bytes held per rank (MiB)")
    ax.set_title(f"Per-rank memory after training, {len(ranks)} {backend_of(reports.values())} processes, "
                 f"measured on {hardware}\n"
                 f"model of {reports[ranks[0]]['parameters']:,} float32 parameters", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


DEMOS = {"collectives", "memory", "tensor", "pipeline"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Lesson 13's demonstrations, one rank each; start with torchrun "
                                                 "(python -m torch.distributed.run --nproc-per-node=N "
                                                 "-m gpucourse.sharded_data_parallel DEMO --out DIR).")
    parser.add_argument("demo", choices=sorted(DEMOS))
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<N>.json")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--numel", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--rows", type=int, default=32)
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("start this with torchrun: it needs RANK, WORLD_SIZE and MASTER_ADDR from it")
    import torch.distributed as dist

    init_process_group(device="cpu")  # every demo here keeps its tensors on the CPU: gloo
    if args.demo == "collectives":
        report = collectives(args.numel)
    elif args.demo == "memory":
        report = measure_memory(args.width, args.depth, args.steps)
    elif args.demo == "tensor":
        report = tensor_parallel_mlp(hidden=args.hidden)
    else:
        report = gpipe(args.microbatches, args.rows, args.width)
    report.update(rank=dist.get_rank(), world_size=dist.get_world_size(), backend=dist.get_backend())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    close_process_group()  # every rank done, then destroyed while Python is whole: a clean exit
    return 0


def run(demo: str, nproc: int, timeout: float = 300, **options) -> list[dict]:
    """Launch ``demo`` on ``nproc`` ranks with torchrun and return every rank's report, in rank order
    (raises with the output's tail if the launch failed)."""
    return run_demo("gpucourse.sharded_data_parallel", demo, nproc, timeout, **options)[0]


if __name__ == "__main__":
    exit_rank(main())  # skips the interpreter's shutdown, where a rank can abort (launch.exit_rank)

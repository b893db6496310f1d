"""The cost of communication: collectives timed against message size. Taught in lesson 14.

Everything measured here runs as ranks of ``torchrun``, started from the notebook (``run``, through
``gpucourse.launch``); each rank writes ``rank<N>.json``. The buffers live where ``--device`` says, and
the backend follows them: CPU buffers over gloo (the default, whatever GPUs there are), GPU buffers
over NCCL (one GPU per rank); every report and row says which backend ran (``dist.get_backend()``):

    torchrun --standalone --nproc-per-node=2 -m gpucourse.communication sweep --out DIR [--device cuda]

- ``sweep``: all-reduce, reduce-scatter and all-gather of buffers from a few KiB to tens of MiB, each
  repeated; a repetition's time is the slowest rank's (a collective is over when every rank is done);
- ``plans``: the collectives one training step of the lesson-13 model issues under DDP, ZeRO-1/2 and
  ZeRO-3 (FSDP), as ``step_plan`` lists them, timed as whole sequences.

Sizes follow nccl-tests (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md): S is the
bytes of the whole buffer (for reduce-scatter the input, for all-gather the output); ``bus_bandwidth``
is its busbw. Fitting the latency-bandwidth model to these times is the lesson's first exercise, so it
is not here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch

from gpucourse.launch import backend_of, close_process_group, exit_rank, init_process_group, run_demo

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
# nccl-tests' correction from algorithm bandwidth (S / t) to bus bandwidth, per collective, for n ranks
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n}
ELEMENT = torch.float32  # every buffer here: 4-byte elements
KIB, MIB = 2**10, 2**20
DDP_FIRST_BUCKET, DDP_BUCKET = 1 * MIB, 25 * MIB  # torch's DDP: bucket_cap_mb=25, its first bucket 1 MiB


def sizes_between(smallest: int, largest: int, factor: int = 4) -> list[int]:
    """``smallest``, ``smallest * factor``, ... up to ``largest`` bytes."""
    if smallest < 1 or largest < smallest or factor < 2:
        raise ValueError(f"need 1 <= smallest <= largest and factor >= 2, got {smallest}, {largest}, {factor}")
    sizes = [smallest]
    while sizes[-1] * factor <= largest:
        sizes.append(sizes[-1] * factor)
    return sizes


def bus_bandwidth(collective: str, size_bytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' busbw in bytes per second: algbw = S / t, times 2(n-1)/n for all-reduce and (n-1)/n
    for reduce-scatter and all-gather; comparable to one link's peak whatever the number of ranks."""
    if collective not in BUS_FACTOR:
        raise ValueError(f"unknown collective {collective!r}; one of {COLLECTIVES}")
    return size_bytes / seconds * BUS_FACTOR[collective](world_size)


def _buffers(collective: str, size_bytes: int, world: int, device="cpu"):
    """Input and output of ``collective`` on a buffer of ``size_bytes`` (whole buffer, a multiple of 4 * world)."""
    numel = size_bytes // ELEMENT.itemsize
    if numel % world or size_bytes % ELEMENT.itemsize:
        raise ValueError(f"{size_bytes} bytes do not split into {world} chunks of float32")
    make = dict(dtype=ELEMENT, device=device)
    if collective == "all_reduce":
        return torch.ones(numel, **make), None
    if collective == "reduce_scatter":
        return torch.ones(numel, **make), torch.empty(numel // world, **make)
    return torch.ones(numel // world, **make), torch.empty(numel, **make)


def _issue(collective: str, source, target) -> None:
    import torch.distributed as dist

    # torch 2.13 renamed the flat-buffer forms reduce_scatter_tensor and all_gather_into_tensor to
    # reduce_scatter_single and all_gather_single (the old names still work, with a FutureWarning);
    # older versions have only the former
    if collective == "all_reduce":
        dist.all_reduce(source)
    elif collective == "reduce_scatter":
        (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(target, source)
    elif collective == "all_gather":
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(target, source)
    else:
        raise ValueError(f"unknown collective {collective!r}; one of {COLLECTIVES}")


def _time_all(calls: list, repeats: int, warmup: int, device="cpu") -> list[list[float]]:
    """Seconds of each of ``calls`` (functions issuing collectives), ``repeats`` times each. The calls take
    turns, one repetition of each per round in a shuffled order (the same on every rank: seeded by the
    round), so that a burst of load from other processes, or a slow call right after a large one, hits
    them all alike; each repetition starts together on every rank (a barrier first). Per call, the
    slowest rank's time of every repetition: a collective is over only when every rank is done."""
    import random

    import torch.distributed as dist

    def done():  # gloo's CPU collectives have finished when they return; NCCL's run on a CUDA stream
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    for call in calls:
        for _ in range(warmup):  # the first calls of a size set up the backend's buffers and connections
            call()
    done()
    times = torch.zeros(len(calls), repeats, dtype=torch.float64)
    for round_ in range(repeats):
        order = list(range(len(calls)))
        random.Random(round_).shuffle(order)
        for i in order:
            call = calls[i]
            dist.barrier()
            done()
            start = time.perf_counter()
            call()
            done()
            times[i, round_] = time.perf_counter() - start
    if torch.device(device).type == "cuda":  # NCCL reduces GPU tensors only
        times = times.cuda()
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.cpu().tolist()


def sweep(sizes: list[int], repeats: int = 5, warmup: int = 2, device="cpu") -> dict:
    """One rank: every collective on every size (bytes of the whole buffer); per pair every repetition's
    time (the slowest rank's) and their median."""
    import torch.distributed as dist

    world = dist.get_world_size()
    pairs = [(collective, size) for collective in COLLECTIVES for size in sizes]
    calls = []
    for collective, size in pairs:
        source, target = _buffers(collective, size, world, device)
        calls.append(lambda c=collective, s=source, t=target: _issue(c, s, t))
    timed = _time_all(calls, repeats, warmup, device)
    backend = dist.get_backend()
    return {"rows": [{"collective": c, "bytes": size, "times": t, "median": statistics.median(t), "backend": backend}
                     for (c, size), t in zip(pairs, timed)]}


def layer_numels(width: int = 256, depth: int = 3) -> list[int]:
    """Elements of each Linear layer (weight and bias) of lesson 13's model, ``gpucourse.sharded_data_parallel.lesson_model``."""
    from gpucourse.sharded_data_parallel import lesson_model

    return [sum(p.numel() for p in layer.parameters()) for layer in lesson_model(width, depth)
            if isinstance(layer, torch.nn.Linear)]


def ddp_buckets(numels: list[int], bytes_per_elem: int = 4) -> list[int]:
    """Bytes of each gradient bucket DDP all-reduces: parameters in reverse order (backward's), a bucket
    closed once it reaches its cap (1 MiB for the first, 25 MiB after; torch's defaults). Per layer
    here, where torch assigns per parameter: the same buckets for models whose layers are under 1 MiB."""
    buckets, current = [], 0
    for numel in reversed(numels):
        current += numel * bytes_per_elem
        if current >= (DDP_FIRST_BUCKET if not buckets else DDP_BUCKET):
            buckets.append(current)
            current = 0
    return buckets + ([current] if current else [])


def step_plan(strategy: str, numels: list[int], world_size: int, bytes_per_elem: int = 4) -> list[tuple[str, int]]:
    """The collectives of one training step, ``(collective, bytes of the whole buffer)`` in order, for the
    layers' element counts ``numels``; buffers padded to a multiple of ``world_size`` elements.

    - ddp: an all-reduce of the gradients per bucket (``ddp_buckets``);
    - zero1, zero2: a reduce-scatter of all gradients (each rank keeps the mean of its shard), then an
      all-gather of the updated parameters (flat, as lesson 13's ShardedAdam; ZeRO-2 sends the same, it
      only frees the gradients sooner);
    - zero3 (FSDP2, one ``fully_shard`` per layer): per layer an all-gather of its parameters before its
      forward, another before its backward, and a reduce-scatter of its gradients after it."""
    def padded(numel):
        return math.ceil(numel / world_size) * world_size * bytes_per_elem

    total = sum(numels)
    if strategy == "ddp":
        return [("all_reduce", padded(b // bytes_per_elem)) for b in ddp_buckets(numels, bytes_per_elem)]
    if strategy in ("zero1", "zero2"):
        return [("reduce_scatter", padded(total)), ("all_gather", padded(total))]
    if strategy == "zero3":
        forward = [("all_gather", padded(n)) for n in numels]
        backward = [step for n in reversed(numels) for step in (("all_gather", padded(n)), ("reduce_scatter", padded(n)))]
        return forward + backward
    raise ValueError(f"unknown strategy {strategy!r}; one of ddp, zero1, zero2, zero3")


STRATEGIES = ("ddp", "zero1", "zero2", "zero3")


def time_plans(widths: list[int], depth: int = 3, repeats: int = 5, warmup: int = 2, device="cpu") -> dict:
    """One rank: for each model width, each strategy's ``step_plan`` issued as one sequence, timed."""
    import torch.distributed as dist

    world = dist.get_world_size()
    items, calls = [], []
    for width in widths:
        numels = layer_numels(width, depth)
        for strategy in STRATEGIES:
            plan = step_plan(strategy, numels, world)
            buffers = [(collective, *_buffers(collective, size, world, device)) for collective, size in plan]

            def call(buffers=buffers):
                for collective, source, target in buffers:
                    _issue(collective, source, target)

            items.append({"width": width, "parameters": sum(numels), "strategy": strategy, "plan": plan})
            calls.append(call)
    timed = _time_all(calls, repeats, warmup, device)
    backend = dist.get_backend()
    return {"rows": [{**item, "times": t, "median": statistics.median(t), "backend": backend}
                     for item, t in zip(items, timed)]}


def predict(plan: list[tuple[str, int]], fits: dict) -> float:
    """The latency-bandwidth model's seconds for a plan: each collective's alpha + S / beta, summed
    (``fits`` maps a collective to its ``(alpha, beta)``)."""
    return sum(fits[collective][0] + size / fits[collective][1] for collective, size in plan)


def _style(collective: str) -> dict:
    return {"all_reduce": {"color": "tab:blue", "marker": "o"}, "reduce_scatter": {"color": "tab:orange", "marker": "s"},
            "all_gather": {"color": "tab:green", "marker": "^"}}[collective]


def plot_collective_times(rows: list[dict], hardware: str, world_size: int, fits: dict | None = None):
    """Median time of each collective against the buffer's bytes, log-log, every repetition as a faint
    dot; with ``fits`` (collective -> (alpha, beta)) the model alpha + S / beta drawn over them."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for collective in COLLECTIVES:
        mine = [r for r in rows if r["collective"] == collective]
        if not mine:
            continue
        style = _style(collective)
        sizes = [r["bytes"] for r in mine]
        for r in mine:
            ax.scatter([r["bytes"]] * len(r["times"]), [1e3 * t for t in r["times"]], s=8, color=style["color"], alpha=0.25)
        ax.plot(sizes, [1e3 * r["median"] for r in mine], linestyle="none", label=f"{collective} (median)", **style)
        if fits and collective in fits:
            alpha, beta = fits[collective]
            grid = np.geomspace(min(sizes), max(sizes), 64)
            ax.plot(grid, 1e3 * (alpha + grid / beta), color=style["color"], linestyle="--",
                    label=f"fit: {1e6 * alpha:.0f} µs + S / ({beta / 1e9:.2f} GB/s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size S, whole buffer (bytes)")
    ax.set_ylabel("time per collective (ms, slowest rank)")
    ax.set_title(f"{backend_of(rows)} collectives, {world_size} processes, measured on {hardware}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_bus_bandwidth(rows: list[dict], hardware: str, world_size: int):
    """nccl-tests' bus bandwidth of each median against the buffer's bytes (log x)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    for collective in COLLECTIVES:
        mine = [r for r in rows if r["collective"] == collective]
        if mine:
            ax.plot([r["bytes"] for r in mine],
                    [bus_bandwidth(collective, r["bytes"], r["median"], world_size) / 1e9 for r in mine],
                    label=collective, **_style(collective))
    ax.set_xscale("log")
    ax.set_xlabel("message size S, whole buffer (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s, nccl-tests' busbw)")
    ax.set_title(f"Bus bandwidth of {backend_of(rows)} collectives, {world_size} processes, measured on {hardware}",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_fits_against_ranks(fits: dict, hardware: str, backend: str):
    """Lesson 14: the fitted latency alpha (left) and bandwidth beta (right) of each collective against the
    number of ranks N. ``fits``: N -> {collective: (alpha seconds, beta bytes per second)}, fitted to sweeps
    run on ``backend`` on ``hardware``; a collective without a fit at some N is left out there."""
    import matplotlib.pyplot as plt

    ranks = sorted(fits)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for collective in COLLECTIVES:
        have = [n for n in ranks if collective in fits[n]]
        if have:
            left.plot(have, [1e6 * fits[n][collective][0] for n in have], label=collective, **_style(collective))
            right.plot(have, [fits[n][collective][1] / 1e9 for n in have], label=collective, **_style(collective))
    for ax in (left, right):
        ax.set_xticks(ranks)
        ax.set_xlabel("ranks N (processes)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    left.set_ylabel("latency alpha (µs, fitted)")
    right.set_ylabel("bandwidth beta (GB/s, fitted)")
    fig.suptitle(f"alpha and beta of {backend} collectives against the number of ranks, measured on {hardware}",
                 fontsize=9)
    fig.tight_layout()
    return fig


def plot_prediction(rows: list[dict], hardware: str, world_size: int):
    """Per model width and strategy: the time the fitted model predicts for one step's collectives beside
    the time measured for them (``rows``: dicts with width, strategy, predicted and measured seconds)."""
    import matplotlib.pyplot as plt

    widths = sorted({r["width"] for r in rows})
    fig, axes = plt.subplots(1, len(widths), figsize=(4.5 * len(widths), 3.8), squeeze=False)
    for ax, width in zip(axes[0], widths):
        mine = [r for r in rows if r["width"] == width]
        xs = range(len(mine))
        ax.bar([x - 0.2 for x in xs], [1e3 * r["predicted"] for r in mine], 0.4, label="predicted (alpha-beta fit)",
               color="tab:gray")
        ax.bar([x + 0.2 for x in xs], [1e3 * r["measured"] for r in mine], 0.4, label="measured (median)",
               color="tab:blue")
        ax.set_xticks(list(xs), [r["strategy"] for r in mine])
        ax.set_xlabel(f"strategy (model width {width}, {mine[0]['parameters']:,} float32 parameters)")
        ax.set_ylabel("communication per step (ms)")
        ax.legend(fontsize=7)
    fig.suptitle(f"One step's collectives, predicted and measured, {world_size} {backend_of(rows)} processes on "
                 f"{hardware}", fontsize=9)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Lesson 14's measurements, one rank each; start with torchrun "
                                                 "(python -m torch.distributed.run --nproc-per-node=N "
                                                 "-m gpucourse.communication DEMO --out DIR).")
    parser.add_argument("demo", choices=["sweep", "plans"])
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<N>.json")
    parser.add_argument("--smallest", type=int, default=4 * KIB)
    parser.add_argument("--largest", type=int, default=64 * MIB)
    parser.add_argument("--widths", default="256,1024", help="comma-separated model widths (plans)")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the buffers live: cpu (gloo) or cuda (NCCL, one GPU per rank)")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("start this with torchrun: it needs RANK, WORLD_SIZE and MASTER_ADDR from it")
    import torch.distributed as dist

    device = init_process_group(device=args.device)  # the backend follows the buffers: gloo or NCCL
    if args.demo == "sweep":
        report = sweep(sizes_between(args.smallest, args.largest), args.repeats, device=device)
    else:
        report = time_plans([int(w) for w in args.widths.split(",")], args.depth, args.repeats, device=device)
    report.update(rank=dist.get_rank(), world_size=dist.get_world_size(), backend=dist.get_backend())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    close_process_group()  # every rank done, then destroyed while Python is whole: a clean exit
    return 0


def run(demo: str, nproc: int, timeout: float = 600, device: str = "cpu", **options) -> list[dict]:
    """Launch ``demo`` on ``nproc`` ranks with torchrun, its buffers on ``device`` ("cpu": gloo, "cuda":
    NCCL), and return every rank's report, in rank order (raises with the output's tail if the launch failed)."""
    return run_demo("gpucourse.communication", demo, nproc, timeout, device=device, **options)[0]


if __name__ == "__main__":
    exit_rank(main())  # skips the interpreter's shutdown, where a rank can abort (launch.exit_rank)

"""Tensor, sequence and pipeline parallelism with today's PyTorch APIs. Taught in lesson 18.

Everything here runs as ranks of ``torchrun`` with every tensor on the CPU (gloo), each rank writing
``rank<N>.json`` with the backend that ran (``dist.get_backend()``); ``run`` starts a demo from the notebook:

    torchrun --standalone --nproc-per-node=2 -m gpucourse.model_parallel tensor --out DIR

- ``tensor``: a transformer block (LayerNorm, causal self-attention, LayerNorm, MLP) split with
  ``parallelize_module`` two ways, tensor parallel (``ColwiseParallel``/``RowwiseParallel``) and tensor +
  sequence parallel (``SequenceParallel`` on the norms, the layouts of the PyTorch TP tutorial); each is
  checked against the unsplit block (output and every gradient), the bytes autograd saves for backward
  are counted per rank (``saved_activation_bytes``), and the collectives each runs are counted with
  ``CommDebugMode``;
- ``pipeline``: a stack of Linear + GELU layers cut into stages (``PipelineStage``) and run by
  ``ScheduleGPipe``, ``Schedule1F1B`` and ``ScheduleInterleaved1F1B``; every forward and backward of every
  micro-batch is timed (``time.perf_counter``, one clock for all processes of a machine), from which
  ``bubble_measured`` and ``in_flight_peak`` read the idle time and the activations held.

Lesson 13 split a toy MLP by hand and ran GPipe by hand; this lesson uses the library for both and
measures what the papers predict.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from gpucourse.launch import backend_of, close_process_group, exit_rank, init_process_group, run_demo

# --- the transformer block -------------------------------------------------------------------------------


class Attention(nn.Module):
    """Causal multi-head self-attention. The number of heads is read from the width ``wq`` returns, so a
    rank that holds h/t of the columns (tensor parallel) runs heads/t heads with no change to this code."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s = x.shape[0], x.shape[1]
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # never materialises the s x s scores
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """The MLP: dim -> 4 dim, GELU, -> dim."""

    def __init__(self, dim: int):
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """A pre-norm transformer block: x + attention(norm(x)), then h + mlp(norm(h)). Module names as in the
    PyTorch tensor-parallel tutorial, so that its plans apply word for word."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention, self.feed_forward = Attention(dim, heads), FeedForward(dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def make_block(dim: int, heads: int, seed: int = 0) -> Block:
    """The block with weights drawn from ``seed`` (the same on every rank), norms' weights not all ones
    (so that a wrong gradient for them shows)."""
    torch.manual_seed(seed)
    block = Block(dim, heads)
    with torch.no_grad():
        for norm in (block.attention_norm, block.ffn_norm):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.1, 0.1)
    return block


def tp_plan(sequence_parallel: bool) -> dict:
    """The ``parallelize_module`` plan for ``Block``: column-parallel q, k, v and w1, row-parallel wo and w2;
    with ``sequence_parallel`` the norms run on sequence shards (``SequenceParallel``), the block's input and
    output are sharded on the sequence (dim 1), all-gathered before attention and the MLP and
    reduce-scattered after them, as in the PyTorch TP tutorial."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    plan = {name: ColwiseParallel() for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1")}
    if not sequence_parallel:
        plan.update({"attention.wo": RowwiseParallel(), "feed_forward.w2": RowwiseParallel()})
        return plan
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                 "attention": gather, "feed_forward": gather,
                 "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                 "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))})
    return plan


def saved_activation_bytes(run, parameters=()) -> dict:
    """The bytes autograd saves for backward while ``run()`` executes, each storage once, parameters left
    out (they are not activations): counted with ``torch.autograd.graph.saved_tensors_hooks``. A DTensor
    counts its local shard, what this rank holds. Returns ``{"bytes", "tensors"}``; ``tensors`` lists each
    saved storage's shape and bytes, largest first."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t._local_tensor if isinstance(t, DTensor) else t

    skip = {local(p).untyped_storage().data_ptr() for p in parameters}
    seen: dict[int, tuple] = {}

    def pack(tensor):
        t = local(tensor)
        key = t.untyped_storage().data_ptr()
        if key not in skip and key not in seen:
            seen[key] = (list(t.shape), t.untyped_storage().nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    tensors = sorted(seen.values(), key=lambda item: -item[1])
    return {"bytes": sum(n for _, n in tensors), "tensors": tensors}


def _comm_counts(mode) -> dict:
    return {str(op).split(".")[-1]: count for op, count in mode.get_comm_counts().items() if count}


def tensor_demo(batch: int, seq: int, dim: int, heads: int, seed: int = 0) -> dict:
    """The block unsplit, tensor parallel and tensor + sequence parallel on this world's ranks: largest
    difference from the unsplit output, and from its gradients relative to each gradient's largest element,
    saved activation bytes, collectives per pass."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(batch, seq, dim, generator=torch.Generator().manual_seed(seed + 1))
    reference = make_block(dim, heads, seed)
    single = saved_activation_bytes(lambda: reference(x.clone().requires_grad_(True)), reference.parameters())
    ref_out = reference(x)
    ref_out.sum().backward()
    ref_grads = {name: p.grad for name, p in reference.named_parameters()}
    report = {"batch": batch, "seq": seq, "dim": dim, "heads": heads, "single": single, "layouts": {}}
    rows = slice(rank * seq // world, (rank + 1) * seq // world)  # this rank's part of the sequence
    for layout, sp in (("tensor parallel", False), ("tensor + sequence parallel", True)):
        block = parallelize_module(make_block(dim, heads, seed), mesh, tp_plan(sp))
        given = x[:, rows] if sp else x  # sequence parallel: each rank starts with its slice of the sequence
        saved = saved_activation_bytes(lambda: block(given.clone().requires_grad_(True)), block.parameters())
        forward_mode, backward_mode = CommDebugMode(), CommDebugMode()
        with forward_mode:
            out = block(given)
        with backward_mode:
            out.sum().backward()  # under SP each rank's sum is of its own rows: together, the whole sum
        expected = ref_out[:, rows] if sp else ref_out
        grad_error = 0.0
        for name, p in block.named_parameters():
            grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            scale = ref_grads[name].abs().max().item() or 1.0  # relative: a norm's gradient sums over s*b rows
            grad_error = max(grad_error, (grad - ref_grads[name]).abs().max().item() / scale)
        placements = {name: str(p.placements[0]) if isinstance(p, DTensor) else "plain tensor (every rank whole)"
                      for name, p in block.named_parameters()}
        report["layouts"][layout] = {"output_error": (out - expected).abs().max().item(), "grad_error": grad_error,
                                     "saved": saved, "forward_comms": _comm_counts(forward_mode),
                                     "backward_comms": _comm_counts(backward_mode), "placements": placements}
    return report


def korthikanti_bytes(s: int, b: int, h: int, t: int, sequence_parallel: bool) -> float:
    """Korthikanti et al. (arXiv 2205.05198, section 4), the attention-score term (5as/h) left out: bytes of
    activations per layer and rank with 16-bit activations and 1-byte dropout masks: sbh(10 + 24/t) under
    tensor parallelism, sbh * 34 / t with sequence parallelism too (t = 1: the unsplit 34 sbh)."""
    return s * b * h * (34 / t if sequence_parallel else 10 + 24 / t)


def plot_saved(reports: list[dict], hardware: str):
    """Saved activation bytes per rank for each layout, in units of sbh bytes: measured (float32, no dropout),
    Korthikanti et al.'s count converted to float32 without dropout masks, and their count as written (16-bit,
    with dropout masks)."""
    import matplotlib.pyplot as plt

    r = reports[0]
    t, sbh = len(reports), r["seq"] * r["batch"] * r["dim"]
    labels = ["unsplit (t = 1)", f"tensor parallel (t = {t})", f"tensor + sequence parallel (t = {t})"]
    measured = [r["single"]["bytes"]] + [max(q["layouts"][k]["saved"]["bytes"] for q in reports)
                                          for k in ("tensor parallel", "tensor + sequence parallel")]
    splits = [(1, False), (t, False), (t, True)]
    paper = [korthikanti_bytes(1, 1, 1, k, sp) for k, sp in splits]
    # float32 doubles each 16-bit element; without dropout the two 1-byte masks (2 sbh; split by t under SP) go
    converted = [2 * (value - (2 / k if sp else 2)) for value, (k, sp) in zip(paper, splits)]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    xs = range(len(labels))
    for offset, values, label in ((-0.27, [m / sbh for m in measured], "measured: float32, no dropout"),
                                  (0.0, converted, "Korthikanti et al., converted to float32, no dropout"),
                                  (0.27, paper, "Korthikanti et al. as written: 16-bit, dropout masks")):
        ax.bar([x + offset for x in xs], values, 0.27, label=label)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("activation bytes per rank / (s·b·h)")
    ax.set_xlabel("layout of one transformer block (attention scores left out of the formula)")
    ax.set_title(f"Bytes saved for backward per rank, one block (s={r['seq']}, b={r['batch']}, h={r['dim']}), "
                 f"{t} {backend_of(reports)} processes, measured on {hardware}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --- pipelines -------------------------------------------------------------------------------------------

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def stage_module(index: int, layers: int, width: int) -> nn.Sequential:
    """Pipeline stage ``index``'s layers: ``layers`` Linear + GELU of ``width``, weights seeded by the index."""
    torch.manual_seed(1000 + index)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.GELU())])


def _timed(stage, spans: list, local: int):
    """Wrap ``stage``'s forward_one_chunk and backward_one_chunk (what every schedule calls to compute one
    micro-batch) so that each call appends ``(kind, micro-batch, local stage, start, end)`` to ``spans``."""
    forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

    def timed_forward(index, *args, **kwargs):
        start = time.perf_counter()
        out = forward(index, *args, **kwargs)
        spans.append(("forward", index, local, start, time.perf_counter()))
        return out

    def timed_backward(index, *args, **kwargs):
        start = time.perf_counter()
        out = backward(index, *args, **kwargs)
        spans.append(("backward", index, local, start, time.perf_counter()))
        return out

    stage.forward_one_chunk, stage.backward_one_chunk = timed_forward, timed_backward


def pipeline_demo(schedule: str, microbatches: int, rows: int, width: int, layers: int, virtual: int,
                  steps: int = 4) -> dict:
    """One rank = one pipeline rank holding ``virtual`` stages (2 for the interleaved schedule: stages r and
    r + p, as ``ScheduleInterleaved1F1B`` expects), each ``layers`` Linear + GELU. ``steps`` steps are run;
    returns this rank's spans (``_timed``) of every step but the first (``quickest_step`` picks one)."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    rank, world = dist.get_rank(), dist.get_world_size()
    total = world * virtual
    indices = [rank + k * world for k in range(virtual)]
    spans: list = []
    stages = []
    for local, index in enumerate(indices):
        stage = PipelineStage(stage_module(index, layers, width), index, total, torch.device("cpu"))
        _timed(stage, spans, local)
        stages.append(stage)
    loss = nn.MSELoss()
    if schedule == "interleaved_1f1b":
        runner = ScheduleInterleaved1F1B(stages, microbatches, loss_fn=loss)
    else:
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        runner = kind(stages[0], microbatches, loss_fn=loss)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(microbatches * rows, width, generator=g), torch.randn(microbatches * rows, width, generator=g)
    first, last = 0 in indices, total - 1 in indices
    kept = []
    for _ in range(steps):
        spans.clear()
        dist.barrier()
        runner.step(*((x,) if first else ()), target=y if last else None)
        kept.append(list(spans))
    return {"schedule": schedule, "rank": rank, "stages": world, "virtual": virtual, "microbatches": microbatches,
            "backend": dist.get_backend(), "steps": kept[1:]}  # the first step pays one-off set-up (buffers, the first backward): left out


def quickest_step(reports: list[dict]) -> list[dict]:
    """Every rank's report of one pipeline run reduced to one step, the step whose window (first computation
    to last, over all ranks) was shortest: on a shared machine the others were slowed by other processes.
    Each returned report carries that step's ``spans``."""
    def window(k):
        spans = [s for r in reports for s in r["steps"][k]]
        return max(s[4] for s in spans) - min(s[3] for s in spans)

    best = min(range(len(reports[0]["steps"])), key=window)
    return [{**{key: v for key, v in r.items() if key != "steps"}, "spans": r["steps"][best]} for r in reports]


def busy_seconds(report: dict) -> float:
    """Seconds this rank spent computing in the step (its forward and backward spans)."""
    return sum(end - start for *_, start, end in report["spans"])


def bubble_measured(reports: list[dict]) -> dict:
    """From every rank's report of one step: the window (first computation's start to last one's end over
    all ranks), and per rank the busy and idle seconds, with idle / busy (the bubble over the ideal time,
    as the formula counts it) and idle / window (the share of the step spent idle)."""
    start = min(s[3] for r in reports for s in r["spans"])
    end = max(s[4] for r in reports for s in r["spans"])
    window = end - start
    ranks = []
    for r in reports:
        busy = busy_seconds(r)
        ranks.append({"rank": r["rank"], "busy": busy, "idle": window - busy,
                      "over_ideal": (window - busy) / busy, "over_total": (window - busy) / window})
    mean = lambda key: sum(q[key] for q in ranks) / len(ranks)  # noqa: E731
    return {"window": window, "ranks": ranks, "over_ideal": mean("over_ideal"), "over_total": mean("over_total")}


def in_flight_peak(report: dict) -> int:
    """The most micro-batches whose activations this rank held at once (forwards finished, their backward
    not yet), over all its stages: each forward adds one, each backward frees one."""
    held = peak = 0
    for kind, *_ in sorted(report["spans"], key=lambda s: s[3]):
        held += 1 if kind == "forward" else -1
        peak = max(peak, held)
    return peak


def plot_schedules(runs: dict, hardware: str):
    """The measured timelines, one panel per schedule (``runs`` maps a schedule to its ranks' reports)."""
    import matplotlib.pyplot as plt

    rows = sum(len(reports) for reports in runs.values())
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 0.8 * rows + 1.2 * len(runs) + 1))
    axes = axes if len(runs) > 1 else [axes]
    colors = {("forward", 0): "tab:blue", ("backward", 0): "tab:orange",
              ("forward", 1): "tab:cyan", ("backward", 1): "tab:red"}
    for ax, (schedule, reports) in zip(axes, runs.items()):
        start = min(s[3] for r in reports for s in r["spans"])
        for r in reports:
            for kind, index, local, b, e in r["spans"]:
                ax.barh(r["rank"], 1000 * (e - b), left=1000 * (b - start), color=colors[(kind, local)],
                        alpha=0.8, edgecolor="white")
                ax.text(1000 * ((b + e) / 2 - start), r["rank"], str(index), ha="center", va="center", fontsize=6)
        measured = bubble_measured(reports)
        ax.set_yticks([r["rank"] for r in reports], [f"rank {r['rank']}" for r in reports])
        ax.invert_yaxis()
        ax.set_ylabel("pipeline rank")
        ax.set_title(f"{schedule}: p={reports[0]['stages']}, m={reports[0]['microbatches']}, v={reports[0]['virtual']}; "
                     f"idle/busy {measured['over_ideal']:.2f} measured", fontsize=8)
    axes[-1].set_xlabel("time since the step's first computation (ms, time.perf_counter)")
    fig.suptitle(f"Pipeline schedules, {backend_of(next(iter(runs.values())))} processes, measured on {hardware}\n"
                 "blue/orange: forward/backward (cyan/red: the second virtual stage's), number = micro-batch", fontsize=9)
    fig.tight_layout()
    return fig


def plot_bubbles(rows: list[dict], hardware: str):
    """Measured idle / busy against the formula (p-1)/(v m), per schedule and number of micro-batches."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    markers = {"gpipe": "o", "1f1b": "s", "interleaved_1f1b": "^"}
    for schedule in dict.fromkeys(r["schedule"] for r in rows):
        mine = [r for r in rows if r["schedule"] == schedule]
        line, = ax.plot([r["microbatches"] for r in mine], [r["measured"] for r in mine], marker=markers[schedule],
                        label=f"{schedule}, measured (v={mine[0]['virtual']})")
        ax.plot([r["microbatches"] for r in mine], [r["formula"] for r in mine], linestyle="--",
                color=line.get_color(), label=f"{schedule}, (p-1)/(v m)")
    ax.set_xlabel("micro-batches per step, m (count)")
    ax.set_ylabel("bubble: idle time / busy time per rank")
    p = rows[0]["stages"]
    ax.set_title(f"Pipeline bubble, p={p} ranks ({rows[0]['backend']}), measured on {hardware}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


DEMOS = {"tensor", "pipeline"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Lesson 18's demonstrations, one rank each; start with torchrun "
                                                 "(python -m torch.distributed.run --nproc-per-node=N "
                                                 "-m gpucourse.model_parallel DEMO --out DIR).")
    parser.add_argument("demo", choices=sorted(DEMOS))
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<N>.json")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--schedules", type=str, default="gpipe,1f1b,interleaved_1f1b")
    parser.add_argument("--microbatches", type=str, default="4", help="pipeline: comma-separated counts")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4, help="pipeline: Linear + GELU layers per rank")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("start this with torchrun: it needs RANK, WORLD_SIZE and MASTER_ADDR from it")
    import torch.distributed as dist

    init_process_group(device="cpu")  # every demo here keeps its tensors on the CPU: gloo
    if args.demo == "tensor":
        report = tensor_demo(args.batch, args.seq, args.dim, args.heads)
    else:
        runs = []
        for schedule in args.schedules.split(","):
            virtual = 2 if schedule == "interleaved_1f1b" else 1
            for m in (int(v) for v in args.microbatches.split(",")):
                # the same model whatever the schedule: `layers` per rank, split into `virtual` stages
                runs.append(pipeline_demo(schedule, m, args.rows, args.width, args.layers // virtual, virtual))
        report = {"runs": runs}
    report.update(rank=dist.get_rank(), world_size=dist.get_world_size(), backend=dist.get_backend())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    close_process_group()  # every rank done, then destroyed while Python is whole: a clean exit
    return 0


def run(demo: str, nproc: int, timeout: float = 300, **options) -> list[dict]:
    """Launch ``demo`` on ``nproc`` ranks with torchrun and return every rank's report, in rank order
    (raises with the output's tail if the launch failed)."""
    return run_demo("gpucourse.model_parallel", demo, nproc, timeout, **options)[0]


if __name__ == "__main__":
    exit_rank(main())  # skips the interpreter's shutdown, where a rank can abort (launch.exit_rank)

"""FSDP2 in practice: mixed precision, resharding, prefetching, HSDP, meta-device init, accumulation.
Taught in lesson 17 (lesson 13 introduced ``fully_shard``; this lesson measures its knobs).

Everything runs as ranks of ``torchrun`` with CPU tensors (gloo), each rank writing ``rank<N>.json``:

    torchrun --standalone --nproc-per-node=4 -m gpucourse.fsdp2_in_practice reshard --out DIR

- ``precision``: ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``: the dtypes the
  parameters are stored, gathered and computed in, the dtype gradients are reduced in, and the bytes of
  every all-gather with and without the policy (counted by :class:`CollectiveLog`);
- ``reshard``: ``reshard_after_forward`` True, False and an int: the peak bytes of parameters a rank holds
  during a step (:class:`ParameterMemory`) and the all-gathers it runs;
- ``prefetch``: a ``torch.profiler`` trace of one step with FSDP2's implicit prefetching and with
  ``set_modules_to_forward_prefetch``/``set_modules_to_backward_prefetch``: the order of collectives and
  compute;
- ``hsdp``: a 2-D ``DeviceMesh`` (replicate, shard): which rank holds which rows and which collective runs
  on which group;
- ``meta``: the model built on ``torch.device("meta")``, sharded, then ``to_empty`` and initialised;
- ``accumulate``: micro-steps with ``set_requires_gradient_sync(False)``: how many reduce-scatters run.

The model is a stack of blocks (Linear then ReLU), each block its own FSDP unit, the stack the root.
Its width (30 by default) is deliberately not a multiple of 4, so the padding FSDP2 adds shows.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from gpucourse.launch import backend_of, close_process_group, exit_rank, init_process_group, run_demo  # noqa: F401

ROWS = 8  # rows of each rank's batch


class Block(nn.Sequential):
    """One FSDP unit: Linear(width, width) then ReLU."""

    def __init__(self, width: int, device=None):
        super().__init__(nn.Linear(width, width, device=device), nn.ReLU())

    def reset_parameters(self):
        self[0].reset_parameters()


def stack(width: int, depth: int, seed: int = 0, device=None) -> nn.Sequential:
    """``depth`` blocks of ``width``, seeded: the same weights on every rank (not on the meta device)."""
    torch.manual_seed(seed)
    return nn.Sequential(*[Block(width, device) for _ in range(depth)])


def shard(model: nn.Sequential, mesh=None, **options) -> nn.Sequential:
    """``fully_shard`` every block, then the stack (the root, which holds no parameters of its own), over ``mesh``
    (all ranks, on the CPU, when None)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if mesh is None:  # these demos keep their tensors on the CPU; FSDP2's default mesh is on the accelerator torch
        # sees, cuda:<rank>, which fails on a machine with fewer GPUs than ranks (an H200: "invalid device ordinal")
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model:
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model


def batch(step: int, rank: int, width: int, seed: int = 0):
    """This rank's ``(x, y)`` of step ``step``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    return torch.randn(ROWS, width, generator=g), torch.randn(ROWS, width, generator=g)


def step(model, width: int, number: int = 0) -> float:
    """One forward and backward of the mean-squared error on this rank's batch (no optimizer step)."""
    import torch.distributed as dist

    x, y = batch(number, dist.get_rank(), width)
    loss = nn.functional.mse_loss(model(x).float(), y)
    loss.backward()
    return float(loss)


class CollectiveLog:
    """Every all-gather, reduce-scatter and all-reduce FSDP2 runs while this is active: its kind, dtype,
    elements in and out, and the ranks of its group.

    FSDP2 calls ``torch.distributed.all_gather_single``, ``reduce_scatter_single`` and ``all_reduce``
    through the module (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``), so wrapping those
    three names sees each call, whatever the backend; the profiler's trace sees them too (``prefetch``).
    Before torch 2.13 the first two were ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (still
    there, deprecated): every name this torch has is wrapped. An old name reaches the new function inside
    ``distributed_c10d``, not through this module's wrapped name, so each call is counted once."""

    NAMES = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
             "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
             "all_reduce": "all_reduce"}

    def __init__(self):
        self.calls: list[dict] = []

    @contextmanager
    def active(self):
        import torch.distributed as dist

        saved = {name: getattr(dist, name) for name in self.NAMES if hasattr(dist, name)}

        def wrap(name, original):
            def logged(*args, **kwargs):
                tensors = [a for a in args if torch.is_tensor(a)] + [v for k, v in kwargs.items() if torch.is_tensor(v)]
                group = kwargs.get("group")
                ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
                out, inp = (tensors[0], tensors[-1])  # (output, input) for the all-gathers and reduce-scatters; all_reduce: one tensor
                self.calls.append({"kind": self.NAMES[name], "dtype": str(inp.dtype).replace("torch.", ""),
                                   "numel_in": inp.numel(), "numel_out": out.numel(),
                                   "element_bytes": inp.element_size(), "group": ranks})
                return original(*args, **kwargs)
            return logged

        for name, original in saved.items():
            setattr(dist, name, wrap(name, original))
        try:
            yield self
        finally:
            for name, original in saved.items():
                setattr(dist, name, original)

    def summary(self) -> dict:
        """Per kind: the number of calls and the bytes this rank received (all-gather: the other ranks'
        shards, (group - 1) x input; reduce-scatter with a ring: (group - 1) x output)."""
        found: dict[str, dict] = {}
        for call in self.calls:
            entry = found.setdefault(call["kind"], {"calls": 0, "bytes_received": 0})
            entry["calls"] += 1
            chunk = call["numel_in"] if call["kind"] == "all_gather" else call["numel_out"]
            if call["kind"] != "all_reduce":
                entry["bytes_received"] += (len(call["group"]) - 1) * chunk * call["element_bytes"]
        return found


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor counts its local part)."""
    seen, total = set(), 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        if t.device.type == "meta":
            continue  # no storage at all
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.nbytes():
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


class ParameterMemory:
    """The bytes of parameters this rank holds, read while each Linear runs forward and backward: the
    sharded parameters (always kept) plus whatever each block has registered at that moment (its shard,
    its whole gathered parameters, or a post-forward shard). ``peak`` is the largest reading."""

    def __init__(self, model: nn.Sequential):
        self.model = model
        self.sharded = [p for p in model.parameters()]  # registered right after fully_shard: the shards
        self.readings: list[tuple[str, int]] = []
        for index, block in enumerate(model):
            block[0].register_forward_pre_hook(lambda module, args, i=index: self.read(f"forward {i}"))
            block[0].register_forward_hook(lambda module, args, out, i=index: self.read_in_backward(out, i))

    def read_in_backward(self, output, index: int) -> None:
        """Read when the gradient of block ``index``'s Linear output is computed: its backward is under way,
        after FSDP2's pre-backward hook gathered its parameters."""
        output.register_hook(lambda grad: self.read(f"backward {index}"))

    def read(self, moment: str) -> None:
        held = storage_bytes(self.sharded + [p for p in self.model.parameters()])
        self.readings.append((moment, held))

    @property
    def peak(self) -> int:
        return max(b for _, b in self.readings)


def precision_demo(width: int, depth: int) -> dict:
    """The dtypes FSDP2 keeps, gathers, computes and reduces in, with and without a bf16 policy."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy

    report = {}
    for label, policy in [("float32", MixedPrecisionPolicy()),
                          ("bf16 params, fp32 reduce", MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                            reduce_dtype=torch.float32))]:
        model = shard(stack(width, depth), mp_policy=policy)
        seen = {}
        model[0][0].register_forward_pre_hook(
            lambda m, args: seen.update(compute=str(m.weight.dtype), input=str(args[0].dtype)))
        log = CollectiveLog()
        with log.active():
            step(model, width)
        gathers = [c for c in log.calls if c["kind"] == "all_gather"]
        reduces = [c for c in log.calls if c["kind"] == "reduce_scatter"]
        weight = model[0][0].weight
        report[label] = {
            "stored": str(weight.dtype), "gathered": gathers[0]["dtype"],
            "computed": seen["compute"], "reduced": reduces[0]["dtype"], "gradient": str(weight.grad.dtype),
            "all_gather_bytes": [c["numel_out"] * c["element_bytes"] for c in gathers],
            "reduce_scatter_bytes": [c["numel_in"] * c["element_bytes"] for c in reduces],
            "summary": log.summary(), "world_size": dist.get_world_size()}
    return report


def reshard_demo(width: int, depth: int, settings: list) -> dict:
    """Per ``reshard_after_forward`` setting: the peak parameter bytes during a step and the collectives."""
    import torch.distributed as dist

    rows = []
    for setting in settings:
        model = shard(stack(width, depth), reshard_after_forward=setting)
        memory = ParameterMemory(model)
        log = CollectiveLog()
        with log.active():
            step(model, width)
        after_forward = [b for moment, b in memory.readings if moment.startswith("backward")][0]
        rows.append({"setting": setting, "world_size": dist.get_world_size(), "peak_parameter_bytes": memory.peak,
                     "parameter_bytes_at_backward_start": after_forward,
                     "sharded_bytes": storage_bytes(memory.sharded), "readings": memory.readings,
                     "collectives": log.summary(),
                     "all_gather_groups": [len(c["group"]) for c in log.calls if c["kind"] == "all_gather"],
                     "shapes": [list(p.shape) for p in model.parameters()]})
    return {"rows": rows}


def prefetch_demo(width: int, depth: int, explicit: bool) -> dict:
    """A profiled step (after one warm-up step): collectives and matrix products in the order they ran."""
    from torch.profiler import ProfilerActivity, profile

    model = shard(stack(width, depth))
    if explicit:  # each block asks for the next one's (forward) or the previous one's (backward) parameters
        blocks = list(model)
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 3])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - 2):i][::-1])
    step(model, width, 0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(model, width, 1)
    events = []
    for e in prof.events():
        name = e.name
        kind = ("all_gather" if "all_gather" in name and "copy" not in name else
                "reduce_scatter" if "reduce_scatter" in name else
                "compute" if name in ("aten::addmm", "aten::mm") else None)
        if kind:
            events.append({"name": name, "kind": kind, "start_us": e.time_range.start, "end_us": e.time_range.end,
                           "thread": e.thread})
    events.sort(key=lambda e: e["start_us"])
    origin = events[0]["start_us"] if events else 0
    for e in events:
        e["start_us"] -= origin
        e["end_us"] -= origin
    return {"explicit": explicit, "events": events}


def hsdp_demo(width: int) -> dict:
    """A 2 x 2 (replicate, shard) mesh: this rank's place, its groups, its rows and the collectives."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    replicate = dist.get_world_size() // 2
    mesh = init_device_mesh("cpu", (replicate, 2), mesh_dim_names=("replicate", "shard"))
    model = shard(stack(width, 1), mesh=mesh)
    weight = model[0][0].weight
    local = weight.to_local()
    full = stack(width, 1)[0][0].weight.detach()
    first_row = next(r for r in range(full.shape[0]) if local.shape[0] and torch.equal(full[r], local[0].detach()))
    log = CollectiveLog()
    with log.active():
        step(model, width)
    return {"coordinate": mesh.get_coordinate(), "mesh": mesh.mesh.tolist(),
            "shard_group": dist.get_process_group_ranks(mesh.get_group("shard")),
            "replicate_group": dist.get_process_group_ranks(mesh.get_group("replicate")),
            "placements": [str(p) for p in weight.placements], "local_rows": [first_row, first_row + local.shape[0]],
            "collectives": [{"kind": c["kind"], "group": c["group"], "dtype": c["dtype"]} for c in log.calls]}


def meta_demo(width: int, depth: int) -> dict:
    """Build on the meta device, shard, ``to_empty``, initialise; against a normal init of the same seed."""
    import torch.distributed as dist

    with torch.device("meta"):
        model = stack(width, depth)
    on_meta = storage_bytes(model.parameters())
    shard(model)
    sharded_meta = storage_bytes(model.parameters())
    model.to_empty(device="cpu")
    after_empty = storage_bytes(model.parameters())
    torch.manual_seed(0)
    for block in model:
        block.reset_parameters()
    local = model[0][0].weight.to_local()
    from_meta = [p.full_tensor() for p in model.parameters()]
    normal = list(stack(width, depth, seed=0).parameters())
    whole = sum(p.numel() * p.element_size() for p in normal)
    # a remedy that keeps every other rank free of the whole model: rank 0 alone builds it and sends the shards
    loaded = load_from_rank0(width, depth)
    return {"bytes_on_meta": on_meta, "bytes_sharded_on_meta": sharded_meta, "bytes_after_to_empty": after_empty,
            "bytes_of_whole_model": whole, "world_size": dist.get_world_size(),
            "first_local_values": local.reshape(-1)[:3].tolist(),
            "same_as_normal_init": all(torch.equal(a, b) for a, b in zip(from_meta, normal)),
            "max_difference": max(float((a - b).abs().max()) for a, b in zip(from_meta, normal)),
            "rank0_broadcast_same": all(torch.equal(a.full_tensor(), b) for a, b in zip(loaded.parameters(), normal))}


def load_from_rank0(width: int, depth: int, seed: int = 0):
    """Meta-built and sharded on every rank; rank 0 alone initialises the whole model (seeded) and
    ``set_model_state_dict(..., broadcast_from_rank0=True)`` sends each rank its shards."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    with torch.device("meta"):
        model = stack(width, depth)
    shard(model)
    model.to_empty(device="cpu")
    full = stack(width, depth, seed).state_dict() if dist.get_rank() == 0 else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return model


def accumulate_demo(width: int, depth: int, micro: int) -> dict:
    """``micro`` micro-batches, gradients synchronised on every one, or only on the last one."""
    rows = {}
    for label in ("sync every micro-step", "set_requires_gradient_sync(False) until the last"):
        model = shard(stack(width, depth))
        log = CollectiveLog()
        with log.active():
            for i in range(micro):
                if label.startswith("set_"):
                    model.set_requires_gradient_sync(i == micro - 1)
                step(model, width, i)
        rows[label] = {"collectives": log.summary(),
                       "gradient": torch.cat([p.grad.full_tensor().reshape(-1) for p in model.parameters()]).tolist()}
    return rows



def overlap_us(events: list[dict]) -> float:
    """Microseconds during which a collective's work on gloo's own threads ran at the same time as a matrix
    product on the main thread (the events of one ``prefetch_demo``)."""
    main = {e["thread"] for e in events if e["kind"] == "compute"}
    comms = [e for e in events if e["kind"] != "compute" and e["thread"] not in main]
    compute = [e for e in events if e["kind"] == "compute"]
    return sum(max(0, min(a["end_us"], b["end_us"]) - max(a["start_us"], b["start_us"])) for a in comms for b in compute)


def plot_reshard(rows: list[dict], hardware: str, note: str):
    """Peak parameter bytes per rank and all-gather bytes received per step, per reshard_after_forward."""
    import matplotlib.pyplot as plt

    labels = [str(r["setting"]) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    axes[0].bar(labels, [r["peak_parameter_bytes"] for r in rows], color="tab:blue")
    axes[0].axhline(rows[0]["sharded_bytes"], color="gray", linestyle="--", label="the shards alone")
    axes[0].set_ylabel("peak parameter bytes per rank (B)")
    axes[0].legend(fontsize=8)
    axes[1].bar(labels, [r["collectives"]["all_gather"]["bytes_received"] for r in rows], color="tab:orange")
    axes[1].set_ylabel("all-gather bytes received per step (B)")
    for ax in axes:
        ax.set_xlabel("reshard_after_forward")
    fig.suptitle(f"FSDP2 resharding, {rows[0]['world_size']} gloo processes on {hardware}\n{note}", fontsize=8)
    fig.tight_layout()
    return fig


def plot_trace(reports: dict, hardware: str, note: str):
    """Rank 0's profiled step, implicit and explicit prefetching: collectives and matrix products in time."""
    import matplotlib.pyplot as plt

    colors = {"all_gather": "tab:orange", "reduce_scatter": "tab:green", "compute": "tab:blue"}
    fig, ax = plt.subplots(figsize=(9, 3.2))
    rows = []
    for label, report in reports.items():
        main = {e["thread"] for e in report["events"] if e["kind"] == "compute"}
        for lane, on_main in (("main thread", True), ("gloo threads", False)):
            y = len(rows)
            rows.append(f"{label}: {lane}")
            for e in report["events"]:
                if (e["thread"] in main) == on_main:
                    ax.barh(y, (e["end_us"] - e["start_us"]) / 1000, left=e["start_us"] / 1000,
                            color=colors[e["kind"]], edgecolor="black", linewidth=0.3)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("time since the step's first event (ms)")
    for kind, color in colors.items():
        ax.barh([], [], color=color, label=kind.replace("_", "-"))
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"One FSDP2 step on rank 0 (torch.profiler), gloo on {hardware}\n{note}", fontsize=8)
    fig.tight_layout()
    return fig

DEMOS = {"precision", "reshard", "prefetch", "hsdp", "meta", "accumulate"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Lesson 17's demonstrations, one rank each; start with torchrun.")
    parser.add_argument("demo", choices=sorted(DEMOS | {"all"}))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--width", type=int, default=30)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--settings", type=str, default="True,False,2")
    parser.add_argument("--micro", type=int, default=4)
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("start this with torchrun: it needs RANK, WORLD_SIZE and MASTER_ADDR from it")
    import torch.distributed as dist

    init_process_group(device="cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    settings = [{"True": True, "False": False}[s] if s in ("True", "False") else int(s) for s in args.settings.split(",")]
    demos = {  # each a function of nothing: "all" runs every one in the same launch (one start-up, not six)
        "precision": lambda: precision_demo(args.width, args.depth),
        "reshard": lambda: reshard_demo(args.width, args.depth, settings),
        "prefetch": lambda: {"implicit": prefetch_demo(args.width, args.depth, False),
                             "explicit": prefetch_demo(args.width, args.depth, True)},
        "hsdp": lambda: hsdp_demo(args.width),
        "meta": lambda: meta_demo(args.width, args.depth),
        "accumulate": lambda: accumulate_demo(args.width, args.depth, args.micro)}
    if args.demo == "all":
        report = {name: demos[name]() for name in demos}
    else:
        report = demos[args.demo]()
    report.update(rank=dist.get_rank(), world_size=dist.get_world_size(), backend=dist.get_backend(),
                  seconds=time.perf_counter() - start)
    (args.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    close_process_group()
    return 0


def run(demo: str, nproc: int, timeout: float = 300, **options) -> list[dict]:
    """Launch ``demo`` on ``nproc`` ranks; every rank's report in rank order."""
    reports, _ = run_demo("gpucourse.fsdp2_in_practice", demo, nproc, timeout, **options)
    return reports


if __name__ == "__main__":
    exit_rank(main())  # skips the interpreter's shutdown, where a rank can abort (launch.exit_rank)

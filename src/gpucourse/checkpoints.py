"""Checkpoints and restarts: distributed checkpoints (DCP), resharding on load, a rank that dies. Taught in lesson 16.

Everything here runs as ranks of ``torchrun`` (gloo between CPU processes, as lesson 13), each writing
``rank<N>.json``; ``run`` starts a demo from the notebook:

    torchrun --standalone --nproc-per-node=2 -m gpucourse.checkpoints save --ckpt DIR --out DIR

- ``save``: the lesson's model sharded with FSDP2 (``fully_shard``) and Adam, trained a few steps, saved
  with ``torch.distributed.checkpoint.save`` (each rank writes its own shards, rank 0 adds ``.metadata``),
  and, for comparison, the old way: the full state gathered on rank 0 and ``torch.save``d; then trained on;
- ``load``: a fresh model on any number of ranks loads that checkpoint (DCP reshards on load), reports the
  full weights and trains on the same global batches;
- ``train``: a training loop that checkpoints every ``--every`` steps and resumes from the last complete
  checkpoint; with ``--fail-rank``/``--fail-at`` that rank raises at that step on torchrun's first attempt
  only (``TORCHELASTIC_RESTART_COUNT == 0``), and ``torchrun --max-restarts=1`` restarts every rank;
- ``timing``: save time against model size, blocking ``dcp.save`` against ``dcp.async_save`` (the time the
  training loop waits) and the old full-state ``torch.save`` on rank 0.
- ``resume``: model and optimizer (``AppState``), a shuffling sampler (``ResumableSampler``) and each rank's RNG
  state (``RankRNG``), all DCP ``Stateful`` objects, saved mid-run; a restart that loads all of them, all but the
  RNG state, or the model and optimizer only, against the uninterrupted run;
- ``fault``: a rank that skips a collective (the other waits until the timeout) and one that raises.

Every batch is one global batch of ``GLOBAL_ROWS`` rows cut into equal slices per rank, so a run on 1, 2, 3 or
4 ranks computes the same mean gradient: the weights after a resumed run can be compared across world sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch import nn

from gpucourse.launch import close_process_group, exit_rank, run_demo
# the Stateful objects a checkpoint holds besides model and optimizer (section 6), in a module of their own
from gpucourse.resumable_state import DATASET_ROWS, LOADER_BATCH, AppState, RankRNG, ResumableSampler  # noqa: F401
from gpucourse.sharded_data_parallel import IN_FEATURES, OUT_FEATURES, lesson_model

GLOBAL_ROWS = 12  # divisible by 1, 2, 3 and 4 ranks: every rank's slice has the same size
POINTER = "LATEST"  # written by rank 0 once a checkpoint is complete: the training script's way to find it


def init_attempt_process_group():
    """``init_process_group`` (gloo) whose keys carry this attempt's number (lesson 16). torchrun's agent keeps
    one key-value store for every attempt of a launch, and torch 2.14's env:// rendezvous no longer prefixes the
    keys per attempt (older versions used ``/worker/attempt_<n>``): without a prefix a restarted gloo group here
    found the dead attempt's keys and sometimes failed to connect ("Connection refused")."""
    import torch.distributed as dist
    from datetime import timedelta

    from gpucourse.launch import collective_timeout

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # else rank 0 hosts the store
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_hosts and rank == 0, timeout=timedelta(seconds=60))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt_{attempt}", store), rank=rank,
                            world_size=world, timeout=collective_timeout())


def sharded_model(width: int, depth: int, seed: int = 0):
    """The lesson's MLP (lesson 13's) in float64, every Linear sharded with FSDP2 over all ranks, and Adam."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = lesson_model(width, depth, seed).to(torch.float64)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def global_batch(step: int, seed: int = 0):
    """Step ``step``'s whole batch ``(x, y)``, the same whatever the number of ranks."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return (torch.randn(GLOBAL_ROWS, IN_FEATURES, generator=g, dtype=torch.float64),
            torch.randn(GLOBAL_ROWS, OUT_FEATURES, generator=g, dtype=torch.float64))


def train_step(model, optimizer, step: int) -> float:
    """One step on this rank's equal slice of the global batch; FSDP2 averages the gradients over the ranks."""
    import torch.distributed as dist

    x, y = global_batch(step)
    rows = slice(dist.get_rank() * GLOBAL_ROWS // dist.get_world_size(),
                 (dist.get_rank() + 1) * GLOBAL_ROWS // dist.get_world_size())
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x[rows]), y[rows])
    loss.backward()
    optimizer.step()
    return float(loss)


def full_weights(model) -> list[float]:
    """Every parameter whole (a collective: every rank must call it), flattened in order."""
    return torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()]).tolist()


def save_checkpoint(model, optimizer, folder, step: int) -> float:
    """``dcp.save`` of model and optimizer (each rank its shards) plus the step; seconds it took."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    start = time.perf_counter()
    model_state, optimizer_state = get_state_dict(model, optimizer)  # sharded: DTensors, this rank's part
    dcp.save({"model": model_state, "optimizer": optimizer_state, "step": step}, checkpoint_id=str(folder))
    return time.perf_counter() - start


def load_checkpoint(model, optimizer, folder) -> int:
    """Load ``folder`` into this (already sharded) model and optimizer, in place; the step it was saved at."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)  # the shapes and shards DCP fills
    state = {"model": model_state, "optimizer": optimizer_state, "step": -1}
    dcp.load(state, checkpoint_id=str(folder))  # reshards: the saved world size need not be this one
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return int(state["step"])


def files_written(folder) -> dict[str, int]:
    """The checkpoint's files and their sizes in bytes."""
    return {p.name: p.stat().st_size for p in sorted(Path(folder).iterdir()) if p.is_file()}


def items_by_file(folder) -> dict[str, dict]:
    """What ``.metadata`` says each data file holds: its number of items (a tensor shard, or a value such as
    an optimizer setting), their bytes, and how many of them are the model's parameter shards."""
    from torch.distributed.checkpoint import FileSystemReader

    found: dict[str, dict] = {}
    for index, info in FileSystemReader(str(folder)).read_metadata().storage_data.items():
        entry = found.setdefault(info.relative_path, {"items": 0, "bytes": 0, "model_shards": 0, "other": 0})
        entry["items"] += 1
        entry["bytes"] += info.length
        if index.fqn.startswith("model."):
            entry["model_shards"] += 1
        elif index.offset is None:  # not a tensor: written once, by one rank
            entry["other"] += 1
    return dict(sorted(found.items()))


def full_state_on_rank0(model, optimizer) -> dict:
    """The old form: model and optimizer state gathered whole, copied to CPU, on rank 0 only (the other
    ranks get empty dicts). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optimizer_state = get_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": model_state, "optimizer": optimizer_state}


def tensor_bytes(tree) -> int:
    """Bytes of every tensor in a nested state dict."""
    if torch.is_tensor(tree):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensor_bytes(v) for v in tree)
    return 0


def save_demo(ckpt: Path, width: int, depth: int, steps: int, more: int) -> dict:
    """Train ``steps`` steps, save with DCP and the old way, train ``more`` steps; what each rank saw."""
    import torch.distributed as dist

    model, optimizer = sharded_model(width, depth)
    for step in range(steps):
        train_step(model, optimizer, step)
    seconds = save_checkpoint(model, optimizer, ckpt, steps)
    saved = full_weights(model)
    # the old way: model and optimizer state gathered whole onto rank 0 (full_state_dict), which alone saves it
    start = time.perf_counter()
    full = full_state_on_rank0(model, optimizer)
    old_bytes = 0
    if dist.get_rank() == 0:
        torch.save(full, ckpt.parent / "full_state.pt")
        old_bytes = (ckpt.parent / "full_state.pt").stat().st_size
    old_seconds = time.perf_counter() - start
    held = tensor_bytes(full)  # what this rank held to write it
    for step in range(steps, steps + more):
        train_step(model, optimizer, step)
    dist.barrier()
    return {"dcp_seconds": seconds, "weights_saved": saved, "weights_after_more": full_weights(model),
            "files": files_written(ckpt) if dist.get_rank() == 0 else {},
            "items": items_by_file(ckpt) if dist.get_rank() == 0 else {},
            "old_way": {"seconds": old_seconds, "file_bytes": old_bytes, "bytes_held": held}}


def load_demo(ckpt: Path, width: int, depth: int, steps: int, more: int) -> dict:
    """A fresh sharded model and optimizer on this world size load ``ckpt``, then train ``more`` steps."""
    model, optimizer = sharded_model(width, depth, seed=1)  # other weights: only the load can make them equal
    step = load_checkpoint(model, optimizer, ckpt)
    loaded = full_weights(model)
    for s in range(step, step + more):
        train_step(model, optimizer, s)
    local = sum(p.to_local().numel() for p in model.parameters())
    return {"step": step, "weights_loaded": loaded, "weights_after_more": full_weights(model),
            "local_parameters": local}


def latest_pointer(root: Path):
    """The checkpoint folder ``LATEST`` names, if any (rank 0 writes it only after a save has completed)."""
    pointer = root / POINTER
    return root / pointer.read_text().strip() if pointer.exists() else None


def train_demo(ckpt: Path, out: Path, width: int, depth: int, steps: int, every: int,
               fail_rank: int, fail_at: int) -> dict:
    """The resumable training loop. Each attempt logs its events (``events_rank<R>_attempt<A>.json``)."""
    import torch.distributed as dist

    rank, attempt = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    events, log = [], out / f"events_rank{rank}_attempt{attempt}.json"

    def note(kind, step, **extra):  # perf_counter: one clock for every process of this machine
        events.append({"event": kind, "step": step, "t": time.perf_counter(), **extra})
        log.write_text(json.dumps(events))

    note("started", None)
    model, optimizer = sharded_model(width, depth)
    start, found = 0, latest_pointer(ckpt)
    if found is not None:
        start = load_checkpoint(model, optimizer, found)
    note("resumed", start, checkpoint=found.name if found else None)
    for step in range(start, steps):
        if step == fail_at and rank == fail_rank and attempt == 0:
            note("failed", step)
            raise RuntimeError(f"rank {rank} fails at step {step} (a simulated crash, first attempt only)")
        train_step(model, optimizer, step)
        note("step", step + 1)
        if (step + 1) % every == 0 and step + 1 < steps:
            folder = ckpt / f"step_{step + 1}"
            seconds = save_checkpoint(model, optimizer, folder, step + 1)
            if rank == 0:  # after dcp.save returned on every rank: .metadata is written, the checkpoint complete
                (ckpt / (POINTER + ".tmp")).write_text(folder.name)
                os.replace(ckpt / (POINTER + ".tmp"), ckpt / POINTER)  # atomic: never a half-written pointer
            dist.barrier()
            note("saved", step + 1, seconds=seconds)
    return {"attempt": attempt, "weights": full_weights(model)}


def timing_demo(ckpt: Path, widths: list[int], depth: int) -> dict:
    """Per width: seconds of a blocking ``dcp.save``, of ``dcp.async_save`` until it returns and until its
    write finished, and of the old gather-to-rank-0 ``torch.save``."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    checkpoint_group = dist.new_group(backend="gloo")  # async saves talk on a group of their own
    rows = []
    for width in widths:
        model, optimizer = sharded_model(width, depth)
        train_step(model, optimizer, 0)
        dist.barrier()
        blocking = save_checkpoint(model, optimizer, ckpt / f"w{width}_blocking", 1)
        dist.barrier()
        model_state, optimizer_state = get_state_dict(model, optimizer)
        start = time.perf_counter()
        future = dcp.async_save({"model": model_state, "optimizer": optimizer_state},
                                checkpoint_id=str(ckpt / f"w{width}_async"), process_group=checkpoint_group)
        returned = time.perf_counter() - start  # the training loop could go on from here
        future.result()
        finished = time.perf_counter() - start
        dist.barrier()
        start = time.perf_counter()
        full = full_state_on_rank0(model, optimizer)
        if dist.get_rank() == 0:
            torch.save(full, ckpt / f"w{width}_full.pt")
        dist.barrier()
        old = time.perf_counter() - start
        parameters = sum(p.numel() for p in lesson_model(width, depth).parameters())
        rows.append({"width": width, "parameters": parameters, "blocking_seconds": blocking,
                     "async_returned_seconds": returned, "async_finished_seconds": finished,
                     "full_state_seconds": old,
                     "dcp_bytes": sum(files_written(ckpt / f"w{width}_blocking").values())})
    return {"rows": rows}


# --- section 6: what else a checkpoint must hold (Stateful objects), and a rank that fails or hangs ---

def dropout_model(width: int, seed: int = 0):
    """A small MLP with dropout (so the random generator matters) in float64, sharded with FSDP2, and Adam."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN_FEATURES, width), nn.ReLU(), nn.Dropout(0.5),
                          nn.Linear(width, OUT_FEATURES)).to(torch.float64)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def loader_step(model, optimizer, sampler, data) -> list[int]:
    """One step on this rank's slice of the sampler's next global batch; that batch's indices."""
    import torch.distributed as dist

    indices = sampler.next_batch()
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = indices[rank * len(indices) // world:(rank + 1) * len(indices) // world]
    x, y = data
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
    optimizer.step()
    return indices


RESUME_VARIANTS = {"everything": ("app", "loader", "rng"), "no RNG state": ("app", "loader"),
                   "model and optimizer only": ("app",)}


def start_process(seed: int = 0):
    """What a (re)started rank does first: seed its generator, ``seed`` plus its rank (each rank its own masks)."""
    import torch.distributed as dist

    torch.manual_seed(100 + seed + dist.get_rank())


def resume_demo(ckpt: Path, width: int, steps: int, stop_at: int) -> dict:
    """Train ``steps`` steps with dropout and a shuffling sampler, saving model, optimizer, sampler and each
    rank's RNG state with DCP after ``stop_at``; then, per ``RESUME_VARIANTS``, new model, sampler and a re-seeded
    generator (what a restarted process starts with) load a part of that checkpoint and train to ``steps``."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    g = torch.Generator().manual_seed(7)
    data = (torch.randn(DATASET_ROWS, IN_FEATURES, generator=g, dtype=torch.float64),
            torch.randn(DATASET_ROWS, OUT_FEATURES, generator=g, dtype=torch.float64))
    model, optimizer = dropout_model(width)
    start_process()
    sampler, seen = ResumableSampler(), []
    for step in range(steps):
        if step == stop_at:
            dcp.save({"app": AppState(model, optimizer), "loader": sampler, "rng": RankRNG(dist.get_rank()),
                      "step": step}, checkpoint_id=str(ckpt))
            rng_at_save = torch.get_rng_state()
        seen.append(loader_step(model, optimizer, sampler, data))
    report = {"uninterrupted": {"batches": seen[stop_at:], "first_batches": seen[:steps - stop_at],
                                "weights": full_weights(model)}}
    other = [None] * dist.get_world_size()
    dist.all_gather_object(other, rng_at_save.tolist())
    report["rng_differs_from_rank0"] = other[dist.get_rank()] != other[0]
    if dist.get_rank() == 0:
        from torch.distributed.checkpoint import FileSystemReader

        keys = FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
        report["saved_keys"] = sorted(k for k in keys if not k.startswith("app."))
    for name, parts in RESUME_VARIANTS.items():
        model, optimizer = dropout_model(width, seed=1)  # other weights: only the load makes them right
        start_process()
        sampler = ResumableSampler()
        state = {"app": AppState(model, optimizer), "loader": sampler, "rng": RankRNG(dist.get_rank()), "step": -1}
        state = {key: state[key] for key in (*parts, "step")}
        dcp.load(state, checkpoint_id=str(ckpt))  # loads only the keys asked for
        batches = [loader_step(model, optimizer, sampler, data) for _ in range(int(state["step"]), steps)]
        report[name] = {"batches": batches, "weights": full_weights(model), "resumed_at": int(state["step"])}
    return report


def fault_demo(out: Path, timeout_seconds: float) -> dict:
    """Two faults of rank 1 in one launch, rank 0 waiting in an ``all_reduce`` each time; both ranks log events
    with ``time.perf_counter()`` (``faults_rank<R>.json``). First rank 1 skips the collective (it sleeps instead)
    on a group whose timeout is ``timeout_seconds``; then it raises, and the launch ends."""
    import torch.distributed as dist
    from datetime import timedelta

    rank, events = dist.get_rank(), []
    skip_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_seconds))
    dist.barrier()  # both ranks are up: the launch's start-up is not in what is timed

    def note(event, **extra):
        events.append({"event": event, "t": time.perf_counter(), **extra})
        (out / f"faults_rank{rank}.json").write_text(json.dumps(events))

    def failed(error):
        note("error", type=type(error).__name__, message=str(error).splitlines()[0][:160])

    if rank == 1:
        note("skip")
        time.sleep(timeout_seconds + 1)  # a branch only this rank took: it never calls that all_reduce
    else:
        try:
            dist.all_reduce(torch.ones(1), group=skip_group)
            note("returned")
        except Exception as error:  # caught only so that this launch can show the second fault too
            failed(error)
    dist.barrier()  # the default group: rank 1 is back
    if rank == 1:
        note("raise")
        raise RuntimeError("rank 1 raises before the all_reduce (a simulated crash)")
    try:
        dist.all_reduce(torch.ones(1))
    except Exception as error:
        failed(error)
        raise
    note("returned")
    return {}


def run_fault(timeout_seconds: float = 4) -> dict:
    """Launch ``fault_demo`` on 2 ranks; per fault (``"skip"``, ``"raise"``) the seconds from rank 1's fault until
    rank 0's ``all_reduce`` failed (None if rank 0 saw no error: torchrun stopped it first) and its error; for the
    raise, also until the launch had ended. Lesson 16."""
    import tempfile

    from gpucourse.launch import torchrun

    with tempfile.TemporaryDirectory(prefix="gpucourse-faults-") as out:
        launch = torchrun(["-m", "gpucourse.checkpoints", "fault", "--out", out, "--ckpt", out,
                           f"--timeout={timeout_seconds}"], nproc=2, timeout=120 + 2 * timeout_seconds)
        ended = time.perf_counter()
        logs = [json.loads((Path(out) / f"faults_rank{r}.json").read_text()) if (Path(out) / f"faults_rank{r}.json").exists()
                else [] for r in (0, 1)]
    faults, seen = [e for e in logs[1] if e["event"] in ("skip", "raise")], iter(logs[0])
    found = {"returncode": launch.returncode, "timeout_seconds": timeout_seconds, "output": launch.output}
    for fault in faults:  # rank 0's first event after each fault is what that fault did to it
        answer = next((e for e in seen if e["t"] >= fault["t"]), None)
        error = answer if answer and answer["event"] == "error" else None
        found[fault["event"]] = {"seconds_to_error": error["t"] - fault["t"] if error else None,
                                 "error": f"{error['type']}: {error['message']}" if error else None}
    if "raise" in found:
        found["raise"]["seconds_to_end"] = ended - next(f["t"] for f in faults if f["event"] == "raise")
    return found


DEMOS = {"save", "load", "train", "timing", "resume", "fault"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Lesson 16's demonstrations, one rank each; start with torchrun "
                                                 "(python -m torch.distributed.run --nproc-per-node=N -m gpucourse.checkpoints DEMO ...).")
    parser.add_argument("demo", choices=sorted(DEMOS))
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<N>.json")
    parser.add_argument("--ckpt", type=Path, required=True, help="the checkpoint folder (save, load) or root (train)")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--widths", type=str, default="64,256", help="timing: comma-separated widths")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--more", type=int, default=3)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--stop-at", type=int, default=5, help="resume: the step the checkpoint is saved at")
    parser.add_argument("--timeout", type=float, default=4, help="fault: the skipped collective's timeout, seconds")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("start this with torchrun: it needs RANK, WORLD_SIZE and MASTER_ADDR from it")
    import torch.distributed as dist

    init_attempt_process_group()
    args.out.mkdir(parents=True, exist_ok=True)
    args.ckpt.mkdir(parents=True, exist_ok=True)
    if args.demo == "save":
        report = save_demo(args.ckpt, args.width, args.depth, args.steps, args.more)
    elif args.demo == "load":
        report = load_demo(args.ckpt, args.width, args.depth, args.steps, args.more)
    elif args.demo == "train":
        report = train_demo(args.ckpt, args.out, args.width, args.depth, args.steps, args.every,
                            args.fail_rank, args.fail_at)
    elif args.demo == "resume":
        report = resume_demo(args.ckpt, args.width, args.steps, args.stop_at)
    elif args.demo == "fault":
        report = fault_demo(args.out, args.timeout)
    else:
        report = timing_demo(args.ckpt, [int(w) for w in args.widths.split(",")], args.depth)
    report.update(rank=dist.get_rank(), world_size=dist.get_world_size())
    (args.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    close_process_group()  # every rank done, then destroyed while Python is whole: a clean exit
    return 0


def run(demo: str, nproc: int, ckpt, out=None, timeout: float = 300, max_restarts: int = 0, **options):
    """Launch ``demo`` on ``nproc`` ranks (``torchrun --max-restarts``) with checkpoints under ``ckpt``;
    every rank's report in rank order, and the launch (its wall time, its output). Raises with the output's
    tail if the launch failed. ``out``: where the ranks write (a temporary folder when None)."""
    return run_demo("gpucourse.checkpoints", demo, nproc, timeout, out=out, launcher=(f"--max-restarts={max_restarts}",),
                    ckpt=ckpt, **options)


def read_events(out) -> list[dict]:
    """Every event the ranks of a ``train`` launch logged, each with its rank and attempt, in time order."""
    events = []
    for path in Path(out).glob("events_rank*_attempt*.json"):
        rank, attempt = (int(part) for part in path.stem.replace("events_rank", "").split("_attempt"))
        events += [{**e, "rank": rank, "attempt": attempt} for e in json.loads(path.read_text())]
    return sorted(events, key=lambda e: e["t"])


def restart_cost(events: list[dict]) -> dict:
    """From a failed-and-restarted ``train`` launch's events: the seconds from the failure until every rank
    of the second attempt had resumed, the step it resumed from and the steps done twice."""
    failed = next(e for e in events if e["event"] == "failed")
    last = max(e["attempt"] for e in events)  # the attempt that finished (a restart may itself be retried)
    resumed = [e for e in events if e["event"] == "resumed" and e["attempt"] == last]
    reached = max(e["step"] for e in events if e["event"] == "step" and e["attempt"] == 0 and e["rank"] == failed["rank"])
    return {"failed_at": failed["step"], "resumed_from": resumed[0]["step"],
            "seconds_to_resume": max(e["t"] for e in resumed) - failed["t"],
            "steps_redone": reached - resumed[0]["step"], "attempts": last + 1}


def plot_save_times(rows: list[dict], hardware: str, world_size: int):
    """Seconds a save costs the training loop against the model's bytes: blocking DCP, async DCP (until it
    returns, and until written) and the old full state gathered on rank 0."""
    import matplotlib.pyplot as plt

    mib = [r["dcp_bytes"] / 2**20 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label, marker in [("blocking_seconds", "dcp.save (blocking)", "o"),
                               ("async_returned_seconds", "dcp.async_save: until it returns", "v"),
                               ("async_finished_seconds", "dcp.async_save: until written", "^"),
                               ("full_state_seconds", "full state gathered to rank 0 + torch.save (old)", "s")]:
        ax.plot(mib, [r[key] for r in rows], marker=marker, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("checkpoint size, model + Adam state (MiB, float64)")
    ax.set_ylabel("time (s)")
    ax.set_title(f"Checkpoint save time, {world_size} gloo processes, measured on {hardware}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    exit_rank(main())  # skips the interpreter's shutdown, where a rank can abort (launch.exit_rank)

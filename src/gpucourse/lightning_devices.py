"""Lightning on many devices. Taught in lesson 6.

- ``regression_data`` and ``MLP``: one small problem, trained two ways;
- ``train_plain``: the hand-written loop with ``.to(device)`` everywhere (what Lightning replaces);
- ``LitRegressor``: the same model as a LightningModule, every hook in its place, writing down which
  process ran ``prepare_data`` and ``setup`` so the lesson can show the difference under DDP; it logs
  one synchronized metric, ``val_loss`` (lesson 7's exercise on synchronized metrics is left to you);
- ``quiet_trainer``: a Trainer without logger, checkpoints or progress bar, for short demonstrations
  (``ddp_spawn`` in place of ``ddp_notebook`` where a fork cannot work: ``fork_blocked_by``);
- ``lightning_device_ids``: how Lightning itself parses ``devices=`` for a machine with N GPUs;
- ``REMOVED`` and ``try_trainer``: the 2021-22 Trainer arguments, run on the installed Lightning;
- ``fork_and_use_cuda`` and ``RECORDED_FORK_ERROR``: CUDA and fork, in the wrong order and the right one
  (for real on a GPU, in a fresh interpreter; as recorded on an H100 elsewhere);
- ``plot_ddp_timings``: the 1- vs 2-process chart, saying what was measured and on what.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytorch_lightning as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset, random_split

TRUE_WEIGHTS = torch.tensor([1.5, -2.0, 0.5, 3.0])


def regression_data(n: int = 512, seed: int = 0) -> TensorDataset:
    """``n`` rows of 4 features and a noisy linear target: small enough for any CPU."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ TRUE_WEIGHTS + 0.1 * torch.randn(n, generator=g))


class MLP(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.layers(x).squeeze(-1)


def train_plain(model: nn.Module, loader: DataLoader, epochs: int, lr: float, device: Any) -> list[float]:
    """The loop Lightning writes for you: every tensor moved by hand, every step spelled out."""
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
    return losses


class LitRegressor(pl.LightningModule):
    """The MLP as a LightningModule. ``data_dir`` receives the dataset file and ``hooks.log``, one line
    per ``prepare_data``/``setup`` call with the process's global rank and PID."""

    def __init__(self, data_dir: str, hidden: int = 32, lr: float = 1e-2, batch_size: int = 32, n: int = 512):
        super().__init__()
        self.save_hyperparameters()
        self.model = MLP(hidden)

    def _note(self, hook: str) -> None:
        with open(Path(self.hparams.data_dir) / "hooks.log", "a") as log:
            log.write(f"{hook} rank={self.global_rank} pid={os.getpid()}\n")

    # Once per machine, on local rank 0 only: download or write files. Never assign state here:
    # the other processes would not have it.
    def prepare_data(self):
        self._note("prepare_data")
        path = Path(self.hparams.data_dir) / "regression.pt"
        if not path.exists():
            torch.save(regression_data(self.hparams.n).tensors, path)

    # In every process: read what prepare_data wrote, split, assign state.
    def setup(self, stage: str):
        self._note(f"setup({stage})")
        x, y = torch.load(Path(self.hparams.data_dir) / "regression.pt")
        self.train_set, self.val_set = random_split(TensorDataset(x, y), [0.8, 0.2],
                                                    generator=torch.Generator().manual_seed(0))

    # No DistributedSampler here: Lightning adds one when it runs on several processes.
    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch  # already on the right device: Lightning moved the batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss  # Lightning calls backward, step and zero_grad

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), sync_dist=True)  # the mean over every process's batches

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def fork_blocked_by(visible_devices: str | None = None) -> str | None:
    """Why a ``ddp_notebook`` fit cannot run in this notebook's process (lesson 6), or None where it can.

    A MIG slice named by its UUID (``CUDA_VISIBLE_DEVICES=MIG-...``, as a scheduler hands one out): NVML
    cannot count it (torch's ``_device_count_nvml`` returns -1 for MIG names), so ``torch.cuda.device_count()``
    asks the CUDA runtime, which "poisons" fork (its docstring: it does not "if NVML discovery succeeds"),
    and every Trainer asks it (``lightning_fabric.accelerators.cuda.num_cuda_devices``) before forking.
    ``visible_devices`` defaults to this process's CUDA_VISIBLE_DEVICES."""
    if visible_devices is None:
        visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if any(part.strip().startswith("MIG-") for part in visible_devices.split(",")):
        return ("CUDA_VISIBLE_DEVICES names a MIG slice, which NVML cannot count, so every Trainer counts GPUs "
                "with the CUDA runtime in this process before forking, and a forked child cannot use CUDA")
    return None


def quiet_trainer(**kwargs) -> pl.Trainer:
    """``pl.Trainer(**kwargs)`` without logger, checkpoints, progress bar or model summary; where a fork
    cannot work (``fork_blocked_by``), ``strategy="ddp_spawn"`` in place of ``"ddp_notebook"``, said aloud
    (spawned processes start fresh; the LightningModule must be importable, as every one here is)."""
    defaults = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    why = fork_blocked_by() if kwargs.get("strategy") == "ddp_notebook" else None
    if why:
        print(f'strategy="ddp_spawn" instead of "ddp_notebook": {why}.')
        kwargs["strategy"] = "ddp_spawn"
    return pl.Trainer(**{**defaults, **kwargs})


def read_hook_log(data_dir: str | Path) -> list[str]:
    path = Path(data_dir) / "hooks.log"
    return path.read_text().splitlines() if path.exists() else []


def lightning_device_ids(devices: Any, available: int) -> Any:
    """What Lightning makes of ``Trainer(accelerator="gpu", devices=devices)`` on a machine with
    ``available`` GPUs: a list of GPU indices, None (no GPU), or the exception it raises."""
    from lightning_fabric.utilities import device_parser

    with mock.patch.object(device_parser, "_get_all_available_gpus", lambda **_: list(range(available))):
        try:
            return device_parser._parse_gpu_ids(devices, include_cuda=True)
        except Exception as error:  # the answer for a bad request is the error itself
            return error


# The 2021-22 Trainer arguments, what happened to them, and what to write today.
REMOVED = [
    ({"gpus": 2}, "removed in 2.0: one flag per device kind did not scale (TPUs, MPS, HPUs...)",
     'Trainer(accelerator="gpu", devices=2)'),
    ({"tpu_cores": 8}, "removed in 2.0, for the same reason", 'Trainer(accelerator="tpu", devices=8)'),
    ({"auto_select_gpus": True}, "removed in 2.0",
     'devices=-1 for every GPU; devices=find_usable_cuda_devices(2) for free GPUs in exclusive mode'),
    ({"strategy": "dp"}, "removed in 2.0: one process driving every GPU is slower than DDP, bound by the GIL",
     'strategy="ddp" in a script, "ddp_notebook" in a notebook'),
    ({"strategy": "ddp2"}, "support removed in 1.7, the class itself in 1.8", 'strategy="ddp"'),
    ({"strategy": "horovod"}, "the Horovod integration is gone: Lightning 2.x has no such strategy",
     'strategy="ddp" (or Horovod directly)'),
    ({"strategy": "ddp_sharded"}, "removed in 2.0 with the FairScale integration: sharding is in PyTorch now",
     'strategy="fsdp"'),
    ({"accelerator": "ddp"}, "before 1.5 accelerator= also chose how to distribute; strategy= took that over "
     "in 1.5, and strategy names in accelerator= were refused from 1.7",
     'Trainer(accelerator="gpu", strategy="ddp")'),
]


def try_trainer(**kwargs) -> str:
    """Build ``quiet_trainer(**kwargs)`` on the installed Lightning; "ok: <Strategy>" or the error's first line."""
    try:
        trainer = quiet_trainer(**kwargs)
    except Exception as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return f"ok: {type(trainer.strategy).__name__}"


# Run by fork_and_use_cuda in a fresh interpreter, so that the notebook's own process never holds CUDA.
FORK_DEMO = """
import multiprocessing as mp, sys, torch
def child(queue):
    try:
        torch.zeros(1, device="cuda")
        queue.put("the forked child used the GPU")
    except RuntimeError as error:
        queue.put(f"the forked child raised RuntimeError: {str(error).splitlines()[0]}")
if sys.argv[1] == "cuda first":
    torch.zeros(1, device="cuda")  # the parent initializes CUDA, then forks
queue = mp.get_context("fork").SimpleQueue()
process = mp.get_context("fork").Process(target=child, args=(queue,))
process.start()
print(queue.get())
process.join()
if sys.argv[1] == "fork first":
    torch.zeros(1, device="cuda")
    print("and the parent used the GPU after the fork")
"""

# What lesson 6 printed on a real GPU while its ddp_notebook cell came after a single-process fit
# (the last frames of the child's traceback, from the recorded run's test log).
RECORDED_FORK_ERROR = """Recorded on an NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, pytorch-lightning 2.6.6, 2026-11-25),
when this lesson still ran a single-process fit in the notebook's process before its ddp_notebook cell.
Process 0 (a ddp_notebook child) terminated with the following error:
  ...
  File ".../lightning_fabric/utilities/seed.py", line 146, in _collect_rng_states
    states["torch.cuda"] = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
  File ".../torch/cuda/random.py", line 47, in get_rng_state_all
    results = [get_rng_state(i) for i in range(device_count())]
  File ".../torch/cuda/random.py", line 33, in get_rng_state
    _lazy_init()
  File ".../torch/cuda/__init__.py", line 466, in _lazy_init
    raise RuntimeError(
RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method"""


def fork_and_use_cuda(order: str, timeout: float = 180) -> str:
    """In a fresh interpreter: initialize CUDA then fork a child that uses it (``"cuda first"``), or fork
    first (``"fork first"``). Returns what happened, in one or two lines. Needs an NVIDIA GPU."""
    if order not in ("cuda first", "fork first"):
        raise ValueError(f"order must be 'cuda first' or 'fork first', not {order!r}")
    run = subprocess.run([sys.executable, "-c", FORK_DEMO, order], capture_output=True, text=True, timeout=timeout)
    lines = run.stdout.strip().splitlines() or run.stderr.strip().splitlines()[-1:]
    return " ".join(lines) if lines else f"no output (exit status {run.returncode})"


def plot_ddp_timings(timings: dict[int, float], hardware: str | None = None, smoke: bool = False):
    """Seconds to fit per process count, titled with the hardware, and saying whether 2 processes were
    faster in *this* measurement: no speedup is claimed that was not measured. Returns the Figure."""
    import matplotlib.pyplot as plt

    from gpucourse.reference import this_machine

    if not timings or any(t <= 0 for t in timings.values()):
        raise ValueError(f"timings must map process counts to positive seconds, not {timings!r}")
    counts = sorted(timings)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.bar([f"{n} process{'es' if n > 1 else ''}" for n in counts], [timings[n] for n in counts], color="tab:blue")
    ax.set_xlabel("ddp_notebook processes (CPU, gloo)")
    ax.set_ylabel("time to fit, best of runs (s)")
    ax.set_title(f"LitRegressor fit, 1 vs {max(counts)} DDP processes\non {hardware or this_machine('cpu')}",
                 fontsize=9)
    one, many = timings[counts[0]], timings[counts[-1]]
    if many < one:
        note = f"measured: {max(counts)} processes {one / many:.2f}x faster than 1 (each trains on half the batches)"
    else:
        note = (f"measured: {max(counts)} processes {many / one:.2f}x SLOWER than 1: process start-up and one\n"
                "all-reduce per step cost more than the halved work")
    if smoke:
        note += "\nsmoke size: seconds of start-up and a few steps, too small to show DDP's scaling"
    ax.text(0.5, 0.97, note, transform=ax.transAxes, ha="center", va="top", fontsize=8,
            bbox=dict(facecolor="white", alpha=0.85, edgecolor="none"))
    ax.set_ylim(0, 1.45 * max(timings.values()))
    fig.tight_layout()
    return fig

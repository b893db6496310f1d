"""Lesson 11 (profiling): a training loop to profile, its labelled phases, and a timeline of a trace.

``torch.profiler`` records what a loop does; these helpers give lesson 11 something to record (a
regression model, a ``Dataset`` that can be made slow), a loop whose phases are labelled with
``record_function`` (``profile_training``), the exported trace as a list of events
(``load_trace``) and a figure of it (``draw_timeline``). Reading a diagnosis out of the events is
the lesson's exercise, not a helper.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

PHASES = ("data", "forward", "backward", "optimizer")  # the record_function labels of profile_training


class SlowDataset(Dataset):
    """``n`` random (features, target) pairs; each ``__getitem__`` sleeps ``delay`` seconds first, as a
    dataset that decodes images or reads files would spend them."""

    def __init__(self, n: int = 256, features: int = 32, delay: float = 0.0, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=g)
        self.y = self.x[:, :1] * 2 + 0.1 * torch.randn(n, 1, generator=g)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        return self.x[i], self.y[i]


def tiny_model(features: int = 32, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def profile_training(loader: DataLoader, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                     device="cpu", sync: bool = False, wait: int = 1, warmup: int = 1, active: int = 3):
    """Run ``wait + warmup + active`` training steps under ``torch.profiler.profile`` and return the profiler.

    Each step's phases run inside ``record_function`` ranges named as in ``PHASES``; ``sync=True`` adds
    the classic hidden synchronisation, ``running += loss.item()`` in the optimizer phase. CUDA
    activity is recorded when ``device`` is a CUDA device.
    """
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    device = torch.device(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    model.to(device)
    batches = iter(loader)
    running = 0.0
    with profile(activities=activities, record_shapes=True,
                 schedule=schedule(wait=wait, warmup=warmup, active=active)) as prof:
        for _ in range(wait + warmup + active):
            with record_function("data"):
                x, y = next(batches)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with record_function("forward"):
                loss = nn.functional.mse_loss(model(x), y)
            with record_function("backward"):
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
                if sync:
                    running += loss.item()
            prof.step()
    return prof


def load_trace(path) -> list[dict]:
    """The events of a trace written by ``prof.export_chrome_trace(path)``: its ``"traceEvents"`` list."""
    return json.loads(Path(path).read_text())["traceEvents"]


SYNC_NAMES = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize")


def draw_timeline(events: list[dict], phases=PHASES, title: str = "Profiled training steps"):
    """One row per labelled phase (its CPU ranges, ``cat == "user_annotation"``) and one for the host
    synchronisations (ops named in ``SYNC_NAMES``), on a time axis in milliseconds from the first range."""
    import matplotlib.pyplot as plt

    spans = {name: [] for name in phases}
    marks = []
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "user_annotation" and e.get("name") in spans:
            spans[e["name"]].append((e["ts"], e["dur"]))
        elif e.get("name") in SYNC_NAMES:
            marks.append(e["ts"])
    starts = [ts for ranges in spans.values() for ts, _ in ranges]
    origin = min(starts) if starts else 0.0
    fig, ax = plt.subplots(figsize=(9, 0.6 * (len(phases) + 1) + 1.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    rows = list(phases) + ["sync ops"]
    for row, name in enumerate(phases):
        bars = [((ts - origin) / 1000, dur / 1000) for ts, dur in spans[name]]
        ax.broken_barh(bars, (row - 0.4, 0.8), color=colors[row % len(colors)])
    ax.vlines([(ts - origin) / 1000 for ts in marks], len(phases) - 0.4, len(phases) + 0.4, color="black", linewidth=2)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("time since the first labelled range (ms)")
    ax.set_ylabel("phase")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def lightning_regressor(features: int = 32):
    """A ``LightningModule`` around ``tiny_model`` (imported here: Lightning takes seconds to import)."""
    import pytorch_lightning as pl

    class TinyRegressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = tiny_model(features)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return TinyRegressor()

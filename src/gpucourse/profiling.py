"""Lesson 11 (profiling): a training loop to profile, its labelled phases, and a timeline of a trace.

``torch.profiler`` records what a loop does; these helpers give lesson 11 something to record (a
regression model, a ``Dataset`` that can be made slow), a loop whose phases are labelled with
``record_function`` (``profile_training``), the exported trace as a list of events
(``load_trace``) and a figure of it (``draw_timeline``). Reading a diagnosis out of the events is
the lesson's exercise, not a helper.
"""

from __future__ import annotations

import json
import os
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
    # acc_events: keep the events of every cycle (there is one); without it torch warns on a GPU that it clears them
    with profile(activities=activities, record_shapes=True, acc_events=True,
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


def quiet_kineto_without_cuda() -> bool:
    """Keep the CUDA build's tracing library (Kineto) from printing ``gpuGetDeviceCount failed with
    code 35`` on a machine without a usable NVIDIA driver; returns whether it did.

    Kineto lists the machine's GPUs for the trace whatever activities were asked for, and logs the
    CUDA error it gets (35, ``cudaErrorInsufficientDriver``: no driver recent enough, here none) the
    first time a profile ends. Its log level, ``KINETO_LOG_LEVEL``, is read once, when the first
    profile starts: this sets it (unless it is set already) to silence Kineto's own messages,
    start/stop notes included, and only where CUDA is not available, so that on a GPU its errors
    still show. Call it before the first profile of the process.
    """
    if torch.version.cuda is None or torch.cuda.is_available():
        return False
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # above every level Kineto logs at: nothing printed
    return True


def profile_totals(prof) -> dict[str, float]:
    """The totals under a profiler table, in µs: "self CPU time" (the self CPU time of every
    recorded event, summed) and, when CUDA activity was recorded, "self CUDA time" (the GPU
    running kernels). Keys end with the number of active steps, as in the course's GPU reference."""
    events = prof.key_averages()
    steps = sum(e.count for e in events if e.key.startswith("ProfilerStep"))
    totals = {f"self CPU time, {steps} steps": float(events.self_cpu_time_total)}
    device = device_time_total(events)
    if device:
        totals[f"self CUDA time, {steps} steps"] = device
    return totals


def device_time_total(events) -> float:
    """µs the device spent running kernels, summed as the profiler's table sums its "Self CUDA time
    total": events on a device, except ``record_function`` ranges as the GPU saw them (their time
    is their kernels', already counted)."""
    from torch.autograd import DeviceType

    total = 0.0
    for e in events:
        on_device = e.device_type != DeviceType.CPU or getattr(e, "is_legacy", False)
        if on_device and not getattr(e, "is_user_annotation", False):
            total += getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))
    return float(total)


def step_ms(model: nn.Module, batch_size: int, device="cpu", graphed: bool = False, features: int = 32,
            min_seconds: float = 0.2, cpu_threads: int | None = 1) -> float:
    """Milliseconds per training step (forward, MSE loss, backward, SGD with momentum) of ``model`` on
    random data, eager or, with ``graphed=True`` (CUDA only), captured once in a ``torch.cuda.CUDAGraph``
    and replayed: one launch for the whole step instead of one per operation.

    Follows PyTorch's recipe for whole-network capture: warm-up steps on a side stream, gradients kept
    (``zero_grad(set_to_none=False)``) so that the captured step reuses their memory, static inputs.
    On a CPU the step runs on ``cpu_threads`` threads (one by default: a pool of threads costs a small
    model more than it gains, and other programs on the same cores make it erratic); None keeps torch's count.
    """
    from gpucourse.timing import seconds_per_call

    device = torch.device(device)
    if graphed and device.type != "cuda":
        raise ValueError("CUDA graphs need a CUDA device")
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch_size, features, device=device)
    y = torch.randn(batch_size, 1, device=device)

    def step():
        optimizer.zero_grad(set_to_none=False)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    if device.type == "cuda":  # warm up on a side stream, as capture requires
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
    run = step
    if graphed:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    threads = torch.get_num_threads()
    if device.type == "cpu" and cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    try:
        if device.type != "cuda":
            for _ in range(3):
                step()
        return 1000 * seconds_per_call(run, min_seconds=min_seconds)
    finally:
        torch.set_num_threads(threads)


def plot_busy(mine: dict[str, float], mine_label: str, reference: dict[str, float], reference_label: str,
              note: str | None = None):
    """The totals of ``profile_totals`` (µs) on this machine beside the reference GPU's, log scale
    (``gpucourse.reference.plot_beside``): how long the CPU worked and how long the GPU did. Returns the Figure."""
    from gpucourse.reference import plot_beside

    fig = plot_beside(mine, reference, title="Profiled steps: CPU time and GPU (kernel) time", unit="µs (log scale)",
                      mine_label=mine_label, reference_label=reference_label, note=note, log=True)
    fig.axes[0].set_xlabel("profiler total")
    _legend_below(fig)
    return fig


def plot_step_times(mine: dict[str, float], mine_label: str, reference: dict[str, float], reference_label: str,
                    note: str | None = None):
    """Milliseconds per training step by batch size, eager and as a CUDA graph, on this machine beside
    the reference GPU (``gpucourse.reference.plot_beside``, log scale). Returns the Figure."""
    from gpucourse.reference import plot_beside

    fig = plot_beside(mine, reference, title="A launch-bound training step, eager and as one CUDA graph",
                      unit="ms per step (log scale)", mine_label=mine_label, reference_label=reference_label,
                      note=note, log=True)
    fig.axes[0].set_xlabel("batch size and how the step is launched")
    _legend_below(fig)
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


def _legend_below(fig) -> None:
    """Move a one-axes figure's legend below the axes: hardware names are long."""
    ax = fig.axes[0]
    handles, labels = ax.get_legend_handles_labels()
    ax.get_legend().remove()
    fig.legend(handles, labels, loc="outside lower center", fontsize=8, title="hardware", title_fontsize=8)

"""Lesson 2 (CPU vs GPU, and CUDA): asynchronous execution, synchronization points, timing.

``AsyncDevice`` is the GPU idea in plain Python on the CPU: ``launch`` queues work on a worker
thread and returns at once, like a CUDA kernel launch; ``synchronize`` waits for the queue, like
``torch.cuda.synchronize``. Timing it shows the classic mistake on any laptop (the right harness is
the lesson's exercise, so it is not here); ``cuda_event_ms`` and ``torch.utils.benchmark`` time the
real thing on a GPU (the course's helpers time with ``gpucourse.timing``). The diagnosis of "why is my GPU not
available" is in ``gpucourse.doctor``.

``AsyncDevice`` records what ran (``spans``: when the CPU queued each launch and waited, when the
worker ran each piece of work), and ``plot_timeline`` draws those records, so the lesson's timeline
figure is what ran, not a drawing. ``CopyComputeDevice`` adds a second engine: a copy engine and a
compute engine fed by streams, to show when host-to-device copies overlap kernels and when they do
not. Both model *ordering and waiting* only (the work is ``time.sleep``); they say nothing about
how fast a real GPU or bus is.
"""

from __future__ import annotations

import os
import queue
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Span:
    """One interval of a timeline, in seconds since its device was created."""

    row: str  # "CPU", "GPU", "copy engine" or "compute engine"
    label: str
    start: float
    end: float
    kind: str  # "launch" (the CPU queues work), "wait" (the CPU blocks), "kernel" or "copy"


class AsyncDevice:
    """A stand-in GPU: a stream of work that runs in order, in the background.

    The first ``cold_launches`` launches cost ``cold_seconds`` more, as a GPU's first kernels do
    (module loading, autotuning, caches): what a warm-up exists to absorb. ``spans`` records, with
    ``time.perf_counter``, each launch and wait on the CPU and each piece of work on the worker.
    """

    def __init__(self, cold_launches: int = 2, cold_seconds: float = 0.15) -> None:
        self._work: queue.Queue = queue.Queue()
        self._cold, self._cold_seconds = cold_launches, cold_seconds
        self.launches = 0
        self.synchronizations = 0
        self.spans: list[Span] = []
        self._t0 = time.perf_counter()
        threading.Thread(target=self._run, daemon=True).start()

    def now(self) -> float:
        """Seconds since this device was created (the time axis of ``spans``)."""
        return time.perf_counter() - self._t0

    def _run(self) -> None:
        while True:
            seconds, done, label = self._work.get()
            start = self.now()
            time.sleep(seconds)
            if label is not None:
                self.spans.append(Span("GPU", label, start, self.now(), "kernel"))
            done.set()

    def launch(self, seconds: float, label: str | None = None) -> threading.Event:
        """Queue ``seconds`` of device work; returns at once with an event set when it is done."""
        start = self.now()
        done = threading.Event()
        extra = self._cold_seconds if self.launches < self._cold else 0.0
        self.launches += 1
        label = label or f"k{self.launches}"
        self._work.put((seconds + extra, done, label))
        self.spans.append(Span("CPU", label, start, self.now(), "launch"))
        return done

    def wait(self, done: threading.Event, label: str = ".item()") -> None:
        """Block the CPU until one launch has finished, as ``.item()`` on its result does.

        The stream runs in order, so that is also everything launched before it.
        """
        start = self.now()
        done.wait()
        self.spans.append(Span("CPU", label, start, self.now(), "wait"))

    def host(self, seconds: float, label: str = "Python") -> None:
        """Busy the CPU with ``seconds`` of its own work (preparing the next batch, say)."""
        start = self.now()
        time.sleep(seconds)
        self.spans.append(Span("CPU", label, start, self.now(), "host"))

    def synchronize(self, label: str = "synchronize()") -> None:
        """Wait until everything launched so far has finished."""
        start = self.now()
        self.synchronizations += 1
        marker = threading.Event()
        self._work.put((0.0, marker, None))
        marker.wait()
        self.spans.append(Span("CPU", label, start, self.now(), "wait"))


class Stream:
    """An in-order queue of device work, run by its own thread (a CUDA stream)."""

    def __init__(self, device: "CopyComputeDevice", name: str) -> None:
        self.device, self.name = device, name
        self._work: queue.Queue = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            op = self._work.get()
            if op[0] == "wait":  # a device-side wait: this stream waits, the CPU does not
                op[1].wait()
            elif op[0] == "mark":
                op[1].set()
            else:
                _, engine, seconds, label, done = op
                with self.device._engines[engine]:  # one piece of work per engine at a time
                    start = self.device.now()
                    time.sleep(seconds)
                    self.device.spans.append(Span(f"{engine} engine", f"{label} ({self.name})",
                                                  start, self.device.now(), engine if engine == "copy" else "kernel"))
                done.set()

    def record_event(self) -> threading.Event:
        """An event that is set when this stream reaches this point (``torch.cuda.Event.record``)."""
        event = threading.Event()
        self._work.put(("mark", event))
        return event

    def wait_event(self, event: threading.Event) -> None:
        """Work queued on this stream from now on waits for ``event``; returns at once (``Stream.wait_event``)."""
        self._work.put(("wait", event))

    def synchronize(self) -> None:
        """Block the CPU until this stream has run everything queued on it."""
        self.record_event().wait()


class CopyComputeDevice:
    """A stand-in GPU with a copy engine and a compute engine, fed by streams.

    What it models: work on one stream runs in order; work on different streams may run at the same
    time, but only on different engines (one copy and one kernel at once, as a GPU with one
    host-to-device copy engine); a copy returns to the CPU at once only when it is asynchronous
    (``pinned`` and ``non_blocking``), otherwise the CPU waits for it, as ``tensor.to("cuda")`` from
    pageable memory or with ``non_blocking=False`` does. What it does not model: bandwidth, staging
    buffers, memory. The work is ``time.sleep``; the times recorded in ``spans`` are real.
    """

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._engines = {"copy": threading.Lock(), "compute": threading.Lock()}
        self.spans: list[Span] = []
        self.default_stream = Stream(self, "default stream")
        self._streams = [self.default_stream]

    def now(self) -> float:
        """Seconds since this device was created (the time axis of ``spans``)."""
        return time.perf_counter() - self._t0

    def stream(self, name: str) -> Stream:
        """A new stream (``torch.cuda.Stream()``)."""
        made = Stream(self, name)
        self._streams.append(made)
        return made

    def copy(self, seconds: float, stream: Stream | None = None, *, pinned: bool = False,
             non_blocking: bool = False, label: str = "copy") -> threading.Event:
        """Queue a host-to-device copy of ``seconds`` on ``stream`` (default: the default stream)."""
        stream = stream or self.default_stream
        start, done = self.now(), threading.Event()
        stream._work.put(("op", "copy", seconds, label, done))
        if pinned and non_blocking:
            self.spans.append(Span("CPU", label, start, self.now(), "launch"))
        else:  # the CPU waits for the copy to finish
            done.wait()
            self.spans.append(Span("CPU", f"{label} (blocking)", start, self.now(), "wait"))
        return done

    def kernel(self, seconds: float, stream: Stream | None = None, label: str = "kernel") -> threading.Event:
        """Queue ``seconds`` of compute on ``stream``; returns at once."""
        stream = stream or self.default_stream
        start, done = self.now(), threading.Event()
        stream._work.put(("op", "compute", seconds, label, done))
        self.spans.append(Span("CPU", label, start, self.now(), "launch"))
        return done

    def synchronize(self, label: str = "synchronize()") -> None:
        """Block the CPU until every stream has run everything queued on it."""
        start = self.now()
        for stream in list(self._streams):
            stream.synchronize()
        self.spans.append(Span("CPU", label, start, self.now(), "wait"))


_COLORS = {"launch": "#3c78d8", "wait": "#cc0000", "host": "#999999", "kernel": "#6aa84f", "copy": "#e69138"}


def plot_timeline(spans: Iterable[Span], title: str = "CPU launches, GPU runs later", ax=None,
                  rows: Sequence[str] | None = None):
    """Draw recorded spans as a timeline: one row per ``Span.row``, time in milliseconds.

    Launches are thin blue ticks (they take microseconds), CPU waits red, CPU work grey, kernels
    green and copies orange. Returns the Figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    spans = list(spans)
    rows = list(rows) if rows is not None else list(dict.fromkeys(s.row for s in spans))
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 0.7 * len(rows) + 1.6))
    else:
        fig = ax.figure
    origin = min((s.start for s in spans), default=0.0)  # time 0: the first thing recorded
    end = (max((s.end for s in spans), default=0.0) - origin) * 1000
    tick = max(end / 150, 1e-3)  # launches take microseconds: draw them at least this wide (ms), on top
    for y, row in enumerate(rows):
        for s in (s for s in spans if s.row == row):
            launch = s.kind == "launch"
            width = max((s.end - s.start) * 1000, tick)
            ax.broken_barh([((s.start - origin) * 1000, width)], (y - 0.35, 0.35 if launch else 0.7),
                           facecolors=_COLORS.get(s.kind, "#666666"), edgecolor="white", linewidth=0.5,
                           zorder=3 if launch else 2)
            if not launch and width > end / 25:
                ax.text((s.start - origin) * 1000 + width / 2, y + 0.15, s.label.split(" (")[0], ha="center",
                        va="center", fontsize=7, color="white", clip_on=True, zorder=4)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.5 + 0.6, -0.5)  # top row first; room at the bottom for the legend
    ax.set_xlim(0, end * 1.02 if end else 1)
    ax.set_xlabel("time since the first recorded event (ms)")
    ax.set_ylabel("where it runs")
    ax.set_title(title)
    kinds = [k for k in _COLORS if any(s.kind == k for s in spans)]
    names = {"launch": "CPU queues work", "wait": "CPU waits", "host": "CPU works", "kernel": "kernel", "copy": "copy"}
    ax.legend(handles=[Patch(color=_COLORS[k], label=names[k]) for k in kinds], loc="lower right", fontsize=7,
              ncol=len(kinds))
    fig.tight_layout()
    return fig


# Example core counts from the vendors' own spec pages (as of 2024/25): AMD's Ryzen 9 9950X product page
# (16 cores, 32 threads) and NVIDIA's H100 architecture whitepaper (H100 SXM5: 132 SMs, 128 FP32 lanes
# ("CUDA cores") each, 16,896 in all). A GPU "core" here is one FP32 lane, far simpler than a CPU core.
CORE_EXAMPLES = {"AMD Ryzen 9 9950X\n(desktop CPU): cores": 16,
                 "NVIDIA H100 SXM5\n(datacenter GPU): SMs": 132,
                 "NVIDIA H100 SXM5: FP32 lanes\n(\"CUDA cores\")": 16_896}


def this_machine_cores() -> dict[str, int]:
    """This machine's logical CPUs and, with CUDA, its first GPU's SM count."""
    found = {"this machine: logical CPUs\n(os.cpu_count())": os.cpu_count() or 1}
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            found[f"this machine: {props.name}\nSMs (multi_processor_count)"] = props.multi_processor_count
    except ImportError:
        pass
    except RuntimeError:  # NVML sees a GPU that CUDA cannot start (a driver too old): the CPU only
        pass
    return found


def plot_core_counts(counts: dict[str, int] | None = None, title: str = "A few big cores, thousands of small lanes"):
    """Bar chart of core counts on a log scale: ``CORE_EXAMPLES`` plus this machine's by default."""
    import matplotlib.pyplot as plt

    counts = dict(counts) if counts is not None else {**CORE_EXAMPLES, **this_machine_cores()}
    fig, ax = plt.subplots(figsize=(8, 3.8))
    names, values = list(counts), list(counts.values())
    colors = ["#3c78d8" if "CPU" in n else "#6aa84f" for n in names]
    bars = ax.bar(range(len(values)), values, color=colors)
    ax.bar_label(bars, labels=[f"{v:,}" for v in values], fontsize=8)
    ax.set_xticks(range(len(names)), names, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("count (units, log scale)")
    ax.set_xlabel("processor and what is counted")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def naive_seconds(run: Callable[[], object], repeats: int = 5) -> float:
    """The classic mistake: a host clock around launches, no synchronization, no warm-up.

    Kept by hand on purpose: it is what the lesson shows going wrong. Measure with
    ``gpucourse.timing.seconds_per_call`` (``torch.utils.benchmark``) or ``cuda_event_ms``.
    """
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - start) / repeats


def cuda_event_ms(run: Callable[[], object], warmup: int = 3, repeats: int = 20) -> float:
    """Median milliseconds per call measured on the GPU itself with CUDA events (needs CUDA)."""
    import torch

    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def matmul_tflops(n: int, seconds: float) -> float:
    """TFLOP/s of an n×n by n×n matrix product that took ``seconds`` (2·n³ operations)."""
    return 2 * n**3 / seconds / 1e12


# The code of exercise 2, as shown in the notebook: which lines make the CPU wait for the GPU?
SYNC_EXERCISE = '''\
x = torch.randn(4096, 4096, device="cuda")
y = x @ x
total = y.sum()
if total > 0:
    y = y * 2
big = torch.nonzero(y > 1)
peak = y.max()
print(peak)
scaled = y / peak
mean = scaled.mean().item()
z = scaled[:8].cpu()
scaled.add_(1)
torch.cuda.synchronize()
w = torch.empty_like(scaled).copy_(scaled)
'''


# Figures of lesson 2's measurements. The hardware each series ran on is in its legend label
# (``gpucourse.reference.this_machine()`` for this machine, ``Reference.label()`` for the reference GPU).

def plot_matmul_sizes(series: Mapping[str, Mapping[int, float]], note: str | None = None):
    """float32 matrix-product throughput (GFLOP/s) against n, one line per hardware (its legend
    label), both axes on log scales. Returns the Figure."""
    import matplotlib.pyplot as plt

    if not series or not any(series.values()):
        raise ValueError("nothing to plot: no measurements")
    fig, ax = plt.subplots(figsize=(6.5, 4.0), layout="constrained")
    for label, values in series.items():
        sizes = sorted(values)
        ax.plot(sizes, [values[n] for n in sizes], "o-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("n (n×n @ n×n, float32 with TF32 off)")
    ax.set_ylabel("GFLOP/s (log scale)")
    ax.set_title("Matrix product throughput by size" + (f"\n{note}" if note else ""), fontsize=10)
    ax.legend(fontsize=8, title="hardware", title_fontsize=8)
    _legend_below(fig)
    return fig


def plot_times(mine: Mapping[str, float], mine_label: str, reference: Mapping[str, float], reference_label: str,
               title: str, note: str | None = None):
    """Milliseconds per call of the same named measurements on two machines, side by side on a log
    scale (``gpucourse.reference.plot_beside``). Returns the Figure."""
    from gpucourse.reference import plot_beside

    fig = plot_beside(mine, reference, title=title, unit="ms per call (log scale)", mine_label=mine_label,
                      reference_label=reference_label, note=note, log=True)
    fig.axes[0].set_xlabel("what was timed")
    _legend_below(fig)
    return fig


def _legend_below(fig) -> None:
    """Move a one-axes figure's legend below the axes: hardware names are long."""
    ax = fig.axes[0]
    handles, labels = ax.get_legend_handles_labels()
    ax.get_legend().remove()
    fig.legend(handles, labels, loc="outside lower center", fontsize=8, title="hardware", title_fontsize=8)

"""Lesson 2 (CPU vs GPU, and CUDA): asynchronous execution, synchronization points, timing.

``AsyncDevice`` is the GPU idea in plain Python on the CPU: ``launch`` queues work on a worker
thread and returns at once, like a CUDA kernel launch; ``synchronize`` waits for the queue, like
``torch.cuda.synchronize``. Timing it shows the classic mistake on any laptop (the right harness is
the lesson's exercise, so it is not here); ``cuda_event_ms`` and ``torch.utils.benchmark`` time the
real thing on a GPU (the course's helpers time with ``gpucourse.timing``). The diagnosis of "why is my GPU not
available" is in ``gpucourse.doctor``.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from typing import Callable


class AsyncDevice:
    """A stand-in GPU: a stream of work that runs in order, in the background.

    The first ``cold_launches`` launches cost ``cold_seconds`` more, as a GPU's first kernels do
    (module loading, autotuning, caches): what a warm-up exists to absorb.
    """

    def __init__(self, cold_launches: int = 2, cold_seconds: float = 0.15) -> None:
        self._work: queue.Queue = queue.Queue()
        self._cold, self._cold_seconds = cold_launches, cold_seconds
        self.launches = 0
        self.synchronizations = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            seconds, done = self._work.get()
            time.sleep(seconds)
            done.set()

    def launch(self, seconds: float) -> threading.Event:
        """Queue ``seconds`` of device work; returns at once with an event set when it is done."""
        done = threading.Event()
        extra = self._cold_seconds if self.launches < self._cold else 0.0
        self.launches += 1
        self._work.put((seconds + extra, done))
        return done

    def synchronize(self) -> None:
        """Wait until everything launched so far has finished."""
        self.synchronizations += 1
        marker = threading.Event()
        self._work.put((0.0, marker))
        marker.wait()


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


# The code of exercise 3, as shown in the notebook: which lines make the CPU wait for the GPU?
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

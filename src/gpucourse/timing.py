"""How long one call of some PyTorch work takes, measured with ``torch.utils.benchmark``.

Taught in lesson 2 (timing asynchronous GPU work) and used by lessons 3 to 5's helpers. The
benchmark ``Timer`` does what a hand-written loop around ``time.perf_counter`` gets wrong on a GPU:
it synchronizes CUDA before reading the clock (a launch returns before the kernel has run), runs
the work before measuring (the first calls pay for loading kernels and allocating), and repeats it
in blocks long enough to time. A host clock around a whole program or training run (a ``torchrun``
launch, a Trainer's ``fit``) is a different measurement and stays one.
"""

from __future__ import annotations

from typing import Callable


def seconds_per_call(fn: Callable[[], object], min_seconds: float = 0.2, calls: int | None = None) -> float:
    """Seconds per call of ``fn()``: the median over blocks of calls lasting ``min_seconds`` in all
    (``Timer.blocked_autorange``), or, with ``calls``, the mean of exactly that many calls after two
    warm-up calls (``Timer.timeit``: for work too slow to repeat much, such as a training step).

    Runs with this process's thread count (the Timer's own default is one thread).
    """
    import torch
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    if calls is not None:
        return timer.timeit(number=calls).median
    return timer.blocked_autorange(min_run_time=min_seconds).median

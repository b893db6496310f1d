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


def conditions(smoke: bool | None = None) -> str:
    """What a chart's numbers were measured under, for its label (lessons 4, 5 and 15): the smoke size
    when ``GPUCOURSE_SMOKE`` shrinks the run (or ``smoke``), and this machine's load, the 1-minute load
    average over the CPUs this process may use (``os.getloadavg``). A small run on busy cores can show
    any ratio; the label says that it was one."""
    import os

    from gpucourse import environment

    if smoke is None:
        smoke = environment.smoke()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        average = os.getloadavg()[0]
        load, busy = f"load {average:.1f} on {cpus} CPUs", average > 0.75 * cpus
    except OSError:  # no load average on this system
        load, busy = f"{cpus} CPUs, load unknown", False
    return f"{'smoke size' if smoke else 'full size'}, {load}" + (" (busy: other programs share them)" if busy else "")


def chart_note(note: str | None, contradiction: str | None = None, smoke: bool | None = None) -> str:
    """A chart's note with the run's :func:`conditions`; where this run's numbers contradict the note
    (``contradiction``: what they show), the note says so instead of leaving the chart to disagree."""
    where = conditions(smoke)
    if contradiction:
        return ((note + " " if note else "") + f"This run shows otherwise ({contradiction}) at {where}: too small "
                "or too busy a run to show it; run it at full size on an idle machine.")
    return (note + " " if note else "") + f"(Measured here at {where}.)"


def fastest_attempt(measure: Callable[[], dict], expected: float, attempts: int = 3, slack: float = 1.2) -> dict:
    """``measure()`` (a dict with the ``seconds`` it measured) again while it took more than ``slack`` times
    ``expected`` (what the work itself takes), up to ``attempts`` times: the fastest attempt.

    A busy machine only ever adds time (late wake-ups, a sleep that overruns), so a time pushed out by load
    comes back down when measured again; a measurement that times the wrong thing stays wrong: too long every
    time (warm-up or queued work included, a sum not divided by the count), or too short (no synchronize),
    which load never produces. Used by the checks of lesson 2's ``measure`` exercise."""
    best = None
    for _ in range(attempts):
        got = measure()
        if best is None or got["seconds"] < best["seconds"]:
            best = got
        if got["seconds"] <= slack * expected:
            break
    return best

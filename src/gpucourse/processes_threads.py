"""Lesson 1 (processes, threads and the GIL): workloads, runners and measurements.

Every function here lives at module level on purpose: under the ``spawn`` and ``forkserver``
start methods a child process receives a function by *name* (pickled by reference) and imports
it, so workloads defined in a notebook cell cannot be sent to a process pool there.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import sysconfig
import textwrap
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Sequence

KINDS = ("serial", "threads", "processes", "asyncio")


# --- the machine -------------------------------------------------------------------------

def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity (``taskset``, SLURM, a container's cpuset).

    A CPU-time quota (``docker run --cpus``) is not an affinity and does not show here.
    """
    if hasattr(os, "process_cpu_count"):  # 3.13+
        count = os.process_cpu_count()
    elif hasattr(os, "sched_getaffinity"):
        count = len(os.sched_getaffinity(0))
    else:
        count = os.cpu_count()
    return count or 1


def interpreter_facts() -> dict[str, Any]:
    """Python version, free-threaded build or not, GIL on or off, and the start methods."""
    free_threaded_build = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    gil_check = getattr(sys, "_is_gil_enabled", None)  # 3.13+
    return {
        "python": sys.version.split()[0],
        "free_threaded_build": free_threaded_build,
        "gil_enabled": gil_check() if gil_check else True,
        "default_start_method": mp.get_start_method(allow_none=True) or mp.get_context().get_start_method(),
        "start_methods": mp.get_all_start_methods(),
        "usable_cores": usable_cores(),
    }


# --- workloads ---------------------------------------------------------------------------

def count_primes(limit: int) -> int:
    """CPU-bound pure Python: trial division below ``limit``. Holds the GIL throughout."""
    count = 0
    for n in range(2, limit):
        d = 2
        while d * d <= n:
            if n % d == 0:
                break
            d += 1
        else:
            count += 1
    return count


_BLOCK = bytes(range(256)) * 4096  # 1 MiB: far above the 2 KiB where hashlib drops the GIL


def hash_rounds(rounds: int) -> str:
    """CPU-bound work in C that releases the GIL: SHA-256 over ``rounds`` MiB."""
    digest = hashlib.sha256()
    for _ in range(rounds):
        digest.update(_BLOCK)
    return digest.hexdigest()


def wait_io(seconds: float) -> float:
    """I/O-bound stand-in: sleeping releases the GIL exactly as a blocking socket read does."""
    time.sleep(seconds)
    return seconds


async def wait_io_async(seconds: float) -> float:
    """The coroutine twin of :func:`wait_io`: yields to the event loop instead of blocking."""
    await asyncio.sleep(seconds)
    return seconds


def square(x: float) -> float:
    """A trivial picklable function, for checking that a parallel map keeps order."""
    return x * x


def worker_identity(x: Any, seconds: float = 0.02) -> tuple[Any, int, int]:
    """``(x, process id, thread id)`` after a short sleep, so that a pool spreads the calls."""
    time.sleep(seconds)
    return x, os.getpid(), threading.get_ident()


def sleep_then_return(pair: tuple[Any, float]) -> Any:
    """Sleep ``pair[1]`` seconds, return ``pair[0]``: later items can finish first."""
    value, seconds = pair
    time.sleep(seconds)
    return value


# Lesson 1's time-lock modulus: the product of two random 1024-bit primes. The primes are kept by the
# grader only; without them no shortcut to the end of a chain of squarings is known.
MODULUS = int(
    "db93ab0266d5822cf51be297af4722c1d56601e61e2073330c76a6b922b6977e4c8234fce64b5d05f91fd1d8f98498a8"
    "16a64c0b9ec8128553836e1432ddf68ab126cd058ba7b8f7fa07bfff5570321b28aa7614db8429442393d9dd18f3fb54"
    "0b34008adb9d8903a3ac26dae88fe9c6dfd48e9fa54391586a5d49fa142cb356dc86e11b62186be977bad873b6cc982d"
    "f9cf33576610663009e82793efa353ad425bcff24b749f40f1ac5d0b23f58f4e0e806068b3c494e5b9b53e387892c914"
    "7fd0deb54b9d2301ca49710abaa4133e160b77514e7a9c6b6dbc476ff710f39eece6db61a1b2be6997f8fdc0f8eb1641"
    "8ec939011ff93ac84b95e43e45a1075d"
    , 16)


def square_chain(item: tuple[Any, int, int]) -> tuple[Any, int]:
    """Lesson 1's GIL-bound work whose result proves it was done: ``item`` is ``(x, base, squarings)``;
    squares ``base`` modulo :data:`MODULUS`, ``squarings`` times one after the other, and returns
    ``(x, base ** (2 ** squarings) % MODULUS)``.

    This is Rivest, Shamir and Wagner's time-lock puzzle ("Time-lock puzzles and timed-release crypto",
    MIT/LCS/TR-684, 1996): each squaring needs the one before, so the chain cannot be split across cores,
    and without the factors ``p, q`` of the modulus nobody knows a faster way to its end. Whoever holds
    them (here the grader) checks a result with two short modular powers instead:
    ``pow(base, pow(2, squarings, phi), MODULUS)`` with ``phi = (p - 1) * (q - 1)`` (Euler's theorem).
    So a returned value shows that the work was done, and the CPU time of whichever process ran this
    function grows by it: a parallel map cannot skip it or do it elsewhere unseen.
    """
    value, base, squarings = item
    result = base
    for _ in range(squarings):
        result = result * result % MODULUS
    return value, result


# --- runners -----------------------------------------------------------------------------

def run_serial(fn: Callable, args: Sequence, workers: int = 1) -> list:
    return [fn(a) for a in args]


def run_threads(fn: Callable, args: Sequence, workers: int) -> list:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, args))


def run_processes(fn: Callable, args: Sequence, workers: int, start_method: str | None = None) -> list:
    context = mp.get_context(start_method)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        return list(pool.map(fn, args))


def run_asyncio(coro_fn: Callable, args: Sequence, workers: int) -> list:
    """At most ``workers`` coroutines in flight, all in one thread."""

    async def main() -> list:
        limit = asyncio.Semaphore(workers)

        async def one(a: Any) -> Any:
            async with limit:
                return await coro_fn(a)

        return await asyncio.gather(*(one(a) for a in args))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    # Jupyter already runs an event loop in this thread: run ours in a helper thread.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()


RUNNERS: dict[str, Callable] = {
    "serial": run_serial,
    "threads": run_threads,
    "processes": run_processes,
    "asyncio": run_asyncio,
}

ASYNC_TWINS: dict[Callable, Callable] = {wait_io: wait_io_async}


# --- measuring ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Measurement:
    workload: str
    kind: str
    workers: int
    seconds: float
    speedup: float

    def as_dict(self) -> dict:
        return asdict(self)


def time_run(kind: str, fn: Callable, args: Sequence, workers: int, repeats: int = 1) -> float:
    """Best wall time of ``repeats`` runs (pool start-up included: it is part of the price)."""
    if kind not in RUNNERS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if workers < 1 or repeats < 1:
        raise ValueError("workers and repeats must be at least 1")
    if kind == "asyncio":
        if fn not in ASYNC_TWINS:
            raise ValueError(f"{fn.__name__} has no coroutine twin; asyncio only helps code that awaits")
        fn = ASYNC_TWINS[fn]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        RUNNERS[kind](fn, args, workers)
        best = min(best, time.perf_counter() - start)
    return best


def measure_speedups(fn: Callable, args: Sequence, kinds: Iterable[str], worker_counts: Iterable[int],
                     repeats: int = 1) -> list[Measurement]:
    """Time ``fn`` over ``args`` serially, then with each kind and worker count.

    Speedup is serial time over parallel time: 2.0 means twice as fast as one worker.
    """
    name = fn.__name__
    serial = time_run("serial", fn, args, 1, repeats)
    rows = [Measurement(name, "serial", 1, serial, 1.0)]
    for kind in kinds:
        for workers in worker_counts:
            seconds = time_run(kind, fn, args, workers, repeats)
            rows.append(Measurement(name, kind, workers, seconds, serial / seconds))
    return rows


def pool_startup_seconds(start_method: str, workers: int = 2, repeats: int = 3) -> float:
    """Best time to start a process pool and get one trivial answer back from each worker."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run_processes(square, range(workers), workers, start_method)
        best = min(best, time.perf_counter() - start)
    return best


def plot_speedups(rows: Sequence[Measurement], ax: Any = None, cores: int | None = None) -> Any:
    """Speedup against worker count, one line per kind, with the ideal and the core count marked."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    cores = cores or usable_cores()
    parallel = [r for r in rows if r.kind != "serial"]
    if not parallel:
        raise ValueError("no parallel measurements to plot")
    most = max(r.workers for r in parallel)
    ax.plot([1, most], [1, most], ":", color="grey", label="ideal (speedup = workers)")
    for kind in dict.fromkeys(r.kind for r in parallel):
        points = sorted((r.workers, r.speedup) for r in parallel if r.kind == kind)
        ax.plot(*zip(*points), "o-", label=kind)
    ax.axvline(cores, color="red", alpha=0.4, label=f"{cores} usable cores")
    ax.axhline(1, color="black", linewidth=0.5)
    ax.set_xlabel("workers (threads, processes or tasks)")
    ax.set_ylabel("speedup over serial (×)")
    ax.set_title(parallel[0].workload)
    ax.legend(fontsize=8)
    return ax


# Lesson 1's CPU-bound workload at full size on a 16-core machine (gpucourse.reference, measured):
# what a chart shows beside a run too small or too crowded to show the speedup.
REFERENCE_SPEEDUP = "lesson01_count_primes_speedup"
# The workloads whose point is that processes beat serial (hash_rounds and wait_io make theirs with threads).
PROCESS_BOUND = ("count_primes",)


def speedup_note(rows: Sequence[Measurement], smoke: bool = False) -> str | None:
    """One sentence for a chart whose processes never beat serial, or None when they did.

    Processes pay for starting the pool and for sending work; with tasks of a few milliseconds, or
    with the cores busy elsewhere (a loaded laptop, a smoke run), that price is the whole run. The
    sentence says so, and what the same workload does at full size on the course's reference machine.
    """
    processes = [r for r in rows if r.kind == "processes"]
    if not processes or rows[0].workload not in PROCESS_BOUND or max(r.speedup for r in processes) > 1.0:
        return None
    serial = next((r for r in rows if r.kind == "serial"), None)
    size = "smoke size" if smoke else "this size and this machine's load"
    note = f"processes never beat serial at {size}"
    if serial is not None:
        note += f" ({serial.seconds:.2f} s of work in all): starting the pool costs more than it saves"
    if rows[0].workload == "count_primes":
        from gpucourse import reference

        ref = reference.load()
        values = ref.values(REFERENCE_SPEEDUP)
        shown = ", ".join(f"{k.split()[-1][1:]} processes {v:.1f}×" for k, v in values.items()
                          if k.startswith("processes") and k.split()[-1] in ("x2", "x8", "x16"))
        cores = ref.data["device"].get("cpu_cores")
        if not shown:  # this GPU's reference did not measure its host's processes
            return note + f". {ref.missing(REFERENCE_SPEEDUP)}"
        note += (f". A larger run (the course's bench: 32 tasks of count_primes(150,000)) on a {cores}-core CPU "
                 f"({ref.short} host, {ref.data['date']}): {shown} faster than serial")
    return note


def plot_speedup_panels(panels: Sequence[Sequence[Measurement]], hardware: str, cores: int | None = None,
                        smoke: bool = False) -> Any:
    """Lesson 1's three speedup charts side by side, titled with the hardware; returns the Figure.

    A panel whose processes never beat serial carries :func:`speedup_note` in the chart itself, so a
    run too small to show the lesson's point says so instead of showing the opposite.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 5.0), squeeze=False)
    cores = cores or usable_cores()
    for rows, ax in zip(panels, axes[0]):
        plot_speedups(rows, ax=ax, cores=cores)
        note = speedup_note(rows, smoke)
        if note:
            # under the axes, as a caption: inside, it would hide the lines or the legend
            ax.text(0.0, -0.2, textwrap.fill(note, 62), transform=ax.transAxes, fontsize=8, va="top",
                    bbox={"facecolor": "lightyellow", "alpha": 0.9, "edgecolor": "grey"})
    fig.suptitle(f"Speedup over one worker, measured on {hardware} ({cores} usable cores"
                 f"{', smoke size' if smoke else ''})")
    fig.tight_layout()
    return fig


def plot_loader_throughput(items_per_second: dict[int, float], hardware: str, cores: int | None = None) -> Any:
    """DataLoader items per second against ``num_workers`` (lesson 1), titled with the hardware."""
    import matplotlib.pyplot as plt

    if not items_per_second:
        raise ValueError("no measurements to plot")
    cores = cores or usable_cores()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(list(items_per_second), list(items_per_second.values()), "o-")
    ax.axvline(cores, color="red", alpha=0.4, label=f"{cores} usable cores")
    ax.set_xlabel("num_workers (loader processes; 0 = in the main process)")
    ax.set_ylabel("throughput (items / s)")
    ax.set_title(f"DataLoader throughput on {hardware}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --- DataLoader workers ------------------------------------------------------------------

class PrimeCountingDataset:
    """A map-style dataset whose items cost CPU time, like decoding and augmenting images.

    Item ``i`` is ``count_primes(limit + i)``. Picklable: it holds only two integers.
    """

    def __init__(self, length: int, limit: int) -> None:
        if length < 0 or limit < 2:
            raise ValueError("length must be >= 0 and limit >= 2")
        self.length, self.limit = length, limit

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return count_primes(self.limit + index)


class WhoLoadsDataset:
    """Item ``i`` is ``(i, pid of the process that loaded it)``: shows DataLoader workers are processes."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[int, int]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return index, os.getpid()


class OpenFileLinesDataset:
    """The classic mistake: an open file handle in ``__init__`` cannot be pickled for workers."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.file = open(path)  # noqa: SIM115 - kept open on purpose, that is the bug
        self.lines = self.file.read().splitlines()

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, index: int) -> int:
        return int(self.lines[index])


def write_int_lines(path: str | os.PathLike, values: Iterable[int]) -> str:
    """Write one integer per line; returns the path. Used by the picklable-dataset exercise."""
    with open(path, "w") as handle:
        handle.writelines(f"{int(v)}\n" for v in values)
    return os.fspath(path)


def loader_seconds(dataset: Any, num_workers: int, batch_size: int = 4, epochs: int = 1,
                   persistent_workers: bool = False) -> float:
    """Wall time to iterate ``epochs`` epochs of a DataLoader over ``dataset``."""
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                        persistent_workers=persistent_workers and num_workers > 0)
    start = time.perf_counter()
    for _ in range(epochs):
        for _batch in loader:
            pass
    seconds = time.perf_counter() - start
    del loader  # shuts persistent workers down now rather than at garbage collection
    return seconds


# --- scripts -----------------------------------------------------------------------------

def run_python_script(source: str, timeout: float = 120) -> tuple[int, str]:
    """Run ``source`` as a fresh ``python script.py``; returns (exit code, stdout+stderr).

    Start methods and the ``__main__`` guard only show their real behaviour in a script,
    because a notebook's ``__main__`` is the kernel, not a file a child process can re-import.
    """
    with tempfile.TemporaryDirectory(prefix="gpucourse-script-") as folder:
        path = os.path.join(folder, "script.py")
        with open(path, "w") as handle:
            handle.write(source)
        done = subprocess.run([sys.executable, path], capture_output=True, text=True,
                              timeout=timeout, cwd=folder)
    return done.returncode, done.stdout + done.stderr

"""Lesson 2 (CPU, GPU and CUDA): a first GPU kernel with Triton, in plain Python on the CPU first.

A Triton kernel is written for one *program*: the launch runs a grid of programs, and program ``pid``
handles the block of elements ``pid * BLOCK_SIZE + arange(BLOCK_SIZE)``, with a mask for the part of
the last block that lies past the end. ``simulate`` runs a plain Python version of such a program
for every program id, one after another, which is all the model there is to it.

With the environment variable ``TRITON_INTERPRET=1`` set before a kernel is defined, ``@triton.jit``
gives a kernel that Triton's interpreter runs on the CPU, on CPU tensors (NumPy underneath, one
program after another): slow, but the same source compiles for a GPU (``compiled``). Triton ships with
PyTorch's Linux wheels; this module imports it only when a function here needs it, so importing
``gpucourse.kernels`` never decides in which mode later kernels are made.

``probe_launch`` runs a launcher on tensors that sit between guard areas, in a child process, and
reports what it wrote: a kernel without a mask writes into the guard (or crashes the child) instead of
corrupting the memory of the process that asked.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
import warnings
from typing import Any, Callable, Iterable, Iterator

INTERPRET_ENV = "TRITON_INTERPRET"
GUARD = 1 << 14  # elements of guard area on each side of a probed tensor: more than any sensible block


def cdiv(n: int, d: int) -> int:
    """``ceil(n / d)`` for positive ``d``: the number of blocks of ``d`` that cover ``n`` elements
    (what ``triton.cdiv`` computes)."""
    if d < 1:
        raise ValueError("d must be >= 1")
    return -(-n // d)


def block_table(n: int, block_size: int) -> list[dict[str, Any]]:
    """For each program of a 1-D launch over ``n`` elements: its id, its offsets and its mask."""
    rows = []
    for pid in range(cdiv(n, block_size)):
        offsets = [pid * block_size + i for i in range(block_size)]
        rows.append({"pid": pid, "offsets": offsets, "mask": [o < n for o in offsets]})
    return rows


def simulate(program: Callable[..., None], grid: int, *args: Any, **meta: Any) -> None:
    """Run ``program(pid, *args, **meta)`` for every ``pid`` in ``range(grid)``: a launch, serially."""
    for pid in range(grid):
        program(pid, *args, **meta)


def have_triton() -> bool:
    """Whether the ``triton`` package can be imported here (PyTorch's Linux wheels bring it)."""
    import importlib.util
    return importlib.util.find_spec("triton") is not None


def interpret_on_cpu() -> None:
    """Set ``TRITON_INTERPRET=1``: kernels defined from now on run in Triton's interpreter, on the CPU.

    The Triton that PyTorch 2.14 installs (3.8) reads the variable when ``@triton.jit`` decorates a
    function; calling this before ``import triton`` is safe whatever the version.
    """
    os.environ[INTERPRET_ENV] = "1"


def interpreted(kernel: Any) -> Any:
    """The same kernel, run by Triton's interpreter on CPU tensors, whatever mode made ``kernel``."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    return InterpretedFunction(kernel.fn) if isinstance(kernel, JITFunction) else kernel


def compiled(kernel: Any) -> Any:
    """The same kernel compiled for the GPU (it then takes CUDA tensors), whatever mode made ``kernel``."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    return JITFunction(kernel.fn) if isinstance(kernel, InterpretedFunction) else kernel


@contextlib.contextmanager
def kernels_as(mode: str, *places: Any) -> Iterator[None]:
    """Within the block, every Triton kernel found in ``places`` is the ``"interpreted"`` or the
    ``"compiled"`` version of itself, so a launcher that names its kernel runs it that way; the
    originals are put back afterwards. A place is a namespace (a notebook's ``globals()``) or a
    function, whose globals and closure are searched."""
    change = {"interpreted": interpreted, "compiled": compiled}[mode]
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    kinds = (JITFunction, InterpretedFunction)
    saved: list[tuple[Any, Any, Any]] = []  # (dict, key, kernel) or (cell, None, kernel)
    interpret = os.environ.get(INTERPRET_ENV)
    if mode == "compiled":  # helpers that a compiled kernel calls read the setting while it runs
        os.environ.pop(INTERPRET_ENV, None)
    for place in places:
        spaces = [place] if isinstance(place, dict) else [getattr(place, "__globals__", {})]
        for space in spaces:
            for name, value in list(space.items()):
                if isinstance(value, kinds):
                    saved.append((space, name, value))
                    space[name] = change(value)
        for cell in getattr(place, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                if isinstance(cell.cell_contents, kinds):
                    saved.append((cell, None, cell.cell_contents))
                    cell.cell_contents = change(cell.cell_contents)
    try:
        yield
    finally:
        for holder, name, value in reversed(saved):
            if isinstance(holder, dict):
                holder[name] = value
            else:
                holder.cell_contents = value
        if interpret is not None:
            os.environ[INTERPRET_ENV] = interpret


def run_isolated(rows: Callable[[], Iterable[dict]], timeout: float = 60.0) -> list[dict]:
    """The rows that ``rows()`` yields, computed in a forked child process, as JSON-ready dicts.

    A child that dies (a kernel reading or writing far outside its tensors) or runs past ``timeout``
    seconds ends the list with ``{"crashed": ...}`` or ``{"timeout": ...}``; the rows sent before stay.
    Where ``os.fork`` does not exist (Windows), the rows are computed in this process.
    """
    if not hasattr(os, "fork"):
        return list(rows())
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python 3.12+ warns when a multi-threaded process forks
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: send one JSON line per row, then leave without cleanup handlers
        os.close(read_end)
        try:
            if "torch" in sys.modules:  # the parent's intra-op threads are not in this copy: using
                sys.modules["torch"].set_num_threads(1)  # them would hang (DataLoader workers do the same)
            with os.fdopen(write_end, "w") as out:
                try:
                    for row in rows():
                        out.write(json.dumps(row) + "\n")
                        out.flush()
                except BaseException as error:  # reported as a row, like any other outcome
                    out.write(json.dumps({"error": f"{type(error).__name__}: {error}"[:300]}) + "\n")
        finally:
            os._exit(0)
    os.close(write_end)
    buffer, finished, deadline = b"", False, time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([read_end], [], [], left)
            if not ready:
                break
            chunk = os.read(read_end, 65536)
            if not chunk:
                finished = True
                break
            buffer += chunk
    finally:
        os.close(read_end)
        if not finished:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    result = [json.loads(line) for line in buffer.decode().splitlines() if line.strip()]
    if not finished:
        result.append({"timeout": timeout})
    elif os.WIFSIGNALED(status):
        result.append({"crashed": signal.Signals(os.WTERMSIG(status)).name})
    return result


def _guarded(n: int, dtype: Any, fill: float, guard: int) -> tuple[Any, Any]:
    """A tensor of ``n`` elements in the middle of a buffer whose ``guard`` elements on each side hold ``fill``."""
    import torch
    base = torch.full((2 * guard + n,), fill, dtype=dtype)
    return base, base[guard:guard + n]


def probe_launch(launch: Callable[..., Any], configs: Iterable[tuple[int, int, str]], alpha: float = 2.0,
                 namespaces: Iterable[dict] = (), seed: int = 0, timeout: float = 60.0) -> list[dict]:
    """Call ``launch(x, y, alpha, out, block_size=b)`` for each ``(n, b, dtype)`` in ``configs`` on
    guarded CPU tensors, in a child process, and report what happened to ``out`` and around it.

    Each row: ``n``, ``block_size``, ``dtype``, and either ``error`` or ``returned_out`` (the launcher
    returned ``out`` itself), ``unwritten`` (elements of ``out`` never written; ``first_unwritten``),
    ``wrong`` (written, but not ``alpha * x + y`` within the dtype's tolerance), ``past_end`` (something
    was written in the guard areas around ``out``) and ``inputs_changed`` (``x``, ``y`` or their guards).
    Kernels found in ``namespaces`` and in the launcher's globals and closure run in Triton's interpreter.
    """
    configs = [(int(n), int(b), str(d)) for n, b, d in configs]
    places = [*namespaces, launch]

    def rows() -> Iterator[dict]:
        import torch
        os.environ[INTERPRET_ENV] = "1"
        kernels = kernels_as("interpreted", *places) if have_triton() else contextlib.nullcontext()
        generator = torch.Generator().manual_seed(seed)
        with kernels:
            for n, block_size, dtype_name in configs:
                dtype = getattr(torch, dtype_name)
                row: dict[str, Any] = {"n": n, "block_size": block_size, "dtype": dtype_name}
                x_base, x = _guarded(n, dtype, 0.5, GUARD)
                y_base, y = _guarded(n, dtype, 0.25, GUARD)
                out_base, out = _guarded(n, dtype, -3.0, GUARD)
                x.copy_(torch.randn(n, generator=generator).to(dtype))
                y.copy_(torch.randn(n, generator=generator).to(dtype))
                out.fill_(float("nan"))
                x_kept, y_kept, out_kept = x_base.clone(), y_base.clone(), out_base.clone()
                try:
                    returned = launch(x, y, alpha, out, block_size=block_size)
                except Exception as error:
                    row["error"] = f"{type(error).__name__}: {error}"[:300]
                    yield row
                    continue
                expected = (alpha * x.double() + y.double()).to(dtype)
                written = ~torch.isnan(out)
                tolerance = ({"rtol": 1e-2, "atol": 1e-2} if dtype in (torch.float16, torch.bfloat16)
                             else {"rtol": 1e-5, "atol": 1e-6})
                close = torch.isclose(out, expected, **tolerance)
                unwritten = (~written).nonzero().flatten().tolist()
                around = torch.cat([out_base[:GUARD], out_base[GUARD + n:]])
                kept_around = torch.cat([out_kept[:GUARD], out_kept[GUARD + n:]])
                row.update({
                    "returned_out": returned is out,
                    "unwritten": len(unwritten),
                    "first_unwritten": unwritten[0] if unwritten else None,
                    "wrong": int((written & ~close).sum()),
                    "past_end": not torch.equal(around, kept_around),
                    "inputs_changed": not (torch.equal(x_base, x_kept) and torch.equal(y_base, y_kept)),
                })
                yield row

    return run_isolated(rows, timeout)


def probe_problem(rows: list[dict], configs: int | None = None) -> str | None:
    """What the rows of ``probe_launch`` say is wrong (the first thing), in words; None when all is right."""
    for row in rows:
        where = (f"n={row['n']}, block_size={row['block_size']}, {row['dtype']}" if "n" in row else "")
        if "crashed" in row:
            return f"the process running the kernel died ({row['crashed']}): a load or store far outside the tensors?"
        if "timeout" in row:
            return f"the launches did not finish within {row['timeout']:g} s"
        if "error" in row:
            return f"{where}: raised {row['error']}" if where else f"raised {row['error']}"
        if row["past_end"]:
            return f"{where}: wrote past the end of out"
        if row["inputs_changed"]:
            return f"{where}: changed x or y"
        if not row["returned_out"]:
            return f"{where}: did not return out (write into the out tensor you are given)"
        if row["unwritten"]:
            return (f"{where}: {row['unwritten']} of {row['n']} elements of out never written "
                    f"(the first at index {row['first_unwritten']})")
        if row["wrong"]:
            return f"{where}: {row['wrong']} of {row['n']} values differ from alpha * x + y"
    if configs is not None and len(rows) < configs:
        return f"only {len(rows)} of {configs} launches reported"
    return None


# Measuring the fused kernel against PyTorch's two kernels (the GPU cell after exercise 4).

def cache_bytes(device: Any = "cpu") -> int:
    """The last-level cache a streaming kernel on ``device`` can be served from: a CUDA GPU's L2
    (``L2_cache_size``), or the CPU's largest cache as Linux reports it (32 MiB where unknown)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    sizes = []
    for index in range(8):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as f:
                text = f.read().strip()
        except OSError:
            break
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=32 << 20)


def sizes_around(cache: int, element_size: int = 4, smallest: int = 1 << 16, above: int = 8) -> list[int]:
    """Powers of two ``n`` from ``smallest`` elements up to the first whose tensor (``n * element_size``
    bytes) is at least ``above`` times ``cache``: sizes well inside the cache and well outside it."""
    if cache < 1 or element_size < 1 or smallest < 1 or above < 1:
        raise ValueError("cache, element_size, smallest and above must be positive")
    sizes = [smallest]
    while sizes[-1] * element_size < above * cache:
        sizes.append(sizes[-1] * 2)
    return sizes


def fused_vs_eager(sizes: Iterable[int], device: Any, fused: Callable[..., Any], eager: Callable[..., Any],
                   min_seconds: float = 0.1) -> dict[int, dict[str, float]]:
    """For each ``n``: seconds per call of ``fused(x, y, out)`` and of ``eager(x, y)`` on float32
    tensors of ``n`` elements on ``device`` (``gpucourse.timing.seconds_per_call``, which synchronizes CUDA)."""
    import torch

    from gpucourse.timing import seconds_per_call

    results = {}
    for n in sizes:
        x, y = torch.randn(n, device=device), torch.randn(n, device=device)
        out = torch.empty_like(x)
        results[n] = {"fused": seconds_per_call(lambda x=x, y=y, out=out: fused(x, y, out), min_seconds=min_seconds),
                      "eager": seconds_per_call(lambda x=x, y=y: eager(x, y), min_seconds=min_seconds)}
        del x, y, out  # free this size's tensors before the next size allocates
    return results


def plot_fused_vs_eager(results: dict[int, dict[str, float]], hardware: str, cache: int, element_size: int = 4,
                        reference: dict[int, dict[str, float]] | None = None, reference_label: str | None = None):
    """Left: µs per call of the fused kernel and of the eager pair against the size of one tensor;
    right: fused time / eager time, with the 12/20 traffic ratio and the cache size marked. A
    ``reference`` (same shape as ``results``) is drawn as hollow markers. Returns the Figure."""
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("nothing to plot: no measurements")
    fig, (times, ratio) = plt.subplots(1, 2, figsize=(11, 4.0), layout="constrained")
    sets = [(results, hardware, "o-", None)]
    if reference:
        sets.append((reference, reference_label or "reference", "s", "none"))
    for data, label, style, face in sets:
        mib = [n * element_size / 2**20 for n in sorted(data)]
        for name, colour in (("fused", "tab:green"), ("eager", "tab:red")):
            times.plot(mib, [1e6 * data[n][name] for n in sorted(data)], style, color=colour,
                       markerfacecolor=face, label=f"{name}: {label}")
        ratio.plot(mib, [data[n]["fused"] / data[n]["eager"] for n in sorted(data)], style, color="black",
                   markerfacecolor=face, label=label)
    for ax in (times, ratio):
        ax.set_xscale("log", base=2)
        ax.axvline(cache / 2**20, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("size of one tensor (MiB, log scale; dashed: the cache)")
    times.set_yscale("log")
    times.set_ylabel("µs per call (log scale)")
    times.set_title("Time per call", fontsize=9)
    times.legend(fontsize=7)
    ratio.axhline(12 / 20, color="tab:green", linestyle=":", linewidth=1, label="12/20: the traffic ratio")
    ratio.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="1: no gain")
    ratio.set_ylim(0, max(1.3, ratio.get_ylim()[1]))
    ratio.set_ylabel("fused time / eager time (ratio)")
    ratio.set_title("Fused relative to eager", fontsize=9)
    ratio.legend(fontsize=7)
    fig.suptitle(f"Triton scaled_add (one pass) vs torch 2.0 * x + y (two kernels), float32, on {hardware}",
                 fontsize=10)
    return fig


def plot_scaled_add_beside(mine: dict[str, float], mine_label: str, reference: dict[str, float],
                           reference_label: str, note: str | None = None):
    """Milliseconds per call of ``scaled_add`` and of ``2.0 * x + y`` on this machine beside the
    reference GPU (``gpucourse.reference.plot_beside``, log scale). Returns the Figure."""
    from gpucourse.reference import plot_beside

    fig = plot_beside(mine, reference, title="scaled_add: the same kernel, two machines", unit="ms per call (log scale)",
                      mine_label=mine_label, reference_label=reference_label, note=note, log=True)
    fig.axes[0].set_xlabel("what was timed")
    _legend_below(fig)
    return fig


def _legend_below(fig) -> None:
    """Move a one-axes figure's legend below the axes: hardware names are long."""
    ax = fig.axes[0]
    handles, labels = ax.get_legend_handles_labels()
    ax.get_legend().remove()
    fig.legend(handles, labels, loc="outside lower center", fontsize=8, title="hardware", title_fontsize=8)

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

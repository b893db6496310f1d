"""Starting a multi-process run and reading what its ranks wrote: one way for every lesson and check.

Taught in lesson 7 (DDP as a script: ``python -m torch.distributed.run``, i.e. ``torchrun``, starts
one process per device, each writes its own report) and lesson 10 (the same launch, as a cluster
job would make it); lessons 1 and 7's script exercises are graded through it (gpucourse.checks.ddp).

- ``torchrun``: ``torchrun --standalone --nproc-per-node=N`` with this Python: on timeout (or an
  interrupt) the launcher and every rank are killed, with whatever they started, so no rank is left
  behind holding a port, a GPU or a CPU core. Killing the launcher's process group is not enough:
  torchrun starts each rank in a session (and process group) of its own, and a rank whose launcher
  died goes on running.
- ``read_rank_reports``: the ``rank<N>.json`` files the ranks wrote, by rank.
- ``init_process_group(device)``: what each rank does first: the backend follows where the tensors
  live (gloo for CPU tensors, NCCL for GPU ones, one GPU per rank); ``gpu_per_rank`` says whether
  every rank can have a usable GPU.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

# a rank that skips a collective fails the others by then (GPUCOURSE_COLLECTIVE_SECONDS changes it: the
# grader's sandbox sets it from c.Grading.collective_seconds, and every rank it starts inherits it)
COLLECTIVE_TIMEOUT = timedelta(seconds=45)


def collective_timeout() -> timedelta:
    """How long a collective waits for the other ranks before it fails: ``COLLECTIVE_TIMEOUT``, or what
    ``GPUCOURSE_COLLECTIVE_SECONDS`` says (``gpucourse.environment``). Read when a group starts."""
    from gpucourse import environment

    return timedelta(seconds=environment.collective_seconds(COLLECTIVE_TIMEOUT.total_seconds()))


@dataclass
class Launch:
    returncode: int | None  # None: killed at the timeout
    output: str  # the launcher's and every rank's stdout and stderr, interleaved as written
    seconds: float
    timed_out: bool = False
    reports: dict | None = None  # the ranks' records by rank, when they came through pipes (forked launches)


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid``, from the parent links in /proc (psutil where there is none)."""
    children: dict[int, list[int]] = {}
    if os.path.isdir("/proc/self"):
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as stat:  # "pid (name) state ppid ...": a name may hold ")"
                    state, parent = stat.read().rsplit(")", 1)[1].split()[:2]
            except (OSError, ValueError, IndexError):
                continue
            if state != "Z":  # a zombie is dead already (its parent has not collected it)
                children.setdefault(int(parent), []).append(int(entry))
    else:
        try:
            import psutil

            return {child.pid for child in psutil.Process(pid).children(recursive=True)}
        except Exception:  # no psutil, or the launcher is gone: its process group is all there is to kill
            return set()
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def signal_all(pids, number: int) -> None:
    """Send signal ``number`` to each of ``pids`` that still lives (kill_tree; the grader's supervisor)."""
    for pid in pids:
        try:
            os.kill(pid, number)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(pid: int, spare: set[int] = frozenset()) -> int:
    """SIGKILL the launcher ``pid``, every rank and what they started; how many processes that was.
    Everything is stopped first (a stopped process cannot start another, and a rank stays its
    launcher's child), then the process groups they are in are killed (a rank's own group holds its
    workers; never this process's own), then every process found.

    ``pid`` may be this process (the grading runner, after a cell ran out of time): then what is below
    it goes, and it stays. ``spare``: processes left running, with everything below them."""
    spared = set(spare).union(*(descendants(p) for p in spare))
    tree, stopped = ({pid} - {os.getpid()}) | (descendants(pid) - spared), set()
    while tree - stopped:  # stop from the top, look again for children started meanwhile
        signal_all(tree - stopped, signal.SIGSTOP)
        stopped |= tree
        tree |= descendants(pid) - spared
    groups = set()
    for pid in tree:
        try:
            groups.add(os.getpgid(pid))
        except (ProcessLookupError, PermissionError):
            pass
    for group in groups - {os.getpgrp()}:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    signal_all(tree, signal.SIGKILL)
    return len(tree)


def torchrun(target: list[str], nproc: int = 2, timeout: float = 300, env: dict | None = None,
             cwd: str | os.PathLike | None = None) -> Launch:
    """Run ``torchrun --standalone --nproc-per-node=nproc <target...>`` (a script path and its arguments,
    or ``["-m", "module", ...]``) with this Python; its exit code, output and wall time.

    ``env`` is added to this process's environment (with ``OMP_NUM_THREADS=1``: N ranks on N cores
    would otherwise each start a thread per core). On timeout every process of the launch is killed
    and ``returncode`` is None.
    """
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    # torchrun's agent keeps its ranks' error files in a log folder, a new one in /tmp per launch unless told
    with tempfile.TemporaryDirectory(prefix="gpucourse-torchrun-") as logs:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                   f"--log-dir={logs}", *target]
        start = time.perf_counter()  # wall clock: what is timed is processes starting and running, not one call
        proc = subprocess.Popen(command, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, text=True, errors="replace")
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc.pid)
            output, _ = proc.communicate()
        except BaseException:  # interrupted (a notebook's stop button, a check's alarm): no rank outlives it
            kill_tree(proc.pid)
            proc.wait()
            raise
    return Launch(None if timed_out else proc.returncode, output, time.perf_counter() - start, timed_out)


_REPORT = re.compile(r"rank(\d+)\.json")


def run_demo(module: str, demo: str, nproc: int, timeout: float = 300, out: str | os.PathLike | None = None,
             launcher: tuple[str, ...] = (), **options) -> tuple[list, Launch]:
    """``python -m module demo --out DIR --<option>=<value> ...`` on ``nproc`` ranks under torchrun (its
    ``launcher`` flags first, e.g. ``--max-restarts=1``): every rank's ``rank<N>.json`` report in rank order,
    and the launch. Raises with the output's tail if the launch failed. ``out``: where the ranks write (a
    temporary folder, removed afterwards, when None). The lessons' ``run`` helpers (13, 14, 16) call this.
    """
    with tempfile.TemporaryDirectory(prefix=f"gpucourse-{module.rsplit('.', 1)[-1]}-") as scratch:
        out = Path(out or scratch)
        flags = [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
        launch = torchrun([*launcher, "-m", module, demo, "--out", str(out), *flags], nproc=nproc, timeout=timeout)
        if launch.returncode != 0:
            raise RuntimeError(f"{demo} on {nproc} ranks failed (exit {launch.returncode}):\n{launch.output[-12000:]}")
        return list(read_rank_reports(out).values()), launch


def read_rank_reports(folder: str | os.PathLike, strict: bool = True) -> dict[int, object]:
    """Every ``rank<N>.json`` in ``folder``, keyed by N (from the file's name), in rank order.

    ``strict``: a file that is not JSON raises ValueError; otherwise it reads as ``{"unreadable": True}``
    (a judge then says which rank failed instead of the grader failing).
    """
    found = {}
    for path in Path(folder).iterdir():
        match = _REPORT.fullmatch(path.name)
        if match is None:
            continue
        try:
            found[int(match.group(1))] = json.loads(path.read_text())
        except (ValueError, OSError) as error:
            if strict:
                raise ValueError(f"{path}: not a rank report ({error})") from None
            found[int(match.group(1))] = {"unreadable": True}
    return dict(sorted(found.items()))


BACKENDS = {"cpu": "gloo", "cuda": "nccl", "cpu,cuda": "cpu:gloo,cuda:nccl"}  # NCCL has no CPU collectives


def local_ranks() -> int:
    """How many ranks this machine runs (torchrun's LOCAL_WORLD_SIZE; 1 outside torchrun)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def backend_of(records) -> str:
    """The backend that the ranks' reports (or a demo's rows) say ran them, each carrying what
    ``dist.get_backend()`` said: what a label prints, never an assumed one. Records of two backends
    in one figure or table are refused: the comparison would not be of one link."""
    found = {record.get("backend") for record in records}
    if None in found or not found:
        raise ValueError("records without a 'backend': label them with what dist.get_backend() said "
                         "(the lessons' demos record it)")
    if len(found) != 1:
        raise ValueError(f"records of different backends {sorted(found)}: compare one backend at a time")
    return found.pop()


def gpu_per_rank() -> bool:
    """Whether every local rank can have a usable GPU of its own (NCCL refuses two ranks on one GPU).
    Usable: ``gpucourse.preamble.probe_cuda``, which says no where the driver is too old for this torch."""
    from gpucourse.preamble import probe_cuda

    return probe_cuda().count >= local_ranks()


def backend_for(device: str) -> str:
    """The backend for collectives on tensors that live on ``device``: "cpu" -> gloo, "cuda" -> NCCL,
    "cpu,cuda" (a demo with tensors on both) -> "cpu:gloo,cuda:nccl" (each tensor's device picks)."""
    if device not in BACKENDS:
        raise ValueError(f"device must be one of {sorted(BACKENDS)} (where the collectives' tensors live), not {device!r}")
    return BACKENDS[device]


def init_process_group(device: str = "auto", timeout: timedelta | None = None):
    """Start torch.distributed for this rank, with the backend for the tensors it will use; returns the
    rank's device (move the model and data there).

    ``device``: where the collectives' tensors live. "cpu": gloo, whatever GPUs there are; "cuda": NCCL,
    one GPU per local rank (an error saying so where there are fewer usable GPUs than ranks); "cpu,cuda":
    both ("cpu:gloo,cuda:nccl"), the GPU as for "cuda"; "auto": "cuda" when every rank can have a usable
    GPU, else "cpu" (for drivers that put everything on the device returned). A collective that waits
    longer than ``timeout`` (default ``collective_timeout()``) fails. ``dist.get_backend()``
    says afterwards which backend runs: labels must read it, never assume one."""
    import torch
    import torch.distributed as dist

    from gpucourse.preamble import probe_cuda

    device = str(getattr(device, "type", device))  # torch.device("cuda") works as "cuda"
    probe = probe_cuda() if device == "auto" or "cuda" in device else None
    if device == "auto":
        device = "cuda" if probe.count >= local_ranks() else "cpu"
    backend = backend_for(device)
    if "cuda" in device:
        if probe.count < local_ranks():
            why = f" ({probe.reason})" if probe.reason else ""
            raise RuntimeError(f"device={device!r} needs one usable GPU per rank (NCCL refuses two ranks on one GPU): "
                               f"{local_ranks()} rank(s) on this machine, {probe.count} usable GPU(s){why}. "
                               "Start fewer ranks, or use device='cpu' (gloo).")
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
    dist.init_process_group(backend, timeout=timeout or collective_timeout())
    return torch.device("cuda", index) if "cuda" in device else torch.device("cpu")


def close_process_group(wait: bool = True) -> None:
    """End torch.distributed in this rank while Python is still whole, so that the rank exits cleanly.

    A process group still alive at exit is destroyed during interpreter shutdown, where gloo's worker
    threads can abort the rank now and then ("terminate called without an active exception", SIGABRT).
    ``wait``: a barrier first, so that no rank closes its connections while a
    peer still sends to it; leave it out when this rank is failing (the others may never arrive).
    Nothing to do when no group was started. Every demo and driver ends its ranks through this."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if wait:
        dist.barrier()
    dist.destroy_process_group()


def exit_rank(code: int | None = 0) -> None:
    """End this rank's process now, its work done: output flushed, then ``os._exit``, skipping the
    interpreter's shutdown. Every rank entry point (``python -m`` a demo, the checks' harness) ends here.

    Even with its process group destroyed (``close_process_group``) and no thread of its own left, a rank
    on torch 2.10 aborts during interpreter shutdown now and then: "terminate called without an active
    exception" (SIGABRT) from a C++ destructor, after its report is written. Measured on this project's
    2-core machine, launching lesson 7's ``average_gradients`` check (2 ranks) beside a busy process and
    another such loop: 6 of 120 launches aborted, both ranks' reports on disk each time, with no Python
    frame left (faulthandler); 0 of 120 launches, interleaved with those, with this function. torchrun
    fails the whole launch on one aborted rank. A rank has nothing left to do at that point, so it skips
    the shutdown, as multiprocessing's children do (``os._exit`` after their target returns).
    ``code``: the exit status (None is 0, as for ``sys.exit``)."""
    import logging

    logging.shutdown()  # what the interpreter's shutdown would flush: handlers, then the standard streams
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: nothing more can reach it
            pass
    os._exit(code or 0)

"""Graded multi-process launches forked from a clean copy of the runner, not started as new Pythons.

    start(close=[fd])   the runner, before any student code runs: fork the copy ("zygote")
    launch(...)         gpucourse.checks.ddp, for each graded launch: ``torchrun`` without the Pythons

``torchrun`` starts a launcher and one Python per rank, each importing torch (and Lightning): about
8 s of CPU for a 2-rank exercise on a 2-core machine, for work the grader's preloaded process has
already done. Here the runner forks a copy of itself at its start, while it holds nothing but the
course's public packages and no student code has run. For each launch that copy forks a launcher
which runs torchrun's own machinery (``torch.distributed.launcher.api.elastic_launch``: the same
rendezvous, environment variables, agent and exit codes as ``torchrun --standalone``) with
``start_method="fork"``, so every rank is a copy of that clean process too: under a second where
starting them took seconds.

The copy lives in the runner's sandbox (same user, limits, namespaces and process group), so it
adds nothing a student's code could not already reach; it holds no results channel. Launches that
run out of time are killed with every process they started (``gpucourse.launch.kill_tree``).
Outside grading (a student's notebook, whose kernel runs threads) launches start ``torchrun``.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
import traceback
import uuid

_ZYGOTE: dict | None = None  # {"pid", "requests", "responses"} in the runner once start() forked it


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # not Linux: never fork


def start(close: tuple[int, ...] = ()) -> bool:
    """Fork the clean copy (the runner calls this before running any cell); whether it is serving.

    Forking is only safe from a process with one thread and no CUDA context; otherwise launches
    start ``torchrun`` as outside grading. ``close``: descriptors the copy must not hold (the
    runner's results channel)."""
    global _ZYGOTE
    torch = sys.modules.get("torch")
    if _threads() != 1 or (torch is not None and torch.cuda.is_initialized()):
        return False
    requests_r, requests_w = os.pipe()
    responses_r, responses_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError:  # out of processes (RLIMIT_NPROC): launches start torchrun, and fail visibly there if they must
        for fd in (requests_r, requests_w, responses_r, responses_w):
            os.close(fd)
        return False
    if pid == 0:
        try:
            for fd in (requests_w, responses_r, *close):
                os.close(fd)
            _serve(requests_r, responses_w)
        finally:
            os._exit(0)
    os.close(requests_r)
    os.close(responses_w)
    _ZYGOTE = {"pid": pid, "requests": os.fdopen(requests_w, "w", buffering=1), "responses": responses_r, "read": b""}
    return True


def available() -> bool:
    return _ZYGOTE is not None


def pids() -> set[int]:
    """The copy's pid, if it is serving: the processes a runner must not kill between cells."""
    return {_ZYGOTE["pid"]} if _ZYGOTE else set()


def _serve(requests: int, responses: int) -> None:
    """The copy: one launch at a time, answering its launcher's pid, then its exit status."""
    with os.fdopen(requests, "r") as incoming, os.fdopen(responses, "w", buffering=1) as outgoing:
        for line in incoming:  # ends when the runner closes its end or exits
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    incoming.close()
                    outgoing.close()
                    code = _launcher(request)
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            outgoing.write(json.dumps({"pid": pid}) + "\n")
            _, status = os.waitpid(pid, 0)
            outgoing.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")


def _rank(target: list[str]) -> None:
    """One rank, as ``python -m gpucourse.checks.ddp_harness STUDENT OUT DRIVER`` would run it."""
    from gpucourse.checks import ddp_harness

    sys.argv = [ddp_harness.__file__, *target]  # what the script sees under torchrun
    try:
        ddp_harness.main(*target)
    except BaseException:  # the traceback a started rank would print (torchrun shows the rank's stderr)
        traceback.print_exc()
        sys.stderr.flush()
        raise


def _launcher(request: dict) -> int:
    """``torchrun --standalone --nproc-per-node=N -m gpucourse.checks.ddp_harness ...``, forking its ranks."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.chdir(request["cwd"])
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.update(request["env"])
    # the agent's log folder (ranks' error files) beside launch.log, not a new one in /tmp per launch
    logs = DefaultLogsSpecs(log_dir=os.path.join(request["cwd"], "torchelastic"))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=request["nproc"], run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          start_method="fork", monitor_interval=0.05, logs_specs=logs)
    try:
        elastic_launch(config, _rank)(request["target"])
    except Exception as error:  # ChildFailedError: which rank failed, with what exit code
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


def _answer(timeout: float | None = None) -> dict | None:
    """The copy's next reply (one JSON line), or None when ``timeout`` seconds pass first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while b"\n" not in _ZYGOTE["read"]:
        left = None if deadline is None else max(deadline - time.monotonic(), 0)
        if not select.select([_ZYGOTE["responses"]], [], [], left)[0]:
            return None
        chunk = os.read(_ZYGOTE["responses"], 4096)
        if not chunk:
            raise RuntimeError("the forked launcher is gone")
        _ZYGOTE["read"] += chunk
    line, _ZYGOTE["read"] = _ZYGOTE["read"].split(b"\n", 1)
    return json.loads(line)


def launch(target: list[str], nproc: int, timeout: float, cwd: str, env: dict | None = None):
    """Run ``ddp_harness.main(*target)`` on ``nproc`` forked ranks; a ``gpucourse.launch.Launch``."""
    from gpucourse.launch import Launch, kill_tree

    assert _ZYGOTE is not None, "start() first"
    log = os.path.join(cwd, "launch.log")
    request = {"target": target, "nproc": nproc, "cwd": cwd, "log": log,
               "env": {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}}
    started = time.perf_counter()
    _ZYGOTE["requests"].write(json.dumps(request) + "\n")
    pid = _answer()["pid"]
    timed_out = False
    try:
        reply = _answer(timeout)
        if reply is None:
            timed_out = True
            kill_tree(pid)
            reply = _answer()
    except BaseException:  # interrupted (a check's time ran out): no rank outlives it
        kill_tree(pid)
        _answer()
        raise
    status = reply["status"]
    try:
        with open(log, errors="replace") as file:
            output = file.read()
    except OSError:
        output = ""
    return Launch(None if timed_out else status, output, time.perf_counter() - started, timed_out)

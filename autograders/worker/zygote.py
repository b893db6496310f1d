"""Graded multi-process launches forked from a clean copy of the runner, not started as new Pythons.

    start(close=[fd])   the supervisor, before any student code runs: fork the copy ("zygote")
    launch(...)         the launcher of the runner's worker's ``gpucourse.checks.ddp.LaunchPolicy``, for each
                        graded launch: ``torchrun`` without the Pythons

``torchrun`` starts a launcher and one Python per rank, each importing torch (and Lightning): about
8 s of CPU for a 2-rank exercise on a 2-core machine, for work the grader's preloaded process has
already done. Here the runner forks a copy of itself at its start, while it holds nothing but the
course's public packages and no student code has run. For each launch that copy forks a launcher
which runs torchrun's own machinery (``torch.distributed.launcher.api.elastic_launch``: the same
rendezvous, environment variables, agent and exit codes as ``torchrun --standalone``) with
``start_method="fork"``, so every rank is a copy of that clean process too: under a second where
starting them took seconds. The copy imports that machinery and takes the snapshot the ranks start
from (``rank.base``) once, while the cells run in the worker; each rank only brings it up to date.

The copy lives in the runner's sandbox (same user, limits, namespaces and process group); it holds
no results channel, and while grading only the runner's supervisor holds its pipes: the worker that
runs the cells asks the supervisor, which passes on only the launches the job lists (a script
exercise's submitted source with its own driver). Every request carries an id, and each reply
carries it back. Each rank reports through a pipe of its own that the copy hands it (the other
ranks' are closed before the student's code runs), not through a file another process could
rewrite; the copy collects the reports and sends them with the launch's exit status. Launches that
run out of time are killed with every process they started (``gpucourse.launch.kill_tree``).
Every rank runs ``rank.main`` (``gpucourse.checks.ddp_harness`` with the runner's protection).
Outside grading (a student's notebook, whose kernel runs threads) the default launch policy has no
launcher, and launches start ``torchrun`` on the unprotected harness.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
import traceback
import uuid

from . import forking, rank
from .forking import Channel, fork_safe, in_child

_ZYGOTE: dict | None = None  # {"pid", "requests": Channel, "responses": Channel} once start() forked it


def start(close: tuple[int, ...] = ()) -> bool:
    """Fork the clean copy (the runner calls this before running any cell); whether it is serving.

    Forking is only safe from a process with one thread and no CUDA context; otherwise launches
    start ``torchrun`` as outside grading. ``close``: descriptors the copy must not hold (the
    runner's results channel)."""
    global _ZYGOTE
    if fork_safe() is not None:
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
        def copy() -> int:
            for fd in (requests_w, responses_r, *close):
                os.close(fd)
            serve(Channel(read=requests_r), Channel(write=responses_w))
            return 0

        in_child(copy, code=0)
    os.close(requests_r)
    os.close(responses_w)
    _ZYGOTE = {"pid": pid, "requests": Channel(write=requests_w), "responses": Channel(read=responses_r)}
    return True


def relay(requests: Channel, responses: Channel) -> None:
    """Send this process's launches on ``requests`` and read the replies on ``responses``: in the runner's
    worker, the supervisor's pipes (it passes the listed launches on to the copy, whose own pipes the
    worker never holds); in a process that runs threads, and so cannot fork a copy itself, the pipes of a
    copy it started as a Python of its own (tests/clean_copy.py), which reads the same messages."""
    global _ZYGOTE
    _ZYGOTE = {"pid": None, "requests": requests, "responses": responses, "relayed": True}


def available() -> bool:
    return _ZYGOTE is not None


def pids() -> set[int]:
    """The copy's pid, if this process started it: the processes a runner must not kill between cells."""
    return {_ZYGOTE["pid"]} if _ZYGOTE and _ZYGOTE["pid"] else set()


def channel() -> Channel | None:
    """The copy's replies, in the process that started it (the runner's supervisor)."""
    return _ZYGOTE["responses"] if _ZYGOTE and not _ZYGOTE.get("relayed") else None


def request(message: dict) -> None:
    """Pass a launch on to the copy (the supervisor, for a request it checked): only what a launch needs."""
    _ZYGOTE["requests"].send({"id": str(message["id"]), "target": [str(t) for t in message["target"]][:2],
                              "driver": str(message["driver"]), "nproc": int(message["nproc"]),
                              "cwd": str(message["cwd"]), "source": str(message["source"])})


def serve(incoming: Channel, outgoing: Channel) -> None:
    """The copy: one launch at a time, answering its launcher's pid, then its exit status and the
    ranks' reports, each with the request's id. First it imports torchrun's machinery (0.4 s that
    each launcher would spend again) and takes the snapshot its launches start from."""
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend  # noqa: F401  (the launchers' rendezvous)
    import torch.distributed.launcher.api  # noqa: F401
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    # The rendezvous names each of its events with inspect.stack(), which looks up the module of every
    # frame among all loaded ones (CPython issue 92041): 0.6 s of a launch where Lightning is loaded.
    # The same name from the frame itself, set once here for every launcher; nothing else changes.
    dynamic_rendezvous.get_method_name = _method_name
    # Before its first join every node pauses a random 0 to 0.3 s (``_delay(seconds=(0, 0.3))``), which spreads
    # many nodes' joins over the store's server; a graded launch has one node, which waits for no one: a mean
    # 0.15 s of a launch that otherwise takes 0.3-0.5 s. Only that pause is skipped; the rendezvous' other
    # delays (1 s between polls of a round that waits for more nodes) stay.
    dynamic_rendezvous._delay = _without_the_join_skew(dynamic_rendezvous._delay)
    _BASE[:] = [rank.base()]

    def receive() -> "_Launch | None":
        try:
            return _Launch(incoming.receive(), (incoming.read_fd, outgoing.write_fd))
        except EOFError:  # the runner closed its end or exited
            return None

    forking.serve(receive, outgoing.send)


class _Launch:
    """One launch (a ``forking.Fork``): the child is its launcher (``_launcher``), each rank with a report
    pipe of its own; the server reads the pipes while it waits for the launcher."""

    def __init__(self, request: dict, server_fds: tuple[int, int]):
        # the launch as ``launch`` words it (passed on by ``request``, or relayed as it is): the launcher and
        # every rank run the script, the folder and the driver
        self.request = {**request, "target": [*request["target"][:2], request["driver"]]}
        self.server_fds = server_fds
        self.reports = [os.pipe() for _ in range(int(request["nproc"]))]

    def child(self) -> int:
        for fd in (*self.server_fds, *(r for r, _ in self.reports)):
            os.close(fd)
        return _launcher(self.request, [w for _, w in self.reports])

    def forked(self, pid: int) -> dict:
        for _, write_end in self.reports:
            os.close(write_end)
        return {"id": self.request["id"], "pid": pid}

    def finished(self, pid: int) -> dict:
        status, found, notes = _collect(pid, [Channel(read=r) for r, _ in self.reports])
        return {"id": self.request["id"], "status": status, "reports": found, "tampering": notes}


def _collect(pid: int, pipes: list[Channel]) -> tuple[int, dict, dict]:
    """Wait for the launcher ``pid`` while reading each rank's pipe: its exit status, every
    rank's one report (a rank that wrote two, or anything but what ``rank.main`` sends, reads as
    ``{"unreadable": True}``) and, by rank, what its audit hook noted the script do."""
    status, open_ = None, list(pipes)
    # Readable when the launcher has exited: the waits below end then, not at their next poll. The pipes
    # reach their end as the launcher exits, a moment before it can be waited for: polling every 0.05 s
    # cost each launch 0.05 s more.
    try:
        ended = [os.pidfd_open(pid)]
    except (AttributeError, OSError):  # Linux before 5.3: the poll alone
        ended = []
    try:
        while status is None or open_:
            if status is None:
                done, raw = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = os.waitstatus_to_exitcode(raw)
            if not open_:  # the launcher still runs (the loop ended otherwise)
                select.select(ended, [], [], 0.05)
                continue
            # once it has been waited for, its pidfd stays readable: no longer waited on
            ready = select.select([c.read_fd for c in open_] + (ended if status is None else []), [], [],
                                  0.05 if status is None else 0)[0]
            if status is not None and not ready:
                break  # the launcher is gone; a process still holding a pipe sends nothing more that counts
            for channel in [c for c in open_ if c.read_fd in ready]:
                try:
                    if not channel.fill():
                        open_.remove(channel)
                except ValueError:
                    open_.remove(channel)
    finally:
        for fd in ended:
            os.close(fd)
    found, notes = {}, {}
    for number, channel in enumerate(pipes):
        os.close(channel.read_fd)
        lines = [line for line in bytes(channel.buffer).split(b"\n") if line.strip()]
        if not lines:
            continue
        if len(lines) > 1:
            found[str(number)] = {"unreadable": True, "reports": len(lines)}
            continue
        try:
            sent = json.loads(lines[0])
        except ValueError:
            sent = None
        if not (isinstance(sent, dict) and set(sent) == {"report", "tampering"}):
            found[str(number)] = {"unreadable": True}
            continue
        found[str(number)] = sent["report"]
        if isinstance(sent["tampering"], list) and sent["tampering"]:
            notes[str(number)] = [str(note)[:300] for note in sent["tampering"][:20]]
    return status, found, notes


_REPORT_FDS: list[int] = []  # in a launcher: each rank's report pipe, by rank
_PREPARED: list[tuple] = []  # in a launcher: rank.prepare()'s driver, inputs and protection, for every rank
_BASE: list = []  # in the copy: rank.base(), the snapshot each launch's ranks bring up to date


def _method_name(depth: int = 2) -> str:
    """``dynamic_rendezvous.get_method_name``'s answer, the name of the function ``depth`` frames up
    (``inspect.stack()[depth].function``), read from the frame alone."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # fewer frames than that
        return "no_method_name"


def _without_the_join_skew(delay):
    """``delay`` (torch's ``dynamic_rendezvous._delay``) but for the one pause it draws from a range: the skew
    of a node's first join."""

    def delay_unless_drawn(seconds) -> None:
        if not isinstance(seconds, tuple):
            delay(seconds)

    return delay_unless_drawn


def _rank(target: list[str]) -> None:
    """One rank, as ``python -m autograders.worker.rank STUDENT OUT DRIVER`` would run it (the
    harness, protected), reporting through its own pipe (the other ranks' are closed first)."""
    mine = _REPORT_FDS[int(os.environ["RANK"])]
    for fd in _REPORT_FDS:
        if fd != mine:
            os.close(fd)
    sys.argv = [rank.__file__, *target]  # what the script sees under torchrun
    try:
        rank.main(*target, report=mine, prepared=_PREPARED[0])
    except BaseException:  # the traceback a started rank would print (torchrun shows the rank's stderr)
        traceback.print_exc()
        sys.stderr.flush()
        raise


def _launcher(request: dict, report_fds: list[int]) -> int:
    """``torchrun --standalone --nproc-per-node=N -m autograders.worker.rank ...``, forking its ranks."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.chdir(request["cwd"])
    if request.get("source") is not None:  # what the supervisor checked is what runs
        with open(request["target"][0], "w") as student:
            student.write(request["source"])
    log = os.open(os.path.join(request["cwd"], "launch.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    _REPORT_FDS[:] = report_fds
    _PREPARED[:] = [rank.prepare(request["target"][2], request["target"][1], _BASE[0] if _BASE else None)]  # the ranks inherit it
    # the agent's log folder (ranks' error files) beside launch.log, not a new one in /tmp per launch
    logs = DefaultLogsSpecs(log_dir=os.path.join(request["cwd"], "torchelastic"))
    # the agent looks at its ranks every monitor_interval seconds: the launch ends that long after they did
    # at most (a look is a waitpid per rank)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=request["nproc"], run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          start_method="fork", monitor_interval=0.01, logs_specs=logs)
    try:
        elastic_launch(config, _rank)(request["target"])
    except Exception as error:  # ChildFailedError: which rank failed, with what exit code
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


class CopyGone(RuntimeError):
    """The supervisor's answer to a launch when the copy has ended: nothing was started."""


def _reply(request_id: str, timeout: float | None = None) -> dict | None:
    """The reply to ``request_id`` (None when ``timeout`` seconds pass first); a reply to another
    request means something else wrote to the channel."""
    reply = _ZYGOTE["responses"].receive(timeout)
    if reply is None:
        return None
    if reply.get("id") != request_id:
        raise RuntimeError("the launcher answered another request: something else wrote to its channel")
    if "error" in reply:
        raise (CopyGone if reply.get("gone") is True else RuntimeError)(str(reply["error"]))
    return reply


def launch(target: list[str], nproc: int, timeout: float, cwd: str, env: dict | None = None, source: str | None = None):
    """Run ``rank.main(*target)`` on ``nproc`` forked ranks (``target``: the student's script,
    the folder, the driver; ``source``: the script's text, written by the launcher); a
    ``gpucourse.launch.Launch`` whose ``reports`` are the ranks' records, by rank."""
    from gpucourse.launch import Launch, kill_tree

    assert _ZYGOTE is not None, "start() first"
    if source is None:
        with open(target[0]) as student:
            source = student.read()
    request_id = uuid.uuid4().hex
    message = {"type": "launch", "id": request_id, "target": list(target[:2]), "driver": target[2], "nproc": nproc,
               "cwd": cwd, "source": source}
    started = time.perf_counter()
    if _ZYGOTE.get("relayed"):
        _ZYGOTE["requests"].send(message)
    else:
        request(message)
    try:
        pid = _reply(request_id)["pid"]
    except CopyGone:  # the copy ended before this launch (the supervisor says so): ranks from real torchrun instead
        return rank.torchrun(target, nproc, timeout, cwd, source)
    timed_out = False
    try:
        reply = _reply(request_id, timeout)
        if reply is None:
            timed_out = True
            kill_tree(pid)
            reply = _reply(request_id)
    except BaseException:  # interrupted (a check's time ran out): no rank outlives it
        kill_tree(pid)
        _reply(request_id)
        raise
    try:
        with open(os.path.join(cwd, "launch.log"), errors="replace") as file:
            output = file.read()
    except OSError:
        output = ""
    return Launch(None if timed_out else reply["status"], output, time.perf_counter() - started, timed_out,
                  reports={int(rank): report for rank, report in reply.get("reports", {}).items()})

"""A preloaded Python for the sandbox: imports torch, Lightning and the course's checks once, then
forks a fresh process into each sandbox instead of starting Python and importing them again.

    started by sandbox.Preloaded (``python -m autograders.preload FD``); never by hand

Grading a submission used to start a Python and import torch (and often Lightning): seconds of CPU
per submission, the same work every time. This process does it once per grading worker, then for
each run it forks a child that becomes the sandboxed program exactly as ``sandbox.run`` would start
it (see ``sandbox.py``): a new session, the resource limits, the scrubbed environment, its own
working folder, the run's cgroup (as root); when isolated, new network, mount, PID and IPC namespaces with the same mounts, and
``nobody`` with no capabilities and no new privileges. The grader still kills the child's process
group on timeout, and a child in a PID namespace takes everything it started with it.

It is safe to fork because this process never starts a thread (sandbox.ONE_THREAD_ENV comes with the
environment, and ``worker.forking.fork_safe`` checks its threads and CUDA before serving), never
initializes CUDA, and never reads anything a submission must not see: it imports public packages,
the sandbox's worker (``worker.trust.PRELOAD``), ``sandbox`` and ``sandbox_view`` (limits and mounts,
nothing secret) only. Its socket and every other descriptor it holds are closed in the child before student code
runs, and the child forgets the grader's modules (``_forget_grader``) before it runs the program.
It stays on the grader's side (it applies ``sandbox``'s limits), but its children become sandboxes;
it forks them in ``worker.forking.serve``, the loop the zygote serves its launches with too.

Protocol (a SOCK_SEQPACKET socket, one JSON message each way per step): first ``{"ready": bool,
"why": str}``; then per run, a request with the descriptors for stdin, stdout and ``pass_fds``
attached, answered by ``{"pid": N}`` once the child has its own session, and by ``{"status": code}``
(as ``subprocess`` reports it) when it exits.
"""

from __future__ import annotations

import fcntl
import importlib
import io
import json
import os
import resource
import runpy
import signal
import socket
import sys
import traceback

from . import sandbox  # its Limits, and the limits applied as sandbox.run applies them
from .namespaces import isolate
from .worker import forking
from .worker.forking import fork_safe
from .worker.trust import PRELOAD

HIGH_FD = 1000  # received descriptors are parked above this while the child closes everything else


def preload() -> tuple[bool, str]:
    """Import PRELOAD; whether forking is safe afterwards, and why not."""
    if not os.path.isdir("/proc/self/task"):
        return False, "forking a preloaded Python needs Linux"
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # a missing optional package only means a slower child
            pass
    from .worker.trust import import_course

    import_course()  # every module of gpucourse, as the runner does before its snapshot
    why = fork_safe()
    return why is None, "" if why is None else f"{why} after importing"


def serve(sock: socket.socket) -> None:
    base_path = sys.path[1:]  # without this file's folder: the child's sys.path is the program's own
    ready, why = preload()
    sock.send(json.dumps({"ready": ready, "why": why}).encode())
    if not ready:
        return

    def receive() -> "_Run | None":
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 16)
        except OSError:
            return None
        return _Run(json.loads(message), fds, base_path) if message else None  # no message: the grader is gone

    forking.serve(receive, lambda reply: sock.send(json.dumps(reply).encode()), failure_code=127)


class _Run:
    """One sandboxed run (a ``worker.forking.Fork``): the child becomes the program (``_child``); the server
    names it once it has its own session (from then on the grader may kill its group), then waits for it."""

    def __init__(self, request: dict, fds: list[int], base_path: list[str]):
        self.request, self.fds, self.base_path = request, fds, base_path
        self.started_r, self.started_w = os.pipe()

    def child(self) -> None:  # exits itself with the program's code
        os.close(self.started_r)
        _child(self.request, self.fds, self.started_w, self.base_path)

    def forked(self, pid: int) -> dict:
        os.close(self.started_w)
        for fd in self.fds:
            os.close(fd)
        os.read(self.started_r, 1)  # the child has its own session
        os.close(self.started_r)
        return {"pid": pid}

    def finished(self, pid: int) -> dict:
        _, status = os.waitpid(pid, 0)
        return {"status": os.waitstatus_to_exitcode(status)}


def _descriptors(fds: list[int], targets: list[int]) -> None:
    """Put each received descriptor at its target number and close every other one (the socket too)."""
    parked = [fcntl.fcntl(fd, fcntl.F_DUPFD, HIGH_FD + i) for i, fd in enumerate(fds)]
    if any(not 2 < t < HIGH_FD for t in targets[2:]):
        raise SystemExit(f"preload: cannot pass descriptors {targets[2:]}")
    os.closerange(0, HIGH_FD)
    for fd, target in zip(parked, targets):
        os.dup2(fd, target)  # inheritable, as Popen's pass_fds are
    os.dup2(1, 2)
    os.closerange(HIGH_FD, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _child(request: dict, fds: list[int], started: int, base_path: list[str]) -> None:
    limits = sandbox.Limits(**request["limits"])
    # its cgroup first (before the job, which holds the student's code, is read), then a new session and the limits
    sandbox._limit_resources(limits, tuple(request.get("cgroup", ())))()
    os.write(started, b"x")
    _descriptors(fds, [0, 1] + request["pass_fds"])
    for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        signal.signal(number, signal.SIG_DFL)
    if request["isolate"]:
        isolate(request["script"], limits.processes, limits.user)
    else:
        os.chdir(request["workdir"])
    os.environ.clear()
    os.environ.update(request["env"])
    os._exit(_run_python(request["command"][1:], base_path))


def _run_python(argv: list[str], base_path: list[str]) -> int:
    """``python ARGV`` (``-m module``, ``-c code`` or a script) in this process; its exit code."""
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8")
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8",
                                                   errors="backslashreplace", line_buffering=True)
    _forget_grader()
    import atexit

    atexit._clear()  # handlers the imports registered here (matplotlib's temporary cache...) are this server's
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv, sys.path[:] = [argv[1]] + argv[2:], [os.getcwd()] + base_path
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv, sys.path[:] = ["-c"] + argv[2:], [""] + base_path
            runpy._run_module_code(compile(argv[1], "<string>", "exec"), {}, None, "__main__")
        else:
            sys.argv, sys.path[:] = list(argv), [os.path.dirname(os.path.abspath(argv[0]))] + base_path
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    return code & 0xFF


def _forget_grader() -> None:
    """The grader's modules this server imported (this one, ``sandbox``, ``sandbox_view``) are not the program's
    business: out of ``sys.modules`` and off the ``autograders`` package, which keeps only its worker."""
    package = sys.modules.get("autograders")
    for name in [n for n in sys.modules if n.startswith("autograders.") and not n.startswith("autograders.worker")]:
        sys.modules.pop(name, None)
        if package is not None:
            vars(package).pop(name.split(".")[1], None)


def main() -> None:
    """``python -m autograders.preload FD``: no path of the grader's on the command line, which the
    children inherit (they are forks, not new programs)."""
    os.chdir("/")
    serve(socket.socket(fileno=int(sys.argv[1])))
    os._exit(0)  # nothing to flush or clean up: skip tearing torch and Lightning down


if __name__ == "__main__":
    main()

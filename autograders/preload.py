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

It is safe to fork because this process never starts a thread (OMP_NUM_THREADS=1 comes with the
environment, and ``worker.forking.fork_safe`` checks its threads and CUDA before serving), never
initializes CUDA, and never reads anything a submission must not see: it imports public packages,
the sandbox's worker (``worker.trust.PRELOAD``), ``sandbox`` and ``sandbox_view`` (limits and mounts,
nothing secret) only. Its socket and every other descriptor it holds are closed in the child before student code
runs, and the child forgets the grader's modules (``_forget_grader``) before it runs the program.
It stays on the grader's side (it applies ``sandbox``'s limits), but its children become sandboxes;
its serve loop and the zygote's are two (``worker.forking`` says why).

Protocol (a SOCK_SEQPACKET socket, one JSON message each way per step): first ``{"ready": bool,
"why": str}``; then per run, a request with the descriptors for stdin, stdout and ``pass_fds``
attached, answered by ``{"pid": N}`` once the child has its own session, and by ``{"status": code}``
(as ``subprocess`` reports it) when it exits.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib
import io
import json
import os
import resource
import runpy
import signal
import socket
import subprocess
import sys
import traceback

from . import sandbox  # its Limits, and the limits applied as sandbox.run applies them
from .sandbox_view import NOBODY, ROOT_MOUNT
from .worker.forking import fork_safe, in_child
from .worker.trust import PRELOAD

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
LINUX_CAPABILITY_VERSION_3 = 0x20080522
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
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 16)
        except OSError:
            return
        if not message:
            return  # the grader is gone
        request = json.loads(message)
        started_r, started_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            def child(request=request, fds=fds) -> None:  # exits itself with the program's code
                os.close(started_r)
                _child(request, fds, started_w, base_path)

            in_child(child, code=127)
        os.close(started_w)
        for fd in fds:
            os.close(fd)
        os.read(started_r, 1)  # the child has its own session: the grader may kill its group from now on
        os.close(started_r)
        sock.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        sock.send(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode())


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


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _drop_privileges(processes: int, user: int = NOBODY) -> None:
    """What ``setpriv --reuid=USER --regid=USER --clear-groups --no-new-privs --inh-caps=-all``
    and ``prlimit --nproc`` do (USER: nobody, or another free uid, sandbox.Limits.user); refuses to go
    on if any capability is left."""
    libc = _libc()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    os.setgroups([])
    os.setresgid(user, user, user)
    os.setresuid(user, user, user)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable, twice: all empty
    _check(libc.capset(header, data), "capset")
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    left = [k for k in ("CapInh", "CapPrm", "CapEff", "CapAmb") if int(status.get(k, "0").strip(), 16)]
    if left or os.getuid() != user or os.getgid() != user or os.getgroups():
        raise SystemExit(f"preload: privileges not dropped ({', '.join(left) or 'ids'})")
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def _isolate(script: str, processes: int, user: int = NOBODY) -> None:
    """New namespaces; the child of this process becomes PID 1 of the new PID namespace and returns,
    as ``nobody`` in /mnt; this process waits for it and exits as it did (``unshare --fork --kill-child``)."""
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC), "unshare")
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code & 0xFF)
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    mounts = subprocess.run(["sh", "-c", script], stdin=subprocess.DEVNULL)  # output: the sandbox's own
    if mounts.returncode != 0:
        os._exit(mounts.returncode & 0xFF or 1)
    os.chroot(ROOT_MOUNT)  # the root the script put together: only what sandbox_view.visible() lists
    os.chdir("/mnt")
    _drop_privileges(processes, user)
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # a change of user clears it


def _child(request: dict, fds: list[int], started: int, base_path: list[str]) -> None:
    limits = sandbox.Limits(**request["limits"])
    # its cgroup first (before the job, which holds the student's code, is read), then a new session and the limits
    sandbox._limit_resources(limits, tuple(request.get("cgroup", ())))()
    os.write(started, b"x")
    _descriptors(fds, [0, 1] + request["pass_fds"])
    for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        signal.signal(number, signal.SIG_DFL)
    if request["isolate"]:
        _isolate(request["script"], limits.processes, limits.user)
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

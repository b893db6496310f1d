"""Run untrusted student code in a subprocess with limits, and kill everything it started.

Always (any OS user): a new session, a scrubbed environment, a working folder of its own, and
resource limits: address space, CPU seconds, processes, file size; a wall-clock limit that kills
the whole process group; and captured output cut at a byte limit.

Isolated, additionally: new network (loopback only), mount, PID and IPC namespaces (no network, no
view of or signal to the grader's processes, and every process left behind dies with the
namespace), a root holding only what ``sandbox_view.visible()`` lists (the system's programs and
libraries, the interpreter, its venv, the course's package without its answer-derived files, the
grader's sandbox-side ``autograders.worker``; nothing of the checkout around them, of other
students' work or of the rest of the grader; sandbox_view.py builds it), and the code runs as
``nobody`` with no capabilities. Two ways, probed once (``probe()``):

- ``namespaces``: the grader runs as root on Linux and can create namespaces (CI, a grading server); the
  code runs as the real ``nobody``, and runs may be forked from a preloaded Python (``Preloaded``).
- ``bwrap``: any user, with bubblewrap and unprivileged user namespaces (a laptop, a shared account);
  the code is ``nobody`` inside a user namespace and the grader's own user outside (with its
  supplementary groups: an unprivileged process cannot drop them), and what it sees is read-only but
  for its working folder and its own /tmp and /dev/shm. Every run starts
  Python: bubblewrap has to start the program it confines, and a child forked from a preloaded
  Python is already running.

As root, each run also gets a cgroup of its own (``cgroups``): the kernel bounds the memory of the
whole run, its tmpfs files included, its number of processes and its share of the CPU, and kills what
is left when it ends. Elsewhere the rlimits (and bubblewrap's namespaces) still bound it.

``probe().describe()`` says which applies and, when neither does, what is missing and how to get it;
it says as well whether cgroup limits apply, and why not.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import cgroups, sandbox_view


# Variables of every run's environment that keep a preloaded Python at one thread, so that forking it is
# safe (worker.forking.fork_safe refuses otherwise, and runs fall back to starting Python): OpenMP's pool,
# and the background thread of the jemalloc inside pyarrow, which `import pyarrow` starts (pandas imports
# it wherever it is installed: seen on a GPU machine's image, 2026-12-01, where the preload was refused).
ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}


@dataclass(frozen=True)
class Limits:
    wall_seconds: float = 600
    cpu_seconds: int = 900
    memory_bytes: int = 6 << 30  # address space; torch's CUDA build maps ~2 GB just importing
    processes: int = 256  # per user, threads included: bounds a fork bomb; workers, ranks and their threads fit
    # Under ``namespaces``, the user the code runs as. RLIMIT_NPROC counts every process of a user, so
    # sandboxes that run at the same time each need their own (``users``), as Nix's build users do:
    # otherwise one student's fork bomb leaves the other sandboxes of the batch no process to start.
    user: int = sandbox_view.NOBODY
    file_bytes: int = 256 << 20
    output_bytes: int = 1 << 20  # kept; anything beyond is counted and dropped
    # The run as a whole, in its cgroup (as root; 0: none): rlimits bound each process alone, and tmpfs
    # pages count against no process. Memory includes the sandbox's /tmp and /dev/shm, with no swap.
    memory_max_bytes: int = 6 << 30
    tmpfs_bytes: int = 1 << 30  # each of the isolated sandbox's own /tmp and /dev/shm, cgroup or not
    pids_max: int = 512  # processes and threads of this run alone, whoever runs beside it
    cpu_weight: int = 100  # its CPU share against other sandboxes (cgroup v2's cpu.weight; 100 is the default)
    cpu_quota: float = 0  # the most CPUs it may use at once; 0: no cap


@dataclass
class Outcome:
    returncode: int | None
    output: str
    output_bytes: int
    seconds: float
    timed_out: bool
    isolated: bool
    notes: list[str] = field(default_factory=list)
    isolation: str = ""  # the method (METHODS) when isolated
    forked: bool = False  # from a preloaded Python (Preloaded), not a new interpreter
    cgroup: str = ""  # "v1" or "v2" when the run had a cgroup of its own (cgroups), else ""

    @property
    def truncated(self) -> bool:
        return self.output_bytes > len(self.output.encode(errors="replace"))


METHODS = ("namespaces", "bwrap")


@dataclass(frozen=True)
class Isolation:
    """The isolation runs can have here (``method``: one of METHODS, or "" for none) and what is missing."""

    method: str
    missing: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.method)

    def describe(self) -> str:
        if self.method == "namespaces":
            text = "isolated: namespaces (root, autograders.namespaces), code runs as nobody"
        elif self.method == "bwrap":
            text = "isolated: bubblewrap (user namespaces), code runs as nobody in its own namespaces"
        else:
            text = "not isolated (resource limits and process-group kill only): " + "; ".join(self.missing)
        limits = cgroups.probe()
        if limits:
            return f"{text}; {limits.describe()}"
        still = "rlimits per process" + (", its own /tmp and /dev/shm of bounded size" if self.method else "")
        return f"{text}; {limits.describe()}: {still} bound the run"


def _first_line(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _userns_problem() -> str:
    """Why this kernel refuses an ordinary user a user namespace, with the setting that allows it."""
    if _first_line("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return ("unprivileged user namespaces are disabled: sysctl -w kernel.unprivileged_userns_clone=1 "
                "(as root; kernel.unprivileged_userns_clone=1 in /etc/sysctl.d/ to keep it)")
    if _first_line("/proc/sys/user/max_user_namespaces") == "0":
        return "user namespaces are disabled: sysctl -w user.max_user_namespaces=10000 (as root)"
    if _first_line("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return ("AppArmor restricts unprivileged user namespaces (Ubuntu 23.10 and later): an AppArmor profile "
                "allowing userns for /usr/bin/bwrap, or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0")
    return ""


@functools.cache
def probe() -> Isolation:
    """Which isolation works here (tried for real, once per process), and what is missing for the rest."""
    if sys.platform != "linux":
        return Isolation("", ("namespaces and bubblewrap need Linux: grade a class on a Linux machine or VM",))
    if os.geteuid() == 0:  # the real nobody; bubblewrap as root would map nobody to root, exempt from RLIMIT_NPROC
        missing = [tool for tool in ("sh", "mount") if not shutil.which(tool, path=os.defpath)]
        if missing:
            return Isolation("", (f"{', '.join(missing)} missing: apt-get install util-linux",))
        with tempfile.TemporaryDirectory(prefix="gpucourse-probe-") as folder:  # a run of `true`, isolated as every run
            trial = subprocess.run(sandbox_view._isolated_command(["true"], Path(folder), [], sandbox_view.NOBODY, 16),
                                   cwd=sandbox_view.ISOLATED_CWD, env={"PATH": os.defpath}, capture_output=True, timeout=60)
        if trial.returncode != 0:
            return Isolation("", ("the sandbox's namespaces could not be created (a container without CAP_SYS_ADMIN?): "
                                  + trial.stderr.decode(errors="replace").strip()[-200:],))
        return Isolation("namespaces")
    if not shutil.which("bwrap"):
        return Isolation("", ("bubblewrap is not installed: apt-get install bubblewrap (or dnf/pacman install "
                              "bubblewrap); root on a grading server gets namespaces without it",))
    base = sandbox_view._bwrap_base()  # the namespaces alone: a run's root is sandbox_view.visible(), the probe's the whole
    trial = subprocess.run(base[:1] + ["--ro-bind", "/", "/"] + base[1:] + ["--", "true"], capture_output=True, timeout=30)
    if trial.returncode != 0:
        return Isolation("", (_userns_problem() or "bubblewrap cannot create its namespaces: "
                              + trial.stderr.decode(errors="replace").strip()[-200:],))
    return Isolation("bwrap")


def namespaces_available() -> bool:
    """Whether runs can be isolated here, either way (see ``probe``); the first call that finds none
    says on stderr what is missing and how to get it."""
    isolation = probe()
    if not isolation and not getattr(namespaces_available, "told", False):
        namespaces_available.told = True
        print(f"sandbox: {isolation.describe()}", file=sys.stderr)
    return bool(isolation)


def users(count: int) -> list[int]:
    """``count`` users for sandboxes that run at the same time, claimed for this process: the uids just
    below ``nobody`` that no account holds (Debian reserves 65000-65533 and never allocates them).

    RLIMIT_NPROC counts every process of a user on the machine, so two graders on one machine (a second
    ``make grade``, the test suite's parallel workers) must not share one either: each uid is claimed
    with a lock file that this process holds until it exits, and another process skips it. ``nobody``
    itself stays the default user of a single sandbox (``Limits.user``) and is never handed out here.
    """
    import pwd

    found = [uid for uid in _CLAIMED][:count]
    for uid in range(sandbox_view.NOBODY - 1, 65000, -1):
        if len(found) >= count:
            break
        if uid in _CLAIMED:
            continue
        try:
            pwd.getpwuid(uid)
            continue  # an account holds it
        except KeyError:
            pass
        if _claim(uid):
            found.append(uid)
    if len(found) < count:
        raise ValueError(f"no {count} free user ids below {sandbox_view.NOBODY} for {count} sandboxes at a time")
    return found


_CLAIMED: dict[int, int] = {}  # uid -> descriptor of its lock file, held while this process lives


def _claim(uid: int) -> bool:
    import fcntl
    import tempfile

    fd = os.open(os.path.join(tempfile.gettempdir(), f"gpucourse-sandbox-user-{uid}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another grader holds it
        os.close(fd)
        return False
    _CLAIMED[uid] = fd
    return True


def _limit_resources(limits: Limits, cgroup: tuple[str, ...] = ()):
    """What the child does before it runs the program: its cgroup (``cgroups.Group.procs``) first, so
    that everything after is counted, then a session of its own and the rlimits."""
    def apply() -> None:
        if cgroup:
            try:
                cgroups.join(cgroup)
            except OSError as error:  # the rlimits still hold: run, and say so in the run's output
                os.write(2, f"sandbox: could not join the run's cgroup: {error}\n".encode())
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if os.geteuid() != 0:  # root ignores RLIMIT_NPROC; `namespaces` sets it after dropping to nobody
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))

    return apply


def _drain(stream, limits: Limits, kept: list[bytes], counted: list[int]) -> None:
    for chunk in iter(lambda: stream.read(65536), b""):
        counted[0] += len(chunk)
        room = limits.output_bytes - sum(len(k) for k in kept)
        if room > 0:
            kept.append(chunk[:room])


class Preloaded:
    """A preloaded Python (``autograders.preload``) that forks each run instead of starting Python.

    One per grading worker, one run at a time. It is started with the environment its runs get
    (the engine's scrubbed one), imports torch, Lightning and the course's checks once, and then
    serves ``run(..., preloaded=this)`` for programs started as ``[sys.executable, ...]`` with that
    environment; anything else, a server that could not start, or a run under bubblewrap (it
    confines only a program it starts itself) falls back to starting Python.
    """

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self.why = ""
        self._ready: bool | None = None
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self._process = subprocess.Popen([sys.executable, "-m", f"{__package__}.preload", str(theirs.fileno())],
                                             env=self.env, cwd=sandbox_view.GRADER.parent, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                             pass_fds=(theirs.fileno(),), start_new_session=True)

    def _receive(self, timeout: float | None) -> dict | None:
        self._sock.settimeout(timeout)
        try:
            message = self._sock.recv(1 << 16)
        finally:
            self._sock.settimeout(None)
        if not message:
            raise ConnectionError("the preloaded Python is gone")
        return json.loads(message)

    def usable(self) -> bool:
        """Waits for the imports on first call; whether runs can be forked from it."""
        if self._ready is None:
            try:
                answer = self._receive(timeout=600)
                self._ready, self.why = bool(answer.get("ready")), str(answer.get("why", ""))
            except (OSError, ValueError, AttributeError) as error:
                self._ready, self.why = False, f"{type(error).__name__}: {error}"
        return self._ready and self._process.poll() is None

    def start(self, command: list[str], workdir: Path, env: dict[str, str], hide: list[Path], limits: Limits,
              isolate: str, pass_fds: tuple[int, ...], cgroup: tuple[str, ...] = ()) -> "_Forked | None":
        """Fork ``command`` as ``run`` would start it; None if this server cannot (then start Python).
        ``cgroup``: the run's (``cgroups.Group.procs``), which the child joins before anything else.

        ``isolate``: "" or "namespaces" (the server enters them in the child, as root); "bwrap" never
        forks: bubblewrap can only confine a program it starts itself."""
        if isolate not in ("", "namespaces") or command[:1] != [sys.executable] or env != self.env or not self.usable():
            return None
        request = {"command": command, "workdir": str(workdir), "env": env, "isolate": bool(isolate),
                   "limits": dataclasses.asdict(limits), "pass_fds": list(pass_fds), "cgroup": list(cgroup),
                   "script": "\n".join(sandbox_view._mount_script(workdir, hide, tmpfs_bytes=limits.tmpfs_bytes))
                   if isolate else ""}
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], [stdin_r, stdout_w, *pass_fds])
            pid = self._receive(timeout=60)["pid"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            self._ready, self.why = False, f"{type(error).__name__}: {error}"
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            return None
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        return _Forked(self, pid, os.fdopen(stdin_w, "wb"), os.fdopen(stdout_r, "rb"))

    def close(self) -> None:
        self._sock.close()  # the server sees EOF and exits
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class _Forked:
    """The part of ``subprocess.Popen`` that ``run`` uses, for a child of a preloaded Python."""

    def __init__(self, server: Preloaded, pid: int, stdin, stdout):
        self.server, self.pid, self.stdin, self.stdout, self.returncode = server, pid, stdin, stdout, None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = int(self.server._receive(timeout)["status"])
            except socket.timeout:
                raise subprocess.TimeoutExpired("preloaded run", timeout) from None
            except (OSError, ValueError, KeyError, TypeError) as error:  # the server died: no more runs from it
                self.server._ready, self.server.why = False, f"{type(error).__name__}: {error}"
                self.returncode = -signal.SIGKILL
        return self.returncode


def run(command: list[str], workdir: Path, *, env: dict[str, str] | None = None, hide: list[Path] = (),
        limits: Limits = Limits(), isolate: bool | str | None = None, stdin: bytes = b"",
        pass_fds: tuple[int, ...] = (), preloaded: Preloaded | None = None) -> Outcome:
    """Run ``command`` in ``workdir`` under ``limits``; never raises for what the code does.

    ``isolate``: None or True, the method ``probe()`` found (None: none if it found none); a method
    name (METHODS) for that one; False, none. ``workdir`` becomes the code's current folder (``/mnt``
    when isolated; handed to ``nobody`` under ``namespaces``). ``hide`` lists folders the code must
    not read although they lie inside a visible folder (isolated only; nothing else is visible anyway).
    ``pass_fds`` are given to the code and closed here. ``preloaded``: fork
    a Python ``command`` from that server (same sandbox, no interpreter start-up) when it can.
    """
    if isinstance(isolate, str):
        method = isolate
    elif isolate is None:
        method = probe().method
    else:  # asked for where none works: fails visibly, in the run's output
        method = (probe().method or "namespaces") if isolate else ""
    if method and method not in METHODS:
        raise ValueError(f"isolate must be one of {METHODS}, a bool or None, not {isolate!r}")
    env = env if env is not None else {"PATH": os.defpath}
    notes = []
    if method == "namespaces":
        os.chown(workdir, limits.user, limits.user)
        for path in workdir.rglob("*"):
            os.chown(path, limits.user, limits.user, follow_symlinks=False)
    elif not method:
        why = "; ".join(probe().missing) or "isolation was turned off"
        notes.append(f"not isolated (limits and process-group kill only): {why}")
    try:
        group = cgroups.create(limits)  # None where there are none (probe().describe() says why): rlimits only
    except OSError as error:  # a limit the kernel refuses, say: the run goes on with its rlimits
        group = None
        notes.append(f"no cgroup for this run ({error}): its rlimits alone bound it")
    try:
        return _run(command, workdir, env, hide, limits, method, stdin, pass_fds, preloaded, notes, group)
    finally:
        if group is not None:
            group.remove()  # kills what is left in it: a setsid daemon of a run that was not isolated too


def _run(command, workdir, env, hide, limits, method, stdin, pass_fds, preloaded, notes, group) -> Outcome:
    joins = group.procs if group is not None else ()
    start = time.perf_counter()
    proc = preloaded.start(command, workdir, env, list(hide), limits, method, pass_fds, joins) if preloaded else None
    if proc is None:
        if method == "namespaces":
            full = sandbox_view._isolated_command(command, workdir, list(hide), limits.user, limits.processes,
                                                  limits.tmpfs_bytes)
        elif method == "bwrap":
            full = sandbox_view._bwrap_command(command, workdir, list(hide), limits.tmpfs_bytes)
        else:
            full = command
        proc = subprocess.Popen(full, cwd=sandbox_view.ISOLATED_CWD if method == "namespaces" else workdir, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                preexec_fn=_limit_resources(limits, joins), pass_fds=pass_fds, close_fds=True)
    for fd in pass_fds:  # handed over: the child holds them now, and readers must see EOF when it exits
        os.close(fd)
    kept: list[bytes] = []
    counted = [0]
    reader = threading.Thread(target=_drain, args=(proc.stdout, limits, kept, counted), daemon=True)
    reader.start()
    try:
        proc.stdin.write(stdin)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    timed_out = False
    try:
        proc.wait(timeout=limits.wall_seconds)
    except subprocess.TimeoutExpired:
        timed_out = True
        notes.append(f"killed after {limits.wall_seconds:.0f} s of wall time")
    _kill_group(proc)
    if group is not None:
        group.remove()  # before the output is drained: a leftover process may hold the pipe open
    if isinstance(proc, _Forked) and proc.returncode is None:  # its end was never reported: never reuse that server
        proc.server._ready, proc.server.why = False, "a run's end was not reported"
    reader.join(timeout=10)
    if counted[0] > limits.output_bytes:
        notes.append(f"output cut at {limits.output_bytes} of {counted[0]} bytes")
    output = b"".join(kept).decode(errors="replace")
    if method == "bwrap" and proc.returncode and output.startswith(BWRAP_NO_PROCESS):
        notes.append(_process_limit_note(limits))
    return Outcome(returncode=None if timed_out else proc.returncode,
                   output=output, output_bytes=counted[0],
                   seconds=time.perf_counter() - start, timed_out=timed_out, isolated=bool(method), notes=notes,
                   forked=isinstance(proc, _Forked), isolation=method, cgroup=group.version if group else "")


# What bubblewrap says when RLIMIT_NPROC stops it creating its namespaces: the limit counts every
# process and thread of the grader's account, not only the sandbox's.
BWRAP_NO_PROCESS = "bwrap: Creating new namespace failed: Resource temporarily unavailable"


def _process_limit_note(limits: Limits) -> str:
    """Why bubblewrap could not start, and what to do: the instructor is told, not only the student."""
    uid, mine = os.getuid(), 0
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            mine += task.stat().st_uid == uid
        except OSError:  # ended meanwhile
            continue
    return (f"not started: the process limit ({limits.processes}, RLIMIT_NPROC) counts every process and thread "
            f"of your account, which runs {mine} now; under bubblewrap the sandbox shares that count. Raise "
            f"SandboxLimits.processes, end other processes of this account, or grade as root (namespaces: a user "
            f"of its own per sandbox)")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the session the code ran in: its children and grandchildren go with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass

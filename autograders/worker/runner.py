"""The grader's sandbox side: run a submission's cells, then the observers; report plain data.

    python -m autograders.worker RESULTS_FD OBSERVERS_FD < job.json

``job.json``: ``{"cells": [{"source", "grade_id"}], ...}``, the grader's settings beside the cells, each
field declared once with its default in ``job.Job`` (which refuses unknown fields and wrong types); the
observers (``[{"case", "source", "function"}]``, and ``"inputs"`` for a case that draws them) come on
OBSERVERS_FD, read only once the cells are done.
RESULTS_FD receives JSON lines: one per cell (its output and error), in order; then one per
observer, in order (``{"case", "ok", "data" | "error"}``; ``"answer": true`` when the error is a
missing or mistyped answer, whose message already says what to define); ``{"type": "flag",
"reason"}`` when the run was refused or forged; then ``{"type": "done"}``.

Two processes (see the grader's threat model): the *supervisor* (``supervisor``, beside this) holds
the results and the observers and never runs student code; it forks a *worker* (``_work``, here) that runs
the cells and then, one at a time, the observers it is sent, and watches it from outside.

Why it looks like this:
- no IPython: a student cell cannot install input transformers or pre-run hooks that rewrite the
  code run after it (``get_ipython`` does not exist here);
- every module of ``gpucourse`` is imported before student code runs; then every loaded module of
  ``gpucourse``, this worker, torch, Lightning, numpy and the standard library (``trust``) is
  snapshotted (``snapshot.Snapshot``: its dict and class, with the dicts of the classes defined there,
  the code and defaults of their Python functions, the ``sys.modules`` entries and the import system's
  lists); after every cell whatever changed is put back (compared by identity), so patching
  ``os.getpid``, ``torch.Tensor.tolist``, a course helper or a check module reaches neither the runner
  nor the observers;
- while student cells run, the modules of ``gpucourse.checks`` (the public checks, the harnesses)
  and of ``autograders`` (this runner and its worker package) cannot be imported
  (``snapshot.Gate``): ``import gpucourse.checks.lesson10_beyond_one_machine`` or ``import autograders.worker.runner``
  raises ImportError; ``gpucourse.checks`` itself stays, with ``check`` only saying that the grader
  runs the checks;
- the observers run with the environment and import path of the snapshot, without the working
  folder: a module the student wrote there is not what an observer imports;
- observations leave as JSON, never pickle; judging happens in the grader's process;
- multi-process exercises fork their launcher and ranks from a copy of this process taken before
  the first cell (``zygote``, the launcher of the ``gpucourse.checks.ddp.LaunchPolicy`` the worker
  installs for its whole run, with the exercises' sources as the job holds them), instead of starting a
  Python and importing torch per rank; every rank runs the harness protected as the cells are
  (``rank``);
- processes a cell leaves behind live on, as in a kernel (a forkserver, a pool's resource tracker,
  a DataLoader's persistent workers); a cell that runs out of time has every process below the worker
  killed (``kill_strays``: the worker is their subreaper), so a fork bomb costs that answer, not the
  next ones (the sandbox's cgroup bounds how many there can be); the alarm repeats until it is taken,
  since one raised inside an at-fork hook is swallowed; a cell that still does not stop is stopped from
  outside, and a fresh worker goes on after it;
- before any observer runs the worker must be quiet (``Quiet``): no code of the cells' running in a
  thread, no trace or profile function, audit hook, gc callback, signal handler or timer of theirs.
  Threads and processes that libraries keep (idle thread pools, OpenMP, a forkserver) are honest and
  allowed. Quiet is hygiene, not the defence: the checks that give points compare outputs on inputs
  the grader draws after the cells with references only the grader holds.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import linecache
import os
import signal
import sys
import time
import traceback
import types

from gpucourse import launch
from gpucourse.checks import AnswerError, ddp

from . import audit, rank, zygote
from .forking import Channel
from .job import DEFAULTS
from .snapshot import Gate, Snapshot, in_scope


OUTPUT_LIMIT = DEFAULTS.output_limit  # characters of each cell's output kept for the feedback (the job's)


class CellTimeout(BaseException):
    """Raised in a cell or observer that overran its time (BaseException: `except Exception` won't eat it)."""


_ALARM = {"armed": False}
RETRY_SECONDS = DEFAULTS.alarm_retry_seconds  # the job's alarm_retry_seconds


def _on_alarm(signum, frame):
    if _ALARM["armed"]:
        # Again in a moment, in case this one is swallowed: a handler that runs inside an at-fork hook
        # (logging registers one) has its exception ignored, and a fork bomb is mostly inside fork().
        signal.setitimer(signal.ITIMER_REAL, RETRY_SECONDS)
        raise CellTimeout()


def _arm(seconds: float) -> None:
    signal.signal(signal.SIGALRM, _on_alarm)
    _ALARM["armed"] = True
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _disarm() -> None:
    _ALARM["armed"] = False
    signal.setitimer(signal.ITIMER_REAL, 0)


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans of this process's descendants come back to it (instead of to init), so that
    ``kill_strays`` finds every process a cell started, however it forked."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# bound before any student code runs: the freeze comes before the cell's patches are undone
_kill = os.kill
# Set in a worker whose supervisor is PID 1 of the sandbox's PID namespace (the supervisor asks before it
# forks the worker): then ``kill(-1)`` reaches only the sandbox's processes (PID 1 is spared), and the
# launcher copy is thawed afterwards.
FREEZE = {"namespace": False, "keep": set()}


def freeze_strays() -> None:
    """At a cell's timeout, before anything else: in the sandbox's own PID namespace, stop every other
    process in it with one ``kill(-1, SIGSTOP)`` (PID 1, the supervisor, and this worker are spared),
    so that a fork bomb stops forking and leaves the CPU to this process. ``kill_strays`` then kills
    them and thaws ``FREEZE["keep"]``."""
    if FREEZE["namespace"]:
        try:
            _kill(-1, signal.SIGSTOP)
        except OSError:
            pass


def _reap() -> None:
    """Collect every child of this process that has died (a process exits after handing its own
    children to this subreaper, so no dead process is left below a dead one)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def kill_strays(keep: set[int]) -> tuple[int, int]:
    """Kill every process below this one but ``keep``'s (``gpucourse.launch.kill_tree``), reap them
    (a zombie still counts against the user's process limit) and let ``keep``'s go on: how many were
    killed, and how many still lived when ``bury`` gave up."""
    killed = launch.kill_tree(os.getpid(), spare=keep)
    left = bury(lambda: family(keep))
    thaw(keep)
    return killed, len(left)


def family(pids) -> set[int]:
    """``pids`` and every living process below them: what a kill of strays spares (the launcher copy)."""
    return set(pids).union(*(launch.descendants(pid) for pid in pids))


def thaw(pids) -> None:
    """SIGCONT to ``pids`` and everything below them: what a freeze (``kill(-1, SIGSTOP)``) stopped and must go on."""
    for pid in family(pids):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)


def bury(spared, idle: float = 5.0, most: float = 60.0) -> set[int]:
    """Wait until every process below this one, but ``spared()``'s, is dead and reaped; the living ones
    are sent SIGKILL again at each look (one started after the kill's last look). Waits while they still
    die: until ``idle`` seconds pass with none fewer, or ``most`` in all. What is left, if any.

    Why not a fixed wait: 255 processes of a fork bomb, forked from a worker with torch loaded, took
    1.2-1.8 s to exit after SIGKILL on a quiet 2-core machine, and several times that when the machine
    is busy: leftovers then hold the process limit against the checks that follow."""
    me, start = os.getpid(), time.monotonic()
    fewest, progress = None, start
    while True:  # the killed die a moment later, and their orphans come back here to be reaped
        _reap()
        living = launch.descendants(me) - spared()
        now = time.monotonic()
        if not living:
            break
        if fewest is None or len(living) < fewest:
            fewest, progress = len(living), now
        if now - progress > idle or now - start > most:
            break
        launch.signal_all(living, signal.SIGKILL)
        time.sleep(0.01)
    _reap()  # those that died after the last reap: a zombie is not living, so the look above passed it
    return living


class _Capture(io.StringIO):
    def write(self, text):  # keep the head of a flood, drop the rest
        room = OUTPUT_LIMIT - self.tell()
        return super().write(text[:max(room, 0)]) if room > 0 else len(text)


# --- a process that is quiet: nothing of the cells' left running while the checks run --------------

SIGNALS = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))
TIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)


class Quiet:
    """What a process running no code of the cells looks like, taken before the first cell; ``problems``
    says what differs now: a thread, a child, a trace or profile function, a gc callback, an audit
    hook, a signal handler or an interval timer could each run student code while the checks run.

    Every function it calls is bound here, before any cell could replace it."""

    def __init__(self):
        import gc
        import threading

        self._gettrace, self._getprofile, self._audit = sys.gettrace, sys.getprofile, sys.audit
        self._settrace, self._setprofile = sys.settrace, sys.setprofile
        self._threading = threading
        self._callbacks, self._held_callbacks = gc.callbacks, list(gc.callbacks)
        self._getsignal, self._signal, self._getitimer, self._setitimer = (signal.getsignal, signal.signal,
                                                                          signal.getitimer, signal.setitimer)
        self._handlers = {s: signal.getsignal(s) for s in SIGNALS}
        self._wakeup = signal.set_wakeup_fd
        self._frames, self._get_ident, self._sleep = sys._current_frames, threading.get_ident, time.sleep

    def _threads_on_cells(self, samples: int = 5) -> int:
        """Threads but this one that run the cells' code, or whose target was defined in a cell, in any
        of a few looks a few milliseconds apart."""
        found = set()
        if len(self._frames()) == 1:  # this thread alone: no other can run code of the cells, or start to
            return 0
        for _ in range(samples):
            for ident, frame in self._frames().items():
                if ident != self._get_ident() and ident not in found and _runs_cells(frame):
                    found.add(ident)
            self._sleep(0.005)
        for thread in self._threading.enumerate():
            if thread.ident != self._get_ident() and _defined_in_cells(getattr(thread, "_target", None)):
                found.add(thread.ident)
        return len(found)

    def problems(self) -> list[str]:
        """What is not quiet; each is also undone where it can be (a thread or an audit hook cannot).
        Threads that libraries keep (an idle ``ThreadPoolExecutor``, OpenMP's, a DataLoader's, Lightning's,
        the profiler's) and processes (a forkserver, a resource tracker, persistent workers) are honest;
        a thread that runs the cells' code, or was started on it, is not."""
        found = []
        if self._gettrace() is not None or self._getprofile() is not None:
            found.append("a trace or profile function was left set (sys.settrace, sys.setprofile)")
            self._settrace(None)
            self._setprofile(None)
        if getattr(self._threading, "_trace_hook", None) is not None or getattr(self._threading, "_profile_hook", None) is not None:
            found.append("a trace or profile function was left for new threads (threading.settrace, setprofile)")
            self._threading._trace_hook = self._threading._profile_hook = None
        try:
            self._audit("gpucourse.canary")
            found.append("the grader's audit hook is gone")
        except PermissionError as error:
            if error.args != ("gpucourse.canary",):
                found.append("an audit hook answered the grader's canary")
        except BaseException:
            found.append("an audit hook answered the grader's canary")
        if self._callbacks != self._held_callbacks:
            found.append("gc callbacks were left (gc.callbacks)")
            self._callbacks[:] = self._held_callbacks
        # the timers stop before any handler is put back: the signal of a timer still running, once its
        # handler is the default again, would end this process (SIGALRM's, SIGVTALRM's, SIGPROF's action)
        timers = [t for t in TIMERS if self._getitimer(t) != (0.0, 0.0)]
        for t in timers:
            self._setitimer(t, 0)
        changed = [s for s, handler in self._handlers.items() if self._getsignal(s) is not handler]
        foreign = [s for s in changed if not _library_handler(self._getsignal(s), self._handlers[s])]
        if foreign:
            found.append("signal handlers were changed: " + ", ".join(map(_signal_name, foreign)))
        for s in changed:  # a library's (DataLoader's SIGCHLD handler) is put back too, without a flag
            with contextlib.suppress(OSError, ValueError, TypeError):
                self._signal(s, self._handlers[s])
        if timers:
            found.append("an interval timer was left running (signal.setitimer)")
        if self._wakeup(-1) != -1:
            found.append("a signal wake-up descriptor was left set (signal.set_wakeup_fd)")
        threads = self._threads_on_cells()
        if threads:
            found.append(f"{threads} threads were left running code of the cells")
        return found


def _in_cells(code) -> bool:
    return isinstance(getattr(code, "co_filename", None), str) and code.co_filename.startswith("<cell ")


def _runs_cells(frame) -> bool:
    while frame is not None:
        if _in_cells(frame.f_code):
            return True
        frame = frame.f_back
    return False


def _defined_in_cells(target, depth: int = 0) -> bool:
    """Whether a thread's target is the cells' code, through partials and bound methods."""
    if target is None or depth > 4:
        return False
    if _in_cells(getattr(target, "__code__", None)) or getattr(target, "__module__", None) == "__main__":
        return True
    inner = [getattr(target, "func", None), getattr(target, "__func__", None), getattr(target, "__self__", None)]
    inner += [a for a in getattr(target, "args", ()) or () if callable(a)] if isinstance(getattr(target, "args", None), tuple) else []
    return any(_defined_in_cells(i, depth + 1) for i in inner if i is not None and i is not target)


def _library_handler(handler, held, depth: int = 0) -> bool:
    """Whether ``handler`` is a library's (torch's DataLoader installs one for SIGCHLD) that calls only
    the handler before it, ending at ``held``: no code of the cells in the chain."""
    if handler is held or handler in (signal.SIG_DFL, signal.SIG_IGN, None):
        return True
    if type(handler) is not types.FunctionType or depth > 8:
        return False
    if not in_scope(getattr(handler, "__module__", None) or "__main__"):
        return False
    chained = [value for value in map(_cell_value, handler.__closure__ or ()) if callable(value)]
    return all(_library_handler(previous, held, depth + 1) for previous in chained)


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# --- running the cells and the checks, in a worker -------------------------------------------------

def run_cells(cells: list[dict], seconds: float, emit, taken: Snapshot, start: int = 0, skipped=(), announce=None) -> dict:
    """Run ``cells`` in a fresh ``__main__``; each one's record goes to ``emit``. Cells before ``start``
    run again silently (a fresh worker rebuilds what they defined), but for the ``skipped`` ones;
    ``announce(index)`` is told before each cell runs. After every cell, what it patched is put back
    and every process it left is killed."""
    # The cells' namespace is a real __main__ module, as in a kernel: classes defined in a cell then
    # pickle by reference (DataLoader workers, process pools) exactly as they do in a notebook.
    main_module = types.ModuleType("__main__")
    sys.modules["__main__"] = main_module
    namespace = main_module.__dict__
    namespace.update({"__builtins__": builtins})
    for index, cell in enumerate(cells):
        if index in skipped:
            continue
        if announce is not None:
            announce(index)
        filename = f"<cell {index}>"
        linecache.cache[filename] = (len(cell["source"]), None, cell["source"].splitlines(True), filename)
        captured, error = _Capture(), None
        _arm(seconds)
        try:
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                exec(compile(cell["source"], filename, "exec"), namespace)
        except CellTimeout:
            _disarm()
            freeze_strays()  # first: what the cell left running takes the CPU from everything else
            error = f"CellTimeout: the cell ran longer than {seconds:.0f} s"
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the run goes on
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        finally:
            _disarm()
            taken.restore()  # a patched builtin must not break the runner itself, nor reach the next cell's checks
        if error and error.startswith("CellTimeout"):  # with os and gpucourse.launch as they were before the cell
            killed, left = kill_strays(FREEZE["keep"])
            if killed:
                error += f" (its {killed} leftover processes were killed" + (f"; {left} still lived when the grader "
                         "gave up waiting, and count against the checks' process limit)" if left else ")")
        if index >= start:
            emit({"type": "cell", "index": index, "output": captured.getvalue(), "error": error})
    return namespace


def run_observer(observer: dict, namespace: dict, seconds: float) -> dict:
    """One check's observer on the cells' namespace: its record (``ok`` and ``data``, or ``error``)."""
    _arm(seconds)
    try:
        scope = {"__name__": "gpucourse_observer", "__builtins__": builtins}
        exec(compile(observer["source"], f"<observer {observer['case']}>", "exec"), scope)
        # a case that draws its inputs gets those the grader drew for this submission, sent only now
        args = (namespace, observer["inputs"]) if "inputs" in observer else (namespace,)
        with contextlib.redirect_stdout(_Capture()), contextlib.redirect_stderr(_Capture()):
            data = scope[observer["function"]](*args)
        record = {"ok": True, "data": json.loads(json.dumps(data))}
    except CellTimeout:
        _disarm()
        record = {"ok": False, "error": f"ran longer than {seconds:.0f} s"}
    except AnswerError as exc:  # "define `choices` (a dict from ...)": the student's words, no exception name
        record = {"ok": False, "answer": True, "error": str(exc)[:500]}
    except BaseException as exc:
        record = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    finally:
        _disarm()
    return record


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor above stderr but ``keep``'s: the supervisor's results, its observers and
    the launcher copy's pipes are not the worker's."""
    try:
        open_fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        import resource

        open_fds = range(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    for fd in open_fds:
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _work(cells: list[dict], cell_seconds: float, observe_seconds: float, start: int, skipped: set[int],
          up_fd: int, down_fd: int, namespace_init: bool = False, zygote_pid: int | None = None,
          launch_settings: dict | None = None) -> None:
    """The worker: the cells, then one check at a time as the supervisor sends them. It holds no
    results channel and no observer until the cells are done, and reports only to the supervisor.
    ``launch_settings``: the job's ``tries`` and ``script_seconds`` for script exercises' launches."""
    if zygote_pid:  # launches go through the supervisor to the clean copy; the copy's own pipes are dropped
        zygote.relay(Channel(write=up_fd), Channel(read=down_fd))
    _close_all_but({up_fd, down_fd})
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    up, down = Channel(write=up_fd), Channel(read=down_fd)
    FREEZE.update(namespace=namespace_init, keep={zygote_pid} if zygote_pid else set())
    become_subreaper()
    signal.signal(signal.SIGALRM, _on_alarm)
    quiet = Quiet()
    # Graded launches: forked from the clean copy, or (no copy) torchrun on the protected rank, on the
    # sources as the job holds them. Installed before the snapshot, so that every cell's restore puts it back;
    # the worker ends with os._exit, inside the block.
    chosen = ddp.LaunchPolicy(launcher=zygote.launch if zygote_pid else rank.torchrun,
                              sources={c["grade_id"]: c["source"] for c in cells if c.get("grade_id")},
                              **(launch_settings or {}))
    with ddp.launch_policy(chosen):
        gate = Gate()
        gate.close()
        while_cells = Snapshot(closed=gate.modules)  # the gate is part of what every cell's restore puts back
        namespace = run_cells(cells, cell_seconds, up.send, while_cells, start, skipped,
                              announce=lambda index: up.send({"type": "start", "index": index}))
        while_cells.restore()
        while_cells.restore_environment()
        gate.open()
        ddp.forget_launches()  # launches are the checks' own, made while they run
        taken = Snapshot()
        up.send({"type": "ready", "problems": quiet.problems(), "tampering": audit.findings()})
        while True:
            message = down.receive()
            if message.get("type") != "observe":
                os._exit(0)
            record = run_observer(message, namespace, observe_seconds)
            taken.restore()  # the student's code ran again: what it patched must not reach the next observer
            taken.restore_environment()
            if not record.get("ok") and str(record.get("error", "")).startswith("ran longer than"):
                kill_strays(FREEZE["keep"])  # a check out of time: what its call started must not run on
            up.send({"type": "observation", "id": message["id"], "record": record, "problems": quiet.problems(),
                     "tampering": audit.findings()})

"""The sandbox's runner and supervisor (autograders/worker/): cells run, timed out and cleaned up after, modules
restored, observers run and timed from outside the worker, and what the supervisor believes of the worker."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from autograders import engine
from conftest import ROOT


def _run_runner(job: dict, user: int | None = None, processes: int | None = None, pid_namespace: bool = False) -> list[dict]:
    """The runner's records up to its "done" (read until then: a process it left behind may hold the pipe open);
    ``user`` and ``processes``: run as that user, with at most that many processes (RLIMIT_NPROC);
    ``pid_namespace``: the supervisor is PID 1 of a PID namespace of its own, as in the sandbox."""
    import resource

    # setpriv, not os.setuid in preexec_fn: the interpreter may live where only root may look (/root/.pyenv),
    # and setpriv finds it before the privileges go
    drop = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user is not None else []
    if pid_namespace:
        drop = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *drop]
    limit = (lambda: resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))) if processes else None
    job = dict(job)
    observers = json.dumps(job.pop("observers", [])).encode()  # on a pipe of their own, as the grader sends them
    read_end, write_end = os.pipe()
    observers_r, observers_w = os.pipe()
    proc = subprocess.Popen([*drop, sys.executable, "-m", "autograders.worker", str(write_end), str(observers_r)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            pass_fds=(write_end, observers_r), preexec_fn=limit,
                            env={**os.environ, "MPLCONFIGDIR": "/tmp"} if user is not None else None)
    os.close(write_end)
    os.close(observers_r)
    # the grader's own writer: closes the pipe when done, and stops when the runner no longer reads
    threading.Thread(target=engine._write_all, args=(observers_w, observers), daemon=True).start()
    proc.communicate(json.dumps(job).encode(), timeout=120)
    records, buffer, deadline = [], b"", time.monotonic() + 30
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while not (records and records[-1]["type"] == "done") and time.monotonic() < deadline:
            if not select.select([pipe], [], [], 1)[0]:
                continue
            chunk = pipe.read(65536)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            records += [json.loads(line) for line in lines if line.strip()]
    return records


def test_runner_runs_cells_restores_modules_and_reports_json():
    observer = "def observe(ns):\n    import os\n    return {'pid_is_real': os.getpid() > 0, 'answer': ns['answer']()}\n"
    records = _run_runner({
        "cells": [{"source": "import os\nos.getpid = lambda: -1\ndef answer():\n    return 42", "grade_id": "x"},
                  {"source": "import sys\nprint('before exit')\nsys.exit(3)", "grade_id": None},
                  {"source": "print('still running')", "grade_id": None}],
        "observers": [{"case": "c1", "source": observer, "function": "observe"},
                      {"case": "c2", "source": "def boom(ns):\n    raise ValueError('no')", "function": "boom"}],
        "cell_seconds": 30, "observe_seconds": 30})
    cells = [r for r in records if r["type"] == "cell"]
    assert [c["error"] is None for c in cells] == [True, False, True]
    assert "before exit" in cells[1]["output"] and "SystemExit" in cells[1]["error"]
    assert cells[2]["output"] == "still running\n"
    observations = {r["case"]: r for r in records if r["type"] == "observation"}
    seen = observations["c1"].pop("seen")  # the supervisor's own measurement (Case.seen)
    assert observations["c1"] == {"type": "observation", "case": "c1", "ok": True, "data": {"pid_is_real": True, "answer": 42}}
    assert set(seen) == {"worker_cpu_s", "worker_user_s"} and 0 <= seen["worker_user_s"] <= seen["worker_cpu_s"] < 1
    assert observations["c2"]["ok"] is False and "ValueError: no" in observations["c2"]["error"]
    assert records[-1] == {"type": "done"}


@pytest.mark.slow  # starts sandbox workers, pools or ranks many times (10-25 s): `make test`, not `make test-fast`
def test_runner_times_out_a_stuck_cell_and_kills_what_it_left(tmp_path):
    """The cell leaves spinning children and orphaned grandchildren, and patches os.kill: at its
    timeout every one of them is killed (runner.kill_strays; the runner is their subreaper)."""
    pids = tmp_path / "pids"
    spin = f"open({str(pids)!r}, 'a').write(f'{{os.getpid()}} ')\n        while True:\n            pass\n"
    stuck = ("import os\nfor _ in range(2):\n    if os.fork() == 0:\n        if os.fork() == 0:\n"
             "            " + spin.replace("\n        ", "\n            ") + "        os._exit(0)\n"
             "for _ in range(2):\n    if os.fork() == 0:\n        " + spin +
             "os.kill = lambda *args: None\nwhile True:\n    pass")
    survivors = (f"import os\nfound = [int(p) for p in open({str(pids)!r}).read().split()]\nalive = []\n"
                 "for pid in found:\n    try:\n        os.kill(pid, 0)\n        alive.append(pid)\n"
                 "    except ProcessLookupError:\n        pass\nprint(len(found), alive)")
    try:
        records = _run_runner({"cells": [{"source": stuck, "grade_id": None}, {"source": survivors, "grade_id": None}],
                               "observers": [], "cell_seconds": 2, "observe_seconds": 5})
    finally:  # were any left, this test stops them
        for pid in map(int, pids.read_text().split() if pids.exists() else []):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert records[0]["error"].startswith("CellTimeout") and "its 4 leftover processes were killed" in records[0]["error"]
    assert records[1]["error"] is None and records[1]["output"] == "4 []\n", records[1]
    assert records[-1]["type"] == "done"


@pytest.mark.slow  # starts sandbox workers, pools or ranks many times (10-25 s): `make test`, not `make test-fast`
def test_after_a_fork_bomb_the_next_cell_can_start_processes():
    """A cell forks until the process limit refuses (every fork-bomb process forking too); at its timeout
    the worker stops them all at once (its supervisor is PID 1 of their PID namespace, as in the sandbox),
    kills them and waits until each is dead and reaped, so the next cell (the checks, in a graded run) can
    start a pool under the same limit. Left to fork while the worker puts modules back, 255 of them take
    the CPU it needs for longer than the supervisor waits, which then stops it from outside instead.
    Run as a user of its own: root ignores the limit."""
    if os.geteuid() != 0:
        pytest.skip("RLIMIT_NPROC binds a user that is not root, and a PID namespace needs root: the test drops to one")
    from autograders import sandbox

    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    pool = ("import multiprocessing\nwith multiprocessing.get_context('fork').Pool(2) as pool:\n"
            "    print(pool.map(abs, [-1, -2, -3]))")
    records = _run_runner({"cells": [{"source": bomb, "grade_id": None}, {"source": pool, "grade_id": None}],
                           "observers": [], "cell_seconds": 3, "observe_seconds": 5},
                          user=sandbox.users(1)[0], processes=256, pid_namespace=True)
    # Stopped by the worker (its leftover processes killed), or, where the bomb took the CPU the worker
    # needed for longer than the supervisor waits, by the supervisor: both kill every process of the
    # bomb, and either way the next cell must start its pool under the same limit.
    stopped = records[0]["error"] or ""
    by_worker = stopped.startswith("CellTimeout: the cell ran longer than 3 s (its ") and "leftover processes were killed)" in stopped
    by_supervisor = stopped.startswith("CellTimeout: the cell ran longer than 3 s and did not stop when interrupted; it was stopped")
    assert by_worker or by_supervisor, records[0]
    assert records[1]["error"] is None and records[1]["output"] == "[1, 2, 3]\n", records[1]


def test_bury_waits_while_the_killed_still_die_and_gives_up_when_none_does(monkeypatch):
    """``runner.bury`` waits as long as fewer processes are left at each look (a fork bomb's hundreds
    take seconds to exit on a busy machine) and returns the living ones once ``idle`` passes with none
    fewer; each look sends the living SIGKILL again, and the spared are left alone."""
    from autograders.worker import runner

    living, signalled = set(range(1000, 1012)), []
    clock = {"t": 0.0}
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(runner.time, "sleep", lambda s: clock.__setitem__("t", clock["t"] + 0.5))
    monkeypatch.setattr(runner, "_reap", lambda: None)
    monkeypatch.setattr(runner.launch, "signal_all", lambda pids, number: signalled.append((set(pids), number)))

    def dying():  # one dies every 1.5 s of the clock (three looks): 18 s for all, beyond any fixed 5 s wait
        return {pid for pid in living if pid - 1000 >= clock["t"] / 1.5} | {7}
    monkeypatch.setattr(runner.launch, "descendants", lambda pid: dying())
    assert runner.bury(lambda: {7}, idle=2.0, most=60.0) == set()
    assert clock["t"] >= 16.5 and all(7 not in pids and number == signal.SIGKILL for pids, number in signalled)

    clock["t"] = 0.0
    monkeypatch.setattr(runner.launch, "descendants", lambda pid: {1000, 1001, 7})  # they never die
    assert runner.bury(lambda: {7}, idle=2.0, most=60.0) == {1000, 1001}
    assert 2.0 < clock["t"] <= 3.0
    clock["t"] = 0.0
    monkeypatch.setattr(runner.launch, "descendants", lambda pid: dying())  # dying, but `most` is 5 s
    left = runner.bury(lambda: {7}, idle=100.0, most=5.0)
    assert 5.0 < clock["t"] <= 5.5 and left == dying() - {7} and len(left) == 8


QUIET_SCRIPT = """
import json, sys, threading, time
from autograders.worker import audit
from autograders.worker.runner import Quiet
audit.install()  # as in the worker: the quiet check asks it for its canary
quiet = Quiet()
looks = []
quiet._sleep = lambda seconds: looks.append(seconds)
alone = (quiet.problems(), len(looks))
cell = {}
exec(compile("def spin(stop):\\n    while not stop.is_set():\\n        time.sleep(0.001)\\n", "<cell 3>", "exec"),
     {"time": time}, cell)
stop = threading.Event()
spinning = threading.Thread(target=cell["spin"], args=(stop,))
spinning.start()
idle = threading.Thread(target=threading.Event().wait, args=(60,), daemon=True)
idle.start()
found = (quiet.problems(), len(looks) - alone[1])
stop.set()
spinning.join()
print(json.dumps({"alone": alone, "found": found, "after": quiet.problems()}))
"""


def test_quiet_looks_at_threads_only_where_another_runs_and_still_finds_one_on_the_cells():
    """Alone in its process the worker's quiet check takes no looks (no other thread can run code of the
    cells); with threads it looks, finds the one running a cell's function, not the idle library one, and
    nothing once that one ended."""
    done = subprocess.run([sys.executable, "-c", QUIET_SCRIPT], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["alone"] == [[], 0]
    problems, looks = result["found"]
    assert problems == ["1 threads were left running code of the cells"] and looks == 5
    assert result["after"] == []


TIMER_SCRIPT = """
import json, signal, time
from autograders.worker import audit
from autograders.worker.runner import Quiet
audit.install()  # as in the worker: the quiet check asks it for its canary
quiet = Quiet()
put_back = quiet._signal
def slow_put_back(number, handler):  # a moment passes after each handler is put back, as under load
    put_back(number, handler)
    time.sleep(0.05)
quiet._signal = slow_put_back
runs = []
for timer, number in ((signal.ITIMER_REAL, signal.SIGALRM), (signal.ITIMER_PROF, signal.SIGPROF)):
    signal.signal(number, lambda *args: None)
    signal.setitimer(timer, 0.001, 0.001)
    end = time.process_time() + 0.05
    while time.process_time() < end:  # the profiling timer counts CPU time
        pass
    runs.append(quiet.problems())
print(json.dumps(runs))
"""


def test_quiet_stops_a_timer_before_putting_its_handler_back():
    """A cell that leaves a 1 ms interval timer with its own handler (SIGALRM's, SIGPROF's): the quiet
    check says so and puts both back, and the process lives on although the default action of those
    signals ends it. Put back in the other order, a tick between the two ended the worker, and with
    it the flag a person needs (a full-tier run lost the adversarial test's 'not quiet' flag so)."""
    done = subprocess.run([sys.executable, "-c", TIMER_SCRIPT], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    for problems, name in zip(json.loads(done.stdout.strip().splitlines()[-1]), ("SIGALRM", "SIGPROF")):
        assert problems == [f"signal handlers were changed: {name}", "an interval timer was left running (signal.setitimer)"]


@pytest.mark.slow  # starts sandbox workers, pools or ranks many times (10-25 s): `make test`, not `make test-fast`
def test_runner_sees_the_cpu_time_the_worker_spent_on_each_observer_from_outside_it():
    """An observer that spins in the worker, and one whose spinning runs in a child process: the
    supervisor's /proc reading of the worker counts the first, in user time too, and not the second."""
    # spins on arithmetic, reading the clock only now and then: a clock read is a system call (system time)
    spin = ("def observe(ns):\n    import time\n    end, x = time.thread_time() + 0.4, 0\n    while time.thread_time() < end:\n"
            "        for i in range(20_000):\n            x = (x * 31 + i) % 1_000_003\n")
    child = ("def observe(ns):\n    import multiprocessing\n    from gpucourse.processes_threads import square_chain\n"
             "    with multiprocessing.get_context('fork').Pool(1) as pool:\n        return pool.map(square_chain, [(1, 3, 30_000)])\n")
    records = _run_runner({"cells": [{"source": "x = 1", "grade_id": None}],
                           "observers": [{"case": "here", "source": spin, "function": "observe"},
                                         {"case": "child", "source": child, "function": "observe"}],
                           "cell_seconds": 30, "observe_seconds": 60})
    seen = {r["case"]: r["seen"] for r in records if r["type"] == "observation"}
    assert seen["here"]["worker_cpu_s"] >= seen["here"]["worker_user_s"] >= 0.35, seen  # 0.4 s, read in clock ticks
    assert seen["child"]["worker_cpu_s"] < 0.2 and seen["child"]["worker_user_s"] < 0.1, seen


def _observe_with_a_fake_worker(answers):
    """``Supervisor.observe`` against a forked child that, per observer, spins ``spin`` s of CPU and answers
    ``claim`` as its data and as a ``seen`` of its own (in its record and beside it); what was emitted."""
    from autograders.worker import supervisor
    from autograders.worker.forking import Channel

    up_r, up_w = os.pipe()
    down_r, down_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            up, down = Channel(write=up_w), Channel(read=down_r)
            for spin, claim in answers:
                ask = down.receive()
                end, x = time.thread_time() + spin, 0
                while time.thread_time() < end:  # arithmetic between clock reads: user time
                    for i in range(20_000):
                        x = (x * 31 + i) % 1_000_003
                forged = {"worker_cpu_s": claim}
                up.send({"type": "observation", "id": ask["id"], "seen": forged, "problems": [],
                         "record": {"ok": True, "data": claim, "seen": forged}})
        finally:
            os._exit(0)
    os.close(up_w)
    os.close(down_r)
    emitted = []
    sup = object.__new__(supervisor.Supervisor)  # only its worker and its observing matter here
    sup.worker = {"pid": pid, "up": Channel(read=up_r), "down": Channel(write=down_w)}
    sup.emit, sup.zygote, sup.pending, sup.flagged, sup.observe_seconds, sup.restarts = emitted.append, None, {}, set(), 30, 0
    try:
        assert sup.observe([{"case": f"c{i}", "source": "", "function": "f"} for i in range(len(answers))])
    finally:
        os.waitpid(pid, 0)
        os.close(up_r)
        os.close(down_w)
    return emitted


def test_supervisor_sets_seen_itself_and_ignores_a_seen_the_worker_sends():
    """The worker spins 0.4 s claiming none, then idles claiming 99 s: what the grader reads is the
    supervisor's reading of the child's CPU time."""
    spins, idles = _observe_with_a_fake_worker([(0.4, 0.0), (0.0, 99.0)])
    assert spins["data"] == 0.0 and spins["seen"]["worker_cpu_s"] >= spins["seen"]["worker_user_s"] >= 0.35, spins
    assert idles["data"] == 99.0 and idles["seen"]["worker_cpu_s"] < 0.2 and idles["seen"]["worker_user_s"] < 0.2, idles
    assert set(spins) == set(idles) == {"type", "case", "ok", "data", "seen"}


def test_supervisor_flags_once_when_it_cannot_read_the_workers_cpu_time(monkeypatch):
    """No reading: ``seen`` is None (a case judged on it fails) and a person is told why, once per run."""
    from autograders.worker import supervisor

    monkeypatch.setattr(supervisor, "cpu_seconds", lambda pid: None)
    emitted = _observe_with_a_fake_worker([(0.0, 1.0), (0.0, 99.0)])
    observations = [e for e in emitted if e["type"] == "observation"]
    flags = [e for e in emitted if e["type"] == "flag"]
    assert [o["seen"] for o in observations] == [None, None] and [o["data"] for o in observations] == [1.0, 99.0]
    assert len(flags) == 1 and "could not be read from /proc" in flags[0]["reason"] and "forgery" not in flags[0]


@pytest.mark.slow  # starts sandbox workers, pools or ranks many times (10-25 s): `make test`, not `make test-fast`
def test_runner_closes_the_checks_to_cells_and_undoes_patches_before_observers():
    patches = ("import torch, gpucourse.tpus_xla, gpucourse.processes_threads\n"
               "torch.Tensor.tolist = lambda self: ['forged']\n"
               "gpucourse.tpus_xla.count_host_reads = None\n"
               "vars(gpucourse.processes_threads)['square'] = lambda x: 'forged'\n"
               "gpucourse.processes_threads.worker_identity.__defaults__ = (99,)\n"
               "import os\nos.environ['PYTHONPATH'] = '/forged'\n")
    observer = ("def observe(ns):\n    import os, torch, gpucourse.tpus_xla\n"
                "    from gpucourse.processes_threads import square, worker_identity\n"
                "    from gpucourse.checks.lesson01_processes_threads import ASSIGNMENT\n"
                "    return {'tolist': torch.zeros(1).tolist(), 'reads': callable(gpucourse.tpus_xla.count_host_reads),\n"
                "            'square': square(3), 'defaults': worker_identity.__defaults__, 'path': os.environ.get('PYTHONPATH'),\n"
                "            'assignment': ASSIGNMENT, 'tolist_in_cell': ns['seen']}\n")
    records = _run_runner({
        "cells": [{"source": patches + "seen = torch.zeros(1).tolist()", "grade_id": "x"},
                  {"source": "import importlib\nimportlib.import_module('gpucourse.checks.' + 'lesson01_processes_threads')",
                   "grade_id": "y"},
                  {"source": "from gpucourse.checks import check\ncheck('parallel_map')", "grade_id": "z"},
                  {"source": "import importlib\nimportlib.import_module('autograders.worker.' + 'runner')", "grade_id": "w"},
                  {"source": "import sys\nprint(sorted(m for m in sys.modules if m.startswith('autograders')))", "grade_id": "v"}],
        "observers": [{"case": "c", "source": observer, "function": "observe"}],
        "cell_seconds": 60, "observe_seconds": 60})
    cells = [r for r in records if r["type"] == "cell"]
    assert cells[0]["error"] is None
    assert cells[1]["error"] == "ImportError: gpucourse.checks.lesson01_processes_threads is not available while grading"
    assert cells[2]["error"] is None and "skipped while grading" in cells[2]["output"]
    assert cells[3]["error"] == "ImportError: autograders is not available while grading"  # the runner itself
    assert cells[4]["error"] is None and cells[4]["output"] == "[]\n"
    observation = next(r for r in records if r["type"] == "observation")
    assert observation["data"] == {"tolist": [0.0], "reads": True, "square": 9, "defaults": [0.02], "path": None,
                                   "assignment": "lesson01_processes_threads", "tolist_in_cell": ["forged"]}

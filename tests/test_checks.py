"""gpucourse.checks (the notebooks' check()), its sandbox runner, and autograders/assemble.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from autograders import assemble, engine
from conftest import AUTOGRADERS, COURSE, ROOT, SOLUTIONS, execute_notebook, nbgrader_meta, notebooks, read
from gpucourse import checks
from gpucourse.checks import ddp


def _parallel_map(fn, items, kind, workers=None):
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    if kind not in ("cpu", "io"):
        raise ValueError(kind)
    with {"cpu": ProcessPoolExecutor, "io": ThreadPoolExecutor}[kind](workers) as pool:
        return list(pool.map(fn, items))


def test_check_passes_and_prints(capsys):
    checks.check("parallel_map", {"parallel_map": _parallel_map})
    out = capsys.readouterr().out
    assert "✓ kind='cpu' runs in other processes" in out and "all 3 public checks passed" in out


def test_check_fails_with_every_reason(capsys):
    def threads_only(fn, items, kind, workers=None):
        return [fn(x) for x in items]

    with pytest.raises(checks.CheckFailed, match="1 of 3 public checks failed") as failure:
        checks.check("parallel_map", {"parallel_map": threads_only})
    assert isinstance(failure.value, AssertionError)  # plain Python and pytest see a failed assertion
    assert "\n" not in str(failure.value), "one summary line: the reasons are the ✗ lines above it"
    assert "use processes for GIL-bound work" in failure.value.failures[0]
    out = capsys.readouterr().out
    assert "✗ kind='cpu' runs in other processes: ran in this process: use processes for GIL-bound work" in out


def test_check_reports_a_missing_answer_and_unknown_exercises(capsys):
    with pytest.raises(checks.CheckFailed):
        checks.check("choose_tools", {})
    out = capsys.readouterr().out
    assert "✗ one known tool for each of a-f: not answered yet: define `choices` (a dict from each workload key" in out
    assert "KeyError" not in out and "raised" not in out
    with pytest.raises(KeyError, match="known: "):
        checks.check("no_such_exercise", {})


def _all_exercises() -> dict[str, tuple[checks.Answer, ...]]:
    checks.public_cases("parallel_map")  # imports every lesson's module
    return checks.ANSWERS


def test_every_exercise_declares_its_answers():
    declared = _all_exercises()
    assert set(declared) == set(checks.PUBLIC), f"exercises without declared answers: {set(checks.PUBLIC) - set(declared)}"
    names = [a.name for answers in declared.values() for a in answers]
    assert len(names) == len(set(names)), "an answer's name must be unique across the course (answer() looks it up)"
    for answers in declared.values():
        assert answers and all(a.type in checks.TYPES and a.describes for a in answers)


def _exercise_cells(nb) -> list[tuple[str, str, str]]:
    """(exercise, its text, its stub) for every check cell of a released notebook: the stub is the answer
    cell above the check cell, the text every markdown cell between the previous check cell and the stub."""
    found, start = [], 0
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            exercise = cell.source.split('check("')[1].split('"')[0]
            above = nb.cells[start:index]
            stubs = [c for c in above if c.cell_type == "code" and c.get("metadata", {}).get("nbgrader", {}).get("solution")]
            text = "\n".join(c.source for c in above if c.cell_type == "markdown")
            found.append((exercise, text, stubs[-1].source if stubs else ""))
            start = index + 1
    return found


def test_answers_are_named_in_every_released_exercise_text_and_stub():
    declared = _all_exercises()
    seen = set()
    for path in sorted(COURSE.glob("*/*.ipynb")):
        for exercise, text, stub in _exercise_cells(read(path)):
            seen.add(exercise)
            assert exercise in declared, f"{path.name}: check({exercise!r}) has no declared answers"
            for answer in declared[exercise]:
                where = f"{path.parent.name}, exercise {exercise!r}"
                assert answer.line() in text, f"{where}: the exercise text must say: {answer.line()}"
                assert f"# The grader reads {answer.line()}" in stub, f"{where}: the stub must say: {answer.line()}"
    assert seen == set(declared), f"declared but never checked in a notebook: {set(declared) - seen}"


def test_a_wrong_type_says_what_it_must_be(capsys):
    with pytest.raises(checks.CheckFailed):
        checks.check("choose_tools", {"choices": [("a", "threads")]})
    assert "`choices` must be a dict; got list" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed):
        checks.check("sync_lines", {"sync_lines": "4, 6"})
    assert "`sync_lines` must be a set; got str" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed):
        checks.check("q3", {"q3": 2})
    assert "`q3` must be a str; got int" in capsys.readouterr().out


def test_every_check_public_and_hidden_says_what_to_define():
    """On an empty notebook every case, public or hidden, of every assignment asks for its answer by name."""
    from autograders import engine

    _all_exercises()
    for path in sorted(AUTOGRADERS.glob("checks/*.py")):
        hidden = engine.load_checks(path.stem)
        for test, exercise in engine.exercise_of_test(path.stem).items():
            names = [a.name for a in checks.ANSWERS[exercise]]
            for case_id, case in engine.cases_for(hidden, exercise):
                message = checks.run_case(case, {})
                assert message and any(f"define `{name}` (" in message for name in names), (path.stem, case_id, message)
                assert "KeyError" not in message and "raised" not in message, (path.stem, case_id, message)


@pytest.mark.slow  # starts sandbox workers, pools or ranks many times (10-25 s): `make test`, not `make test-fast`
def test_the_grader_reports_a_missing_answer_in_the_same_words():
    from autograders import engine

    observer = "def observe(ns):\n    from gpucourse.checks import answer\n    return answer(ns, 'choices')\n"
    records = _run_runner({"cells": [{"source": "chioces = {}", "grade_id": "choose_tools"}],
                           "observers": [{"case": "c", "source": observer, "function": "observe"}],
                           "cell_seconds": 30, "observe_seconds": 30})
    observation = next(r for r in records if r["type"] == "observation")
    case = checks.public_cases("choose_tools")[0]
    expected = checks.declared("choices").missing()
    assert observation["answer"] is True and engine._judge(case, observation) == expected
    assert engine._judge(case, {"ok": False, "error": "KeyError: 'x'"}) == "raised KeyError: 'x'"


def test_a_failed_check_is_one_error_line_in_a_kernel_and_still_fails_the_cell(tmp_path):
    """In Jupyter a failed check ends the cell with an error output (what Validate and autograding count)
    whose traceback is one line, with no path into the package."""
    import nbformat
    from nbgrader.utils import determine_grade

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('from gpucourse.checks import check\ncheck("choose_tools")')
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": "test_choose_tools",
                                 "points": 2, "schema_version": 3, "task": False}
    nb.cells = [cell]
    execute_notebook(nb, tmp_path, timeout=120, allow_errors=True)
    errors = [o for o in cell.outputs if o["output_type"] == "error"]
    printed = "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")
    assert "✗ one known tool for each of a-f: not answered yet: define `choices` (" in printed
    assert len(errors) == 1 and errors[0]["ename"] == "CheckFailed", cell.outputs
    assert len(errors[0]["traceback"]) == 1 and "1 of 1 public checks failed" in errors[0]["traceback"][0]
    assert not any(s in line for line in errors[0]["traceback"] for s in ("gpucourse", ".py", "File ", "Traceback"))
    assert determine_grade(cell, None) == (0, 2.0), "nbgrader must score the failed test cell 0"


def test_only_plain_data_crosses():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    with pytest.raises(TypeError):
        checks.as_data([AlwaysEqual()])
    assert checks.as_data({"a": [1, 2.5, "x", None]}) == {"a": [1, 2.5, "x", None]}


def test_script_exercise_is_not_launched_without_its_functions():
    result = ddp.run_exercise_script({}, "average_across_ranks")
    assert result["returncode"] == "not run" and "shard_indices" in result["tail"]


def test_script_exercise_is_not_launched_while_unanswered():
    placeholder = "def average_gradients(model):\n    \"\"\"doc\"\"\"\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
    ns = {"average_gradients": lambda model: None}
    with ddp.launch_policy(ddp.LaunchPolicy(sources={"average_gradients": placeholder})):
        result = ddp.run_exercise_script(ns, "average_gradients")
    assert result == {"returncode": "not run", "ranks": {}, "tail": "not answered yet: average_gradients"}
    answered = placeholder.replace("raise NotImplementedError()", "if model is None:\n        raise NotImplementedError()")
    assert ddp.unanswered(answered, ["average_gradients"]) == []


def test_first_raised_names_a_ranks_own_error_before_a_lost_peer():
    lost = "RuntimeError: [../gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:1952"
    ranks = {"0": {"runs": [{"weights": []}, {"error": lost}]},
             "1": {"runs": [{"weights": []}, {"error": "ValueError: mine"}]},
             "2": {"runs": [{"weights": []}]}}
    assert ddp.first_raised(ranks, 3) == (1, "1", "ValueError: mine")
    assert ddp.first_raised({"0": ranks["0"], "2": ranks["2"]}, 3) == (1, "0", lost)  # no rank's own: the lost peer's
    assert ddp.first_raised({"0": {"runs": [{}, {}]}, "1": {"runs": "forged"}, "2": {}}, 2) is None


@pytest.mark.slow  # starts sandbox workers, pools or ranks many times (10-25 s): `make test`, not `make test-fast`
def test_a_rank_that_raises_releases_its_peers_from_the_collective_they_wait_in(tmp_path):
    """Rank 1's answer raises where rank 0's is inside an all-reduce: ``ddp.settle`` on rank 1 leaves the
    group, and rank 0's all-reduce fails with gloo's lost peer, not at the collective timeout (set here to
    600 s, beyond the launch's own 240 s); then both stop, and both still report."""
    from gpucourse import launch

    script = tmp_path / "ranks.py"
    script.write_text(
        "import json, sys, torch, torch.distributed as dist\n"
        "from gpucourse.checks.ddp import leave, settle\n"
        "from gpucourse.checks.ddp_harness import init_process_group\n"
        "init_process_group(device='cpu')\n"
        "rank, runs = dist.get_rank(), []\n"
        "for run in range(3):\n"
        "    record = {}\n"
        "    try:\n"
        "        if rank == 1 and run == 1:\n"
        "            raise ValueError('only on rank 1')\n"
        "        dist.all_reduce(torch.ones(3))\n"
        "    except Exception as error:\n"
        "        record['error'] = f'{type(error).__name__}: {error}'[:200]\n"
        "    runs.append(record)\n"
        "    if not settle('error' in record):\n"
        "        break\n"
        "leave()\n"
        "open(sys.argv[1] + f'/rank{rank}.json', 'w').write(json.dumps({'runs': runs}))\n")
    done = launch.torchrun([str(script), str(tmp_path)], nproc=2, timeout=240,
                           env={**os.environ, "GPUCOURSE_COLLECTIVE_SECONDS": "600"})
    assert done.returncode == 0 and not done.timed_out, done.output[-2000:]
    ranks = {str(r): json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert [len(ranks[r]["runs"]) for r in "01"] == [2, 2]
    assert any(words in ranks["0"]["runs"][1]["error"] for words in ddp.LOST_PEER), ranks
    assert ddp.first_raised(ranks, 3) == (1, "1", "ValueError: only on rank 1")


def test_script_source_comes_from_the_notebook_cells_that_define_it():
    cell = "import torch\n\nclass Model:\n    pass\n\ndef make_trainer(n):\n    return n\n"
    ns = {"In": ["", "x = 1", cell.replace("return n", "return 0"), cell, "check('x')"], "Model": object,
          "make_trainer": print}
    source = ddp.exercise_source(ns, "synced", ["Model", "make_trainer"])
    assert source == ddp.HEADER + cell  # the latest cell defining both, once, with its imports


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
    assert set(seen) == {"worker_cpu_s"} and 0 <= seen["worker_cpu_s"] < 1
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


@pytest.mark.slow  # starts sandbox workers, pools or ranks many times (10-25 s): `make test`, not `make test-fast`
def test_runner_sees_the_cpu_time_the_worker_spent_on_each_observer_from_outside_it():
    """An observer that spins in the worker, and one whose spinning runs in a child process: the
    supervisor's /proc reading of the worker counts the first and not the second."""
    spin = "def observe(ns):\n    import time\n    end = time.thread_time() + 0.4\n    while time.thread_time() < end:\n        pass\n"
    child = ("def observe(ns):\n    import multiprocessing\n    from gpucourse.processes_threads import square_chain\n"
             "    with multiprocessing.get_context('fork').Pool(1) as pool:\n        return pool.map(square_chain, [(1, 3, 30_000)])\n")
    records = _run_runner({"cells": [{"source": "x = 1", "grade_id": None}],
                           "observers": [{"case": "here", "source": spin, "function": "observe"},
                                         {"case": "child", "source": child, "function": "observe"}],
                           "cell_seconds": 30, "observe_seconds": 60})
    seen = {r["case"]: r["seen"]["worker_cpu_s"] for r in records if r["type"] == "observation"}
    assert seen["here"] >= 0.35, seen  # 0.4 s, read in clock ticks
    assert seen["child"] < 0.2, seen


def test_lesson01_trapdoor_gives_each_square_chain_and_the_judge_wants_the_work_done_elsewhere():
    """The grader's primes multiply to the public modulus; through them it finds the end of any chain (as
    doing the squarings does); the CPU-time judge fails results that skip fn, and work seen in the caller."""
    import random

    from gpucourse.processes_threads import MODULUS, square_chain

    from autograders.checks.lesson01_processes_threads import parallel_map as hidden  # the time-lock puzzle
    p, q = hidden._PRIME_P, hidden._PRIME_Q
    assert p * q == MODULUS and 1 < p < MODULUS and p != q
    for base, squarings in ((2, 0), (MODULUS - 2, 1), (p, 5), (3 ** 900 % MODULUS, 3_000)):
        assert hidden.reference_square_chain(base, squarings) == square_chain((None, base, squarings))[1]
    drawn = hidden.draw_cpu_time(random.Random(1))
    items = checks.values.rebuild(drawn["items"])
    done = checks.values.describe([(x, hidden.reference_square_chain(b, s)) for x, b, s in items])
    skipped = checks.values.describe([(x, b) for x, b, _ in items])
    work = hidden._squaring_seconds(sum(s for _, _, s in items))  # what the judge measures too
    assert hidden.judge_cpu_time(done, drawn, {"worker_cpu_s": work / 10}) is None
    assert "fn was not run on every item" in hidden.judge_cpu_time(skipped, drawn, {"worker_cpu_s": 0.0})
    assert "in the order of items" in hidden.judge_cpu_time(done[::-1], drawn, {"worker_cpu_s": 0.0})
    assert "ran fn in this process" in hidden.judge_cpu_time(done, drawn, {"worker_cpu_s": work})


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
                end = time.thread_time() + spin
                while time.thread_time() < end:
                    pass
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
    assert spins["data"] == 0.0 and spins["seen"]["worker_cpu_s"] >= 0.35, spins
    assert idles["data"] == 99.0 and idles["seen"]["worker_cpu_s"] < 0.2, idles
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


ATTACKS = {  # an answer's code -> the forgery reason the scan must give
    "from gpucourse.checks.lesson10_beyond_one_machine import lightning_slurm_ranks as slurm_ranks":
        "imports the checks' `gpucourse.checks.lesson10_beyond_one_machine`",
    "import gpucourse.checks": "imports the checks' `gpucourse.checks`",
    "from gpucourse import checks": "imports the checks' `gpucourse.checks`",
    "from gpucourse.checks import check as c": "imports the checks' `gpucourse.checks` (check)",
    "from gpucourse.checks import check, answer": "imports the checks' `gpucourse.checks` (check, answer)",
    "from gpucourse.checks import check\ncheck.__globals__['PUBLIC']": "reaches the checks' `gpucourse.checks.check.__globals__",
    "import gpucourse\nc = getattr(gpucourse, 'checks')": "reaches the checks' `gpucourse.checks`",
    "import importlib\nimportlib.import_module('gpucourse.checks.' + 'lesson01_processes_threads')":
        "gpucourse.checks.lesson01_processes_threads",
    "__import__(f'gpucourse.checks.lesson01_processes_threads')": "names the checks' `gpucourse.checks.lesson01_processes_threads`",
    "import sys\nsys.modules['gpucourse.checks.lesson10_beyond_one_machine'].x = 1": "gpucourse.checks.lesson10_beyond_one_machine",
    "import engine": "imports the grader's `engine`",
    "from autograders import assemble": "imports the grader's `autograders`",
    "from autograders.worker import runner": "imports the grader's `autograders.worker`",
    "import zygote": "imports the grader's `zygote`",  # every grader module by its bare name, found, not listed
    "import importlib\nimportlib.import_module('supervisor')": "the grader's `supervisor`",
    "from nbgrader.preprocessors import ClearSolutions": "imports the grader's `nbgrader.preprocessors`",
    "import gpucourse.processes_threads\ngpucourse.processes_threads.worker_identity = print":
        "patches `gpucourse.processes_threads.worker_identity`",
    "import gpucourse.processes_threads as p\nsetattr(p, 'square', print)": "patches `gpucourse.processes_threads.square`",
    "from gpucourse import tpus_xla\nm = tpus_xla\nm.count_host_reads = None": "patches `gpucourse.tpus_xla.count_host_reads`",
    "import gpucourse.tpus_xla\ndel gpucourse.tpus_xla.count_host_reads": "patches `gpucourse.tpus_xla.count_host_reads`",
    "import gpucourse.tpus_xla as x\nx.__dict__['count_host_reads'] = None": "patches `gpucourse.tpus_xla.__dict__[...]`",
    "import gpucourse.tpus_xla\nvars(gpucourse.tpus_xla).update(count_host_reads=None)": "patches `gpucourse.tpus_xla.__dict__[...]`",
    "import torch\ntorch.Tensor.tolist = lambda self: [1]": "patches `torch.Tensor.tolist`",
    "from torch import Tensor as T\nT.__int__ = int": "patches `torch.Tensor.__int__`",
    "import torch\nt = torch.zeros(1)\ntype(t).item = None": "patches `type(t).item`",
    "import torch\nt = torch.zeros(1)\nt.__class__.item = None": "patches `type(t).item`",
    "import torch.nn as nn\nnn.Module.__call__ = print": "patches `torch.nn.Module.__call__`",
    "from torch.utils.data import DataLoader\nDataLoader.__iter__ = iter": "patches `torch.utils.data.DataLoader.__iter__`",
    "import lightning.pytorch as pl\npl.Trainer.fit = print": "patches `lightning.pytorch.Trainer.fit`",
    "import numpy as np\nnp.allclose = lambda *a, **k: True": "patches `numpy.allclose`",
    "import os\nos.getpid = lambda: 1": "patches `os.getpid`",
    "import os\nfor m in (os,):\n    m.getpid = lambda: 1": "patches `os.getpid`",  # a loop's name bound to a module
    "import os\ndef f():\n    for m in [os]:\n        setattr(m, 'getpid', int)\nf()": "patches `os.getpid`",
    "import os, sys\n[setattr(m, 'getpid', int) for m in (sys, os)]": "patches `sys.getpid`",
    "import json\njson.dumps += ''": "patches `json.dumps`",
    "import builtins\nbuiltins.isinstance = lambda *a: True": "patches `builtins.isinstance`",
    "import sys, types\nsys.modules['darts'] = types.ModuleType('darts')": "patches `sys.modules[...]`",
    "import sys\nsys.meta_path.insert(0, None)": "patches `sys.meta_path[...]`",
    "def f():\n    pass\nf.__code__ = (lambda: 1).__code__": "rewrites a function's __code__",
    "open('/srv/course/autograders/checks/lesson01_processes_threads.py').read()": "reads the grader's or the solutions' files",
    "open('../solutions/lesson01/processes_threads.ipynb')": "reads the grader's or the solutions' files",
}


@pytest.mark.parametrize("code", list(ATTACKS))
def test_scan_calls_each_route_forgery(code):
    forgery, flags = assemble.scan({"answer": code})
    assert any(ATTACKS[code] in reason for reason in forgery), forgery
    assert all(reason in flags for reason in forgery)


@pytest.mark.parametrize("code", [
    "from gpucourse.checks import check\ncheck('parallel_map')",
    "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.benchmark = True",
    "import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\ndel os.environ['CUDA_VISIBLE_DEVICES']",
    "import sys\nsys.path.insert(0, '.')",
    "import torch\nclass Net(torch.nn.Module):\n    count = 0\n    def __init__(self):\n        super().__init__()\n"
    "        type(self).count += 1\n        self.layer = torch.nn.Linear(2, 2)\nNet.extra = 1\nx = torch.zeros(2)\nx[0] = 1",
    "import matplotlib.pyplot as plt\nplt.rcParams['figure.figsize'] = (4, 3)",
    "import os\nfor m in (1, 2):\n    m = m + 1\nfor p in [os.getcwd()]:\n    p = p + '/x'\nprint([n.upper() for n in ('a', os.sep)])",
    # words that are also names of grader modules, used as data, and every script's __main__
    "record = {'rank': 0, 'worker': 1}\nprint('grade', 'course', 'checks', 'trust')\nif __name__ == '__main__':\n    pass",
])
def test_scan_allows_what_lessons_teach(code):
    assert assemble.scan({"answer": code}) == ([], [])


@pytest.mark.slow  # starts sandbox workers, pools or ranks many times (10-25 s): `make test`, not `make test-fast`
def test_scans_in_threads_at_once_never_fail():
    """The pool grades submissions in threads, each scanned with ast.parse: on CPython before 3.11.8 two
    parses at once fail ("SystemError: AST constructor recursion depth mismatch", python/cpython#106905)
    whenever a collection runs Python finalizers in the middle of one, as here; ``assemble`` parses one at a time."""
    import gc
    import threading

    answer = "\n".join(f"def f{i}(x):\n    return [y for y in range(x) if y % {i + 1}]" for i in range(300))
    errors = []

    class Cycle:
        def __del__(self):  # Python code run by the collector, wherever a thread happens to be
            sum(range(100))

    def grade_some():
        for _ in range(30):
            junk = [Cycle() for _ in range(50)]
            for item in junk:
                item.me = item
            del junk
            try:
                assert assemble.scan({"answer": answer}) == ([], [])
            except SystemError as error:
                errors.append(str(error))

    threshold = gc.get_threshold()
    gc.set_threshold(50)
    try:
        threads = [threading.Thread(target=grade_some) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*threshold)
    assert not errors, errors[:3]


def test_scan_follows_python_scoping_of_imported_names():
    context = ["import gpucourse.tpus_xla as X\nimport torch"]  # a released cell's imports

    def forgery(code):
        return assemble.scan({"answer": code}, context)[0]

    for own in ["X = torch.randn(3)\nX[0] = 1", "def f(X):\n    X[0] = 1", "def f():\n    X = {}\n    X['a'] = 1",
                "class A:\n    X = {}\n    X['a'] = 1"]:
        assert forgery(own) == [], own
    for patch in ["X.count_host_reads = None\nX = 0", "if False:\n    X = 0\nX.count_host_reads = None",
                  "def f():\n    X.count_host_reads = None", "def f():\n    global X\n    X = 0\n    X.count_host_reads = None",
                  "X = 0\nfor i in range(2):\n    X.count_host_reads = None\n    X = gpucourse_xla = __import__('gpucourse.tpus_xla')"]:
        assert forgery(patch), patch


def test_the_scan_looks_at_each_scope_once(monkeypatch):
    """What each scope binds is computed once per scan, however many nodes and imported names ask:
    computed at every ask, the scan grew with nodes x names x scope size (lesson 13's solution took 11.6 s,
    now 0.02 s: the grader scans every submission)."""
    import collections

    calls = collections.Counter()
    real = assemble._bindings

    def counted(scope, aliases):
        calls[id(scope)] += 1
        return real(scope, aliases)

    monkeypatch.setattr(assemble, "_bindings", counted)
    nb = read(SOLUTIONS / "lesson13_sharded_data_parallel" / "sharded_data_parallel.ipynb")
    answers = {nbgrader_meta(c)["grade_id"]: c.source for c in nb.cells if nbgrader_meta(c).get("solution") and c.cell_type == "code"}
    assert assemble.scan(answers) == ([], [])
    assert calls and max(calls.values()) == 1, calls.most_common(3)


def test_no_solution_or_right_fixture_is_flagged():
    """Every answer cell of the solutions (with the imports of their other cells) and every right fixture."""
    flagged = []
    for path in notebooks(SOLUTIONS):
        nb = read(path)
        answers = {nbgrader_meta(c)["grade_id"]: c.source for c in nb.cells
                   if nbgrader_meta(c).get("solution") and c.cell_type == "code"}
        context = [c.source for c in nb.cells if c.cell_type == "code" and not nbgrader_meta(c).get("solution")]
        flagged += [f"{path.name}: {f}" for f in assemble.scan(answers, context)[1]]
    for path in sorted((ROOT / "tests" / "fixtures").glob("*/right/*.py")):
        flagged += [f"{path.name}: {f}" for f in assemble.scan({path.stem: path.read_text()})[1]]
    assert not flagged, "\n".join(flagged)


def _released() -> dict:
    return json.loads((COURSE / "lesson01_processes_threads" / "processes_threads.ipynb").read_text())


def test_plan_takes_only_answers_from_the_submission():
    released = _released()
    submission = json.loads(json.dumps(released))
    for cell in submission["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("grade_id") == "choose_tools":
            cell["source"] = "choices = {}"
        elif meta.get("grade_id") == "test_choose_tools":
            cell["source"] = "pass"
    plan = assemble.plan(released, submission)
    assert plan.answers["choose_tools"] == "choices = {}"
    assert not any("check(" in c["source"] for c in plan.cells), "test cells are never run"
    assert not any(c["source"].startswith("demo") for c in plan.cells)
    assert "locked cell test_choose_tools: changed (the released one was used)" in plan.flags


def test_plan_skips_measurements_and_keeps_scaffolding():
    released = _released()
    plan = assemble.plan(released, json.loads(json.dumps(released)))
    skipped = [c for c in released["cells"] if assemble.SKIP_TAG in c["metadata"].get("tags", [])]
    assert skipped and not any(c["source"] == "".join(s["source"]) for c in plan.cells for s in skipped)
    assert any("S = setup(seed=0)" in c["source"] for c in plan.cells)
    assert plan.flags == []


def test_no_cell_after_the_last_graded_one_runs_when_grading():
    """Grading runs every code cell up to the checks, each submission again: a measurement after the last
    answer and check (lesson 4's timings took 50-140 s there, eight lesson 4 submissions in the class) is
    work no check reads, so it carries the skip-when-grading tag."""
    untagged = []
    for path in notebooks(SOLUTIONS):
        cells = read(path).cells
        graded = [i for i, c in enumerate(cells) if nbgrader_meta(c).get("solution") or nbgrader_meta(c).get("grade")]
        untagged += [f"{path.parent.name} cell {i}" for i, c in enumerate(cells)
                     if graded and i > graded[-1] and c.cell_type == "code"
                     and assemble.SKIP_TAG not in c.metadata.get("tags", [])]
    assert not untagged, f"tag these {assemble.SKIP_TAG!r}: {untagged}"


@pytest.mark.parametrize("content, reason", [
    (b"{not json", "not valid JSON"),
    (b'{"x": "\xff"}', "not UTF-8"),
    (b'{"nbformat": 3, "cells": []}', "not an nbformat 4 notebook"),
])
def test_unreadable_submissions_are_reasons_not_crashes(tmp_path, content, reason):
    path = tmp_path / "nb.ipynb"
    path.write_bytes(content)
    nb, flags = assemble.read_submission(path)
    assert nb is None and reason in flags[0]
    plan = assemble.plan(_released(), nb, flags)
    assert not plan.readable and all(v is None for v in plan.answers.values())


def test_symlinks_are_not_followed(tmp_path):
    target = tmp_path / "real.ipynb"
    target.write_text(json.dumps(_released()))
    (tmp_path / "link.ipynb").symlink_to(target)
    nb, flags = assemble.read_submission(tmp_path / "link.ipynb")
    assert nb is None and "symlink" in flags[0]


def test_one_declaration_per_exercise_drives_notebooks_hidden_checks_and_readme():
    """register() is the one place an exercise is declared: its notebook has the answer cell and a test
    cell with the declared points, its hidden cases join it by name, the README's table is written from it."""
    from autograders import engine
    from autograders import release

    for source in notebooks(SOLUTIONS):
        assignment = source.parent.name
        declared = {e.name: e for e in checks.exercises(assignment)}
        nb = read(source)
        answers = [nbgrader_meta(c)["grade_id"] for c in nb.cells if nbgrader_meta(c).get("solution") and c.cell_type == "code"]
        tests = {nbgrader_meta(c)["grade_id"]: nbgrader_meta(c)["points"] for c in nb.cells
                 if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")}
        assert sorted(answers) == sorted(declared), f"{assignment}: answer cells {answers}, declared {list(declared)}"
        assert tests == {e.test_id: e.points for e in declared.values()}, f"{assignment}: test cells and points"
        assert set(engine.load_checks(assignment).HIDDEN) <= set(declared)
    readme = (ROOT / "README.md").read_text()
    assert release.TABLE_START + "\n" + checks.exercise_table() + "\n" + release.TABLE_END in readme, \
        "README.md's table of exercises is stale: run make release"


# --- every fixture judged in this process: its exercise's public and hidden cases, as the grader judges them

def _fixture_params():
    from autograders import classroom

    return [pytest.param(kind, exercise, path, id=f"{assignment}/{kind}/{path.stem}")
            for assignment, kind, exercise, path in classroom.fixtures()]


def grading_seed() -> int:
    """The seed of the drawn inputs in an in-process judgement: GPUCOURSE_TEST_SEED (conftest.py fixes one,
    so that a run is reproducible), or with GPUCOURSE_TEST_SEED=random a new one each time, as in grading (a
    failure names the seed it drew, to draw the same inputs again)."""
    import secrets

    given = os.environ.get("GPUCOURSE_TEST_SEED", "random")
    return secrets.randbits(63) if given == "random" else int(given)


def judge_answer(exercise: str, source: str, filename: str = "<answer>", until: str | None = None) -> list[str]:
    """The ✗ lines the grader's judges give an answer cell ``source`` of ``exercise`` (observed here, not
    in the sandbox: quick enough for one lesson's fixtures, ``-k lesson04``). ``filename``: a file that
    holds ``source``, for code that reads its own source (Triton's ``@jit``). ``until``: stop at the first
    ✗ line that holds it (a wrong fixture's intended reason: the cases after it cannot change the verdict)."""
    from autograders import engine

    assignment = checks.EXERCISES[exercise].assignment if exercise in checks.EXERCISES else None
    hidden = engine.load_checks(assignment or next(e.assignment for e in checks.exercises() if e.name == exercise))
    import types

    # as in the runner (and a kernel), the namespace is a real __main__ module: its classes pickle
    main = types.ModuleType("__main__")
    ns = main.__dict__
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = main
    try:  # the source passed in as the grader's worker passes it: its launch policy, launcher kept
        with ddp.launch_policy(dataclasses.replace(ddp.policy(), sources={exercise: source})):
            return _judge_in(ns, hidden, exercise, source, filename, until)
    finally:
        sys.modules["__main__"] = saved


def _judge_in(ns, hidden, exercise, source, filename, until=None):
    from autograders import engine

    try:
        exec(compile(source, filename, "exec"), ns)
    except Exception as error:  # an answer cell that raises still gets every case's verdict
        print(f"the answer cell raised {type(error).__name__}: {error}")
    failures = []
    named = engine.cases_for(hidden, exercise)
    seed = grading_seed()
    inputs = engine.draw_inputs(seed, named)
    for case_id, case in named:
        try:  # ``seen`` as the grader's supervisor measures it, here in this process (Case.observe_seen)
            data, seen = case.observe_seen(ns, inputs.get(case_id))
            observation = {"ok": True, "data": checks.as_data(data), "seen": seen}
        except checks.AnswerError as error:
            observation = {"ok": False, "answer": True, "error": str(error)}
        except Exception as error:
            observation = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        verdict = engine._judge(case, observation, inputs.get(case_id))
        if verdict is not None:
            failures.append(f"✗ {case.name}: {verdict} [inputs drawn from seed {seed}: GPUCOURSE_TEST_SEED={seed} draws them again]")
            if until is not None and until in failures[-1]:
                break
    return failures


@pytest.mark.parametrize("kind, exercise, path", _fixture_params())
def test_fixture_judged_in_process_as_its_first_line_says(kind, exercise, path, request):
    """A wrong fixture fails with a ✗ line holding its first line's reason, a right one passes every case.
    A multi-process exercise's launches are forked as in grading (conftest's ``forked_launches``)."""
    from autograders import classroom

    checks.exercises()
    if isinstance(checks.EXERCISES[exercise].kind, checks.Script):
        request.getfixturevalue("forked_launches")
    reason = None if kind == "right" else classroom.intended(path)[1]
    failures = judge_answer(exercise, path.read_text(), str(path), until=reason)
    if kind == "right":
        assert not failures, failures
    else:
        assert any(reason in line for line in failures), f"no ✗ line with {reason!r}; got {failures}"


def _global_names(code) -> set[str]:
    """The global names a function's code (and the code nested in it) reads."""
    import dis

    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            names |= _global_names(const)
    return names


def test_every_observer_is_self_contained():
    """The grader sends an observer's own source into the sandbox: every global name it reads must be a
    builtin (its imports are inside it), never a name of the module it is written in."""
    import builtins
    import inspect

    from autograders import engine

    leaks = []
    for exercise in checks.exercises():
        hidden = engine.load_checks(exercise.assignment)
        for case_id, case in engine.cases_for(hidden, exercise.name):
            source = inspect.getsource(case.observe)
            if not source.lstrip().startswith("def "):
                leaks.append(f"{case_id}: its observer is not a def")
                continue
            code = compile(inspect.cleandoc(source) if source[:1].isspace() else source, "<observer>", "exec")
            function = next(c for c in code.co_consts if hasattr(c, "co_code"))
            outside = sorted(n for n in _global_names(function) if not hasattr(builtins, n))
            if outside:
                leaks.append(f"{case_id} ({case.observe.__name__}): reads {outside}")
    assert not leaks, "\n".join(leaks)


def test_judges_rebuild_seeded_models_one_thread_at_a_time():
    """The grader judges in threads; a judge that seeds torch's global generator gets its own draws."""
    import threading

    import torch

    from gpucourse.checks.seeded import global_rng

    def draws(seed):
        with global_rng(seed):
            return [torch.nn.Linear(64, 64).weight.sum().item() for _ in range(20)]

    alone = {seed: draws(seed) for seed in range(4)}
    together = {}
    threads = [threading.Thread(target=lambda s=seed: together.__setitem__(s, draws(s))) for seed in range(4) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
    before = torch.random.get_rng_state()
    draws(0)
    assert torch.equal(torch.random.get_rng_state(), before), "the global state is put back"

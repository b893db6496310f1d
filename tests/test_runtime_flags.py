"""The runner as the grader runs it (``python -m autograders.worker``), without a sandbox: honest code that
leaves threads and processes behind is observed and flagged for nothing; what only tampering does is
flagged at run time with its cell and line (``autograders.worker.audit``), and never zeroes a score;
a worker that runs the cells' code in a thread after them is given a second run, then a flag for a person.
"""

from __future__ import annotations

import pytest

from autograders.classroom import HONEST
from test_runner import _run_runner

pytestmark = pytest.mark.slow  # each run starts the runner and imports torch: seconds each

OBSERVER = {"case": "c1", "source": "def observe(ns):\n    return ns['answer']()\n", "function": "observe"}


def _run(*sources: str) -> tuple[list[dict], list[str], list[dict]]:
    records = _run_runner({"cells": [{"source": s, "grade_id": f"cell{i}"} for i, s in enumerate(sources)],
                           "observers": [OBSERVER], "cell_seconds": 60, "observe_seconds": 60})
    flags = [r for r in records if r["type"] == "flag"]
    return [r for r in records if r["type"] == "cell"], [f["reason"] for f in flags], flags


def test_honest_threads_and_processes_left_behind_cost_nothing():
    cells, flags, _ = _run("def answer():\n    return 42\n" + HONEST)
    assert cells[0]["error"] is None, cells[0]["error"]
    assert flags == []


def test_the_checks_see_what_honest_processes_left_running_still_do():
    """A forkserver pool made in one cell still serves the next cell and the check: nothing killed it."""
    pool = "import multiprocessing as mp\nPOOL = mp.get_context('forkserver').Pool(1)\nassert POOL.map(abs, [-1]) == [1]\n"
    use = "def answer():\n    return POOL.map(abs, [-2, -3])\n"
    cells, flags, _ = _run(pool, use)
    assert [c["error"] for c in cells] == [None, None]
    assert flags == []


TAMPERING = {
    "compiles a string at run time": "import base64\nexec(base64.b64decode(b'eD0x').decode())",
    "walks the interpreter's frames": "import sys\nframe = sys._getframe()",
    "walks the interpreter's frames (inspect)": "import inspect\nframe = inspect.currentframe()",
    "walks every object in memory": "import gc\nn = len(gc.get_objects())",
    "calls C through ctypes": "import ctypes\nlibc = ctypes.CDLL(None)",
    "registers an at-fork hook": "import os\nos.register_at_fork(after_in_child=lambda: None)",
}


def test_what_only_tampering_does_is_flagged_with_its_cell_and_line_and_zeroes_nothing():
    sources = list(TAMPERING.values()) + ["def answer():\n    return 42"]
    records = _run_runner({"cells": [{"source": s, "grade_id": None} for s in sources],
                           "observers": [OBSERVER], "cell_seconds": 60, "observe_seconds": 60})
    flags = [r for r in records if r["type"] == "flag"]
    for index, (what, _) in enumerate(TAMPERING.items()):
        words = what.split(" (")[0]
        assert any(f"cell {index}, line 2: {words}" in f["reason"] for f in flags), (what, flags)
    assert not any(f.get("forgery") for f in flags)
    observation = next(r for r in records if r["type"] == "observation")
    assert observation["ok"] and observation["data"] == 42


def test_libraries_that_compile_or_walk_frames_are_not_the_cells():
    honest = ("import collections, dataclasses, logging\nPoint = collections.namedtuple('Point', 'x y')\n"
              "@dataclasses.dataclass\nclass Box:\n    size: int\nlogging.getLogger('x').warning('fine')\n"
              "def answer():\n    return Box(Point(1, 2).x).size\n")
    _, flags, _ = _run(honest)
    assert flags == []


def test_a_thread_running_the_cells_code_gets_a_second_run_then_a_flag_for_a_person_not_a_forgery():
    left = "import threading, time\ndef spin():\n    while True:\n        time.sleep(0.001)\n" \
           "threading.Thread(target=spin, daemon=True).start()\ndef answer():\n    return 1\n"
    cells, reasons, flags = _run(left)
    assert cells[0]["error"] is None
    assert len(flags) == 1 and "not quiet after the cells, twice" in reasons[0] and "a person should look" in reasons[0]
    assert not flags[0].get("forgery")


def test_what_a_graded_ranks_script_does_that_only_tampering_needs_is_flagged_with_its_line(monkeypatch):
    """A multi-process exercise runs as a script in forked ranks: their audit hook notes what the script
    does there (a payload decoded and run when a rank imports it), the copy passes the notes on beside the
    reports, and the supervisor flags each once, naming the script, the rank and the line; nothing is zeroed.
    One torch thread, as in the sandbox: the supervisor forks the copy only while it has one thread."""
    import inspect

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    from gpucourse.checks import lesson01_processes_threads as lesson01

    script = ("import base64\nimport torch\nimport torch.distributed as dist\n"
              "exec(base64.b64decode(b'eD0x').decode())\n"
              "def shard_indices(n, rank, world_size):\n    return list(range(rank, n, world_size))\n"
              "def average_across_ranks(tensor):\n    total = tensor.clone()\n"
              "    dist.all_reduce(total)\n    return total / dist.get_world_size()\n")
    observer = {"case": "c1", "source": inspect.getsource(lesson01.observe_ranks), "function": "observe_ranks"}
    records = _run_runner({"cells": [{"source": script, "grade_id": "average_across_ranks"}],
                           "observers": [observer], "cell_seconds": 60, "observe_seconds": 90})
    reasons = [r["reason"] for r in records if r["type"] == "flag"]
    for rank in (0, 1):
        assert any(f"the script on rank {rank}, line 4: compiles a string at run time" in r for r in reasons), reasons
    assert not any(r.get("forgery") for r in records if r["type"] == "flag")
    observation = next(r for r in records if r["type"] == "observation")
    assert observation["ok"] and observation["data"]["returncode"] == 0, observation
    assert sorted(observation["data"]["ranks"]) == ["0", "1"]


@pytest.mark.parametrize("ending", ["import os\nos._exit(3)", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"])
def test_a_worker_that_ends_in_a_cell_is_flagged_for_a_person_with_the_cell_never_a_silent_zero(ending):
    """The cells end their own process: the run stops there, as a kernel would, the checks have no
    observation, and a person is told where it ended (the grader's flag, not the student's output)."""
    cells, reasons, flags = _run("def answer():\n    return 1\n", ending, "after = 1\n")
    assert [c["index"] for c in cells] == [0] and cells[0]["error"] is None
    assert len(flags) == 1 and not flags[0].get("forgery"), reasons
    assert "the process that runs the cells ended in cell 1 (answer cell1)" in reasons[0], reasons
    assert "a person should look" in reasons[0]

"""Graded launches forked from the runner's clean copy (autograders.worker.zygote) and the rank
that runs the student's script in them (autograders.worker.rank: gpucourse.checks.ddp_harness,
protected): same reports as torchrun, no rank left behind at a timeout, and what the student's source
patches or imports does not reach the driver; the same protection when the grader starts real
torchrun on that rank.

The launches run in one fresh Python, one after another, as a submission's cases run in the runner
(the copy is forked from a process with one thread, as the runner is when it starts; pytest's own
process may hold threads by then)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="forking the launcher needs Linux")

# A driver as the lessons' drivers are: it runs in every rank on the namespace the student's source ran in.
DRIVER = '''
import json, os, sys
import torch
import torch.distributed as dist
import gpucourse.launch
from gpucourse.checks.ddp_harness import init_process_group


def drive(ns, inputs=None):
    init_process_group()
    value = torch.tensor([float(ns["contribution"](dist.get_rank()))])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return {"rank": dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"]),
            "world": int(os.environ["WORLD_SIZE"]), "total": value.item(),
            "dumps_is_real": json.dumps({"a": 1}) == '{"a": 1}',
            "helper_is_real": gpucourse.launch.read_rank_reports.__module__ == "gpucourse.launch"
                              and gpucourse.launch.read_rank_reports.__name__ == "read_rank_reports",
            "inputs": inputs, "argv": sys.argv[1:]}
'''

LAUNCH = """
import json, os, sys, time
scenarios = json.loads(sys.argv[1])
sys.path.insert(0, scenarios[0]["folder"])
from autograders.worker import runner, trust, zygote
trust.import_course()
import test_driver
from gpucourse.launch import descendants
assert zygote.start(), "the copy did not start"
results = {}
for scenario in scenarios:
    folder = scenario["folder"]
    started = time.perf_counter()
    result = zygote.launch([folder + "/student.py", folder, "test_driver:drive"], nproc=2,
                                  timeout=scenario["timeout"], cwd=folder)
    time.sleep(0.3)
    results[scenario["name"]] = {"returncode": result.returncode, "timed_out": result.timed_out,
                                 "output": result.output[-3000:], "seconds": time.perf_counter() - started,
                                 "ranks": {str(k): v for k, v in result.reports.items()},
                                 "files": sorted(n for n in os.listdir(folder) if n.startswith("rank")),
                                 "left": sorted(descendants(zygote._ZYGOTE["pid"]))}
print(json.dumps(results))
"""

# name -> (the student's source, launch timeout in seconds, inputs.json or None)
SCENARIOS = {
    "reports": ("def contribution(rank):\n    return rank + 1\n", 120, {"sizes": [5, 3]}),
    "patches": ("""
        import json, gpucourse.launch
        json.dumps = lambda *a, **k: "forged"                  # what a record is written with
        gpucourse.launch.read_rank_reports = lambda *a, **k: {}  # a course helper
        def contribution(rank):
            return 1.0
    """, 120, None),
    "imports_checks": ("""
        from gpucourse.checks import lesson07_ddp_scripts as lesson07
        def contribution(rank):
            return 1.0
    """, 120, None),
    "imports_worker": ("""
        import autograders.worker.runner
        def contribution(rank):
            return 1.0
    """, 120, None),
    "forges_reports": ("""
        import json, os, stat, sys
        forged = json.dumps({"rank": 1, "world": 2, "total": 3.0, "forged": True}) + "\\n"
        frame = sys._getframe()  # up to the launcher's frames (gc.get_objects misses what the fork servers froze)
        while frame.f_globals.get("__name__") != "autograders.worker.zygote":
            frame = frame.f_back
        launcher = frame.f_globals
        for fd in launcher["_REPORT_FDS"]:  # every rank's report pipe, as the launcher had them
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, forged.encode())
            except OSError:
                pass
        for rank in (0, 1):
            open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w").write(forged)
        def contribution(rank):
            return 1.0
    """, 120, None),
    "raises": ("""
        def contribution(rank):
            raise ValueError("no contribution from rank %d" % rank)
    """, 120, None),
    "out_of_time": ("""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # as a loader worker would
        time.sleep(600)
        def contribution(rank):
            return 1.0
    """, 8, None),
}


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    """Every scenario, launched one after another from one copy (as the runner launches a submission's cases)."""
    scenarios = []
    for name, (source, timeout, inputs) in SCENARIOS.items():
        folder = tmp_path_factory.mktemp(name)
        (folder / "test_driver.py").write_text(DRIVER)
        (folder / "student.py").write_text(textwrap.dedent(source))
        if inputs is not None:
            (folder / "inputs.json").write_text(json.dumps(inputs))
        scenarios.append({"name": name, "folder": str(folder), "timeout": timeout})
    done = subprocess.run([sys.executable, "-c", LAUNCH, json.dumps(scenarios)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # launches ranks forked from a clean copy (about a minute for the module's launch): `make test`, not `make test-fast`
def test_every_rank_reports_as_under_torchrun(launched):
    result = launched["reports"]
    assert result["returncode"] == 0, result["output"]
    assert sorted(result["ranks"]) == ["0", "1"]
    assert result["files"] == [], "ranks report through the pipes the launcher hands them, not files"
    for rank, report in result["ranks"].items():
        assert report["world"] == 2 and report["total"] == 3.0  # 1 + 2, summed over both ranks
        assert report["inputs"] == {"sizes": [5, 3]}
        assert report["argv"][2] == "test_driver:drive" and report["argv"][0].endswith("student.py")  # as torchrun passes them


@pytest.mark.slow  # launches ranks forked from a clean copy (about a minute for the module's launch): `make test`, not `make test-fast`
def test_what_the_source_patches_does_not_reach_the_driver(launched):
    result = launched["patches"]
    assert result["returncode"] == 0, result["output"]
    for report in result["ranks"].values():
        assert report["dumps_is_real"] and report["helper_is_real"], report


@pytest.mark.slow  # launches ranks forked from a clean copy (about a minute for the module's launch): `make test`, not `make test-fast`
def test_the_checks_cannot_be_imported_from_the_source(launched):
    result = launched["imports_checks"]
    assert result["returncode"] not in (0, None)
    assert "not available while grading" in result["output"], result["output"]
    assert result["ranks"] == {}


@pytest.mark.slow  # launches ranks forked from a clean copy (about a minute for the module's launch): `make test`, not `make test-fast`
def test_the_grader_cannot_be_imported_from_the_source(launched):
    result = launched["imports_worker"]
    assert result["returncode"] not in (0, None)
    assert "autograders is not available while grading" in result["output"], result["output"]
    assert result["ranks"] == {}


@pytest.mark.slow
def test_torchrun_on_the_graded_rank_protects_it_too(tmp_path):
    """Where the runner could not fork its clean copy, graded launches start real torchrun on
    autograders.worker.rank (the launch policy's launcher): the same gate and snapshot around the student's source."""
    for name in ("imports_worker", "patches"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "test_driver.py").write_text(DRIVER)
        (folder / "student.py").write_text(textwrap.dedent(SCENARIOS[name][0]))
    code = textwrap.dedent('''
        import json, sys
        from autograders.worker import rank
        out = {}
        for folder in sys.argv[1:]:
            result = rank.torchrun([folder + "/student.py", folder, "test_driver:drive"], nproc=2, timeout=240, cwd=folder)
            out[folder] = {"returncode": result.returncode, "output": result.output[-3000:]}
        print(json.dumps(out))
    ''')
    folders = [str(tmp_path / "imports_worker"), str(tmp_path / "patches")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), folders[1]])}
    done = subprocess.run([sys.executable, "-c", code, *folders], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    refused, patched = results[folders[0]], results[folders[1]]
    assert refused["returncode"] not in (0, None)
    assert "is not available while grading" in refused["output"], refused["output"]
    assert patched["returncode"] == 0, patched["output"]
    reports = [json.loads((tmp_path / "patches" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["dumps_is_real"] and r["helper_is_real"] for r in reports), reports


@pytest.mark.slow  # launches ranks forked from a clean copy (about a minute for the module's launch): `make test`, not `make test-fast`
def test_a_rank_cannot_report_for_another(launched):
    """Each rank holds only its own report pipe: a forged line reaches its own report alone (two
    reports read as unreadable), never another rank's; report files count for nothing."""
    result = launched["forges_reports"]
    assert result["returncode"] == 0, result["output"]
    assert result["ranks"] == {"0": {"unreadable": True, "reports": 2}, "1": {"unreadable": True, "reports": 2}}


@pytest.mark.slow  # launches ranks forked from a clean copy (about a minute for the module's launch): `make test`, not `make test-fast`
def test_a_failing_rank_shows_its_traceback(launched):
    result = launched["raises"]
    assert result["returncode"] not in (0, None)
    assert "ValueError: no contribution from rank" in result["output"], result["output"]


@pytest.mark.slow  # launches ranks forked from a clean copy (about a minute for the module's launch): `make test`, not `make test-fast`
def test_a_launch_out_of_time_leaves_nothing_behind(launched):
    result = launched["out_of_time"]
    assert result["timed_out"] and result["returncode"] is None
    assert result["left"] == [], "a launcher, rank or their child outlived the launch"


def test_the_supervisor_passes_on_only_listed_scripts_with_their_driver_and_a_bounded_world_size():
    from autograders.worker import supervisor

    sup = object.__new__(supervisor.Supervisor)  # only its list of launches matters here
    sup.launches = {"print('answer')": ("gpucourse.checks.lesson07_ddp_scripts:drive", 2)}
    ask = dict(source="print('answer')", driver="gpucourse.checks.lesson07_ddp_scripts:drive", nproc=2)
    assert sup._allowed(ask)
    assert sup._allowed({**ask, "nproc": 3}), "a hidden check may ask for another world size"
    assert not sup._allowed({**ask, "nproc": supervisor.MAX_RANKS + 1})
    assert not sup._allowed({**ask, "nproc": 0}) and not sup._allowed({**ask, "nproc": "2"})
    assert not sup._allowed({**ask, "driver": "os:system"})
    assert not sup._allowed({**ask, "source": "print('forged')"})


def test_fork_safe_says_why_forking_is_unsafe():
    """The one fork-safety check of the preload and the zygote: one thread is safe; a second is not."""
    code = ("import threading, time\nfrom autograders.worker.forking import fork_safe\nprint(fork_safe())\n"
            "threading.Thread(target=time.sleep, args=(1,)).start()\nprint(fork_safe())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    alone, threaded = done.stdout.splitlines()
    assert alone == "None" and threaded.startswith("2 threads"), done.stdout


REBASE = """
import json, multiprocessing.process as mp
from autograders.worker import rank, trust
trust.import_course()
mp._children = {"the launcher's child"}
guard = rank.Protection(rank.base())  # the copy's snapshot, taken once; the launcher's gate, closed
taken = guard.taken
mp._children = set()                # what multiprocessing does for itself in a forked rank
import sys
fresh = "wave" not in sys.modules
import wave                         # a module the launcher imported since
read_again = taken.rebase(closed=guard.gate.modules)
unchanged_after_rebase = taken.restore()
json.dumps = lambda *a, **k: "forged"   # then the student's source
mp._children = {"forged"}
undone = taken.restore()
print(json.dumps({"read_again": read_again, "unchanged_after_rebase": unchanged_after_rebase, "undone": undone,
                  "dumps": json.dumps({"a": 1}), "children_empty": mp._children == set(),
                  "fresh": fresh, "wave_held": "wave" in taken.entries}))
"""


@pytest.mark.slow  # launches ranks forked from a clean copy (about a minute for the module's launch): `make test`, not `make test-fast`
def test_a_rebased_snapshot_keeps_what_the_graders_code_changed_and_undoes_the_students():
    """The ranks of a launch bring the copy's snapshot up to date (``Snapshot.rebase``) instead of each
    taking a new one: what the grader's own code changed before the student's source (multiprocessing's
    state of a forked child, modules the launcher imported) is the state to restore, so a rank never
    gets its parent's children back (it would fail at exit: "can only join a child process"), and what
    the source changes afterwards is undone as before."""
    done = subprocess.run([sys.executable, "-c", REBASE], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["fresh"] and seen["wave_held"] and seen["read_again"] >= 2, seen  # multiprocessing.process and wave
    assert seen["unchanged_after_rebase"] == 0, seen
    assert seen["undone"] >= 2 and seen["dumps"] == '{"a": 1}' and seen["children_empty"], seen


def test_the_rendezvous_names_its_events_as_inspect_would():
    """The launcher's ``dynamic_rendezvous.get_method_name`` (read from the frame, not ``inspect.stack()``,
    which looks up every frame's module among all loaded ones) gives torch's own answer."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from autograders.worker import zygote

    def caller():
        return named()

    def named():
        return zygote._method_name(), dynamic_rendezvous.get_method_name(), zygote._method_name(1)

    ours, torchs, one_up = caller()
    assert ours == torchs == "caller" and one_up == "named"
    assert zygote._method_name(10_000) == "no_method_name"


def test_the_launchers_rendezvous_skips_only_the_first_join_skew():
    """torch pauses a node a random 0-0.3 s before it first joins (the one ``_delay`` drawn from a range); the
    copy's launchers, one node each, skip it and keep every other delay. Fails where torch changes that call."""
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from autograders.worker import zygote

    assert "_delay(seconds=(0, 0.3))" in inspect.getsource(dynamic_rendezvous.DynamicRendezvousHandler.next_rendezvous)
    slept = []
    delay = zygote._without_the_join_skew(slept.append)
    delay(seconds=(0, 0.3))
    delay(seconds=1)
    delay(0.5)
    assert slept == [1, 0.5]


SERVE = """
import gc, json, os
from autograders.worker import forking

class Job:
    def __init__(self, code):
        self.code = code
    def child(self):
        if self.code == "raise":
            raise RuntimeError("the request failed")
        return self.code
    def forked(self, pid):
        return {"pid": pid > 0 and pid != os.getpid(), "frozen": gc.get_freeze_count() > 0}
    def finished(self, pid):
        return {"status": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}

requests, replies = [3, "raise", 0], []
forking.serve(lambda: Job(requests.pop(0)) if requests else None, replies.append, failure_code=9)
print(json.dumps(replies))
"""


def test_one_fork_loop_names_each_child_then_says_how_it_ended():
    """``worker.forking.serve``, the loop of the preload and the zygote: per request a reply naming the child,
    then one with its exit status (``failure_code`` when the request raised), and an end when no request comes.
    What the server had loaded is out of the collector's generations when it forks (``gc.freeze``)."""
    done = subprocess.run([sys.executable, "-c", SERVE], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    replies = json.loads(done.stdout.splitlines()[-1])
    named = {"pid": True, "frozen": True}
    assert replies == [named, {"status": 3}, named, {"status": 9}, named, {"status": 0}], replies
    assert "RuntimeError: the request failed" in done.stderr  # in_child printed the child's traceback


COLLECT = """
import json, os, sys
from autograders.worker import zygote
from autograders.worker.forking import Channel

if sys.argv[1] == "poll":  # no pidfd (before Linux 5.3): the poll alone
    del os.pidfd_open
opened = []
if hasattr(os, "pidfd_open"):
    pidfd_open = os.pidfd_open
    os.pidfd_open = lambda pid: opened.append(pid) or pidfd_open(pid)
report = (json.dumps({"report": {"rank": 0}, "tampering": ["wrote to fd 7"]}) + "\\n").encode()
pipes = [os.pipe() for _ in range(3)]
pid = os.fork()
if pid == 0:  # the launcher: rank 0 reports, rank 1 writes something else, rank 2 nothing; then it exits
    os.write(pipes[0][1], report)
    os.write(pipes[1][1], b"not a report\\n")
    os._exit(3)
for _, write_end in pipes:
    os.close(write_end)
status, found, notes = zygote._collect(pid, [Channel(read=r) for r, _ in pipes])
print(json.dumps({"status": status, "found": found, "notes": notes, "waited_on_the_pidfd": opened == [pid]}))
"""


@pytest.mark.parametrize("how", ["pidfd", "poll"])
def test_the_copy_collects_every_rank_report_and_the_launchers_status_as_the_launcher_ends(how):
    """``zygote._collect``: the launcher's exit status, each rank's one report (anything else is unreadable, a
    rank without one is absent) and what the audit hooks noted; it wakes on the launcher's end through a
    pidfd, or polls where there is none."""
    done = subprocess.run([sys.executable, "-c", COLLECT, how], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"status": 3, "found": {"0": {"rank": 0}, "1": {"unreadable": True}},
                      "notes": {"0": ["wrote to fd 7"]}, "waited_on_the_pidfd": how == "pidfd"}, result

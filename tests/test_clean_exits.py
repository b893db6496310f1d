"""Every multi-process demo and script exercise ends cleanly: each rank ends torch.distributed while
Python is still whole (gpucourse.launch.close_process_group), then its process without the interpreter's
shutdown (gpucourse.launch.exit_rank), so that no rank aborts at exit ("terminate called without an
active exception", SIGABRT) and fails a launch in a student's notebook. On torch 2.10 (the edition's
oldest) a rank aborted now and then even with its group destroyed: the stress tier runs the checks'
harness on that torch too.

A gloo group left to interpreter shutdown aborts its rank only now and then, and more often on a busy
machine: one clean launch proves little. ``make test-stress`` (marker ``stress``) launches each demo
GPUCOURSE_STRESS_RUNS times (50 unless set) in a row, beside a process that keeps a core busy.
In ``make test`` every demo but one is already launched by the test of its lesson (``LAUNCHED_BY``), whose
``run`` raises on a rank's abort as on any failed launch, so a demo that aborts often fails there; the one
that no other test launches through torchrun (the rank harness under Lightning) is launched here once."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpucourse.launch import close_process_group, torchrun

ROOT = Path(__file__).resolve().parent.parent
CHEAP_RUNS = 1  # in `make test`: once, checked for an abort (the stress tier repeats it)
STRESS_RUNS = int(os.environ.get("GPUCOURSE_STRESS_RUNS", "50"))
# what an aborted rank leaves in the output: the C++ runtime's words, and torchrun's or mp.spawn's report
ABORTED = re.compile(r"terminate called|SIGABRT|Signal 6 |signal 6\b|core dumped")


def _torchrun(*target: str, nproc: int = 2):
    def launch(folder: Path):
        done = torchrun(list(target) + ["--out", str(folder)], nproc=nproc, timeout=300, cwd=folder)
        return done.returncode, done.output
    return launch


def _lightning_driver(folder: Path):
    """Lesson 7's Lightning exercise through the grader's rank harness: a Trainer starts the gloo group."""
    fixture = ROOT / "tests/fixtures/lesson07_ddp_scripts/right/synced_metrics__torchmetrics_objects.py"
    (folder / "student.py").write_text(fixture.read_text())
    done = torchrun(["-m", "gpucourse.checks.ddp_harness", str(folder / "student.py"), str(folder),
                     "gpucourse.checks.lesson07_ddp_scripts:drive_synced_metrics"], nproc=2, timeout=300, cwd=folder)
    return done.returncode, done.output


def _harness(python: str | None = None):
    """Lesson 7's ``average_gradients`` check through the checks' rank harness (plain DDP, 2 ranks), with a
    right answer; on ``python`` (another interpreter, e.g. the edition's oldest torch) instead of this one."""
    fixture = ROOT / "tests/fixtures/lesson07_ddp_scripts/right/average_gradients__one_flat_buffer.py"
    target = ["-m", "gpucourse.checks.ddp_harness", "student.py", ".",
              "gpucourse.checks.lesson07_ddp_scripts:drive_average_gradients"]

    def launch(folder: Path):
        (folder / "student.py").write_text(fixture.read_text())
        if python is None:
            done = torchrun(target, nproc=2, timeout=300, cwd=folder)
            return done.returncode, done.output
        done = subprocess.run([python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *target],
                              capture_output=True, text=True, timeout=300, cwd=folder,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")})
        return done.returncode, done.stdout + done.stderr
    return launch


def _darts_ddp(folder: Path):
    """Lesson 9's script: ``ddp_spawn`` on 2 CPU processes (mp.spawn, not torchrun)."""
    done = subprocess.run([sys.executable, "-m", "gpucourse.darts_ddp", "--devices", "2", "--epochs", "1",
                           "--out", str(folder / "result.json")], capture_output=True, text=True, timeout=600,
                          cwd=folder, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return done.returncode, done.stdout + done.stderr


# Every module that runs as ranks, each demo at its smallest size (lessons 7, 9, 13, 14, 16, and the
# harness that runs lessons 1, 7 and 13's script exercises).
DEMOS = {
    "ddp_scripts": _torchrun("-m", "gpucourse.ddp_scripts", "--steps", "2", "--per-rank", "4", "--hidden", "8"),
    "sharding-collectives": _torchrun("-m", "gpucourse.sharded_data_parallel", "collectives", "--numel", "10", nproc=3),
    "sharding-memory": _torchrun("-m", "gpucourse.sharded_data_parallel", "memory", "--width", "32", "--steps", "2"),
    "sharding-tensor": _torchrun("-m", "gpucourse.sharded_data_parallel", "tensor"),
    "sharding-pipeline": _torchrun("-m", "gpucourse.sharded_data_parallel", "pipeline", "--width", "32", "--rows", "8"),
    "comms-sweep": _torchrun("-m", "gpucourse.communication", "sweep", "--smallest", "4096", "--largest", "16384",
                             "--repeats", "2"),
    "comms-plans": _torchrun("-m", "gpucourse.communication", "plans", "--widths", "16", "--repeats", "2"),
    "resilience-save": lambda folder: _torchrun("-m", "gpucourse.checkpoints", "save", "--ckpt", str(folder / "ckpt"),
                                                "--width", "16", "--steps", "2", "--more", "1")(folder),
    "harness-lightning": _lightning_driver,
    "harness-ddp": _harness(),
    "darts_ddp": _darts_ddp,
}


def launch_many(name: str, runs: int, launch=None) -> list[str]:
    """Launch demo ``name`` (or ``launch``, a function like DEMOS') ``runs`` times in a row; one line per
    launch that failed or aborted."""
    failures = []
    for run in range(runs):
        with tempfile.TemporaryDirectory(prefix="gpucourse-exit-") as folder:
            returncode, output = (launch or DEMOS[name])(Path(folder))
        aborted = ABORTED.search(output)
        if returncode != 0 or aborted:
            why = f"aborted ({aborted.group(0)!r})" if aborted else f"exit {returncode}"
            failures.append(f"launch {run + 1}/{runs}: {why}\n{output[-1500:]}")
    return failures


# Where `make test` already launches each demo (the call, as the test file writes it). Those launches fail
# on an aborted rank too (gpucourse.launch.run_demo raises on a non-zero exit, and torchrun reports a
# SIGABRT as one), so launching the demo once more here would repeat them.
LAUNCHED_BY = {
    "ddp_scripts": ("tests/test_ddp_scripts.py", '"-m", "gpucourse.ddp_scripts"'),
    "sharding-collectives": ("tests/test_sharded_data_parallel.py", 'H.run("collectives", nproc=3'),
    "sharding-memory": ("tests/test_sharded_data_parallel.py", 'H.run("memory"'),
    "sharding-tensor": ("tests/test_sharded_data_parallel.py", 'H.run("tensor"'),
    "sharding-pipeline": ("tests/test_sharded_data_parallel.py", 'H.run("pipeline"'),
    "comms-sweep": ("tests/test_communication.py", 'C.run("sweep"'),
    "comms-plans": ("tests/test_communication.py", 'C.run("plans"'),
    "resilience-save": ("tests/test_checkpoints.py", 'H.run("save"'),
    # lesson 9's solution run, which `make test` executes: its cell raises when the script fails
    "darts_ddp": ("solutions/lesson09_darts_forecasting/darts_forecasting.ipynb", '"gpucourse.darts_ddp", "--devices", "2"'),
}


def test_every_demo_is_launched_here_or_by_its_lessons_test():
    for name, (path, call) in LAUNCHED_BY.items():
        assert name in DEMOS, f"{name}: no such demo"
        text = (ROOT / path).read_text()
        if path.endswith(".ipynb"):
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"] if c["cell_type"] == "code")
        assert call in text, f"{name}: {path} no longer launches it ({call!r} not found): launch it here again"
        if path.endswith(".py"):
            assert not re.search(r"^pytestmark = .*(stress|bench|skip)", text, re.M), f"{path} is not in `make test`"
            assert not _left_out_of_make_test(text, call), f"{name}: the test in {path} that launches it is not in `make test`"


def _left_out_of_make_test(text: str, call: str) -> bool:
    """Whether the test function around the first ``call`` in ``text`` is marked stress, bench or skip (a
    helper or fixture around it is not judged: the tests that use it are)."""
    line = text[:text.index(call)].count("\n") + 1
    around = [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef)
              and node.lineno <= line <= node.end_lineno]
    if not around:
        return False
    inner = max(around, key=lambda node: node.lineno)
    marks = " ".join(ast.unparse(d) for d in inner.decorator_list)
    return inner.name.startswith("test_") and bool(re.search(r"\b(stress|bench|skip|skipif)\b", marks))


def test_a_launch_in_a_test_left_out_of_make_test_does_not_count():
    call = 'H.run("memory"'
    body = f"def {{name}}():\n    return {call}, nproc=2)\n"
    assert _left_out_of_make_test("import pytest\n@pytest.mark.stress\n" + body.format(name="test_a"), call)
    assert _left_out_of_make_test("@pytest.mark.skip(reason='x')\n" + body.format(name="test_a"), call)
    assert not _left_out_of_make_test("@pytest.mark.slow\n" + body.format(name="test_a"), call)
    assert not _left_out_of_make_test(body.format(name="_launch"), call)  # a helper: the tests using it are judged


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(DEMOS) - set(LAUNCHED_BY)))
def test_each_demo_no_other_test_launches_exits_cleanly(name):
    failures = launch_many(name, CHEAP_RUNS)
    assert not failures, f"{len(failures)} of {CHEAP_RUNS} launches of {name} failed:\n" + "\n".join(failures)


@pytest.fixture
def busy_core():
    """A process spinning on one core while the test runs: a rank's exit races its threads more often."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    spinner.kill()
    spinner.wait()


@pytest.mark.stress
@pytest.mark.parametrize("name", sorted(DEMOS))
def test_each_demo_exits_cleanly_many_times_under_load(name, busy_core):
    failures = launch_many(name, STRESS_RUNS)
    assert not failures, f"{len(failures)} of {STRESS_RUNS} launches of {name} failed:\n" + "\n".join(failures)


@pytest.mark.stress
def test_the_checks_harness_exits_cleanly_many_times_under_load_on_the_oldest_torch(busy_core):
    """The abort that the edition's run met on torch 2.10 (lesson 7's check, now and then): after its
    report, at interpreter shutdown. The harness ends its ranks with ``exit_rank``; here on that torch,
    the edition test's runtime (built first if missing: about 3 minutes)."""
    from test_edition_installed import oldest_runtime

    python = str(oldest_runtime())
    failures = launch_many("harness-ddp", STRESS_RUNS, _harness(python))
    assert not failures, f"{len(failures)} of {STRESS_RUNS} launches on {python} failed:\n" + "\n".join(failures)


def test_exit_rank_flushes_its_output_keeps_the_code_and_skips_the_shutdown():
    program = ("import atexit, sys\n"
               "from gpucourse.launch import exit_rank\n"
               "atexit.register(lambda: print('shutdown ran'))\n"
               "print('report written', end='')\n"
               "sys.stderr.write('to stderr')\n"
               "exit_rank({code})\n"
               "print('after exit_rank')\n")
    for code, status in ((None, 0), (0, 0), (3, 3)):
        done = subprocess.run([sys.executable, "-c", program.format(code=code)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert (done.returncode, done.stdout, done.stderr) == (status, "report written", "to stderr"), done


def test_aborts_are_recognised_in_the_output():
    assert ABORTED.search("terminate called without an active exception")
    assert ABORTED.search("exitcode  : -6 (pid: 4242)\n  error_file: <N/A>\n  traceback : Signal 6 (SIGABRT) received")
    assert ABORTED.search("process 1 terminated with signal SIGABRT")
    assert not ABORTED.search("rank 0 wrote rank0.json\nexit 0")


def _one_rank_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    return dist


def test_close_process_group_destroys_the_group_and_then_does_nothing(tmp_path):
    dist = _one_rank_group(tmp_path)
    assert dist.is_initialized()
    close_process_group()
    assert not dist.is_initialized()
    close_process_group()  # a second call (a harness after a driver that closed it already) is a no-op
    close_process_group(wait=False)


def test_darts_ranks_end_the_group_when_fit_ends_only(tmp_path):
    from gpucourse.darts_ddp import EndProcessGroup

    dist = _one_rank_group(tmp_path)
    try:
        EndProcessGroup().teardown(None, None, "validate")  # Lightning tears down after validate too
        assert dist.is_initialized()
        EndProcessGroup().teardown(None, None, "fit")
        assert not dist.is_initialized()
    finally:
        close_process_group(wait=False)


def test_every_rank_entry_point_ends_through_close_process_group_and_exit_rank():
    """The modules that start ranks (a ``__main__`` that initialises torch.distributed, or a harness)
    end them through the one helper, not with a bare destroy_process_group that skips the barrier; and
    their ``__main__`` (the harnesses' too) ends the process through ``exit_rank``."""
    ended = []
    for path in sorted((ROOT / "src/gpucourse").rglob("*.py")):
        text = path.read_text()
        # the module's own calls (a script it holds as a string, shown in a lesson, is not the module)
        called = {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                  for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Call)}
        if '__name__ == "__main__"' not in text or not called & {"init_process_group", "init_attempt_process_group"} \
                or path.name == "launch.py":
            continue
        assert "close_process_group" in called, f"{path.relative_to(ROOT)} starts ranks but never calls close_process_group"
        assert "destroy_process_group" not in called, f"{path.relative_to(ROOT)} destroys its group directly"
        ended.append(path)
    assert len(ended) >= 6, ended  # the lessons' demos
    # and every rank's process ends through exit_rank once its work is done (the harnesses after their report)
    for path in [*ended, ROOT / "src/gpucourse/checks/ddp_harness.py", ROOT / "autograders/worker/rank.py"]:
        main = [node for node in ast.parse(path.read_text()).body if isinstance(node, ast.If)
                and ast.unparse(node.test) in ("__name__ == '__main__'", '__name__ == "__main__"')]
        assert main, f"{path.relative_to(ROOT)}: no __main__ block"
        last = ast.unparse(main[0].body[-1])
        assert last.startswith("exit_rank("), f"{path.relative_to(ROOT)}: its __main__ ends with {last!r}, not exit_rank(...)"

"""Shared paths and helpers for the test suite (run by `make test`, on CPU)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

# Each pytest-xdist worker stands for about one core (the Makefile starts one more than cores), so it and every process
# it starts (notebook kernels, scripts) get one torch thread, set before torch is imported anywhere. With
# torch's default of one thread per core, N workers run N x N OpenMP threads on N cores and a small operator
# waits for a descheduled thread: on this 2-core machine, with the other core busy, F.gelu on a 12x96 tensor
# took 4.2 ms with 2 threads and 54 us with 1. Lessons that compare thread counts set theirs explicitly.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import nbformat  # noqa: E402
import pytest  # noqa: E402

from gpucourse import environment

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
COURSE = ROOT / "course"
AUTOGRADERS = ROOT / "autograders"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Each solution notebook executed in a pytest run is saved here (``executed_solution``), so the tests that
# read what it printed (tests/test_notebooks_accelerator_cells.py, tests/test_site.py) share one run of it;
# book/make_book.py reads the same folder.
EXECUTED = ROOT / "build" / "executed"
SESSION_START = time.time()  # executed notebooks older than this were not made by this pytest run

os.environ.setdefault(environment.OFFLINE, "1")  # never download a dataset in tests; kernels inherit this
# The hidden checks draw their inputs from a seed per grading. The suite draws from a fixed one, so that a run
# is reproducible (as Hypothesis derandomizes in CI): GPUCOURSE_TEST_SEED for the fixtures judged in this
# process (test_checks.grading_seed; "random" draws a new one each time, to explore), GPUCOURSE_GRADING_SEED
# for the sandboxed class (nbgrader_config.py sets c.Grading.seed from it).
# Hidden checks judge sbatch_for by reading its script unless a test asks for a run on the local Slurm
# (tests/test_local_slurm.py): a judgement must not depend on whether another test has the cluster up.
os.environ.setdefault("GPUCOURSE_SLURM_JUDGE", "0")
os.environ.setdefault("GPUCOURSE_TEST_SEED", "20261127")
if os.environ["GPUCOURSE_TEST_SEED"] != "random":
    os.environ.setdefault("GPUCOURSE_GRADING_SEED", os.environ["GPUCOURSE_TEST_SEED"])

# The suite's own switches, read here only (CI's `.ci/run` sets them; the course reads its variables in
# gpucourse.environment): with GPUCOURSE_REQUIRE_ISOLATION=1 a test that cannot isolate a sandbox fails
# instead of skipping, with GPUCOURSE_REQUIRE_BROWSER=1 a browser test without Chromium does, with
# GPUCOURSE_REQUIRE_INDEX=1 a test that cannot reach the package index (test_edition_installed.py) does;
# GPUCOURSE_TEST_SECRETS names the folders test_sandbox.py's root run planted for its run as nobody.
REQUIRE_ISOLATION_ENV, REQUIRE_BROWSER_ENV, SECRETS_ENV = ("GPUCOURSE_REQUIRE_ISOLATION", "GPUCOURSE_REQUIRE_BROWSER",
                                                           "GPUCOURSE_TEST_SECRETS")
REQUIRE_ISOLATION = os.environ.get(REQUIRE_ISOLATION_ENV) == "1"
REQUIRE_BROWSER = os.environ.get(REQUIRE_BROWSER_ENV) == "1"
REQUIRE_INDEX_ENV = "GPUCOURSE_REQUIRE_INDEX"
REQUIRE_INDEX = os.environ.get(REQUIRE_INDEX_ENV) == "1"


def planted_secrets() -> list[Path]:
    """The folders named in GPUCOURSE_TEST_SECRETS (none when it is unset)."""
    return [Path(p) for p in os.environ.get(SECRETS_ENV, "").split(os.pathsep) if p]



# The one notebook `make test-fast` executes (a quick lesson with GPU cells that skip on a CPU); the
# others are marked slow and run in `make test`.
FAST_NOTEBOOK = "lesson03_tensor_cores"


def notebook_param(path: Path, *values):
    """A pytest.param for a test about notebook ``path``: marked slow unless it is ``FAST_NOTEBOOK``.

    Under pytest-xdist (``make test`` runs ``--dist loadgroup``) every test about one notebook goes
    to the same worker, which then executes that notebook once (``executed_solution``).
    """
    import pytest

    name = Path(path).parent.name
    marks = (pytest.mark.xdist_group(name),) + (() if name == FAST_NOTEBOOK else (pytest.mark.slow,))
    return pytest.param(*(values or (path,)), marks=marks)


@pytest.fixture(scope="session")
def forked_launches():
    """Multi-process answers judged in the test process launch as the grader launches them: forked from a
    clean copy of the runner (tests/clean_copy.py, one per pytest worker), protected as in grading,
    instead of starting a Python per rank under ``torchrun`` (seconds of CPU each). The ``torchrun`` path a
    student's own ``check()`` takes is what the notebooks and tests/test_ddp_scripts.py run."""
    import clean_copy
    from autograders.worker import zygote
    from gpucourse.checks import ddp

    copy = clean_copy.start()
    if copy is None:  # it said why on stderr; the launches then start torchrun, slower but the same
        yield None
        return
    with ddp.launch_policy(ddp.LaunchPolicy(launcher=zygote.launch)):
        yield zygote
    clean_copy.stop(copy)


def pytest_addoption(parser):
    parser.addoption("--every-fixture-sandboxed", action="store_true",
                     help="tests/test_grading.py: grade every wrong fixture in the sandbox too (each is judged "
                          "in-process anyway); by default every right one and the first wrong one per exercise")


# Modules that run in the xdist group of a notebook (``notebook_param``'s), not in one of their own: every
# module that holds lesson 10's local Slurm cluster (conftest.local_cluster, one per machine) for minutes,
# and lesson 10's notebook, which needs it too. Split over two workers, one would wait, idle, for the
# other's lock (minutes of a core, measured in the CI log's CPU idle); in one group they run one after another.
MODULE_GROUPS = {name: "lesson10_beyond_one_machine" for name in ("test_local_slurm", "test_requeue", "test_slurm_grading")}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups to schedule by them
def pytest_collection_modifyitems(items):
    """Under pytest-xdist, a module whose tests share a module-scoped fixture (a class graded once, a
    server started once) runs on one worker: split over two, each would build the fixture again."""

    for item in items:
        if item.module.__name__ in MODULE_GROUPS and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(MODULE_GROUPS[item.module.__name__]))
        info = getattr(item, "_fixtureinfo", None)
        shared = info and any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)
        if shared and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


_UNGROUPED: set[str] = set()  # grouped tests whose group pytest-xdist lost (pytest_collection_finish)


def pytest_collection_finish(session):
    """Fail loudly where pytest-xdist's groups would silently not take effect: its loadgroup marks a grouped
    test by rewriting the test's node id, which pytest 9.2 no longer reads (pytest-dev/pytest-xdist#1386;
    constraints.txt keeps pytest below 9.2 until a fixed pytest-xdist is out). Split over workers, the
    whole-class grading and the adversarial batch would each run twice: each such test fails instead,
    before its fixtures, saying why."""
    config = session.config
    if hasattr(config, "workerinput") and config.getvalue("loadgroup"):
        _UNGROUPED.update(item.nodeid for item in session.items
                          if item.get_closest_marker("xdist_group") and "@" not in item.nodeid)


def pytest_runtest_setup(item):
    if item.nodeid in _UNGROUPED:
        pytest.fail(f"pytest-xdist's --dist loadgroup does not group tests under pytest {pytest.__version__} "
                    "(pytest-dev/pytest-xdist#1386): install constraints.txt's pytest (`make install`), or run "
                    "without -n", pytrace=False)


def needs_cuda(reason: str):
    """Skip a test without CUDA, unless ``GPUCOURSE_REQUIRE=cuda`` (``make test-gpu``) makes that a failure."""
    import pytest
    import torch

    from gpucourse.preamble import required_kinds

    return pytest.mark.skipif(not torch.cuda.is_available() and "cuda" not in required_kinds(), reason=reason)


# Run in a kernel before its first cell (``execute_notebook(record=True)``), one line per event in its log, the
# number of the cell running then (1 for the first cell run, as nbclient numbers them; counted at IPython's
# pre_run_cell, which a silent run like this one does not trigger):
# - "fork N": a fork of the kernel's own process. ``os.register_at_fork`` hooks run for os.fork and
#   multiprocessing's fork (DataLoader workers, Lightning's ddp_notebook); subprocess's fork and exec
#   (torchrun, a fresh Python) runs none, and its child starts afresh, without its parent's CUDA state.
# - "read N": the kernel opened a GPU reference file (a JSON file of ``reference_folder``, or the one
#   GPUCOURSE_REFERENCE names), seen by an audit hook (``gpucourse.reference.load`` reads the file at each call).
RECORDER = """\
def _record(log, folder, named):
    import os, sys
    cells = [0]
    def started(info):
        cells[0] += 1
    def note(kind):
        with open(log, "a") as out:
            out.write(f"{{kind}} {{cells[0]}}\\n")
    def opened(event, args):
        if event == "open" and args and isinstance(args[0], (str, os.PathLike)):
            path = os.fspath(args[0])
            if isinstance(path, str) and path.endswith(".json") and (path.startswith(folder) or path == named):
                note("read")
    get_ipython().events.register("pre_run_cell", started)
    os.register_at_fork(before=lambda: note("fork"))
    sys.addaudithook(opened)
_record({log!r}, {folder!r}, {named!r})
del _record
"""


def reference_folder() -> str:
    from gpucourse import reference

    return str(reference.FOLDER.resolve()) + os.sep


def execute_notebook(nb, cwd: str | os.PathLike, timeout: int, allow_errors: bool = False,
                     record: bool = False) -> dict[str, list[int]]:
    """Execute ``nb`` in place in a fresh python3 kernel started in ``cwd`` (nbclient's ``execute``: a
    failing cell raises CellExecutionError unless ``allow_errors``). With ``record``, returns the index of
    each cell in which the kernel's own process forked ("fork") and of each that read a GPU reference file
    ("read"; ``RECORDER``: run silently, outside the notebook's history, its log outside ``cwd``, so
    execution counts, outputs and files are as without it); without, both lists are empty.

    The kernel talks to this process over Unix sockets in a folder of its own, not over TCP ports:
    jupyter_client picks a "free" port by binding and releasing it, and under this suite's parallel
    load (the other worker's kernels, torchrun's and gloo's ports) another process can take it first,
    so that the kernel dies with "Address already in use" and the test fails after a minute's wait
    (jupyter/nbconvert#1066, nteract/papermill#511; seen here in a full run).
    """
    import shutil

    from nbclient import NotebookClient
    from traitlets.config import Config

    sockets = tempfile.mkdtemp(prefix="gpucourse-kernel-")  # short: a Unix socket path has at most 107 bytes
    config = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets, "kernel")}})
    client = NotebookClient(nb, config=config, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(cwd)}})
    log = Path(sockets) / "events"
    if record:
        log.write_text("")
        code = RECORDER.format(log=str(log), folder=reference_folder(), named=os.environ.get(environment.REFERENCE, ""))

        async def install_recorder(notebook):
            reply = await client.async_wait_for_reply(client.kc.execute(code, silent=True, store_history=False))
            if reply is None or reply["content"]["status"] != "ok":
                raise RuntimeError(f"the recorder did not install in the kernel: {reply}")

        client.on_notebook_start = install_recorder
    try:
        client.execute()
        events = [line.split() for line in log.read_text().splitlines()] if record else []
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    return {kind: sorted(i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                         and str(c.get("execution_count")) in {count for k, count in events if k == kind})
            for kind in ("fork", "read")}


def notebooks(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def read(path: Path):
    return nbformat.read(path, as_version=4)


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


class NotebookFailed(Exception):
    """A solution notebook raised in a cell: the message names the cell and carries nbclient's error."""


_FAILED: dict[Path, str] = {}  # solution notebook -> why it failed, this pytest run


def executed_solution(path: Path, wait: bool = True):
    """``path`` (a solution notebook) executed in the smoke setting, once per pytest run.

    The first caller runs it in a real kernel and saves it under ``EXECUTED``; every later caller, in any
    test file and in any order, reads that run (or gets its failure again) instead of running it twice.
    A test that needs an executed notebook calls this, so it never depends on another test having run.
    With ``wait=False`` it returns None at once where another pytest worker is running the notebook (or
    lesson 10's cluster is taken) instead of waiting for it (``executed_solutions``).
    """
    from filelock import FileLock, Timeout

    path = Path(path)
    target = EXECUTED / path.relative_to(SOLUTIONS)
    if path in _FAILED:
        raise NotebookFailed(_FAILED[path])
    target.parent.mkdir(parents=True, exist_ok=True)
    # pytest-xdist workers share EXECUTED: the first to take the lock runs the notebook, the others wait
    # for its file instead of running it again beside it.
    lock = FileLock(str(target.with_name(f".{target.name}.lock")))
    try:
        lock.acquire(timeout=-1 if wait else 0)
    except Timeout:
        return None
    try:
        if target.is_file() and target.stat().st_mtime >= SESSION_START:
            return read(target)  # this run's execution: no cluster needed to read it
        _raise_earlier_failure(path, target)
        if path.parent.name == "lesson10_beyond_one_machine":
            with local_cluster(wait=wait) as up:  # lesson 10 submits real jobs where a local Slurm can run
                return None if up is None else _execute_once(path, target)
        return _execute_once(path, target)
    finally:
        lock.release()


def executed_solutions(paths: list[Path]) -> list:
    """Every notebook of ``paths`` executed (``executed_solution``), in the order given: first those no other
    pytest worker is running, then the rest, waiting for them. A test that needs many notebooks (the book)
    thus runs what is free instead of waiting for the other worker's notebook while its own core idles."""
    runs = {path: executed_solution(path, wait=False) for path in paths}
    return [runs[path] if runs[path] is not None else executed_solution(path) for path in paths]


# The cluster is one per machine (its state folder and ports), whatever checkout's tests use it: the lock
# lives beside its state folder, so two checkouts' test runs take turns too.
SLURM_LOCK = Path(environment.slurm_dir().rstrip("/") + ".lock")


@contextmanager
def local_cluster(required: bool = False, wait: bool = True):
    """Lesson 10's local Slurm (gpucourse.local_slurm), held by one test at a time (a lock shared by the
    pytest workers): started here where this machine can run it (root, slurm-wlm) and stopped after if it
    was down; yields whether it is up. Where it cannot start, ``required`` (or GPUCOURSE_REQUIRE_SLURM=1)
    fails the caller instead of letting the lesson show its recorded run. With ``wait=False`` it yields
    None at once where another test holds it."""
    from filelock import FileLock, Timeout

    from gpucourse import local_slurm

    SLURM_LOCK.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(SLURM_LOCK))
    try:
        lock.acquire(timeout=-1 if wait else 0)
    except Timeout:
        yield None
        return
    try:
        started = False
        if not local_slurm.is_up():
            problems = local_slurm.missing()
            if problems:
                if required or os.environ.get("GPUCOURSE_REQUIRE_SLURM") == "1":
                    pytest.fail("GPUCOURSE_REQUIRE_SLURM=1 but no local Slurm cluster: " + "; ".join(problems))
                yield False
                return
            local_slurm.start()
            started = True
        try:
            yield True
        finally:
            if started:
                local_slurm.stop(quiet=True)
    finally:
        lock.release()


def _failure_note(target: Path) -> Path:
    """Where a failed run of ``target``'s notebook leaves why, for the other pytest workers."""
    return target.with_name(f".{target.name}.failed")


def _raise_earlier_failure(path: Path, target: Path) -> None:
    """NotebookFailed with its reason where this pytest run already ran ``path`` and it failed, on any worker."""
    note = _failure_note(target)
    if note.is_file() and note.stat().st_mtime >= SESSION_START:  # another worker's run failed: not again
        _FAILED[path] = note.read_text()
        raise NotebookFailed(_FAILED[path])


def _execute_once(path: Path, target: Path):
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    if target.is_file() and target.stat().st_mtime >= SESSION_START:
        return read(target)
    _raise_earlier_failure(path, target)
    note = _failure_note(target)
    if not environment.smoke():
        raise NotebookFailed("run through `make test` (or `make test-fast`), which sets GPUCOURSE_SMOKE=1")
    nb = read(path)
    with tempfile.TemporaryDirectory() as workdir:
        try:
            recorded = execute_notebook(nb, workdir, timeout=900, record=True)
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as error:
            # a timeout or a dead kernel too: each later caller would otherwise run the notebook again
            index = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                          and any(o.get("output_type") == "error" for o in c.get("outputs", []))), "?")
            head = nb.cells[index].source.splitlines()[0] if index != "?" else ""
            why = "" if isinstance(error, CellExecutionError) else f"{type(error).__name__}: "
            _FAILED[path] = f"{path.relative_to(SOLUTIONS.parent)}: cell {index} ({head!r}) failed:\n{why}{error}"
            note.write_text(_FAILED[path])
            raise NotebookFailed(_FAILED[path]) from None
    note.unlink(missing_ok=True)
    _record_note(target).write_text(json.dumps(recorded))  # before the notebook: whoever reads it finds this too
    save_executed(path, nb)
    return nb


def _record_note(target: Path) -> Path:
    return target.with_name(f".{target.name}.recorded.json")


def recorded_cells(path: Path, kind: str) -> list[int]:
    """The cells of solution notebook ``path`` in which ``RECORDER`` saw ``kind`` ("fork": its kernel's own process
    forked; "read": it read a GPU reference file), in this pytest run's execution of it (``executed_solution``,
    which runs it if no worker has; raises NotebookFailed if it failed)."""
    path = Path(path)
    executed_solution(path)
    return json.loads(_record_note(EXECUTED / path.relative_to(SOLUTIONS)).read_text())[kind]


def forked_cells(path: Path) -> list[int]:
    return recorded_cells(path, "fork")


def reference_cells(path: Path) -> list[int]:
    return recorded_cells(path, "read")


def save_executed(source: Path, nb) -> Path:
    """Write an executed notebook to ``EXECUTED/<assignment>/<name>.ipynb`` (atomically: runs may overlap)."""
    target = EXECUTED / source.relative_to(SOLUTIONS)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    nbformat.write(nb, partial)
    os.replace(partial, target)
    return target

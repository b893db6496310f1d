"""autograders/cgroups.py: as root, each sandboxed run gets a cgroup that bounds the run as a whole.

One test per limit, each running a real sandbox whose program tries to pass it: memory (its tmpfs
files included), the size of its own /tmp, processes, and the CPU share of a hog beside an honest
neighbour; then that no cgroup is left after the runs. Without cgroups (not root, no writable cgroup
file system) they skip and say why, unless ``GPUCOURSE_REQUIRE_ISOLATION=1`` makes that a failure.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from autograders import cgroups, sandbox, sandbox_view
from conftest import REQUIRE_ISOLATION

pytestmark = pytest.mark.slow  # starts isolated sandboxes: `make test`, not `make test-fast`

SUPPORT = cgroups.probe()
ISOLATION = sandbox.probe()
ENV = {"PATH": os.defpath, "LANG": "C.UTF-8", **sandbox.ONE_THREAD_ENV}  # as test_sandbox.py's


def _missing(what: str) -> None:
    if REQUIRE_ISOLATION:
        pytest.fail(f"GPUCOURSE_REQUIRE_ISOLATION=1 but {what}")
    pytest.skip(what)


@pytest.fixture
def cgroups_here():
    if not SUPPORT:
        _missing(SUPPORT.describe())


needs_cgroups = pytest.mark.usefixtures("cgroups_here")


@pytest.fixture(scope="module")
def server():
    if not ISOLATION:  # a preloaded Python isolates each run it forks: without isolation it has none to give
        _missing(ISOLATION.describe())
    with contextlib.closing(sandbox.Preloaded(ENV)) as preloaded:
        assert preloaded.usable(), preloaded.why
        yield preloaded


@pytest.fixture(params=["started", "forked"])
def launch(request):
    """A Python started per run joins its cgroup between fork and exec; one forked from a preloaded
    Python joins it before it reads the job."""
    return request.getfixturevalue("server") if request.param == "forked" else None


def _run(tmp_path: Path, code: str, launch=None, isolate=True, **limits) -> sandbox.Outcome:
    if isolate and not ISOLATION:
        _missing(ISOLATION.describe())
    work = tmp_path / f"work-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    (work / "main.py").write_text(textwrap.dedent(code))
    out = sandbox.run([sys.executable, "main.py"], work, env=ENV, limits=sandbox.Limits(**{"wall_seconds": 60, **limits}),
                      isolate=isolate, preloaded=launch)
    assert out.cgroup == SUPPORT.version, out
    return out


def _shmem() -> int:
    """Bytes of tmpfs and shared memory in use on the machine (/proc/meminfo's Shmem)."""
    line = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("Shmem:"))
    return int(line.split()[1]) << 10


FILL = """
    import sys
    written = 0
    try:
        for number in range({count}):
            with open(f"{folder}/fill{{number}}", "wb") as f:  # files of 16 MiB: RLIMIT_FSIZE is not what stops it
                f.write(b"x" * (16 << 20))
            written += 16
            print("wrote", written, flush=True)
    except BaseException as error:
        print("stopped:", type(error).__name__, error, flush=True)
        sys.exit(3)
"""


@needs_cgroups
def test_memory_bounds_the_sandboxs_tmpfs_files(tmp_path, launch):
    """512 MiB into /dev/shm under a 256 MiB limit: stopped (killed, or an error) below the limit, and
    nothing of it left in the machine's memory after the run."""
    before = _shmem()
    out = _run(tmp_path, FILL.format(count=32, folder="/dev/shm"), launch, memory_max_bytes=256 << 20)
    written = [int(line.split()[1]) for line in out.output.splitlines() if line.startswith("wrote ")]
    assert out.returncode != 0 and max(written, default=0) <= 256, out.output[-2000:]
    assert _shmem() - before < 128 << 20, "the sandbox's tmpfs files outlived it"


@needs_cgroups
def test_tmpfs_size_bounds_tmp(tmp_path):
    """/tmp of 64 MiB: writing 128 MiB there fails with ENOSPC, whatever the memory limit."""
    if ISOLATION.method == "bwrap" and not sandbox_view._bwrap_sizes():
        pytest.skip("this bubblewrap has no --size: its /tmp is not bounded")
    out = _run(tmp_path, FILL.format(count=8, folder="/tmp"), tmpfs_bytes=64 << 20)
    assert out.returncode == 3 and "No space left on device" in out.output, out.output[-2000:]


@needs_cgroups
def test_pids_max_refuses_a_fork_bomb(tmp_path, launch):
    code = """
        import os, time
        children = 0
        try:
            while children < 200:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                children += 1
        except OSError as error:
            print("refused after", children, error, flush=True)
    """
    out = _run(tmp_path, code, launch, pids_max=32)
    refused = [line for line in out.output.splitlines() if line.startswith("refused after")]
    assert refused and int(refused[0].split()[2]) < 32, out.output[-2000:]


HOG = """
    import os, time
    for _ in range({count}):
        if os.fork() == 0:
            os.setsid()
            deadline = time.monotonic() + 120
            while not os.path.exists("stop") and time.monotonic() < deadline:
                for _ in range(100_000):
                    pass
            os._exit(0)
    open("ready", "w").close()
    while not os.path.exists("stop"):
        time.sleep(0.1)
"""
NEIGHBOUR = """
    import time
    start = time.perf_counter()
    total = 0
    for i in range(4_000_000):
        total += i * i
    print("seconds", time.perf_counter() - start)
"""


def _neighbour(tmp_path: Path, user: int, isolate, limits: dict) -> float:
    out = _run(tmp_path, NEIGHBOUR, isolate=isolate, user=user, **limits)
    assert out.returncode == 0, out.output[-2000:]
    return float(out.output.split("seconds")[-1])


@contextlib.contextmanager
def _hog(tmp_path: Path, user: int, isolate, limits: dict):
    """A sandbox of 8 busy setsid processes, busy while the block runs."""
    work = tmp_path / f"hog-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    (work / "main.py").write_text(textwrap.dedent(HOG.format(count=8)))
    hog = threading.Thread(target=sandbox.run, args=([sys.executable, "main.py"], work),
                           kwargs={"env": ENV, "isolate": isolate,
                                   "limits": sandbox.Limits(wall_seconds=120, user=user, **limits)})
    hog.start()
    try:
        deadline = time.monotonic() + 30
        while not (work / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (work / "ready").exists(), "the hog did not start"
        time.sleep(0.2)
        yield
    finally:
        (work / "stop").touch()
        hog.join(timeout=60)


def _beside_hog(tmp_path: Path, repeats: int, isolate, limits: dict) -> tuple[float, float]:
    """The neighbour's median seconds alone and beside a hog, timed in turns, so that the rest of the
    machine's load weighs on both alike."""
    hog_user, user = sandbox.users(2)
    alone, beside = [], []
    for _ in range(repeats):
        alone.append(_neighbour(tmp_path, user, isolate, limits))
        with _hog(tmp_path, hog_user, isolate, limits):
            beside.append(_neighbour(tmp_path, user, isolate, limits))
    return statistics.median(alone), statistics.median(beside)


@needs_cgroups
def test_every_run_gets_the_same_cpu_share_however_many_processes_it_runs(tmp_path):
    """The mechanism the timing below rests on: a hog of 8 busy processes sits in a cgroup of its own,
    all 8 in it, with the CPU weight of the setting, the same as a neighbour's of one process."""
    hog_user, _ = sandbox.users(2)
    with _hog(tmp_path, hog_user, bool(ISOLATION), {"cpu_weight": 100}):
        groups = [g for folder, _ in SUPPORT.parents for g in _ours(folder)]
        assert groups, "the hog's run has no cgroup"
        weights = {}
        for group in groups:
            for name in ("cpu.shares", "cpu.weight"):
                if (group / name).exists():
                    weights[group] = int((group / name).read_text())
            if (group / "cgroup.procs").exists() and (group / "pids.max").exists():
                assert len((group / "cgroup.procs").read_text().split()) >= 9, "the hog's processes are not all in its cgroup"
        assert weights and set(weights.values()) == {1024 if SUPPORT.version == "v1" else 100}, weights


@pytest.mark.bench  # a speed property: shown by `make bench` (which runs the tests marked bench), not asserted in `make test`
def test_cpu_weight_keeps_an_honest_neighbour_near_its_time_alone(tmp_path):
    """Beside a hog of 8 busy processes, a one-process job keeps within 1.5x of its time alone: each
    sandbox's cgroup gets the same share, however many processes it runs. The machine is shared
    (two cores here), so a noisy first try is measured once more."""
    isolate = bool(ISOLATION)
    for attempt in range(2):
        alone, beside = _beside_hog(tmp_path, 3, isolate, {})
        print(f"neighbour alone {alone:.2f} s, beside the hog {beside:.2f} s")
        if beside <= 1.5 * alone:
            return
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 2 * cores:  # others' work decides the times, not the sandboxes' weights
        pytest.skip(f"the machine is too busy to time (load {load:.1f} on {cores} cores): "
                    f"the neighbour took {beside:.2f} s beside the hog, {alone:.2f} s alone")
    pytest.fail(f"the neighbour took {beside:.2f} s beside the hog, {alone:.2f} s alone")


def _ours(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"run-{os.getpid()}-*")) if folder.is_dir() else []


@needs_cgroups
def test_cgroups_are_removed_and_leftovers_killed(tmp_path):
    """After a run its cgroup is gone, and so is a setsid daemon it left behind (not isolated: no PID
    namespace takes it with it; the cgroup does)."""
    marker = f"gpucourse-cgroup-daemon-{uuid.uuid4().hex}"
    code = f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"], start_new_session=True)
        print("started", flush=True)
    """
    out = _run(tmp_path, code, isolate=False)
    assert "started" in out.output
    assert not [p for p in Path("/proc").glob("[0-9]*") if _cmdline_has(p, marker)], "a setsid daemon outlived the run"
    _run(tmp_path, "print('hello')")
    assert not [path for parent, _ in SUPPORT.parents for path in _ours(parent)]


def _cmdline_has(process: Path, marker: str) -> bool:
    try:
        return marker in (process / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def test_without_cgroups_the_run_goes_on_and_says_why(tmp_path, monkeypatch):
    """Where cgroups are missing the run keeps its rlimits, and ``describe()`` says what is missing."""
    missing = cgroups.Support("", missing=("cgroups need the grader to run as root",))
    monkeypatch.setattr(cgroups, "probe", lambda: missing)
    work = tmp_path / "work"
    work.mkdir()
    (work / "main.py").write_text("print('hello')")
    out = sandbox.run([sys.executable, "main.py"], work, env=ENV, isolate=False)
    assert (out.returncode, out.output.strip(), out.cgroup) == (0, "hello", "")
    assert "no cgroup limits (cgroups need the grader to run as root)" in ISOLATION.describe()
    assert "rlimits" in ISOLATION.describe()


@needs_cgroups
def test_a_limit_the_kernel_refuses_is_noted_and_the_run_goes_on(tmp_path):
    """A CPU quota below the kernel's least (1 ms per 100 ms period): no cgroup, a note, the run as before."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "main.py").write_text("print('hello')")
    out = sandbox.run([sys.executable, "main.py"], work, env=ENV, isolate=False, limits=sandbox.Limits(cpu_quota=0.001))
    assert (out.returncode, out.output.strip(), out.cgroup) == (0, "hello", "")
    assert any(note.startswith("no cgroup for this run") for note in out.notes), out.notes
    assert not [path for parent, _ in SUPPORT.parents for path in _ours(parent)]

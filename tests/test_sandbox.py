"""autograders/sandbox.py: limits always; isolation by namespaces as root, by bubblewrap otherwise.

Isolated tests run with this user's method (``sandbox.probe()``); as root, one test runs this file again
as an ordinary user (a free uid, as an instructor's account), where the method is bubblewrap. They skip
where isolation is missing, unless ``GPUCOURSE_REQUIRE_ISOLATION=1`` (set by `.ci/run` when CI=true)
makes that a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

import reachable
from autograders import sandbox, sandbox_view
from conftest import REQUIRE_ISOLATION, REQUIRE_ISOLATION_ENV, ROOT, SECRETS_ENV, planted_secrets

pytestmark = pytest.mark.slow  # starts isolated sandboxes, as root and as an ordinary user: `make test`, not `make test-fast`

ISOLATION = sandbox.probe()
REQUIRED = REQUIRE_ISOLATION


def _missing(what: str) -> None:
    """Skip, or fail where isolation is required (CI)."""
    if REQUIRED:
        pytest.fail(f"GPUCOURSE_REQUIRE_ISOLATION=1 but {what}")
    pytest.skip(what)


@pytest.fixture
def isolated():
    if not ISOLATION:
        _missing(ISOLATION.describe())


needs_isolation = pytest.mark.usefixtures("isolated")  # isolate=True parameters: checked in _run
# What the sandboxed code gets, as the engine gives it; one thread, so that a preloaded Python may fork.
ENV = {"PATH": os.defpath, "LANG": "C.UTF-8", **sandbox.ONE_THREAD_ENV}


@pytest.fixture(scope="module")
def server():
    if sys.platform != "linux":
        pytest.skip("the sandbox forks from a preloaded Python on Linux only (elsewhere it starts Python)")
    with contextlib.closing(sandbox.Preloaded(ENV)) as preloaded:
        assert preloaded.usable(), preloaded.why
        yield preloaded


@pytest.fixture(params=["started", "forked"])
def launch(request):
    """Every guarantee holds both for a Python started per run and for one forked from a preloaded one."""
    return request.getfixturevalue("server") if request.param == "forked" else None


def _run(tmp_path: Path, code: str, launch=None, *, isolate=None, hide=(), env=ENV, **limits):
    if isolate and not ISOLATION:
        _missing(ISOLATION.describe())
    work = tmp_path / f"work-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    (work / "main.py").write_text(textwrap.dedent(code))
    settings = {"wall_seconds": 60, **limits}
    out = sandbox.run([sys.executable, "main.py"], work, hide=list(hide), env=env,
                      limits=sandbox.Limits(**settings), isolate=isolate, preloaded=launch)
    # bubblewrap starts the program it confines: a preloaded Python cannot fork into it
    assert out.forked == (launch is not None and out.isolation != "bwrap")
    return out


def _alive(marker: str) -> bool:
    for entry in Path("/proc").iterdir():
        try:
            if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                return True
        except OSError:
            continue
    return False


@pytest.mark.parametrize("isolate", [False, True])
def test_runs_code_and_captures_output(tmp_path, isolate, launch):
    out = _run(tmp_path, "print('hello'); import sys; sys.exit(3)", launch, isolate=isolate)
    assert (out.returncode, out.output.strip(), out.isolated) == (3, "hello", isolate)
    assert out.isolation == (ISOLATION.method if isolate else "")


@pytest.mark.parametrize("isolate", [False, True])
def test_infinite_loop_that_ignores_signals_is_killed(tmp_path, isolate, launch):
    code = """
        import signal
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        while True:
            pass
    """
    out = _run(tmp_path, code, launch, isolate=isolate, wall_seconds=3)
    assert out.timed_out and out.returncode is None


@pytest.mark.parametrize("isolate", [False, True])
def test_children_die_with_the_run(tmp_path, isolate, launch):
    marker = f"gpucourse-orphan-{uuid.uuid4().hex}"
    code = f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"])
        print("started")
    """
    out = _run(tmp_path, code, launch, isolate=isolate)
    assert "started" in out.output
    time.sleep(0.5)
    assert not _alive(marker), "a child outlived the run"


@needs_isolation
def test_escaped_daemon_dies_with_the_namespace(tmp_path, launch):
    marker = f"gpucourse-daemon-{uuid.uuid4().hex}"
    code = f"""
        import os, subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"], start_new_session=True)
    """
    _run(tmp_path, code, launch, isolate=True)
    time.sleep(0.5)
    assert not _alive(marker), "a setsid daemon outlived the namespace"


@pytest.mark.parametrize("isolate", [False, True])
def test_memory_blowup_fails_inside(tmp_path, isolate, launch):
    # a forked Python has torch and Lightning mapped already (~4 GB of address space): the limit counts them
    memory = (2 << 30) if launch is None else (6 << 30)
    out = _run(tmp_path, "x = bytearray(40 << 30)\nprint('allocated')", launch, isolate=isolate, memory_bytes=memory)
    assert out.returncode not in (0, None) and "MemoryError" in out.output and "allocated" not in out.output


@pytest.mark.parametrize("isolate", [False, True])
def test_output_flood_is_cut(tmp_path, isolate, launch):
    code = "import sys\nfor _ in range(50):\n    sys.stdout.write('x' * (1 << 20))\n"
    out = _run(tmp_path, code, launch, isolate=isolate, output_bytes=1000)
    assert out.output_bytes >= 50 << 20 and len(out.output) == 1000 and out.truncated
    assert any("output cut" in n for n in out.notes)


@needs_isolation
def test_fork_bomb_is_bounded(tmp_path, launch):
    code = """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """
    out = _run(tmp_path, code, launch, isolate=True, wall_seconds=5, processes=64)
    assert out.timed_out
    time.sleep(0.5)
    # the machine is fine: this test process can still start one
    assert _run(tmp_path, "print('still fine')", launch, isolate=True).output.strip() == "still fine"


def test_sandboxes_at_once_each_have_their_own_processes(tmp_path):
    """A fork bomb at its process limit in one sandbox; a sandbox running beside it, as the grader's
    other worker would, still starts its threads and processes (its own user: sandbox.users)."""
    if sandbox.probe().method != "namespaces":
        pytest.skip("one user per sandbox needs root (namespaces); bubblewrap maps every sandbox to your user")
    bomber, neighbour = sandbox.users(2)
    assert bomber != neighbour
    bomb = threading.Thread(target=_run, args=(tmp_path, """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """), kwargs={"isolate": True, "wall_seconds": 8, "processes": 64, "user": bomber})
    bomb.start()
    time.sleep(3)  # the bomb is at its limit by now
    out = _run(tmp_path, """
        import os, subprocess, sys, threading
        threads = [threading.Thread(target=len, args=("x",)) for _ in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(subprocess.run([sys.executable, "-c", "print(os.getuid())".replace("os.", "__import__('os').")],
                             capture_output=True, text=True).stdout.strip(), os.getuid())
    """, isolate=True, processes=64, user=neighbour)
    bomb.join()
    assert out.returncode == 0, out.output
    assert out.output.split()[-2:] == [str(neighbour)] * 2


def test_sandbox_users_are_free_ids():
    import pwd

    users = sandbox.users(4)
    assert sandbox_view.NOBODY not in users and len(set(users)) == 4
    for uid in users:
        with pytest.raises(KeyError):
            pwd.getpwuid(uid)
    assert sandbox.users(2) == users[:2], "this process's claims are reused, not claimed again"


def test_the_runs_environment_keeps_pyarrows_import_to_one_thread():
    """``import pyarrow`` (which pandas does wherever pyarrow is installed) starts the background thread of
    its jemalloc, and a preloaded Python with two threads is not forked (``worker.forking.fork_safe``):
    every run would start Python instead. The runs' environment (``sandbox.ONE_THREAD_ENV``) turns it off."""
    import subprocess
    import sys

    pytest.importorskip("pyarrow")
    code = "import os, pyarrow; print(len(os.listdir('/proc/self/task')))"
    threads = {}
    for name, env in (("without", {"PATH": os.defpath, "OMP_NUM_THREADS": "1"}), ("with", ENV)):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        threads[name] = int(out.stdout)
    assert threads == {"without": 2, "with": 1}, threads


def test_another_grader_on_the_machine_gets_other_users():
    """Two graders at once (a second `make grade`, the suite's parallel workers) never share a user:
    RLIMIT_NPROC is per user, so a fork bomb in one would leave the other no process to start."""
    import subprocess
    import sys

    mine = sandbox.users(2)
    other = subprocess.run([sys.executable, "-c", "from autograders import sandbox; print(*sandbox.users(2))"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr
    theirs = [int(uid) for uid in other.stdout.split()]
    assert len(theirs) == 2 and not set(theirs) & set(mine), (mine, theirs)


@needs_isolation
def test_no_network_and_no_view_of_the_grader(tmp_path, launch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = f"""
            import os, signal, socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=3)
                print("reached the grader's loopback")
            except OSError as error:
                print("no route:", type(error).__name__)
            with socket.socket() as own:  # its own loopback is up: gloo's ranks meet on 127.0.0.1
                own.bind(("127.0.0.1", 0))
                own.listen()
                socket.create_connection(own.getsockname(), timeout=3).close()
                print("own loopback up")
            for pid in {[os.getpid()] + ([launch._process.pid] if launch else [])}:  # the grader, the preloaded Python
                try:
                    os.kill(pid, signal.SIGKILL)
                    print("killed the grader")
                except (ProcessLookupError, PermissionError) as error:
                    print("cannot signal:", type(error).__name__)
            print("uid", os.getuid(), "pid", os.getpid())
        """
        out = _run(tmp_path, code, launch, isolate=True)
    assert "no route" in out.output and "reached" not in out.output
    assert "own loopback up" in out.output, out.output[-2000:]
    assert "cannot signal" in out.output and "killed" not in out.output
    assert "uid 65534" in out.output


@needs_isolation
def test_hidden_folders_and_environment(tmp_path, monkeypatch, launch):
    secret = tmp_path / "secrets"
    secret.mkdir()
    (secret / "hidden_tests.py").write_text("ANSWER = 42")
    monkeypatch.setenv("GPUCOURSE_GRADER_SECRET", "do-not-leak")
    code = f"""
        import os
        print("exists:", os.path.exists({str(secret / 'hidden_tests.py')!r}))
        print("env:", os.environ.get("GPUCOURSE_GRADER_SECRET"))
        print("tmp:", sorted(os.listdir("/tmp")))
    """
    out = _run(tmp_path, code, launch, isolate=True, hide=[secret], env=ENV)
    assert "exists: False" in out.output and "env: None" in out.output
    # the namespace's /tmp is empty but for the way to the interpreter, when a checkout lives in /tmp
    assert "pytest-of" not in out.output and str(tmp_path.parts[2]) not in out.output.split("tmp:")[1]


@needs_isolation
def test_only_the_allow_list_is_visible(tmp_path, launch):
    """Secrets beside the checkout, inside it and elsewhere outside /tmp, and the package's answer key,
    are absent from the sandbox wherever the checkout lives (nothing is hidden by a list of folders:
    the sandbox's root holds only ``sandbox_view.visible()``); the interpreter and the package still work."""
    import gpucourse

    package = Path(gpucourse.__file__).resolve().parent
    key = package / "checks" / "self_check.json"
    planted = not key.exists()
    if planted:  # `make release` writes it; the test plants one where it would be
        key.write_text('{"salt": "x", "answers": {}}')
    # Run as an ordinary user (test_isolated_for_an_ordinary_user), this test cannot write beside the checkout:
    # the root run plants the secrets there and names them in SECRETS_ENV, readable by anyone.
    given = planted_secrets()
    secrets = given or _plant_secrets()
    try:
        readable = [*(str(f / "answers.txt") for f in secrets), *(str(package / name) for name in sandbox_view.ANSWER_FILES),
                    str(ROOT / "README.md"), str(ROOT / "autograders" / "engine.py")]
        code = f"""
            import json, os
            found = {{}}
            for path in {readable!r}:
                try:
                    found[path] = open(path).read()[:20]
                except OSError as error:
                    found[path] = None
            import gpucourse.checks.self_check
            print("imported:", gpucourse.__file__ == {str(package / '__init__.py')!r})
            print("found:", json.dumps(found))
        """
        out = _run(tmp_path, code, launch, isolate=True)
        assert "imported: True" in out.output, out.output
        found = json.loads(out.output.split("found:", 1)[1])
        assert found == {path: None for path in readable}, found
    finally:
        if not given:
            for folder in secrets:
                shutil.rmtree(folder, ignore_errors=True)
        if planted:
            key.unlink()


def _plant_secrets() -> list[Path]:
    """Folders holding an answers.txt anyone may read: beside the checkout, inside it, and in /var/tmp."""
    secrets = [ROOT.parent / f"gpucourse-secret-{uuid.uuid4().hex[:8]}", ROOT / f"gpucourse-secret-{uuid.uuid4().hex[:8]}",
               Path(tempfile.mkdtemp(prefix="gpucourse-secret-", dir="/var/tmp"))]
    for folder in secrets:
        folder.mkdir(exist_ok=True)
        (folder / "answers.txt").write_text("the answers")
        folder.chmod(0o755)
        (folder / "answers.txt").chmod(0o644)
    return secrets


def test_the_allow_list_is_one_list_without_answers():
    """What a sandbox sees is ``visible()``: no folder that holds the checkout or a user's home, and
    the package shown is a copy without the answer files."""
    import gpucourse

    package = Path(gpucourse.__file__).resolve().parent
    shown = dict(sandbox_view.visible())
    assert shown[str(package)] != str(package)
    assert not any((Path(shown[str(package)]) / name).exists() for name in sandbox_view.ANSWER_FILES)
    worker = Path(shown[str(sandbox_view.GRADER)])  # the grader's folder, as a copy of its worker alone
    assert worker != sandbox_view.GRADER and (worker / "worker" / "runner.py").is_file()
    assert sorted(p.name for p in worker.iterdir()) == ["__init__.py", "worker"]
    assert not list(worker.rglob("checks")) and not list(worker.rglob("engine.py"))
    for inside in shown:
        assert not ROOT.is_relative_to(inside) or inside == str(ROOT), f"{inside} shows the checkout around the package"
        assert inside not in ("/", "/home", "/root", "/tmp", "/work", "/var")


def test_environment_is_scrubbed_without_isolation(tmp_path, monkeypatch, launch):
    monkeypatch.setenv("GPUCOURSE_GRADER_SECRET", "do-not-leak")
    out = _run(tmp_path, "import os; print(os.environ.get('GPUCOURSE_GRADER_SECRET'))", launch, isolate=False)
    assert out.output.strip() == "None"


def test_needed_folders_under_masked_or_closed_paths_are_bound_back(tmp_path):
    """A checkout in /tmp (masked by the namespace's own /tmp) or a Python under /root (closed to
    others) must stay reachable; a folder that is neither is left alone."""
    closed = tmp_path / "closed"
    (closed / "python").mkdir(parents=True)
    closed.chmod(0o700)
    before, after = reachable.keep_reachable([Path("/tmp/checkout/.venv"), closed / "python", Path("/usr/lib")], masked=["/tmp"])
    assert "mount --bind /tmp/checkout/.venv /dev/shm/keep0" in before
    assert "mount --bind /dev/shm/keep0 /tmp/checkout/.venv" in after
    ancestor = reachable.blocking_ancestor(closed / "python")
    assert ancestor is not None and (closed / "python").is_relative_to(ancestor)
    assert f"mount -t tmpfs -o mode=0755 gpucourse-veil {ancestor}" in after
    assert f"mount --bind /dev/shm/keep1 {closed / 'python'}" in after
    assert not any("keep2 /usr/lib" in line for line in after) and "umount /dev/shm/keep2" in after


@pytest.mark.parametrize("isolate", [False, True])
def test_files_outside_the_work_folder_are_read_only(tmp_path, isolate, launch):
    """Isolated, the code cannot write where the grader's user can (as ``nobody`` or an ordinary user, or on a read-only root)."""
    outside = Path(tempfile.mkdtemp(prefix="gpucourse-outside-", dir="/var/tmp"))
    try:
        code = f"""
            import pathlib
            try:
                pathlib.Path({str(outside / 'planted.py')!r}).write_text("x = 1")
                print("wrote outside")
            except OSError as error:
                print("refused:", type(error).__name__)
            pathlib.Path("inside.txt").write_text("ok")
            print("inside:", pathlib.Path("inside.txt").read_text())
        """
        out = _run(tmp_path, code, launch, isolate=isolate)
        assert "inside: ok" in out.output
        assert ("refused" in out.output) == isolate and ("wrote outside" in out.output) == (not isolate), out.output
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def test_probe_says_what_is_missing_and_how_to_get_it(monkeypatch):
    sandbox.probe.cache_clear()
    try:
        monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
        monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
        isolation = sandbox.probe()
        assert not isolation and "apt-get install bubblewrap" in isolation.describe()
        sandbox.probe.cache_clear()
        monkeypatch.setattr(sandbox.shutil, "which", lambda name: "/usr/bin/" + name)
        monkeypatch.setattr(sandbox.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, b"", b"denied"))
        monkeypatch.setattr(sandbox, "_first_line", lambda path: "0" if path.endswith("unprivileged_userns_clone") else "")
        assert "sysctl -w kernel.unprivileged_userns_clone=1" in sandbox.probe().describe()
    finally:
        sandbox.probe.cache_clear()


@needs_isolation
def test_process_limit_at_start_is_explained(tmp_path, launch):
    """Under bubblewrap the process limit counts the grader's whole account: where that stops the sandbox
    starting, the outcome says so and what to do (the instructor reads it), not only bubblewrap's words."""
    if ISOLATION.method != "bwrap":
        pytest.skip("bubblewrap's start under the account's process limit: run as an ordinary user "
                    "(test_isolated_for_an_ordinary_user)")
    out = _run(tmp_path, "print('started')", launch, isolate=True, processes=1)  # this pytest is one already
    assert out.returncode and "started" not in out.output, out
    assert out.output.startswith(sandbox.BWRAP_NO_PROCESS), out.output
    assert any("process limit (1, RLIMIT_NPROC)" in note and "SandboxLimits.processes" in note
               for note in out.notes), out.notes


# As an ordinary user, the isolation guarantees, each once: a preloaded Python cannot fork into bubblewrap, so the
# "forked" runs repeat the "started" ones, and the resource limits do not depend on the account.
ISOLATION_TESTS = ("not ordinary_user and started and not False and not infinite_loop and not memory_blowup "
                   "and not output_flood")


def test_isolated_for_an_ordinary_user(tmp_path):
    """This file again as an ordinary user (an instructor's account without root): bubblewrap isolates.

    The user is a free uid claimed as the grader claims its sandboxes' (``sandbox.users``), not ``nobody``:
    the other tests' sandboxes run as ``nobody`` at the same time, and RLIMIT_NPROC, which bubblewrap's
    runs share with their account, would count their threads too. The interpreter lives under /root here
    (closed to others): a mount namespace shows that user the folder alone, as ``tests/reachable.py``'s
    ``keep_reachable`` puts it together.
    """
    if os.geteuid() != 0:
        pytest.skip("the other tests run as this ordinary user already")
    if not (shutil.which("bwrap") and shutil.which("unshare") and shutil.which("setpriv")):
        _missing("bubblewrap (apt-get install bubblewrap), unshare and setpriv are needed to test it as an "
                 "ordinary user")
    user = sandbox.users(1)[0]
    home = Path(tempfile.mkdtemp(prefix="gpucourse-ordinary-"))
    secrets = _plant_secrets()  # that user cannot write beside the checkout; the allow-list test reads these
    try:
        os.chown(home, user, user)
        before, after = reachable.keep_reachable(reachable.needed_folders(), masked=[])
        pytest_args = ["-m", "pytest", str(ROOT / "tests" / "test_sandbox.py"), "-q", "-p", "no:cacheprovider",
                       "-k", ISOLATION_TESTS, f"--basetemp={home / 'pytest'}", "--rootdir", str(ROOT)]
        script = ["set -e", "mount --make-rprivate /", *before, *after,
                  "mount -t tmpfs -o mode=1777 gpucourse-shm /dev/shm",
                  "exec setpriv --reuid={0} --regid={0} --clear-groups --inh-caps=-all -- {1}".format(
                      user, " ".join(map(shlex.quote, [sys.executable, *pytest_args])))]
        env = {"PATH": os.defpath, "HOME": str(home), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
               REQUIRE_ISOLATION_ENV: "1", "GPUCOURSE_OFFLINE": "1", "OMP_NUM_THREADS": "1",
               SECRETS_ENV: os.pathsep.join(map(str, secrets))}
        done = subprocess.run(["unshare", "--mount", "--", "sh", "-c", "\n".join(script)], cwd=home, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert "skipped" not in done.stdout.splitlines()[-1], done.stdout[-4000:]
    finally:
        shutil.rmtree(home, ignore_errors=True)
        for folder in secrets:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("isolate", [False, True])
def test_passed_descriptor_reaches_the_code(tmp_path, isolate, launch):
    """The engine's results pipe (``pass_fds``) crosses every way of starting the code."""
    if isolate and not ISOLATION:
        _missing(ISOLATION.describe())
    read_end, write_end = os.pipe()
    work = tmp_path / f"work-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    (work / "main.py").write_text(f"import os\nos.write({write_end}, b'through the pipe')\n")
    out = sandbox.run([sys.executable, "main.py"], work, env=ENV, limits=sandbox.Limits(wall_seconds=60),
                      isolate=isolate, pass_fds=(write_end,), preloaded=launch)
    with os.fdopen(read_end, "rb") as pipe:
        assert pipe.read() == b"through the pipe", out.output

"""What a sandbox sees of this machine: one allow-list (``visible()``), and the commands that build a
sandbox's root from it and nothing else. ``sandbox.run`` starts every isolated run with one of them.

- ``namespaces`` (the grader is root): ``autograders.namespaces`` enters new namespaces, runs
  ``_mount_script``, which puts the root together at ROOT_MOUNT from ``visible()`` alone
  (``_root_script``), and the code runs there (``chroot``) as the sandbox's user: in a preloaded
  Python's child (autograders/preload.py), or before a program that a run starts (``_isolated_command``).
- ``bwrap`` (any user): ``_bwrap_command``, bubblewrap's namespaces (``_bwrap_base``, which
  ``sandbox.probe`` tries too) over an empty root holding ``visible()`` read-only.

Either way a ``hide`` folder that lies inside a visible one is covered by an empty tmpfs (``_hidden``),
the sandbox has its own /proc, /dev, /tmp and /dev/shm, and its working folder is /mnt.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

NOBODY = 65534  # the user sandboxed code runs as (bubblewrap's inside, sandbox.Limits' default, preload's children)


# --- what a sandbox sees: this allow-list, and nothing else ------------------------------------------

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")  # programs, libraries, settings
# Files of the package derived from the answers: never in a sandbox (the self-check key's salted hashes
# give every quiz answer to a loop over the letters).
ANSWER_FILES = ("checks/self_check.json",)
ROOT_MOUNT = "/dev/shm"  # where the sandbox's root is put together, inside its own mount namespace


def _package() -> Path:
    import gpucourse

    return Path(gpucourse.__file__).resolve().parent


@functools.cache
def _package_copy() -> Path:
    """The course's package without ANSWER_FILES: a copy made once per grader, shown to every sandbox
    at the package's own path (modules a preloaded Python imported keep their paths)."""
    import atexit
    import tempfile

    package = _package()
    folder = Path(tempfile.mkdtemp(prefix="gpucourse-package-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    answers = {package / name for name in ANSWER_FILES}
    copy = folder / package.name
    shutil.copytree(package, copy, ignore=lambda where, names: [n for n in names if Path(where, n) in answers])
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


GRADER = Path(__file__).resolve().parent  # autograders/
# where ``_isolated_command``'s Python starts: ``-m`` looks in its working folder first, so the grader's
# checkout, never the run's folder (it moves to /mnt, the run's folder, inside its new root)
ISOLATED_CWD = GRADER.parent
# The grader's files a sandbox sees: its package's docstring and the sandbox-side worker (the runner,
# its supervisor, the zygote), nothing secret. Never the hidden checks, the engine or the gradebook.
WORKER_FILES = ("__init__.py", "worker")


@functools.cache
def _worker_copy() -> Path:
    """``autograders/`` as a sandbox sees it: a copy of WORKER_FILES alone, made once per grader and
    shown at the package's own path (the sandbox imports ``autograders.worker`` from there)."""
    import atexit
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="gpucourse-worker-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    copy = folder / GRADER.name
    copy.mkdir()
    for name in WORKER_FILES:
        source = GRADER / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, copy / name)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


def visible() -> list[tuple[str, str]]:
    """Everything a sandbox sees of this machine, as (path inside, source outside): the system's
    programs and libraries, the interpreter, its venv, the package (a copy without ANSWER_FILES),
    the grader's worker (a copy of WORKER_FILES at autograders/'s own path).
    Nothing else: not the checkout around them, its neighbours, /home, /root or /tmp (the sandbox
    has its own /tmp, /dev/shm and /proc, and its working folder at /mnt)."""
    shown = [(path, path) for path in SYSTEM if os.path.lexists(path)]
    package = _package()
    for folder in (Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()):
        if not any(folder == Path(p) or folder.is_relative_to(p) for p, _ in shown):
            shown.append((str(folder), str(folder)))
    shown.append((str(package), str(_package_copy())))
    shown.append((str(GRADER), str(_worker_copy())))
    return shown


def _hidden(hide) -> list[Path]:
    """The ``hide`` folders that lie inside a visible folder, but for one that ``visible()`` shows as a
    copy of its own (autograders/: the copy holds the worker alone)."""
    shown = visible()
    copies = {Path(inside) for inside, source in shown if inside != source}
    found = [Path(p).resolve() for p in hide]
    return [p for p in found if p.is_dir() and p not in copies and any(p.is_relative_to(inside) for inside, _ in shown)]


# --- the commands that build a sandbox's root from that list alone -----------------------------------

def _root_script(workdir: Path, hide: list[Path], tmpfs_bytes: int = 0) -> list[str]:
    """Shell lines, run as root in the new mount namespace, that put the sandbox's root together at
    ROOT_MOUNT from ``visible()`` alone; the caller then changes root to it (``chroot``). A folder in
    ``hide`` that lies inside a visible one is covered too. Its own /tmp and /dev/shm hold at most
    ``tmpfs_bytes`` each (0: half the machine's memory, the kernel's default)."""
    root = ROOT_MOUNT
    size = f",size={tmpfs_bytes}" if tmpfs_bytes else ""
    script = [f"mount -t tmpfs -o mode=0755 gpucourse-root {root}"]
    # The sandbox's own /proc, /dev, /tmp and /sys first: a visible folder that lies below one of them (a
    # checkout under /tmp, as CI's may be) is then bound inside it instead of being covered by it.
    script += [f"mkdir {root}/proc {root}/dev {root}/tmp {root}/mnt {root}/sys",
               f"mount -t proc -o nosuid,noexec,nodev proc {root}/proc",
               f"mount --bind /dev {root}/dev",  # devices; not /dev/shm or /dev/pts mounted below it
               f"mount -t tmpfs -o mode=1777{size} gpucourse-shm {root}/dev/shm",
               f"mount --bind /sys {root}/sys",
               f"mount -t tmpfs -o mode=1777{size} gpucourse-tmp {root}/tmp"]
    for inside, source in visible():
        target, quoted = shlex.quote(root + inside), shlex.quote(source)
        if os.path.islink(source) and inside == source:  # /bin -> usr/bin: the same link
            script += [f"mkdir -p {shlex.quote(str(Path(root + inside).parent))}",
                       f"ln -s {shlex.quote(os.readlink(source))} {target}"]
        elif os.path.isdir(source):
            script += [f"mkdir -p {target}", f"mount --bind {quoted} {target}"]
    for path in _hidden(hide):
        script.append(f"mount -t tmpfs -o size=1m,mode=0755 gpucourse-hidden {shlex.quote(root + str(path))}")
    script.append(f"mount --bind {shlex.quote(str(workdir.resolve()))} {root}/mnt")
    return script


def _mount_script(workdir: Path, hide: list[Path], tmpfs_bytes: int = 0) -> list[str]:
    """Shell lines run as root inside the new namespaces (whose loopback ``namespaces.isolate`` has
    brought up): the PID namespace's own /proc (what ``unshare --mount-proc`` does), then the sandbox's
    root from ``visible()`` alone (``_root_script``) at ROOT_MOUNT, which the caller makes the root."""
    script = ["set -e", "mount --make-rprivate /", "mount -t proc -o nosuid,noexec,nodev proc /proc"]
    return script + _root_script(workdir, hide, tmpfs_bytes)


def _isolated_command(command: list[str], workdir: Path, hide: list[Path], user: int, processes: int,
                      tmpfs_bytes: int = 0) -> list[str]:
    """Wrap ``command``: ``autograders.namespaces`` enters new namespaces, runs ``_mount_script``, makes its
    root the root and becomes ``user`` (``sandbox.Limits.user``) in /mnt of it, with at most ``processes``
    (RLIMIT_NPROC, set after dropping to that user), then runs ``command``: the steps a preloaded Python's
    child takes (autograders/preload.py). Start it in ``ISOLATED_CWD``."""
    settings = {"script": "\n".join(_mount_script(workdir, hide, tmpfs_bytes=tmpfs_bytes)),
                "processes": processes, "user": user}
    return [sys.executable, "-m", f"{GRADER.name}.namespaces", json.dumps(settings), "--", *command]


def _bwrap_command(command: list[str], workdir: Path, hide: list[Path], tmpfs_bytes: int = 0) -> list[str]:
    """Wrap ``command`` in bubblewrap: ``_bwrap_base``'s namespaces over an empty root holding only
    ``visible()`` (read-only), its own /dev, /proc and /tmp, the work folder writable at /mnt; a
    ``hide`` folder inside a visible one under an empty tmpfs."""
    args = _bwrap_base(tmpfs_bytes)
    for inside, source in visible():
        if os.path.islink(source) and inside == source:
            args += ["--symlink", os.readlink(source), inside]
        elif os.path.isdir(source):
            args += ["--ro-bind", source, inside]
    for path in _hidden(hide):
        args += ["--tmpfs", str(path)]
    args += ["--bind", str(workdir.resolve()), "/mnt", "--chdir", "/mnt", "--"]
    return args + command


def _bwrap_base(tmpfs_bytes: int = 0) -> list[str]:
    """bubblewrap's namespaces and process settings, the same for the probe and every run; /tmp and
    /dev/shm of ``tmpfs_bytes`` each where this bubblewrap has ``--size`` (0.5.0 and later)."""
    sized = ["--size", str(tmpfs_bytes)] if tmpfs_bytes and _bwrap_sizes() else []
    return [shutil.which("bwrap") or "bwrap", "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY),
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--dev", "/dev", "--proc", "/proc", *sized, "--tmpfs", "/tmp", "--ro-bind-try", "/sys", "/sys"] + \
        ([*sized, "--tmpfs", "/dev/shm"] if sized else [])  # else /dev/shm is a folder of --dev's tmpfs


@functools.cache
def _bwrap_sizes() -> bool:
    """Whether this bubblewrap sizes its tmpfs mounts (``--size``); older ones leave them unbounded."""
    try:
        return "--size" in subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False

"""One cgroup per sandboxed run, so that the kernel bounds the run as a whole.

rlimits bound each process alone: a run's tmpfs files (its /tmp and /dev/shm) count against no
process, and 120 ``setsid`` children each get as much CPU as the honest sandbox beside them. A
cgroup bounds all of a run's processes together: its memory, tmpfs pages included (no swap, so they
cannot be pushed out of the count), its number of processes and threads, and its share of the CPU
against the other sandboxes. When the run ends, whatever is left in the cgroup is killed, even a
``setsid`` daemon of a run that was not isolated, and the cgroup is removed.

Only root can make cgroups (``probe()`` says why not elsewhere); the run then goes on with its
rlimits. Both layouts are handled:

- v2 (one unified hierarchy): a parent ``gpucourse`` at the root of the hierarchy, with the
  controllers handed down in ``cgroup.subtree_control`` (a cgroup that holds processes, such as the
  grader's own, cannot hand them down, the root can); a run's cgroup inside it.
- v1 (a hierarchy per controller): a parent ``gpucourse`` inside the grader's own cgroup of each
  hierarchy (a limit put on the grader then holds for its sandboxes too); a run's cgroup inside it.

The first process of a run joins its cgroup (``join``) between fork and exec, or, forked from a
preloaded Python, before it reads the job: its children are born inside.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")
PARENT = "gpucourse"  # the course's folder in each hierarchy; runs are run-<grader pid>-<n> inside
PERIOD_US = 100_000


@dataclass(frozen=True)
class Support:
    """Where runs' cgroups go: ``version`` "v1", "v2" or "" (none); ``parents``: (folder, controllers it
    limits) per hierarchy; ``missing``: why a controller, or all of them, cannot be used."""

    version: str
    parents: tuple[tuple[Path, frozenset[str]], ...] = ()
    missing: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.parents)

    def controllers(self) -> set[str]:
        return {c for _, cs in self.parents for c in cs}

    def describe(self) -> str:
        if not self:
            return "no cgroup limits (" + "; ".join(self.missing) + ")"
        names = {"memory": "memory incl. /tmp and /dev/shm", "pids": "processes", "cpu": "CPU share"}
        text = f"cgroup {self.version} limits: " + ", ".join(names[c] for c in CONTROLLERS if c in self.controllers())
        return text + (" (" + "; ".join(self.missing) + ")" if self.missing else "")


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(root inside the hierarchy, mount point, type, options) of each cgroup file system mounted here."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((fields[3], fields[4].replace("\\040", " "), tail[0], set(tail[2].split(","))))
    return found


def _own(controller: str | None) -> str:
    """The grader's own cgroup path in the v1 hierarchy of ``controller`` (None: the v2 one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, names, path = line.split(":", 2)
        if (controller is None and number == "0") or controller in names.split(","):
            return path
    return "/"


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _weigh(parent: Path, version: str) -> None:
    """The course's parent weighs as much as the runs in it together, so that each run competes with
    the rest of the machine as one process of its weight would: with a fixed weight the runs would
    split one share, and a sandbox's time would double as soon as a hog ran beside it on a busy machine."""
    file, least, most = ("cpu.weight", 1, 10_000) if version == "v2" else ("cpu.shares", 2, 262_144)
    total = 0
    for run in parent.glob("run-*"):
        try:
            total += int((run / file).read_text())
        except (OSError, ValueError):  # removed meanwhile, or no CPU limit
            pass
    _quietly(_write, parent / file, str(min(most, max(least, total))))


def _ensure_v2(root: Path) -> tuple[frozenset[str], list[str]]:
    """Make ``root``/gpucourse hand our controllers down; the ones it does, and why not the rest."""
    available = set((root / "cgroup.controllers").read_text().split())
    missing, usable = [], set()
    parent = root / PARENT
    parent.mkdir(exist_ok=True)
    for name in CONTROLLERS:
        if name not in available:
            missing.append(f"the {name} controller is not in {root}/cgroup.controllers (it is bound to a v1 hierarchy, "
                           "or the kernel lacks it)")
            continue
        try:
            for folder in (root, parent):
                if name not in (folder / "cgroup.subtree_control").read_text().split():
                    _write(folder / "cgroup.subtree_control", f"+{name}")
            usable.add(name)
        except OSError as error:
            busy = " (it holds processes: a container's own cgroup? only an empty one, or the root, hands controllers down)"
            missing.append(f"cannot enable {name} in {folder}/cgroup.subtree_control: {error.strerror}"
                           + (busy if error.errno == errno.EBUSY else ""))
    if "cpu" in usable:
        _weigh(parent, "v2")
    return frozenset(usable), missing


def _find() -> Support:
    if not os.path.isfile("/proc/self/mountinfo"):
        return Support("", missing=("cgroups need Linux",))
    if os.geteuid() != 0:
        return Support("", missing=("cgroups need the grader to run as root",))
    mounts = _mounts()
    for root_in, point, kind, _ in mounts:
        controllers = Path(point, "cgroup.controllers")
        if kind == "cgroup2" and controllers.is_file() and set(controllers.read_text().split()) & set(CONTROLLERS):
            usable, missing = _ensure_v2(Path(point))
            return Support("v2", ((Path(point) / PARENT, usable),) if usable else (), tuple(missing))
    parents, missing = {}, []
    for name in CONTROLLERS:
        hierarchy = next(((r, p) for r, p, kind, opts in mounts if kind == "cgroup" and name in opts), None)
        if hierarchy is None:
            missing.append(f"no cgroup file system holds the {name} controller")
            continue
        root_in, point = hierarchy
        own = _own(name)
        inside = os.path.relpath(own, root_in) if own.startswith(root_in) else "."
        parent = Path(os.path.normpath(Path(point, inside, PARENT)))
        parents.setdefault(parent, set()).add(name)
    for parent in list(parents):
        try:
            _make_v1(parent, parents[parent])
        except OSError as error:
            missing.append(f"cannot create {parent}: {error.strerror}")
            del parents[parent]
    if not parents and not missing:
        missing.append("no cgroup file system is mounted")
    return Support("v1" if parents else "", tuple((p, frozenset(cs)) for p, cs in parents.items()), tuple(missing))


def _make_v1(parent: Path, controllers) -> None:
    parent.mkdir(exist_ok=True)
    if "cpu" in controllers:
        _weigh(parent, "v1")


_LOCK = threading.Lock()  # the grader's worker threads start runs at once: one probe for all


def probe() -> Support:
    """Whether runs get cgroups here (tried once: a trial cgroup made and removed), and why not."""
    with _LOCK:
        return _probe()


@functools.cache
def _probe() -> Support:
    try:
        support = _find()
        if support:
            create_in(support, {c: None for c in CONTROLLERS}, name=f"probe-{os.getpid()}").remove()
    except OSError as error:
        return Support("", missing=(f"cannot make a cgroup: {error}",))
    return support


_COUNT = itertools.count()


class Group:
    """A run's cgroup, one folder per hierarchy."""

    def __init__(self, folders: list[Path], version: str):
        self.folders, self.version = folders, version
        self.procs = tuple(str(f / "cgroup.procs") for f in folders)  # what ``join`` writes, in the child

    def remove(self) -> None:
        """Kill whatever is left in the cgroup, then remove it (and the course's parent, once empty)."""
        deadline = time.monotonic() + 10
        for folder in self.folders:
            if (folder / "cgroup.kill").exists():  # v2, Linux 5.14: the kernel kills every process at once
                _quietly(_write, folder / "cgroup.kill", "1")
        while time.monotonic() < deadline:
            left = {pid for folder in self.folders for pid in _members(folder)}
            for pid in left:  # a fork bomb cannot outrun this: pids.max bounds it
                _quietly(os.kill, pid, signal.SIGKILL)
            if not left:
                break
            time.sleep(0.02)
        for folder in self.folders:
            while time.monotonic() < deadline:
                try:
                    folder.rmdir()  # EBUSY until the last process has exited
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
            _weigh(folder.parent, self.version)  # where it is no CPU hierarchy, the write fails quietly
            _quietly(folder.parent.rmdir)  # fails while another run's cgroup is in it
        self.folders = []  # removed: a second call does nothing


def _members(folder: Path) -> list[int]:
    try:
        return [int(pid) for pid in (folder / "cgroup.procs").read_text().split()]
    except OSError:  # removed already
        return []


def _quietly(function, *args) -> None:
    try:
        function(*args)
    except OSError:
        pass


def _settings(version: str, limits: dict[str, int | float | None]) -> dict[str, dict[str, str]]:
    """Per controller, the files to write and their values, for limits keyed by controller (None: none)."""
    memory, pids, (weight, quota) = limits.get("memory"), limits.get("pids"), limits.get("cpu") or (None, None)
    if version == "v2":
        return {"memory": {"memory.max": str(memory), "memory.swap.max": "0"} if memory else {},
                "pids": {"pids.max": str(pids)} if pids else {},
                "cpu": {**({"cpu.weight": str(weight)} if weight else {}),
                        **({"cpu.max": f"{int(quota * PERIOD_US)} {PERIOD_US}"} if quota else {})}}
    return {"memory": {"memory.limit_in_bytes": str(memory), "memory.memsw.limit_in_bytes": str(memory)} if memory else {},
            "pids": {"pids.max": str(pids)} if pids else {},
            "cpu": {**({"cpu.shares": str(max(2, weight * 1024 // 100))} if weight else {}),
                    **({"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(int(quota * PERIOD_US))}
                       if quota else {})}}


def create_in(support: Support, limits: dict, name: str) -> Group:
    """A cgroup named ``name`` with ``limits`` (see ``_settings``) in each hierarchy that has one of them;
    OSError (and nothing left behind) where the kernel refuses one."""
    folders: list[Path] = []
    files = _settings(support.version, limits)
    try:
        for parent, controllers in support.parents:
            if not controllers & set(limits):
                continue
            for attempt in range(3):  # another run may remove the empty parent meanwhile: make it again
                try:
                    (parent / name).mkdir()
                    break
                except FileNotFoundError:
                    if support.version == "v2":
                        _ensure_v2(parent.parent)
                    else:
                        _make_v1(parent, controllers)
            folders.append(parent / name)
            for controller in controllers & set(limits):
                for file, value in files[controller].items():
                    if file == "memory.memsw.limit_in_bytes" or file == "memory.swap.max":
                        _quietly(_write, parent / name / file, value)  # absent without swap accounting
                    else:
                        _write(parent / name / file, value)
            if "cpu" in controllers & set(limits):
                _weigh(parent, support.version)
    except OSError:
        Group(folders, support.version).remove()
        raise
    return Group(folders, support.version)


def create(limits) -> Group | None:
    """A cgroup for one run under ``limits`` (sandbox.Limits), or None where cgroups are not available
    (``probe()`` says why) or the run sets none of their limits (each 0: none); OSError where the
    kernel refuses a limit."""
    support = probe()
    wanted = {"memory": limits.memory_max_bytes or None, "pids": limits.pids_max or None,
              "cpu": (limits.cpu_weight or None, limits.cpu_quota or None)}
    wanted = {c: v for c, v in wanted.items() if (any(v) if isinstance(v, tuple) else v) and c in support.controllers()}
    if not wanted:
        return None
    return create_in(support, wanted, name=f"run-{os.getpid()}-{next(_COUNT)}")


def join(procs: tuple[str, ...]) -> None:
    """Put the calling process in a run's cgroup (``Group.procs``); called in the child before it runs
    anything of the student's, so every process the run starts is born inside."""
    pid = str(os.getpid()).encode()
    for path in procs:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)

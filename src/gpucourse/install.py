"""Install what the course needs and this machine lacks (Colab), never replacing its torch.

Every notebook's setup cell installs ``gpucourse`` itself with ``pip install --no-deps`` when it is
missing, so that pip cannot swap the torch build a runtime ships (Colab's matches its CUDA driver)
for another one, and then calls :func:`install_missing`: it installs only the requirements that are
not there, and leaves torch and torchvision alone even when they are older than the tested floor
(it says so in one line). Lesson 9 calls ``install_missing("darts")`` for Darts, which no other
lesson needs. On a machine set up with ``make install`` everything is present and nothing happens.

pip runs with :data:`PIP_OPTIONS`: quiet, and without the lines that read as failures on Colab but are
not. The main one is pip's "ERROR: pip's dependency resolver ... gpucourse requires torch>=..., but
you have torch ..." after installing Lightning next to an older torch: that torch is kept on purpose.

Every install time the course prints or writes (the setup cell, these messages, the student README)
comes from :data:`MEASURED`, measured by ``bench/install_times.py``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # every environment with pip has pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

# Runtimes ship these built for their own CUDA; pip must never replace them.
PROTECTED = ("torch", "torchvision")
# Quiet, no "new pip available" notice, no root-user warning (Colab runs as root), and no dependency
# conflict report: gpucourse's torch floor is knowingly not met where a runtime's older torch is kept.
PIP_OPTIONS = ("-q", "--disable-pip-version-check", "--root-user-action=ignore", "--no-warn-conflicts")


@dataclass(frozen=True)
class Measured:
    """An install step's wall time, and how it was measured (the provenance every estimate carries)."""

    seconds: float
    how: str

    def about(self) -> str:
        """The estimate as the course words it: "about 20 s", rounded up to 5 s."""
        return f"about {max(5, 5 * -(-round(self.seconds) // 5))} s"


# The one source of the course's install-time estimates (bench/install_times.py measures them): keys
# are what is installed; "gpucourse" is the setup cell's own step (the package, then Lightning).
_HOW = ("median of 3 runs of bench/install_times.py on 2026-11-25, on the course's 2-core build machine with "
        "other work running (load average 6-10): a Colab-like venv (torch, NumPy, pandas, scikit-learn present; "
        "Lightning and Darts absent), packages downloaded from PyPI, pip's cache off, the edition from a local "
        "folder (a git clone adds its own time)")
MEASURED: dict[str, Measured] = {
    "gpucourse": Measured(11.6, f"pip install --no-deps of the student edition (runs: 11.2, 11.6, 17.2 s); {_HOW}"),
    "pytorch-lightning": Measured(10.1, f"install_missing(), Lightning and what it needs (runs: 9.1, 10.1, 12.5 s); {_HOW}"),
    "darts": Measured(8.8, f"install_missing('darts'), Darts and what it needs (runs: 8.7, 8.8, 9.7 s); {_HOW}"),
}


def estimate(*names: str) -> Measured | None:
    """The measured time of installing ``names`` together (their MEASURED entries summed); None
    when one of them was never measured (the course then gives no estimate rather than a guess)."""
    found = [MEASURED.get(canonicalize_name(n)) for n in names]
    if not found or None in found:
        return None
    return Measured(sum(m.seconds for m in found), "; ".join(dict.fromkeys(m.how for m in found)))


@dataclass
class Plan:
    """What :func:`install_missing` does: ``install`` (requirement strings) and one-line ``notes``."""

    install: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    keep: dict[str, str] = field(default_factory=dict)  # protected package -> the version kept


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def requirements(extra: str | None = None, distribution: str = "gpucourse") -> list[Requirement]:
    """``distribution``'s runtime requirements (``extra=None``), or those its ``extra`` adds."""
    try:
        lines = requires(distribution) or []
    except PackageNotFoundError:  # importable without being installed (PYTHONPATH): nothing to go by
        return []
    found = []
    for line in lines:
        req = Requirement(line)
        wanted = req.marker is None or req.marker.evaluate({"extra": extra or ""})
        is_extra = req.marker is not None and "extra" in str(req.marker)
        if wanted and is_extra == (extra is not None):
            found.append(req)
    return found


def plan(extra: str | None = None, installed=_installed, distribution: str = "gpucourse") -> Plan:
    """Decide, without installing anything; ``installed(name)`` gives a version or None."""
    result = Plan(keep={name: have for name in PROTECTED if (have := installed(name)) is not None})
    older = []
    for req in requirements(extra, distribution):
        name = canonicalize_name(req.name)
        have = installed(req.name)
        if name in result.keep:
            if not req.specifier.contains(have, prereleases=True):
                older.append((req, have))
        elif have is None or not req.specifier.contains(have, prereleases=True):
            extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            result.install.append(f"{req.name}{extras}{req.specifier}")  # without the extra's marker
    if older:
        result.notes.append(f"Note: {', '.join(f'{r.name} {have}' for r, have in older)} here "
                            f"{'is' if len(older) == 1 else 'are'} older than the tested "
                            f"{', '.join(str(r) for r, _ in older)}; kept as they are (replacing a runtime's "
                            "own torch breaks its CUDA setup).")
    return result


def install_missing(extra: str | None = None, quiet: bool = False) -> None:
    """Install what ``plan(extra)`` lists, torch and torchvision pinned to the versions present."""
    todo = plan(extra)
    say = (lambda *_: None) if quiet else (lambda text: print(text, flush=True))
    for note in todo.notes:
        say(note)
    if not todo.install:
        return
    measured = estimate(*(Requirement(r).name for r in todo.install))
    kept = ", ".join(f"{name} {v}" for name, v in todo.keep.items())
    say(f"Installing {', '.join(todo.install)}" + (f" ({measured.about()})" if measured else "")
        + (f"; {kept} stay as they are" if kept else ""))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpucourse-install-") as tmp:
        pins = Path(tmp) / "keep.txt"
        pins.write_text("".join(f"{name}=={v}\n" for name, v in todo.keep.items()))
        subprocess.run([sys.executable, "-m", "pip", "install", *PIP_OPTIONS, "-c", str(pins), *todo.install], check=True)
    importlib.invalidate_caches()
    say(f"Installed in {time.perf_counter() - start:.0f} s.")

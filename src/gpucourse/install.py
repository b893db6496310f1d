"""Install what the course needs and this machine lacks (Colab), never replacing its torch.

Every notebook's setup cell installs ``gpucourse`` itself with ``pip install --no-deps`` when it is
missing, so that pip cannot swap the torch build a runtime ships (Colab's matches its CUDA driver)
for another one, and then calls :func:`install_missing`: it installs only the requirements that are
not there, and leaves torch and torchvision alone even when they are older than the tested floor
(it says so in one line). Lesson 9 calls ``install_missing("darts")`` for Darts, which no other
lesson needs. On a machine set up with ``make install`` everything is present and nothing happens.
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
# Rough install times on Colab, to tell the student how long to wait.
SECONDS = {"darts": 20, "pytorch-lightning": 15}


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
    seconds = sum(SECONDS.get(canonicalize_name(Requirement(r).name), 10) for r in todo.install)
    kept = ", ".join(f"{name} {v}" for name, v in todo.keep.items())
    say(f"Installing {', '.join(todo.install)} (about {seconds} s)" + (f"; {kept} stay as they are" if kept else ""))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpucourse-install-") as tmp:
        pins = Path(tmp) / "keep.txt"
        pins.write_text("".join(f"{name}=={v}\n" for name, v in todo.keep.items()))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-c", str(pins), *todo.install], check=True)
    importlib.invalidate_caches()
    say(f"Installed in {time.perf_counter() - start:.0f} s.")

"""A mount namespace put together by hand, for tests/test_sandbox.py's run of itself as an ordinary user
(an instructor's account without root, where the sandbox isolates with bubblewrap): that user must still
reach the interpreter, its venv and the course's package, which may sit under /tmp or behind /root."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def blocking_ancestor(path: Path) -> Path | None:
    """The first folder on the way to ``path`` that others may not enter (e.g. /root), if any."""
    current = Path("/")
    for part in path.resolve().parts[1:]:
        current = current / part
        if current.is_dir() and not current.stat().st_mode & 0o001:
            return current
    return None


def keep_reachable(needed: list[Path], masked: list[str]) -> tuple[list[str], list[str]]:
    """Shell lines around the masking mounts so that ``nobody`` still reaches ``needed`` folders.

    A needed folder can disappear under the namespace's own /tmp (a checkout in /tmp), or sit
    behind a folder others may not enter (a Python under /root). Before anything is masked, each
    needed folder is bound aside on a scratch tmpfs; afterwards an empty tmpfs veils each closed
    ancestor (its other contents stay hidden) and every folder is bound back at its own path.
    Returns (lines to run before masking, lines to run after ``masked`` mounts are in place).
    """
    before = ["mount -t tmpfs -o mode=0700 gpucourse-keep /dev/shm"]
    after, veiled = [], set()
    for number, folder in enumerate(needed):
        keep, path = f"/dev/shm/keep{number}", shlex.quote(str(folder))
        before += [f"mkdir {keep}", f"mount --bind {path} {keep}"]
        ancestor = blocking_ancestor(folder)
        if ancestor is not None and ancestor not in veiled:
            after.append(f"mount -t tmpfs -o mode=0755 gpucourse-veil {shlex.quote(str(ancestor))}")
            veiled.add(ancestor)
        covered = ancestor is not None or any(str(folder).startswith(m.rstrip("/") + "/") for m in masked)
        if covered:
            after += [f"mkdir -p {path}", f"mount --bind {keep} {path}"]
        after.append(f"umount {keep}")
    return before, after


def needed_folders() -> list[Path]:
    """What the sandboxed Python must reach: its interpreter, its venv and the course's package."""
    import gpucourse

    folders = [Path(sys.base_prefix), Path(sys.prefix), Path(gpucourse.__file__).parent.parent]
    return list(dict.fromkeys(f.resolve() for f in folders))

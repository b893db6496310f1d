"""The sandbox's audit hook: no other hook may be added, and what only tampering does is written down.

The supervisor installs it before any worker is forked (``install``), so every worker and rank has it
from the start. It refuses ``sys.addaudithook`` (another hook would run inside every check) and any
change to itself; ``gpucourse.canary`` proves it is still the first hook. And it notes, with the cell
and line, each event that an honest answer has no need of when the cell's own code raises it:

- ``compile()``, ``exec()`` or ``eval()`` of a string or code object (a payload decoded at run time
  is how the scan of the source is got around);
- walking the interpreter's frames (``sys._getframe``, ``sys._current_frames``, ``inspect``'s
  frame functions) or every object in memory (``gc.get_objects``, ``get_referrers``, ``get_referents``);
- calling C through ``ctypes`` (from raw memory writes to ``prctl``);
- registering an at-fork hook (``os.register_at_fork``: watched by a wrapper, it has no audit event).

"The cell's own code" (or a graded rank's script, ``watch``) is the innermost frame, past the machinery that raises the event for it
(``ctypes``, ``inspect``): a library that compiles code (``dataclasses``, ``torch.compile``) or walks
frames (``logging``) is not the cell. The notes are flags for a person (``tampering``), never a score:
points come from outputs the grader checks against its own references on inputs it draws after the
cells, so a flag here is a reason to look, not a verdict.
"""

from __future__ import annotations

import os
import sys

WATCHED = {
    "compile": "compiles a string at run time (compile(), exec() or eval() of a string)",
    "exec": "runs a code object with exec() or eval()",
    "sys._getframe": "walks the interpreter's frames (sys._getframe)",
    "sys._current_frames": "reads every thread's frames (sys._current_frames)",
    "gc.get_objects": "walks every object in memory (gc.get_objects)",
    "gc.get_referrers": "walks the objects that refer to another (gc.get_referrers)",
    "gc.get_referents": "walks the objects another refers to (gc.get_referents)",
    "os.register_at_fork": "registers an at-fork hook (os.register_at_fork)",
}
MACHINERY = ("/ctypes/", "/inspect.py", __file__)  # frames that raise an event on their caller's behalf
LIMIT = 20  # notes kept per process


def _make_guard():
    found: list[str] = []
    scripts: dict[str, str] = {}  # a graded script's file -> how a note names it (``watch``)
    busy = [False]
    getframe, refuse = sys._getframe, PermissionError

    def origin(frame):
        while frame is not None and any(part in frame.f_code.co_filename for part in MACHINERY):
            frame = frame.f_back
        if frame is None:
            return None
        name = frame.f_code.co_filename
        if name.startswith("<cell "):
            return f"{name[1:-1]}, line {frame.f_lineno}"
        if name in scripts:
            return f"{scripts[name]}, line {frame.f_lineno}"
        return None

    def guard(event, args):
        if event == "sys.addaudithook":
            raise refuse("audit hooks cannot be added while grading")
        if event == "object.__setattr__" and args and args[0] is guard:
            raise refuse("the grader's audit hook cannot be changed")
        if event == "gpucourse.canary":
            raise refuse("gpucourse.canary")
        what = WATCHED.get(event) or ("calls C through ctypes" if event.startswith("ctypes.") else None)
        if what is None or busy[0] or len(found) >= LIMIT:
            return
        busy[0] = True  # sys._getframe raises an event of its own
        try:
            where = origin(getframe(1))
            note = where and f"{where}: {what}"
            if note and note not in found:
                found.append(note)
        finally:
            busy[0] = False

    return guard, found, scripts


_GUARD, _FOUND, _SCRIPTS = _make_guard()


def install() -> None:
    """The hook, once per process tree (before any worker is forked), and the at-fork wrapper."""
    if getattr(sys, "_gpucourse_guarded", False):
        return
    sys.addaudithook(_GUARD)
    sys._gpucourse_guarded = True
    real = os.register_at_fork

    def register_at_fork(**hooks):
        sys.audit("os.register_at_fork")
        return real(**hooks)

    os.register_at_fork = register_at_fork
    import posix

    posix.register_at_fork = register_at_fork


def watch(filename: str, label: str) -> None:
    """Note what the code of ``filename`` does too, named ``label`` (a graded rank's script: the
    cells' code is recognised by its ``<cell N>`` file name)."""
    _SCRIPTS[filename] = label


def findings() -> list[str]:
    """What the cells' code did that only tampering needs, since the last call (and forgets it)."""
    taken = list(_FOUND)
    _FOUND.clear()
    return taken

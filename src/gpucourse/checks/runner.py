"""The grader's sandbox side: run a submission's cells, then the observers; report plain data.

    python -m gpucourse.checks.runner RESULTS_FD < job.json

``job.json`` (read whole before any student code runs): ``{"cells": [{"source", "grade_id"}],
"observers": [{"case", "source", "function"}], "cell_seconds", "observe_seconds"}``.
RESULTS_FD receives JSON lines: one per cell (its output and error), one per observer
(``{"case", "ok", "data" | "error"}``; ``"answer": true`` when the error is a missing or mistyped
answer, whose message already says what to define), then ``{"type": "done"}``.

Why it looks like this:
- no IPython: a student cell cannot install input transformers or pre-run hooks that rewrite the
  code run after it (``get_ipython`` does not exist here);
- the modules observers rely on are snapshotted before student code runs and restored after every
  cell, so patching ``os.getpid``, ``json.dumps``, ``builtins`` or a course helper reaches neither
  the runner nor the observers;
- observations leave as JSON, never pickle; judging happens in the grader's process.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import io
import json
import linecache
import os
import signal
import sys
import traceback
import types

from gpucourse.checks import AnswerError

SNAPSHOT = ["builtins", "os", "sys", "json", "pickle", "threading", "time", "math", "tempfile", "pathlib",
            "inspect", "subprocess", "multiprocessing", "numpy", "numpy.testing", "torch", "torch.testing",
            "torch.distributed", "gpucourse", "gpucourse.parallel", "gpucourse.checks", "gpucourse.checks.ddp"]
OUTPUT_LIMIT = 20_000  # characters of each cell's output kept for the feedback


class CellTimeout(BaseException):
    """Raised in a cell or observer that overran its time (BaseException: `except Exception` won't eat it)."""


def _on_alarm(signum, frame):
    raise CellTimeout()


def _snapshot() -> dict:
    taken = {}
    for name in SNAPSHOT:
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        taken[name] = (module, dict(vars(module)))
    return taken


def _restore(taken: dict) -> None:
    for name, (module, attributes) in taken.items():
        sys.modules[name] = module
        for key, value in attributes.items():
            try:
                setattr(module, key, value)
            except (AttributeError, TypeError):
                pass


class _Capture(io.StringIO):
    def write(self, text):  # keep the head of a flood, drop the rest
        room = OUTPUT_LIMIT - self.tell()
        return super().write(text[:max(room, 0)]) if room > 0 else len(text)


def run_cells(cells: list[dict], seconds: float, emit, taken: dict) -> dict:
    # The cells' namespace is a real __main__ module, as in a kernel: classes defined in a cell then
    # pickle by reference (DataLoader workers, process pools) exactly as they do in a notebook.
    main_module = types.ModuleType("__main__")
    sys.modules["__main__"] = main_module
    namespace = main_module.__dict__
    namespace.update({"__builtins__": builtins,
                      "__exercise_sources__": {c["grade_id"]: c["source"] for c in cells if c.get("grade_id")}})
    for index, cell in enumerate(cells):
        filename = f"<cell {index}>"
        linecache.cache[filename] = (len(cell["source"]), None, cell["source"].splitlines(True), filename)
        captured, error = _Capture(), None
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                exec(compile(cell["source"], filename, "exec"), namespace)
        except CellTimeout:
            error = f"CellTimeout: the cell ran longer than {seconds:.0f} s"
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the run goes on
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _restore(taken)  # a patched builtin must not break the runner itself, nor reach the next cell's checks
        emit({"type": "cell", "index": index, "output": captured.getvalue(), "error": error})
    return namespace


def run_observers(observers: list[dict], namespace: dict, seconds: float, emit) -> None:
    for observer in observers:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            scope = {"__name__": "gpucourse_observer", "__builtins__": builtins}
            exec(compile(observer["source"], f"<observer {observer['case']}>", "exec"), scope)
            with contextlib.redirect_stdout(_Capture()), contextlib.redirect_stderr(_Capture()):
                data = scope[observer["function"]](namespace)
            record = {"type": "observation", "case": observer["case"], "ok": True, "data": json.loads(json.dumps(data))}
        except CellTimeout:
            record = {"type": "observation", "case": observer["case"], "ok": False, "error": f"ran longer than {seconds:.0f} s"}
        except AnswerError as exc:  # "define `choices` (a dict from ...)": the student's words, no exception name
            record = {"type": "observation", "case": observer["case"], "ok": False, "answer": True, "error": str(exc)[:500]}
        except BaseException as exc:
            record = {"type": "observation", "case": observer["case"], "ok": False,
                      "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        emit(record)


def main(fd: int) -> None:
    job = json.loads(sys.stdin.read())
    sys.stdin.close()
    channel = os.fdopen(fd, "w", buffering=1)
    dumps = json.dumps

    def emit(record: dict) -> None:
        channel.write(dumps(record) + "\n")
        channel.flush()

    taken = _snapshot()
    namespace = run_cells(job["cells"], job["cell_seconds"], emit, taken)
    run_observers(job["observers"], namespace, job["observe_seconds"], emit)
    emit({"type": "done"})
    channel.close()
    os._exit(0)  # no atexit hooks, no waiting for threads the student left running


if __name__ == "__main__":
    main(int(sys.argv[1]))

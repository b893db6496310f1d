"""The job the grader sends a sandbox: the submission's cells and the settings its run obeys.

The grader writes it (``autograders/settings.py``: ``Grading.job``) and the supervisor reads it
(``Job.parse``) from stdin as JSON. Every field but ``cells`` has a default: a job without it (a
test's, a student's own run) gets it, and the grader's traitlets settings take their defaults from
here, so that each default is written once. Unknown fields and values of the wrong type are refused
with a message that names them: a grader and a worker of different versions never half-agree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Job:
    """One submission's run in its sandbox."""

    cells: tuple[dict, ...]  # each {"source": str, "grade_id": str | None}, in the notebook's order
    cell_seconds: float = 300.0  # the most one cell may run before its alarm (CellTimeout)
    observe_seconds: float = 240.0  # the most one check's observer may run
    output_limit: int = 20_000  # characters of each cell's output kept for the feedback
    grace: float = 10.0  # seconds a cell or check may overrun its own alarm before it is stopped from outside
    restarts: int = 3  # fresh workers after cells or checks that had to be stopped from outside
    setup_seconds: float = 120.0  # a fresh worker's snapshot, before its first cell
    max_ranks: int = 4  # the most ranks a graded launch may ask for (a CPU grader: more would only contend)
    script_seconds: float = 180.0  # a whole multi-process launch of a script exercise
    collective_seconds: float = 45.0  # a collective's wait before it fails every rank of a graded launch
    launch_tries: int = 3  # launches of a script exercise that fail for the machine's reasons, before a flag
    message_bytes: int = 32 << 20  # the longest JSON line on a channel between the sandbox's processes
    alarm_retry_seconds: float = 0.5  # a cell's alarm repeats this often until it is taken

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "cells":
                if not isinstance(value, (list, tuple)) or not all(isinstance(c, dict) for c in value):
                    raise ValueError(f"job: {f.name} must be a list of objects")
                object.__setattr__(self, f.name, tuple(value))
                continue
            wanted = float if f.type == "float" else int
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (wanted is int and value != int(value)):
                raise ValueError(f"job: {f.name} must be {'a number' if wanted is float else 'an integer'}, not {value!r}")
            value = wanted(value)
            if not value > 0 and f.name != "restarts" or value < 0:
                raise ValueError(f"job: {f.name} must be {'at least 0' if f.name == 'restarts' else 'positive'}, not {value!r}")
            object.__setattr__(self, f.name, value)

    @classmethod
    def parse(cls, data: Any) -> "Job":
        """The job in ``data`` (decoded JSON); a ValueError names what is wrong."""
        if not isinstance(data, dict) or "cells" not in data:
            raise ValueError("job: expected an object with cells")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"job: unknown fields {unknown}")
        return cls(**data)

    def settings(self) -> dict:
        """Every field but the cells: what the grader's settings decide."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "cells"}


DEFAULTS = Job(cells=())

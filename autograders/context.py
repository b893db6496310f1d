"""What the grading steps share about one submission (``Submission``), and how they name a check (``CaseRef``).

The engine's steps (engine.py: take the answers, flag, observe, judge) and record.py's (save the
grades, the late penalty) are ``step(nb, submission) -> (nb, submission)``: each reads the fields
it needs and fills the ones it finds, and a test can hand one step a ``Submission`` with only
those fields set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import datetime

    from . import assemble, sandbox
    from .settings import Grading


@dataclass(frozen=True, order=True)
class CaseRef:
    """One check of one exercise: its ``index``-th ``public`` or ``hidden`` case. Where it must travel as
    a string (the observers sent to the sandbox and the records back, the feedback, the logs) it is
    ``<exercise>/<origin>/<index>`` (``str``), read back by ``parse`` only."""

    exercise: str
    origin: str  # "public" (gpucourse.checks, seen by students) or "hidden" (autograders/checks)
    index: int

    ORIGINS: ClassVar[tuple[str, ...]] = ("public", "hidden")
    _TEXT: ClassVar[re.Pattern] = re.compile(r"([^/\s]+)/(public|hidden)/(0|[1-9][0-9]*)")

    def __post_init__(self) -> None:
        if not self.exercise or "/" in self.exercise or self.origin not in self.ORIGINS \
                or type(self.index) is not int or self.index < 0:
            raise ValueError(f"not a case: exercise {self.exercise!r}, origin {self.origin!r}, index {self.index!r} "
                             f"(an exercise name without '/', one of {self.ORIGINS}, an index from 0)")

    def __str__(self) -> str:
        return f"{self.exercise}/{self.origin}/{self.index}"

    @property
    def hidden(self) -> bool:
        return self.origin == "hidden"

    @classmethod
    def parse(cls, text: str) -> "CaseRef":
        """``<exercise>/<public|hidden>/<index>`` back into a CaseRef; anything else is a ValueError."""
        found = cls._TEXT.fullmatch(text) if isinstance(text, str) else None
        if found is None:
            raise ValueError(f"malformed case id {str(text)[:80]!r}: expected <exercise>/public/<index> "
                             "or <exercise>/hidden/<index>")
        return cls(found.group(1), found.group(2), int(found.group(3)))


@dataclass
class SandboxOptions:
    """Where and how ``observe`` runs a submission: its working folder (``work``; the sandbox's own
    folder is made under it), what the sandbox must not see, its limits, whether to isolate it
    (``sandbox.run``'s ``isolate``) and the preloaded Pythons to fork it from (engine.Preloads)."""

    work: Path
    hide: list[Path]
    limits: "sandbox.Limits"
    isolate: bool | None = None
    preloads: Any = None  # engine.Preloads


@dataclass
class Submission:
    """One submission on its way through the steps, made once by ``engine.start``. Fields are
    grouped by the step that first sets them; the steps after it read them."""

    # engine.start
    student: str
    assignment: str
    notebook: str  # the released notebook's name, without .ipynb
    submitted: Path  # the submitted notebook
    checks: ModuleType  # engine.load_checks: the hidden cases (HIDDEN) and which exercise each test cell grades
    grading: "Grading"  # settings.Grading: the budgets and switches of this run
    sandbox: SandboxOptions | None = None  # for observe only
    # take_answers
    plan: "assemble.Plan | None" = None
    answers: dict[str, str | None] = field(default_factory=dict)  # answer grade id -> source (None: unanswered)
    # flag (observe adds to both when the run's records break the protocol or the runner refused to observe)
    flags: list[str] = field(default_factory=list)  # what a person should look at
    forgery: list[str] = field(default_factory=list)  # the reasons every score of the submission is 0
    # observe
    seed: int | None = None  # the seed this submission's drawn inputs came from (settings.Grading.seed reproduces it)
    inputs: dict[CaseRef, Any] = field(default_factory=dict)  # the drawn inputs of each case that draws them
    observations: dict[CaseRef, dict] = field(default_factory=dict)  # each case's record from the runner
    notes: list[str] = field(default_factory=list)  # why the run ended early, launches that failed for the machine
    log: str = ""  # the sandbox's output
    seconds: float = 0.0  # the sandboxed run's wall time
    # judge
    scores: dict[str, float] = field(default_factory=dict)  # test grade id -> score
    max_scores: dict[str, float] = field(default_factory=dict)  # test grade id -> points
    report: dict[str, list[str]] = field(default_factory=dict)  # test grade id -> its ✓/✗ lines
    # record.save_grades, record.late_penalty: set by the grader's main thread before they run
    work: Path | None = None  # the nbgrader course folder
    logs: Path | None = None  # the folder of the logs
    config: Any = None  # the course's nbgrader configuration (traitlets Config)
    gradebook: Any = None  # an open nbgrader Gradebook of ``work`` kept for a whole class, or None
    timestamp: "datetime.datetime | None" = None  # from timestamp.txt
    seconds_late: float = 0.0
    late_penalty: float = 0.0  # points

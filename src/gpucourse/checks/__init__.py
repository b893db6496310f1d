"""Exercise checks, used by every lesson's exercises: observe the student's code, then judge data.

A check is a list of cases. A case's ``observe(ns)`` calls the student's code (``ns`` is the
notebook's namespace) and returns plain data: numbers, strings, lists and dicts, as JSON has
them. Its ``judge(data)`` returns ``None`` when the data is right, or a message saying what is
wrong. Nothing a judge sees can pretend to be something else: an object whose ``__eq__`` always
says yes is not plain data, so it never reaches a judge.

Each exercise declares its *answers* (``Answer``: the name the grader reads and what it must hold)
where it registers its cases; the exercise's text and stub in the notebook repeat that line, and an
observer fetches an answer with ``answer(ns, name)``, so a missing or mistyped answer is reported as
``not answered yet: define `choices` (a dict from ...)`` rather than as a ``KeyError``; an answer that
is still the released stub (it raises ``NotImplementedError``) reads the same way.

In a notebook, ``check("parallel_map")`` runs an exercise's public cases right there (this is what
the test cell under each exercise does, in JupyterLab and on Colab): it prints one ✓/✗ line per case
and, when one fails, raises ``CheckFailed``, which IPython shows as one line without a traceback: the
cell still ends with an error output, so Validate and autograding count it as failed. For an answer
exercise (a quiz letter, a dict of choices) whose public checks pass, it then says whether the answer
is right, "self-check: correct" or "not yet", from a hashed key (``self_check``; off where the course
turns it off). The course's grader runs the observers, public and hidden, in a sandbox, and the
judges in its own process.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

def _lesson_modules() -> tuple[str, ...]:
    """Every module of this package that declares exercises: ``lessonNN_<slug>`` and ``quiz_<slug>``, found, not listed."""
    import pkgutil
    from pathlib import Path

    return tuple(f"{__name__}.{m.name}" for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                 if m.name.startswith(("lesson", "quiz")))


LESSONS = _lesson_modules()  # one per assignment; each sets ASSIGNMENT and declares its exercises


UNANSWERED = "not answered yet"  # how every check of a stub or a missing answer begins

TYPES = {  # Answer.type -> (test, what to call it in a message)
    "function": (callable, "a function"),
    "class": (callable, "a class"),
    "dict": (lambda v: isinstance(v, dict), "a dict"),
    "set": (lambda v: hasattr(v, "__iter__") and not isinstance(v, (str, bytes, dict)), "a set"),
    "str": (lambda v: isinstance(v, str), "a str"),
}


@dataclass(frozen=True)
class Answer:
    """A name the grader reads from the student's notebook, and what it must hold.

    ``describes`` completes "define `name` (...)": the same words appear in the exercise's text and
    stub (``line()``), and in the message a check gives when the answer is missing.
    """
    name: str
    type: str  # a key of TYPES
    describes: str

    def line(self) -> str:
        return f"`{self.name}`: {self.describes}"

    def missing(self) -> str:
        return f"{UNANSWERED}: {self.to_define()}"

    def to_define(self) -> str:
        return f"define `{self.name}` ({self.describes})"


class AnswerError(Exception):
    """An answer the grader reads is missing or of the wrong type; the message says what to define."""


class NotJudged(Exception):
    """A judge could not judge, for a reason of the machine's and not of the answer (a cluster that failed
    on every try): the case scores nothing, and the grader tells a person why, so that it is graded again."""


class CheckFailed(AssertionError):
    """``check()`` found failing cases; the ✓/✗ lines above say which (``failures`` holds them)."""

    def __init__(self, summary: str, failures: list[str]):
        super().__init__(summary)
        self.failures = failures

    def _render_traceback_(self) -> list[str]:
        # IPython (Jupyter, Colab) shows this instead of a traceback into the package; the cell still
        # ends with an error output, which is what Validate and autograding count as a failed test.
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


@dataclass(frozen=True)
class Case:
    """One check: ``observe(ns)`` runs the student's code and returns plain data; ``judge(data)`` says
    what is wrong with it, or None.

    A case with ``draw`` takes its inputs from whoever runs it, at that moment: ``draw(rng)`` (a
    ``random.Random``) returns plain data, the observer is called ``observe(ns, inputs)`` and the judge
    ``judge(data, inputs)``. The grader draws them from a seed of its own per submission and sends them
    into the sandbox only after the last cell, so no answer can know them in advance; hidden cases keep
    ``draw`` and the reference the judge compares with on the grader's side only. ``check()`` in a
    notebook draws with a fresh generator each time.

    A case with ``seen=True`` is judged also on what was seen from *outside* the process that ran the
    observer, which no code in that process can write: its judge is called ``judge(data, seen)``, or
    ``judge(data, inputs, seen)`` with ``draw``. ``seen`` is ``{"worker_cpu_s": s, "worker_user_s": u}``,
    the CPU time (all its threads, not its child processes) that process spent while the observer ran,
    user and system together, and in user mode alone (its own code running, not the kernel working for
    it); or None when nothing was measured. The grader's supervisor reads both from /proc;
    ``observe_seen`` measures the same in this process."""
    name: str
    observe: Callable[..., Any]
    judge: Callable[..., "str | None"]
    draw: "Callable[[Any], Any] | None" = None
    seen: bool = False

    def inputs(self, rng) -> Any:
        """This case's inputs drawn from ``rng`` (None for a case without ``draw``), as plain data."""
        return None if self.draw is None else as_data(self.draw(rng))

    def observe_with(self, ns: dict, inputs: Any = None) -> Any:
        return self.observe(ns) if self.draw is None else self.observe(ns, inputs)

    def observe_seen(self, ns: dict, inputs: Any = None) -> "tuple[Any, dict]":
        """``observe_with``'s data, and what the grader's supervisor would see from outside while it ran
        (see ``seen``), measured in this process: ``getrusage(RUSAGE_SELF)`` counts what /proc/PID/stat's
        utime and stime do, every thread of this process and none of its children."""
        import resource

        start = resource.getrusage(resource.RUSAGE_SELF)
        data = self.observe_with(ns, inputs)
        end = resource.getrusage(resource.RUSAGE_SELF)
        return data, {"worker_cpu_s": (end.ru_utime + end.ru_stime) - (start.ru_utime + start.ru_stime),
                      "worker_user_s": end.ru_utime - start.ru_utime}

    def judge_with(self, data: Any, inputs: Any = None, seen: "dict | None" = None) -> "str | None":
        args = (data,) + ((inputs,) if self.draw is not None else ()) + ((seen,) if self.seen else ())
        return self.judge(*args)


@dataclass(frozen=True)
class Script:
    """Kind of a multi-process exercise: its answer cell becomes ``student.py``, started by ``torchrun``
    as ``world_size`` ranks that each run ``driver`` ("module:function", the exercise's own: there is no
    default) on the names ``names`` (see gpucourse.checks.ddp)."""
    names: tuple[str, ...]
    world_size: int = 2
    driver: str = field(kw_only=True)

    def __post_init__(self):
        module, _, function = self.driver.partition(":")
        if not module or not function:
            raise ValueError(f"Script driver must be 'module:function', not {self.driver!r}")


@dataclass
class Exercise:
    """Everything the course says about one exercise, declared once by ``register`` in its lesson's
    check module: the answer cell's grade id (``name``), the test cell that grades it (``test_id``),
    its points, its kind, the answers the checks read and the public cases. Hidden cases are added by
    name by the instructors' grader; the notebook's test cell, the classroom's fixtures
    and the README's table of exercises follow from this."""
    name: str
    assignment: str
    points: float
    kind: "str | Script"  # "function" (defines functions or classes), "answer" (values), or a Script
    answers: tuple[Answer, ...]
    cases: list[Case]
    # An answer exercise's answer as self-check hashes it (``reads(ns, exercise)``: plain data), when
    # the grader reads it otherwise than the first public case's observer does (checks/self_check.py).
    reads: "Callable[[dict, Exercise], Any] | None" = None
    # An answer exercise whose answer is one dict: for each key of the solution's dict, the values of
    # the form its text asks for (what the public checks allow, never which are right; ``choices(solution)``).
    # ``make release`` keeps every combination the grader accepts among them in the self-check key
    # (checks/self_check.py reads it). None: one accepted answer, the solution's.
    choices: "Callable[[dict], dict[Any, list]] | None" = None

    @property
    def test_id(self) -> str:
        return f"test_{self.name}"

    def kind_words(self) -> str:
        if isinstance(self.kind, Script):
            return f"{self.kind.world_size}-process script"
        return {"function": "code", "answer": "answer"}[self.kind]


EXERCISES: dict[str, Exercise] = {}  # name -> its declaration, in declaration order
PUBLIC: dict[str, list[Case]] = {}
ANSWERS: dict[str, tuple[Answer, ...]] = {}  # exercise -> the names its checks read


def register(exercise: str, *cases: Case, answers: tuple[Answer, ...] | list[Answer] = (),
             points: float | None = None, kind: "str | Script" = "function", reads=None, choices=None) -> None:
    """Declare ``exercise`` (its answer cell's grade id) in a lesson's check module.

    The exercise belongs to the assignment named by the calling module's ``ASSIGNMENT``, which every
    lesson's check module sets before it registers anything (a module without it is refused).
    ``reads``, ``choices``: see ``Exercise`` (answer exercises only)."""
    if not isinstance(kind, Script) and kind not in ("function", "answer"):
        raise ValueError(f"{exercise}: kind must be 'function', 'answer' or a Script, not {kind!r}")
    if reads is not None and kind != "answer":
        raise ValueError(f"{exercise}: reads= is for answer exercises (self-check reads their answer)")
    if choices is not None and kind != "answer":
        raise ValueError(f"{exercise}: choices= is for answer exercises (self-check's key lists their accepted answers)")
    module = sys.modules[sys._getframe(1).f_globals["__name__"]]
    assignment = getattr(module, "ASSIGNMENT", None)
    if not isinstance(assignment, str):
        raise ValueError(f"{exercise}: {module.__name__} registers an exercise but sets no ASSIGNMENT = '<assignment id>'")
    PUBLIC.setdefault(exercise, []).extend(cases)
    if answers:
        ANSWERS[exercise] = tuple(answers)
    EXERCISES[exercise] = Exercise(exercise, assignment, points, kind, tuple(answers), PUBLIC[exercise], reads, choices)


def exercises(assignment: str | None = None) -> list[Exercise]:
    """The declared exercises (of one assignment), in the order the lessons declare them."""
    for module in LESSONS:
        importlib.import_module(module)
    return [e for e in EXERCISES.values() if assignment is None or e.assignment == assignment]


def exercise_table() -> str:
    """The README's table of exercises (a test keeps README.md equal to it; ``make release`` writes it)."""
    rows = ["| assignment | exercise (answer cell) | points | kind | the grader reads |", "|---|---|---|---|---|"]
    for e in sorted(exercises(), key=lambda e: (e.assignment, list(EXERCISES).index(e.name))):
        names = ", ".join(f"`{a.name}`" for a in e.answers)
        rows.append(f"| `{e.assignment}` | `{e.name}` | {e.points:g} | {e.kind_words()} | {names} |")
    return "\n".join(rows)


def declared(name: str) -> Answer | None:
    """The declaration of the answer called ``name`` (names are unique across the course), or None."""
    for module in LESSONS:
        importlib.import_module(module)
    return next((a for answers in ANSWERS.values() for a in answers if a.name == name), None)


def answer_problem(ns: dict, name: str) -> str | None:
    """Why ``ns`` lacks a usable answer ``name`` (as a student should read it), or None when it is there."""
    spec = declared(name) or Answer(name, "", "as the exercise asks")
    if name not in ns:
        return spec.missing()
    test, called = TYPES.get(spec.type, (lambda v: True, ""))
    value = ns[name]
    if not test(value):
        return f"`{name}` must be {called}; got {type(value).__name__} (define `{name}`: {spec.describes})"
    return None


def _exercise_of(case: Case) -> str | None:
    return next((name for name, cases in PUBLIC.items() if any(c is case for c in cases)), None)


def is_stub(value: Any) -> bool:
    """Whether ``value`` is a function that can only raise NotImplementedError (or a class whose own
    ``__init__`` is one): a released stub.

    Its code names ``NotImplementedError`` and has no way to return or yield, which is what nbgrader's
    ``raise NotImplementedError()`` in place of the solution leaves.
    """
    import dis

    if isinstance(value, type):  # a class whose own __init__ is a stub cannot be made: the class is one too
        return "__init__" in vars(value) and is_stub(vars(value)["__init__"])
    code = getattr(value, "__code__", None)
    if code is None or "NotImplementedError" not in code.co_names:
        return False
    return not any(i.opname.startswith(("RETURN", "YIELD")) for i in dis.get_instructions(code))


def unanswered(case: Case, ns: dict | None = None) -> str | None:
    """What a case says when its exercise is still the released stub: "not answered yet: define ...".

    With ``ns``, only the answers still stubbed there are named (None when none is); without it, all.
    """
    answers = ANSWERS.get(_exercise_of(case) or "", ())
    if ns is not None:
        answers = tuple(a for a in answers if is_stub(ns.get(a.name)))
        if not answers:
            return None
    if not answers:
        return f"{UNANSWERED}: the stub still raises NotImplementedError; replace it with your answer"
    return f"{UNANSWERED}: " + " and ".join(a.to_define() for a in answers)


def answer(ns: dict, name: str) -> Any:
    """``ns[name]``, the student's answer; AnswerError saying what to define when it is missing or mistyped.

    Every observer, public or hidden, reads answers through this, in the notebook and in the grader.
    """
    problem = answer_problem(ns, name)
    if problem:
        raise AnswerError(problem)
    return ns[name]


def observe_calls(ns: dict, name: str, calls: list[dict]) -> list[dict]:
    """Call the answer ``name`` once per entry of ``calls`` (``{"args": [...], "kwargs": {...}}``, values
    as ``values.describe`` writes them, rebuilt here) and return each outcome as plain data:
    ``{"returned": <described value>}`` or ``{"raised": [the exception's class and its bases' names]}``.
    What a differential check observes: the grader computes the same calls with its own reference."""
    from gpucourse.checks.values import describe, rebuild

    function = answer(ns, name)
    outcomes = []
    for call in calls:
        args, kwargs = rebuild(call.get("args", [])), rebuild(call.get("kwargs", {"__dict__": []}))
        try:
            outcomes.append({"returned": describe(function(*args, **kwargs))})
        except AnswerError:
            raise
        except NotImplementedError:
            raise
        except Exception as error:
            outcomes.append({"raised": [k.__name__ for k in type(error).__mro__]})
    return outcomes


def public_cases(exercise: str) -> list[Case]:
    for module in LESSONS:
        importlib.import_module(module)
    if exercise not in PUBLIC:
        raise KeyError(f"no exercise {exercise!r}; known: {', '.join(sorted(PUBLIC))}")
    return PUBLIC[exercise]


def as_data(value: Any) -> Any:
    """``value`` as plain JSON data, or TypeError: what crosses from student code to a judge."""
    return json.loads(json.dumps(value))


def run_case(case: Case, namespace: dict, rng=None) -> str | None:
    """Observe and judge in this process; the failure message, or None. A case that draws its inputs
    (``Case.draw``) draws them from ``rng`` (a fresh ``random.Random`` when None).

    An exercise whose answer is still the released stub gets one line saying what to define, before
    any of its code runs (an observer may catch the stub's NotImplementedError itself, and a
    multi-process exercise would start processes just to find it).
    """
    import random

    stubbed = unanswered(case, namespace)
    if stubbed:
        return f"{case.name}: {stubbed}"
    inputs = case.inputs(rng if rng is not None else random.Random())
    try:
        data, seen = case.observe_seen(namespace, inputs)
        data = as_data(data)
    except AnswerError as error:
        return f"{case.name}: {error}"
    except NotImplementedError:  # the released stub, not a crash: say what to write instead
        return f"{case.name}: {unanswered(case)}"
    except Exception as error:  # the student's code raising is a failed case, not a crash
        return f"{case.name}: raised {type(error).__name__}: {error}"
    verdict = case.judge_with(data, inputs, seen)
    return None if verdict is None else f"{case.name}: {verdict}"


def check(exercise: str, namespace: dict | None = None) -> None:
    """Run ``exercise``'s public cases on the caller's namespace; print ✓/✗ per case; CheckFailed on failure."""
    namespace = namespace if namespace is not None else sys._getframe(1).f_globals
    cases = public_cases(exercise)
    failures = []
    for case in cases:
        message = run_case(case, namespace)
        print(("✗ " + message) if message else f"✓ {case.name}")
        if message:
            failures.append(message)
    if failures:
        raise CheckFailed(f"{exercise}: {len(failures)} of {len(cases)} public checks failed (✗ above)", failures)
    print(f"{exercise}: all {len(cases)} public checks passed (grading runs more)")
    if EXERCISES[exercise].kind == "answer":  # "correct" or "not yet" against a hashed key (checks/self_check.py)
        from gpucourse.checks.self_check import verdict
        print(verdict(exercise, namespace))

"""Every public check of an exercise left as released says, in one line, that it is not answered yet
and what to define: never "raised NotImplementedError: " with nothing after it."""

from __future__ import annotations

import linecache
from pathlib import Path

import nbformat
import pytest

from gpucourse import checks

COURSE = Path(__file__).resolve().parents[1] / "course"
NOTEBOOKS = sorted(COURSE.glob("*/*.ipynb"))


def released_answers(path: Path) -> dict:
    """The namespace a student has after running every answer cell of ``path`` as released (stubs)."""
    ns: dict = {}
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            name = f"<answer cell {cell.get('id')}>"  # a real source for inspect (Triton's @jit reads it)
            linecache.cache[name] = (len(cell.source), None, cell.source.splitlines(True), name)
            try:
                exec(compile(cell.source, name, "exec"), ns)
            except NotImplementedError:  # an answer exercise's stub raises where the value would be
                pass
    return ns


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.parent.name for p in NOTEBOOKS])
def test_every_public_check_of_a_stub_says_not_answered_yet_and_what_to_define(path, monkeypatch):
    monkeypatch.setenv("GPUCOURSE_SMOKE", "1")
    ns = released_answers(path)
    found = checks.exercises(path.parent.name)
    assert found, f"{path.parent.name} declares no exercises"
    for exercise in found:
        for case in exercise.cases:
            message = checks.run_case(case, ns)
            assert message is not None, (exercise.name, case.name, "passed on the stub")
            assert "\n" not in message and "raised" not in message, message
            head = f"{case.name}: not answered yet: define `"
            assert message.startswith(head), message
            assert all(f"`{a.name}`" in message for a in exercise.answers if a.name not in ns or checks.is_stub(ns[a.name])), message


def test_is_stub_tells_a_stub_from_an_answer_that_sometimes_raises():
    def stub(x):
        raise NotImplementedError()

    def partial(x):
        if x < 0:
            raise NotImplementedError("negative x")
        return x

    def lazy():
        return NotImplementedError  # names it, returns

    assert checks.is_stub(stub)
    assert not checks.is_stub(partial) and not checks.is_stub(lazy)
    assert not checks.is_stub(None) and not checks.is_stub("raise NotImplementedError()")


def test_a_stub_inside_an_observer_that_catches_errors_still_reads_not_answered_yet():
    case = checks.public_cases("effective_batch")[0]

    def effective_batch_size(batch_size, devices, num_nodes=1, strategy="ddp"):
        raise NotImplementedError()

    def scaled_learning_rate(base_lr, base_batch_size, effective_batch_size):
        return base_lr

    message = checks.run_case(case, {"effective_batch_size": effective_batch_size,
                                     "scaled_learning_rate": scaled_learning_rate})
    assert message.endswith("not answered yet: " + checks.declared("effective_batch_size").to_define())
    assert "scaled_learning_rate" not in message.split("not answered yet")[1]  # only the stub is named


def test_a_class_whose_init_is_a_stub_is_a_stub():
    class Stubbed:
        def __init__(self, params):
            raise NotImplementedError()

        def step(self):
            raise NotImplementedError()

    class Answered(Stubbed):
        def __init__(self, params):
            self.params = params

    class Inherits(Stubbed):  # its own __init__ is not a stub: not judged a stub (it may answer elsewhere)
        pass

    assert checks.is_stub(Stubbed)
    assert not checks.is_stub(Answered) and not checks.is_stub(Inherits) and not checks.is_stub(int)

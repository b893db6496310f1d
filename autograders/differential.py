"""Differential judging: the student's answer and the grader's reference on the same drawn calls.

A hidden case of a function exercise draws its calls at grading time (``Case.draw``: boundaries
first, each named value and "any other", then random ones from the whole domain the exercise's text
states), the sandbox calls the answer on them (``gpucourse.checks.observe_calls``), and the judge
here calls the reference, which lives on the grader's side only, on the same calls. An outcome is a
returned value (compared with its type: a tuple is not a list, 2 is not 2.0 unless the text allows
it) or a raised exception (compared by class: the answer's exception must be the reference's class
or a subclass of it). A message names the call and what the answer did, never the expected value.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from gpucourse.checks.values import TAGS, describe, rebuild, type_words


def call(*args, **kwargs) -> dict:
    """One call of the answer, as a drawn input: ``{"args", "kwargs"}`` in ``describe``'s data."""
    return {"args": describe(list(args)), "kwargs": describe(kwargs)}


def outcome(reference: Callable, spec: dict) -> dict:
    """What ``reference`` does on the call ``spec``: as ``observe_calls`` reports an answer's."""
    args, kwargs = rebuild(spec.get("args", [])), rebuild(spec.get("kwargs", {"__dict__": []}))
    try:
        return {"returned": describe(reference(*args, **kwargs))}
    except Exception as error:
        return {"raised": [k.__name__ for k in type(error).__mro__]}


def shown(spec: dict, name: str, limit: int = 160) -> str:
    """The call as Python: ``name(3, kind='io')``, cut at ``limit`` characters."""
    args = rebuild(spec.get("args", []))
    kwargs = rebuild(spec.get("kwargs", {"__dict__": []}))
    text = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
    text = f"{name}({text})"
    return text if len(text) <= limit else text[:limit - 4] + "...)"


def same(got: Any, want: Any, rel: float = 1e-9, abs_tol: float = 1e-12, loose_numbers: bool = False) -> bool:
    """Whether two described values agree: same types and structure, numbers within ``rel``/``abs_tol``.
    ``loose_numbers``: an int and a float of the same value agree (where the text asks for "a number")."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        if type(got) is not type(want) and not loose_numbers:
            return False
        if isinstance(want, int) and isinstance(got, int):
            return got == want  # exact, at any size
        return math.isclose(got, want, rel_tol=rel, abs_tol=abs_tol)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(
            same(g, w, rel, abs_tol, loose_numbers) for g, w in zip(got, want))
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return False
        if "__float__" in want:
            return got == want
        if "__tensor__" in want:
            return (got["__tensor__"] == want["__tensor__"] and got["shape"] == want["shape"]
                    and same(got["values"], want["values"], rel, abs_tol, loose_numbers))
        if "__dict__" in want:  # keys in any order
            pairs = {repr(k): v for k, v in want["__dict__"]}
            others = {repr(k): v for k, v in got["__dict__"]} if isinstance(got["__dict__"], list) else None
            return others is not None and set(pairs) == set(others) and all(
                same(others[k], pairs[k], rel, abs_tol, loose_numbers) for k in pairs)
        return all(same(got[k], want[k], rel, abs_tol, loose_numbers) for k in want)
    return got == want


def _raised(found: dict) -> str:
    return found["raised"][0] if isinstance(found.get("raised"), list) and found["raised"] else "an exception"


def unreported(got: Any, where: str) -> str | None:
    """The verdict on an outcome that is neither a return nor a raise (a forged or broken report)."""
    if not isinstance(got, dict) or ("returned" in got) == ("raised" in got):
        return f"{where}: no outcome was reported"
    return None


def must_raise(got: dict, expected: str, where: str) -> str | None:
    """The verdict on a call whose reference raises ``expected``: the answer must raise it (or a subclass:
    the answer's outcome lists the classes of what it raised)."""
    if "raised" not in got:
        return f"{where} returned {type_words(got['returned'])}; it must raise {expected}"
    if not isinstance(got["raised"], list) or expected not in got["raised"]:
        return f"{where} raised {_raised(got)}; it must raise {expected}"
    return None


def verdict(spec: dict, got: Any, want: dict, name: str, **tolerance) -> str | None:
    """What is wrong with the answer's outcome ``got`` of the call ``spec``, against the reference's ``want``."""
    where = shown(spec, name)
    if found := unreported(got, where):
        return found
    if "raised" in want:
        return must_raise(got, want["raised"][0], where)
    if "raised" in got:
        return f"{where} raised {_raised(got)}"
    if not same(got["returned"], want["returned"], **tolerance):
        kind, expected_kind = type_words(got["returned"]), type_words(want["returned"])
        if kind != expected_kind and not (tolerance.get("loose_numbers") and {kind, expected_kind} <= {"an int", "a float"}):
            return f"{where} returned {kind}; it must return {expected_kind}"
        return f"{where} returned a wrong value"
    return None


def judge_calls(reference: Callable, name: str, **tolerance) -> Callable[[Any, Any], str | None]:
    """A judge ``judge(observed, calls)`` for a case whose observer is ``observe_calls(ns, name, calls)``:
    the first call where the answer and ``reference`` disagree, or None."""
    def judge(observed, calls):
        if not isinstance(observed, list) or len(observed) != len(calls):
            return f"{len(observed) if isinstance(observed, list) else 'no'} outcomes for {len(calls)} calls"
        for spec, got in zip(calls, observed):
            found = verdict(spec, got, outcome(reference, spec), name, **tolerance)
            if found:
                return found
        return None
    return judge


__all__ = ["TAGS", "call", "judge_calls", "must_raise", "outcome", "same", "shown", "unreported", "verdict"]

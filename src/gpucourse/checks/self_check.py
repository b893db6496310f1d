"""Self-check for answer exercises: after the public checks pass, say "correct" or "not yet".

An answer exercise (``register(..., kind="answer")``: the quiz, a dict of choices, a set of line
numbers) has public checks that only look at the form of the answer, so a student working alone
would not learn whether it is right until it is graded. ``check("q3")`` therefore compares the
answer with a key, ``self_check.json`` next to this module, after its public checks pass.

The key holds no answer in plain text. ``make release`` runs each answer cell of the solution
notebooks, collects every answer the grader gives full marks (where it accepts several, each of
them), reads each the way the grader does (``normalized``: "(C)" is the letter c, a list of line
numbers is the set of them) and stores, per exercise, a random salt and the sha256 of the salt
followed by the canonical JSON of each accepted answer. ``check`` hashes the student's answer the
same way and looks it up: it says "correct" or "not yet", never what the right answer is.

What this does and does not hide. A hash cannot be read back, but it can be checked against a
guess, which is what the student's own attempts are anyway: a multiple-choice question has four
letters, and trying them one by one finds the right one in at most four tries, with or without
the key file. Self-check is for practice. A class whose answer exercises are graded must turn
it off: ``self_check = false`` in edition.toml leaves the key out of the student edition
(``make publish``), and then ``check`` says self-check is off. ``GPUCOURSE_SELF_CHECK=0`` in the
environment turns it off at run time as well. Grading is not affected either way: the grader
replaces ``check`` and runs its own hidden checks.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gpucourse import environment

KEY_FILE = Path(__file__).with_name("self_check.json")
ENV = environment.SELF_CHECK  # "0" (or "false", "no", "off") turns self-check off at run time
CORRECT = "self-check: correct"
NOT_YET = "self-check: not yet (the form is right, the answer is not: reread the lesson and try again)"


def canonical(value: Any) -> str:
    """The canonical JSON of plain data: sorted keys, no spaces, UTF-8 as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(salt: str, value: Any) -> str:
    """sha256 of ``salt`` followed by the canonical JSON of ``value`` (a normalized answer), as hex."""
    return hashlib.sha256((salt + canonical(value)).encode("utf-8")).hexdigest()


def normalized(exercise: str, ns: dict) -> Any:
    """The answer of ``exercise`` in ``ns`` as plain data, read as the grader reads it.

    Raises (AnswerError, ValueError, ...) when the answer cannot be read that way.
    """
    from gpucourse.checks import EXERCISES, as_data, public_cases

    cases = public_cases(exercise)
    declared = EXERCISES[exercise]
    if declared.reads is not None:  # the exercise's own way, declared with it
        return as_data(declared.reads(ns, declared))
    return as_data(cases[0].observe(ns))


def off_reason(key_file: Path | None = None) -> str | None:
    """Why self-check is off here (the environment, or no key in this edition), or None when it is on."""
    if (value := environment.self_check_off()) is not None:
        return f"self-check is off ({ENV}={value})"
    if not (key_file or KEY_FILE).is_file():
        return "self-check is off in this edition of the course (graded answers are checked when graded)"
    return None


def load_key(key_file: Path | None = None) -> dict:
    return json.loads((key_file or KEY_FILE).read_text(encoding="utf-8"))


def verdict(exercise: str, ns: dict, key_file: Path | None = None) -> str:
    """One line: "self-check: correct", "self-check: not yet ...", or why self-check says nothing."""
    off = off_reason(key_file)
    if off:
        return off
    try:
        entry = load_key(key_file).get("exercises", {}).get(exercise)
    except (OSError, ValueError, AttributeError) as error:
        return f"self-check: the key file cannot be read ({type(error).__name__})"
    if entry is None:
        return f"self-check: this release of the course has no key for {exercise!r}"
    try:
        value = normalized(exercise, ns)
    except Exception:  # an answer the grader cannot read as right is not yet right
        return NOT_YET
    return CORRECT if digest(entry["salt"], value) in entry["hashes"] else NOT_YET

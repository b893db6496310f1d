"""Public checks for the assessment quiz: each answer must be one of the offered letters.

Whether it is the right letter is for grading to say (autograders/checks/quiz_gpu_data_parallel.py),
with a hint when it is not.
"""

from __future__ import annotations

from gpucourse.checks import Case, register

QUESTIONS = tuple(f"q{n}" for n in range(1, 11))


def observe_answer(ns):
    # one observation serves every question: all answers qN that exist
    return {name: str(ns[name]).strip().lower() for name in (f"q{n}" for n in range(1, 11)) if name in ns}


def _form(question):
    def judge(d):
        if question not in d:
            return f"{question} is not answered"
        return None if d[question] in ("a", "b", "c", "d") else f"{question} must be one of 'a', 'b', 'c', 'd', got {d[question]!r}"
    return judge


for _question in QUESTIONS:
    register(_question, Case(f"{_question} is one of a-d", observe_answer, _form(_question)))

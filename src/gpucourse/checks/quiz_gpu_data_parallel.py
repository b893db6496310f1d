"""Public checks for the assessment quiz: each answer must be one of the offered letters.

An answer is read as the notebook's intro says, and as grading reads it: upper or lower case, and
spaces, brackets or quotes around the letter, do not matter ("C", " c ", "(c)", "c)" are all c);
anything else beside it ("c.", "*c*", "`c`") is not a letter. Spaces are every kind Python's
``str.isspace`` knows (a tab, a newline, "\\r", a no-break space), brackets every opening or closing
bracket of Unicode (round, square, curly, angle, full-width) and quotes every quotation mark (straight,
curly, guillemets): the student's keyboard or editor chooses which one is typed.

Whether it is the right letter is for grading to say (the quiz's hidden checks), with a hint when it
is not.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "quiz_gpu_data_parallel"  # the course folder this module's exercises belong to

QUESTIONS = tuple(f"q{n}" for n in range(1, 27))
LETTERS = 'a str, one of the letters "a", "b", "c", "d"'


def around(char: str) -> bool:
    """Whether ``char`` may stand around the letter: a space, a bracket or a quotation mark (Unicode's
    categories of opening and closing punctuation and of initial and final quotes, with the ASCII quotes
    and angle brackets, which Unicode files elsewhere). A backtick, a full stop or an asterisk may not."""
    import unicodedata

    return char.isspace() or char in "'\"<>\uff02\uff07\uff1c\uff1e" or unicodedata.category(char) in ("Ps", "Pe", "Pi", "Pf")


def letter_of(text: str) -> str | None:
    """The letter a-d that ``text`` gives, in lower case, or None: one letter, in either case, with only
    spaces, brackets or quotes around it ("C", " c ", "(c)", "c)", "\u201cc\u201d"); "c.", "*c*", "`c`" give None."""
    start, end = 0, len(text)
    while start < end and around(text[start]):
        start += 1
    while end > start and around(text[end - 1]):
        end -= 1
    inner = text[start:end].lower()
    return inner if len(inner) == 1 and inner in "abcd" else None


def observe_answer(ns):
    # one observation serves every question: each answer qN that exists, as a letter, or what is wrong with it
    from gpucourse.checks import answer_problem
    from gpucourse.checks.quiz_gpu_data_parallel import letter_of

    found = {}
    for name in (f"q{n}" for n in range(1, 27)):
        if name in ns:
            problem = answer_problem(ns, name)
            # the letter as written, in either case, with spaces, brackets or quotes around it: "C", " c ", "(c)",
            # "c)"; anything else ("c.", "*c*") is kept as written, and is not a letter
            text = str.__str__(ns[name]) if not problem else ""
            found[name] = {"problem": problem} if problem else (letter_of(text) or text)
    return found


def judge_form(question):
    """A judge: ``question`` is answered with a str that is one of the letters (its "define ..." line if not)."""
    def judge(d):
        if question not in d:
            return Answer(question, "str", LETTERS).missing()
        if isinstance(d[question], dict):
            return d[question]["problem"]
        return None if d[question] in ("a", "b", "c", "d") else f"{question} must be one of 'a', 'b', 'c', 'd', got {d[question]!r}"
    return judge


def read_letter(ns, exercise):
    """Self-check reads a question's letter as the grader does: the quiz's one observation serves every
    question ("(C)" is "c")."""
    found = observe_answer(ns).get(exercise.name)
    if not isinstance(found, str):
        raise ValueError("no letter")
    return found


for _question in QUESTIONS:
    register(_question, Case(f"{_question} is one of a-d", observe_answer, judge_form(_question)),
             answers=[Answer(_question, "str", LETTERS)], points=1, kind="answer", reads=read_letter)

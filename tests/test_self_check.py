"""Self-check of the answer exercises: check() says "correct" or "not yet" from a key of salted hashes."""

from __future__ import annotations

import json
import re
import shutil

import nbformat
import pytest

from autograders import self_check_key
from conftest import FIXTURES, ROOT, SOLUTIONS
from gpucourse import checks
from gpucourse.checks import self_check

ANSWER_EXERCISES = [e for e in checks.exercises() if e.kind == "answer"]
NAMES = [e.name for e in ANSWER_EXERCISES]
BY_NAME = {e.name: e for e in ANSWER_EXERCISES}


def _fixtures(kind: str) -> list[tuple[str, object]]:
    found = []
    for e in ANSWER_EXERCISES:
        for path in sorted((FIXTURES / e.assignment / kind).glob(f"{e.name}__*.py")):
            found.append((e.name, path))
    return found


RIGHT, WRONG = _fixtures("right"), _fixtures("wrong")


def _ns(source: str) -> dict:
    ns: dict = {"__name__": "__main__"}
    exec(compile(source, "<answer>", "exec"), ns)
    return ns


def _checked(exercise: str, ns: dict, capsys) -> list[str]:
    """check(exercise) on ``ns``: its printed lines (CheckFailed propagates)."""
    capsys.readouterr()
    checks.check(exercise, ns)
    return capsys.readouterr().out.splitlines()


@pytest.fixture(autouse=True)
def _self_check_on(monkeypatch):
    monkeypatch.delenv(self_check.ENV, raising=False)


@pytest.fixture(scope="module")
def key() -> dict:
    assert self_check.KEY_FILE.is_file(), "no src/gpucourse/checks/self_check.json: run `make release`"
    return json.loads(self_check.KEY_FILE.read_text())


@pytest.fixture(scope="module")
def accepted() -> dict[str, list]:
    from autograders.self_check_key import accepted_answers

    return {e.name: accepted_answers(SOLUTIONS, e) for e in ANSWER_EXERCISES}


def test_more_accepted_combinations_than_the_setting_allows_stop_the_key_by_name(accepted):
    """c.SelfCheckKey.max_answers (settings.py; release.py passes it): combinations of an exercise's accepted
    parts beyond it stop the key, naming the exercise and the setting; at the limit the key lists them all."""
    from autograders.self_check_key import accepted_answers

    exercise = BY_NAME["loader_settings"]
    with pytest.raises(SystemExit, match=r"^loader_settings: (\d+) accepted answers, more than "
                                         r"c\.SelfCheckKey\.max_answers = 1;") as stopped:
        accepted_answers(SOLUTIONS, exercise, max_answers=1)
    combinations = int(re.match(r"loader_settings: (\d+)", str(stopped.value)).group(1))
    assert combinations >= len(accepted["loader_settings"]) > 1
    with pytest.raises(SystemExit, match=f"more than c\\.SelfCheckKey\\.max_answers = {combinations - 1};"):
        accepted_answers(SOLUTIONS, exercise, max_answers=combinations - 1)
    assert accepted_answers(SOLUTIONS, exercise, max_answers=combinations) == accepted["loader_settings"]


def test_there_are_answer_exercises_and_fixtures():
    assert {"q1", "choose_tools", "sync_lines", "case_answers", "loader_settings"} <= set(NAMES)
    assert {name for name, _ in RIGHT} == set(NAMES), "every answer exercise has right fixtures"


def test_every_answer_exercise_has_a_key(key):
    assert set(key["exercises"]) == set(NAMES), "the key's exercises are the answer exercises: run `make release`"
    for name, entry in key["exercises"].items():
        assert re.fullmatch(r"[0-9a-f]{32}", entry["salt"]), name
        assert entry["hashes"] and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in entry["hashes"]), name
        assert entry["hashes"] == sorted(set(entry["hashes"])), "sorted: the order says nothing about the solution"
    salts = [e["salt"] for e in key["exercises"].values()]
    assert len(set(salts)) == len(salts), "a salt per exercise: equal answers to two questions hash apart"


def _leaves(value) -> list:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in [k, *_leaves(v)]]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def test_the_key_holds_no_plain_answer(key, accepted):
    text = self_check.KEY_FILE.read_text()
    assert set(key) == {"about", "format", "exercises"}  # besides the about line, only hex strings (checked above)
    for name in NAMES:
        assert accepted[name], name
        for value in accepted[name]:
            assert self_check.canonical(value) not in text, f"{name}'s answer in plain text in the key"
            strings = [leaf for leaf in _leaves(value) if isinstance(leaf, str)]
            leaked = [s for s in strings if json.dumps(s) in text]
            assert not leaked, f"{name}: {leaked} appear in the key"
        solution = _ns(self_check_key.answer_cell_source(SOLUTIONS, BY_NAME[name]))
        for answer in BY_NAME[name].answers:
            assert repr(solution[answer.name]) not in text


def test_the_accepted_answers_include_each_alternative_the_grader_allows(accepted):
    # case 3 counts the channels either way; scenarios a and d take ranges of workers
    assert len(accepted["case_answers"]) == 2
    assert len(accepted["loader_settings"]) > 2
    assert all(len(accepted[q]) == 1 for q in NAMES if q.startswith("q"))


@pytest.mark.parametrize("name, path", RIGHT, ids=lambda p: getattr(p, "name", p))
def test_right_fixtures_are_correct(name, path, capsys):
    lines = _checked(name, _ns(path.read_text()), capsys)
    assert lines[-1] == self_check.CORRECT, lines


@pytest.mark.parametrize("name, path", WRONG, ids=lambda p: getattr(p, "name", p))
def test_wrong_fixtures_are_not_yet_or_fail_the_form(name, path, capsys):
    """A wrong answer of the right form is "not yet"; one of the wrong form fails its public check first."""
    ns = _ns(path.read_text())
    form_ok = all(checks.run_case(case, ns) is None for case in checks.public_cases(name))
    if form_ok:
        lines = _checked(name, ns, capsys)
        assert lines[-1] == self_check.NOT_YET, lines
    else:
        with pytest.raises(checks.CheckFailed):
            _checked(name, ns, capsys)
        assert "self-check" not in capsys.readouterr().out


def test_wrong_answers_of_the_right_form_reach_the_self_check():
    reaching = {name for name, path in WRONG
                if all(checks.run_case(c, _ns(path.read_text())) is None for c in checks.public_cases(name))}
    assert {"choose_tools", "sync_lines", "case_answers", "loader_settings", "q3"} <= reaching
    assert "sync_lines__as_strings.py" in {p.name for _, p in WRONG}  # the form the public check lets through ...


def test_strings_for_line_numbers_are_not_yet(capsys):
    """... the grader does not: "4" is not the int 4, so self-check does not call it correct."""
    lines = _checked("sync_lines", {"sync_lines": ("4", "6", "8", "10", "11", "13")}, capsys)
    assert lines[-1] == self_check.NOT_YET


@pytest.mark.parametrize("question", [n for n in NAMES if BY_NAME[n].assignment == "quiz_gpu_data_parallel"])
def test_exactly_one_letter_is_correct_in_any_spelling(question, capsys):
    verdicts = {}
    for letter in "abcd":
        spellings = [letter, letter.upper(), f"({letter.upper()})", f" {letter}) ", f"'{letter}'",
                     f"\u201c{letter}\u201d", f"<{letter.upper()}>", f"{letter}\r\n", f"{letter}\u00a0", f"\u00ab{letter}\u00bb"]
        seen = {_checked(question, {question: s}, capsys)[-1] for s in spellings}
        assert len(seen) == 1, f"{question}: spellings of {letter!r} disagree: {seen}"
        verdicts[letter] = seen.pop()
    assert sorted(verdicts.values()) == sorted([self_check.CORRECT] + 3 * [self_check.NOT_YET]), verdicts


SPACES_BRACKETS_QUOTES = " \t\r\n\u00a0\u3000()[]{}<>'\"\u2018\u2019\u201c\u201d\u00ab\u00bb\uff08\uff09\u300c\u300d"
NOT_AROUND = ".:*`-_,;!?/|=+~#"


def test_a_letter_reads_as_itself_with_any_spaces_brackets_or_quotes_around_and_nothing_else():
    """The intro's rule, as public and hidden checks both read it (``letter_of``): any Unicode space, bracket or
    quotation mark around the letter, in any number and order, leaves the letter; one other character beside it
    (a full stop, a colon, an asterisk, a backtick...), or a second letter, makes it no letter. 2,000 drawn forms."""
    import random

    from gpucourse.checks.quiz_gpu_data_parallel import letter_of

    rng = random.Random(0)
    for _ in range(2000):
        letter = rng.choice("abcdABCD")
        before, after = ("".join(rng.choices(SPACES_BRACKETS_QUOTES, k=rng.randint(0, 5))) for _ in range(2))
        other = rng.choice(NOT_AROUND)
        assert letter_of(before + letter + after) == letter.lower(), repr(before + letter + after)
        spoiled = before + rng.choice([other + letter, letter + other]) + after
        assert letter_of(spoiled) is None, repr(spoiled)
        assert letter_of(before + letter + rng.choice("abcdefx") + after) is None
        assert letter_of(before + after) is None


def test_the_environment_switch_turns_it_off_and_on(monkeypatch, capsys):
    ns = _ns((FIXTURES / "quiz_gpu_data_parallel" / "right" / "q1__in_brackets.py").read_text())
    monkeypatch.setenv(self_check.ENV, "0")
    assert _checked("q1", ns, capsys)[-1] == f"self-check is off ({self_check.ENV}=0)"
    monkeypatch.setenv(self_check.ENV, "1")
    assert _checked("q1", ns, capsys)[-1] == self_check.CORRECT


def test_without_the_key_file_it_says_self_check_is_off(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(self_check, "KEY_FILE", tmp_path / "self_check.json")
    assert _checked("q1", {"q1": "a"}, capsys)[-1].startswith("self-check is off in this edition")
    shutil.copy(ROOT / "src" / "gpucourse" / "checks" / "self_check.json", tmp_path / "self_check.json")
    assert _checked("q1", {"q1": "a"}, capsys)[-1] in (self_check.CORRECT, self_check.NOT_YET)


def test_code_exercises_say_nothing_of_self_check(capsys):
    from test_checks import _parallel_map

    assert "self-check" not in "\n".join(_checked("parallel_map", {"parallel_map": _parallel_map}, capsys))


def test_while_grading_check_is_replaced_and_says_nothing_of_self_check(capsys):
    from autograders.worker.snapshot import _check_while_grading

    _check_while_grading("q1", {"q1": "a"})
    assert "self-check" not in capsys.readouterr().out


def test_publish_keeps_or_leaves_out_the_key(tmp_path):
    from autograders.course import load_edition
    from autograders.publish import self_check_on, publish

    edition = load_edition()
    key = ("src", "gpucourse", "checks", "self_check.json")
    on = publish(tmp_path / "on", edition, git=False, self_check=True)
    assert on.joinpath(*key).read_bytes() == self_check.KEY_FILE.read_bytes()
    assert "says **correct** or **not yet**" in (on / "README.md").read_text()
    off = publish(tmp_path / "off", edition, git=False, self_check=False)
    assert not off.joinpath(*key).exists()
    # The GPU reference (gpucourse/reference/*.json) and lesson 10's recorded Slurm run (gpucourse/recorded/)
    # are public measurement data; nothing else may be JSON.
    public_data = {off / "src" / "gpucourse" / "reference", off / "src" / "gpucourse" / "recorded"}
    assert not [p for p in off.rglob("*.json") if p.parent not in public_data], "no key file of any name"
    assert "Self-check is off in this edition" in (off / "README.md").read_text()
    assert self_check.off_reason(off.joinpath(*key)).startswith("self-check is off in this edition")
    for edition_pyproject in (on / "pyproject.toml", off / "pyproject.toml", ROOT / "pyproject.toml"):
        assert '"gpucourse.checks" = ["self_check.json"]' in edition_pyproject.read_text(), "the key goes into the wheel"
    config = tmp_path / "edition.toml"
    config.write_text('[student-edition]\nhome = "a/b"\nself_check = false\n')
    assert self_check_on(config) is False
    config.write_text('[student-edition]\nhome = "a/b"\n')
    assert self_check_on(config) is True
    assert isinstance(self_check_on(), bool)


def _quiz_copy(tmp_path, q1: str):
    folder = tmp_path / "solutions" / "quiz_gpu_data_parallel"
    shutil.copytree(SOLUTIONS / "quiz_gpu_data_parallel", folder)
    path = next(folder.glob("*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "q1"
                and c.cell_type == "code" and c.metadata["nbgrader"].get("solution"))
    cell.source = re.sub(r'^q1 = .*$', f"q1 = {q1!r}", cell.source, flags=re.M)
    nbformat.write(nb, path)
    return tmp_path / "solutions"


def test_the_key_follows_the_solutions_as_the_grader_reads_them(tmp_path, key):
    from autograders.self_check_key import build_key

    salts = {name: entry["salt"] for name, entry in key["exercises"].items()}
    solution = next(v for v in _ns(self_check_key.answer_cell_source(SOLUTIONS, BY_NAME["q1"])).values()
                    if isinstance(v, str) and len(v) == 1)
    respelled = build_key(_quiz_copy(tmp_path / "respelled", f" ({solution.upper()}) "), salts)
    assert respelled["exercises"]["q1"] == key["exercises"]["q1"], "the same answer spelled otherwise: the same key"
    assert set(respelled["exercises"]) == {n for n in NAMES if BY_NAME[n].assignment == "quiz_gpu_data_parallel"}
    other = next(letter for letter in "abcd" if letter != solution)
    with pytest.raises(SystemExit, match="does not pass its own checks"):
        build_key(_quiz_copy(tmp_path / "changed", other), salts)  # solutions and hidden checks disagree: no key


def test_releasing_one_assignment_rebuilds_its_entries_and_keeps_the_others(key):
    from autograders.self_check_key import build_key

    salts = {name: entry["salt"] for name, entry in key["exercises"].items()}
    assert build_key(SOLUTIONS, salts, only="lesson01_processes_threads", old=key) == key
    alone = build_key(SOLUTIONS, salts, only="lesson01_processes_threads", old=None)
    assert list(alone["exercises"]) == ["choose_tools"]
    assert alone["exercises"]["choose_tools"] == key["exercises"]["choose_tools"]

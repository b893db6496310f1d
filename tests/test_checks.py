"""gpucourse.checks (the notebooks' check()): what it says, the exercises' declarations, script exercises, and
every fixture judged in this process as the grader judges it. The runner: test_runner.py; the scan:
test_scan.py; the plan: test_plan.py."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading

import pytest

from autograders import engine
from conftest import AUTOGRADERS, COURSE, ROOT, SOLUTIONS, execute_notebook, nbgrader_meta, notebooks, read
from gpucourse import checks
from gpucourse.checks import ddp
from test_runner import _run_runner


def _parallel_map(fn, items, kind, workers=None):
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    if kind not in ("cpu", "io"):
        raise ValueError(kind)
    with {"cpu": ProcessPoolExecutor, "io": ThreadPoolExecutor}[kind](workers) as pool:
        return list(pool.map(fn, items))


def test_check_passes_and_prints(capsys):
    checks.check("parallel_map", {"parallel_map": _parallel_map})
    out = capsys.readouterr().out
    assert "✓ kind='cpu' runs in other processes" in out and "all 3 public checks passed" in out


def test_check_fails_with_every_reason(capsys):
    def threads_only(fn, items, kind, workers=None):
        return [fn(x) for x in items]

    with pytest.raises(checks.CheckFailed, match="1 of 3 public checks failed") as failure:
        checks.check("parallel_map", {"parallel_map": threads_only})
    assert isinstance(failure.value, AssertionError)  # plain Python and pytest see a failed assertion
    assert "\n" not in str(failure.value), "one summary line: the reasons are the ✗ lines above it"
    assert "use processes for GIL-bound work" in failure.value.failures[0]
    out = capsys.readouterr().out
    assert "✗ kind='cpu' runs in other processes: ran in this process: use processes for GIL-bound work" in out


def test_check_reports_a_missing_answer_and_unknown_exercises(capsys):
    with pytest.raises(checks.CheckFailed):
        checks.check("choose_tools", {})
    out = capsys.readouterr().out
    assert "✗ one known tool for each of a-f: not answered yet: define `choices` (a dict from each workload key" in out
    assert "KeyError" not in out and "raised" not in out
    with pytest.raises(KeyError, match="known: "):
        checks.check("no_such_exercise", {})


def _all_exercises() -> dict[str, tuple[checks.Answer, ...]]:
    checks.public_cases("parallel_map")  # imports every lesson's module
    return checks.ANSWERS


def test_every_exercise_declares_its_answers():
    declared = _all_exercises()
    assert set(declared) == set(checks.PUBLIC), f"exercises without declared answers: {set(checks.PUBLIC) - set(declared)}"
    names = [a.name for answers in declared.values() for a in answers]
    assert len(names) == len(set(names)), "an answer's name must be unique across the course (answer() looks it up)"
    for answers in declared.values():
        assert answers and all(a.type in checks.TYPES and a.describes for a in answers)


def _exercise_cells(nb) -> list[tuple[str, str, str]]:
    """(exercise, its text, its stub) for every check cell of a released notebook: the stub is the answer
    cell above the check cell, the text every markdown cell between the previous check cell and the stub."""
    found, start = [], 0
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            exercise = cell.source.split('check("')[1].split('"')[0]
            above = nb.cells[start:index]
            stubs = [c for c in above if c.cell_type == "code" and c.get("metadata", {}).get("nbgrader", {}).get("solution")]
            text = "\n".join(c.source for c in above if c.cell_type == "markdown")
            found.append((exercise, text, stubs[-1].source if stubs else ""))
            start = index + 1
    return found


def test_answers_are_named_in_every_released_exercise_text_and_stub():
    declared = _all_exercises()
    seen = set()
    for path in sorted(COURSE.glob("*/*.ipynb")):
        for exercise, text, stub in _exercise_cells(read(path)):
            seen.add(exercise)
            assert exercise in declared, f"{path.name}: check({exercise!r}) has no declared answers"
            for answer in declared[exercise]:
                where = f"{path.parent.name}, exercise {exercise!r}"
                assert answer.line() in text, f"{where}: the exercise text must say: {answer.line()}"
                assert f"# The grader reads {answer.line()}" in stub, f"{where}: the stub must say: {answer.line()}"
    assert seen == set(declared), f"declared but never checked in a notebook: {set(declared) - seen}"


def test_a_wrong_type_says_what_it_must_be(capsys):
    with pytest.raises(checks.CheckFailed):
        checks.check("choose_tools", {"choices": [("a", "threads")]})
    assert "`choices` must be a dict; got list" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed):
        checks.check("sync_lines", {"sync_lines": "4, 6"})
    assert "`sync_lines` must be a set; got str" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed):
        checks.check("q3", {"q3": 2})
    assert "`q3` must be a str; got int" in capsys.readouterr().out


def test_every_check_public_and_hidden_says_what_to_define():
    """On an empty notebook every case, public or hidden, of every assignment asks for its answer by name."""

    _all_exercises()
    for path in sorted(AUTOGRADERS.glob("checks/*.py")):
        hidden = engine.load_checks(path.stem)
        for test, exercise in engine.exercise_of_test(path.stem).items():
            names = [a.name for a in checks.ANSWERS[exercise]]
            for case_id, case in engine.cases_for(hidden, exercise):
                message = checks.run_case(case, {})
                assert message and any(f"define `{name}` (" in message for name in names), (path.stem, case_id, message)
                assert "KeyError" not in message and "raised" not in message, (path.stem, case_id, message)


@pytest.mark.slow  # starts sandbox workers, pools or ranks many times (10-25 s): `make test`, not `make test-fast`
def test_the_grader_reports_a_missing_answer_in_the_same_words():

    observer = "def observe(ns):\n    from gpucourse.checks import answer\n    return answer(ns, 'choices')\n"
    records = _run_runner({"cells": [{"source": "chioces = {}", "grade_id": "choose_tools"}],
                           "observers": [{"case": "c", "source": observer, "function": "observe"}],
                           "cell_seconds": 30, "observe_seconds": 30})
    observation = next(r for r in records if r["type"] == "observation")
    case = checks.public_cases("choose_tools")[0]
    expected = checks.declared("choices").missing()
    assert observation["answer"] is True and engine._judge(case, observation) == expected
    assert engine._judge(case, {"ok": False, "error": "KeyError: 'x'"}) == "raised KeyError: 'x'"


def test_a_failed_check_is_one_error_line_in_a_kernel_and_still_fails_the_cell(tmp_path):
    """In Jupyter a failed check ends the cell with an error output (what Validate and autograding count)
    whose traceback is one line, with no path into the package."""
    import nbformat
    from nbgrader.utils import determine_grade

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('from gpucourse.checks import check\ncheck("choose_tools")')
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": "test_choose_tools",
                                 "points": 2, "schema_version": 3, "task": False}
    nb.cells = [cell]
    execute_notebook(nb, tmp_path, timeout=120, allow_errors=True)
    errors = [o for o in cell.outputs if o["output_type"] == "error"]
    printed = "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")
    assert "✗ one known tool for each of a-f: not answered yet: define `choices` (" in printed
    assert len(errors) == 1 and errors[0]["ename"] == "CheckFailed", cell.outputs
    assert len(errors[0]["traceback"]) == 1 and "1 of 1 public checks failed" in errors[0]["traceback"][0]
    assert not any(s in line for line in errors[0]["traceback"] for s in ("gpucourse", ".py", "File ", "Traceback"))
    assert determine_grade(cell, None) == (0, 2.0), "nbgrader must score the failed test cell 0"


def test_only_plain_data_crosses():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    with pytest.raises(TypeError):
        checks.as_data([AlwaysEqual()])
    assert checks.as_data({"a": [1, 2.5, "x", None]}) == {"a": [1, 2.5, "x", None]}


def test_script_exercise_is_not_launched_without_its_functions():
    result = ddp.run_exercise_script({}, "average_across_ranks")
    assert result["returncode"] == "not run" and "shard_indices" in result["tail"]


def test_script_exercise_is_not_launched_while_unanswered():
    placeholder = "def average_gradients(model):\n    \"\"\"doc\"\"\"\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
    ns = {"average_gradients": lambda model: None}
    with ddp.launch_policy(ddp.LaunchPolicy(sources={"average_gradients": placeholder})):
        result = ddp.run_exercise_script(ns, "average_gradients")
    assert result == {"returncode": "not run", "ranks": {}, "tail": "not answered yet: average_gradients"}
    answered = placeholder.replace("raise NotImplementedError()", "if model is None:\n        raise NotImplementedError()")
    assert ddp.unanswered(answered, ["average_gradients"]) == []


def test_first_raised_names_a_ranks_own_error_before_a_lost_peer():
    lost = "RuntimeError: [../gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:1952"
    ranks = {"0": {"runs": [{"weights": []}, {"error": lost}]},
             "1": {"runs": [{"weights": []}, {"error": "ValueError: mine"}]},
             "2": {"runs": [{"weights": []}]}}
    assert ddp.first_raised(ranks, 3) == (1, "1", "ValueError: mine")
    assert ddp.first_raised({"0": ranks["0"], "2": ranks["2"]}, 3) == (1, "0", lost)  # no rank's own: the lost peer's
    assert ddp.first_raised({"0": {"runs": [{}, {}]}, "1": {"runs": "forged"}, "2": {}}, 2) is None


@pytest.mark.slow  # starts sandbox workers, pools or ranks many times (10-25 s): `make test`, not `make test-fast`
def test_a_rank_that_raises_releases_its_peers_from_the_collective_they_wait_in(tmp_path):
    """Rank 1's answer raises where rank 0's is inside an all-reduce: ``ddp.settle`` on rank 1 leaves the
    group, and rank 0's all-reduce fails with gloo's lost peer, not at the collective timeout (set here to
    600 s, beyond the launch's own 240 s); then both stop, and both still report."""
    from gpucourse import launch

    script = tmp_path / "ranks.py"
    script.write_text(
        "import json, sys, torch, torch.distributed as dist\n"
        "from gpucourse.checks.ddp import leave, settle\n"
        "from gpucourse.checks.ddp_harness import init_process_group\n"
        "init_process_group(device='cpu')\n"
        "rank, runs = dist.get_rank(), []\n"
        "for run in range(3):\n"
        "    record = {}\n"
        "    try:\n"
        "        if rank == 1 and run == 1:\n"
        "            raise ValueError('only on rank 1')\n"
        "        dist.all_reduce(torch.ones(3))\n"
        "    except Exception as error:\n"
        "        record['error'] = f'{type(error).__name__}: {error}'[:200]\n"
        "    runs.append(record)\n"
        "    if not settle('error' in record):\n"
        "        break\n"
        "leave()\n"
        "open(sys.argv[1] + f'/rank{rank}.json', 'w').write(json.dumps({'runs': runs}))\n")
    done = launch.torchrun([str(script), str(tmp_path)], nproc=2, timeout=240,
                           env={**os.environ, "GPUCOURSE_COLLECTIVE_SECONDS": "600"})
    assert done.returncode == 0 and not done.timed_out, done.output[-2000:]
    ranks = {str(r): json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert [len(ranks[r]["runs"]) for r in "01"] == [2, 2]
    assert any(words in ranks["0"]["runs"][1]["error"] for words in ddp.LOST_PEER), ranks
    assert ddp.first_raised(ranks, 3) == (1, "1", "ValueError: only on rank 1")


def test_script_source_comes_from_the_notebook_cells_that_define_it():
    cell = "import torch\n\nclass Model:\n    pass\n\ndef make_trainer(n):\n    return n\n"
    ns = {"In": ["", "x = 1", cell.replace("return n", "return 0"), cell, "check('x')"], "Model": object,
          "make_trainer": print}
    source = ddp.exercise_source(ns, "synced", ["Model", "make_trainer"])
    assert source == ddp.HEADER + cell  # the latest cell defining both, once, with its imports


def test_lesson01_trapdoor_gives_each_square_chain_and_the_judge_wants_the_work_done_elsewhere():
    """The grader's primes multiply to the public modulus; through them it finds the end of any chain (as
    doing the squarings does); the CPU-time judge fails results that skip fn, and work seen in the caller's
    user time (its system time, forks for the pool, never counts against it)."""
    import random

    from gpucourse.processes_threads import MODULUS, square_chain

    from autograders.checks.lesson01_processes_threads import parallel_map as hidden  # the time-lock puzzle
    p, q = hidden._PRIME_P, hidden._PRIME_Q
    assert p * q == MODULUS and 1 < p < MODULUS and p != q
    for base, squarings in ((2, 0), (MODULUS - 2, 1), (p, 5), (3 ** 900 % MODULUS, 3_000)):
        assert hidden.reference_square_chain(base, squarings) == square_chain((None, base, squarings))[1]
    drawn = hidden.draw_cpu_time(random.Random(1))
    items = checks.values.rebuild(drawn["items"])
    done = checks.values.describe([(x, hidden.reference_square_chain(b, s)) for x, b, s in items])
    skipped = checks.values.describe([(x, b) for x, b, _ in items])
    work = hidden._squaring_seconds(sum(s for _, _, s in items))  # what the judge measures too

    def seen(user, system=0.0):
        return {"worker_cpu_s": user + system, "worker_user_s": user}

    assert hidden.judge_cpu_time(done, drawn, seen(work / 10)) is None
    assert hidden.judge_cpu_time(done, drawn, seen(work / 10, system=5 * work)) is None  # forks on a loaded machine
    assert "fn was not run on every item" in hidden.judge_cpu_time(skipped, drawn, seen(0.0))
    assert "in the order of items" in hidden.judge_cpu_time(done[::-1], drawn, seen(0.0))
    assert "ran fn in this process" in hidden.judge_cpu_time(done, drawn, seen(work))
    assert "did not see the CPU time" in hidden.judge_cpu_time(done, drawn, {"worker_cpu_s": work})  # no user time
    assert "did not see the CPU time" in hidden.judge_cpu_time(done, drawn, None)


def test_lesson01_the_work_is_timed_five_times_once_then_once_more_per_judgement_keeping_the_fastest():
    """The cost of one squaring is measured when a judge first asks (five timings), then once more each time,
    and the fastest is kept: the estimate only falls, scales with the count, and is not above the cost of
    doing those squarings now (what a cheat's process would spend)."""
    import time

    from gpucourse.processes_threads import MODULUS

    from autograders.checks.lesson01_processes_threads import parallel_map as hidden

    hidden._PER_SQUARING.clear()
    first = hidden._squaring_seconds(10_000)
    assert len(hidden._PER_SQUARING) == 1 and first == hidden._PER_SQUARING[0] * 10_000 > 0
    second = hidden._squaring_seconds(10_000)
    assert second <= first and hidden._squaring_seconds(0) == 0
    assert hidden._squaring_seconds(30_000) == pytest.approx(3 * hidden._PER_SQUARING[0] * 10_000)
    value, start = 3, time.thread_time()
    for _ in range(20_000):
        value = value * value % MODULUS
    assert hidden._squaring_seconds(20_000) <= 1.5 * (time.thread_time() - start)


def test_one_declaration_per_exercise_drives_notebooks_hidden_checks_and_readme():
    """register() is the one place an exercise is declared: its notebook has the answer cell and a test
    cell with the declared points, its hidden cases join it by name, the README's table is written from it."""
    from autograders import release

    for source in notebooks(SOLUTIONS):
        assignment = source.parent.name
        declared = {e.name: e for e in checks.exercises(assignment)}
        nb = read(source)
        answers = [nbgrader_meta(c)["grade_id"] for c in nb.cells if nbgrader_meta(c).get("solution") and c.cell_type == "code"]
        tests = {nbgrader_meta(c)["grade_id"]: nbgrader_meta(c)["points"] for c in nb.cells
                 if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")}
        assert sorted(answers) == sorted(declared), f"{assignment}: answer cells {answers}, declared {list(declared)}"
        assert tests == {e.test_id: e.points for e in declared.values()}, f"{assignment}: test cells and points"
        assert set(engine.load_checks(assignment).HIDDEN) <= set(declared)
    readme = (ROOT / "README.md").read_text()
    assert release.TABLE_START + "\n" + checks.exercise_table() + "\n" + release.TABLE_END in readme, \
        "README.md's table of exercises is stale: run make release"


# --- every fixture judged in this process: its exercise's public and hidden cases, as the grader judges them

def _fixture_params():
    from autograders import classroom

    return [pytest.param(kind, exercise, path, id=f"{assignment}/{kind}/{path.stem}")
            for assignment, kind, exercise, path in classroom.fixtures()]


def grading_seed() -> int:
    """The seed of the drawn inputs in an in-process judgement: GPUCOURSE_TEST_SEED (conftest.py fixes one,
    so that a run is reproducible), or with GPUCOURSE_TEST_SEED=random a new one each time, as in grading (a
    failure names the seed it drew, to draw the same inputs again)."""
    import secrets

    given = os.environ.get("GPUCOURSE_TEST_SEED", "random")
    return secrets.randbits(63) if given == "random" else int(given)


def judge_answer(exercise: str, source: str, filename: str = "<answer>", until: str | None = None) -> list[str]:
    """The ✗ lines the grader's judges give an answer cell ``source`` of ``exercise`` (observed here, not
    in the sandbox: quick enough for one lesson's fixtures, ``-k lesson04``). ``filename``: a file that
    holds ``source``, for code that reads its own source (Triton's ``@jit``). ``until``: stop at the first
    ✗ line that holds it (a wrong fixture's intended reason: the cases after it cannot change the verdict)."""

    assignment = checks.EXERCISES[exercise].assignment if exercise in checks.EXERCISES else None
    hidden = engine.load_checks(assignment or next(e.assignment for e in checks.exercises() if e.name == exercise))
    import types

    # as in the runner (and a kernel), the namespace is a real __main__ module: its classes pickle
    main = types.ModuleType("__main__")
    ns = main.__dict__
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = main
    try:  # the source passed in as the grader's worker passes it: its launch policy, launcher kept
        with ddp.launch_policy(dataclasses.replace(ddp.policy(), sources={exercise: source})):
            return _judge_in(ns, hidden, exercise, source, filename, until)
    finally:
        sys.modules["__main__"] = saved


def _judge_in(ns, hidden, exercise, source, filename, until=None):

    try:
        exec(compile(source, filename, "exec"), ns)
    except Exception as error:  # an answer cell that raises still gets every case's verdict
        print(f"the answer cell raised {type(error).__name__}: {error}")
    failures = []
    named = engine.cases_for(hidden, exercise)
    seed = grading_seed()
    inputs = engine.draw_inputs(seed, named)
    for case_id, case in named:
        try:  # ``seen`` as the grader's supervisor measures it, here in this process (Case.observe_seen)
            data, seen = case.observe_seen(ns, inputs.get(case_id))
            observation = {"ok": True, "data": checks.as_data(data), "seen": seen}
        except checks.AnswerError as error:
            observation = {"ok": False, "answer": True, "error": str(error)}
        except Exception as error:
            observation = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        verdict = engine._judge(case, observation, inputs.get(case_id))
        if verdict is not None:
            failures.append(f"✗ {case.name}: {verdict} [inputs drawn from seed {seed}: GPUCOURSE_TEST_SEED={seed} draws them again]")
            if until is not None and until in failures[-1]:
                break
    return failures


@pytest.mark.parametrize("kind, exercise, path", _fixture_params())
def test_fixture_judged_in_process_as_its_first_line_says(kind, exercise, path, request):
    """A wrong fixture fails with a ✗ line holding its first line's reason, a right one passes every case.
    A multi-process exercise's launches are forked as in grading (conftest's ``forked_launches``)."""
    from autograders import classroom

    checks.exercises()
    if isinstance(checks.EXERCISES[exercise].kind, checks.Script):
        request.getfixturevalue("forked_launches")
    reason = None if kind == "right" else classroom.intended(path)[1]
    failures = judge_answer(exercise, path.read_text(), str(path), until=reason)
    if kind == "right":
        assert not failures, failures
    else:
        assert any(reason in line for line in failures), f"no ✗ line with {reason!r}; got {failures}"


def _global_names(code) -> set[str]:
    """The global names a function's code (and the code nested in it) reads."""
    import dis

    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            names |= _global_names(const)
    return names


def test_every_observer_is_self_contained():
    """The grader sends an observer's own source into the sandbox: every global name it reads must be a
    builtin (its imports are inside it), never a name of the module it is written in."""
    import builtins
    import inspect


    leaks = []
    for exercise in checks.exercises():
        hidden = engine.load_checks(exercise.assignment)
        for case_id, case in engine.cases_for(hidden, exercise.name):
            source = inspect.getsource(case.observe)
            if not source.lstrip().startswith("def "):
                leaks.append(f"{case_id}: its observer is not a def")
                continue
            code = compile(inspect.cleandoc(source) if source[:1].isspace() else source, "<observer>", "exec")
            function = next(c for c in code.co_consts if hasattr(c, "co_code"))
            outside = sorted(n for n in _global_names(function) if not hasattr(builtins, n))
            if outside:
                leaks.append(f"{case_id} ({case.observe.__name__}): reads {outside}")
    assert not leaks, "\n".join(leaks)


def test_judges_rebuild_seeded_models_one_thread_at_a_time():
    """The grader judges in threads; a judge that seeds torch's global generator gets its own draws."""

    import torch

    from gpucourse.checks.seeded import global_rng

    def draws(seed):
        with global_rng(seed):
            return [torch.nn.Linear(64, 64).weight.sum().item() for _ in range(20)]

    alone = {seed: draws(seed) for seed in range(4)}
    together = {}
    threads = [threading.Thread(target=lambda s=seed: together.__setitem__(s, draws(s))) for seed in range(4) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
    before = torch.random.get_rng_state()
    draws(0)
    assert torch.equal(torch.random.get_rng_state(), before), "the global state is put back"

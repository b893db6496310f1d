"""Adversarial submissions, graded in one batch next to an honest student.

Each attack is built from the released notebook and states the most its honest content deserves
per test cell (usually 0: the attack replaces a real answer). The suite checks that no attack
scores above that, that the batch finishes, that the honest bystander keeps full marks and an
intact record, that the flags a person needs are raised, and that nothing outlives the run.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import AUTOGRADERS, COURSE, ROOT, SOLUTIONS, nbgrader_meta, read

ASSIGNMENT = "lesson01_processes_threads"
NOTEBOOK = "processes_threads.ipynb"
TESTS = ["test_parallel_map", "test_lines_dataset", "test_choose_tools", "test_average_across_ranks"]
MARKER = f"gpucourse-adversary-{uuid.uuid4().hex}"

import sandbox  # noqa: E402 - after conftest put autograders/ on the path

# Without namespaces some attacks (kill(-1), a fork bomb) would hit the machine running the tests.
pytestmark = pytest.mark.skipif(not sandbox.namespaces_available(),
                                reason="the adversarial suite needs the isolated sandbox: root and unshare, as in CI")


def _released() -> dict:
    return json.loads((COURSE / ASSIGNMENT / NOTEBOOK).read_text())


def _reference_answers() -> dict[str, str]:
    return {nbgrader_meta(c)["grade_id"]: c.source for c in read(SOLUTIONS / ASSIGNMENT / NOTEBOOK).cells
            if nbgrader_meta(c).get("solution") and c.cell_type == "code"}


def _cell(nb: dict, grade_id: str) -> dict:
    return next(c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id)


def answered(**answers: str) -> dict:
    """The released notebook with the reference answers, then ``answers`` (grade id -> source) on top."""
    nb = _released()
    for grade_id, source in {**_reference_answers(), **answers}.items():
        _cell(nb, grade_id)["source"] = source
    return nb


def unanswered(**answers: str) -> dict:
    nb = _released()
    for grade_id, source in answers.items():
        _cell(nb, grade_id)["source"] = source
    return nb


ALWAYS_THREADS = '''
from concurrent.futures import ThreadPoolExecutor
def parallel_map(fn, items, kind, workers=None):
    if kind not in ("cpu", "io"):
        raise ValueError(kind)
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))
'''

DDP_GOOD_SHARDS = '''
import torch
import torch.distributed as dist
def shard_indices(n, rank, world_size):
    return list(range(rank, n, world_size))
'''


def _with(nb: dict, edit) -> dict:
    nb = copy.deepcopy(nb)
    edit(nb)
    return nb


def _test_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "").startswith("test_")]


def _attacks(paths: dict[str, Path]) -> dict[str, dict]:
    """name -> {"nb": notebook dict | "raw": bytes | "link": target, "max": {test: most points}, "exact": {...}, "flag": text}"""
    zero = {t: 0 for t in TESTS}
    secret_paths = [str(AUTOGRADERS / "checks" / f"{ASSIGNMENT}.py"), str(SOLUTIONS / ASSIGNMENT / NOTEBOOK)]
    others_full = {t: 2 for t in TESTS if t != "test_parallel_map"}
    return {
        # --- the notebook's structure -----------------------------------------------------
        "tampered_test_cells": {"nb": _with(unanswered(), lambda nb: [c.update(source="pass") for c in _test_cells(nb)]),
                                "max": zero, "flag": "locked cell test_parallel_map: changed"},
        "deleted_test_cells": {"nb": _with(unanswered(), lambda nb: nb.update(cells=[c for c in nb["cells"] if c not in _test_cells(nb)])),
                               "max": zero, "flag": "locked cell test_parallel_map: deleted"},
        "duplicated_test_cells": {"nb": _with(unanswered(), lambda nb: nb["cells"].extend(copy.deepcopy(_test_cells(nb)))),
                                  "max": zero, "flag": "duplicated"},
        "reordered_cells": {"nb": _with(unanswered(), lambda nb: nb["cells"].reverse()), "max": zero, "flag": "reordered"},
        "changed_points": {"nb": _with(unanswered(), lambda nb: [c["metadata"]["nbgrader"].update(points=100) for c in _test_cells(nb)]),
                           "max": zero, "flag": "metadata changed"},
        "answer_turned_markdown": {"nb": _with(answered(), lambda nb: _cell(nb, "parallel_map").update(cell_type="markdown")),
                                   "max": {"test_parallel_map": 0}, "exact": others_full, "flag": "changed from code to markdown"},
        "schema_version_99": {"nb": _with(answered(), lambda nb: nb["cells"].append({
            "cell_type": "code", "id": "extra", "metadata": {"nbgrader": {"grade": True, "grade_id": "bonus", "locked": True,
                                                                           "points": 99, "schema_version": 99, "solution": False}},
            "source": "pass", "outputs": [], "execution_count": None})),
            "exact": {t: 2 for t in TESTS}, "flag": "not in the released notebook"},
        # --- code that attacks the checks -------------------------------------------------
        "input_transformer": {"nb": unanswered(parallel_map="get_ipython().input_transformers_cleanup.append(lambda lines: ['pass\\n'])"),
                              "max": zero, "flag": "IPython hooks"},
        "pre_run_cell_hook": {"nb": unanswered(parallel_map="get_ipython().events.register('pre_run_cell', lambda *a: None)\nparallel_map = lambda *a, **k: [1, 4, 9]"),
                              "max": zero, "flag": "IPython hooks"},
        "patched_builtins": {"nb": unanswered(parallel_map="import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.AssertionError = type('Never', (Exception,), {})\n"
                                                           "def parallel_map(fn, items, kind, workers=None):\n    return [1, 4, 9]"),
                             "max": zero, "flag": "builtins"},
        "patched_testing_libraries": {"nb": unanswered(parallel_map="import torch.testing, numpy.testing\ntorch.testing.assert_close = lambda *a, **k: None\n"
                                                                    "numpy.testing.assert_allclose = lambda *a, **k: None\nparallel_map = lambda fn, items, kind, workers=None: list(map(fn, items))"),
                                      "max": zero, "flag": "patches"},
        "patched_course_helpers": {"nb": unanswered(parallel_map=ALWAYS_THREADS + "import os, gpucourse.parallel\n"
                                                    "gpucourse.parallel.worker_identity = lambda x, seconds=0.02: (x, os.getpid() + 1, 0)\n"
                                                    "os.getpid = lambda: -1\n"),
                                   "max": zero, "flag": "patches the course"},
        "always_equal_object": {"nb": unanswered(parallel_map="class Anything(list):\n    def __eq__(self, other):\n        return True\n"
                                                              "    def __ne__(self, other):\n        return False\n"
                                                              "def parallel_map(fn, items, kind, workers=None):\n    return Anything()"),
                                "max": zero, "flag": "overrides equality"},
        "tensor_subclass": {"nb": unanswered(lines_dataset="import torch\nclass Liar(torch.Tensor):\n    @classmethod\n"
                                                           "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n        return True\n"
                                                           "class LinesDataset(torch.utils.data.Dataset):\n    def __init__(self, path):\n        self.n = sum(1 for _ in open(path))\n"
                                                           "    def __len__(self):\n        return self.n\n    def __getitem__(self, i):\n        return torch.zeros(1).as_subclass(Liar)"),
                            "max": zero, "flag": "torch dispatch"},
        "nan_answers": {"nb": unanswered(average_across_ranks=DDP_GOOD_SHARDS + "def average_across_ranks(tensor):\n    return torch.full_like(tensor, float('nan'))"),
                        "max": zero},
        "writes_gradebook_and_results": {"nb": unanswered(parallel_map="\n".join(
            f"try:\n    open({str(p)!r}, 'w').write('0')\nexcept OSError as error:\n    print('blocked:', error)"
            for p in [paths["gradebook"], paths["grades"], paths["bystander_log"]])), "max": zero},
        "reads_hidden_tests_by_path": {"nb": unanswered(parallel_map="\n".join(
            f"try:\n    exec(open({p!r}).read())\nexcept Exception as error:\n    print('hidden from me:', error)" for p in secret_paths)),
            "max": zero, "flag": "reads the grader"},
        "reads_environment_and_proc": {"nb": unanswered(parallel_map=
            "import os, glob\nfound = [open(p, 'rb').read() for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline')]\n"
            "hints = [f for f in found if b'autograders' in f or b'solutions' in f]\nassert not hints, hints\n"
            "print(sorted(k for k in os.environ))"), "max": zero, "flag": "reads the grader"},
        "detects_grading_mode": {"nb": unanswered(parallel_map=
            "import os\nGRADING = os.getuid() == 65534 or 'get_ipython' not in globals()\n"
            "def parallel_map(fn, items, kind, workers=None):\n    # pretend to the checks it knows about\n"
            "    return [fn(x) for x in items] if GRADING else None"), "max": zero},
        # --- code that attacks the run ----------------------------------------------------
        "sys_exit": {"nb": answered(parallel_map="import sys\nsys.exit('bye')"), "max": {"test_parallel_map": 0},
                     "exact": others_full, "flag": "hard exits"},
        "os_exit": {"nb": answered(parallel_map="import os\nos._exit(0)"), "max": zero, "flag": "hard exits"},
        "kills_parent_and_everyone": {"nb": unanswered(parallel_map="import os, signal\nfor pid in (os.getppid(), -1):\n"
                                                                    "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as error:\n        print(error)"),
                                      "max": zero, "flag": "hard exits"},
        "atexit_forgery": {"nb": unanswered(parallel_map="import atexit, os\natexit.register(lambda: os.write(1, b'{\"type\": \"done\"}'))"),
                           "max": zero, "flag": "hard exits"},
        "background_child": {"nb": unanswered(parallel_map=f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(900)', '{MARKER}'], start_new_session=True)"),
                             "max": zero},
        "fork_bomb": {"nb": answered(choose_tools="import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
                      "max": {"test_choose_tools": 0}},
        "memory_blowup": {"nb": answered(parallel_map="hog = bytearray(200 << 30)"), "max": {"test_parallel_map": 0}, "exact": others_full},
        "infinite_loop": {"nb": answered(parallel_map="while True:\n    pass"), "max": {"test_parallel_map": 0}, "exact": others_full},
        "ignores_every_signal": {"nb": answered(parallel_map="import signal\nfor s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"),
                                 "max": zero, "flag": "hard exits"},
        "output_flood": {"nb": answered(choose_tools="import sys\nfor _ in range(50):\n    sys.stdout.write('x' * (1 << 20))\n" + _reference_answers()["choose_tools"]),
                         "exact": {t: 2 for t in TESTS}},
        # --- files that are not what they claim --------------------------------------------
        "corrupt_json": {"raw": b'{"cells": [ this is not json', "max": zero, "flag": "not valid JSON"},
        "not_utf8": {"raw": b'{"cells": [], "note": "\xff\xfe\xfa"}', "max": zero, "flag": "not UTF-8"},
        "symlink_to_solutions": {"link": SOLUTIONS / ASSIGNMENT / NOTEBOOK, "max": zero, "flag": "symlink"},
        # --- multi-process scripts ---------------------------------------------------------
        "ddp_rank_skips_collective": {"nb": answered(average_across_ranks=DDP_GOOD_SHARDS +
            "def average_across_ranks(tensor):\n    if dist.get_rank() == 1:\n        return tensor.clone()\n"
            "    total = tensor.clone()\n    dist.all_reduce(total)\n    return total / 2"), "max": {"test_average_across_ranks": 0}},
        "ddp_rank_exits_early": {"nb": answered(average_across_ranks=DDP_GOOD_SHARDS +
            "import sys\ndef average_across_ranks(tensor):\n    if dist.get_rank() == 1:\n        sys.exit(0)\n"
            "    total = tensor.clone()\n    dist.all_reduce(total)\n    return total / 2"), "max": {"test_average_across_ranks": 0}},
        "ddp_ignores_world_size": {"nb": answered(average_across_ranks=DDP_GOOD_SHARDS.replace("world_size)", "4)") +
            "def average_across_ranks(tensor):\n    total = tensor.clone()\n    dist.all_reduce(total)\n    return total / 4"),
            "max": {"test_average_across_ranks": 0}},
        "ddp_rank0_fakes_a_pass": {"nb": answered(average_across_ranks=DDP_GOOD_SHARDS +
            "import json, os, sys\ndef average_across_ranks(tensor):\n    out = sys.argv[2]\n    if dist.get_rank() == 0:\n"
            "        for r in (0, 1):\n            rec = {'rank': r, 'world_size': 2, 'shards': {'10': list(range(r, 10, 2)), '7': list(range(r, 7, 2))},"
            " 'average': [1.5, 5.0], 'input_unchanged': True}\n            open(os.path.join(out, f'rank{r}.json'), 'w').write(json.dumps(rec))\n"
            "        os._exit(0)\n    import time\n    time.sleep(600)"), "max": {"test_average_across_ranks": 0}},
        "ddp_port_taken": {"nb": answered(average_across_ranks="import torch.distributed as dist\n"
            "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:29500', rank=0, world_size=2)\n" +
            _reference_answers()["average_across_ranks"]), "max": {"test_average_across_ranks": 0}},
    }


@pytest.fixture(scope="module")
def battle(tmp_path_factory):
    import grade

    submissions = tmp_path_factory.mktemp("adversarial-submitted")
    results = tmp_path_factory.mktemp("adversarial-results")
    paths = {"gradebook": results / "nbgrader" / "gradebook.db", "grades": results / "grades.csv",
             "bystander_log": results / "logs" / f"bystander__{ASSIGNMENT}.log"}
    attacks = _attacks(paths)
    for name, attack in {**attacks, "bystander": {"nb": answered()}}.items():
        folder = submissions / name / ASSIGNMENT
        folder.mkdir(parents=True)
        if "nb" in attack:
            (folder / NOTEBOOK).write_text(json.dumps(attack["nb"]))
        elif "raw" in attack:
            (folder / NOTEBOOK).write_bytes(attack["raw"])
        else:
            (folder / NOTEBOOK).symlink_to(attack["link"])
    started = time.perf_counter()
    batch = grade.grade(submissions, results, jobs=2, limits=sandbox.Limits(wall_seconds=60))
    return attacks, batch, results, time.perf_counter() - started


def _scores(results: Path, student: str) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{results / 'nbgrader' / 'gradebook.db'}") as gb:
        return {t: gb.find_grade(t, Path(NOTEBOOK).stem, ASSIGNMENT, student).score for t in TESTS}


def test_enough_attacks():
    assert len(_attacks({"gradebook": Path("/x"), "grades": Path("/x"), "bystander_log": Path("/x")})) >= 25


def test_no_attack_scores_above_its_honest_content(battle):
    attacks, batch, results, _ = battle
    too_high = []
    for name, attack in attacks.items():
        scores = _scores(results, name)
        for test, most in {**attack.get("max", {}), **attack.get("exact", {})}.items():
            if scores[test] > most:
                too_high.append(f"{name}: {test} scored {scores[test]} > {most}")
    assert not too_high, "\n".join(too_high)


def test_robust_runs_keep_their_honest_points(battle):
    attacks, _, results, _ = battle
    lost = [f"{name}: {test} {scores[test]} != {want}" for name, attack in attacks.items()
            for scores in [_scores(results, name)] for test, want in attack.get("exact", {}).items() if scores[test] != want]
    assert not lost, "\n".join(lost)


def test_batch_finishes_and_bystander_is_untouched(battle):
    attacks, batch, results, seconds = battle
    assert not batch.problems, batch.problems
    assert _scores(results, "bystander") == {t: 2 for t in TESTS}
    log = (results / "logs" / f"bystander__{ASSIGNMENT}.log").read_text()
    assert log.startswith(f"bystander/{ASSIGNMENT}: 8/8") and "blocked" not in log
    rows = (results / "grades.csv").read_text().splitlines()
    assert len(rows) == 1 + len(attacks) + 1, "every student has one row in grades.csv"


def test_flags_say_why(battle):
    attacks, batch, results, _ = battle
    flagged = (results / "flagged.txt").read_text()
    missing = [f"{name}: expected a flag with {attack['flag']!r}" for name, attack in attacks.items()
               if "flag" in attack and not any(line.startswith(f"{name}/") and attack["flag"] in line for line in flagged.splitlines())]
    assert not missing, "\n".join(missing)
    assert "bystander/" not in flagged


def test_nothing_outlives_the_batch(battle):
    time.sleep(1)
    for entry in Path("/proc").iterdir():
        try:
            assert MARKER not in (entry / "cmdline").read_bytes().decode(errors="replace"), "a student's process survived"
        except OSError:
            continue


def test_feedback_reveals_no_hidden_check_code(battle):
    _, _, results, _ = battle
    hidden_source = (AUTOGRADERS / "checks" / f"{ASSIGNMENT}.py").read_text()
    secrets = ["def judge_", "ACCEPTED = ", "list(range(int(k), int(n), 2))"]
    assert all(s in hidden_source for s in secrets)
    page = (results / "feedback" / "bystander" / ASSIGNMENT / "processes_threads.html").read_text()
    assert "hidden check:" in page, "feedback names the hidden checks that ran"
    assert not any(s in page for s in secrets)

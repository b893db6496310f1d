"""Adversarial submissions, graded in one batch next to an honest student.

Each attack is built from the released notebook and states the most its honest content deserves per test cell (usually
0: the attack replaces a real answer). The suite checks that no attack scores above that, that the batch finishes,
that the honest bystander keeps full marks and an intact record, that the flags a person needs are raised, and that
nothing outlives the run. An attack on what the checks observe is built to score full marks if it worked (a wrong
answer the patch would make pass, a right one behind a forbidden import), so that each test can fail; the plan must
call it forgery (which zeroes the submission), and where the cell's own output can show that a file stayed unreadable
or an import closed, the test reads it there.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

from autograders import engine, sandbox
from conftest import COURSE, EXECUTED, REQUIRE_ISOLATION, ROOT, SOLUTIONS, NotebookFailed, executed_solution, nbgrader_meta, read

pytestmark = pytest.mark.slow  # grades dozens of attack submissions in sandboxes: `make test`, not `make test-fast`

ASSIGNMENT = "lesson01_processes_threads"
NOTEBOOK = "processes_threads.ipynb"
TESTS = ["test_parallel_map", "test_lines_dataset", "test_choose_tools", "test_average_across_ranks"]
# Each submission's wall-clock limit in the battle (its cells get a sixth, an observer half), with room for the slowest
# honest run, kills_the_launch_copy: its 4 launches start torchrun; 58 s alone, 117 s of a 120-s limit once in the suite.
BATTLE_SECONDS = 180
MARKER = f"gpucourse-adversary-{uuid.uuid4().hex}"
BESIDE = f"gpucourse-answers-{uuid.uuid4().hex[:8]}"  # a folder beside the checkout, holding a solution


@pytest.fixture(autouse=True, scope="module")
def _isolated():
    """Without namespaces some attacks (kill(-1), a fork bomb) would hit the machine running the tests:
    skip then, with what is missing; GPUCOURSE_REQUIRE_ISOLATION=1 (CI) makes that a failure."""
    if not sandbox.namespaces_available():
        why = "the adversarial suite needs an isolated sandbox: " + sandbox.probe().describe()
        if REQUIRE_ISOLATION:
            pytest.fail(why)
        pytest.skip(why)


def _released() -> dict:
    return json.loads((COURSE / ASSIGNMENT / NOTEBOOK).read_text())


def _reference_answers() -> dict[str, str]:
    return {nbgrader_meta(c)["grade_id"]: c.source for c in read(SOLUTIONS / ASSIGNMENT / NOTEBOOK).cells
            if nbgrader_meta(c).get("solution") and c.cell_type == "code"}


def _hidden_source() -> str:
    """Every file of the assignment's hidden checks (a module, or a package of one module per exercise)."""
    path = engine.hidden_path(ASSIGNMENT)
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    return "\n".join(f.read_text() for f in files)


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


DDP_GOOD_SHARDS = '''
import torch
import torch.distributed as dist
def shard_indices(n, rank, world_size):
    return list(range(rank, n, world_size))
'''


# Each attack on what the observers see is built to score full marks if it worked: a wrong answer
# that the patch would make pass. Patched: the helper every parallel_map observer calls.
PATCHED_IDENTITY = '''
import os, threading, time
from concurrent.futures import ThreadPoolExecutor
KIND = ["io"]
def parallel_map(fn, items, kind, workers=None):  # threads for both kinds: wrong for "cpu"
    if kind not in ("cpu", "io"):
        raise ValueError(kind)
    KIND[0] = kind
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))
def forged_identity(x, seconds=0.02):  # "another process" whenever the kind is "cpu"
    time.sleep(seconds)
    return x, os.getpid() + (KIND[0] == "cpu"), threading.get_ident()
'''

# Items one too large, which a patched int() of a tensor (every lines_dataset observer's read) would hide.
OFF_BY_ONE_DATASET = '''
import torch
from torch.utils.data import Dataset
class LinesDataset(Dataset):
    def __init__(self, path):
        self.values = [int(line) for line in open(path) if line.strip()]
    def __len__(self):
        return len(self.values)
    def __getitem__(self, index):
        if not 0 <= index < len(self.values):
            raise IndexError(index)
        return torch.tensor(self.values[index] + 1)
'''

# Skips the first line as a header, which a patched write_int_lines (a blank first line) would hide.
SKIPS_FIRST_LINE = OFF_BY_ONE_DATASET.replace("+ 1)", ")").replace("if line.strip()]", "if line.strip()][1:]")


# Code left running after its cell, each way re-applying a patch (by a route the scan does not see)
# while the observers run: PATCHED_IDENTITY's wrong answer would then pass every parallel_map check.
REAPPLY = PATCHED_IDENTITY + "import gpucourse.processes_threads as helpers\n_set = setattr\n" \
    "def reapply(*args):\n    _set(helpers, 'worker_identity', forged_identity)\n"
LEFT_RUNNING = {
    "thread": "import threading, time\ndef keep():\n    while True:\n        reapply()\n        time.sleep(0.0005)\n"
              "threading.Thread(target=keep, daemon=True).start()\n",
    "trace_function": "import sys\ndef tracer(frame, event, arg):\n    reapply()\n    return None\nsys.settrace(tracer)\n",
    "audit_hook": "import sys\nsys.addaudithook(lambda event, args: reapply())\n",
    "gc_callback": "import gc\ngc.callbacks.append(lambda phase, info: reapply())\n",
    "profiling_timer": "import signal\nsignal.signal(signal.SIGPROF, reapply)\nsignal.setitimer(signal.ITIMER_PROF, 0.0005, 0.0005)\n",
}

RIGHT_CHOICES = {"a": "processes", "b": "threads", "c": "asyncio", "d": "processes", "e": "serial", "f": "threads"}
# Observation records for every choose_tools case, written to every descriptor (the results pipe, once
# reachable from a cell), beside a wrong answer: accepted, they would score full marks.
FORGED_RECORDS = (
    "import json, os\n"
    f"forged = {RIGHT_CHOICES!r}\n"
    "cases = ['choose_tools/public/0'] + [f'choose_tools/hidden/{i}' for i in range(4)]\n"
    "lines = ''.join(json.dumps({'type': 'observation', 'case': c, 'ok': True, 'data': forged}) + chr(10) for c in cases)\n"
    "for fd in range(3, 256):\n    try:\n        os.write(fd, lines.encode())\n    except OSError:\n        pass\n"
    "choices = {k: 'serial' for k in 'abcdef'}\n")

# Everything reachable from a cell that holds an observer's source, printed into the feedback.
LEAK_OBSERVERS = (
    "import gc, re, sys\nfound = set()\ndef look(text):\n    found.update(re.findall(r'def (obs' + r'erve_\\w+)', text))\n"
    "for o in gc.get_objects():\n    if type(o) is dict:\n        for v in list(o.values())[:50]:\n"
    "            if type(v) is str:\n                look(v)\n"
    "f = sys._getframe()\nwhile f is not None:\n    for v in list(f.f_locals.values()):\n        look(repr(v))\n    f = f.f_back\n"
    "print('observers seen:', sorted(found))\n")

# The key to the answer exercises (make release writes it into the package), tried letter by letter.
ANSWER_KEY = (
    "import gpucourse, hashlib, itertools, json, os\nchoices = {k: 'serial' for k in 'abcdef'}\ntry:\n"
    "    key = json.load(open(os.path.join(os.path.dirname(gpucourse.__file__), 'checks', 'self_check' + '.json')))\n"
    "    key = key['exercises']['choose_tools']\n"
    "    for combo in itertools.product(['serial', 'threads', 'processes', 'asyncio'], repeat=6):\n"
    "        guess = dict(zip('abcdef', combo))\n"
    "        text = json.dumps(guess, sort_keys=True, separators=(',', ':'), ensure_ascii=False)\n"
    "        if hashlib.sha256((key['salt'] + text).encode()).hexdigest() in key['hashes']:\n"
    "            choices = guess\n            break\n"
    "except OSError as error:\n    print('hidden from me:', error)\n")

# A public launch's record, put in the checks' launch cache during the cells, beside a wrong average.
FORGED_LAUNCH = (
    "import json, sys\ndef average_across_ranks(tensor):\n    return tensor.clone()\n"
    "reports = {str(r): {'rank': r, 'world_size': 2, 'shards': {'10': list(range(r, 10, 2)), '7': list(range(r, 7, 2))},"
    " 'average': [1.5, 5.0], 'input_unchanged': True} for r in (0, 1)}\n"
    f"checks = {'gpucourse.checks.'[::-1]!r}[::-1]\n"
    "f = sys._getframe()  # up to the runner's frames, whose module holds the checks' ddp (gc.get_objects misses frozen dicts)\n"
    "while getattr(f.f_globals.get('ddp'), '__name__', '') != checks + 'ddp':\n    f = f.f_back\no = vars(f.f_globals['ddp'])\n"
    "key = (o['_policy'].sources['average_across_ranks'], 2, checks + 'lesson01:drive_average_across_ranks', 'null')\n"
    "o['_LAUNCHED'][key] = {'returncode': 0, 'ranks': reports, 'tail': ''}\n")

# A common bug: a loop that swallows every exception, the cell's timeout too.
SWALLOWS_TIMEOUT = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass\n"


def _wrong_ranks_launching(reference: str, route: str) -> str:
    """average_across_ranks without any communication, and a patch of the launcher: launched with the
    reference's source instead, every rank of the real script would report the right values."""
    return (DDP_GOOD_SHARDS + "def average_across_ranks(tensor):\n    return tensor.clone()\n"
            f"REFERENCE = {reference!r}\n"
            "def launch_the_reference(real):\n    def launch(ns, exercise, inputs=None):\n"
            "        import dataclasses\n"
            "        g = real.__globals__  # the checks' launcher module: its launch policy, with the reference as the source\n"
            "        with g['launch_policy'](dataclasses.replace(g['policy'](), sources={exercise: REFERENCE})):\n"
            "            return real(ns, exercise, inputs)\n"
            "    return launch\n" + route)


def _with(nb: dict, edit) -> dict:
    nb = copy.deepcopy(nb)
    edit(nb)
    return nb


def _test_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "").startswith("test_")]


def _attacks(paths: dict[str, Path]) -> dict[str, dict]:
    """name -> {"nb": notebook dict | "raw": bytes | "link": target, "max": {test: most points}, "exact": {...},
    "flag": text, "forgery": the plan must give a reason that zeroes the submission,
    "output": {answer grade id: texts, one of which the graded cell's output must hold}}"""
    zero = {t: 0 for t in TESTS}
    hidden_checks, solution = str(engine.hidden_path(ASSIGNMENT)), str(SOLUTIONS / ASSIGNMENT / NOTEBOOK)
    others_full = {t: 2 for t in TESTS if t != "test_parallel_map"}
    reference = _reference_answers()
    unreadable = ["No such file", "Permission denied"]
    solution_relative = f"solutions/{ASSIGNMENT}/{NOTEBOOK}"
    read_reference = (  # a notebook's parallel_map cell, run: the reference answer, if the file can be read
        "def run_reference(path):\n    import json\n    cells = json.load(open(path))['cells']\n"
        "    exec(next(''.join(c['source']) for c in cells if c.get('metadata', {}).get('nbgrader', {}).get('grade_id') == 'parallel_map'), globals())\n")
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
        # with IPython, every later cell would first define the reference parallel_map
        "input_transformer": {"nb": unanswered(parallel_map="REFERENCE = " + repr(reference["parallel_map"]) +
                                               "\nget_ipython().input_transformers_cleanup.append(lambda lines: REFERENCE.splitlines(True) + lines)"),
                              "max": zero, "flag": "IPython hooks"},
        "pre_run_cell_hook": {"nb": unanswered(parallel_map="get_ipython().events.register('pre_run_cell', lambda *a: None)\nparallel_map = lambda *a, **k: [1, 4, 9]"),
                              "max": zero, "flag": "IPython hooks"},
        # --- patches of what the observers call, each by another route: each would score full if it
        # reached the observers; each is undone after the cell, and zeroes the submission (forgery)
        "patched_course_helpers": {"nb": unanswered(parallel_map=PATCHED_IDENTITY + "import gpucourse.processes_threads\n"
                                                    "gpucourse.processes_threads.worker_identity = forged_identity\n"),
                                   "max": zero, "flag": "patches `gpucourse.processes_threads.worker_identity`", "forgery": True},
        "setattr_on_module_alias": {"nb": unanswered(parallel_map=PATCHED_IDENTITY + "import gpucourse.processes_threads as helpers\n"
                                                     "setattr(helpers, 'worker_identity', forged_identity)\n"),
                                    "max": zero, "flag": "patches `gpucourse.processes_threads.worker_identity`", "forgery": True},
        "vars_of_module": {"nb": unanswered(parallel_map=PATCHED_IDENTITY + "import gpucourse.processes_threads\n"
                                            "vars(gpucourse.processes_threads)['worker_identity'] = forged_identity\n"),
                           "max": zero, "flag": "patches `gpucourse.processes_threads.__dict__", "forgery": True},
        "import_as_then_assign": {"nb": unanswered(parallel_map=PATCHED_IDENTITY + "from gpucourse import processes_threads as p\n"
                                                   "helpers = p\nhelpers.worker_identity = forged_identity\n"),
                                  "max": zero, "flag": "patches `gpucourse.processes_threads.worker_identity`", "forgery": True},
        "patched_observer_helper": {"nb": unanswered(lines_dataset=SKIPS_FIRST_LINE +
                                                     "import gpucourse\nfrom gpucourse.processes_threads import write_int_lines as real\n"
                                                     "gpucourse.processes_threads.write_int_lines = lambda path, values: real(path, [0, *values])\n"),
                                    "max": zero, "flag": "patches `gpucourse.processes_threads.write_int_lines`", "forgery": True},
        "patched_torch_method": {"nb": unanswered(lines_dataset=OFF_BY_ONE_DATASET +
                                                  "torch.Tensor.__int__ = lambda self: round(self.item()) - 1\n"),
                                 "max": zero, "flag": "patches `torch.Tensor.__int__`", "forgery": True},
        "patched_check_module_helper": {"nb": unanswered(average_across_ranks=_wrong_ranks_launching(
            reference["average_across_ranks"], "import gpucourse.checks.ddp as launcher\n"
            "launcher.run_exercise_script = launch_the_reference(launcher.run_exercise_script)\n")),
            "max": zero, "flag": "imports the checks' `gpucourse.checks.ddp`", "forgery": True,
            "output": {"average_across_ranks": ["gpucourse.checks.ddp is not available while grading"]}},
        "import_module_of_checks": {"nb": unanswered(average_across_ranks=_wrong_ranks_launching(
            reference["average_across_ranks"], "import importlib\nlesson = importlib.import_module('gpucourse.checks.' + 'lesson01_processes_threads')\n"
            "launches = lesson.judge_script_ran.__globals__\n"
            "launches['run_exercise_script'] = launch_the_reference(launches['run_exercise_script'])\n")),
            "max": zero, "flag": "reaches the checks' `gpucourse.checks.lesson01_processes_threads`", "forgery": True,
            "output": {"average_across_ranks": ["gpucourse.checks.lesson01_processes_threads is not available while grading"]}},
        # the grader's sandbox side is closed to the cells too: a right answer that must first reach the
        # runner (its FREEZE, its snapshot) through a name the scan cannot read
        "imports_the_worker": {"nb": unanswered(parallel_map="import importlib\n"
                                                "runner = importlib.import_module('rennur.rekrow.sredargotua'[::-1])\n"
                                                "runner.FREEZE['keep'].add(1)\n" + reference["parallel_map"]),
                               "max": zero, "output": {"parallel_map": ["autograders is not available while grading"]}},
        # no public check module holds an answer any more; this one stands for it: a right answer that
        # needs an import from one
        "oracle_from_check_module": {"nb": unanswered(parallel_map="from gpucourse.checks.lesson01_processes_threads import drive_average_across_ranks\n"
                                                      + reference["parallel_map"]),
                                     "max": zero, "flag": "imports the checks' `gpucourse.checks.lesson01_processes_threads`", "forgery": True,
                                     "output": {"parallel_map": ["gpucourse.checks.lesson01_processes_threads is not available while grading"]}},
        "forgery_beside_right_answers": {"nb": answered(choose_tools=reference["choose_tools"] +
                                                        "\nimport gpucourse.processes_threads\ngpucourse.processes_threads.square = lambda x: x * x\n"),
                                         "max": zero, "zeroed": True, "flag": "patches `gpucourse.processes_threads.square`", "forgery": True},
        "patched_builtins": {"nb": unanswered(parallel_map="import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.AssertionError = type('Never', (Exception,), {})\n"
                                                           "def parallel_map(fn, items, kind, workers=None):\n    return [1, 4, 9]"),
                             "max": zero, "flag": "patches `builtins.isinstance`", "forgery": True},
        "patched_testing_libraries": {"nb": unanswered(parallel_map="import torch.testing, numpy.testing\ntorch.testing.assert_close = lambda *a, **k: None\n"
                                                                    "numpy.testing.assert_allclose = lambda *a, **k: None\nparallel_map = lambda fn, items, kind, workers=None: list(map(fn, items))"),
                                      "max": zero, "flag": "patches `torch.testing.assert_close`", "forgery": True},
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
        # --- secrets read by path: each would score full if the file could be read ----------------
        "reads_solution_by_path": {"nb": unanswered(parallel_map=read_reference +
            f"try:\n    run_reference({solution!r})\nexcept OSError as error:\n    print('hidden from me:', error)"),
            "max": zero, "flag": "reads the grader's or the solutions' files", "forgery": True, "output": {"parallel_map": unreadable}},
        "reads_hidden_checks_by_path": {"nb": unanswered(choose_tools=
            f"try:\n    text = open({hidden_checks!r}).read()\n    start = text.index('ACCEPTED = ') + len('ACCEPTED = ')\n"
            "    choices = {k: sorted(v)[0] for k, v in eval(text[start:text.index(chr(10), start)]).items()}\n"
            "except OSError as error:\n    print('hidden from me:', error)"),
            "max": zero, "flag": "reads the grader's or the solutions' files", "forgery": True, "output": {"choose_tools": unreadable}},
        # the grader's folder, learnt from any process's environment, command line or working folder
        "reads_environment_and_proc": {"nb": unanswered(parallel_map=read_reference +
            "import glob, os\nroots = {'/'}\nfor proc in glob.glob('/proc/[0-9]*'):\n"
            "    for link in ('cwd', 'root'):\n        try:\n            roots.add(os.readlink(f'{proc}/{link}'))\n"
            "        except OSError:\n            pass\n"
            "    for name in ('environ', 'cmdline'):\n        try:\n            words = open(f'{proc}/{name}', 'rb').read().decode(errors='replace')\n"
            "        except OSError:\n            continue\n"
            "        roots.update(w.split('/autograders')[0] for w in words.replace('=', chr(0)).split(chr(0)) if '/autograders' in w)\n"
            "print(sorted(k for k in os.environ))\nfor root in sorted(roots):\n    try:\n"
            f"        run_reference(os.path.join(root, {solution_relative!r}))\n        break\n"
            "    except OSError as error:\n        print('hidden from me:', error)"),
            "max": zero, "flag": "reads the grader's files, processes", "output": {"parallel_map": unreadable}},
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
        # the clean copy that graded launches fork from, killed (the worker's sibling under the sandbox's PID 1):
        # the launches start torchrun instead and score as they would, and a person is told; never forgery
        "kills_the_launch_copy": {"nb": answered(choose_tools=_reference_answers()["choose_tools"] +
                                                 "\nimport os, signal\nfrom gpucourse.launch import descendants\n"
                                                 "for pid in descendants(os.getppid()) - {os.getpid()} - descendants(os.getpid()):\n"
                                                 "    os.kill(pid, signal.SIGKILL)"),
                                  "exact": {t: 2 for t in TESTS}, "flag": "the clean copy that graded launches fork from ended"},
        # its processes die with its cell (runner.kill_strays), and count against its own user only
        "fork_bomb": {"nb": answered(choose_tools="import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
                      "max": {"test_choose_tools": 0}, "exact": {t: 2 for t in TESTS if t != "test_choose_tools"}},
        "memory_blowup": {"nb": answered(parallel_map="hog = bytearray(200 << 30)"), "max": {"test_parallel_map": 0}, "exact": others_full},
        "infinite_loop": {"nb": answered(parallel_map="while True:\n    pass"), "max": {"test_parallel_map": 0}, "exact": others_full},
        # stopped from outside, then the cells after it run in a fresh process: the other answers keep their points
        "ignores_every_signal": {"nb": answered(parallel_map="import signal\nfor s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"),
                                 "max": {"test_parallel_map": 0}, "exact": others_full, "flag": "hard exits"},
        "swallows_its_timeout": {"nb": answered(parallel_map=SWALLOWS_TIMEOUT), "max": {"test_parallel_map": 0}, "exact": others_full},
        # --- the checks' secrets and the runner's state, from a cell --------------------------
        **{f"left_running_{how}": {"nb": unanswered(parallel_map=REAPPLY + code), "max": zero,
                                   **({} if how == "audit_hook" else {"flag": "not quiet"})}
           for how, code in LEFT_RUNNING.items()},
        "forged_records": {"nb": unanswered(choose_tools=FORGED_RECORDS), "max": zero, "flag": "forged", "forgery_at_run": True},
        "leaks_hidden_observers": {"nb": unanswered(parallel_map=LEAK_OBSERVERS), "max": zero, "leak": True},
        "brute_forces_the_answer_key": {"nb": unanswered(choose_tools=ANSWER_KEY), "max": zero,
                                        "output": {"choose_tools": unreadable}},
        "reads_executed_solutions": {"nb": unanswered(parallel_map=read_reference.replace("'nbgrader'", repr("nbgrader"[::-1]) + "[::-1]") +
            "import gpucourse, os\nhere = os.path.dirname(os.path.dirname(os.path.dirname(gpucourse.__file__)))\n"
            f"for path in [os.path.join(here, 'build', 'executed', {ASSIGNMENT!r}, {NOTEBOOK!r}),\n"
            f"             os.path.join(os.path.dirname(here), {BESIDE!r}, {NOTEBOOK!r})]:\n"
            "    try:\n        run_reference(path)\n        break\n    except OSError as error:\n        print('hidden from me:', error)\n"),
            "max": zero, "output": {"parallel_map": unreadable}},
        "fills_the_launch_cache": {"nb": unanswered(average_across_ranks=DDP_GOOD_SHARDS + FORGED_LAUNCH), "max": zero,
                                   "never": "✓ both ranks finish and agree"},
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
    from autograders import grade

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
    # answers outside /tmp where a checkout keeps them: executed solution notebooks in build/, and a
    # folder beside the checkout (the sandbox shows neither, wherever the checkout is). The first is this
    # pytest run's own execution of the lesson (conftest.executed_solution, which the notebook tests share):
    # a copy planted there instead would pass, on another worker, for that execution (its file is this
    # run's), and its removal after the batch would delete the real one, to be run again.
    try:
        executed_solution(SOLUTIONS / ASSIGNMENT / NOTEBOOK)
    except NotebookFailed:
        pass  # tests/test_notebooks.py reports it; a copy is planted below, dated as no run of this session
    planted = [EXECUTED / ASSIGNMENT / NOTEBOOK, ROOT.parent / BESIDE / NOTEBOOK]
    made = [p for p in planted if not p.exists()]
    folders = [f for p in made for f in [*reversed(p.parents)] if not f.exists()]  # created here, removed after
    for path in made:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOLUTIONS / ASSIGNMENT / NOTEBOOK, path)
        os.utime(path, (0, 0))  # older than this session: conftest.executed_solution never takes it for its run
    started = time.perf_counter()
    try:
        batch = grade.grade(submissions, results, jobs=2, limits=sandbox.Limits(wall_seconds=BATTLE_SECONDS))
    finally:
        for path in made:
            path.unlink()
        for folder in reversed(folders):
            folder.rmdir()
    return attacks, batch, results, time.perf_counter() - started


def _scores(results: Path, student: str) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{results / 'nbgrader' / 'gradebook.db'}") as gb:
        return {t: gb.find_grade(t, Path(NOTEBOOK).stem, ASSIGNMENT, student).score for t in TESTS}


def _no_paths() -> dict[str, Path]:
    return {"gradebook": Path("/x"), "grades": Path("/x"), "bystander_log": Path("/x")}


def test_enough_attacks():
    assert len(_attacks(_no_paths())) >= 25


def test_the_plan_names_every_forgery():
    """Without the sandbox: the scan finds each forgery (which zeroes the submission), and nothing in an honest one."""
    from autograders import assemble

    missed = []
    for name, attack in _attacks(_no_paths()).items():
        if attack.get("forgery"):
            forgery = assemble.plan(_released(), json.loads(json.dumps(attack["nb"]))).forgery
            if not any(attack["flag"] in reason for reason in forgery):
                missed.append(f"{name}: expected forgery with {attack['flag']!r}, got {forgery}")
    assert not missed, "\n".join(missed)
    honest = assemble.plan(_released(), answered())
    assert honest.forgery == [] and honest.flags == []


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
    hidden_source = _hidden_source()
    secrets = ["def judge_", "ACCEPTED = ", '"a": {"processes"}']
    assert all(s in hidden_source for s in secrets)
    page = (results / "feedback" / "bystander" / ASSIGNMENT / "processes_threads.html").read_text()
    assert "hidden check:" in page, "feedback names the hidden checks that ran"
    assert not any(s in page for s in secrets)


def _cell_output(results: Path, student: str, grade_id: str) -> str:
    """What the graded run printed and raised in one answer cell (the autograded notebook's outputs)."""
    nb = json.loads((results / "nbgrader" / "autograded" / student / ASSIGNMENT / NOTEBOOK).read_text())
    cell = _cell(nb, grade_id)
    return "\n".join(str(o.get("text", "")) + str(o.get("evalue", "")) + "".join(map(str, o.get("traceback", [])))
                     for o in cell.get("outputs", []))


def test_secrets_stayed_unreadable_and_the_checks_closed(battle):
    """From the graded cells' own output: the file could not be opened, the check module not imported."""
    attacks, _, results, _ = battle
    wrong = []
    for name, attack in attacks.items():
        for grade_id, texts in attack.get("output", {}).items():
            output = _cell_output(results, name, grade_id)
            if not any(t in output for t in texts):
                wrong.append(f"{name}: cell {grade_id} printed none of {texts}: {output[:300]!r}")
    assert not wrong, "\n".join(wrong)


def test_forgery_zeroes_every_score(battle):
    """Right answers beside a patch score nothing at all, and the report says why."""
    attacks, _, results, _ = battle
    for name, attack in attacks.items():
        if attack.get("zeroed"):
            assert _scores(results, name) == {t: 0 for t in TESTS}, name
            log = (results / "logs" / f"{name}__{ASSIGNMENT}.log").read_text()
            assert "scored 0: answer " in log and attack["flag"] in log, log[:2000]


def test_hidden_observers_never_reach_a_cell(battle):
    """A cell that prints every observer's source it can reach (the job, frames, gc) finds none: the
    observers reach the sandbox only after the cells, one at a time."""
    _, _, results, _ = battle
    hidden = _hidden_source()
    names = ["observe_io_threads", "observe_cpu_processes", "observe_dataset_bounds", "observe_generated_ranks"]
    assert all(f"def {n}" in hidden for n in names)
    printed = _cell_output(results, "leaks_hidden_observers", "parallel_map")
    page = (results / "feedback" / "leaks_hidden_observers" / ASSIGNMENT / "processes_threads.html").read_text()
    assert not any(n in printed or n in page for n in names), printed[:2000]


def test_records_written_by_a_cell_are_forgery(battle):
    attacks, _, results, _ = battle
    for name, attack in attacks.items():
        if attack.get("forgery_at_run"):
            log = (results / "logs" / f"{name}__{ASSIGNMENT}.log").read_text()
            assert "scored 0: " in log and "forged" in log, log[:2000]


def test_a_check_never_reads_what_a_cell_left_for_it(battle):
    """Verdicts a forgery would earn (a launch record put in the checks' cache) never appear."""
    attacks, _, results, _ = battle
    for name, attack in attacks.items():
        if attack.get("never"):
            log = (results / "logs" / f"{name}__{ASSIGNMENT}.log").read_text()
            assert attack["never"] not in log, log[:3000]

"""autograders/assemble.py's scan: each route to the checks or the grader, and each patch of what the checks
read, is flagged as forgery; what the lessons teach never is."""

from __future__ import annotations

import threading

import pytest

from autograders import assemble
from conftest import ROOT, SOLUTIONS, nbgrader_meta, notebooks, read


ATTACKS = {  # an answer's code -> the forgery reason the scan must give
    "from gpucourse.checks.lesson10_beyond_one_machine import lightning_slurm_ranks as slurm_ranks":
        "imports the checks' `gpucourse.checks.lesson10_beyond_one_machine`",
    "import gpucourse.checks": "imports the checks' `gpucourse.checks`",
    "from gpucourse import checks": "imports the checks' `gpucourse.checks`",
    "from gpucourse.checks import check as c": "imports the checks' `gpucourse.checks` (check)",
    "from gpucourse.checks import check, answer": "imports the checks' `gpucourse.checks` (check, answer)",
    "from gpucourse.checks import check\ncheck.__globals__['PUBLIC']": "reaches the checks' `gpucourse.checks.check.__globals__",
    "import gpucourse\nc = getattr(gpucourse, 'checks')": "reaches the checks' `gpucourse.checks`",
    "import importlib\nimportlib.import_module('gpucourse.checks.' + 'lesson01_processes_threads')":
        "gpucourse.checks.lesson01_processes_threads",
    "__import__(f'gpucourse.checks.lesson01_processes_threads')": "names the checks' `gpucourse.checks.lesson01_processes_threads`",
    "import sys\nsys.modules['gpucourse.checks.lesson10_beyond_one_machine'].x = 1": "gpucourse.checks.lesson10_beyond_one_machine",
    "import engine": "imports the grader's `engine`",
    "from autograders import assemble": "imports the grader's `autograders`",
    "from autograders.worker import runner": "imports the grader's `autograders.worker`",
    "import zygote": "imports the grader's `zygote`",  # every grader module by its bare name, found, not listed
    "import importlib\nimportlib.import_module('supervisor')": "the grader's `supervisor`",
    "from nbgrader.preprocessors import ClearSolutions": "imports the grader's `nbgrader.preprocessors`",
    "import gpucourse.processes_threads\ngpucourse.processes_threads.worker_identity = print":
        "patches `gpucourse.processes_threads.worker_identity`",
    "import gpucourse.processes_threads as p\nsetattr(p, 'square', print)": "patches `gpucourse.processes_threads.square`",
    "from gpucourse import tpus_xla\nm = tpus_xla\nm.count_host_reads = None": "patches `gpucourse.tpus_xla.count_host_reads`",
    "import gpucourse.tpus_xla\ndel gpucourse.tpus_xla.count_host_reads": "patches `gpucourse.tpus_xla.count_host_reads`",
    "import gpucourse.tpus_xla as x\nx.__dict__['count_host_reads'] = None": "patches `gpucourse.tpus_xla.__dict__[...]`",
    "import gpucourse.tpus_xla\nvars(gpucourse.tpus_xla).update(count_host_reads=None)": "patches `gpucourse.tpus_xla.__dict__[...]`",
    "import torch\ntorch.Tensor.tolist = lambda self: [1]": "patches `torch.Tensor.tolist`",
    "from torch import Tensor as T\nT.__int__ = int": "patches `torch.Tensor.__int__`",
    "import torch\nt = torch.zeros(1)\ntype(t).item = None": "patches `type(t).item`",
    "import torch\nt = torch.zeros(1)\nt.__class__.item = None": "patches `type(t).item`",
    "import torch.nn as nn\nnn.Module.__call__ = print": "patches `torch.nn.Module.__call__`",
    "from torch.utils.data import DataLoader\nDataLoader.__iter__ = iter": "patches `torch.utils.data.DataLoader.__iter__`",
    "import lightning.pytorch as pl\npl.Trainer.fit = print": "patches `lightning.pytorch.Trainer.fit`",
    "import numpy as np\nnp.allclose = lambda *a, **k: True": "patches `numpy.allclose`",
    "import os\nos.getpid = lambda: 1": "patches `os.getpid`",
    "import os\nfor m in (os,):\n    m.getpid = lambda: 1": "patches `os.getpid`",  # a loop's name bound to a module
    "import os\ndef f():\n    for m in [os]:\n        setattr(m, 'getpid', int)\nf()": "patches `os.getpid`",
    "import os, sys\n[setattr(m, 'getpid', int) for m in (sys, os)]": "patches `sys.getpid`",
    "import json\njson.dumps += ''": "patches `json.dumps`",
    "import builtins\nbuiltins.isinstance = lambda *a: True": "patches `builtins.isinstance`",
    "import sys, types\nsys.modules['darts'] = types.ModuleType('darts')": "patches `sys.modules[...]`",
    "import sys\nsys.meta_path.insert(0, None)": "patches `sys.meta_path[...]`",
    "def f():\n    pass\nf.__code__ = (lambda: 1).__code__": "rewrites a function's __code__",
    "open('/srv/course/autograders/checks/lesson01_processes_threads.py').read()": "reads the grader's or the solutions' files",
    "open('../solutions/lesson01/processes_threads.ipynb')": "reads the grader's or the solutions' files",
}


@pytest.mark.parametrize("code", list(ATTACKS))
def test_scan_calls_each_route_forgery(code):
    forgery, flags = assemble.scan({"answer": code})
    assert any(ATTACKS[code] in reason for reason in forgery), forgery
    assert all(reason in flags for reason in forgery)


@pytest.mark.parametrize("code", [
    "from gpucourse.checks import check\ncheck('parallel_map')",
    "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.benchmark = True",
    "import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\ndel os.environ['CUDA_VISIBLE_DEVICES']",
    "import sys\nsys.path.insert(0, '.')",
    "import torch\nclass Net(torch.nn.Module):\n    count = 0\n    def __init__(self):\n        super().__init__()\n"
    "        type(self).count += 1\n        self.layer = torch.nn.Linear(2, 2)\nNet.extra = 1\nx = torch.zeros(2)\nx[0] = 1",
    "import matplotlib.pyplot as plt\nplt.rcParams['figure.figsize'] = (4, 3)",
    "import os\nfor m in (1, 2):\n    m = m + 1\nfor p in [os.getcwd()]:\n    p = p + '/x'\nprint([n.upper() for n in ('a', os.sep)])",
    # words that are also names of grader modules, used as data, and every script's __main__
    "record = {'rank': 0, 'worker': 1}\nprint('grade', 'course', 'checks', 'trust')\nif __name__ == '__main__':\n    pass",
])
def test_scan_allows_what_lessons_teach(code):
    assert assemble.scan({"answer": code}) == ([], [])


@pytest.mark.slow  # starts sandbox workers, pools or ranks many times (10-25 s): `make test`, not `make test-fast`
def test_scans_in_threads_at_once_never_fail():
    """The pool grades submissions in threads, each scanned with ast.parse: on CPython before 3.11.8 two
    parses at once fail ("SystemError: AST constructor recursion depth mismatch", python/cpython#106905)
    whenever a collection runs Python finalizers in the middle of one, as here; ``assemble`` parses one at a time."""
    import gc

    answer = "\n".join(f"def f{i}(x):\n    return [y for y in range(x) if y % {i + 1}]" for i in range(300))
    errors = []

    class Cycle:
        def __del__(self):  # Python code run by the collector, wherever a thread happens to be
            sum(range(100))

    def grade_some():
        for _ in range(30):
            junk = [Cycle() for _ in range(50)]
            for item in junk:
                item.me = item
            del junk
            try:
                assert assemble.scan({"answer": answer}) == ([], [])
            except SystemError as error:
                errors.append(str(error))

    threshold = gc.get_threshold()
    gc.set_threshold(50)
    try:
        threads = [threading.Thread(target=grade_some) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*threshold)
    assert not errors, errors[:3]


def test_scan_follows_python_scoping_of_imported_names():
    context = ["import gpucourse.tpus_xla as X\nimport torch"]  # a released cell's imports

    def forgery(code):
        return assemble.scan({"answer": code}, context)[0]

    for own in ["X = torch.randn(3)\nX[0] = 1", "def f(X):\n    X[0] = 1", "def f():\n    X = {}\n    X['a'] = 1",
                "class A:\n    X = {}\n    X['a'] = 1"]:
        assert forgery(own) == [], own
    for patch in ["X.count_host_reads = None\nX = 0", "if False:\n    X = 0\nX.count_host_reads = None",
                  "def f():\n    X.count_host_reads = None", "def f():\n    global X\n    X = 0\n    X.count_host_reads = None",
                  "X = 0\nfor i in range(2):\n    X.count_host_reads = None\n    X = gpucourse_xla = __import__('gpucourse.tpus_xla')"]:
        assert forgery(patch), patch


def test_the_scan_looks_at_each_scope_once(monkeypatch):
    """What each scope binds is computed once per scan, however many nodes and imported names ask:
    computed at every ask, the scan grew with nodes x names x scope size (lesson 13's solution took 11.6 s,
    now 0.02 s: the grader scans every submission)."""
    import collections

    calls = collections.Counter()
    real = assemble._bindings

    def counted(scope, aliases):
        calls[id(scope)] += 1
        return real(scope, aliases)

    monkeypatch.setattr(assemble, "_bindings", counted)
    nb = read(SOLUTIONS / "lesson13_sharded_data_parallel" / "sharded_data_parallel.ipynb")
    answers = {nbgrader_meta(c)["grade_id"]: c.source for c in nb.cells if nbgrader_meta(c).get("solution") and c.cell_type == "code"}
    assert assemble.scan(answers) == ([], [])
    assert calls and max(calls.values()) == 1, calls.most_common(3)


def test_no_solution_or_right_fixture_is_flagged():
    """Every answer cell of the solutions (with the imports of their other cells) and every right fixture."""
    flagged = []
    for path in notebooks(SOLUTIONS):
        nb = read(path)
        answers = {nbgrader_meta(c)["grade_id"]: c.source for c in nb.cells
                   if nbgrader_meta(c).get("solution") and c.cell_type == "code"}
        context = [c.source for c in nb.cells if c.cell_type == "code" and not nbgrader_meta(c).get("solution")]
        flagged += [f"{path.name}: {f}" for f in assemble.scan(answers, context)[1]]
    for path in sorted((ROOT / "tests" / "fixtures").glob("*/right/*.py")):
        flagged += [f"{path.name}: {f}" for f in assemble.scan({path.stem: path.read_text()})[1]]
    assert not flagged, "\n".join(flagged)

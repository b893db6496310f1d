"""No notebook leaves CUDA state in its own process before a fork whose children use CUDA (lesson 6's rule).

On a GPU, a process forked after its parent initialized CUDA (or merely asked the CUDA runtime how many
GPUs there are) dies with "Cannot re-initialize CUDA in forked subprocess" as soon as it touches CUDA.
Lightning's ``ddp_notebook`` children always do when a GPU is present (they save the CUDA random state),
so do DataLoader workers or ``multiprocessing`` fork children that put tensors on the GPU. CI has no GPU,
so this check is dynamic: every notebook runs in a real kernel, in the smoke setting (a fork can hide in
a helper module, so none is skipped on the strength of its text), with
``tests/cuda_fork_simulator.py`` installed first. It pretends one H100 through NVML (so every GPU branch
is taken), records each call that would leave CUDA state in a process (CUDA initialized from C++ too:
streams, pinned memory, the allocator's history), marks every fork child as a
"bad fork" exactly when its parent had such state (torch's own rule), and records a violation when such
a child touches CUDA. Cells that need a real GPU fail in this run (there is none); their errors are
ignored, only the recorded events count. What the run cannot reach (a fork after a cell that fails for
want of a real GPU) it cannot judge: keep forks out of GPU-only cells' failure paths.

A violation needs a fork, so the run with a pretended GPU stops after the last cell that may fork: one in
which the notebook's process forked in this pytest run's CPU execution of it (``conftest.forked_cells``,
recorded from inside the kernel, so a fork in a helper module counts), or one whose code names a fork
(``MAY_FORK``, read outside comments and f-strings). A notebook with no such cell forks nowhere here, and its pretended run is not made (its
multi-rank demos start fresh Pythons through torchrun, which inherit no CUDA state). What this cannot see:
a fork that only the GPU branch of a helper makes, in a cell after the last one above.

Proof that it catches the bug it was written for: ``OLD_LESSON06`` holds the cells of lesson 6 as it
was when it failed on an H100 (preamble, imports, section 1's fit on ``S.device``, the 1- then
2-process ``ddp_notebook`` run), and the test asserts that it is flagged, with the cell that caused it.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from conftest import FIXTURES, SOLUTIONS, NotebookFailed, execute_notebook, forked_cells, notebook_param, notebooks, read

pytestmark = pytest.mark.slow  # runs every notebook with a pretended GPU: `make test`, not `make test-fast`

TESTS = Path(__file__).resolve().parent
DDP_FORK = re.compile(r"strategy\s*=\s*[\"']ddp_(notebook|fork)[\"']")
OLD_LESSON06 = FIXTURES / "fork_safety" / "lesson06_before_fix.ipynb"
# A cell whose code may fork the notebook's process (a pool, a fork, DataLoader workers, a Lightning strategy
# that forks): broad on purpose, a cell matched in error only costs time. Read in the cell's code, not in its
# comments or f-strings (text it prints); "ddp_spawn" is not here: its ranks are started fresh (the "spawn" start
# method), and inherit no CUDA state.
MAY_FORK = re.compile(r"fork|num_workers|multiprocessing|Pool\b|Process\(|ddp_notebook")


def code_of(source: str) -> str:
    """``source`` without its comments and f-strings (the words a cell prints or explains); other strings stay:
    ``get_context("fork")`` and ``strategy="ddp_notebook"`` are code. Unreadable as Python (a magic): all of it."""
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source
    kept = [t.string for t in tokens if t.type != tokenize.COMMENT
            and not (t.type == tokenize.STRING and re.match(r"(?i)r?fr?['\"]", t.string))]
    return " ".join(kept)


def last_cell_that_may_fork(path: Path) -> int | None:
    """The index of the last cell of solution notebook ``path`` that forked in this run's CPU execution of it
    or whose text may fork (None: no cell may). Where that execution failed, its last cell: all of it runs."""
    cells = read(path).cells
    try:
        forked = forked_cells(path)
    except NotebookFailed:  # tests/test_notebooks.py reports it; here the whole notebook runs pretended
        return len(cells) - 1
    named = [i for i, c in enumerate(cells) if c.cell_type == "code" and MAY_FORK.search(code_of(c.source))]
    return max(forked + named, default=None)


def run_with_pretend_gpu(nb, tmp_path: Path, profile: str = "1gpu", through: int | None = None) -> list[dict]:
    """Execute ``nb`` (its cells up to index ``through``, all of them if None) with the simulator installed
    first, pretending the machine ``profile`` (a key of ``cuda_fork_simulator.PROFILES``); every recorded
    event, in order."""
    import cuda_fork_simulator

    log = tmp_path / "cuda_events.jsonl"
    log.touch()
    install = nbformat.v4.new_code_cell(
        f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
        f"import cuda_fork_simulator; cuda_fork_simulator.install({str(log)!r}, profile={profile!r})")
    nb = nbformat.from_dict(nb)
    if through is not None:
        nb.cells = nb.cells[:through + 1]
    nb.cells.insert(0, install)
    execute_notebook(nb, tmp_path, timeout=600, allow_errors=True)
    errors = [o for o in nb.cells[0].get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"the simulator did not install: {errors}"
    return cuda_fork_simulator.read_events(log)


def describe(events: list[dict]) -> str:
    """The violations, and where the parent got the CUDA state that caused them."""
    lines = []
    for v in (e for e in events if e["kind"] == "violation"):
        lines.append(f"a forked child touched CUDA in cell {v['cell_number']} ({v['cell']!r}): {v['what']}")
    for s in (e for e in events if e["kind"] == "cuda_state"):
        lines.append(f"  the notebook's process got CUDA state in cell {s['cell_number']} ({s['cell']!r}): "
                     f"{s['what']}\n    via {s['where']}")
    return "\n".join(lines)


# In the xdist group of its notebook (conftest.notebook_param): the worker that executes the notebook on the
# CPU reads which of its cells forked from that run, instead of waiting for another worker's.
@pytest.mark.parametrize("path", [notebook_param(p) for p in notebooks(SOLUTIONS)], ids=lambda p: p.parent.name)
def test_no_cuda_state_before_a_fork_that_uses_it(path, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUCOURSE_REQUIRE", raising=False)  # GPU cells fail here by design, not by requirement
    last = last_cell_that_may_fork(path)
    if last is None:  # no fork in its CPU run, none in its text: no child for CUDA state to break
        return
    nb = read(path)
    events = run_with_pretend_gpu(nb, tmp_path, through=last)
    if any(c.cell_type == "code" and DDP_FORK.search(c.source) and ".fit(" in c.source for c in nb.cells):
        assert any(e["kind"] == "fork" for e in events), "its ddp_notebook fit never forked here: the check saw nothing"
    violations = [e for e in events if e["kind"] == "violation"]
    assert not violations, f"{path.relative_to(SOLUTIONS.parent)} fails on a GPU:\n{describe(events)}"


MIG_SLICE = "MIG-8c7a1f52-3b1e-5d0c-9a77-2f64c1d0e9b3"  # how Slurm or a scheduler hands a job one MIG slice


@pytest.mark.parametrize("profile, visible", [("2xT4", None), ("8gpu", None), ("mig", MIG_SLICE)])
def test_lesson_6_forks_safely_on_other_gpu_machines(profile, visible, tmp_path, monkeypatch):
    """Lesson 6 again, on Kaggle's two T4s, on eight GPUs, and on one A100 MIG slice named by its UUID: its
    ``ddp_notebook`` fits take other device counts there (``devices="auto"`` means every GPU), Lightning's
    own device checks run before the fork, and with ``CUDA_VISIBLE_DEVICES=MIG-<uuid>`` NVML cannot count
    (torch's ``_device_count_nvml`` gives up on MIG names), so whatever asks the CUDA runtime instead
    poisons the fork."""
    monkeypatch.delenv("GPUCOURSE_REQUIRE", raising=False)
    if visible:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    path = SOLUTIONS / "lesson06_lightning_devices" / "lightning_devices.ipynb"
    events = run_with_pretend_gpu(read(path), tmp_path, profile=profile)
    forked = any(e["kind"] == "fork" for e in events)
    if visible:  # the lesson spawns there instead (lightning_devices.quiet_trainer; tests/test_lightning_devices.py)
        assert not forked, f"lesson 6 forked on a MIG slice named by UUID:\n{describe(events)}"
    else:
        assert forked, f"no ddp_notebook fit forked with {profile}: the check saw nothing"
    violations = [e for e in events if e["kind"] == "violation"]
    assert not violations, f"lesson 6 fails on {profile}:\n{describe(events)}"


def test_the_check_catches_lesson_6_as_it_failed_on_an_h100(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUCOURSE_REQUIRE", raising=False)
    events = run_with_pretend_gpu(read(OLD_LESSON06), tmp_path)
    violations = [e for e in events if e["kind"] == "violation"]
    assert violations, "the old lesson 6 forked after using CUDA, and the check did not see it"
    assert all("ddp_notebook" not in e["cell"] and e["child"] for e in violations)
    assert {e["cell"] for e in violations} == {"timings = {}"}, describe(events)  # the cell that failed on the H100
    parent_state = [e for e in events if e["kind"] == "cuda_state"]
    assert any(e["cell"].startswith("epochs = S.size") for e in parent_state), describe(events)


def test_the_recorder_names_the_cells_whose_process_forked_and_changes_nothing_else(tmp_path):
    """conftest's recorder, in a real kernel: a fork and a multiprocessing fork child count, in their own
    cells; a subprocess (fork and exec: a fresh Python) does not; a cell that loads the GPU reference reads it,
    one that opens another JSON file does not; execution counts and outputs are as without it."""
    cells = ["print('first')",
             "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0); print('forked')",
             "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'pass'], check=True); print('a fresh python')",
             "import multiprocessing as mp\np = mp.get_context('fork').Process(target=print, args=('child',))\n"
             "p.start(); p.join(); print(p.exitcode)",
             "from gpucourse import reference as R\nref = R.load()\nimport json\njson.dump({}, open('other.json', 'w'))",
             "print(ref.short)",  # a value of the reference loaded before: that cell is the one that read it
             ""]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    recorded = execute_notebook(nb, tmp_path, timeout=120, record=True)
    assert recorded == {"fork": [1, 3], "read": [4]}
    assert [c.execution_count for c in nb.cells[:6]] == [1, 2, 3, 4, 5, 6]
    assert [o.get("text", "") for o in nb.cells[0].outputs] == ["first\n"]
    assert execute_notebook(nb, tmp_path, timeout=120) == {"fork": [], "read": []}  # nothing recorded unasked


def test_the_pretended_run_stops_after_the_last_cell_that_forked_or_names_a_fork(tmp_path, monkeypatch):
    import test_fork_safety as me

    cells = ["x = 1", "run_demo()", "loader = DataLoader(data, num_workers=2)", "plot()", "print(x)"]
    path = tmp_path / "lesson" / "lesson.ipynb"
    path.parent.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)
    monkeypatch.setattr(me, "forked_cells", lambda p: [1])
    assert me.last_cell_that_may_fork(path) == 2  # the text names DataLoader workers
    monkeypatch.setattr(me, "forked_cells", lambda p: [3])
    assert me.last_cell_that_may_fork(path) == 3  # a helper forked there: no text says so
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), path)
    monkeypatch.setattr(me, "forked_cells", lambda p: [])
    assert me.last_cell_that_may_fork(path) is None
    said = ['print(f"devices={d}, num_workers={w}")  # a DataLoader forks its workers',
            'pl.Trainer(devices=2, strategy="ddp_spawn")', "%time x = 1"]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in said]), path)
    assert me.last_cell_that_may_fork(path) is None  # printed, explained, spawned: no fork in the code
    forks = ['ctx = mp.get_context("fork")', 'pl.Trainer(strategy="ddp_notebook")', "%time x = os.fork()", "x = 1"]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in forks]), path)
    assert me.last_cell_that_may_fork(path) == 2  # a string that is code; a magic read whole

    def failed(p):
        raise NotebookFailed("cell 0 failed")

    monkeypatch.setattr(me, "forked_cells", failed)
    assert me.last_cell_that_may_fork(path) == len(forks) - 1  # its CPU run failed: every cell runs pretended


SCRIPT = """
import os, sys, torch
sys.path.insert(0, {tests!r})
import cuda_fork_simulator as sim
sim.install({log!r})
{before}
pid = os.fork()
if pid == 0:
    try:
        torch.zeros(1, device="cuda")
    except RuntimeError as error:
        print("child:", error)
    os._exit(0)
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("before, violation", [
    ("torch.cuda.is_available()", True),  # cudaGetDeviceCount: what the preamble did before it asked NVML
    ("from gpucourse.preamble import pick_device; pick_device()", False),
    ("import pytorch_lightning; torch.cuda.is_available()", False),  # Lightning sets the NVML switch on import
    ("torch.cuda.device_count()", False),
    ("torch.manual_seed(0)", False),  # CUDA seeding is queued until CUDA starts
    ("import contextlib\nwith contextlib.suppress(RuntimeError): torch.ones(1).cuda()", True),
    ("torch.ones(2).pin_memory()", True),  # CUDA initialized from C++ (tests/test_device_profiles.py: the others)
])
def test_the_simulator_follows_torchs_fork_rule(before, violation, tmp_path):
    import subprocess
    import sys

    import cuda_fork_simulator

    log = tmp_path / "events.jsonl"
    script = SCRIPT.format(tests=str(TESTS), log=str(log), before=before)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    events = cuda_fork_simulator.read_events(log)
    kinds = [e["kind"] for e in events]
    assert "fork" in kinds
    assert ("violation" in kinds) == violation, events
    if violation:
        assert cuda_fork_simulator.REAL_ERROR in run.stdout
    else:
        assert "child_cuda" in kinds  # the child's CUDA use was seen, and allowed

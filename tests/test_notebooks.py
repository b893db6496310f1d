"""Every notebook in solutions/ runs headless in a real Jupyter kernel, in the smoke setting, and shows
nothing on stderr but what ALLOWED_STDERR names (the libraries' messages about themselves are silenced
at their source: gpucourse.preamble.quiet_libraries, run by every notebook's setup cell)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import SOLUTIONS, NotebookFailed, executed_solution, notebook_param, notebooks

# (notebook folder's prefix, a regular expression a line must match, why the line is the lesson's to show)
ALLOWED_STDERR = [
    ("lesson04", r"\S+/configuration_validator\.py:\d+: You passed in a `val_dataloader` but have no `validation_step`",
     "section 5's TinyClassifier trains on a datamodule with a validation split and has no validation_step: "
     "Lightning's warning is about the cell's code"),
    ("lesson08", r"W\d{4} [\d:.]+ \d+ torch/_dynamo/convert_frame\.py:\d+\] \[\d+/\d+\]",
     "section 6 runs past dynamo's recompile limit on purpose; its text quotes the warning, 'hit config.recompile_limit'"),
    ("lesson08", r"W\d{4} [\d:.]+ \d+ torch/_dynamo/variables/tensor\.py:\d+\] \[\d+/\d+\]",
     "section 7 makes the graph break that .item() causes, and dynamo's warning names it"),
    ("lesson09", r"The metric denominator is zero for some entries\. Those entries are set to NaN",
     "the MAPE section shows Darts' default zero_division='warn' on a series with a zero month: the warning is its point"),
    ("lesson11", r"(FIT Profiler Report|-{40,}|\|  .*\|)\s*$",
     "the Lightning profiler section shows profiler='simple''s report, which Lightning logs (to stderr) when fit ends"),
]


def unexplained_stderr(nb, folder: str) -> list[str]:
    """Each stderr line of the executed notebook ``nb`` that no entry of ALLOWED_STDERR for ``folder``
    explains, as "cell N: line"."""
    allowed = [re.compile(pattern) for prefix, pattern, _ in ALLOWED_STDERR if folder.startswith(prefix)]
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") != "stream" or output.get("name") != "stderr":
                continue
            for line in output.get("text", "").splitlines():
                if line.strip() and not any(pattern.match(line) for pattern in allowed):
                    found.append(f"cell {index}: {line[:300]}")
    return found


@pytest.mark.parametrize("path", [notebook_param(p) for p in notebooks(SOLUTIONS)], ids=lambda p: p.parent.name)
def test_solution_notebook_executes(path):
    try:
        nb = executed_solution(path)  # saved for tests/test_site.py and the accelerator-cell summary
    except NotebookFailed as failure:
        pytest.fail(str(failure), pytrace=False)
    executed = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in executed), "some code cells did not run"


@pytest.mark.parametrize("path", [notebook_param(p) for p in notebooks(SOLUTIONS)], ids=lambda p: p.parent.name)
def test_solution_notebook_shows_nothing_unexplained_on_stderr(path):
    try:
        nb = executed_solution(path)  # the run above, read again: no notebook runs twice
    except NotebookFailed as failure:
        pytest.fail(str(failure), pytrace=False)
    found = unexplained_stderr(nb, path.parent.name)
    assert not found, (f"{path.parent.name} writes to stderr what no entry of ALLOWED_STDERR explains (silence a "
                       "library's message about itself in gpucourse.preamble.quiet_libraries):\n" + "\n".join(found[:20]))


def test_unexplained_stderr_reads_stderr_only_and_applies_the_lessons_own_entries():
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
    nb.cells[0].outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="a result\n"),
        nbformat.v4.new_output("stream", name="stderr", text="\n💡 Tip: try installing litlogger\n"),
        nbformat.v4.new_output("stream", name="stderr", text="W1128 03:25:26.949000 19620 torch/_dynamo/"
                               "convert_frame.py:2008] [0/8] torch._dynamo hit config.recompile_limit (8)\n")]
    assert unexplained_stderr(nb, "lesson08_tpus_xla") == ["cell 0: 💡 Tip: try installing litlogger"]
    assert len(unexplained_stderr(nb, "lesson09_darts_forecasting")) == 2  # lesson 8's entry is lesson 8's only


# What the first cells of a Lightning lesson do: the setup cell, torch.utils.benchmark (which imports
# torch.utils.cpp_extension), and one small fit with the Trainer's defaults on the CPU, in bfloat16.
FIRST_LIGHTNING_CELLS = """
from gpucourse import setup
S = setup(seed=0)
import torch
from torch import nn
from torch.utils import benchmark
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.net(batch[0]).squeeze(-1), batch[1])
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16)), batch_size=8)
trainer = pl.Trainer(accelerator="cpu", max_epochs=1, precision="bf16-mixed", logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), data)
pl.seed_everything(0)
print("fitted")
"""


@pytest.mark.slow  # a fresh kernel's setup cell and a first Lightning fit (about 14 s): `make test`, not `make test-fast`
def test_setup_and_a_first_lightning_fit_write_nothing_to_stderr(tmp_path):
    done = subprocess.run([sys.executable, "-c", FIRST_LIGHTNING_CELLS], capture_output=True, text=True, cwd=tmp_path,
                          timeout=900)  # minutes on a loaded machine: torch and Lightning import slowly
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fitted" in done.stdout
    assert done.stderr == "", done.stderr[-3000:]


# The cache of executed notebooks (conftest.executed_solution) that every test above reads, on toy notebooks
# with a stand-in for the kernel: what runs, how often, and in which order.

def _toy_solutions(tmp_path, monkeypatch, names):
    import conftest
    import nbformat

    monkeypatch.setattr(conftest, "SOLUTIONS", tmp_path / "solutions")
    monkeypatch.setattr(conftest, "EXECUTED", tmp_path / "executed")
    monkeypatch.setattr(conftest, "_FAILED", {})
    paths = []
    for name in names:
        path = tmp_path / "solutions" / name / f"{name}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"print({name!r})")]), path)
        paths.append(path)
    return conftest, paths


def test_a_failed_run_is_not_run_again_by_another_worker(tmp_path, monkeypatch):
    from nbclient.exceptions import CellTimeoutError

    conftest, [path] = _toy_solutions(tmp_path, monkeypatch, ["lesson98_toy"])
    runs = []

    def times_out(nb, cwd, timeout, allow_errors=False, record=False):
        runs.append(cwd)
        raise CellTimeoutError("A cell timed out while it was being executed")

    monkeypatch.setattr(conftest, "execute_notebook", times_out)
    for worker in ("this one", "another"):
        monkeypatch.setattr(conftest, "_FAILED", {})  # another worker: nothing of the first failure in its memory
        with pytest.raises(NotebookFailed, match="CellTimeoutError: A cell timed out"):
            conftest.executed_solution(path)
    assert len(runs) == 1, "the failed notebook ran again"


def test_notebooks_another_worker_is_running_wait_until_the_free_ones_ran(tmp_path, monkeypatch):
    import subprocess

    conftest, [held, free] = _toy_solutions(tmp_path, monkeypatch, ["lesson97_held", "lesson98_free"])
    order = []

    def runs(nb, cwd, timeout, allow_errors=False, record=False):
        order.append(nb.cells[0].source)
        nb.cells[0].execution_count = 1
        return {"fork": [], "read": []}  # no cell forked or read the reference

    monkeypatch.setattr(conftest, "execute_notebook", runs)
    lock = conftest.EXECUTED / "lesson97_held" / ".lesson97_held.ipynb.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom filelock import FileLock\n"
                               f"with FileLock({str(lock)!r}):\n    print('held', flush=True)\n    time.sleep(3)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert conftest.executed_solution(held, wait=False) is None
        done = conftest.executed_solutions([held, free])
    finally:
        holder.wait(timeout=60)
    assert order == ["print('lesson98_free')", "print('lesson97_held')"], order
    assert [nb.cells[0].execution_count for nb in done] == [1, 1]
    assert conftest.executed_solution(held).cells[0].source == "print('lesson97_held')"  # read back, not run
    assert len(order) == 2

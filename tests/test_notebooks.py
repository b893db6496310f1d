"""Every notebook in solutions/ runs headless in a real Jupyter kernel, in the smoke setting."""

from __future__ import annotations

import pytest

from conftest import SOLUTIONS, NotebookFailed, executed_solution, notebook_param, notebooks


@pytest.mark.parametrize("path", [notebook_param(p) for p in notebooks(SOLUTIONS)], ids=lambda p: p.parent.name)
def test_solution_notebook_executes(path):
    try:
        nb = executed_solution(path)  # saved for tests/test_site.py and the accelerator-cell summary
    except NotebookFailed as failure:
        pytest.fail(str(failure), pytrace=False)
    executed = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in executed), "some code cells did not run"

"""Every notebook in solutions/ runs headless in a real Jupyter kernel, in the smoke setting."""

from __future__ import annotations

import os

import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from conftest import SOLUTIONS, notebooks, read, save_executed


@pytest.mark.parametrize("path", notebooks(SOLUTIONS), ids=lambda p: p.parent.name)
def test_solution_notebook_executes(path, tmp_path):
    assert os.environ.get("GPUCOURSE_SMOKE") == "1", "run through `make test`, which sets GPUCOURSE_SMOKE=1"
    nb = read(path)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellExecutionError as error:
        index = next((i for i, c in enumerate(nb.cells)
                      if c.cell_type == "code" and any(o.get("output_type") == "error" for o in c.get("outputs", []))), "?")
        head = nb.cells[index].source.splitlines()[0] if index != "?" else ""
        pytest.fail(f"{path.relative_to(SOLUTIONS.parent)}: cell {index} ({head!r}) failed:\n{error}", pytrace=False)
    executed = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in executed), "some code cells did not run"
    save_executed(path, nb)  # tests/test_site.py renders the course from it, without running it again

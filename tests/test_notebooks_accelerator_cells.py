"""Every cell that needs a GPU or TPU (``if S.needs(...)``) shows in the summary: ran, or skipped and why.

Each such cell is one test that reads what it printed in this pytest run's execution of its notebook
(``conftest.executed_solution``: shared with tests/test_notebooks.py, run here if nothing ran it yet).
On a CPU they are skips carrying the cell's own reason, so the summary lists what never ran; `make
test-gpu` (GPUCOURSE_REQUIRE=cuda) runs them on a GPU, where a CUDA cell that skipped for want of any
GPU has already failed its notebook.
"""

from __future__ import annotations

import re

import pytest

from conftest import SOLUTIONS, NotebookFailed, executed_solution, notebook_param, notebooks, read

NEEDS = re.compile(r"S\.needs\(\s*\"(\w+)\"(?:\s*,\s*(?:count\s*=\s*)?(\d+))?\s*\)")


def accelerator_cells() -> list[tuple[str, int, str]]:
    """(notebook, code cell index among all cells, what it needs) for every ``S.needs`` cell in solutions/."""
    found = []
    for path in notebooks(SOLUTIONS):
        for index, cell in enumerate(read(path).cells):
            match = NEEDS.search(cell.source) if cell.cell_type == "code" else None
            if match:
                found.append((str(path.relative_to(SOLUTIONS)), index, f"{match.group(2) or 1} {match.group(1)}"))
    return found


CELLS = accelerator_cells()


def test_the_gpu_and_tpu_cells_are_found():
    assert len(CELLS) >= 15, CELLS
    assert {what.split()[1] for _, _, what in CELLS} >= {"cuda", "tpu"}


@pytest.mark.parametrize("notebook,index,what", [notebook_param(SOLUTIONS / n, n, i, w) for n, i, w in CELLS],
                         ids=[f"{n.split('/')[0]}[{i}]" for n, i, _ in CELLS])
def test_accelerator_cell(notebook, index, what):
    try:
        cell = executed_solution(SOLUTIONS / notebook).cells[index]
    except NotebookFailed as failure:
        pytest.fail(f"{notebook} did not execute, so its cell {index} never ran: {failure}", pytrace=False)
    assert NEEDS.search(cell.source), f"cell {index} of the executed {notebook} is not the S.needs cell: re-run it"
    printed = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert cell.get("execution_count") and not errors, f"{notebook} cell {index} did not run cleanly"
    skipped = re.search(r"Skipped: this cell needs .*", printed)
    if skipped:
        pytest.skip(f"{notebook} cell {index} ({what}): {skipped.group(0)}")

"""Every released notebook (course/), run as a student receives it, unanswered, in the smoke setting:
the only errors are the exercises' own. An answer cell raises its stub's NotImplementedError and a
check() cell ends with its one-line CheckFailed; any other error, or a traceback printed by a cell
(a library logging one), is a failure a student would read as the course crashing."""

from __future__ import annotations


import pytest

from conftest import COURSE, execute_notebook, nbgrader_meta, notebooks, read

from gpucourse import environment

pytestmark = pytest.mark.slow  # runs every released notebook unanswered: `make test`, not `make test-fast`

TRACEBACK = "Traceback (most recent call last)"


def _expected(cell, output) -> bool:
    meta = nbgrader_meta(cell)
    if meta.get("solution"):  # an answer cell, as released
        return output.ename == "NotImplementedError"
    if meta.get("grade"):  # a test cell: check("<exercise>") fails in one line, no traceback
        return output.ename == "CheckFailed" and len(output.get("traceback", [])) == 1
    return False


def problems(nb) -> list[str]:
    """What a student would read as a crash in the executed ``nb``: one line each."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        head = (cell.source.splitlines() or [""])[0][:60]
        for output in cell.get("outputs", []):
            if output.output_type == "error" and not _expected(cell, output):
                found.append(f"cell {index} ({head!r}): {output.ename}: {output.evalue.splitlines()[0] if output.evalue else ''}")
            elif output.output_type == "stream" and TRACEBACK in output.text:
                line = next((l for l in reversed(output.text.splitlines()) if l.strip()), "")
                found.append(f"cell {index} ({head!r}): a traceback printed on {output.name}, ending {line[:120]!r}")
    return found


@pytest.mark.parametrize("path", notebooks(COURSE), ids=lambda p: p.parent.name)
def test_released_notebook_runs_unanswered_with_no_traceback_outside_the_exercises(path, tmp_path):
    assert environment.smoke(), "run through `make test`, which sets GPUCOURSE_SMOKE=1"
    nb = read(path)
    execute_notebook(nb, tmp_path, timeout=900, allow_errors=True)
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code"), "some code cells did not run"
    assert any(_expected(c, o) for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"), \
        "no exercise failed: the notebook was not run unanswered"
    found = problems(nb)
    assert not found, f"{path.relative_to(COURSE.parent)}, unanswered:\n" + "\n".join(found)

"""Every released notebook (course/), run as a student receives it, unanswered, in the smoke setting:
the only errors are the exercises' own. An answer cell raises its stub's NotImplementedError and a
check() cell ends with its one-line CheckFailed; any other error, or a traceback printed by a cell
(a library logging one), is a failure a student would read as the course crashing.

What an unanswered run can change is what the answers reach. A measurement cell (tagged
``skip-when-grading``) whose source is the solution's, and which reads no name that an answer binds or
that a cell reading one binds (``elided_cells``: names read and bound, found by ``ast``), runs exactly
as in the solution run; it is not run again here (most of a lesson's minutes are such cells), and its
outputs in this pytest run's execution of the solution notebook (``conftest.executed_solution``) are
held to the same rule instead; its imports still run (a later cell may use them). A cell that a cell
run here needs (it binds a name that one reads) runs. What names cannot show is not followed: a side effect
(a file, a setting, a process) that a cell run here leaves differently when its answer is missing, and
that an elided cell after it would meet. Such a cell reads nothing the answers reach by name, so it
would have to find that effect by other means.
"""

from __future__ import annotations

import pytest

import cell_names
from conftest import COURSE, SOLUTIONS, execute_notebook, nbgrader_meta, notebook_param, notebooks, read

from autograders.assemble import SKIP_TAG
from gpucourse import environment

TRACEBACK = "Traceback (most recent call last)"


def _expected(cell, output) -> bool:
    meta = nbgrader_meta(cell)
    if meta.get("solution"):  # an answer cell, as released
        return output.ename == "NotImplementedError"
    if meta.get("grade"):  # a test cell: check("<exercise>") fails in one line, no traceback
        return output.ename == "CheckFailed" and len(output.get("traceback", [])) == 1
    return False


def problems(nb, cells=None) -> list[str]:
    """What a student would read as a crash in the executed ``nb`` (its cells of index in ``cells``, all
    of them if None): one line each."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or (cells is not None and index not in cells):
            continue
        head = (cell.source.splitlines() or [""])[0][:60]
        for output in cell.get("outputs", []):
            if output.output_type == "error" and not _expected(cell, output):
                found.append(f"cell {index} ({head!r}): {output.ename}: {output.evalue.splitlines()[0] if output.evalue else ''}")
            elif output.output_type == "stream" and TRACEBACK in output.text:
                line = next((l for l in reversed(output.text.splitlines()) if l.strip()), "")
                found.append(f"cell {index} ({head!r}): a traceback printed on {output.name}, ending {line[:120]!r}")
    return found


def elided_cells(released, solution) -> list[int]:
    """The cells of ``released`` an unanswered run need not make: tagged ``skip-when-grading``, the same
    source as ``solution``'s cell, reading no name an answer reaches (bound by an answer cell, not by an
    import the stub keeps, or by a cell that reads such a name), and binding no name a cell that runs reads."""
    if len(released.cells) != len(solution.cells):
        return []
    cells = cell_names.of_notebook(released, solution)
    sources = {i: cells[i][1] - cells[i][2] if cells[i] is not None else set()  # the stub's imports are the solution's
               for i, c in enumerate(released.cells) if nbgrader_meta(c).get("solution")}
    sources.update({i: cells[i][1] if cells[i] is not None else set() for i, (c, theirs)
                    in enumerate(zip(released.cells, solution.cells)) if c.source != theirs.source and i not in sources})
    affected = cell_names.reached(cells, sources)
    candidates = {i for i, c in enumerate(released.cells) if c.cell_type == "code" and cells[i] is not None
                  and i not in sources and i not in affected and not nbgrader_meta(c).get("grade")
                  and SKIP_TAG in c.get("metadata", {}).get("tags", [])}
    running = {i for i, c in enumerate(released.cells) if c.cell_type == "code"} - candidates
    return sorted(candidates - cell_names.needed(cells, running))


@pytest.mark.slow  # runs every released notebook unanswered: `make test`, not `make test-fast`
@pytest.mark.parametrize("path", [notebook_param(p) for p in notebooks(COURSE)], ids=lambda p: p.parent.name)
def test_released_notebook_runs_unanswered_with_no_traceback_outside_the_exercises(path, tmp_path):
    from conftest import executed_solution

    assert environment.smoke(), "run through `make test`, which sets GPUCOURSE_SMOKE=1"
    nb = read(path)
    solution_path = SOLUTIONS / path.relative_to(COURSE)
    elided = elided_cells(nb, read(solution_path))
    cell_names.elide(nb, elided)
    execute_notebook(nb, tmp_path, timeout=900, allow_errors=True)
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code" and c.source.strip()), \
        "some code cells did not run"
    assert any(_expected(c, o) for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"), \
        "no exercise failed: the notebook was not run unanswered"
    found = problems(nb) + ([f"{p} (in the solution run: this cell is the same, and no answer reaches it)"
                             for p in problems(executed_solution(solution_path), set(elided))] if elided else [])
    assert not found, f"{path.relative_to(COURSE.parent)}, unanswered:\n" + "\n".join(found)


def _notebook(cells):
    """A notebook of (source, kind) code cells; kind: "answer", "test", "skip" (tagged) or "" (a plain cell)."""
    import nbformat

    made = []
    for source, kind in cells:
        cell = nbformat.v4.new_code_cell(source)
        if kind == "answer":
            cell.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "f"}
        elif kind == "test":
            cell.metadata["nbgrader"] = {"solution": False, "grade": True, "grade_id": "test_f", "points": 1}
        elif kind == "skip":
            cell.metadata["tags"] = [SKIP_TAG]
        made.append(cell)
    return nbformat.v4.new_notebook(cells=made)


def test_a_measurement_is_elided_only_where_no_answer_reaches_it_and_no_cell_run_needs_it():
    solution = [
        ("from gpucourse import setup\nS = setup(seed=0)", ""),  # 0: plain: always runs
        ("import numpy as np\nbig = S.size(10, 2)\nslow = sum(range(big))", "skip"),  # 1: read by 9: runs
        ("import math\nfrom pathlib import Path\nr = 3", "skip"),  # 2: 6 reads r; later elided, imports kept
        ("import torch\ndef f(x):\n    return x + 1", "answer"),  # 3: binds f (torch: the stub's import too)
        ("from gpucourse.checks import check\ncheck('f')", "test"),  # 4
        ("y = f(2)\nprint(torch.ones(1))", "skip"),  # 5: reads f: runs, y is reached
        ("print(y, r)", "skip"),  # 6: reads y (reached through 5): runs
        ("r = 1\nprint(r, math.pi)\nfor k in range(2):\n    print(k)", "skip"),  # 7: binds r before reading it
        ("print([v for v in range(3)], sum(k for k in [1]))", "skip"),  # 8: comprehensions read their own names
        ("print(slow)", ""),  # 9: plain: needs 1
        ("z = torch.zeros(2)", "skip"),  # 10: torch is an import the stub keeps: not reached
        ("w = 1", "skip"),  # 11: differs from the release (below): runs
    ]
    released = [(source, kind) for source, kind in solution]
    released[3] = ("import torch\ndef f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()", "answer")
    released[11] = ("w = 2", "skip")
    elided = elided_cells(_notebook(released), _notebook(solution))
    assert elided == [7, 8, 10]
    released[6] = ("print(y)", "skip")
    solution[6] = ("print(y)", "skip")
    assert elided_cells(_notebook(released), _notebook(solution)) == [2, 7, 8, 10]  # r is read by no cell that runs
    assert cell_names.imports_of(solution[2][0]) == "import math\nfrom pathlib import Path"
    assert elided_cells(_notebook(released[:3]), _notebook(solution)) == []  # not the same notebook: nothing elided


def test_names_read_are_those_a_cell_reads_before_it_binds_them():
    read_names, bound, imported = cell_names.names(
        "x = x + 1\nfor r in rows:\n    print(r)\nwith open(p) as fh:\n    t = fh.read()\n"
        "def g(a):\n    return a + G + g(a)\nclass C:\n    k = K\nq = [u * m for u in us]\nimport numpy as np\n%time n = 1")
    assert read_names == {"x", "rows", "print", "open", "p", "G", "K", "m", "us", "get_ipython"}  # the magic, as run
    assert {"x", "r", "fh", "t", "g", "C", "q", "np"} <= bound and imported == {"np"}
    assert cell_names.names("this is not python (") is None

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

import ast

import pytest

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


def _refs(node) -> set[str]:
    """The module-level names evaluating ``node`` reads: in its own expressions, and the globals of the
    functions, lambdas, classes and comprehensions in it (not their parameters or locals)."""
    import symtable

    found = set()
    tables = [(symtable.symtable(ast.unparse(node), "<cell>", "exec"), True)]
    while tables:
        table, top = tables.pop()
        found |= {s.get_name() for s in table.get_symbols() if s.is_referenced() and (top or s.is_global())}
        tables += [(child, False) for child in table.get_children()]
    return found


def _bound(target) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _flow(statements, bound: set[str], free: set[str], imported: set[str]) -> None:
    """In execution order: a name read before this cell binds it is ``free`` (the cell reads the value an
    earlier cell left); ``bound`` gathers what the cell binds at module level, ``imported`` what its imports do."""
    for stmt in statements:
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            free |= _refs(stmt.iter) - bound
            bound |= _bound(stmt.target)
            _flow(stmt.body + stmt.orelse, bound, free, imported)
        elif isinstance(stmt, (ast.If, ast.While)):
            free |= _refs(stmt.test) - bound
            _flow(stmt.body + stmt.orelse, bound, free, imported)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                free |= _refs(item.context_expr) - bound
                bound |= _bound(item.optional_vars) if item.optional_vars is not None else set()
            _flow(stmt.body, bound, free, imported)
        elif isinstance(stmt, ast.Try):
            _flow(stmt.body, bound, free, imported)
            for handler in stmt.handlers:
                free |= (_refs(handler.type) if handler.type is not None else set()) - bound
                bound |= {handler.name} if handler.name else set()
                _flow(handler.body, bound, free, imported)
            _flow(stmt.orelse + stmt.finalbody, bound, free, imported)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names = {(a.asname or a.name).split(".")[0] for a in stmt.names}
            bound |= names
            imported |= names
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            free |= _refs(stmt) - bound - {stmt.name}
            bound.add(stmt.name)
        else:  # an assignment reads its value before it binds its targets
            free |= _refs(stmt) - bound
            bound |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}


def names(source: str) -> tuple[set[str], set[str], set[str]] | None:
    """(read, bound, imported) names of a cell: the names it reads before it binds them (in its functions
    too: their globals), the names it binds at module level, and those its imports bind. None: not Python."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        tree = ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return None
    bound, free, imported = set(), set(), set()
    _flow(tree.body, bound, free, imported)
    return free, bound, imported


def elided_cells(released, solution) -> list[int]:
    """The cells of ``released`` an unanswered run need not make: tagged ``skip-when-grading``, the same
    source as ``solution``'s cell, reading no name an answer reaches (bound by an answer cell, not by an
    import the stub keeps, or by a cell that reads such a name), and binding no name a cell that runs reads."""
    if len(released.cells) != len(solution.cells):
        return []
    reached: set[str] = set()
    cells = {}  # index -> (read, bound)
    candidates = set()
    for index, (cell, theirs) in enumerate(zip(released.cells, solution.cells)):
        if cell.cell_type != "code":
            continue
        mine, solved = names(cell.source), names(theirs.source)
        if mine is None or solved is None:  # not Python: it runs, and what it binds is unknown
            cells[index] = (set(), set(), set())
            continue
        read_names, bound, imported = mine
        cells[index] = (read_names | solved[0], bound | solved[1], imported)
        if nbgrader_meta(cell).get("solution"):
            reached |= (bound | solved[1]) - imported  # the stub's imports bind what the solution's do
        elif read_names & reached or cell.source != theirs.source:
            reached |= bound
        elif SKIP_TAG in cell.get("metadata", {}).get("tags", []) and not nbgrader_meta(cell).get("grade"):
            candidates.add(index)
    changed = True
    while changed:  # a cell that runs gets the cells that bind what it reads (the last binding before it)
        changed = False
        for index, (read_names, _, _) in cells.items():
            if index in candidates:
                continue
            for name in read_names:
                binders = [i for i, (_, bound, _) in cells.items() if name in bound and i < index]
                if binders and binders[-1] in candidates and name not in imports_only(cells[binders[-1]]):
                    candidates.discard(binders[-1])
                    changed = True
    return sorted(candidates)


def imports_only(cell_names) -> set[str]:
    """The names a cell binds by its imports alone: an elided cell's imports still run (``imports_of``)."""
    _, bound, imported = cell_names
    return imported


def imports_of(source: str) -> str:
    """The module-level import statements of a cell: all an elided cell still runs, since a cell after it
    may use what they bind."""
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))
    return "\n".join(ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))


@pytest.mark.slow  # runs every released notebook unanswered: `make test`, not `make test-fast`
@pytest.mark.parametrize("path", [notebook_param(p) for p in notebooks(COURSE)], ids=lambda p: p.parent.name)
def test_released_notebook_runs_unanswered_with_no_traceback_outside_the_exercises(path, tmp_path):
    from conftest import executed_solution

    assert environment.smoke(), "run through `make test`, which sets GPUCOURSE_SMOKE=1"
    nb = read(path)
    solution_path = SOLUTIONS / path.relative_to(COURSE)
    elided = elided_cells(nb, read(solution_path))
    for index in elided:  # only its imports run (nbclient does not run a cell left empty)
        nb.cells[index].source = imports_of(nb.cells[index].source)
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
    assert imports_of(solution[2][0]) == "import math\nfrom pathlib import Path"
    assert elided_cells(_notebook(released[:3]), _notebook(solution)) == []  # not the same notebook: nothing elided


def test_names_read_are_those_a_cell_reads_before_it_binds_them():
    read_names, bound, imported = names(
        "x = x + 1\nfor r in rows:\n    print(r)\nwith open(p) as fh:\n    t = fh.read()\n"
        "def g(a):\n    return a + G + g(a)\nclass C:\n    k = K\nq = [u * m for u in us]\nimport numpy as np\n%time n = 1")
    assert read_names == {"x", "rows", "print", "open", "p", "G", "K", "m", "us", "get_ipython"}  # the magic, as run
    assert {"x", "r", "fh", "t", "g", "C", "q", "np"} <= bound and imported == {"np"}
    assert names("this is not python (") is None

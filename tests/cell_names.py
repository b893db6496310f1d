"""Which cells of a notebook a partial run must make, from the names its cells read and bind (``ast``,
in execution order). Used by the runs that repeat only part of a lesson: the unanswered run
(tests/test_unanswered_notebooks.py) and the run against a written GPU reference (tests/test_reference.py).

A cell *reads* a name when it uses the value an earlier cell left under it (read before the cell binds it
itself; in its functions, their globals). What names cannot show (a file, a setting, a process one cell
leaves for another) these helpers do not follow: each caller says what that leaves unseen.
"""

from __future__ import annotations

import ast


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


def needed(cells: list[tuple[set[str], set[str], set[str]] | None], run: set[int]) -> set[int]:
    """The cells of ``cells`` (each ``names(source)``, None where not Python) a run must make besides ``run``:
    for every cell that runs, the cell that last bound each name it reads (one bound only by an import
    excepted: an elided cell's imports still run, ``imports_of``), and so on for those."""
    running, todo = set(run), sorted(run)
    while todo:
        index = todo.pop()
        if cells[index] is None:
            continue
        for name in cells[index][0]:
            binder = next((i for i in range(index - 1, -1, -1) if cells[i] is not None and name in cells[i][1]), None)
            if binder is not None and binder not in running and name not in cells[binder][2]:
                running.add(binder)
                todo.append(binder)
    return running - set(run)


def reached(cells: list[tuple[set[str], set[str], set[str]] | None], sources: dict[int, set[str]]) -> set[int]:
    """The cells after a cell of ``sources`` (an index -> the names it leaves reached) that read a reached name;
    what such a cell binds is reached too. The cells of ``sources`` are not counted."""
    found, names_ = set(), set()
    for index, cell in enumerate(cells):
        if index not in sources and cell is not None and cell[0] & names_:
            found.add(index)
            names_ |= cell[1]
        names_ |= sources.get(index, set())
    return found


def of_notebook(nb, *others) -> list[tuple[set[str], set[str], set[str]] | None]:
    """``names`` of every cell of ``nb`` (nothing read or bound for a markdown cell); with ``others`` (notebooks
    of the same cells, another version of them), what any version of a cell reads or binds, and the imports of
    ``nb``'s."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            found.append((set(), set(), set()))
            continue
        versions = [names(cell.source)] + [names(other.cells[index].source) for other in others]
        if any(v is None for v in versions):
            found.append(None)
            continue
        found.append((set().union(*(v[0] for v in versions)), set().union(*(v[1] for v in versions)), versions[0][2]))
    return found


def imports_of(source: str) -> str:
    """The module-level import statements of a cell: all an elided cell still runs, since a cell after it
    may use what they bind."""
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))
    return "\n".join(ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))


def elide(nb, indices) -> None:
    """Leave only the imports of ``nb``'s cells at ``indices``, in place (nbclient does not run a cell left empty)."""
    for index in indices:
        nb.cells[index].source = imports_of(nb.cells[index].source)

"""Turn a submitted notebook into what the sandbox runs, trusting nothing in it but the answers.

The run plan starts from the *released* notebook (scaffolding, locked cells, no solutions), and
takes only the student's answer cells from the submission, matched by their nbgrader grade id.
Test cells are never run from either notebook: checks live in ``autograders/checks``. Anything odd
about the submission (a changed locked cell, a duplicated answer, a metadata rewrite, code that
reaches for the grader's machinery) becomes a flag for manual review, never a crash.

An ``ast`` scan of the answers finds *forgery* (``Plan.forgery``: the whole submission scores 0, and
each reason is flagged): changing anything reached from an imported module (assignment, ``del``,
``setattr``, ``vars(m)[...] =``...: what the observers would see), importing ``gpucourse.checks``
(only ``from gpucourse.checks import check`` is allowed) or the grader, naming their files.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .worker import trust

MAX_NOTEBOOK_BYTES = 20 << 20  # c.Grading.notebook_bytes's default (settings.py)
SKIP_TAG = "skip-when-grading"  # lesson measurements the checks do not need

# What the ast scan below cannot see (strings, names used without an assignment): each match flags
# the submission for a person to look at; it does not change the score.
SUSPICIOUS = {
    "IPython hooks or input transformers": r"input_transformers|register_transform|events\.register|pre_run_cell|post_run_cell|get_ipython",
    "reaches into builtins or the import system": r"__builtins__|importlib\.reload|sys\.meta_path|sys\.path_hooks|sys\.path_importer_cache",
    "reads the grader's files, processes or environment": r"/proc|gradebook|NBGRADER|GPUCOURSE_",
    "hard exits or exit hooks": r"os\._exit|sys\.exit|atexit|signal\.signal|os\.kill|killpg",
    "raw file descriptors or interpreter internals": r"os\.(dup2?|fdopen|write|read)\b|gc\.get_objects|gc\.get_referr|"
                                                     r"sys\._getframe|\bf_globals\b|"
                                                     r"__subclasses__|ctypes|sys\.settrace|sys\.setprofile",
    "overrides equality or torch dispatch": r"def __eq__|def __ne__|__torch_function__|__torch_dispatch__|__array_ufunc__",
}
# Strings that name the grader's or the solutions' files: reading them is an attempt at the answers.
SECRET_PATHS = r"autograders|solutions/|solutions\\|grades\.csv"

# Reasons that zero the whole submission (the engine's business) and are flagged: an answer that
# changes what the checks observe, or reaches the checks' or the grader's code.
CHECKS = "gpucourse.checks"
ALLOWED_FROM_CHECKS = {"check"}  # the notebooks' own test cells: from gpucourse.checks import check
# The grader's modules, by the bare names submissions once imported them by (``import engine``, when the
# grader was a folder of scripts) as well as the package: every module of autograders and its worker,
# found rather than listed, so that a new one is covered the day it is added.
_PACKAGE = Path(__file__).resolve().parent
GRADER = {"autograders", "nbgrader"} | {m.name for m in pkgutil.iter_modules([str(_PACKAGE), str(_PACKAGE / "worker")])
                                        if not m.name.startswith("_")}  # __main__ is every script's, not the grader's
# Of those, the ones a string may name without naming the grader: ordinary words an answer uses as
# data ("rank" is a key of every rank's record); importing them is still flagged (``_imported``).
ORDINARY_WORDS = {"grade", "record", "release", "publish", "course", "cli", "rank", "trust", "worker", "forking",
                  "snapshot"}
# Settings a lesson teaches: torch.backends flags, environment variables, the import path (put back
# after every cell anyway).
ALLOWED_PATCHES = (r"torch\.backends\.[\w.]*[a-z0-9]", r"os\.environ(\[\.\.\.\])?", r"sys\.path(\[\.\.\.\])?",
                   r"pandas\.options\.[\w.]*[a-z0-9]")
# Patches count where the sandbox's observers and drivers could see them: what the runner snapshots
# (worker.trust.SCOPE: the course, torch, Lightning, numpy; the standard library), what observers
# import later (trust.OBSERVED_LATER), builtins. From the same list the runner protects, so the two agree.
PATCH_SCOPE = set(trust.SCOPE) | set(trust.OBSERVED_LATER) | {"builtins"} | set(sys.stdlib_module_names)
FUNCTION_INTERNALS = {"__code__", "__defaults__", "__kwdefaults__", "__globals__", "__closure__"}
DICT_MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
IMPORT_SYSTEM = {"sys.modules", "sys.meta_path", "sys.path_hooks", "sys.path_importer_cache"}
OWN = {"self", "cls"}  # type(self).x = ... changes the student's own class


@dataclass
class Plan:
    cells: list[dict] = field(default_factory=list)  # {"source", "grade_id" (answers only), "template_index"}
    answers: dict[str, str | None] = field(default_factory=dict)  # grade id -> the student's source (None: missing)
    flags: list[str] = field(default_factory=list)
    readable: bool = True
    forgery: list[str] = field(default_factory=list)  # reasons that zero the whole submission (each one is a flag too)


def nbgrader_meta(cell: dict) -> dict:
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
    return nbgrader if isinstance(nbgrader, dict) else {}


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def read_submission(path: Path, max_bytes: int = MAX_NOTEBOOK_BYTES) -> tuple[dict | None, list[str]]:
    """The notebook as plain JSON, or None with the reason (one larger than ``max_bytes`` too);
    never follows a symlink."""
    if path.is_symlink():
        return None, [f"{path.name} is a symlink; not followed"]
    if not path.is_file():
        return None, [f"{path.name} is missing"]
    if path.stat().st_size > max_bytes:
        return None, [f"{path.name} is larger than {max_bytes / 2**20:g} MB"]
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        return None, [f"{path.name} is not UTF-8 text ({error.reason} at byte {error.start})"]
    try:
        nb = json.loads(text)
    except ValueError as error:
        return None, [f"{path.name} is not valid JSON ({error})"]
    if not isinstance(nb, dict) or nb.get("nbformat") != 4 or not isinstance(nb.get("cells"), list):
        return None, [f"{path.name} is not an nbformat 4 notebook"]
    return nb, []


def _answer(student_cells: list[dict], template_cell: dict, grade_id: str, flags: list[str]) -> str | None:
    matches = [c for c in student_cells if isinstance(c, dict) and nbgrader_meta(c).get("grade_id") == grade_id]
    if not matches and template_cell.get("id"):
        matches = [c for c in student_cells if isinstance(c, dict) and c.get("id") == template_cell["id"]]
        if matches:
            flags.append(f"answer {grade_id}: nbgrader metadata removed; matched by cell id")
    if not matches:
        flags.append(f"answer {grade_id}: cell deleted")
        return None
    if len(matches) > 1:
        flags.append(f"answer {grade_id}: {len(matches)} cells claim this id; the first was graded")
    cell = matches[0]
    if cell.get("cell_type") != template_cell["cell_type"]:
        flags.append(f"answer {grade_id}: changed from {template_cell['cell_type']} to {cell.get('cell_type')}")
        return None
    return _source(cell)


def _tampering(student_cells: list[dict], template_cells: list[dict], flags: list[str]) -> None:
    """Locked and test cells come from the release anyway; say when the submission changed them."""
    theirs = {}
    for cell in student_cells:
        if isinstance(cell, dict) and nbgrader_meta(cell).get("grade_id"):
            theirs.setdefault(nbgrader_meta(cell)["grade_id"], []).append(cell)
    order = [g for g in (nbgrader_meta(c).get("grade_id") for c in student_cells if isinstance(c, dict)) if g]
    for cell in template_cells:
        meta = nbgrader_meta(cell)
        grade_id = meta.get("grade_id")
        if not grade_id or meta.get("solution"):
            continue
        found = theirs.get(grade_id, [])
        if not found:
            flags.append(f"locked cell {grade_id}: deleted (the released one was used)")
        elif len(found) > 1:
            flags.append(f"locked cell {grade_id}: duplicated (the released one was used)")
        elif _source(found[0]) != _source(cell) or found[0].get("cell_type") != cell["cell_type"]:
            flags.append(f"locked cell {grade_id}: changed (the released one was used)")
        elif any(nbgrader_meta(found[0]).get(key) != meta.get(key) for key in ("points", "schema_version")):
            flags.append(f"locked cell {grade_id}: nbgrader metadata changed (the released one was used)")
    known = {nbgrader_meta(c).get("grade_id") for c in template_cells}
    for extra in sorted(set(theirs) - known):
        flags.append(f"cell {extra}: not in the released notebook (ignored)")
    released_order = [g for g in (nbgrader_meta(c).get("grade_id") for c in template_cells) if g and g in theirs]
    if [g for g in order if g in released_order] != released_order and all(len(v) == 1 for v in theirs.values()):
        flags.append("cells were reordered (the released order was used)")


def _const(node) -> str | None:
    """A string the code spells out: a constant, constants added, or an f-string of constants."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _const(node.left), _const(node.right)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = [_const(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values]
        return "".join(parts) if all(p is not None for p in parts) else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
            and _const(node.func.value) is not None and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple))):
        parts = [_const(e) for e in node.args[0].elts]
        return _const(node.func.value).join(parts) if all(p is not None for p in parts) else None
    return None


OWNERS = {"checks": "the checks'", "grader": "the grader's"}


def _imported(name: str) -> tuple[str, str] | None:
    """Why importing module ``name`` is forgery, as (kind, name), or None."""
    if name == CHECKS or name.startswith(CHECKS + "."):
        return "checks", name
    if name.partition(".")[0] in GRADER:
        return "grader", name
    return None


class _Aliases:
    """Names bound to modules or to objects imported from them (``import torch as t``, ``from os import
    environ``, ``m = torch``, ``T = type(x)``), across the notebook's cells: name -> dotted path."""

    def __init__(self, trees: list[ast.AST]):
        self.paths: dict[str, str] = {}
        for _ in range(4):  # re-bindings of re-bindings
            before = dict(self.paths)
            for tree in trees:
                for node in ast.walk(tree):
                    self._bind(node)
            if self.paths == before:
                break

    def _bind(self, node) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                self.paths[a.asname or a.name.partition(".")[0]] = a.name if a.asname else a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name != "*":
                    self.paths[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, (ast.Assign, ast.NamedExpr)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                pairs = [(target, node.value)]
                if isinstance(target, (ast.Tuple, ast.List)) and isinstance(node.value, (ast.Tuple, ast.List)) \
                        and len(target.elts) == len(node.value.elts):
                    pairs = list(zip(target.elts, node.value.elts))
                for name, value in pairs:
                    path = self.path(value) if isinstance(name, ast.Name) else None
                    if path is not None:
                        self.paths.setdefault(name.id, path)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and isinstance(node.target, ast.Name):
            path = self.element_path(node.iter)  # ``for m in (os,): m.getpid = ...``: m is os
            if path is not None:
                self.paths.setdefault(node.target.id, path)

    def element_path(self, node) -> str | None:
        """The path an element of a literal tuple, list or set ``node`` reaches (the first that does), or None."""
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return next((p for p in map(self.path, node.elts) if p is not None), None)
        return None

    shadowed: frozenset = frozenset()  # names that, where the scan is looking, hold the code's own values

    def path(self, node) -> str | None:
        """The dotted path ``node`` reaches from an import, or None (a value the code made itself)."""
        if isinstance(node, ast.Name):
            return self.paths.get(node.id) if node.id not in self.shadowed else None
        if isinstance(node, ast.NamedExpr):
            return self.path(node.value)
        if isinstance(node, ast.Attribute):
            if node.attr == "__class__":
                return self._class_of(node.value)
            base = self.path(node.value)
            return f"{base}.{node.attr}" if base is not None else None
        if isinstance(node, ast.Subscript):
            base = self.path(node.value)
            key = _const(node.slice)
            if base == "sys.modules" and key is not None:
                return key
            return f"{base}[...]" if base is not None else None
        if isinstance(node, ast.Call):
            func, args = node.func, node.args
            name = func.id if isinstance(func, ast.Name) else None
            called = self.path(func)
            if name == "type" and len(args) == 1:
                return self._class_of(args[0])
            if name == "vars" and len(args) == 1:
                base = self.path(args[0])
                return f"{base}.__dict__" if base is not None else None
            if name == "getattr" and len(args) >= 2 and _const(args[1]) is not None:
                base = self.path(args[0])
                return f"{base}.{_const(args[1])}" if base is not None else None
            if (called in ("importlib.import_module", "builtins.__import__") or name in ("__import__", "import_module")) \
                    and args and _const(args[0]) is not None:
                module = _const(args[0])
                return module.partition(".")[0] if (name == "__import__" or called == "builtins.__import__") else module
            if isinstance(func, ast.Attribute) and func.attr == "get" and self.path(func.value) == "sys.modules" \
                    and args and _const(args[0]) is not None:
                return _const(args[0])
        return None

    def _class_of(self, node) -> str | None:
        if isinstance(node, ast.Name) and node.id in OWN:
            return None
        base = self.path(node)
        return f"type({base or ast.unparse(node)})"


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp)


def _walk(node, stack: tuple):
    """Every node with the scopes it is in (the module first), depth first, without recursion."""
    todo = [(node, stack)]
    while todo:
        node, stack = todo.pop()
        yield node, stack
        for child in reversed(list(ast.iter_child_nodes(node))):
            todo.append((child, stack + (child,) if isinstance(child, _SCOPES) else stack))


def _bindings(scope, aliases: _Aliases) -> tuple[set, set, set]:
    """Names one scope binds to modules, binds otherwise, and declares global (nested scopes excluded)."""
    modules, others, declared = set(), set(), set()
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = scope.args
        others |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [v for v in (a.vararg, a.kwarg) if v]}
    for node, stack in _walk(scope, (scope,)):
        if stack[-1] is not scope:
            if node is stack[-1] and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                others.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules |= {a.asname or a.name.partition(".")[0] for a in node.names if a.name != "*"}
        elif isinstance(node, (ast.Assign, ast.NamedExpr)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name) and aliases.path(node.value) is not None:
                    modules.add(target.id)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and isinstance(node.target, ast.Name) \
                and aliases.element_path(node.iter) is not None:
            modules.add(node.target.id)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            others.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            others.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared |= set(node.names)
    return modules, others - modules, declared


class _Shadows:
    """Which imported names, at a given node, hold the answer's own values instead (Python's scoping:
    a name a function assigns is local to it; at the top, a plain assignment earlier in the cell)."""

    def __init__(self, tree: ast.Module, aliases: _Aliases):
        self.tree, self.aliases, self.scopes = tree, aliases, {}
        self.top = {}  # name -> lines of the cell's top-level statements that bind it to its own value
        for statement in tree.body:
            names = []
            if isinstance(statement, ast.Assign) and aliases.path(statement.value) is None:
                names = [t.id for t in statement.targets if isinstance(t, ast.Name)]
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None and isinstance(statement.target, ast.Name):
                names = [statement.target.id]
            elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [statement.name]
            for name in names:
                self.top.setdefault(name, []).append(statement.lineno)

    def _bindings(self, scope) -> tuple[set, set, set]:
        """``_bindings`` of ``scope``, computed once: each look walks the whole scope, and ``at`` asks for every
        node of the answer and every imported name (``setdefault(scope, _bindings(...))`` computed it each time:
        the scan of lesson 13's solution took 11.6 s, now 0.02 s)."""
        if scope not in self.scopes:
            self.scopes[scope] = _bindings(scope, self.aliases)
        return self.scopes[scope]

    def at(self, node, stack: tuple) -> frozenset:
        shadowed = set()
        for name in self.aliases.paths:
            for scope in reversed(stack):
                if isinstance(scope, ast.ClassDef) and scope is not stack[-1]:
                    continue  # a method does not see its class's names
                if scope is self.tree:
                    modules = self._bindings(scope)[0]
                    line = getattr(node, "lineno", 0)
                    if name not in modules and any(bound < line for bound in self.top.get(name, ())):
                        shadowed.add(name)
                    break
                modules, others, declared = self._bindings(scope)
                if name in declared or name in modules:
                    break
                if name in others:
                    shadowed.add(name)
                    break
        return frozenset(shadowed)


def _forgery(tree: ast.AST, aliases: _Aliases) -> list[str]:
    """Why this answer's code is forgery (patches what observers rely on, reaches the checks or the grader)."""
    found: list[str] = []

    def say(text: str) -> None:
        if text not in found:
            found.append(text)

    def patched(path: str | None, target=None) -> None:
        if path is None:
            if target is not None and isinstance(target, ast.Attribute) and target.attr in FUNCTION_INTERNALS:
                say(f"rewrites a function's {target.attr}")
            return
        if any(re.fullmatch(p, path) for p in ALLOWED_PATCHES) or not (
                path.startswith("type(") or path.partition(".")[0].partition("[")[0] in PATCH_SCOPE):
            return
        say(f"patches `{path}`")

    def mutated(target) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                mutated(element)
        elif isinstance(target, ast.Starred):
            mutated(target.value)
        elif isinstance(target, ast.Attribute):
            base = aliases.path(target.value)
            patched(f"{base}.{target.attr}" if base is not None else None, target)
        elif isinstance(target, ast.Subscript):
            base = aliases.path(target.value)
            patched(f"{base}[...]" if base is not None else None)

    shadows = _Shadows(tree, aliases)
    for node, stack in _walk(tree, (tree,)):
        aliases.shadowed = shadows.at(node, stack) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete, ast.Call,
                                                                         ast.Name, ast.Attribute, ast.Subscript)) else frozenset()
        if isinstance(node, ast.Import):
            for a in node.names:
                why = _imported(a.name)
                if why:
                    say(f"imports {OWNERS[why[0]]} `{why[1]}`")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            why = _imported(node.module)
            if why and not (node.module == CHECKS
                            and all(a.name in ALLOWED_FROM_CHECKS and a.asname in (None, a.name) for a in node.names)):
                say(f"imports {OWNERS[why[0]]} `{node.module}` ({', '.join(a.name for a in node.names)})")
            for a in node.names if not why else ():  # from gpucourse import checks
                inner = _imported(f"{node.module}.{a.name}")
                if inner:
                    say(f"imports {OWNERS[inner[0]]} `{inner[1]}`")
        elif isinstance(node, (ast.Assign, ast.Delete)):
            for target in node.targets:
                mutated(target)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and (isinstance(node, ast.AugAssign) or node.value is not None):
            mutated(node.target)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else None
            called = aliases.path(func)
            if (name in ("setattr", "delattr") or called in ("builtins.setattr", "builtins.delattr")
                    or (isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__")
                        and isinstance(func.value, ast.Name) and func.value.id in ("object", "type"))) and node.args:
                base = aliases.path(node.args[0])
                attribute = _const(node.args[1]) if len(node.args) > 1 else None
                if base is not None:
                    patched(f"{base}.{attribute or '?'}")
                elif attribute in FUNCTION_INTERNALS:
                    say(f"rewrites a function's {attribute}")
            elif isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__"):
                base = aliases.path(func.value)
                if base is not None:
                    patched(f"{base}.{_const(node.args[0]) if node.args else '?'}")
            elif isinstance(func, ast.Attribute) and func.attr in DICT_MUTATORS | {"append", "insert", "extend", "remove"}:
                base = aliases.path(func.value)
                if base is not None and (base.endswith(".__dict__") or base in IMPORT_SYSTEM):
                    patched(f"{base}[...]")
        if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
            path = aliases.path(node)
            if path and (path == CHECKS or path.startswith(CHECKS + ".")) and path != f"{CHECKS}.check":
                if not (isinstance(node, ast.Name) and node.id in ALLOWED_FROM_CHECKS):
                    say(f"reaches the checks' `{path}`")
            elif path and path.partition(".")[0] in GRADER and path.partition(".")[0] != "builtins":
                say(f"reaches the grader's `{path}`")
        text = _const(node) if isinstance(node, (ast.Constant, ast.BinOp, ast.JoinedStr, ast.Call)) else None
        if text is not None:
            if re.match(rf"{re.escape(CHECKS)}(\.|$)", text) or re.search(r"gpucourse[/\\]checks", text):
                say(f"names the checks' `{text[:60]}`")
            elif (_imported(text) and re.fullmatch(r"[\w.]+", text)
                  and text.partition(".")[0] in GRADER - ORDINARY_WORDS):
                say(f"names the grader's `{text[:60]}`")
            elif re.search(SECRET_PATHS, text):
                say(f"reads the grader's or the solutions' files (`{text[:60]}`)")
    aliases.shadowed = frozenset()
    return found


# One ast.parse at a time in this process: the pool grades submissions in threads, and CPython before
# 3.11.8 and 3.12.1 keeps the AST constructor's depth count in state that threads share, so two parses at
# once fail with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905; seen here
# on 3.11.7, two lesson 1 notebooks graded side by side).
_PARSING = threading.Lock()


def _parse(source: str) -> ast.Module:
    with _PARSING:
        return ast.parse(source)


def scan(answers: dict[str, str | None], context: list[str] = ()) -> tuple[list[str], list[str]]:
    """(forgery, flags) for the answers; ``context``: the notebook's other code cells (their imports bind names)."""
    trees, parsed = [], {}
    for source in list(context) + [a for a in answers.values() if a]:
        try:
            tree = _parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # it will not run either; the regexes still look
            continue
        trees.append(tree)
        parsed.setdefault(source, tree)
    try:
        aliases = _Aliases(trees)
    except RecursionError:  # names bound through thousands of nested expressions: nobody's answer
        aliases = _Aliases([])
    forgery, flags = [], []
    for grade_id, source in answers.items():
        if not source:
            continue
        if source in parsed:
            try:
                reasons = _forgery(parsed[source], aliases)
            except RecursionError:
                reasons = ["code nested too deeply to be checked"]
            forgery += [f"answer {grade_id}: {reason}" for reason in reasons]
        for reason, pattern in SUSPICIOUS.items():
            if re.search(pattern, source):
                flags.append(f"answer {grade_id}: {reason}")
    return forgery, forgery + flags


def plan(released: dict, submission: dict | None, read_flags: list[str] = ()) -> Plan:
    """What to run for ``submission`` (None: unreadable, so every answer is missing)."""
    result = Plan(flags=list(read_flags), readable=submission is not None)
    student_cells = submission["cells"] if submission else []
    if submission:
        _tampering(student_cells, released["cells"], result.flags)
    for index, cell in enumerate(released["cells"]):
        meta = nbgrader_meta(cell)
        grade_id = meta.get("grade_id")
        if meta.get("solution"):
            answer = _answer(student_cells, cell, grade_id, result.flags) if submission else None
            result.answers[grade_id] = answer
            if cell["cell_type"] == "code":
                result.cells.append({"source": answer if answer is not None else f"raise NotImplementedError('answer {grade_id} missing')",
                                     "grade_id": grade_id, "template_index": index})
        elif cell["cell_type"] == "code" and not (meta.get("grade") or SKIP_TAG in cell.get("metadata", {}).get("tags", [])):
            result.cells.append({"source": _source(cell), "grade_id": None, "template_index": index})
    context = [c["source"] for c in result.cells if c["grade_id"] is None]
    result.forgery, flags = scan(result.answers, context)
    result.flags += flags
    return result

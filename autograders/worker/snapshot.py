"""What the observers rely on, held before student code and put back after it; and the modules closed to it.

``Snapshot``: every loaded module of ``trust.SCOPE`` and the standard library (its dict and class),
with the dicts of the classes defined there, the code and defaults of their Python functions, the
``sys.modules`` entries and the import system's lists; ``restore()`` puts back what changed
(compared by identity). ``Gate``: while cells run, the modules of ``gpucourse.checks`` (the public
checks and harnesses) and the grader's package (``autograders``, this worker included) cannot be
imported, and ``gpucourse.checks`` shows only a ``check`` that says the grader runs the checks.

The runner puts both around every cell; a graded rank (``rank``) around the student's script and
its driver.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
import sys
import types

from .trust import CLASSES, OWN, SCOPE, TOP_CLASSES

CHECKS = "gpucourse.checks"
CLOSED = ("gpucourse.checks.", "autograders.")  # their modules cannot be imported while cells run
CLOSED_PACKAGES = ("autograders",)  # closed themselves too (gpucourse.checks stays, with its check)
HIDDEN_WHILE_CELLS = ("EXERCISES", "PUBLIC", "ANSWERS")  # the registries reach every observer's globals
_MISSING = object()
_FUNCTION_STATE = tuple(operator.attrgetter(a) for a in ("__code__", "__defaults__", "__kwdefaults__"))


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the working folder was removed
        return None


def in_scope(name: str) -> bool:
    """Whether module ``name`` is one the snapshot holds: of ``trust.SCOPE`` or the standard library."""
    top = name.partition(".")[0]
    return name != "__main__" and (top in SCOPE or top in sys.stdlib_module_names)


def _unwrap(value):
    """The Python functions behind a dict entry (a function, a static/class method, a property)."""
    kind = type(value)  # not isinstance: some module attributes warn when their __class__ is read
    if kind is types.FunctionType:
        return (value,)
    if kind is staticmethod or kind is classmethod:
        return (value.__func__,) if type(value.__func__) is types.FunctionType else ()
    if kind is property:
        return tuple(f for f in (value.fget, value.fset, value.fdel) if type(f) is types.FunctionType)
    return ()


def _mutable_class(value) -> bool:
    return issubclass(type(value), type) and not value.__flags__ & (1 << 8)  # Py_TPFLAGS_IMMUTABLETYPE


class Snapshot:
    """What the observers rely on, as it was before student code; ``restore()`` puts back what changed."""

    def __init__(self, closed: dict | None = None):
        """``closed``: modules taken out of ``sys.modules`` (by the Gate) whose contents are held too."""
        self.entries: dict = {}
        self.modules, self.classes, self._functions, self._seen = [], [], {}, set()
        self.closed_names = list(closed or ())
        self._hold({name: m for name, m in sys.modules.items() if in_scope(name)}, closed or {})
        self.environ = dict(os.environ)
        self.cwd = _cwd()

    def _hold(self, entries: dict, closed: dict | None = None) -> None:
        """Hold ``entries`` (names of ``sys.modules`` in scope) and the modules of ``closed``, then
        derive the lists that ``restore`` compares."""
        self.entries.update(entries)
        seen, functions = self._seen, self._functions
        for name, module in {**entries, **(closed or {})}.items():
            if not isinstance(module, types.ModuleType) or id(module) in seen:
                continue
            seen.add(id(module))
            attributes = dict(vars(module))
            self.modules.append((module, type(module), tuple(attributes.items()), tuple(attributes.values())))
            if name not in TOP_CLASSES and not any(name == c or name.startswith(c + ".") for c in CLASSES):
                continue
            for value in attributes.values():  # what the module defines and what it imported (torch.Tensor is in torch._tensor)
                for f in _unwrap(value):
                    functions[id(f)] = f
                if _mutable_class(value) and id(value) not in seen:
                    seen.add(id(value))
                    held = dict(vars(value))
                    self.classes.append((value, tuple(held.items()), tuple(held.values())))
                    for member in held.values():
                        for f in _unwrap(member):
                            functions[id(f)] = f
        self.functions = [(f, f.__code__, f.__defaults__, f.__kwdefaults__) for f in functions.values()]
        # For the common case, nothing changed, checked in C loops: lengths, then every value by identity.
        self._dicts = [vars(module) for module, *_ in self.modules]
        self._lengths = [len(values) for *_, values in self.modules]
        self._values = tuple(itertools.chain.from_iterable(values for *_, values in self.modules))
        self._kinds = [kind for _, kind, _, _ in self.modules]
        self._class_list = [cls for cls, *_ in self.classes]
        self._class_lengths = [len(values) for *_, values in self.classes]
        self._class_values = tuple(itertools.chain.from_iterable(values for *_, values in self.classes))
        self._module_list = [module for module, *_ in self.modules]
        self._function_list = [f for f, *_ in self.functions]
        self._function_state = [tuple(state[i] for _, *state in self.functions) for i in range(3)]
        # The course's public module-level lists, dicts and sets (TABLE, PUBLIC_LOSSES...): their contents
        # too. Private ones are caches the checks fill while they run (ddp._LAUNCHED: one launch per script).
        self.contents = [(value, type(value)(value)) for module, *_ in self.modules if module.__name__.startswith(OWN)
                         for key, value in vars(module).items() if type(value) in (list, dict, set) and not key.startswith("_")]
        self.path, self.meta_path, self.path_hooks = list(sys.path), list(sys.meta_path), list(sys.path_hooks)
        self.importer_cache = dict(sys.path_importer_cache)

    def rebase(self, closed: dict | None = None) -> int:
        """Take what trusted code changed since the snapshot as the state to restore, reading again
        only what changed: in a rank forked after its launcher took the snapshot, multiprocessing has
        reset its own state for the child (``process._children``, ``_current_process``) and the
        launcher imported more modules. Only for code of the grader's, before any student code runs
        in this process. ``closed``: the modules a Gate closed since (held too, and taken out of
        ``sys.modules`` again by ``restore``). How many modules and classes were read again."""
        same = operator.is_
        changed = 0
        for i, (module, kind, _, values) in enumerate(self.modules):
            current = vars(module)
            if type(module) is not kind or len(current) != len(values) or not all(map(same, current.values(), values)):
                self.modules[i] = (module, type(module), tuple(current.items()), tuple(current.values()))
                changed += 1
        for i, (cls, _, values) in enumerate(self.classes):
            current = vars(cls)
            if len(current) != len(values) or not all(map(same, current.values(), values)):
                self.classes[i] = (cls, tuple(current.items()), tuple(current.values()))
                changed += 1
        added = {name: m for name, m in sys.modules.items() if in_scope(name) and self.entries.get(name, _MISSING) is not m}
        if closed is not None:
            self.closed_names = list(closed)
        self._hold(added, closed)
        return changed + len(added)

    def _unchanged(self) -> bool:
        same, values = operator.is_, operator.methodcaller("values")
        return (all(map(same, map(sys.modules.get, self.entries), self.entries.values()))
                and all(map(same, map(type, self._module_list), self._kinds))
                and list(map(len, self._dicts)) == self._lengths
                and all(map(same, itertools.chain.from_iterable(map(values, self._dicts)), self._values))
                and list(map(len, map(vars, self._class_list))) == self._class_lengths
                and all(map(same, itertools.chain.from_iterable(map(values, map(vars, self._class_list))), self._class_values))
                and all(all(map(same, map(get, self._function_list), held)) for get, held in zip(_FUNCTION_STATE, self._function_state)))

    def restore(self) -> int:
        """Put back every changed entry; how many were changed."""
        changed = 0
        modules, same = sys.modules, operator.is_
        if self._unchanged():
            return self._restore_lists()
        for name, module in self.entries.items():
            if modules.get(name, _MISSING) is not module:
                modules[name] = module
                changed += 1
        # Same length and the same values in the same order: unchanged (a key cannot be renamed without
        # moving its value to the end). Otherwise put back every held entry, remove the added ones.
        for module, kind, held, values in self.modules:
            if type(module) is not kind:
                module.__class__ = kind
                changed += 1
            current = vars(module)
            if len(current) == len(values) and all(map(same, current.values(), values)):
                continue
            keys, prefix = {key for key, _ in held}, module.__name__ + "."
            for key in [k for k in current if k not in keys]:  # a submodule imported meanwhile stays
                if not (isinstance(current[key], types.ModuleType) and modules.get(prefix + key) is current[key]):
                    del current[key]
                    changed += 1
            for key, value in held:
                if current.get(key, _MISSING) is not value:
                    current[key] = value
                    changed += 1
        for cls, held, values in self.classes:
            current = vars(cls)
            if len(current) == len(values) and all(map(same, current.values(), values)):
                continue
            keys = {key for key, _ in held}
            for key in [k for k in current if k not in keys]:
                type.__delattr__(cls, key)
                changed += 1
            for key, value in held:
                if current.get(key, _MISSING) is not value:
                    type.__setattr__(cls, key, value)
                    changed += 1
        for f, code, defaults, kwdefaults in self.functions:
            if f.__code__ is not code or f.__defaults__ is not defaults or f.__kwdefaults__ is not kwdefaults:
                f.__code__, f.__defaults__, f.__kwdefaults__ = code, defaults, kwdefaults
                changed += 1
        return changed + self._restore_lists()

    def _restore_lists(self) -> int:
        changed, same = 0, operator.is_
        for name in self.closed_names:
            changed += sys.modules.pop(name, None) is not None
        for current, held in self.contents:
            if len(current) != len(held) or (current != held if type(held) is set else not all(map(same, current, held))) or (
                    type(held) is dict and not all(map(same, current.values(), held.values()))):
                current.clear()
                current.update(held) if type(held) is not list else current.extend(held)
                changed += 1
        for current, held in ((sys.path, self.path), (sys.meta_path, self.meta_path), (sys.path_hooks, self.path_hooks)):
            if len(current) != len(held) or not all(map(same, current, held)):
                current[:] = held
                changed += 1
        cache = sys.path_importer_cache
        if cache.keys() != self.importer_cache.keys() or not all(map(same, cache.values(), self.importer_cache.values())):
            cache.clear()
            cache.update(self.importer_cache)
            changed += 1
        return changed

    def restore_environment(self) -> None:
        """The environment and import path of the snapshot, without the working folder (for the observers)."""
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        if self.cwd and _cwd() != self.cwd:
            with contextlib.suppress(OSError):
                os.chdir(self.cwd)
        sys.path[:] = [p for p in self.path if p not in ("", ".", self.cwd)]
        sys.path_importer_cache.pop(self.cwd, None)


def is_closed(name: str) -> bool:
    """Whether module ``name`` is closed while cells run: a module of gpucourse.checks (not the
    package), or the grader's package and anything in it (this worker too)."""
    return name in CLOSED_PACKAGES or name.startswith(CLOSED)


class _Closed:
    """A meta path finder that refuses the closed modules (``is_closed``) while student cells run."""

    def find_spec(self, name, path=None, target=None):
        if is_closed(name):
            raise ImportError(f"{name} is not available while grading", name=name)
        return None

    def invalidate_caches(self):
        pass


def _check_while_grading(exercise, namespace=None):
    """``check`` while the grader runs the cells: it runs every check, public and hidden, afterwards."""
    print(f"check({exercise!r}): skipped while grading; the grader runs every check after the cells")


class Gate:
    """Closes gpucourse.checks' modules and the grader's package to the cells; ``open`` gives them
    back to the observers."""

    def __init__(self):
        self.finder = _Closed()
        self.package = sys.modules[CHECKS]
        self.modules = {name: m for name, m in sys.modules.items() if is_closed(name)}
        closed = {id(m) for m in self.modules.values()}
        self.attributes = {key: value for key, value in vars(self.package).items()
                           if id(value) in closed or key in HIDDEN_WHILE_CELLS or key == "check"}

    def close(self) -> None:
        for name in self.modules:
            sys.modules.pop(name, None)
        held = vars(self.package)
        for key in self.attributes:
            held.pop(key, None)
        held["check"] = _check_while_grading
        sys.meta_path.insert(0, self.finder)

    def open(self) -> None:
        sys.modules.update(self.modules)
        vars(self.package).update(self.attributes)
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self.finder]

"""The boundary between the course's package, the grader and the grader's sandbox side.

``gpucourse`` (public: students get it) never imports ``autograders``; ``autograders.worker`` (it runs
next to student code, and a sandbox sees it) imports ``gpucourse`` and its own modules, never the
grader's side (engine, sandbox, assemble, course, the hidden checks...); the grader's internals are
not in ``gpucourse.checks``; the public edition holds no file of ``autograders`` (tests/test_edition.py
builds it and checks that too). Read from the source (``ast``), then confirmed in a fresh Python.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from conftest import AUTOGRADERS, ROOT

PACKAGE = ROOT / "src" / "gpucourse"
WORKER = AUTOGRADERS / "worker"


def _imports(path) -> list[tuple[int, str]]:
    """Every import of a module, as (level, dotted name): level 0 for absolute ones, and for
    ``from . import x`` the name ``x`` (what is imported, relative to the level)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found += [(node.level, f"{base}.{a.name}".strip(".")) for a in node.names]
    return found


def test_no_module_of_gpucourse_imports_the_grader():
    offenders = [f"{path.relative_to(ROOT)}: {name}" for path in PACKAGE.rglob("*.py")
                 for level, name in _imports(path) if level == 0 and name.partition(".")[0] == "autograders"]
    assert offenders == []


def test_the_worker_imports_no_module_of_the_graders_side():
    """Relative imports stay inside the worker (one dot); absolute ones reach gpucourse, third-party
    packages and the standard library, and of ``autograders`` only the worker."""
    offenders = []
    for path in WORKER.glob("*.py"):
        for level, name in _imports(path):
            if level > 1 or (level == 0 and name.partition(".")[0] == "autograders" and not name.startswith("autograders.worker")):
                offenders.append(f"{path.name}: {'.' * level}{name}")
    assert offenders == []
    grader_side = {p.stem for p in AUTOGRADERS.glob("*.py")} - {"__init__", "__main__"}
    assert grader_side >= {"engine", "sandbox", "assemble", "course", "grade", "record", "release", "publish"}
    bare = [f"{path.name}: {name}" for path in WORKER.glob("*.py") for level, name in _imports(path)
            if level == 0 and name.partition(".")[0] in grader_side | {"checks"}]
    assert bare == [], "a grader module imported by its bare name"


def test_the_package_face_imports_nothing():
    """``autograders/__init__.py`` goes into every sandbox with the worker: a docstring, nothing else."""
    tree = ast.parse((AUTOGRADERS / "__init__.py").read_text())
    assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant)


def test_the_graders_internals_are_not_in_the_public_checks():
    names = {p.stem for p in (PACKAGE / "checks").glob("*.py")}
    assert not names & {"runner", "supervisor", "zygote", "forked_launch", "rank", "snapshot", "preload"}
    assert (WORKER / "runner.py").is_file() and (WORKER / "supervisor.py").is_file() and (WORKER / "zygote.py").is_file()


LOADED = """
import importlib, json, pkgutil, sys
import gpucourse
for info in pkgutil.walk_packages(gpucourse.__path__, "gpucourse."):
    if info.name.rpartition(".")[2] != "__main__":
        try:
            importlib.import_module(info.name)
        except Exception:
            pass
public = sorted(m for m in sys.modules if m.partition(".")[0] == "autograders")
import autograders.worker.supervisor, autograders.worker.rank
worker = sorted(m for m in sys.modules if m.partition(".")[0] == "autograders")
print(json.dumps({"public": public, "worker": worker}))
"""


@pytest.mark.slow  # starts a fresh Python per side and imports torch in each (about 20 s): `make test`, not `make test-fast`
def test_what_each_side_loads_in_a_fresh_python():
    """Every module of gpucourse loaded loads nothing of autograders; the whole worker loaded loads
    the package's face and the worker alone."""
    done = subprocess.run([sys.executable, "-c", LOADED], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GPUCOURSE_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["public"] == []
    assert {m for m in loaded["worker"] if m != "autograders" and not m.startswith("autograders.worker")} == set()
    assert "autograders.worker.runner" in loaded["worker"]

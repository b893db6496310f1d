"""What release.py and grade.py share: the course's nbgrader config and its assignments."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from traitlets import Dict, Unicode
from traitlets.config import Config, Configurable
from traitlets.config.loader import PyFileConfigLoader

HERE = AUTOGRADERS = Path(__file__).resolve().parent
ROOT = HERE.parent
SOLUTIONS = ROOT / "solutions"
COURSE = ROOT / "course"
EDITION = ROOT / "edition.toml"
PACKAGE = ROOT / "src" / "gpucourse"


def load_config(root: Path | None = None, db: Path | None = None, source: str | None = None,
                release: str | None = None) -> Config:
    """autograders/nbgrader_config.py, with the course root, database and folders overridden."""
    config = PyFileConfigLoader("nbgrader_config.py", path=str(HERE)).load_config()
    if root is not None:
        config.CourseDirectory.root = str(root)
    if db is not None:
        config.CourseDirectory.db_url = f"sqlite:///{db}"
    if source is not None:
        config.CourseDirectory.source_directory = source
    if release is not None:
        config.CourseDirectory.release_directory = release
    return config


class DueDates(Configurable):
    """Each assignment's due date, set in nbgrader_config.py (``c.DueDates.duedates``). nbgrader keeps
    due dates in the gradebook: `make grade` writes these there when it registers the assignments,
    and a submission stamped later (its timestamp.txt) gets nbgrader's late penalty."""

    duedates = Dict(value_trait=Unicode(), help="assignment id -> due date as nbgrader writes one, e.g. "
                    "'2026-10-05 23:59:00 Europe/Berlin' (a zone or offset after a space; UTC without)").tag(config=True)


def assignments(source: Path = SOLUTIONS) -> list[str]:
    """Assignment ids: the folders of ``source`` that hold at least one notebook."""
    return sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def stamp_new_gradebook(db: Path) -> bool:
    """Stamp a gradebook that does not exist yet with the schema revision nbgrader would write, read here.

    nbgrader's ``Gradebook`` finds the revision of a new database (its alembic head) by running the
    ``alembic`` command in a subprocess (``nbgrader.api.get_alembic_version``), which imports nbgrader
    anew: 3-4 s on 2 cores, paid by every class graded and every release. This process has nbgrader
    imported, so alembic's own ``ScriptDirectory`` reads the same head from nbgrader's migrations in
    milliseconds. Written before any ``Gradebook`` opens the file, the ``alembic_version`` table tells
    nbgrader the database exists, and ``Gradebook`` creates its tables as it always does. True where a
    gradebook was stamped; an existing file is left as it is."""
    import sqlite3

    import nbgrader
    from alembic.script import ScriptDirectory

    if db.exists():
        return False
    head = ScriptDirectory(str(Path(nbgrader.__file__).parent / "alembic")).get_current_head()
    with contextlib.closing(sqlite3.connect(db)) as connection, connection:
        connection.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        connection.execute("INSERT INTO alembic_version (version_num) VALUES (?)", (head,))
    return True


def api(config: Config):
    # nbgrader runs the `alembic` command to open a gradebook: make this interpreter's scripts
    # findable even when it was started as .venv/bin/python without an activated venv.
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
    from nbgrader.apps import NbGraderAPI  # slow import: only the drivers need it

    return NbGraderAPI(config=config)


# --- The student edition: where badges and setup cells point (edition.toml) -----------------------

@contextlib.contextmanager
def generated(solutions: Path, ids: list[str], db: Path | None = None,
              prepare: Callable[[Path], object] | None = None) -> Iterator[Path]:
    """nbgrader's generate_assignment for ``ids``, in a temporary course root; yields its release folder.

    nbgrader needs one root holding both source and release, so ``solutions`` is copied there first
    (``prepare`` may then change the copy). ``db`` is the gradebook that records the assignments (a
    throwaway one inside the root by default). Any failure stops with nbgrader's error and log.
    """
    with tempfile.TemporaryDirectory(prefix="gpucourse-generate-") as tmp:
        work = Path(tmp)
        shutil.copytree(solutions, work / "source", ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        if prepare is not None:
            prepare(work / "source")
        db = db or work / "gradebook.db"
        stamp_new_gradebook(db)  # no `alembic` subprocess for a new one
        nbgrader = api(load_config(root=work, db=db, source="source", release="release"))
        for aid in ids:
            result = nbgrader.generate_assignment(aid, force=True, create=True)
            if not result["success"]:
                raise SystemExit(f"generate_assignment failed for {aid}:\n{result['error']}\n{result['log']}")
        yield work / "release"


def package_version(package: Path = PACKAGE) -> str:
    """``gpucourse.__version__``, read from the source without importing it."""
    found = re.search(r'^__version__ = "([^"]+)"', (package / "__init__.py").read_text(), re.M)
    if not found:
        raise SystemExit(f"no __version__ = \"...\" in {package / '__init__.py'}")
    return found.group(1)


@dataclass(frozen=True)
class Edition:
    """The public student edition: its GitHub home (owner/name) and the ref notebooks install from."""

    home: str
    ref: str
    version: str

    @property
    def url(self) -> str:
        return f"https://github.com/{self.home}"

    @property
    def install_url(self) -> str:
        return f"git+{self.url}@{self.ref}"

    def badge_url(self, notebook: str) -> str:
        """The Colab link of ``notebook`` (``<assignment>/<name>.ipynb``) in the edition's course/."""
        return f"https://colab.research.google.com/github/{self.home}/blob/{self.ref}/course/{notebook}"


def load_edition(path: Path = EDITION, package: Path = PACKAGE) -> Edition:
    """edition.toml, with ``{version}`` in its ref replaced by the package's version."""
    table = tomllib.loads(path.read_text()).get("student-edition", {})
    home = table.get("home", "")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", home):
        raise SystemExit(f"{path}: [student-edition] home must be a GitHub owner/name, not {home!r}")
    version = package_version(package)
    ref = str(table.get("ref", "v{version}")).format(version=version)
    return Edition(home=home, ref=ref, version=version)


BADGE = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"
BADGE_LINE = re.compile(r"^\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)$", re.M)
SETUP_CELL_ID = "preamble"
# The first code cell of every notebook (a locked nbgrader cell). It runs before gpucourse exists on
# Colab, so the part that installs the package is plain Python; gpucourse.install does the rest.
# GPUCOURSE_INSTALL_URL stays an environment variable, read in the kernel: it is how a test (or a
# fork) points a notebook's install at another copy across the process boundary (gpucourse.environment).
SETUP_CELL = """\
# Setup, the same in every notebook: install the course helpers where they are missing (Colab),
# then seed everything, pick the device and read the smoke setting (GPUCOURSE_SMOKE=1 in CI).
import importlib.util, os, subprocess, sys
if importlib.util.find_spec("gpucourse") is None:
    url = os.environ.get("GPUCOURSE_INSTALL_URL", "{install_url}")
    print(f"Installing the course helpers from {{url}} ({about}, once per runtime)", flush=True)
    pip = [sys.executable, "-m", "pip", "install", {pip_options}]
    subprocess.run([*pip, "--no-deps", url], check=True)
    importlib.invalidate_caches()
    from gpucourse.install import install_missing; install_missing()
from gpucourse import setup
S = setup(seed=0)"""


def setup_code(edition: Edition) -> str:
    """The setup cell for ``edition``: its install URL, pip's options and the measured install time
    (gpucourse.install.MEASURED, the one source of the course's install estimates)."""
    from gpucourse.install import PIP_OPTIONS, estimate

    return SETUP_CELL.format(install_url=edition.install_url, about=estimate("gpucourse").about(),
                             pip_options=", ".join(f'"{o}"' for o in PIP_OPTIONS))


def stamp(nb, notebook: str, edition: Edition) -> bool:
    """Point ``nb``'s Colab badge (first markdown cell) and setup cell at ``edition``; True if changed.

    ``notebook`` is its path inside course/ (``<assignment>/<name>.ipynb``).
    """
    first = nb.cells[0] if nb.cells else None
    if first is None or first.cell_type != "markdown":
        raise SystemExit(f"{notebook}: the first cell must be markdown holding the Colab badge")
    badge = BADGE.format(url=edition.badge_url(notebook))
    if BADGE_LINE.search(first.source):
        source = BADGE_LINE.sub(lambda _: badge, first.source, count=1)
    else:
        source = badge + "\n\n" + first.source
    changed = source != first.source
    first.source = source
    setups = [c for c in nb.cells if c.cell_type == "code"
              and c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == SETUP_CELL_ID]
    if len(setups) != 1 or nb.cells.index(setups[0]) != 1:
        raise SystemExit(f"{notebook}: the second cell must be the setup cell (nbgrader id {SETUP_CELL_ID!r})")
    code = setup_code(edition)
    changed |= setups[0].source != code
    setups[0].source = code
    return changed

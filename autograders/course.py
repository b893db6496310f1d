"""What release.py and grade.py share: the course's nbgrader config and its assignments."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

HERE = AUTOGRADERS = Path(__file__).resolve().parent
ROOT = HERE.parent
SOLUTIONS = ROOT / "solutions"
COURSE = ROOT / "course"


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


def assignments(source: Path = SOLUTIONS) -> list[str]:
    """Assignment ids: the folders of ``source`` that hold at least one notebook."""
    return sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def api(config: Config):
    # nbgrader runs the `alembic` command to open a gradebook: make this interpreter's scripts
    # findable even when it was started as .venv/bin/python without an activated venv.
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
    from nbgrader.apps import NbGraderAPI  # slow import: only the drivers need it

    return NbGraderAPI(config=config)

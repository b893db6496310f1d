"""Measure what a notebook's first cells cost on a Colab-like Python: the numbers in gpucourse.install.MEASURED.

A Colab runtime has torch, NumPy, pandas, scikit-learn and friends, and lacks Lightning and Darts. This
builds such a Python from this checkout's .venv: a fresh venv that sees the .venv's packages through a
folder of links, minus the ones a Colab runtime lacks (Lightning and what only it needs; Darts and what
only it needs that Colab does not ship). Then it times, downloading from the package index with pip's
cache off (as a new runtime does):

  1. the setup cell's ``pip install --no-deps`` of the student edition (written by publish.py into a
     temporary folder; a local folder, so no git clone is timed),
  2. the setup cell's ``install_missing()`` (Lightning from the package registry),
  3. lesson 9's ``install_missing("darts")``.

Run: ``nice .venv/bin/python bench/install_times.py`` (needs the package registry). It prints each step's
wall time and the load average, to be copied into MEASURED with the date and machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from importlib.metadata import distribution
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the grader is the package autograders there

# What a Colab runtime lacks: Lightning with what only it needs, Darts with what only it needs and Colab lacks.
HIDDEN = ("pytorch-lightning", "lightning-fabric", "lightning-utilities", "torchmetrics", "darts", "nfoursid", "pyod", "shap")


def top_level_entries(name: str) -> set[str]:
    """The names in site-packages that distribution ``name`` installed (its RECORD's first parts)."""
    files = distribution(name).files or []
    return {f.parts[0] for f in files if f.parts and f.parts[0] not in ("..", "bin")}


def colab_like(tmp: Path) -> Path:
    """A venv that sees this .venv's packages except HIDDEN; returns its python."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    hidden = set().union(*(top_level_entries(n) for n in HIDDEN if _installed(n)))
    view = tmp / "view"
    view.mkdir()
    for entry in site.iterdir():
        if entry.name not in hidden and not entry.name.startswith("gpucourse") and not entry.name.startswith("__editable__"):
            (view / entry.name).symlink_to(entry)
    venv = tmp / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    own_site = next((venv / "lib").glob("python*/site-packages"))
    (own_site / "colab_like.pth").write_text(str(view) + "\n")
    return venv / "bin" / "python"


def _installed(name: str) -> bool:
    try:
        distribution(name)
        return True
    except Exception:
        return False


def timed(what: str, command: list[str], env: dict) -> float:
    start = time.perf_counter()
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    print(f"{what}: {seconds:.1f} s (exit {run.returncode})")
    print("   ", (run.stdout + run.stderr).strip().replace("\n", "\n    "))
    if run.returncode:
        raise SystemExit(f"{what} failed")
    return seconds


def main() -> None:
    from autograders.publish import publish

    from gpucourse.install import PIP_OPTIONS

    # From the package index itself, with an empty cache, as a new runtime does: no local wheels or mirrors.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHONPATH"))}
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"})
    with tempfile.TemporaryDirectory(prefix="gpucourse-install-times-") as folder:
        tmp = Path(folder)
        edition = publish(tmp / "edition", git=False)
        python = str(colab_like(tmp))
        print(f"load average before: {os.getloadavg()}")
        timed("setup cell: pip install --no-deps the edition",
              [python, "-m", "pip", "install", *PIP_OPTIONS, "--no-deps", str(edition)], env)
        missing = "from gpucourse.install import install_missing; install_missing"
        timed("setup cell: install_missing()", [python, "-c", f"{missing}()"], env)
        timed("lesson 9: install_missing('darts')", [python, "-c", f"{missing}('darts')"], env)
        print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

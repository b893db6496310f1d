"""Build the rendered course (`make site`): a static HTML book of the executed lessons.

The tool is Jupyter Book 1.x (Sphinx, sphinx-book-theme, myst-nb): its theme and templates are Python
packages, so the book builds offline. Jupyter Book 2.x builds with mystmd, which downloads its site
template from the network at every build, and fails without it.

What the book shows, per lesson: the notebook as released to students (course/), every cell's source
taken from the release, with the outputs of one run of the *solution* notebook (solutions/) for the
cells that are the same in both. Exercise cells (nbgrader solution cells) show the released stub
(`# YOUR CODE HERE` / `raise NotImplementedError()`, or `YOUR ANSWER HERE`) without output, and the
check cells (nbgrader grade cells) show no output, so no solution, hidden test or model answer reaches
the site. Cells after an exercise that use its answer show what the reference answer gives.

    python book/make_book.py                       # run solutions/ into build/executed/, then build the book
    GPUCOURSE_SMOKE=1 python book/make_book.py     # the same at smoke size (small data, few epochs)
    python book/make_book.py --no-execute          # build from build/executed/ as it is (the tests save it)

The book's source is written to build/site/ and its HTML to build/site/_build/html/index.html.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import nbformat
import yaml

from gpucourse import environment

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
SOLUTIONS, COURSE = ROOT / "solutions", ROOT / "course"
EXECUTED = ROOT / "build" / "executed"
SITE = ROOT / "build" / "site"


def lessons(folder: Path = COURSE) -> list[Path]:
    """The notebooks, as paths relative to ``folder`` (``<assignment>/<name>.ipynb``), in course order."""
    return sorted(p.relative_to(folder) for p in folder.glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def execute(rel: Path, executed: Path = EXECUTED, timeout: int = 3600) -> Path:
    """Run ``solutions/<rel>`` in a fresh kernel and save it executed under ``executed/<rel>``."""
    from nbclient import NotebookClient

    nb = nbformat.read(SOLUTIONS / rel, as_version=4)
    with tempfile.TemporaryDirectory(prefix="gpucourse-book-") as cwd:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": cwd}}).execute()
    target = executed / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    nbformat.write(nb, partial)
    os.replace(partial, target)
    return target


def redact(released, executed):
    """The released notebook, with the executed run's outputs for the cells that are not exercises.

    A cell gets outputs only when it is a code cell, neither an nbgrader solution cell nor a grade cell,
    and its source is the same in the release and in the run; every other cell has none.
    """
    if [c.cell_type for c in released.cells] != [c.cell_type for c in executed.cells]:
        raise ValueError("the executed notebook does not have the released notebook's cells: run `make release`")
    book = nbformat.from_dict(released)
    for cell, run in zip(book.cells, executed.cells):
        if cell.cell_type != "code":
            continue
        meta = _nbgrader(cell)
        shown = not meta.get("solution") and not meta.get("grade") and cell.source == run.source
        cell.outputs = [nbformat.from_dict(o) for o in run.get("outputs", [])] if shown else []
        cell.execution_count = run.get("execution_count") if shown else None
    return book


def stale_cells(released, executed) -> list[int]:
    """Code cells shown with outputs in the book whose source the run did not have (an older run)."""
    return [i for i, (cell, run) in enumerate(zip(released.cells, executed.cells))
            if cell.cell_type == "code" and not _nbgrader(cell).get("solution")
            and not _nbgrader(cell).get("grade") and cell.source != run.source]


def _repository_url() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]


def assemble(executed: Path = EXECUTED, site: Path = SITE) -> list[Path]:
    """Write the book's source into ``site``: configuration, table of contents, home page, lessons."""
    missing = [str(rel) for rel in lessons() if not (executed / rel).is_file()]
    if missing:
        raise FileNotFoundError(f"no executed notebook in {executed} for: {', '.join(missing)}")
    site.mkdir(parents=True, exist_ok=True)
    for old in site.iterdir():  # a fresh source; _build/ stays for the build to overwrite
        if old.name != "_build":
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    config = yaml.safe_load((HERE / "_config.yml").read_text())
    config["repository"]["url"] = _repository_url()
    (site / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    shutil.copy(HERE / "intro.md", site / "intro.md")
    written = []
    for rel in lessons():
        released, run = nbformat.read(COURSE / rel, as_version=4), nbformat.read(executed / rel, as_version=4)
        book = redact(released, run)
        if stale := stale_cells(released, run):
            print(f"warning: {executed / rel} is a run of older sources (cells {stale} changed since); "
                  f"those cells are shown without output", file=sys.stderr)
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(book, site / rel)
        written.append(site / rel)
    toc = {"format": "jb-book", "root": "intro",
           "chapters": [{"file": rel.with_suffix("").as_posix()} for rel in lessons()]}
    (site / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    return written


def build_html(site: Path = SITE, quiet: bool = False) -> Path:
    """Run Jupyter Book on ``site``; returns the folder holding index.html."""
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    command = [str(jupyter_book) if jupyter_book.exists() else "jupyter-book", "build", str(site),
               "--builder", "html", "--all"]
    result = subprocess.run(command + (["-q"] if quiet else []), capture_output=quiet, text=True)
    if result.returncode:
        raise RuntimeError(f"jupyter-book failed ({result.returncode}):\n{(result.stdout or '')[-3000:]}"
                           f"{(result.stderr or '')[-3000:]}")
    return site / "_build" / "html"


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-execute", action="store_true", help="build from the executed notebooks already there")
    parser.add_argument("--executed", type=Path, default=EXECUTED, help="executed solution notebooks (default build/executed)")
    parser.add_argument("--site", type=Path, default=SITE, help="the book's source and build (default build/site)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if not args.no_execute:
        size = "smoke" if environment.smoke() else "full"
        for rel in lessons():
            t0 = time.perf_counter()
            print(f"executing solutions/{rel} ({size} size) ...", flush=True)
            execute(rel, args.executed)
            print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
    assemble(args.executed, args.site)
    html = build_html(args.site)
    print(f"\nthe course, rendered: {html / 'index.html'} "
          f"({_size(html) / 1e6:.1f} MB, {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

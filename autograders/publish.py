"""`make publish`: write the public student edition, committed and tagged in its own git repository.

The edition holds what students need and nothing of the grading: the released notebooks (course/),
the helper package with its public checks (src/gpucourse), a pyproject.toml without the instructor's
extras, a student README with every lesson's Colab badge, a LICENSE and a small Makefile
(`make lab`). No solutions, hidden checks, tests, fixtures or grading tools. The package keeps the
self-check key of the answer exercises (salted hashes) unless edition.toml says ``self_check = false``,
for a class whose answer exercises are graded. The folder is a git repository whose commit is
tagged with edition.toml's ref; push it to edition.toml's home:

    cd build/student-edition && git push <home's URL> main <ref>

Publishing again into the same folder commits on top of the previous edition (students' `git pull`
keeps working); to start from the public history on another machine, `git clone` the home there first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import nbformat
from packaging.requirements import Requirement

from .course import BADGE, COURSE, EDITION, PACKAGE, ROOT, Edition, load_edition, setup_code

OUT = ROOT / "build" / "student-edition"
ENTRIES = [".git", ".gitignore", "LICENSE", "Makefile", "README.md", "course", "pyproject.toml", "src"]
# The extras a student may want; `lab` loses nbgrader (grading needs this repository's configuration).
STUDENT_EXTRAS = ("lab", "darts", "tf")
INSTRUCTOR_ONLY = {"nbgrader"}
KEY_NAME = "self_check.json"  # in src/gpucourse/checks/ (gpucourse.checks.self_check)
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info")

GITIGNORE = """\
.venv/
work/
__pycache__/
*.egg-info/
.ipynb_checkpoints/
cifar10-data/
cifar-10-batches-py/
"""

MAKEFILE = """\
# `make lab`: create .venv, install the course helpers, copy course/ into work/ (each file once, so
# `git pull` updates course/ and never overwrites your answers), and open JupyterLab on work/.

PYTHON ?= python3
VENV   ?= .venv
WORK   ?= work
BIN    := $(VENV)/bin

.PHONY: lab install clean

$(BIN)/python:
\t@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required; set PYTHON=/path/to/python3.11")'
\t$(PYTHON) -m venv $(VENV)
\t$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
\t$(BIN)/python -m pip install -e ".[lab,darts]"
\t@touch $@

install: $(VENV)/.installed

lab: install
\t@$(BIN)/python lab/copy_course.py course "$(WORK)"
\t$(BIN)/jupyter lab --ServerApp.root_dir="$(abspath $(WORK))" $(if $(filter 0,$(shell id -u)),--allow-root,) $(LAB_ARGS)

clean:
\trm -rf $(VENV)
"""

README = """\
# GPU & data-parallel deep learning

A hands-on notebook course: why GPUs are fast and how to keep them busy, from processes and threads
through CUDA, Tensor Cores, mixed precision and data movement to PyTorch Lightning and DDP on many
devices, TPUs, a Darts forecasting case study and clusters. Every lesson runs on any CPU; cells that
need a GPU or TPU say so and skip, and every speed claim is measured on *your* machine.

| lesson | open |
|---|---|
{rows}

## On Colab

Click a lesson's badge. Its first code cell installs the course helpers (`gpucourse`, this repository
at `{ref}`) next to the PyTorch that Colab ships, which it never replaces, and prints one line per step:
what it installs, its estimate ({setup_about}, once per runtime; lesson 9 adds Darts, {darts_about}),
and how long it took. An older torch than the tested one is kept, and said so in one line; that is not
an error. For a GPU choose *Runtime → Change runtime type*.

The estimates are measured, not guessed: {provenance}. They are kept in one table,
`gpucourse.install.MEASURED`, from which the notebooks and this README take them.

## On your own machine

Needs Python ≥ 3.11. With `make`:

```bash
git clone {url}.git && cd {name}
make lab     # .venv, install, copy course/ into work/ once, open JupyterLab on work/
```

By hand:

```bash
python -m venv .venv && . .venv/bin/activate
pip install -e ".[lab,darts]"    # or `pip install -e .` for the helpers alone (no Darts, no JupyterLab)
cp -R course work                # your copy: `git pull` updates course/, never work/
jupyter lab work
```

PyTorch is the large part of the install. `python -m gpucourse doctor` explains why torch does or
does not see a GPU on your machine, with the fix.

## Exercises and feedback

Work through a lesson top to bottom; exercise cells say `# YOUR CODE HERE`. Under each exercise a
one-line cell `check("<exercise>")` runs that exercise's public checks and prints ✓ or ✗ with the
reason, on Colab and locally alike; an exercise you have not answered yet reads "not answered yet:
define `name` (...)". A cell that shows off an exercise's answer says "answer exercise N first" until
you have. Warnings printed by torch or Lightning never count against you.

**What the checks tell you, and what they do not.** ✓ on every public check means your answer has the
right form and passes the cases shown; it is not your grade. The public checks are a subset: grading
runs hidden checks too (more inputs, edge cases, every clause of the exercise's text), on the notebook
you hand in, so an answer that passes here can still lose points there. The JupyterLab this edition
installs (`make lab`, the `lab` extra) has no nbgrader and so no **Validate** button: the `check` cells
are your feedback there and on Colab (on a class's JupyterHub with nbgrader, Validate runs every
check of the notebook at once).

{self_check}

## Handing in

How you hand in a notebook depends on how you take the course; your instructor says which:

- **A class on JupyterHub with nbgrader** (an *Assignments* tab): *Fetch* the assignment there, work in
  the fetched copy, save, and *Submit* it from the same tab; you may submit again before the deadline
  (the last submission counts). Where your instructor collects files instead, upload the saved
  `.ipynb` from your `work/` folder where they say.
- **Colab**: *File → Download → Download .ipynb*, then upload that file where your instructor says (an
  LMS assignment, a shared folder). Colab saves your edits to your Google Drive only after *File →
  Save a copy in Drive*: do that first if you want to come back to it.
- **Self-study**: there is nothing to hand in. `check("<exercise>")` is your feedback.

Hand in the notebook with your answers in the exercise cells only: grading takes your answer cells
and runs everything else as released, so changes elsewhere are not seen.

## Contents

```
course/        the lessons' notebooks (copy them before you work in them)
src/gpucourse/ the course helpers: one module per lesson, and every exercise's public checks
lab/           the copy step of `make lab` (course/ into work/, never over your files)
```

MIT licensed (LICENSE).
"""


SELF_CHECK_ON = """\
Under an answer exercise (a quiz letter, a choice of tools, a set of settings), once the public
checks pass, `check` also says **correct** or **not yet**. It compares a salted hash of your answer
with hashes of the accepted answers (`src/gpucourse/checks/self_check.json`), so it never shows an
answer; but any guess can be checked that way, and a quiz question has only four letters to try.
Self-check is for practice, and only for answer exercises (never code): a class whose answer
exercises are graded turns it off, and then `check` says so. `GPUCOURSE_SELF_CHECK=0` turns it off on
your machine."""

SELF_CHECK_OFF = """\
Self-check is off in this edition: under an answer exercise (a quiz letter, a choice of tools, a set
of settings), `check` looks at the form of your answer only; whether it is right, grading says."""


def install_estimates() -> dict[str, str]:
    """The README's install times, from gpucourse.install.MEASURED (the setup cell's come from there too)."""
    from gpucourse.install import MEASURED, estimate

    setup = estimate("gpucourse", "pytorch-lightning")
    return {"setup_about": setup.about(), "darts_about": estimate("darts").about(),
            "provenance": MEASURED["darts"].how.split("; ", 1)[1]}


def self_check_on(path: Path = EDITION) -> bool:
    """edition.toml's ``self_check`` (true when absent): whether the edition carries the self-check key."""
    value = tomllib.loads(path.read_text()).get("student-edition", {}).get("self_check", True)
    if not isinstance(value, bool):
        raise SystemExit(f"{path}: [student-edition] self_check must be true or false, not {value!r}")
    return value


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def edition_pyproject(edition: Edition, source: Path = ROOT / "pyproject.toml") -> str:
    """The instructor's package metadata and dependencies, the student extras only, the edition's URL."""
    project = tomllib.loads(source.read_text())["project"]
    extras = {}
    for name in STUDENT_EXTRAS:
        kept = [r for r in project.get("optional-dependencies", {}).get(name, [])
                if Requirement(r).name not in INSTRUCTOR_ONLY]
        if kept:
            extras[name] = kept
    dependencies = "".join(f"    {json.dumps(d)},\n" for d in project["dependencies"])
    # the package's data files as the project declares them, from the one place they are declared
    data = tomllib.loads(source.read_text())["tool"]["setuptools"]["package-data"]
    package_data = "".join(f"{json.dumps(k)} = {_toml_list(v)}\n" for k, v in data.items())
    return f"""\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = {json.dumps(project["name"])}
dynamic = ["version"]
description = {json.dumps(project["description"])}
readme = "README.md"
requires-python = {json.dumps(project["requires-python"])}
license = {json.dumps(project["license"])}
# Floors are the versions the course is tested with. On Colab the notebooks install this package
# with --no-deps and add only what is missing (gpucourse.install), never replacing Colab's torch.
dependencies = [
{dependencies}]

[project.optional-dependencies]
{"".join(f"{k} = {_toml_list(v)}{chr(10)}" for k, v in extras.items())}
[project.urls]
Repository = {json.dumps(edition.url)}

[tool.setuptools.dynamic]
version = {{ attr = "gpucourse.__version__" }}

[tool.setuptools.packages.find]
where = ["src"]

[tool.setuptools.package-data]
{package_data}"""


def _lesson_rows(course: Path, edition: Edition) -> str:
    rows = []
    for path in sorted(course.glob("*/*.ipynb")):
        rel = path.relative_to(course).as_posix()
        first = nbformat.read(path, as_version=4).cells[0].source.splitlines()
        title = next((line[2:].strip() for line in first if line.startswith("# ")), path.stem)
        rows.append(f"| {title} (`course/{rel}`) | {BADGE.format(url=edition.badge_url(rel))} |")
    return "\n".join(rows)


def check_release(course: Path, edition: Edition) -> None:
    """Refuse to publish notebooks released for another home or ref: `make release` first."""
    setup = setup_code(edition)
    for path in sorted(course.glob("*/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        rel = path.relative_to(course).as_posix()
        if edition.badge_url(rel) not in nb.cells[0].source or nb.cells[1].source != setup:
            raise SystemExit(f"course/{rel} is not released for {edition.home} @ {edition.ref}: run `make release`")


def _git(out: Path, *args: str) -> str:
    identity = []
    for key, fallback in (("user.name", "Course staff"), ("user.email", "course-staff@users.noreply.github.com")):
        found = subprocess.run(["git", "config", key], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        identity += ["-c", f"{key}={found or fallback}"]
    return subprocess.run(["git", *identity, "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args],
                          cwd=out, check=True, capture_output=True, text=True).stdout


def publish(out: Path = OUT, edition: Edition | None = None, course: Path = COURSE, package: Path = PACKAGE,
            git: bool = True, self_check: bool | None = None) -> Path:
    """Write the student edition into ``out``; returns ``out``.

    ``self_check`` (edition.toml's by default) keeps the package's self-check key; False leaves it out.
    An earlier edition there is replaced, except its git history: the new edition is committed on
    top of it (nothing is committed when nothing changed) and the tag is moved to that commit.
    """
    edition = edition or load_edition()
    self_check = self_check_on() if self_check is None else self_check
    check_release(course, edition)
    key = package / "checks" / KEY_NAME
    if self_check and not key.is_file():
        raise SystemExit(f"{key} is missing and edition.toml asks for self-check: run `make release`")
    out = out.resolve()
    if ROOT == out or ROOT.is_relative_to(out):
        raise SystemExit(f"refusing to write the edition over {out}")
    if out.exists() and not {p.name for p in out.iterdir()} <= set(ENTRIES):
        raise SystemExit(f"{out} holds other files than a student edition; choose an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        if old.name != ".git":
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    shutil.copytree(course, out / "course", ignore=IGNORE)
    shutil.copytree(package, out / "src" / "gpucourse", ignore=IGNORE)
    if not self_check:
        (out / "src" / "gpucourse" / "checks" / KEY_NAME).unlink(missing_ok=True)
    shutil.copy2(ROOT / "LICENSE", out / "LICENSE")
    (out / "lab").mkdir()
    shutil.copy2(ROOT / "lab" / "copy_course.py", out / "lab" / "copy_course.py")  # the same copy step as `make lab` here
    (out / "pyproject.toml").write_text(edition_pyproject(edition))
    owner_name = edition.home.split("/", 1)[1]
    (out / "README.md").write_text(README.format(rows=_lesson_rows(course, edition), ref=edition.ref,
                                                 url=edition.url, name=owner_name, **install_estimates(),
                                                 self_check=SELF_CHECK_ON if self_check else SELF_CHECK_OFF))
    (out / "Makefile").write_text(MAKEFILE)
    (out / ".gitignore").write_text(GITIGNORE)
    if git:
        if not (out / ".git").exists():
            _git(out, "init", "-q", "-b", "main")
        _git(out, "add", "-A")
        if _git(out, "status", "--porcelain").strip():
            _git(out, "commit", "-q", "-m", f"Student edition {edition.ref}")
        _git(out, "tag", "-f", "-a", edition.ref, "-m", f"Student edition {edition.ref}")
    return out


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and ".git" not in p.relative_to(folder).parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help="where to write it (default: build/student-edition)")
    parser.add_argument("--edition", type=Path, default=EDITION, help="the edition's config (edition.toml)")
    args = parser.parse_args(argv)
    edition = load_edition(args.edition)
    out = publish(args.out, edition, self_check=self_check_on(args.edition))
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(f"student edition {edition.ref} written to {shown} ({_size(out) / 1e6:.1f} MB, committed and tagged)")
    print(f"self-check: {'on (the key is in the package)' if self_check_on(args.edition) else 'off (no key in the package)'}")
    print(f"publish it:  cd {shown} && git push {edition.url}.git main {edition.ref}")
    print("(after publishing the same version twice, the moved tag needs `git push --force ... <ref>`)")
    return 0

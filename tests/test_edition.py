"""The student edition (`make publish`): nothing hidden in it, and its setup cell installs it as Colab would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest

from conftest import AUTOGRADERS, COURSE, ROOT, SOLUTIONS, notebooks, read
from test_release import MARKERS, _hidden_lines, _lines

pytestmark = pytest.mark.slow  # builds the edition (make publish: git, a wheel; about 40 s): `make test`, not `make test-fast`

TOP_LEVEL = {".git", ".gitignore", "LICENSE", "Makefile", "README.md", "course", "lab", "pyproject.toml", "src"}


@pytest.fixture(scope="module")
def edition():
    from autograders.course import load_edition

    return load_edition()


@pytest.fixture(scope="module")
def built(tmp_path_factory, edition) -> Path:
    from autograders.publish import publish

    return publish(tmp_path_factory.mktemp("edition") / "student-edition", edition)


def _files(folder: Path) -> dict[Path, str]:
    return {p: p.read_text() for p in sorted(folder.rglob("*")) if p.is_file() and ".git" not in p.relative_to(folder).parts}


def _hidden_check_names() -> list[str]:
    names = []
    for check_file in (AUTOGRADERS / "checks").rglob("*.py"):
        names += re.findall(r"^def (\w+)", check_file.read_text(), re.M)
    assert names, "no hidden checks found"
    return names


# --- (a) What is in it, and what is not ---------------------------------------------------------

def test_the_edition_holds_exactly_the_student_files(built):
    assert {p.name for p in built.iterdir()} == TOP_LEVEL
    assert [p.name for p in (built / "src").iterdir()] == ["gpucourse"]
    assert [p.relative_to(built / "course") for p in notebooks(built / "course")] == \
        [p.relative_to(COURSE) for p in notebooks(COURSE)]
    from autograders.publish import KEY_NAME, self_check_on

    package = {p.relative_to(ROOT / "src"): p.read_bytes() for p in (ROOT / "src" / "gpucourse").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts and (p.name != KEY_NAME or self_check_on())}
    assert {p.relative_to(built / "src"): p.read_bytes() for p in (built / "src" / "gpucourse").rglob("*")
            if p.is_file()} == package, "the edition's package is the course's package, file for file"
    for path in notebooks(COURSE):
        assert (built / "course" / path.relative_to(COURSE)).read_bytes() == path.read_bytes()


def test_nothing_hidden_in_the_edition(built):
    files = _files(built)
    text = "\n".join(files.values())
    for marker in MARKERS:
        assert marker not in text, f"{marker!r} in the edition"
    assert "autograders" not in text
    assert not [p for p in files if "autograders" in p.relative_to(built).parts], "a file of the grader in the edition"
    assert not [n for n in _hidden_check_names() if re.search(rf"\b{re.escape(n)}\b", text)], "hidden check names"
    # a public check module and the hidden one share the lesson's name (CONTRIBUTING.md): each check module of
    # the edition is the project's public one, byte for byte, so none is the grader's
    shipped = [p for p in files if p.suffix == ".py" and "checks" in p.parts]
    assert shipped and all(p.read_bytes() == (ROOT / p.relative_to(built)).read_bytes() for p in shipped)
    # Solution lines: the notebooks, README and project files show none. The package is checked below.
    visible = set().union(*(_lines(t) for p, t in files.items() if (built / "src") not in p.parents))
    for source in notebooks(SOLUTIONS):
        hidden = _hidden_lines(read(source))
        assert hidden, f"the leak check found nothing to look for in {source.name}"
        leaked = sorted(hidden & visible)
        assert not leaked, f"lines of {source.parent.name}'s solutions in the edition: {leaked[:5]}"


def _solution_runs(source_nb, length: int = 3) -> set[tuple[str, ...]]:
    """Every ``length`` consecutive non-trivial lines inside a solution region of ``source_nb``."""
    from test_release import REGIONS

    runs = set()
    for cell in source_nb.cells:
        for match in REGIONS.finditer(cell.source):
            if match.group(1) != "SOLUTION":
                continue
            lines = [line.strip() for line in match.group(2).splitlines() if len(line.strip()) >= 6]
            runs |= {tuple(lines[i:i + length]) for i in range(len(lines) - length + 1)}
    return runs


# The API's own idioms, as its documentation writes them: a reference implementation may use them too.
IDIOMS = {("scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()")}  # torch.amp's GradScaler


def restated_solutions(package: Path) -> list[str]:
    """Blocks of three or more consecutive solution lines that a file of ``package`` repeats.

    The package holds runnable reference implementations of what the lessons teach, so one-line idioms
    (``scaler.update()``) are expected in it; a whole answer restated block by block is a leak.
    """
    found = []
    for path, text in _files(package).items():
        lines = [line.strip() for line in text.splitlines() if len(line.strip()) >= 6]
        windows = {tuple(lines[i:i + 3]) for i in range(len(lines) - 2)}
        for source in notebooks(SOLUTIONS):
            found += [f"{path.name} repeats {source.parent.name}: {run}" for run in (_solution_runs(read(source)) & windows) - IDIOMS]
    return found


def test_the_edition_holds_no_trapdoor_of_the_time_lock_modulus(built):
    """gpucourse.processes_threads.MODULUS is public; its primes (and phi) are the grader's alone: with them an answer
    could return square_chain's results without doing the work. Looked for in decimal and hex, in pieces, in
    the edition's text with quotes and white space taken out (a number split over string literals)."""
    from gpucourse.processes_threads import MODULUS

    from autograders.checks.lesson01_processes_threads import parallel_map as hidden  # the time-lock puzzle
    p, q = hidden._PRIME_P, hidden._PRIME_Q
    assert p * q == MODULUS
    text = re.sub(r"[\s\"'_]", "", "\n".join(_files(built).values())).lower()
    public = str(MODULUS) + format(MODULUS, "x")  # phi = MODULUS - p - q + 1 begins with MODULUS's digits
    for secret in (p, q, (p - 1) * (q - 1)):
        for digits in (str(secret), format(secret, "x")):
            pieces = [digits[i:i + 40] for i in (0, len(digits) // 2, len(digits) - 40)]
            assert not [piece for piece in pieces if piece in text and piece not in public], "a trapdoor in the edition"
            assert [piece for piece in pieces if piece not in public], "nothing of it to look for"


def test_the_package_restates_no_solution(built):
    assert not restated_solutions(built / "src")


def test_the_restatement_check_catches_a_restated_answer(tmp_path):
    """A package that carries lesson 10's answer (as it once did, in a public check) is caught."""
    source = read(SOLUTIONS / "lesson10_beyond_one_machine" / "beyond_one_machine.ipynb")
    answer = next(c.source for c in source.cells if "def slurm_ranks" in c.source)
    (tmp_path / "oracle.py").write_text(answer.replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", ""))
    assert any("lesson10_beyond_one_machine" in leak for leak in restated_solutions(tmp_path))


def test_the_edition_is_a_tagged_git_repository(built, edition):
    git = lambda *args: subprocess.run(["git", *args], cwd=built, check=True, capture_output=True, text=True).stdout
    assert git("tag", "--points-at", "HEAD").split() == [edition.ref]
    assert git("status", "--porcelain") == ""
    tracked = {line.split("/", 1)[0] for line in git("ls-files").splitlines()}
    assert tracked == TOP_LEVEL - {".git"}


def test_the_edition_pyproject_and_readme(built, edition):
    mine = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    theirs = tomllib.loads((built / "pyproject.toml").read_text())["project"]
    assert theirs["dependencies"] == mine["dependencies"]
    assert theirs["name"] == mine["name"] and theirs["requires-python"] == mine["requires-python"]
    assert set(theirs["optional-dependencies"]) == {"lab", "darts", "tf"}
    assert theirs["optional-dependencies"]["darts"] == mine["optional-dependencies"]["darts"]
    assert not [r for extra in theirs["optional-dependencies"].values() for r in extra if r.startswith(("nbgrader", "pytest"))]
    assert theirs["urls"]["Repository"] == edition.url
    readme = (built / "README.md").read_text()
    for path in notebooks(COURSE):
        assert edition.badge_url(path.relative_to(COURSE).as_posix()) in readme
    assert "pip install -e" in readme and 'check("' in readme
    assert re.search(r"^lab:", (built / "Makefile").read_text(), re.M)


def test_the_student_readme_says_how_to_hand_in_and_what_the_checks_do_not_tell(built):
    readme = (built / "README.md").read_text()
    hand_in = readme.split("## Handing in", 1)[1].split("\n## ", 1)[0]
    for way, steps in {"nbgrader": ("*Fetch*", "*Submit*"), "Colab": ("Download .ipynb", "upload"),
                       "Self-study": ("nothing to hand in",)}.items():
        assert way in hand_in and all(step in hand_in for step in steps), way
    assert "hidden checks" in readme and "subset" in readme and "not answered yet" in readme
    assert "turns it off" in readme or "Self-check is off" in readme


def test_the_student_readme_promises_validate_only_where_nbgrader_is(built):
    """The edition's extras leave nbgrader out (grading needs this repository), so its JupyterLab has no
    Validate button: the README names Validate only for a class's JupyterHub with nbgrader."""
    from packaging.requirements import Requirement

    extras = tomllib.loads((built / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "nbgrader" not in {Requirement(r).name for reqs in extras.values() for r in reqs}
    readme = (built / "README.md").read_text()
    sentences = re.split(r"(?<=[.!?])\s+", " ".join(readme.split()))
    validate = [s for s in sentences if "Validate" in s]
    assert any("no **Validate** button" in s for s in validate), "the README does not say there is none"
    promised = [s for s in validate if "JupyterHub" not in s and "no **Validate**" not in s]
    assert not promised, f"Validate promised where the edition installs no nbgrader: {promised}"


ESTIMATE = re.compile(r"about (\d+) s|about (half )?a minute|\d+[–-]\d+ minutes")


def test_every_install_estimate_comes_from_the_one_measured_table(built):
    """The setup cell, install_missing's message and the student README give MEASURED's numbers, and
    every entry says how it was measured; no other install time is written anywhere students read."""
    from gpucourse.install import MEASURED, estimate

    assert MEASURED and all(m.seconds > 0 for m in MEASURED.values())
    assert all("runs:" in m.how and "load average" in m.how for m in MEASURED.values()), "provenance"
    setup = read(built / "course" / "lesson01_processes_threads" / "processes_threads.ipynb").cells[1].source
    assert ESTIMATE.findall(setup) == [(str(int(estimate("gpucourse").about().split()[1])), "")]
    readme = (built / "README.md").read_text()
    assert estimate("gpucourse", "pytorch-lightning").about() in readme and estimate("darts").about() in readme
    assert len(ESTIMATE.findall(readme)) == 2 and "half a minute" not in readme
    darts_cell = read(built / "course" / "lesson09_darts_forecasting" / "darts_forecasting.ipynb").cells[2].source
    assert not ESTIMATE.search(darts_cell), "lesson 9's install cell prints MEASURED's estimate, it writes none"
    assert not re.search(r"install\w*[^.]*\b(\d+[–-]\d+ minutes|a minute)", (ROOT / "README.md").read_text())


def test_publish_refuses_notebooks_released_for_another_home(tmp_path, edition):
    from autograders.course import Edition
    from autograders.publish import publish

    with pytest.raises(SystemExit, match="make release"):
        publish(tmp_path / "out", Edition(home="someone-else/their-course", ref=edition.ref, version=edition.version))


# --- (b) The setup cell installs the edition where torch is already there (Colab) ----------------

def _top_level(name: str) -> set[str]:
    return {str(f).split("/")[0] for f in distribution(name).files}


def _wheel(name: str, folder: Path) -> Path:
    """A wheel of the installed pure-Python distribution ``name``: a local stand-in for PyPI."""
    dist = distribution(name)
    base = Path(dist.locate_file(""))
    wheel = folder / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for f in dist.files:
            if not str(f).startswith("..") and "__pycache__" not in f.parts and \
                    f.name not in ("INSTALLER", "REQUESTED", "direct_url.json"):
                archive.write(base / f, str(f))
    return wheel


def _colab_like(tmp: Path, absent: list[str]) -> Path:
    """A Python whose packages are this one's (torch included) but ``absent``: a fresh venv whose .pth
    adds a folder of links to every entry of this environment's site-packages except theirs."""
    here = Path(sysconfig.get_paths()["purelib"])
    skip = set().union(*(_top_level(name) for name in absent))
    preinstalled = tmp / "preinstalled"
    preinstalled.mkdir()
    for entry in here.iterdir():
        if entry.name not in skip and not entry.name.startswith("__editable__.gpucourse"):
            (preinstalled / entry.name).symlink_to(entry)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
    python = tmp / "venv" / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "preinstalled.pth").write_text(f"import site; site.addsitedir({str(preinstalled)!r})\n")
    return python


RUN_CELLS = """
import importlib.util, json, sys
cells = json.loads(sys.argv[1])
def state():
    import torch
    return {"darts": bool(importlib.util.find_spec("darts")), "torch": torch.__file__, "torch_version": torch.__version__}
exec(cells["lesson1"])
import gpucourse
after_lesson1 = {**state(), "gpucourse": gpucourse.__file__}
exec(cells["lesson9_setup"])
exec(cells["lesson9_darts"])
import darts
print("RESULT " + json.dumps({"lesson1": after_lesson1, "lesson9": {**state(), "darts_file": darts.__file__}}))
"""


def test_the_setup_cell_installs_the_edition_next_to_the_runtimes_torch(built, edition, tmp_path):
    """As on Colab: torch is there, gpucourse, Lightning and Darts are not; pip may not reach PyPI."""
    import torch

    python = _colab_like(tmp_path, absent=["gpucourse", "pytorch-lightning", "darts"])
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("pytorch-lightning", "darts"):
        _wheel(name, wheels)
    lesson1 = read(built / "course" / "lesson01_processes_threads" / "processes_threads.ipynb")
    lesson9 = read(built / "course" / "lesson09_darts_forecasting" / "darts_forecasting.ipynb")
    cells = {"lesson1": lesson1.cells[1].source, "lesson9_setup": lesson9.cells[1].source,
             "lesson9_darts": lesson9.cells[2].source}
    assert 'install_missing("darts")' in cells["lesson9_darts"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV", "GPUCOURSE_"))}
    env.update({
        "GPUCOURSE_INSTALL_URL": f"git+file://{built}@{edition.ref}",
        "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels),
        "PIP_NO_BUILD_ISOLATION": "0",  # pip reads this as --no-build-isolation: setuptools comes from the runtime
        "PIP_CACHE_DIR": str(tmp_path / "pip-cache"), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1",
    })
    run = subprocess.run([python, "-c", RUN_CELLS, json.dumps(cells)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout.split("RESULT ", 1)[1])
    venv_site = Path(result["lesson1"]["gpucourse"]).parent.parent
    assert venv_site.is_relative_to(tmp_path / "venv"), "gpucourse comes from the new install"
    for stage in ("lesson1", "lesson9"):
        assert result[stage]["torch"] == str(tmp_path / "preinstalled" / "torch" / "__init__.py"), "torch was replaced"
        assert result[stage]["torch_version"] == torch.__version__
    assert not result["lesson1"]["darts"], "a lesson other than 9 installed Darts"
    assert Path(result["lesson9"]["darts_file"]).is_relative_to(venv_site)
    installed = {p.name.split("-")[0] for p in venv_site.iterdir()} - {"preinstalled.pth"}
    assert installed == {"gpucourse", "pytorch_lightning", "lightning_fabric", "darts"}, installed
    out = run.stdout
    assert f"Installing the course helpers from git+file://{built}@{edition.ref}" in out
    assert re.search(r"Installing pytorch-lightning>=\S+ \(about \d+ s\); torch \S+, torchvision \S+ stay as they are", out)
    assert re.search(r"Installing darts>=\S+ \(about \d+ s\)", out)
    assert out.count("Installed in") == 2 and f"gpucourse {edition.version} | torch" in out


def test_the_install_plan_adds_what_is_missing_and_keeps_the_runtimes_torch():
    from gpucourse.install import plan

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floor = {r.split(">=")[0]: r for r in project["dependencies"] + project["optional-dependencies"]["darts"]}
    colab = {"torch": "2.8.0+cu126", "torchvision": "0.23.0+cu126", "numpy": "2.0.2", "matplotlib": "3.10.0"}
    base = plan(installed=colab.get)
    assert base.install == [floor["pytorch-lightning"]], "only what is missing, and never Darts outside lesson 9"
    assert base.keep == {"torch": "2.8.0+cu126", "torchvision": "0.23.0+cu126"}
    assert len(base.notes) == 1 and "torch 2.8.0+cu126, torchvision 0.23.0+cu126" in base.notes[0]
    assert plan("darts", installed=colab.get).install == [floor["darts"]]
    tested = {name: floor[name].split(">=")[1] for name in ("torch", "torchvision")}
    assert plan(installed={**colab, **tested}.get).notes == []
    assert plan(installed=lambda name: None).install[:2] == [floor["torch"], floor["torchvision"]]


def _older(python: Path, versions: dict[str, str]) -> None:
    """Make ``python``'s environment report older versions of these distributions, as an older Colab's
    would: metadata only, found before the real ones (pip and importlib.metadata take the first)."""
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    for name, version in versions.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "RECORD").write_text("")


OLDER_TORCH = {"torch": "2.10.0", "torchvision": "0.25.0"}  # below pyproject's floors, as on an older Colab


def _older_torch_runtime(tmp: Path, built: Path, edition) -> tuple[Path, dict]:
    python = _colab_like(tmp, absent=["gpucourse", "pytorch-lightning"])
    _older(python, OLDER_TORCH)
    wheels = tmp / "wheels"
    wheels.mkdir()
    _wheel("pytorch-lightning", wheels)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV", "GPUCOURSE_"))}
    env.update({"GPUCOURSE_INSTALL_URL": f"git+file://{built}@{edition.ref}", "PIP_CONFIG_FILE": os.devnull,
                "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_NO_BUILD_ISOLATION": "0",
                "PIP_CACHE_DIR": str(tmp / "pip-cache"), "PYTHONNOUSERSITE": "1"})
    return python, env


def test_pip_reports_the_kept_older_torch_as_an_error_without_the_courses_options(built, edition, tmp_path):
    """The scenario is real: installing Lightning next to gpucourse and an older torch, with plain
    ``pip install -q`` (what the setup cell did before), prints pip's resolver ERROR."""
    python, env = _older_torch_runtime(tmp_path, built, edition)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", env["GPUCOURSE_INSTALL_URL"]],
                   env=env, check=True, capture_output=True, timeout=300)
    pins = tmp_path / "keep.txt"
    pins.write_text("".join(f"{n}=={v}\n" for n, v in OLDER_TORCH.items()))
    run = subprocess.run([python, "-m", "pip", "install", "-q", "-c", str(pins), "pytorch-lightning>=2.6.4"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ERROR: pip's dependency resolver" in run.stderr and "torch 2.10.0 which is incompatible" in run.stderr


def test_the_setup_cell_prints_only_the_courses_lines_next_to_an_older_torch(built, edition, tmp_path):
    """The same runtime, the released setup cell: one line per step, no ERROR or WARNING from pip."""
    python, env = _older_torch_runtime(tmp_path, built, edition)
    setup = read(built / "course" / "lesson01_processes_threads" / "processes_threads.ipynb").cells[1].source
    run = subprocess.run([python, "-c", setup], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "ERROR" not in run.stdout + run.stderr and "WARNING" not in run.stdout + run.stderr, run.stderr
    assert run.stderr.strip() == "", run.stderr
    lines = run.stdout.strip().splitlines()
    expected = [r"Installing the course helpers from git\+file://\S+ \(about \d+ s, once per runtime\)",
                r"Note: torch 2\.10\.0, torchvision 0\.25\.0 here are older than the tested torch>=\S+, "
                r"torchvision>=\S+; kept as they are \(replacing a runtime's own torch breaks its CUDA setup\)\.",
                r"Installing pytorch-lightning>=\S+ \(about \d+ s\); torch 2\.10\.0, torchvision 0\.25\.0 stay as they are",
                r"Installed in \d+ s\.",
                rf"gpucourse {re.escape(edition.version)} \| torch \S+ \| device: \w+ \| seed 0 \| .*"]
    assert len(lines) == len(expected), lines
    for line, pattern in zip(lines, expected):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_estimates_are_rounded_up_measurements_or_none():
    from gpucourse.install import MEASURED, Measured, estimate

    assert Measured(11.6, "x").about() == "about 15 s" and Measured(10.1, "x").about() == "about 10 s"
    assert Measured(0.4, "x").about() == "about 5 s"
    both = estimate("gpucourse", "pytorch-lightning")
    assert both.seconds == MEASURED["gpucourse"].seconds + MEASURED["pytorch-lightning"].seconds
    assert estimate("numpy") is None and estimate("darts", "numpy") is None, "no estimate for what nobody measured"


def test_the_editions_wheel_holds_every_package_data_file_of_the_project(built, tmp_path):
    """Built as a non-editable install builds it (the setup cell's `pip install --no-deps`), the edition's
    wheel has every data file the project's pyproject declares: the GPU reference the lessons read
    (`gpucourse/reference/*.json`) was once left out, and 9 notebooks broke for every Colab student."""
    import fnmatch

    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(tmp_path), str(built)], check=True, capture_output=True, text=True, timeout=300)
    wheel = next(tmp_path.glob("gpucourse-*.whl"))
    inside = set(zipfile.ZipFile(wheel).namelist())
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    wanted = []
    for package, patterns in declared.items():
        folder = built / "src" / Path(*package.split("."))
        wanted += [f"{package.replace('.', '/')}/{p.name}" for p in folder.iterdir()
                   if any(fnmatch.fnmatch(p.name, pattern) for pattern in patterns)]
    assert any(name.startswith("gpucourse/reference/") and name.endswith(".json") for name in wanted)
    missing = sorted(set(wanted) - inside)
    assert not missing, f"the edition's wheel lacks {missing}"

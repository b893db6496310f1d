"""The student edition as a Colab student gets it, on the oldest torch the course supports.

`make publish` builds the edition; its setup cell installs it from its git tag (non-editable,
``--no-deps``) into a Python whose torch and torchvision are pyproject.toml's ``[tool.gpucourse]``
oldest ones, from the package index; then every released notebook (course/) runs there in a kernel of
that Python, with the reference answers in its answer cells, at smoke size: not one cell may fail.
The suite (`make test-suite`) installs the course editable and on the tested torch, so it cannot see a
package file missing from the wheel or an API that the oldest torch lacks; this test does. It takes
about 3 minutes on two cores once the runtime is built (183 s in a fresh-clone CI run), and the time to
install the runtime first where it is not built yet (``install_command``; marker ``edition``):
`make test-edition` runs it alone, and `make test`, which CI runs, runs it after the suite (having built
the runtime in the background meanwhile: ``python tests/test_edition_installed.py``).

The Python is kept under build/ (keyed by the versions and the requirements), so only the first run
pays for the install. PyPI has no CPU-only torch for Linux (those builds live on PyTorch's own index),
so it is the CUDA build with its nvidia-* libraries, as on Colab; it runs on a CPU.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import nbformat
import pytest

from conftest import REQUIRE_INDEX, REQUIRE_INDEX_ENV, ROOT, SOLUTIONS, nbgrader_meta, notebooks, read

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OLDEST = {"torch": PYPROJECT["tool"]["gpucourse"]["oldest-torch"],
          "torchvision": PYPROJECT["tool"]["gpucourse"]["oldest-torchvision"]}
RUNTIMES = ROOT / "build" / "oldest-torch"
TIMES = RUNTIMES / "notebook-times.json"  # what the last run measured, per notebook
PARALLEL = 2  # notebooks at a time (the course's build machine has 2 cores)
CELL_TIMEOUT = 600
PROBE = "GPUCOURSE-PROBE "
PROBE_CELL = f"""\
import json, sys
from importlib.metadata import distribution
import gpucourse, torch, torchvision
print({PROBE!r} + json.dumps({{"gpucourse": gpucourse.__file__, "torch": torch.__version__,
    "torchvision": torchvision.__version__, "python": sys.executable,
    "direct_url": json.loads(distribution("gpucourse").read_text("direct_url.json"))}}))"""


def runtime_requirements() -> tuple[list[str], str]:
    """What the Python gets besides gpucourse: the oldest torch and torchvision, gpucourse's other
    dependencies and Darts (lesson 9), and ipykernel (the notebooks' kernel); and the constraints,
    constraints.txt less its torch and torchvision pins."""
    project = PYPROJECT["project"]
    pinned = [f"{name}=={v}" for name, v in OLDEST.items()]
    others = [r for r in project["dependencies"] if re.split(r"[<>=!~\[ ;]", r, 1)[0] not in OLDEST]
    constraints = "".join(line + "\n" for line in (ROOT / "constraints.txt").read_text().splitlines()
                          if re.split(r"[<>=!~\[ ;#]", line.strip(), 1)[0] not in OLDEST)
    return pinned + others + project["optional-dependencies"]["darts"] + ["ipykernel"], constraints


def index_offers(name: str, version: str) -> tuple[bool, str]:
    """Whether the package index (pip's configuration) lists ``name`` ``version``, and what pip said."""
    try:
        run = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name], capture_output=True,
                             text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return False, f"`pip index versions {name}` timed out"
    listed = re.search(r"^Available versions: (.*)$", run.stdout, re.M)
    found = bool(listed) and version in [v.strip() for v in listed.group(1).split(",")]
    return found, (run.stdout + run.stderr).strip()[-500:]


def _unreachable(why: str):
    if REQUIRE_INDEX:
        pytest.fail(f"{why} ({REQUIRE_INDEX_ENV}=1: the package index must be reachable here)")
    pytest.skip(why)


def oldest_runtime() -> Path:
    """The Python with the oldest torch (built once, then reused); its interpreter's path."""
    from filelock import FileLock

    requirements, constraints = runtime_requirements()
    spec = "\n".join(requirements) + "\n--- constraints\n" + constraints
    key = (f"torch-{OLDEST['torch']}-torchvision-{OLDEST['torchvision']}-py{sys.version_info[0]}{sys.version_info[1]}"
           f"-{hashlib.sha256(spec.encode()).hexdigest()[:10]}")
    folder = RUNTIMES / key
    done = folder / "installed.txt"  # written last: a build cut short is built again
    RUNTIMES.mkdir(parents=True, exist_ok=True)
    with FileLock(str(RUNTIMES / f".{key}.lock")):
        if done.is_file() and done.read_text() == spec:
            return folder / "bin" / "python"
        offered, said = index_offers("torch", OLDEST["torch"])
        if not offered:
            _unreachable(f"the package index does not offer torch=={OLDEST['torch']} (not reachable?): {said}")
        for old in RUNTIMES.glob(f"torch-{OLDEST['torch']}-*"):  # an older build of the same versions
            shutil.rmtree(old, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        (folder / "constraints.txt").write_text(constraints)
        start = time.perf_counter()
        installer = install_command(folder / "bin" / "python")
        run = subprocess.run([*installer, "-c", folder / "constraints.txt", *requirements], capture_output=True, text=True,
                             timeout=1800)
        assert run.returncode == 0, f"installing {requirements} with {installer[0]} failed:\n{run.stderr[-3000:]}"
        (folder / "install-seconds.txt").write_text(f"{time.perf_counter() - start:.0f} ({Path(installer[0]).name})\n")
        done.write_text(spec)
    return folder / "bin" / "python"


def install_command(python: Path) -> list[str]:
    """How the runtime's packages are installed into ``python``'s venv: uv (the ``test`` extra) where it is
    installed, else pip. Only the runtime around the edition: the edition itself is installed by pip, as its
    setup cell does on Colab. The runtime is the 3.3 GB CUDA build of torch with its nvidia-* libraries;
    pip unpacks it on one core (on 2 cores: 99 s and 97 CPU-seconds; uv: 37 s and 65 CPU-seconds, both with
    empty caches, both compiling the bytecode, as pip does by default). uv reads none of pip's settings: the
    package index, extra indexes and local wheel folders that pip's environment variables name are passed on."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    command = [find_uv_bin(), "pip", "install", "-q", "--compile-bytecode", "--python", str(python)]
    for variable, flag in (("PIP_INDEX_URL", "--default-index"), ("PIP_EXTRA_INDEX_URL", "--index"),
                           ("PIP_FIND_LINKS", "--find-links")):
        for value in os.environ.get(variable, "").split():
            command += [flag, value]
    return command


def answered(released: Path, source: Path):
    """The released notebook ``released`` with the answer cells of ``source`` (its solutions) pasted in
    by nbgrader grade id, as a student who answered every exercise would hand it in."""
    nb = read(released)
    answers = {nbgrader_meta(c)["grade_id"]: c.source for c in read(source).cells if nbgrader_meta(c).get("solution")}
    cells = [c for c in nb.cells if nbgrader_meta(c).get("solution")]
    assert {nbgrader_meta(c)["grade_id"] for c in cells} == set(answers), f"{released.name}: answer cells differ"
    for cell in cells:
        cell.source = answers[nbgrader_meta(cell)["grade_id"]]
    return nb


def kernel_env(python: Path) -> dict[str, str]:
    """The environment of a kernel in ``python``'s venv, as if it were activated, at smoke size: nothing
    of this repository's venv or source on any path (`torchrun` and `python` resolve to the venv's)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "JUPYTER_CONFIG_PATH", "JUPYTER_PATH")}
    here = {str(Path(sys.prefix) / "bin"), str(ROOT / ".venv" / "bin")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p not in here]
    env.update({"PATH": os.pathsep.join([str(python.parent), *path]), "VIRTUAL_ENV": str(python.parent.parent),
                "GPUCOURSE_SMOKE": "1", "GPUCOURSE_OFFLINE": "1", "PYTHONNOUSERSITE": "1"})
    if PARALLEL >= (os.cpu_count() or 1):  # one torch thread per kernel when the kernels fill the cores (conftest.py)
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


async def _execute(nb, python: Path, env: dict[str, str], cwd: Path) -> float:
    """Run ``nb`` in place in a kernel of ``python`` (errors are left in its outputs); the seconds it took."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient
    from traitlets import default
    from traitlets.config import Config

    # A kernelspec of its own, so that nbclient starts ``python`` and not this process's interpreter.
    folder = Path(tempfile.mkdtemp(prefix="gpucourse-k-"))  # short: Unix socket paths stay under 107 bytes
    spec = folder / "kernels" / "oldest-torch"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [str(python), "-m", "ipykernel_launcher", "-f",
                                                           "{connection_file}"], "display_name": "oldest torch",
                                                  "language": "python"}))

    class Manager(AsyncKernelManager):  # nbclient makes it, and so shuts its kernel down when done
        @default("kernel_spec_manager")
        def _only_this_kernelspec(self):
            return KernelSpecManager(kernel_dirs=[str(folder / "kernels")])

    # Unix sockets, not TCP ports (conftest.execute_notebook says why).
    config = Config({"KernelManager": {"transport": "ipc", "ip": str(folder / "kernel")}})
    start = time.perf_counter()
    try:
        await NotebookClient(nb, kernel_manager_class=Manager, kernel_name="oldest-torch", config=config,
                             timeout=CELL_TIMEOUT, allow_errors=True,
                             resources={"metadata": {"path": str(cwd)}}).async_execute(env=env)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return time.perf_counter() - start


def failures(nb) -> list[str]:
    """Every error in the executed ``nb``, and every traceback a cell printed: one line each. A failed
    check() brings its ✗ lines, which say why (the executed notebooks are not kept)."""
    found = []
    for index, cell in enumerate(nb.cells):
        head = (cell.source.splitlines() or [""])[0][:60]
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.output_type == "error":
                found.append(f"cell {index} ({head!r}): {output.ename}: {(output.evalue or '').splitlines()[:1]}")
                if output.ename == "CheckFailed":
                    printed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
                    found.extend(f"    {line[:1500]}" for line in _crossed(printed))
            elif output.output_type == "stream" and "Traceback (most recent call last)" in output.text:
                found.append(f"cell {index} ({head!r}): a traceback printed on {output.name}: {output.text[-300:]!r}")
    return found


def _crossed(printed: str) -> list[str]:
    """check()'s ✗ lines in ``printed``, each with the lines under it up to the next ✓/✗ line (a reason
    may span several: a launch's tail)."""
    lines, keep = [], False
    for line in printed.splitlines():
        if line.startswith(("✓", "✗")):
            keep = line.startswith("✗")
        if keep:
            lines.append(line)
    return lines


def probe(nb) -> dict:
    text = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []) if o.output_type == "stream")
    assert PROBE in text, f"the probe cell printed nothing: {nb.cells[-1].get('outputs')}"
    return json.loads(text.split(PROBE, 1)[1])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from autograders.course import load_edition
    from autograders.publish import publish

    edition = load_edition()
    return publish(tmp_path_factory.mktemp("edition") / "student-edition", edition), edition


@pytest.mark.edition  # about 3 minutes (a first run installs the 3.3 GB runtime too): `make test-edition`
def test_every_released_notebook_runs_answered_on_the_oldest_torch_from_the_installed_edition(built, tmp_path):
    from packaging.version import Version

    edition_dir, edition = built
    started = time.perf_counter()
    python = oldest_runtime()
    runtime_ready = time.perf_counter() - started
    env = kernel_env(python)
    url = f"git+file://{edition_dir}@{edition.ref}"

    # The released setup cell itself installs the edition, as on Colab: gpucourse absent, torch present.
    subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "gpucourse"], env=env, check=True, capture_output=True)
    setup = read(edition_dir / "course" / "lesson01_processes_threads" / "processes_threads.ipynb").cells[1].source
    start = time.perf_counter()
    run = subprocess.run([python, "-c", setup], cwd=tmp_path, env={**env, "GPUCOURSE_INSTALL_URL": url},
                         capture_output=True, text=True, timeout=600)
    installed_in = time.perf_counter() - start
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"Installing the course helpers from {url}" in run.stdout
    assert f"torch {OLDEST['torch']}" in run.stdout, "the setup cell does not say the torch it keeps is older"

    paths = notebooks(edition_dir / "course")
    assert len(paths) == len(notebooks(SOLUTIONS)) > 0
    runs = {}
    for path in paths:
        nb = answered(path, SOLUTIONS / path.relative_to(edition_dir / "course"))
        nb.cells.append(nbformat.v4.new_code_cell(PROBE_CELL, id="gpucourse-probe"))  # what the kernel imported
        (tmp_path / path.parent.name).mkdir()
        runs[path.parent.name] = nb

    async def run_all() -> dict[str, float]:
        gate = asyncio.Semaphore(PARALLEL)

        async def one(name):
            async with gate:
                return name, await _execute(runs[name], python, env, tmp_path / name)

        return dict(await asyncio.gather(*(one(name) for name in runs)))

    start = time.perf_counter()
    seconds = asyncio.run(run_all())
    notebooks_in = time.perf_counter() - start
    RUNTIMES.mkdir(parents=True, exist_ok=True)
    TIMES.write_text(json.dumps({"runtime_ready_s": round(runtime_ready, 1), "edition_install_s": round(installed_in, 1),
                                 "notebooks_s": round(notebooks_in, 1), "parallel": PARALLEL,
                                 "per_notebook_s": {k: round(v, 1) for k, v in sorted(seconds.items())},
                                 "load_average": os.getloadavg()}, indent=1))

    failed = {name: found for name, nb in runs.items() if (found := failures(nb))}
    assert not failed, "cells failed on torch " + OLDEST["torch"] + ":\n" + "\n".join(
        f"{name}: {line}" for name, lines in failed.items() for line in lines)
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               env=env, check=True, capture_output=True, text=True).stdout.strip())
    commit = subprocess.run(["git", "rev-list", "-n", "1", edition.ref], cwd=edition_dir, check=True,
                            capture_output=True, text=True).stdout.strip()
    for name, nb in runs.items():
        seen = probe(nb)
        assert Path(seen["gpucourse"]).is_relative_to(site), f"{name}: gpucourse from {seen['gpucourse']}"
        assert not Path(seen["gpucourse"]).is_relative_to(ROOT / "src")
        assert Version(seen["torch"]).public == OLDEST["torch"] and Version(seen["torchvision"]).public == OLDEST["torchvision"]
        assert Path(seen["python"]).parent == python.parent, seen["python"]
        direct = seen["direct_url"]  # PEP 610: what pip installed it from
        assert direct["url"] == f"file://{edition_dir}" and direct["vcs_info"]["commit_id"] == commit, direct
        assert not direct.get("dir_info", {}).get("editable"), "installed editable"


def test_the_oldest_torch_is_below_the_tested_floor_and_its_torchvision_matches():
    """The declared versions are a real pair below the floors (torchvision 0.N+15 goes with torch 2.N)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    floors = {Requirement(r).name: Requirement(r).specifier for r in PYPROJECT["project"]["dependencies"]}
    torch, vision = Version(OLDEST["torch"]), Version(OLDEST["torchvision"])
    assert torch not in floors["torch"] and vision not in floors["torchvision"], "not older than the tested floor"
    assert (torch.major, torch.minor + 15) == (vision.major + 2, vision.minor)
    requirements, constraints = runtime_requirements()
    assert f"torch=={torch}" in requirements and f"torchvision=={vision}" in requirements
    assert not re.search(r"^(torch|torchvision)\b", constraints, re.M), "constraints.txt's pins would clash"
    assert "ipykernel" in requirements and any(r.startswith("darts") for r in requirements)


def test_pasted_answers_fill_every_answer_cell_and_any_error_output_is_a_failure():
    """The two judgments the long test rests on, checked on lesson 1 without running it."""
    course = ROOT / "course" / "lesson01_processes_threads" / "processes_threads.ipynb"
    nb = answered(course, SOLUTIONS / "lesson01_processes_threads" / "processes_threads.ipynb")
    filled = [c for c in nb.cells if nbgrader_meta(c).get("solution") and c.cell_type == "code"]
    assert filled and not [c for c in filled if "NotImplementedError" in c.source or "YOUR CODE HERE" in c.source]
    assert failures(nb) == []
    filled[0].outputs = [nbformat.v4.new_output("error", ename="AttributeError", evalue="no such API", traceback=[])]
    assert failures(nb) == [f"cell {nb.cells.index(filled[0])} ({filled[0].source.splitlines()[0][:60]!r}): "
                            "AttributeError: ['no such API']"]
    filled[0].outputs = [nbformat.v4.new_output("stream", name="stderr", text="Traceback (most recent call last):\n  x")]
    assert "a traceback printed on stderr" in failures(nb)[0]
    filled[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="✓ first case\n✗ second case: the script "
                                                "did not finish (exit 1):\nrank 0: boom\n✓ third case\n"),
                         nbformat.v4.new_output("error", ename="CheckFailed", evalue="x: 1 of 3 public checks failed",
                                                traceback=[])]
    assert failures(nb)[1:] == ["    ✗ second case: the script did not finish (exit 1):", "    rank 0: boom"]
    with pytest.raises(AssertionError, match="answer cells differ"):
        answered(course, SOLUTIONS / "lesson02_cpu_gpu_cuda" / "cpu_gpu_cuda.ipynb")


def test_an_unreachable_index_skips_the_test_and_fails_it_where_required(monkeypatch, tmp_path):
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "RUNTIMES", tmp_path)
    monkeypatch.setattr(here, "index_offers", lambda name, version: (False, "pip: no route to host"))
    monkeypatch.setattr(here, "REQUIRE_INDEX", False)
    with pytest.raises(pytest.skip.Exception, match=r"does not offer torch==.*no route to host"):
        oldest_runtime()
    monkeypatch.setattr(here, "REQUIRE_INDEX", True)
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_INDEX_ENV}=1"):
        oldest_runtime()
    assert not list(tmp_path.glob("torch-*")), "nothing built without the index"


def test_the_runtime_is_installed_by_uv_with_pips_index_settings_and_by_pip_without_uv(monkeypatch):
    python = Path("/venv/bin/python")
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://a.example/simple https://b.example/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    command = install_command(python)
    assert Path(command[0]).name == "uv" and Path(command[0]).is_file(), command
    assert command[1:6] == ["pip", "install", "-q", "--compile-bytecode", "--python"] and command[6] == str(python)
    pairs = list(zip(command[7::2], command[8::2]))
    assert pairs == [("--default-index", "https://mirror.example/simple"), ("--index", "https://a.example/simple"),
                     ("--index", "https://b.example/simple"), ("--find-links", "/opt/wheels")], command
    monkeypatch.setitem(sys.modules, "uv", None)  # as where the test extra is not installed: import uv fails
    assert install_command(python) == [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]


if __name__ == "__main__":
    # `make test` runs this in the background, at the lowest CPU priority, while the suite runs: uv unpacks the
    # 3.3 GB runtime (install_command), on the cycles the suite leaves. The edition test then finds the runtime built;
    # if this run failed (no index), the test meets the same failure and reports it as a test.
    print(oldest_runtime())

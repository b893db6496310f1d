"""The install: conda's environment.yml and pip's files name the same packages and ranges."""

from __future__ import annotations

import tomllib
from pathlib import Path
from importlib.metadata import version

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ROOT


def _requirements(lines) -> dict[str, Requirement]:
    found = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            found[canonicalize_name(req.name)] = req
    return found


def pip_packages() -> dict[str, Requirement]:
    """What `make install` asks pip for: pyproject's dependencies and extras, as constrained."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _requirements(project["dependencies"])
    for extra in ("lab", "test", "darts", "site"):
        wanted.update(_requirements(project["optional-dependencies"][extra]))
    constraints = _requirements((ROOT / "constraints.txt").read_text().splitlines())
    missing = sorted(set(wanted) - set(constraints))
    assert not missing, f"constraints.txt pins no tested range for {missing}"
    unused = sorted(set(constraints) - set(wanted))
    assert not unused, f"constraints.txt names packages nothing requires: {unused}"
    return constraints


def conda_packages() -> tuple[dict[str, Requirement], list[str]]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_lists = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_lists) == 1, "environment.yml needs exactly one pip: section"
    plain = [d for d in env["dependencies"] if isinstance(d, str)]
    return _requirements(pip_lists[0]), plain


def test_environment_yml_lists_what_pip_installs():
    pip, (conda, _) = pip_packages(), conda_packages()
    assert sorted(conda) == sorted(pip), "environment.yml and pyproject/constraints name different packages"
    for name, req in pip.items():
        assert conda[name].specifier == req.specifier, f"{name}: environment.yml {conda[name].specifier} vs pip {req.specifier}"


def test_environment_yml_python_matches_pyproject():
    _, plain = conda_packages()
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert f"python{requires}" in plain


# Pinned to exactly their floor: what CI installs is what pyproject promises works.
PINNED_AT_FLOOR = ("torch", "torchvision", "pytorch-lightning", "darts")


def runtime_floors() -> dict[str, Requirement]:
    """pyproject's runtime dependencies and the darts extra: what a student's install asks for."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return _requirements(project["dependencies"] + project["optional-dependencies"]["darts"])


def _only(req: Requirement, operator: str) -> str:
    found = [s.version for s in req.specifier if s.operator == operator]
    assert len(found) == 1 and len(req.specifier) == 1, f"{req} must be exactly one {operator} version"
    return found[0]


def test_key_packages_are_pinned_to_their_floors():
    floors, pins = runtime_floors(), pip_packages()
    for name in PINNED_AT_FLOOR:
        assert _only(pins[name], "==") == _only(floors[name], ">="), \
            f"{name}: constraints.txt pins {pins[name]} but pyproject's floor is {floors[name]}"


def test_pyproject_floors_are_the_tested_lower_bounds():
    pins = pip_packages()
    for name, floor in runtime_floors().items():
        tested = pins[name]
        lowest = next(s.version for s in tested.specifier if s.operator in (">=", "=="))
        assert _only(floor, ">=") == lowest, f"{floor} is not the tested lower bound of {tested}"


def test_darts_is_an_extra_that_make_install_installs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "darts" not in _requirements(project["dependencies"]), "only lesson 9 needs Darts: keep it in the extra"
    extras = (ROOT / "Makefile").read_text().split('-e ".[', 1)[1].split("]", 1)[0].split(",")
    assert "darts" in extras, "make install must install the darts extra"


def test_installed_versions_are_the_tested_ones():
    for name, req in pip_packages().items():
        installed = version(name)
        assert req.specifier.contains(installed, prereleases=True), f"{name} {installed} is outside {req.specifier}"


def test_torch_and_torchvision_work_together():
    import torch
    import torchvision

    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    keep = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
    assert keep.tolist() == [0, 2]


def test_lightning_is_not_a_pulled_release():
    import pytorch_lightning

    assert pytorch_lightning.__version__ not in {"2.6.2", "2.6.3"}


def test_xdist_groups_keep_a_group_on_one_worker(tmp_path):
    """`make test` relies on pytest-xdist's --dist loadgroup: the tests sharing a module-scoped fixture (the
    whole class graded once, the adversarial batch) and one notebook's tests run on one worker. Some pairs
    of pytest and pytest-xdist silently stop grouping (pytest-dev/pytest-xdist#1386): this runs six grouped
    tests on two workers, as installed, and asserts that one worker ran them all."""
    import subprocess
    import sys

    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n"
        "@pytest.mark.xdist_group('one')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_grouped(i):\n"
        "    with open(os.path.join(os.path.dirname(__file__), 'workers.txt'), 'a') as out:\n"
        "        out.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                          "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    workers = (tmp_path / "workers.txt").read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, f"one group ran on {sorted(set(workers))}"


def test_notebook_kernels_use_unix_sockets_not_tcp_ports(tmp_path):
    """The suite's kernels (conftest.execute_notebook) take no TCP port that another process could
    take first; a kernel that was started over TCP, or in another folder, fails this."""
    import nbformat

    from conftest import execute_notebook

    cell = nbformat.v4.new_code_cell("import os\nfrom ipykernel import get_connection_info\n"
                                     "info = get_connection_info(unpack=True)\nprint(info['transport'], os.getcwd())")
    nb = nbformat.v4.new_notebook(cells=[cell])
    execute_notebook(nb, tmp_path, timeout=120)
    transport, cwd = cell.outputs[0]["text"].split()
    assert transport == "ipc" and cwd == str(tmp_path), cell.outputs


def test_every_module_holding_the_local_cluster_runs_in_lesson_10s_group():
    """The local Slurm cluster is one per machine (conftest.local_cluster's lock): every test module that holds
    it runs in lesson 10's xdist group (conftest.MODULE_GROUPS), so no worker waits, idle, for another's lock."""
    from conftest import MODULE_GROUPS

    holders = {path.stem for path in (ROOT / "tests").glob("test_*.py")
               if path.name != Path(__file__).name and "with local_cluster(" in path.read_text()}
    assert holders, "no module holds the cluster: this test looks in the wrong place"
    assert {name: MODULE_GROUPS.get(name) for name in holders} == dict.fromkeys(holders, "lesson10_beyond_one_machine")

"""The install: conda's environment.yml and pip's files name the same packages and ranges."""

from __future__ import annotations

import tomllib
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
    for extra in ("lab", "test"):
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


def test_pyproject_floors_admit_the_tested_ranges():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        floor = Requirement(line)
        tested = pip_packages()[canonicalize_name(floor.name)]
        lowest = next(s.version for s in tested.specifier if s.operator == ">=")
        assert floor.specifier.contains(lowest), f"{floor} excludes the tested {tested}"


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

"""A GPU reference file with made-up numbers, for the tests that run the lessons' reading cells against
what ``gpucourse.bench_gpu`` writes: every declared measurement and label, the fixture status
(``gpucourse.reference.FIXTURE_STATUS``: never a reference, and loaded only from a path)."""

from __future__ import annotations

import platform

import torch

from gpucourse import reference
from gpucourse.bench_gpu import RECIPES, WHAT, header

DEVICE = {"kind": "cuda", "name": "Fixture GPU (made-up numbers)", "short": "FIXTURE", "capability": "0.0"}


def made_up() -> dict:
    """The reference's data (``bench_gpu.write`` validates and writes it), each value made up but distinct."""
    measurements = {}
    for i, (name, declared) in enumerate(reference.MEASUREMENTS.items()):
        measurements[name] = {"what": WHAT[name], "unit": declared.unit, "method": "made up by tests/reference_fixture.py",
                              "source": "tests/reference_fixture.py (test suite)", "recipe": RECIPES[name],
                              "values": {label: round(1.0 + 0.37 * ((i + j) % 11), 2) for j, label in enumerate(declared.labels)}}
    software = {"python": platform.python_version(), "torch": torch.__version__}
    data = header(dict(DEVICE), software, reference.FIXTURE_STATUS)
    data["measurements"] = measurements
    return data

"""The course's GPU reference: figures measured on a real GPU, shipped beside the learner's own.

Used by every lesson that measures a GPU (2, 3, 4, 5, 11 and later): when this machine has no CUDA
device, a measurement cell plots what *this* machine measured next to the reference, labelled with
both machines, so a CPU-only learner still sees what a GPU does, and never mistakes one for the other.

Each reference is one JSON file in this folder, ``<short name>.json`` (``h100.json``), written by
``make bench-gpu`` on a GPU machine (or assembled from a recorded GPU run) and kept to one schema
(:func:`validate`; ``tests/test_reference.py`` checks every file). Every file says which machine,
which versions, which date and which commit measured it, and ``status: "measured, not estimated"``:
no number in it was computed or guessed.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

SCHEMA = "gpucourse-reference/1"
FOLDER = Path(__file__).parent
STATUS = "measured, not estimated"
DEVICE_KEYS = ("kind", "name", "short")
SOFTWARE_KEYS = ("python", "torch")
MEASUREMENT_KEYS = ("what", "unit", "method", "source", "values")


def validate(data: Any) -> list[str]:
    """What is wrong with a reference's data (an empty list when nothing is)."""
    if not isinstance(data, dict):
        return ["a reference is a JSON object"]
    problems = []
    if data.get("schema") != SCHEMA:
        problems.append(f"schema must be {SCHEMA!r}, not {data.get('schema')!r}")
    if data.get("status") != STATUS:
        problems.append(f"status must be {STATUS!r}: only measured numbers belong in a reference")
    for key in ("date", "commit"):
        if not isinstance(data.get(key), str) or not data.get(key):
            problems.append(f"{key!r} must say when and at which commit it was measured")
    for section, keys in (("device", DEVICE_KEYS), ("software", SOFTWARE_KEYS)):
        block = data.get(section)
        if not isinstance(block, dict):
            problems.append(f"{section!r} must be an object")
            continue
        problems += [f"{section}.{k} is missing" for k in keys if not block.get(k)]
    measurements = data.get("measurements")
    if not isinstance(measurements, dict) or not measurements:
        return problems + ["'measurements' must name at least one measurement"]
    for name, m in measurements.items():
        if not isinstance(m, dict):
            problems.append(f"measurement {name!r} must be an object")
            continue
        problems += [f"measurement {name!r} has no {k!r}" for k in MEASUREMENT_KEYS if not m.get(k)]
        values = m.get("values")
        if isinstance(values, dict):
            for label, value in values.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
                    problems.append(f"{name}[{label!r}] must be a non-negative number, not {value!r}")
        elif values is not None:
            problems.append(f"measurement {name!r}: values must map labels to numbers")
    return problems


@dataclass(frozen=True)
class Reference:
    """One reference file, read: ``ref.values("matmul_tflops")["float16 8192"]``."""

    data: Mapping[str, Any]
    path: Path

    @property
    def device(self) -> str:
        return self.data["device"]["name"]

    @property
    def short(self) -> str:
        return self.data["device"]["short"]

    def label(self) -> str:
        """What a chart's legend says: the GPU, the torch version and the date, and that it was measured."""
        return f"{self.device} (torch {self.data['software']['torch']}, measured {self.data['date']})"

    def measurement(self, name: str) -> Mapping[str, Any]:
        try:
            return self.data["measurements"][name]
        except KeyError:
            known = ", ".join(sorted(self.data["measurements"]))
            raise KeyError(f"the {self.short} reference has no measurement {name!r}; it has: {known}") from None

    def values(self, name: str) -> dict[str, float]:
        return dict(self.measurement(name)["values"])

    def value(self, name: str, label: str) -> float:
        values = self.values(name)
        if label not in values:
            raise KeyError(f"{self.short} reference {name!r} has no {label!r}; it has: {', '.join(values)}")
        return values[label]

    def unit(self, name: str) -> str:
        return self.measurement(name)["unit"]


def names() -> list[str]:
    """The references shipped with the package, by short name (``["h100"]``)."""
    return sorted(p.stem for p in FOLDER.glob("*.json"))


def load(name: str | None = None) -> Reference:
    """Read and validate a shipped reference (the only one, or ``name``), or a path to a JSON file."""
    if name is not None and (os.sep in name or name.endswith(".json")):
        path = Path(name)
    else:
        available = names()
        if not available:
            raise FileNotFoundError(f"no GPU reference is shipped in {FOLDER}")
        path = FOLDER / f"{name or available[0]}.json"
        if not path.exists():
            raise FileNotFoundError(f"no GPU reference {name!r}; shipped: {', '.join(available)}")
    data = json.loads(path.read_text())
    problems = validate(data)
    if problems:
        raise ValueError(f"{path} is not a valid reference: " + "; ".join(problems))
    return Reference(data, path)


def this_machine(device: Any = None) -> str:
    """A short name for the hardware a measurement ran on: the GPU's name, or the CPU and its cores."""
    kind = getattr(device, "type", str(device) if device is not None else "cpu")
    if kind == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs"


def plot_beside(mine: Mapping[str, float], reference: Mapping[str, float], *, title: str, unit: str,
                mine_label: str, reference_label: str, note: str | None = None, log: bool = False, ax=None):
    """Two bars per label: what this machine measured and what the reference GPU measured.

    ``mine`` and ``reference`` map the same labels (e.g. "float32", "AMP bf16") to numbers in
    ``unit``; a label missing on one side gets no bar there (it was not measured, not zero).
    ``note`` is one sentence under the title on what the difference means. Returns the Figure.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    labels = list(dict.fromkeys([*mine, *reference]))
    if not labels:
        raise ValueError("nothing to plot: both measurements are empty")
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(labels) + 2), 3.8), layout="constrained")
    else:
        fig = ax.figure
    x = np.arange(len(labels))
    width = 0.38
    for offset, data, name, colour in ((-width / 2, mine, mine_label, "tab:blue"),
                                       (width / 2, reference, reference_label, "tab:orange")):
        xs = [x[i] + offset for i, label in enumerate(labels) if label in data]
        ys = [data[label] for label in labels if label in data]
        bars = ax.bar(xs, ys, width, label=name, color=colour)
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=1)
    ax.set_xticks(x, labels, rotation=20 if max(map(len, labels)) > 10 else 0, ha="right" if max(map(len, labels)) > 10 else "center")
    ax.set_ylabel(unit)
    ax.set_xlabel("measurement")
    if log:
        ax.set_yscale("log")
    ax.set_title(title if note is None else f"{title}\n{note}", fontsize=10)
    ax.legend(fontsize=8, title="hardware", title_fontsize=8)
    return fig

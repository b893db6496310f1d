"""The course's GPU reference: figures measured on a real GPU, shipped beside the learner's own.

Used by every lesson that measures a GPU (1-5, 11, 12 and 15): when this machine has no CUDA device,
a measurement cell plots what *this* machine measured next to the reference, labelled with both
machines, so a CPU-only learner still sees what a GPU does, and never mistakes one for the other.

Each reference is one JSON file in this folder, ``<short name>.json`` (``h100.json``), written by
``make bench-gpu`` (``gpucourse.bench_gpu``) on a GPU machine, or assembled from a recorded GPU run.
:data:`MEASUREMENTS` is the one list of what a reference may hold: every measurement ``bench-gpu``
writes and every one a lesson reads, with its unit and its labels. :func:`validate` holds every
file to it (``tests/test_reference.py`` checks the shipped ones): which machine, which versions,
which date and commit, ``status: "measured, not estimated"``, and for each measurement its full
recipe (:data:`RECIPE_KEYS`: TF32 for matmuls and for cuDNN, memory layout, when the peak was reset).
A measurement or label a file lacks was not measured on that GPU: :meth:`Reference.values` gives what
there is, :meth:`Reference.missing` the sentence a chart shows instead ("not measured on the T4: ...").

:func:`load` picks the file for the GPU it runs on (by the device block's name, then its short name,
then its compute capability), or the one named (argument, or ``GPUCOURSE_REFERENCE``: a short name
or a path), else :data:`DEFAULT`.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from gpucourse import environment

SCHEMA = "gpucourse-reference/2"
FOLDER = Path(__file__).parent
STATUS = "measured, not estimated"
# A file made by the test suite (tests/reference_fixture.py, or bench_gpu --tiny): never a reference, never shipped.
FIXTURE_STATUS = "test fixture: not measured on a GPU, never a reference"
DEFAULT = "h100"
ENV = environment.REFERENCE
# Test suite only: reading what a file lacks raises instead of being said (the lessons run against a
# fixture of every declared label this way, so that a key they read and bench-gpu does not write fails).
STRICT_ENV = environment.REFERENCE_STRICT
DEVICE_KEYS = ("kind", "name", "short")
SOFTWARE_KEYS = ("python", "torch")
ENTRY_KEYS = ("what", "unit", "method", "source", "recipe", "values")
# Every entry says how it was run: the same label under two recipes is two quantities.
RECIPE_KEYS = ("matmul_tf32", "cudnn_tf32", "memory_format", "peak_reset")
EMULATED = " emulated"  # label suffix: bfloat16 run on a GPU without bfloat16 Tensor Cores (before sm 80)


@dataclass(frozen=True)
class Declared:
    """One measurement a reference may hold: its unit, its labels (a full ``bench-gpu`` run writes all
    of them on a GPU of compute capability 8.0 or later), the lessons that read it, and recipe keys
    beyond :data:`RECIPE_KEYS` that its entries must name."""

    unit: str
    labels: tuple[str, ...]
    lessons: tuple[int, ...] = ()
    recipe: tuple[str, ...] = ()
    pattern: str | None = None  # labels that depend on the machine (lesson 1's worker counts)

    def knows(self, label: str) -> bool:
        base = label[: -len(EMULATED)] if label.endswith(EMULATED) else label
        if base != label and "bfloat16" not in base and "bf16" not in base:
            return False
        return base in self.labels or bool(self.pattern and re.fullmatch(self.pattern, base))


def _labels(*parts: Iterable[str]) -> tuple[str, ...]:
    return tuple(" ".join(p for p in combo if p) for combo in itertools.product(*parts))


MATMUL_SIZES = (8192, 8191, 8200)
RESNET_SIZES = ((128, 32), (512, 32), (128, 224))  # (batch, pixels): launch-bound twice, then compute-bound
RESNET_RECIPES = _labels(("fp32", "tf32", "amp fp16", "amp bf16"), ("", "channels_last"))
GRAPH_RECIPES = ("fp32 cudnn-tf32", "amp bf16 channels_last")  # float32 weights: cuDNN TF32 convolutions
RESNET_LABELS = _labels([f"b{b} {px}px" for b, px in RESNET_SIZES], RESNET_RECIPES)
LESSON01_WORKERS = (1, 2, 4, 8, 16, 32)

MEASUREMENTS: dict[str, Declared] = {
    "matmul_tflops": Declared("TFLOP/s", _labels(("float32", "tf32", "float16", "bfloat16"), map(str, MATMUL_SIZES)),
                              (2, 3, 15)),
    "h2d_gbps": Declared("GB/s", ("pageable", "pinned", "pinned 1GiB"), (5,), ("host_buffer",)),
    "resnet18_step_ms": Declared("ms", RESNET_LABELS, (4, 15)),
    "resnet18_peak_mib": Declared("MiB", RESNET_LABELS, (12,)),
    "resnet18_cuda_graph_ms": Declared("ms", _labels(("b128 32px", "b512 32px"), GRAPH_RECIPES, ("eager", "cuda graph")),
                                       (4, 11, 15)),
    "copy_compute_overlap_ms": Declared("ms", ("copy only", "matmul only", "serial, one stream", "copy on a side stream"),
                                        (), ("host_buffer",)),
    "sync_loop_ms": Declared("ms", ("b128 32px fp32 item every step", "b128 32px fp32 no sync")),
    "resnet18_bench_peak_mib": Declared("MiB", ("b128 32px fp32", "b128 32px autocast fp16"), (12,)),
    "lesson01_count_primes_speedup": Declared("x over serial", _labels(("threads", "processes"),
                                                                       [f"x{n}" for n in LESSON01_WORKERS]),
                                              (1,), pattern=r"(threads|processes) x\d+"),
    "lesson02_matmul_tflops": Declared("TFLOP/s", ("CPU float32 128", "CPU float32 256", "GPU float32 128",
                                                   "GPU float32 256", "GPU float32 4096"), (2, 15)),
    "lesson02_timing_ms": Declared("ms", ("naive", "your measure", "CUDA events", "torch.utils.benchmark"), (2,)),
    "lesson02_streams_ms": Declared("ms", ("one stream", "copy stream + events"), (2,), ("host_buffer",)),
    "lesson02_scaled_add_ms": Declared("ms", ("Triton scaled_add (fused)", "torch 2.0 * x + y"), (2, 15)),
    "lesson04_saved_mib": Declared("MiB", ("b8 32px float32 activations", "b8 32px autocast float16 activations",
                                           "b8 32px autocast float16 weight copies"), (4,)),
    "lesson03_alignment_tflops": Declared("TFLOP/s", tuple(f"float16 {4096 + o}" for o in (0, 1, 4, 7, 8)), (3,)),
    "lesson05_side_stream_ms": Declared("ms", ("pageable", "pinned"), (5,), ("host_buffer",)),
    "lesson05_conv_ms": Declared("ms", ("float16 NCHW", "float16 channels_last"), (5,)),
    "lesson11_gpu_profile_us": Declared("µs", ("self CPU time, 3 steps", "self CUDA time, 3 steps"), (11, 15)),
}


def _problems_of_entry(name: str, m: Any, declared: Declared | None, check_labels: bool) -> list[str]:
    if not isinstance(m, dict):
        return [f"measurement {name!r} must be an object"]
    problems = [f"measurement {name!r} has no {k!r}" for k in ENTRY_KEYS if not m.get(k)]
    if declared is not None and m.get("unit") and m["unit"] != declared.unit:
        problems.append(f"measurement {name!r} is in {declared.unit!r}, not {m['unit']!r}")
    recipe = m.get("recipe")
    if isinstance(recipe, dict):
        for key in RECIPE_KEYS + (declared.recipe if declared else ()):
            if not isinstance(recipe.get(key), str) or not recipe[key].strip():
                problems.append(f"measurement {name!r}: recipe.{key} must say how it was run")
    elif recipe is not None:
        problems.append(f"measurement {name!r}: recipe must be an object")
    values = m.get("values")
    if isinstance(values, dict):
        for label, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
                problems.append(f"{name}[{label!r}] must be a non-negative number, not {value!r}")
            if check_labels and declared is not None and not declared.knows(label):
                problems.append(f"{name}[{label!r}] is not a label of {name!r} (gpucourse.reference.MEASUREMENTS)")
    elif values is not None:
        problems.append(f"measurement {name!r}: values must map labels to numbers")
    return problems


def validate(data: Any, fixture: bool = False) -> list[str]:
    """What is wrong with a reference's data (an empty list when nothing is).

    A reference holds only :data:`MEASUREMENTS`, in their units and labels, each with its recipe.
    ``fixture=True`` accepts the test suite's files (status :data:`FIXTURE_STATUS`, and --tiny's labels
    at tiny sizes); a shipped file must say :data:`STATUS`.
    """
    if not isinstance(data, dict):
        return ["a reference is a JSON object"]
    problems = []
    if data.get("schema") != SCHEMA:
        problems.append(f"schema must be {SCHEMA!r}, not {data.get('schema')!r}")
    statuses = (STATUS, FIXTURE_STATUS) if fixture else (STATUS,)
    if data.get("status") not in statuses:
        problems.append(f"status must be {STATUS!r}: only measured numbers belong in a reference")
    tiny = fixture and "test mode" in str(data.get("note", ""))
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
        declared = MEASUREMENTS.get(name)
        if declared is None:
            problems.append(f"{name!r} is not a measurement of the schema: declare it in "
                            "gpucourse.reference.MEASUREMENTS (and measure it in bench_gpu) or move it to 'archive'")
        problems += _problems_of_entry(name, m, declared, check_labels=not tiny)
    absent = data.get("absent", {})
    if not isinstance(absent, dict) or not all(isinstance(v, dict) for v in absent.values()):
        problems.append("'absent' must map measurements to {label: why it was not measured}")
    else:
        for name, labels in absent.items():
            problems += [f"absent {name}[{label!r}] needs the reason it was not measured"
                         for label, why in labels.items() if not isinstance(why, str) or not why]
    archive = data.get("archive", {})
    if not isinstance(archive, dict):
        problems.append("'archive' must be an object")
    else:
        for name, m in archive.items():
            problems += [f"archive {name!r} has no {k!r}" for k in ("what", "unit", "source", "values")
                         if not isinstance(m, dict) or not m.get(k)]
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

    @property
    def fixture(self) -> bool:
        return self.data.get("status") == FIXTURE_STATUS

    def label(self) -> str:
        """What a chart's legend says: the GPU, the torch version and the date, and that it was measured."""
        if self.fixture:
            return f"TEST FIXTURE, not measured ({self.device})"
        return f"{self.device} (torch {self.data['software']['torch']}, measured {self.data['date']})"

    def measurement(self, name: str) -> Mapping[str, Any]:
        if name not in MEASUREMENTS:
            raise KeyError(f"{name!r} is not a reference measurement; the schema has: {', '.join(MEASUREMENTS)}")
        try:
            return self.data["measurements"][name]
        except KeyError:
            raise KeyError(self.missing(name)) from None

    def has(self, name: str, *labels: str) -> bool:
        """Whether this GPU's file holds ``name`` (and each of ``labels``)."""
        found = self.values(name)
        return bool(found) and all(label in found for label in labels)

    def values(self, name: str) -> dict[str, float]:
        """The measurement's values by label; empty when this GPU's file does not hold it (:meth:`missing`
        says so). A name outside :data:`MEASUREMENTS` raises KeyError: a typo is not a missing measurement."""
        if name not in MEASUREMENTS:
            raise KeyError(f"{name!r} is not a reference measurement; the schema has: {', '.join(MEASUREMENTS)}")
        if name not in self.data["measurements"] and environment.reference_strict():
            raise KeyError(f"{STRICT_ENV}=1: the {self.short} reference has no {name!r}")
        return dict(self.data["measurements"].get(name, {}).get("values", {}))

    def value(self, name: str, label: str) -> float:
        values = self.values(name)
        if label not in values:
            raise KeyError(self.missing(name, [label]))
        return values[label]

    def missing(self, name: str, labels: Iterable[str] | None = None) -> str:
        """The sentence a cell shows for what this file lacks (``""`` when nothing is missing)."""
        values = self.values(name)
        lacking = [label for label in (labels or ()) if label not in values]
        if values and not lacking:
            return ""
        why = self.data.get("absent", {}).get(name, {})
        reasons = sorted({why[label] for label in (lacking or why) if label in why})
        what = f"{name} ({', '.join(lacking)})" if values else name
        if environment.reference_strict():
            raise KeyError(f"{STRICT_ENV}=1: the {self.short} reference lacks {what}")
        return f"not measured on the {self.short}: {what}" + (f" ({'; '.join(reasons)})" if reasons else "")

    def note(self, sentence: Callable[[dict[str, float]], str], name: str, *labels: str) -> str:
        """``sentence(values)`` (a chart's note quoting this GPU's numbers) when the file holds every one
        of ``labels`` of ``name``; else the :meth:`missing` sentence, so no note quotes another GPU."""
        return sentence(self.values(name)) if self.has(name, *labels) else self.missing(name, labels)

    def unit(self, name: str) -> str:
        return self.measurement(name)["unit"]

    def recipe(self, name: str) -> dict[str, str]:
        """How ``name`` was run (:data:`RECIPE_KEYS` and the measurement's own)."""
        return dict(self.measurement(name)["recipe"])


def names(folder: Path = FOLDER) -> list[str]:
    """The references shipped with the package, by short name (``["h100"]``)."""
    return sorted(p.stem for p in folder.glob("*.json"))


def _gpu() -> tuple[str, str] | None:
    """This machine's first CUDA device: its name and compute capability ("9.0"), or None."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(0)
        return torch.cuda.get_device_name(0), f"{major}.{minor}"
    except Exception:  # a broken driver is no GPU to match: the default reference still loads
        return None


def pick(folder: Path = FOLDER, gpu: tuple[str, str] | None = None) -> str:
    """The short name of the reference for ``gpu`` (name, capability; default: this machine's): the file
    whose device has that name, else whose short name is a word of it, else that capability, else
    :data:`DEFAULT`. Never the alphabetical order of the files."""
    gpu = gpu if gpu is not None else _gpu()
    available = names(folder)
    if gpu is None or not available:
        return DEFAULT
    name, capability = gpu
    devices = {n: json.loads((folder / f"{n}.json").read_text()).get("device", {}) for n in available}
    words = set(re.split(r"[\s\-_]+", name.upper()))
    for test in (lambda d: d.get("name") == name,
                 lambda d: str(d.get("short", "")).upper() in words,
                 lambda d: str(d.get("capability", "")) == capability):
        found = [n for n, d in devices.items() if test(d)]
        if found:
            return DEFAULT if DEFAULT in found else found[0]
    return DEFAULT


def load(name: str | None = None, folder: Path = FOLDER) -> Reference:
    """Read and validate a reference: ``name`` (a short name, or a path to a JSON file), else the one
    ``GPUCOURSE_REFERENCE`` names, else the one for this machine's GPU (:func:`pick`), else ``h100``.

    A test fixture (status :data:`FIXTURE_STATUS`) loads only from a path, never from ``folder``."""
    name = name or environment.reference_name() or pick(folder)
    if os.sep in name or name.endswith(".json"):
        path = Path(name)
    else:
        path = folder / f"{name}.json"
        if not path.exists():
            raise FileNotFoundError(f"no GPU reference {name!r}; shipped: {', '.join(names(folder)) or 'none'}")
    data = json.loads(path.read_text())
    outside = path.resolve().parent != Path(folder).resolve()
    problems = validate(data, fixture=outside)
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
    if note:  # wrapped to the chart's width: a note on the run's size and load can be long
        note = textwrap.fill(note, max(60, int(14 * fig.get_size_inches()[0])))
    ax.set_title(title if not note else f"{title}\n{note}", fontsize=10)
    ax.legend(fontsize=8, title="hardware", title_fontsize=8)
    return fig

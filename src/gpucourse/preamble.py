"""The fixed preamble every notebook runs first: seed, device and the smoke setting.

Taught in every lesson's first cell. ``GPUCOURSE_SMOKE=1`` (set by ``make test`` and by the
grader) shrinks data and epochs so that CI can execute every notebook; the text never changes.
"""

from __future__ import annotations

import os
import random
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from gpucourse import environment

# the environment variables are read in gpucourse.environment only; these names stay for the lessons
SMOKE_ENV = environment.SMOKE
# `make test-gpu` sets GPUCOURSE_REQUIRE=cuda: a cell that needs CUDA on a machine without any is an
# error there, not a skip, so a GPU run proves that every GPU cell ran.
REQUIRE_ENV = environment.REQUIRE
T = TypeVar("T")


def smoke_mode() -> bool:
    """Whether ``GPUCOURSE_SMOKE`` asks for the small, fast run (``1``) or the full one (``0``)."""
    return environment.smoke()


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, asked through NVML so that the notebook's process can still fork.

    By default torch asks the CUDA runtime (cudaGetDeviceCount), which "poisons" fork: a child forked
    afterwards that touches CUDA dies with "Cannot re-initialize CUDA in forked subprocess", and every
    ``ddp_notebook`` child does (lesson 6). ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` asks NVML instead, as
    Lightning does for itself from the moment it is imported; this sets it first, unless set already.
    """
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return torch.cuda.is_available()


def pick_device() -> Any:
    """The best accelerator torch can use here: CUDA (or ROCm), then Apple MPS, then the CPU."""
    import torch

    if cuda_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def required_kinds() -> set[str]:
    """The accelerator kinds that ``GPUCOURSE_REQUIRE`` (comma-separated) says must be present."""
    return environment.required_kinds()


def accelerator_count(kind: str) -> int:
    """How many devices of ``kind`` torch can use: "cuda" (NVIDIA or ROCm), "mps" or "tpu"."""
    import importlib.util

    import torch

    if kind == "cuda":
        return torch.cuda.device_count() if cuda_available() else 0
    if kind == "mps":
        mps = getattr(torch.backends, "mps", None)
        return int(mps is not None and mps.is_available())
    if kind == "tpu":
        if os.environ.get("PJRT_DEVICE", "").upper() != "TPU" or importlib.util.find_spec("torch_xla") is None:
            return 0
        import torch_xla.runtime as xr

        return xr.global_runtime_device_count()
    raise ValueError(f"unknown accelerator kind {kind!r}; use 'cuda', 'mps' or 'tpu'")


@dataclass(frozen=True)
class Setup:
    """What the preamble decided; notebooks read ``S.device`` and ``S.size(full, smoke)``."""

    seed: int
    device: Any
    smoke: bool

    def size(self, full: T, smoke: T, cpu: T | None = None) -> T:
        """``full`` normally, ``smoke`` under GPUCOURSE_SMOKE=1 (CI and grading).

        ``cpu``, where given, replaces ``full`` when the device is a CPU: a workload sized for a GPU
        becomes one that a laptop finishes in minutes. The smoke size wins over both.
        """
        if self.smoke:
            return smoke
        if cpu is not None and getattr(self.device, "type", str(self.device)) == "cpu":
            return cpu
        return full

    def needs(self, kind: str, count: int = 1) -> bool:
        """Whether ``count`` devices of ``kind`` ("cuda", "mps" or "tpu") are here.

        A GPU- or TPU-only cell starts with ``if S.needs("cuda"):``; when the answer is no, this
        prints why the cell is skipped, so a CPU run (CI, a laptop) says so instead of failing.
        Under ``GPUCOURSE_REQUIRE=<kind>`` a machine with no device of that kind raises instead; one
        with some, but fewer than ``count``, still skips (one GPU cannot stand in for two).
        """
        available = accelerator_count(kind)
        if available >= count:
            return True
        what = f"{count} {kind.upper()} device{'s' if count > 1 else ''}"
        if available == 0 and kind in required_kinds():
            raise RuntimeError(f"this cell needs {what}, this machine has none, and {REQUIRE_ENV}={kind} "
                               "says this run must have them")
        print(f"Skipped: this cell needs {what}; this machine has {available} (running on {self.device}).")
        return False

    @contextmanager
    def uses_answer(self, exercise: int, *names: str):
        """Run a demonstration cell that calls a student's answer, or say which exercise to answer first.

        ``with S.uses_answer(2, "train_epoch"):`` around a cell that is not an exercise but calls one:
        while the answer is still the released stub (it raises ``NotImplementedError``) or not defined
        yet, the cell prints one line, "Skipped: answer exercise 2 (`train_epoch`) first ...", instead
        of a traceback from code the student did not write. Any other error is the student's to see.
        """
        if not names:
            raise ValueError("name the answer(s) this cell uses, e.g. S.uses_answer(2, 'train_epoch')")
        try:
            yield
        except NotImplementedError:
            pass
        except NameError as error:
            if getattr(error, "name", None) not in names:
                raise
        else:
            return
        listed = ", ".join(f"`{name}`" for name in names)
        print(f"Skipped: answer exercise {exercise} ({listed}) first; this cell runs it.")


def setup(seed: int = 0, quiet: bool = False) -> Setup:
    """Seed Python, NumPy and torch, pick the device, read the smoke setting, print one line."""
    import numpy as np
    import torch

    from gpucourse import __version__

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    result = Setup(seed=seed, device=pick_device(), smoke=smoke_mode())
    if not quiet:
        mode = "smoke run (GPUCOURSE_SMOKE=1)" if result.smoke else "full run"
        print(f"gpucourse {__version__} | torch {torch.__version__} | device: {result.device} | "
              f"seed {seed} | {mode}")
    return result

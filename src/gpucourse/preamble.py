"""The fixed preamble every notebook runs first: seed, device and the smoke setting.

Taught in every lesson's first cell. ``GPUCOURSE_SMOKE=1`` (set by ``make test`` and by the
grader) shrinks data and epochs so that CI can execute every notebook; the text never changes.
"""

from __future__ import annotations

import functools
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


@dataclass(frozen=True)
class CudaProbe:
    """What ``probe_cuda`` found: how many CUDA devices this process can really use, and why not."""

    count: int  # CUDA devices this process can use; 0 when none (or none usable)
    seen: int  # devices the NVIDIA driver reports, usable or not (-1: unknown)
    reason: str = ""  # why ``count`` is 0 although ``seen`` is not; "" otherwise
    driver: str | None = None  # the NVIDIA driver's version, e.g. "535.104.05"
    driver_cuda: str | None = None  # the newest CUDA that driver runs, e.g. "12.2"
    build_cuda: str | None = None  # torch.version.cuda: the CUDA this torch build was made for


def _cuda_version(number: int) -> str:
    """CUDA's integer version (12020) as text ("12.2")."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _nvml_facts() -> tuple[str | None, str | None, bool]:
    """From NVML in this process: the driver's version, the newest CUDA it runs, and whether a GPU is in
    MIG mode (NVML then counts boards, not the slices CUDA can use); ``(None, None, False)`` without NVML.

    NVML reads the driver without starting CUDA, so this leaves fork safe (torch's own NVML count does the same)."""
    import ctypes

    for name in ("libnvidia-ml.so.1", "nvml.dll"):
        try:
            nvml = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return None, None, False
    try:
        if nvml.nvmlInit_v2() != 0:
            return None, None, False
        text, number, count = ctypes.create_string_buffer(96), ctypes.c_int(0), ctypes.c_uint(0)
        driver = text.value.decode() if nvml.nvmlSystemGetDriverVersion(text, 96) == 0 else None
        cuda = _cuda_version(number.value) if nvml.nvmlSystemGetCudaDriverVersion(ctypes.byref(number)) == 0 else None
        mig = False
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0:
            for index in range(count.value):
                handle, current, pending = ctypes.c_void_p(), ctypes.c_uint(0), ctypes.c_uint(0)
                if (nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
                        and nvml.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending)) == 0):
                    mig = mig or current.value == 1  # NVML_DEVICE_MIG_ENABLE
        nvml.nvmlShutdown()
        return driver, cuda, mig
    except AttributeError:  # a library too old to have these calls
        return None, None, False


# Run by a short-lived child: CUDA started there (cuInit) leaves this process free to fork. Plain ctypes on
# the driver's own library, no torch: it answers in a fraction of a second.
_CHILD = """
import ctypes, json, sys
try:
    cuda = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
except OSError:
    print(json.dumps({"library": False})); sys.exit()
version, count, name = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_char_p()
cuda.cuDriverGetVersion(ctypes.byref(version))
status = cuda.cuInit(0)
if status == 0:
    status = cuda.cuDeviceGetCount(ctypes.byref(count))
if status != 0:
    cuda.cuGetErrorName(status, ctypes.byref(name))
print(json.dumps({"library": True, "status": status, "error": (name.value or b"").decode(),
                  "driver_cuda": version.value, "count": count.value}))
"""


@functools.lru_cache(maxsize=8)
def _ask_a_child(visible_devices: str | None) -> dict:
    """The CUDA driver's own answer (``_CHILD``), asked in a child process with this environment;
    cached per CUDA_VISIBLE_DEVICES (the only setting that changes it)."""
    import json
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-S", "-c", _CHILD], capture_output=True, text=True, timeout=120)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as error:
        return {"library": True, "status": -1, "error": f"the probe failed ({type(error).__name__})",
                "driver_cuda": 0, "count": 0}


def driver_too_old(driver_cuda: str | None, build_cuda: str | None) -> bool:
    """Whether a driver that runs CUDA ``driver_cuda`` cannot run a torch built for ``build_cuda``.

    CUDA's minor-version compatibility runs a build for 12.8 on a driver for 12.0 or newer: only the
    major versions are compared (what cudaGetDeviceCount refuses as cudaErrorInsufficientDriver)."""
    if not driver_cuda or not build_cuda:
        return False
    return int(driver_cuda.split(".")[0]) < int(build_cuda.split(".")[0])


def too_old_reason(driver: str | None, driver_cuda: str, build_cuda: str) -> str:
    """One sentence: the driver is older than this torch build needs (the skip messages and the doctor say it)."""
    name = f"the NVIDIA driver {driver}" if driver else "the NVIDIA driver"
    return (f"{name} runs CUDA up to {driver_cuda}, older than the CUDA {build_cuda} this torch build needs "
            f"(a driver for CUDA {build_cuda.split('.')[0]}.x or newer)")


def probe_cuda() -> CudaProbe:
    """Whether this process can really run CUDA, asked without putting CUDA state in it (lessons 2 and 6).

    ``torch.cuda.is_available()`` cannot say: by default it starts the CUDA runtime, after which a forked
    child that touches CUDA dies (every ``ddp_notebook`` child does, lesson 6), and with
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (Lightning sets it on import) it only counts what NVML sees, also
    with a driver too old for this torch build (then the first GPU tensor raises), and on MIG, where NVML
    cannot count, it falls back to the CUDA runtime after all. Here: NVML's count, with the newest CUDA
    the driver runs compared with the one torch was built for; where NVML cannot answer (MIG: it counts
    boards, or gives up on MIG device names; no NVML), the CUDA driver itself, asked in a short-lived
    child process. The two places that ask the driver outside torch, ``_nvml_facts`` and ``_ask_a_child``,
    are what a test pretending a machine replaces."""
    import torch

    build = torch.version.cuda
    if getattr(torch.version, "hip", None):  # ROCm: torch asks amdsmi under the switch, never the runtime
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return CudaProbe(count, count, "" if count else "no ROCm device", build_cuda=build)
    if build is None or not torch.cuda._is_compiled():
        return CudaProbe(0, 0, "this torch is a CPU-only build")
    if torch.cuda.is_initialized():  # CUDA runs here already: nothing left to protect, torch knows best
        count = torch.cuda.device_count()
        return CudaProbe(count, count, build_cuda=build)
    import warnings

    with warnings.catch_warnings():  # "Can't initialize NVML": the answer below says what it means
        warnings.simplefilter("ignore")
        try:
            seen = torch.cuda._device_count_nvml()  # -1: NVML could not count (MIG UUIDs, no NVML)
        except Exception:  # a private helper: gone or changed in another torch, ask the driver instead
            seen = -1
    if seen == 0:
        return CudaProbe(0, 0, "NVML sees no NVIDIA GPU", build_cuda=build)
    driver, driver_cuda, mig = _nvml_facts() if seen > 0 else (None, None, False)
    if seen > 0 and driver_too_old(driver_cuda, build):
        return CudaProbe(0, seen, too_old_reason(driver, driver_cuda, build), driver, driver_cuda, build)
    if seen > 0 and not mig:
        return CudaProbe(seen, seen, "", driver, driver_cuda, build)
    found = _ask_a_child(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not found.get("library"):
        return CudaProbe(0, 0, "no NVIDIA driver is installed", build_cuda=build)
    driver = driver or _nvml_facts()[0]
    driver_cuda = _cuda_version(found["driver_cuda"]) if found.get("driver_cuda") else None
    if found.get("status"):
        if found["error"] == "CUDA_ERROR_NO_DEVICE":
            return CudaProbe(0, 0, "the NVIDIA driver sees no GPU", driver, driver_cuda, build)
        why = (too_old_reason(driver, driver_cuda, build) if driver_too_old(driver_cuda, build)
               else f"the CUDA driver does not start ({found['error'] or found['status']})")
        return CudaProbe(0, -1, why, driver, driver_cuda, build)
    if driver_too_old(driver_cuda, build):
        return CudaProbe(0, found["count"], too_old_reason(driver, driver_cuda, build), driver, driver_cuda, build)
    return CudaProbe(found["count"], found["count"], "", driver, driver_cuda, build)


def cuda_available() -> bool:
    """Whether this process can run CUDA (``probe_cuda``), asked so that the notebook's process can still fork.

    By default ``torch.cuda.is_available()`` asks the CUDA runtime (cudaGetDeviceCount), which "poisons"
    fork: a child forked afterwards that touches CUDA dies with "Cannot re-initialize CUDA in forked
    subprocess", and every ``ddp_notebook`` child does (lesson 6). ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` makes
    torch's own later calls ask NVML instead, as Lightning does for itself from the moment it is imported;
    this sets it first, unless set already.
    """
    return accelerator_count("cuda") > 0


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
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        return probe_cuda().count
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

    def count(self, kind: str) -> int:
        """How many devices of ``kind`` ("cuda", "mps" or "tpu") this process can use, counted without
        starting CUDA here (``probe_cuda``): safe before a fork, unlike ``torch.cuda.device_count()`` on MIG."""
        return accelerator_count(kind)

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
        # GPUs the driver reports but this torch cannot use (a driver too old for it): say why, and who says more
        unusable = probe_cuda() if kind == "cuda" and available == 0 else None
        why = (f": {unusable.reason}; `python -m gpucourse doctor` says what to do"
               if unusable is not None and unusable.seen and unusable.reason else "")
        if available == 0 and kind in required_kinds():
            raise RuntimeError(f"this cell needs {what}, this machine has none{why}, and {REQUIRE_ENV}={kind} "
                               "says this run must have them")
        print(f"Skipped: this cell needs {what}; this machine has {available} (running on {self.device}){why}.")
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


# Messages of the libraries about themselves, silenced at their source for every lesson (setup() calls
# quiet_libraries()): they say nothing about the lesson's code and bury its output. Lightning's own
# INFO lines come from these loggers: rank_zero_info ("GPU available: False, used: False", "TPU
# available", the "💡 Tip:" lines about LitLogger and litmodels, "`Trainer.fit` stopped", "Using bfloat16
# Automatic Mixed Precision", the ddp banner), Fabric's "Initializing distributed: GLOBAL_RANK ..." and
# "Seed set to", and "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES" on a GPU. Importing Lightning sets only its top
# loggers to INFO, so a level set here, before or after that import, stays; warnings stay audible, and
# so do the profilers' reports (their own logger: lesson 11 reads the simple profiler's).
QUIET_LOGGERS = (
    "pytorch_lightning.utilities.rank_zero", "pytorch_lightning.accelerators.cuda",
    "lightning_fabric.utilities.rank_zero", "lightning_fabric.utilities.distributed", "lightning_fabric.utilities.seed",
    # the same modules in the unified `lightning` package, where that is what is installed
    "lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda",
    "lightning.fabric.utilities.rank_zero", "lightning.fabric.utilities.distributed", "lightning.fabric.utilities.seed",
)
# Importing torch.utils.cpp_extension (torch.utils.benchmark does: lessons 2 to 5) warns "No CUDA runtime
# is found, using CUDA_HOME=..." on a machine with the CUDA toolkit and no usable GPU: it is about
# building CUDA extensions, which no lesson does. Only that record is dropped from its logger.
_NO_CUDA_RUNTIME = "No CUDA runtime is found"
# Lightning 2.6 on this torch warns that its own code uses a deprecated pytree class (a notice for
# Lightning's authors, about no line of ours).
_LIGHTNING_LEAFSPEC = r".*isinstance\(treespec, LeafSpec\)"
# Lightning's advice to start with srun, wherever SLURM's srun is installed: a notebook's kernel is never
# started by srun, and the hint it prints ("srun python -m ipykernel_launcher ...") would be wrong there.
_SRUN_NOT_USED = "The `srun` command is available on your system but is not used"

# Seen on a GPU machine (an H200, 16 cores), never on the 2-core CPU machine:
# - Lightning's "GPU available but not used": the lessons that train on the CPU on purpose (to compare, to
#   fork with ddp_notebook) say which device they use in their own output.
# - Lightning's advice to raise `num_workers` where a machine has many cores: lessons 5 and 11 teach loader
#   workers and measure them; elsewhere the loader is in memory and a worker would only add start-up.
# - torch's AccumulateGrad stream warning under Lightning's DDP on CUDA: Lightning builds DDP on a side stream
#   (Lightning-AI/pytorch-lightning#21567, fixed by #21746), a notice about its code, not the lesson's.
# - tqdm's "IProgress not found" where ipywidgets is not installed: its bar falls back to text.
_GPU_NOT_USED = "GPU available but not used"
_FEW_WORKERS = r".*does not have many workers which may be a bottleneck"
_DDP_SIDE_STREAM = "The AccumulateGrad node's stream does not match the stream"
_NO_IPYWIDGETS = "IProgress not found"


class _DropMessage:
    """A logging filter that drops the records whose message starts with ``prefix``."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def filter(self, record) -> bool:
        return not str(record.msg).startswith(self.prefix)


def quiet_libraries() -> None:
    """Silence the library messages above (idempotent; imports neither Lightning nor cpp_extension).

    Forked processes (``ddp_notebook``, DataLoader workers) inherit it; processes started afresh
    (``ddp_spawn``, ``torchrun``) do not, and their output reaches a notebook only when they fail."""
    import logging
    import warnings

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    cpp_extension = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _DropMessage) for f in cpp_extension.filters):
        cpp_extension.addFilter(_DropMessage(_NO_CUDA_RUNTIME))
    for message in (_LIGHTNING_LEAFSPEC, _SRUN_NOT_USED, _GPU_NOT_USED, _FEW_WORKERS, _DDP_SIDE_STREAM, _NO_IPYWIDGETS):
        warnings.filterwarnings("ignore", message=message)


def setup(seed: int = 0, quiet: bool = False) -> Setup:
    """Seed Python, NumPy and torch, pick the device, read the smoke setting, silence the libraries'
    messages about themselves (``quiet_libraries``), print one line."""
    import numpy as np
    import torch

    from gpucourse import __version__

    quiet_libraries()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    result = Setup(seed=seed, device=pick_device(), smoke=smoke_mode())
    if not quiet:
        mode = "smoke run (GPUCOURSE_SMOKE=1)" if result.smoke else "full run"
        print(f"gpucourse {__version__} | torch {torch.__version__} | device: {result.device} | "
              f"seed {seed} | {mode}")
    return result

"""Pretend the GPUs of a student's machine in a CPU-only process, and record what would break a fork there.

Used by tests/test_fork_safety.py (the rule lesson 6 teaches) and tests/test_device_profiles.py (every
device-dependent path under each machine the course meets). On an NVIDIA machine three things put
CUDA state in a process, after which a forked child that touches CUDA dies with PyTorch's
"Cannot re-initialize CUDA in forked subprocess":

- CUDA initialization from Python (``torch.cuda._lazy_init``: the first tensor on "cuda",
  ``get_rng_state``, ``synchronize``... every module of ``torch.cuda`` that imported it by name too);
- CUDA initialization from C++, which never passes through ``_lazy_init``: ``torch.cuda.Stream()``,
  pinned memory (``Tensor.pin_memory()``, a factory's ``pin_memory=True``, ``DataLoader(pin_memory=True)``),
  ``torch.cuda.memory._record_memory_history``, ``set_device`` and ``torch.accelerator``'s device calls;
- ``torch._C._cuda_getDeviceCount`` (cudaGetDeviceCount calls cuInit): what ``torch.cuda.is_available()``
  does unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (Lightning sets it when imported) makes it ask NVML.
``torch.cuda.device_count()`` asks NVML first, and seeding is queued until initialization: neither counts.

``install(log, profile=...)`` replaces exactly those entry points, and answers device queries as the
profile's GPU would (``PROFILES``: 0, 1, 2 or 8 GPUs; a T4 (sm_75: no TF32, bfloat16 emulated only), an
A100 (sm_80), an H100 (sm_90); a driver too old for this torch; MIG, where NVML counts more GPUs than
CUDA can use). Queries (capability, properties, name, bfloat16 and TF32 support, current device) answer
after recording a CUDA initialization, since on a GPU they initialize CUDA. Work that needs a real GPU
(a kernel, a stream) records, then raises ``NoRealGPU``; pinning returns an unpinned copy, and the
random states and the current stream answer, so CPU training runs to the end and reaches any fork after
it. At every fork the child inherits whether its parent had CUDA state, as torch's own at-fork handler
does; a child that then touches CUDA records a violation and raises PyTorch's real error text. Events are
JSON lines appended to one log file, from every process.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
import warnings
from dataclasses import dataclass

import torch

REAL_ERROR = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
              "you must use the 'spawn' start method")
# torch's own texts (c10/cuda/CUDAFunctions.cpp), for a driver older than the build's CUDA and for none
TOO_OLD = ("The NVIDIA driver on your system is too old (found version {version}). Please update your GPU driver "
           "by downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx "
           "Alternatively, go to: https://pytorch.org to install a PyTorch version that has been compiled with "
           "your version of the CUDA driver.")
NO_DRIVER = ("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a "
             "driver from http://www.nvidia.com/Download/index.aspx")


class NoRealGPU(RuntimeError):
    """Raised where the code would now run work on the GPU: the simulator answers queries, not kernels."""


@dataclass(frozen=True)
class Profile:
    """A machine: what NVML counts, what CUDA can use, and the GPU's answers to torch's queries."""

    nvml_gpus: int  # nvmlDeviceGetCount; -1: no NVML library (a machine without the NVIDIA driver)
    cuda_gpus: int  # cudaGetDeviceCount
    name: str = ""
    capability: tuple[int, int] = (0, 0)
    total_memory: int = 0
    multi_processor_count: int = 0
    L2_cache_size: int = 0  # noqa: N815 (torch's attribute name)
    driver_version: int | None = None  # set: the driver is older than this torch's CUDA, and init fails
    mig: bool = False  # a GPU in MIG mode (NVML says so)


_T4 = dict(name="Tesla T4", capability=(7, 5), total_memory=15_637_086_208, multi_processor_count=40,
           L2_cache_size=4 << 20)
_A100 = dict(name="NVIDIA A100-SXM4-80GB", capability=(8, 0), total_memory=85_097_971_712,
             multi_processor_count=108, L2_cache_size=40 << 20)
_H100 = dict(name="NVIDIA H100 80GB HBM3", capability=(9, 0), total_memory=85_029_158_912,
             multi_processor_count=132, L2_cache_size=50 << 20)
PROFILES = {
    "cpu": Profile(nvml_gpus=-1, cuda_gpus=0),
    "1gpu": Profile(1, 1, **_H100),
    "2xT4": Profile(2, 2, **_T4),  # Kaggle's two-GPU runtime
    "8gpu": Profile(8, 8, **_H100),
    "sm_75": Profile(1, 1, **_T4),  # Colab's free GPU
    "sm_80": Profile(1, 1, **_A100),
    "sm_90": Profile(1, 1, **_H100),
    # NVML (in the kernel driver) sees the GPU; the CUDA 13 runtime of this torch needs driver 580+
    "old-driver": Profile(1, 0, driver_version=12040, **_T4),
    # two A100s in MIG mode: NVML counts the boards, CUDA enumerates one MIG slice per process
    "mig": Profile(2, 1, mig=True, name="NVIDIA A100-SXM4-40GB MIG 1g.5gb", capability=(8, 0), total_memory=4_972_937_216,
                   multi_processor_count=14, L2_cache_size=5 << 20),
}

_state = {"log": None, "cell": "", "cell_number": 0, "has_cuda_state": False, "in_bad_fork": False,
          "forked_child": False, "seen": set(), "profile": PROFILES["1gpu"], "device": 0, "initialized": False,
          "undo": [], "fork_hook": False, "active": False}


def _where() -> str:
    """The innermost frames outside this file and torch.cuda: who asked for CUDA."""
    frames = [f for f in traceback.extract_stack()[:-2] if __file__ not in f.filename]
    return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames[-6:]))


def _record(kind: str, what: str) -> None:
    key = (kind, what, os.getpid(), _state["cell_number"])
    if key in _state["seen"] and kind != "fork":
        return  # once per call site kind, process and cell: an optimizer asks at every step
    _state["seen"].add(key)
    event = {"kind": kind, "what": what, "pid": os.getpid(), "cell": _state["cell"],
             "cell_number": _state["cell_number"], "child": _state["forked_child"], "where": _where()}
    with open(_state["log"], "a") as log:
        log.write(json.dumps(event) + "\n")


def _cuda_state(what: str) -> None:
    """A call that leaves CUDA state in this process: legal, unless this is a child of a process with some."""
    if _state["in_bad_fork"]:
        _record("violation", what)
        raise RuntimeError(REAL_ERROR)
    _record("child_cuda" if _state["forked_child"] else "cuda_state", what)
    _state["has_cuda_state"] = True


def _init(what: str) -> None:
    """CUDA initialization, as the profile's machine answers it: recorded, then it fails or succeeds."""
    profile = _state["profile"]
    if profile.nvml_gpus < 0:  # no driver: torch fails before any CUDA state exists
        raise RuntimeError(NO_DRIVER)
    _cuda_state(f"CUDA initialization ({what})")
    if profile.driver_version is not None:
        raise RuntimeError(TOO_OLD.format(version=profile.driver_version))
    if profile.cuda_gpus == 0:
        raise RuntimeError("CUDA driver initialization failed, you might not have a CUDA gpu.")
    _state["initialized"] = True


def _needs_gpu(what: str) -> None:
    _init(what)
    raise NoRealGPU(f"{what} runs on the GPU: the simulated machine answers device queries only, "
                    "and records this call")


class _Properties:
    """``torch.cuda.get_device_properties``'s answer, with the attributes the course reads."""

    def __init__(self, profile: Profile, index: int):
        self.name, (self.major, self.minor) = profile.name, profile.capability
        self.total_memory, self.multi_processor_count = profile.total_memory, profile.multi_processor_count
        self.L2_cache_size, self.warp_size, self.is_integrated = profile.L2_cache_size, 32, False
        self.uuid = f"GPU-00000000-0000-0000-0000-{index:012d}"

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory >> 20}MB, multi_processor_count={self.multi_processor_count})")


_MISSING = object()


def _patch(owner, name: str, value) -> None:
    getattr(owner, name)  # a torch without this entry point fails here, by name
    _state["undo"].append((owner, name, vars(owner).get(name, _MISSING)))  # inherited: deleted again on undo
    setattr(owner, name, value)


def _replacements() -> dict[str, object]:
    """The CUDA entry points (``module.attribute``), each replaced as the profile's machine answers it."""
    profile = _state["profile"]

    def raw_device_count_nvml() -> int:
        return profile.nvml_gpus

    def raw_device_uuid_nvml():
        return None if profile.nvml_gpus < 0 else [_Properties(profile, i).uuid for i in range(profile.nvml_gpus)]

    def get_device_count() -> int:
        if profile.nvml_gpus < 0:
            return 0  # no driver: cudaGetDeviceCount fails before cuInit can leave state
        _cuda_state("cudaGetDeviceCount (torch.cuda.is_available() without PYTORCH_NVML_BASED_CUDA_CHECK=1)")
        if profile.driver_version is not None:  # torch warns and answers 0
            warnings.warn("CUDA initialization: " + TOO_OLD.format(version=profile.driver_version), UserWarning)
        return profile.cuda_gpus

    def device_count() -> int:
        # torch's own order: before initialization NVML's count, after it the CUDA runtime's
        if _state["initialized"]:
            return get_device_count()
        nvml = torch.cuda._device_count_nvml()  # CUDA_VISIBLE_DEVICES applied by torch itself
        return get_device_count() if nvml < 0 else nvml

    def index(device) -> int:
        device = torch.cuda._get_device_index(device, optional=True)
        if not 0 <= device < profile.cuda_gpus:
            raise AssertionError("Invalid device id")
        return device

    def get_device_properties(device=None):
        _init("torch.cuda.get_device_properties")
        return _Properties(profile, index(device))

    def current_device() -> int:
        _init("torch.cuda.current_device")
        return _state["device"]

    def set_device_index(device: int) -> None:
        _init("cudaSetDevice, from C++")
        if not 0 <= device < profile.cuda_gpus:
            raise RuntimeError("CUDA error: invalid device ordinal")
        _state["device"] = device

    def exchange_device(device: int) -> int:
        if device < 0:
            return -1  # torch.cuda.device(None): nothing to switch, nothing initialized
        before = _state["device"]
        set_device_index(device)
        return before

    def check_bf16_tensor_supported(device) -> bool:
        _init("a bfloat16 tensor on the GPU (torch.cuda.is_bf16_supported)")
        return True  # every CUDA GPU stores bfloat16; before sm_80 its arithmetic is emulated

    def lazy_init() -> None:
        _needs_gpu("CUDA initialization (torch.cuda._lazy_init)")

    def rng_state(device="cuda"):
        _init("torch.cuda.get_rng_state")
        return torch.zeros(16, dtype=torch.uint8)  # a CUDA generator's state: seed and offset

    def rng_state_all():
        _init("torch.cuda.get_rng_state_all")
        return [torch.zeros(16, dtype=torch.uint8) for _ in range(profile.cuda_gpus)]

    class NotCapturing:  # the current CUDA stream, as far as an optimizer's capture check asks
        def is_capturing(self) -> bool:
            return False

    def current_stream(device=None):
        _init("torch.accelerator.current_stream")
        return NotCapturing()

    def new_stream(cls, *args, **kwargs):
        _needs_gpu("torch.cuda.Stream(): a CUDA stream, created in C++")

    def pin_memory(self, *args, **kwargs):
        _init("pinned host memory (Tensor.pin_memory, cudaHostAlloc from C++)")
        return self.clone()  # same values; only the page-locking is missing

    def record_memory_history(*args, **kwargs) -> None:
        _init("torch.cuda.memory._record_memory_history (the caching allocator, from C++)")

    def memory_snapshot(*args, **kwargs):
        _needs_gpu("torch.cuda.memory._snapshot (the caching allocator, from C++)")

    return {
        "torch.cuda._raw_device_count_nvml": raw_device_count_nvml,
        "torch.cuda._raw_device_uuid_nvml": raw_device_uuid_nvml,
        "torch._C._cuda_getDeviceCount": get_device_count,
        "torch.cuda.device_count": device_count,
        "torch.cuda.get_device_properties": get_device_properties,
        "torch.cuda.current_device": current_device,
        "torch._C._cuda_setDevice": set_device_index,
        "torch.cuda._exchange_device": exchange_device,
        "torch.cuda._maybe_exchange_device": exchange_device,
        "torch.accelerator.set_device_index": lambda device: set_device_index(
            torch.cuda._get_device_index(device)),
        "torch.accelerator.current_device_index": current_device,
        "torch.accelerator.current_stream": current_stream,
        "torch.cuda._check_bf16_tensor_supported": check_bf16_tensor_supported,
        "torch.cuda.init": lambda: _init("torch.cuda.init"),  # asked for by name: initialization only
        "torch.cuda._lazy_init": lazy_init,
        "torch.cuda.random._lazy_init": lazy_init,
        "torch.cuda.memory._lazy_init": lazy_init,
        "torch.cuda.get_rng_state": rng_state,
        "torch.cuda.random.get_rng_state": rng_state,
        "torch.cuda.get_rng_state_all": rng_state_all,
        "torch.cuda.random.get_rng_state_all": rng_state_all,
        "torch.cuda.streams.Stream.__new__": new_stream,
        "torch.Tensor.pin_memory": pin_memory,
        "torch._C._cuda_record_memory_history": record_memory_history,
        "torch._C._cuda_memorySnapshot": memory_snapshot,
    }


# Factories that take ``pin_memory=True`` (the course allocates pinned buffers with these)
PINNING_FACTORIES = ("empty", "zeros", "ones", "full", "rand", "randn", "randint", "tensor", "empty_like",
                     "zeros_like", "ones_like", "empty_strided", "arange")


def _driver_answers() -> dict[str, object]:
    """``gpucourse.preamble`` asks the driver outside torch, without starting CUDA in the notebook's process:
    NVML through ctypes, and the CUDA driver in a short-lived child. Their answers on the profile's machine."""
    profile = _state["profile"]
    cuda = profile.driver_version or 13000  # the newest CUDA the driver runs (this torch is built for 13.0)
    facts = (None, None, False) if profile.nvml_gpus < 0 else (
        "550.54.15" if profile.driver_version else "580.82.07", f"{cuda // 1000}.{cuda % 1000 // 10}", profile.mig)
    child = ({"library": False} if profile.nvml_gpus < 0 else
             {"library": True, "status": 0, "error": "", "driver_cuda": cuda,
              "count": profile.cuda_gpus or profile.nvml_gpus})  # cuInit works on an old driver: only torch's runtime fails
    return {"_nvml_facts": lambda: facts, "_ask_a_child": lambda visible_devices: dict(child)}


def _pinning_factory(factory):
    @functools.wraps(factory)
    def wrapper(*args, **kwargs):
        if kwargs.get("pin_memory"):
            _init(f"pinned host memory (torch.{factory.__name__}(pin_memory=True), from C++)")
            kwargs["pin_memory"] = False
        return factory(*args, **kwargs)
    return wrapper


def install(log_path: str, gpus: int | None = None, profile: str = "1gpu") -> None:
    """Pretend the machine ``profile`` (a key of ``PROFILES``; ``gpus`` overrides its count) in this
    process, and record CUDA state and forks to ``log_path``. ``uninstall`` puts torch back."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    uninstall()
    chosen = PROFILES[profile]
    if gpus is not None:
        chosen = Profile(**{**chosen.__dict__, "nvml_gpus": gpus, "cuda_gpus": gpus})
    _state.update(log=str(log_path), profile=chosen, device=0, initialized=False, has_cuda_state=False,
                  in_bad_fork=False, forked_child=False, seen=set(), active=True)
    # A fresh Colab or Jupyter kernel: Lightning has not set the NVML switch yet.
    os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    for target, value in _replacements().items():
        module, _, name = target.rpartition(".")
        owner = functools.reduce(getattr, module.split(".")[1:], torch)
        _patch(owner, name, staticmethod(value) if name == "__new__" else value)
    for name in PINNING_FACTORIES:
        _patch(torch, name, _pinning_factory(getattr(torch, name)))
    try:
        from gpucourse import preamble
    except ImportError:  # the simulator also serves code outside the course package
        preamble = None
    for name, value in _driver_answers().items():
        if hasattr(preamble, name):
            _patch(preamble, name, value)
    torch.cuda._cached_device_count = None
    if not _state["fork_hook"]:  # os.register_at_fork cannot be undone: one hook, live while installed
        os.register_at_fork(before=_before_fork, after_in_child=_after_in_child)
        _state["fork_hook"] = True
    _name_cells()


def uninstall() -> None:
    """Put back every entry point ``install`` replaced (tests that simulate in the pytest process)."""
    while _state["undo"]:
        owner, name, value = _state["undo"].pop()
        if value is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
    _state["active"] = False


def _before_fork() -> None:
    if _state["active"]:
        _record("fork", f"fork with CUDA state in the parent: {_state['has_cuda_state']}")


def _after_in_child() -> None:
    # torch's own at-fork handler: a child of a process with CUDA state is in a "bad fork".
    _state["in_bad_fork"] = _state["has_cuda_state"]
    _state["forked_child"] = True
    _state["initialized"] = False


def _name_cells() -> None:
    """Inside IPython, name the cell in each event."""
    ip = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if ip is None or _state.get("naming"):
        return
    _state["naming"] = True

    def pre_run_cell(info) -> None:
        _state["cell_number"] += 1
        _state["cell"] = (info.raw_cell.strip().splitlines() or [""])[0][:80]

    ip.events.register("pre_run_cell", pre_run_cell)


def read_events(log_path) -> list[dict]:
    with open(log_path) as log:
        return [json.loads(line) for line in log if line.strip()]

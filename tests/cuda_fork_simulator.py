"""Pretend a GPU is present in a CPU-only kernel, and record what would break a fork on a real one.

Used by tests/test_fork_safety.py (the rule lesson 6 teaches). On an NVIDIA machine three things put
CUDA state in a process, after which a forked child that touches CUDA dies with PyTorch's
"Cannot re-initialize CUDA in forked subprocess":

- CUDA initialization itself (``torch.cuda._lazy_init``: the first tensor on "cuda", ``set_device``,
  ``get_rng_state_all``... every CUDA entry point goes through it, the C++ ones included);
- ``torch._C._cuda_getDeviceCount`` (cudaGetDeviceCount calls cuInit): what ``torch.cuda.is_available()``
  does unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (Lightning sets it when imported) makes it ask NVML;
- nothing else: ``torch.cuda.device_count()`` asks NVML first, and seeding is queued until initialization.

``install`` replaces exactly those entry points. NVML "sees" ``gpus`` GPUs, so code takes its GPU
branches (``S.device`` is cuda, ``accelerator="auto"`` picks the GPU, ``S.needs("cuda")`` is true). The
notebook process records each event above (it cannot really run CUDA, so initialization then raises,
as a CPU does). At every fork the child inherits whether its parent had CUDA state, exactly as torch's
own at-fork handler does; a child that then touches CUDA records a violation and raises PyTorch's real
error text, which is what a GPU would do. Two calls that a GPU answers and that CPU code
makes whenever a GPU is present answer here too, after recording: ``get_rng_state_all`` (no states;
Lightning saves the CUDA random state around every fit) and ``torch.accelerator.current_stream`` (a
stream that is not capturing; ``torch.optim`` optimizers ask it in ``step()``). So CPU training runs to
the end and reaches any fork after it. Events are JSON lines appended to one log file, from every process.
"""

from __future__ import annotations

import json
import os
import traceback

import torch

REAL_ERROR = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
              "you must use the 'spawn' start method")
_state = {"log": None, "cell": "", "cell_number": 0, "has_cuda_state": False, "in_bad_fork": False,
          "forked_child": False, "seen": set()}


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


def install(log_path: str, gpus: int = 1) -> None:
    """Pretend ``gpus`` NVIDIA GPUs in this process and record CUDA state and forks to ``log_path``."""
    _state["log"] = str(log_path)
    # A fresh Colab or Jupyter kernel: Lightning has not set the NVML switch yet.
    os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)

    def device_count_nvml() -> int:
        return gpus

    def get_device_count() -> int:
        _cuda_state("cudaGetDeviceCount (torch.cuda.is_available() without PYTORCH_NVML_BASED_CUDA_CHECK=1)")
        return gpus

    def lazy_init() -> None:
        _cuda_state("CUDA initialization (torch.cuda._lazy_init)")
        raise RuntimeError("no GPU here: the fork-safety check pretends one, and records this call")

    def get_rng_state_all():
        _cuda_state("CUDA initialization (torch.cuda.get_rng_state_all)")
        return []

    class NotCapturing:  # the current CUDA stream, as far as an optimizer's capture check asks
        def is_capturing(self) -> bool:
            return False

    def current_stream(device=None):
        _cuda_state("CUDA initialization (torch.accelerator.current_stream)")
        return NotCapturing()

    torch.accelerator.current_stream = current_stream
    torch.cuda._device_count_nvml = device_count_nvml
    torch._C._cuda_getDeviceCount = get_device_count
    torch.cuda._lazy_init = lazy_init
    torch.cuda.get_rng_state_all = get_rng_state_all

    def before_fork() -> None:
        _record("fork", f"fork with CUDA state in the parent: {_state['has_cuda_state']}")

    def after_in_child() -> None:
        # torch's own at-fork handler: a child of a process with CUDA state is in a "bad fork".
        _state["in_bad_fork"] = _state["has_cuda_state"]
        _state["forked_child"] = True

    os.register_at_fork(before=before_fork, after_in_child=after_in_child)

    try:  # name the cell in each event
        ip = get_ipython()  # noqa: F821 (defined inside IPython only)
    except NameError:
        return

    def pre_run_cell(info) -> None:
        _state["cell_number"] += 1
        _state["cell"] = (info.raw_cell.strip().splitlines() or [""])[0][:80]

    ip.events.register("pre_run_cell", pre_run_cell)


def read_events(log_path) -> list[dict]:
    with open(log_path) as log:
        return [json.loads(line) for line in log if line.strip()]

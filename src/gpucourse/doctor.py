"""Lesson 2 (CPU vs GPU, and CUDA): "I know I have a GPU, why isn't it available?"

    python -m gpucourse doctor

``gather()`` reads the facts (torch build, driver, environment, Apple MPS, XLA); ``diagnose()``
turns them into findings, each with a fix. The two are separate so that every diagnosis can be
shown, and tested, on a machine that has none of the problems.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
from dataclasses import dataclass, field

from gpucourse.preamble import driver_too_old, probe_cuda, too_old_reason


@dataclass(frozen=True)
class Facts:
    torch_version: str
    cuda_build: str | None  # torch.version.cuda: None for a CPU-only (or ROCm) build
    hip_build: str | None  # torch.version.hip: set for a ROCm (AMD) build
    cuda_available: bool
    device_count: int
    devices: tuple[str, ...] = ()
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES as set, None when unset
    driver_version: str | None = None  # from NVML or /proc/driver/nvidia/version, None when no NVIDIA driver
    driver_cuda: str | None = None  # the newest CUDA the driver runs ("12.2"), None when unknown
    gpus_seen: int = 0  # GPUs the driver reports, usable by this torch or not (-1: unknown)
    cuda_error: str | None = None  # why CUDA does not start here (what it said, or what the driver probe found)
    nvidia_smi: bool = False
    mps_built: bool = False
    mps_available: bool = False
    xla_installed: bool = False
    pjrt_device: str | None = None
    system: str = field(default_factory=platform.system)


@dataclass(frozen=True)
class Finding:
    level: str  # "ok", "info" or "problem"
    what: str
    fix: str = ""


def _driver_version() -> str | None:
    try:
        with open("/proc/driver/nvidia/version") as handle:
            first = handle.readline()
    except OSError:
        return None
    words = first.split()
    return next((w for w in words if w[:1].isdigit() and "." in w), first.strip() or None)


def _device_names(count: int) -> tuple[tuple[str, ...], str | None]:
    """The GPUs' names (this starts CUDA: the doctor is a process of its own), or what CUDA said instead."""
    import torch

    try:
        return tuple(torch.cuda.get_device_name(i) for i in range(count)), None
    except Exception as error:  # the doctor diagnoses this; it must not fail on it
        said = str(error).strip()
        return (), f"{type(error).__name__}: {said.splitlines()[0][:300] if said else ''}"


def gather() -> Facts:
    """Read this machine's facts; needs nothing but torch. Never raises on a broken CUDA set-up: the
    facts say what failed (``gpucourse.preamble.probe_cuda`` asks the driver without starting CUDA)."""
    import torch

    probe = probe_cuda()
    count = probe.count
    devices, error = _device_names(count) if count else ((), None)
    if error is not None:  # the driver said yes, CUDA itself no
        count = 0
    elif not count and probe.seen and probe.reason:  # GPUs the driver reports, which CUDA cannot use: why
        error = probe.reason
    mps = getattr(torch.backends, "mps", None)
    return Facts(
        torch_version=torch.__version__,
        cuda_build=torch.version.cuda,
        hip_build=getattr(torch.version, "hip", None),
        cuda_available=count > 0,
        device_count=count,
        devices=devices,
        visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        driver_version=probe.driver or _driver_version(),
        driver_cuda=probe.driver_cuda,
        gpus_seen=probe.seen,
        cuda_error=error,
        nvidia_smi=shutil.which("nvidia-smi") is not None,
        mps_built=bool(mps and mps.is_built()),
        mps_available=bool(mps and mps.is_available()),
        xla_installed=importlib.util.find_spec("torch_xla") is not None,
        pjrt_device=os.environ.get("PJRT_DEVICE"),
    )


def diagnose(f: Facts) -> list[Finding]:
    """What the facts mean, most important first; every problem comes with its fix."""
    found: list[Finding] = []
    if f.cuda_available:
        names = ", ".join(f.devices) or f"{f.device_count} device(s)"
        backend = f"ROCm {f.hip_build}" if f.hip_build else f"CUDA {f.cuda_build}"
        found.append(Finding("ok", f"torch {f.torch_version} ({backend}) sees {names}."))
        if f.visible_devices is not None:
            found.append(Finding("info", f"CUDA_VISIBLE_DEVICES={f.visible_devices!r} limits which GPUs this process sees; "
                                         "torch numbers the visible ones from 0."))
    elif f.visible_devices is not None and f.visible_devices.strip() in ("", "-1", "none", "NoDevFiles"):
        found.append(Finding("problem", f"CUDA_VISIBLE_DEVICES={f.visible_devices!r} hides every GPU from this process.",
                             "Unset it (`unset CUDA_VISIBLE_DEVICES`, or remove it from the job script/notebook) "
                             "or list the GPUs to use, e.g. CUDA_VISIBLE_DEVICES=0,1."))
    elif f.cuda_build is None and f.hip_build is None:
        found.append(Finding("problem" if (f.driver_version or f.nvidia_smi) else "info",
                             f"torch {f.torch_version} is a CPU-only build: it cannot use a GPU even if there is one.",
                             "Install a CUDA build of torch: pick your OS, pip and CUDA version on pytorch.org's "
                             "'Get started' page and use the command it gives (on Linux x86-64, the default `pip install torch` is one)."))
    elif f.hip_build is None and driver_too_old(f.driver_cuda, f.cuda_build):
        what = too_old_reason(f.driver_version, f.driver_cuda, f.cuda_build)
        found.append(Finding("problem", f"{what[0].upper()}{what[1:]}: torch {f.torch_version} cannot use the "
                                        f"GPU{'s' if f.gpus_seen > 1 else ''} the driver reports.",
                             f"Either install a torch build for the CUDA this driver runs, CUDA {f.driver_cuda.split('.')[0]}.x "
                             "(an older torch: pytorch.org's 'Previous PyTorch versions' page gives each version's pip "
                             "command, whose `--index-url https://download.pytorch.org/whl/cuXYZ` names its CUDA), or "
                             f"update the NVIDIA driver to one for CUDA {f.cuda_build.split('.')[0]}.x or newer (your "
                             "distribution's package or nvidia.com, or ask the administrator; on a hosted notebook, "
                             "choose a newer GPU image). `nvidia-smi` shows the newest CUDA the driver runs."))
    elif f.driver_version is None and not f.nvidia_smi and not f.cuda_error:  # no driver said anything
        found.append(Finding("problem", f"torch is built for CUDA {f.cuda_build}, but no NVIDIA driver is loaded "
                                        "(or this machine has no NVIDIA GPU).",
                             "On a machine with an NVIDIA GPU, install the NVIDIA driver (your distribution's package, or "
                             "ask the administrator); on Colab choose Runtime → Change runtime type → GPU."))
    else:
        driver = f"driver {f.driver_version}" if f.driver_version else "a driver"
        said = f" (CUDA said: {f.cuda_error})" if f.cuda_error else ""
        found.append(Finding("problem", f"torch is built for CUDA {f.cuda_build} and {driver} is installed, "
                                        f"but torch cannot initialise CUDA{said}: usually the driver is older than "
                                        "that CUDA needs.",
                             "Update the NVIDIA driver, or install a torch build for an older CUDA "
                             "(pytorch.org lists several). `nvidia-smi` shows the newest CUDA the driver supports."))
    if f.mps_available:
        found.append(Finding("ok", "Apple MPS is available: use torch.device('mps')."))
    elif f.system == "Darwin" and not f.mps_built:
        found.append(Finding("info", "This torch build has no MPS support.", "Install the standard macOS arm64 wheel of torch."))
    if f.xla_installed:
        if (f.pjrt_device or "").upper() in ("TPU", "CUDA", "CPU"):
            found.append(Finding("ok", f"torch_xla is installed and PJRT_DEVICE={f.pjrt_device}."))
        else:
            found.append(Finding("problem", "torch_xla is installed but PJRT_DEVICE is not set.",
                                 "Set PJRT_DEVICE=TPU on a TPU VM (XRT and XRT_TPU_CONFIG are gone)."))
    if not any(x.level == "ok" for x in found):
        found.append(Finding("info", "Everything will run on the CPU. That is enough for this course; "
                                     "GPU-only cells say so and skip."))
    return found


def report(findings: list[Finding]) -> str:
    marks = {"ok": "✓", "info": "·", "problem": "✗"}
    lines = []
    for finding in findings:
        lines.append(f"{marks[finding.level]} {finding.what}")
        if finding.fix:
            lines.append(f"    fix: {finding.fix}")
    return "\n".join(lines)


if __name__ == "__main__":  # `python -m gpucourse.doctor` too, the module's own name: the same report
    print(report(diagnose(gather())))

"""What the grader trusts in the sandbox, in one place: the packages whose state the observers rely on.

The runner snapshots these before any student cell and puts back whatever a cell changed
(``snapshot.Snapshot``); the grader's scan of the answers (``autograders.assemble.PATCH_SCOPE``)
flags a patch of the same packages, plus those observers import only later; the preloaded Python
(``autograders.preload``) imports ``PRELOAD`` once, so that forked runs start with them loaded. One
list for all three: a package added to what the observers use is then protected, scanned and
preloaded together, instead of in three hand-kept copies that drift apart.
"""

from __future__ import annotations

# The course's own packages: the helpers students import and this worker. Besides their modules, their
# public module-level lists, dicts and sets are held too (TABLE, PUBLIC_LOSSES, the runner's FREEZE).
OWN = ("gpucourse", "autograders")
# Top-level packages whose loaded modules are snapshotted, besides the standard library's.
SCOPE = (*OWN, "torch", "lightning", "lightning_fabric", "pytorch_lightning", "numpy")
# Modules (and their submodules) whose classes' dicts and Python functions' code are snapshotted too:
# what observers, drivers and the runner call (all of them would cost about 15 ms of CPU per cell).
CLASSES = (*OWN, "torch._tensor", "torch.nn", "torch.utils.data", "torch.optim", "torch.amp", "torch.autograd",
           "torch.serialization", "torch.multiprocessing", "pytorch_lightning.trainer", "pytorch_lightning.core",
           "lightning.pytorch.trainer", "lightning.pytorch.core", "lightning_fabric.utilities", "numpy",
           "json", "pickle", "copyreg", "pathlib", "tempfile", "subprocess", "multiprocessing", "concurrent.futures",
           "threading", "contextlib", "importlib", "_frozen_importlib", "_frozen_importlib_external", "io", "os")
TOP_CLASSES = ("torch", "lightning", "pytorch_lightning", "lightning_fabric")  # these modules themselves, not all below
# Packages observers import only when a check runs (after the snapshot): a cell's patch of them is not
# put back, so the scan of the answers flags it as it flags a patch of SCOPE.
OBSERVED_LATER = ("torchmetrics", "darts", "pandas")
# What the preloaded Python imports once: what every submission imports (the runner snapshots most of
# these), Lightning, which the lessons from 4 on import, and this worker. Importing more would only
# cost start-up time and address space.
PRELOAD = ("numpy", "torch", "torch.distributed", "pytorch_lightning", "gpucourse", "gpucourse.processes_threads",
           "gpucourse.checks", "gpucourse.checks.ddp", "autograders.worker.runner")


def import_course() -> None:
    """Import every module of ``gpucourse`` (what observers, drivers and judges may use), once."""
    import importlib
    import pkgutil

    import gpucourse

    for info in pkgutil.walk_packages(gpucourse.__path__, "gpucourse."):
        if info.name.rpartition(".")[2] != "__main__":
            try:
                importlib.import_module(info.name)
            except Exception:  # an optional dependency missing: that module cannot be used by anyone
                pass

"""Runnable reference implementations for the GPU & data-parallel course.

One module per lesson, named after the lesson (CONTRIBUTING.md); modules more than one lesson uses are named
for what they hold:

- ``gpucourse.preamble``: the setup every notebook runs first (seed, device, smoke setting).
- ``gpucourse.install``: what that setup installs where dependencies are missing (Colab), never torch.
- ``gpucourse.processes_threads``: lesson 1, processes, threads and the GIL.
- ``gpucourse.cpu_gpu_cuda`` and ``gpucourse.doctor``: lesson 2, CPU vs GPU, and CUDA (``python -m gpucourse doctor``).
- ``gpucourse.tensor_cores``: lesson 3, Tensor Cores.
- ``gpucourse.mixed_precision``: lesson 4, automatic mixed precision (autocast by hardware, recipes, CUDA graphs, loss scaling).
- ``gpucourse.cifar``: lesson 4's data (CIFAR-10 offline in its real format, the pl_bolts data module drop-in).
- ``gpucourse.mixed_precision_figures``: lesson 4's figures (lesson 5 plots beside the reference with them too).
- ``gpucourse.moving_data``: lesson 5, moving data.
- ``gpucourse.lightning_devices``: lesson 6, Lightning on many devices.
- ``gpucourse.ddp_scripts``: lesson 7, DDP by hand and as a script (``torchrun ... -m gpucourse.ddp_scripts``).
- ``gpucourse.tpus_xla``: lesson 8, TPUs and XLA (graph recompilation counted with ``torch.compile``).
- ``gpucourse.darts_forecasting`` and ``gpucourse.darts_ddp``: lesson 9, AirPassengers offline with Darts, and the
  ``ddp_spawn`` script (``python -m gpucourse.darts_ddp``).
- ``gpucourse.beyond_one_machine``: lesson 10, beyond one machine (SLURM and torchrun launches).
- ``gpucourse.local_slurm``: lesson 10, a real Slurm cluster of two emulated nodes on this machine (``make cluster``).
- ``gpucourse.requeue``: lesson 10 with lesson 16, a ``--requeue`` job whose node is drained resumes from its checkpoint.
- ``gpucourse.profiling``: lesson 11, profiling a training loop (``torch.profiler``, traces, timelines).
- ``gpucourse.memory``: lesson 12, where the memory goes (storages, saved activations, checkpointing figures).
- ``gpucourse.sharded_data_parallel``: lesson 13, sharded data parallel: ZeRO-1 by hand, ``ZeroRedundancyOptimizer``, FSDP2,
  tensor and pipeline parallelism (``torchrun ... -m gpucourse.sharded_data_parallel DEMO``).
- ``gpucourse.communication``: lesson 14, the cost of communication: collectives timed against message size, DDP and
  ZeRO step plans (``torchrun ... -m gpucourse.communication sweep|plans``).
- ``gpucourse.roofline``: lesson 15, roofline and launch overhead (measured roofs, kernels under them, the cost of
  one eager op).
- ``gpucourse.checkpoints``: lesson 16, checkpoints and restarts: ``torch.distributed.checkpoint`` with FSDP2, loading on
  another number of ranks, a rank restarted by ``torchrun --max-restarts`` (``torchrun ... -m gpucourse.checkpoints DEMO``).
- ``gpucourse.resumable_state``: lesson 16's ``Stateful`` objects (model and optimizer, a resumable sampler, per-rank RNG).
- ``gpucourse.fsdp2_in_practice``: lesson 17, FSDP2 in practice: mixed precision, ``reshard_after_forward``, prefetching,
  HSDP, meta-device init and gradient accumulation, measured (``torchrun ... -m gpucourse.fsdp2_in_practice DEMO``).
- ``gpucourse.model_parallel``: lesson 18, tensor, sequence and pipeline parallel: a transformer block split with
  ``parallelize_module`` (saved activations, collectives), ``torch.distributed.pipelining`` schedules timed
  (``torchrun ... -m gpucourse.model_parallel DEMO``).
- ``gpucourse.memory_and_mfu``: lesson 19, a transformer layer's memory and MFU: the layer Korthikanti et al. count,
  its saved tensors by shape, selective and full recomputation, live bytes after a forward, a small GPT to time.
- ``gpucourse.reference``: the measured GPU reference (H100) that GPU cells plot beside this machine's numbers.
- ``gpucourse.bench_gpu`` and ``gpucourse.bench_gpu_recording``: ``make bench-gpu``, a new GPU reference (what is
  measured, part by part; what each entry records and how).
- ``gpucourse.checks``: every exercise's public checks (``check("...")`` in the notebooks).
"""

from gpucourse.preamble import Setup, setup, smoke_mode

__version__ = "0.1.0"
__all__ = ["Setup", "setup", "smoke_mode", "__version__"]

# Lessons 1-16's helper modules before each took its lesson's name (2026-11-29). A notebook copied into a student's
# work/ folder before then imports the old name: it gets the module, and a warning naming the new one.
RENAMED = {"parallel": "processes_threads", "cuda": "cpu_gpu_cuda", "amp": "mixed_precision",
           "amp_figures": "mixed_precision_figures", "transfer": "moving_data", "xla": "tpus_xla",
           "forecasting": "darts_forecasting", "cluster": "beyond_one_machine", "sharding": "sharded_data_parallel",
           "comms": "communication", "resilience": "checkpoints"}


def __getattr__(name: str):
    """``from gpucourse import amp`` (an old name of RENAMED): the renamed module, with a FutureWarning."""
    if name not in RENAMED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    import warnings

    warnings.warn(f"gpucourse.{name} is now gpucourse.{RENAMED[name]}: change the import (this notebook predates "
                  f"the rename; course/ has the new one)", FutureWarning, stacklevel=2)
    return importlib.import_module(f"{__name__}.{RENAMED[name]}")

"""Lesson 12 (where the memory goes): measuring a training step's tensors, and drawing what they add up to.

Training memory has two parts. The *state* lives from one step to the next: the parameters, their
gradients, the optimizer's state. The *activations* live from a forward pass to its backward pass:
the tensors autograd saves to compute gradients. These helpers measure both on any device, by
storage (two tensors that share a storage, such as a view and its base or tied weights, are counted
once): ``storage_bytes`` and ``state_bytes`` for the state, ``SavedTensors`` (a
``torch.autograd.graph.saved_tensors_hooks`` recorder) for the activations. ``MasterWeightAdam`` is
the bf16 recipe's optimizer (bfloat16 parameters, float32 master copies), and ``build_stack`` the
block stacks the lesson checkpoints. The memory *model* that predicts these numbers, and the choice
of a checkpointing plan, are the lesson's exercises, not helpers; the figures take them as arguments.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

MIB = 2**20


def storage_key(t: torch.Tensor):
    """What identifies a tensor's storage: its device and address (``_cdata``, the storage object's own
    address, on the meta device, where every storage has address 0)."""
    s = t.untyped_storage()
    if t.device.type == "meta":
        return ("meta", s._cdata)
    return (str(t.device), s.data_ptr())


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (``untyped_storage().nbytes()``, each storage once)."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            seen[storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """Every tensor an optimizer keeps: its state (``exp_avg``, ``exp_avg_sq``, ``step``, momentum
    buffers, ...) and, for ``MasterWeightAdam``, the float32 master copies."""
    inner = optimizer.adam if isinstance(optimizer, MasterWeightAdam) else optimizer
    found = [v for state in inner.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    if isinstance(optimizer, MasterWeightAdam):
        found += optimizer.master
    return found


def state_bytes(model: nn.Module, optimizer) -> dict[str, int]:
    """Measured bytes of the training state, by storage: ``{"params", "grads", "optimizer"}``."""
    params = list(model.parameters())
    return {"params": storage_bytes(params),
            "grads": storage_bytes(p.grad for p in params if p.grad is not None),
            "optimizer": storage_bytes(optimizer_tensors(optimizer))}


class MasterWeightAdam:
    """Adam for a model held in bfloat16, with float32 master weights (the mixed-precision recipe of
    large-model training: DeepSpeed, Megatron, the Ultra-Scale Playbook's accounting).

    The model's parameters and gradients stay bfloat16; a float32 copy of each trainable parameter
    (the *master*) and Adam's float32 state live here. ``step()`` copies the gradients into the
    masters' ``.grad`` in float32, steps Adam on the masters, writes them back rounded to bfloat16,
    and frees the float32 gradients again (they exist only during ``step``)."""

    def __init__(self, params: Iterable[nn.Parameter], **adam_kwargs):
        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().to(torch.float32).clone().requires_grad_(True) for p in self.params]
        self.adam = torch.optim.Adam(self.master, **adam_kwargs)

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.to(torch.float32)
        self.adam.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m)
            m.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


class SavedTensors:
    """Records what autograd saves for backward while the ``with`` block runs (a
    ``saved_tensors_hooks`` pack hook sees each saved tensor once per save).

    ``bytes``: the distinct storages saved, each once, leaving out ``exclude`` (pass the model's
    parameters: they are state, counted already); ``by_dtype``: the same bytes split by dtype;
    ``saves``: how many times a tensor was saved (a storage saved twice counts twice there, once in
    ``bytes``). The hooks change nothing: the pack hook returns the tensor it gets."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self.excluded = {storage_key(t) for t in exclude}
        self.storages: dict = {}
        self.saves = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.saves += 1
        key = storage_key(t)
        if key not in self.excluded:
            self.storages[key] = (t.untyped_storage().nbytes(), t.dtype)
        return t

    def __enter__(self) -> "SavedTensors":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(n for n, _ in self.storages.values())

    @property
    def by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n, dtype in self.storages.values():
            name = str(dtype).removeprefix("torch.")
            out[name] = out.get(name, 0) + n
        return out


ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "tanh": nn.Tanh}  # GELU saves its input; ReLU and Tanh their output


def build_stack(widths: list[int], *, act: str = "gelu", norm: bool = False, seed: int = 0,
                dtype=torch.float32) -> nn.Sequential:
    """Blocks ``Linear(widths[i], widths[i + 1])`` + an activation (with ``norm``, a LayerNorm first): the
    kind of stack ``checkpoint_sequential`` takes, with blocks of different sizes when the widths differ."""
    if len(widths) < 2:
        raise ValueError("a stack needs at least two widths (one block)")
    torch.manual_seed(seed)
    blocks = []
    for w_in, w_out in zip(widths, widths[1:]):
        layers = ([nn.LayerNorm(w_in)] if norm else []) + [nn.Linear(w_in, w_out), ACTIVATIONS[act]()]
        blocks.append(nn.Sequential(*layers))
    return nn.Sequential(*blocks).to(dtype)


# --- figures -----------------------------------------------------------------------------------

def draw_state(predicted: dict[str, dict[str, int]], measured: dict[str, dict[str, int]], *, hardware: str,
               title: str = "Training state: predicted vs measured"):
    """Stacked bars per recipe: params, grads, optimizer state in MiB; predicted beside measured.
    ``predicted`` and ``measured`` map a recipe's name to ``{"params", "grads", "optimizer"}`` bytes."""
    import matplotlib.pyplot as plt
    import numpy as np

    recipes = list(predicted)
    if not recipes:
        raise ValueError("nothing to draw: no recipe")
    parts = ("params", "grads", "optimizer")
    colours = {"params": "tab:blue", "grads": "tab:orange", "optimizer": "tab:green"}
    fig, ax = plt.subplots(figsize=(9, 4), layout="constrained")
    x = np.arange(len(recipes))
    for offset, data, hatch, name in ((-0.2, predicted, "", "predicted"), (0.2, measured, "//", "measured")):
        bottom = np.zeros(len(recipes))
        for part in parts:
            values = np.array([data.get(r, {}).get(part, 0) / MIB for r in recipes])
            ax.bar(x + offset, values, 0.38, bottom=bottom, color=colours[part], hatch=hatch, edgecolor="white",
                   label=f"{part} ({name})")
            bottom += values
    ax.set_xticks(x, recipes)
    ax.set_xlabel("precision recipe (left bar: predicted, right bar: measured)")
    ax.set_ylabel("bytes (MiB)")
    ax.set_title(f"{title}\nmeasured on {hardware}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def draw_per_rank(per_rank: Callable[[int, int], float], world_sizes: list[int], *, stages=(0, 1, 2, 3),
                  title: str, note: str = "computed from the memory model, not measured"):
    """Bytes per rank (GiB) against the number of ranks, one line per ZeRO stage (0 = DDP).
    ``per_rank(stage, world_size)`` returns the bytes of one rank."""
    import matplotlib.pyplot as plt

    if not world_sizes:
        raise ValueError("nothing to draw: no world sizes")
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    names = {0: "DDP (nothing sharded)", 1: "ZeRO-1 (optimizer state)", 2: "ZeRO-2 (+ gradients)",
             3: "ZeRO-3 (+ parameters)"}
    for stage in stages:
        ax.plot(world_sizes, [per_rank(stage, n) / 2**30 for n in world_sizes], marker="o", label=names.get(stage, f"stage {stage}"))
    ax.set_xscale("log", base=2)
    ax.set_xticks(world_sizes, [str(n) for n in world_sizes])
    ax.set_xlabel("ranks (data-parallel world size)")
    ax.set_ylabel("training state per rank (GiB)")
    ax.set_title(f"{title}\n{note}", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def draw_checkpointing(segments: list[int], saved_bytes: list[int], step_ms: list[float], *, hardware: str,
                       title: str = "Activation checkpointing: memory for compute"):
    """Two panels against the number of segments: saved-activation bytes (MiB) and the training step's
    time (ms), both measured on ``hardware``."""
    import matplotlib.pyplot as plt

    if not segments or not len(segments) == len(saved_bytes) == len(step_ms):
        raise ValueError("segments, saved_bytes and step_ms must be non-empty and of the same length")
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    left.bar([str(s) for s in segments], [b / MIB for b in saved_bytes], color="tab:green")
    left.set_xlabel("segments (1 = no checkpointing)")
    left.set_ylabel("saved activations (MiB)")
    right.plot([str(s) for s in segments], step_ms, marker="o", color="tab:red")
    right.set_xlabel("segments (1 = no checkpointing)")
    right.set_ylabel("training step (ms)")
    right.set_ylim(bottom=0)
    fig.suptitle(f"{title}\nmeasured on {hardware}", fontsize=10)
    return fig

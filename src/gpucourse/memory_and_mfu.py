"""Lesson 19 (a transformer layer's memory, the caching allocator, and MFU): a GPT-style layer whose
saved activations can be counted tensor by tensor, recomputed in part or in full, and timed.

``TransformerLayer`` is the layer Korthikanti et al. ("Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198) count: LayerNorm, one QKV projection, attention written out
(scores, softmax, dropout, scores times values), an output projection and dropout, a residual; then
LayerNorm, an MLP of width 4h with GeLU, dropout, a residual. Written out so that every tensor the
paper counts exists as a tensor here (``attention="sdpa"`` swaps the core for PyTorch's fused
``scaled_dot_product_attention``, which keeps no s x s tensor). ``recompute`` picks what the backward
pass recomputes: nothing, the attention core only (selective), the whole layer (full), or the layer
under a ``torch.utils.checkpoint`` policy that saves matmul outputs and recomputes the rest.

``saved_by_shape`` groups what autograd saves (lesson 12's ``SavedTensors`` hooks) by shape and dtype,
so each term of the paper's sum can be found; ``live_bytes`` counts every storage made during a forward
pass that is still alive after it, whatever keeps it (autograd, or a checkpoint policy's own cache).
``TinyGPT`` is the small model the lesson times for MFU. The memory formula and the MFU arithmetic
are the lesson's exercises, not helpers.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Iterable

import torch
from torch import nn
from torch.nn import functional as F

RECOMPUTE = ("none", "selective", "full", "policy")

# The H100's peak is not measured by this course in bfloat16 at full size: NVIDIA's figure, labelled so.
H100_SXM_BF16_DENSE_SPEC = {
    "flops": 989.4e12,
    "status": "vendor spec, not measured by this course",
    "source": "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM, BF16 Tensor Core 1,979 TFLOPS with sparsity, "
              "half of it (989.4) dense",
}
# The H200 is the H100's GH100 die with more and faster memory: the same Tensor Core figure.
H200_SXM_BF16_DENSE_SPEC = {
    **H100_SXM_BF16_DENSE_SPEC,
    "source": "NVIDIA H200 Tensor Core GPU product page: H200 SXM, BF16 Tensor Core 1,979 TFLOPS with sparsity, "
              "half of it (989.4) dense",
}
# By a reference's short name (gpucourse.reference): a GPU's measured matmul is set against its own vendor figure.
BF16_DENSE_SPECS = {"H100": H100_SXM_BF16_DENSE_SPEC, "H200": H200_SXM_BF16_DENSE_SPEC}


def core_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, training: bool,
                   causal: torch.Tensor) -> torch.Tensor:
    """Attention written out on (b, a, s, d) tensors: the s x s scores, masked, softmax, dropout, times v.
    The part selective recomputation recomputes: its tensors grow with s^2."""
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(causal, float("-inf"))
    probs = F.dropout(torch.softmax(scores, dim=-1), dropout, training)
    return torch.matmul(probs, v)


def _save_matmuls(ctx, op, *args, **kwargs):
    """A ``create_selective_checkpoint_contexts`` policy: keep every matmul's output, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    matmuls = (torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default)
    return CheckpointPolicy.MUST_SAVE if op in matmuls else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpoint_takes(name: str) -> bool:
    import inspect

    from torch.utils.checkpoint import checkpoint

    return name in inspect.signature(checkpoint).parameters


# Whether checkpoint() can route the tensors a selective-checkpoint policy keeps through saved_tensors_hooks
# (pytorch/pytorch#190581, July 2026: torch 2.14.1 has it, 2.10 does not; there those tensors bypass the hooks).
_CHECKPOINT_RESPECTS_HOOKS = _checkpoint_takes("respect_saved_tensors_hooks")


class TransformerLayer(nn.Module):
    """One pre-LayerNorm GPT layer of width ``hidden`` with ``heads`` heads (Megatron's layout: a fused
    QKV projection, an MLP of 4 x hidden with GeLU, dropout after attention's softmax and after each of
    the two blocks). ``recompute``: ``"none"``, ``"selective"`` (the attention core under
    ``torch.utils.checkpoint``), ``"full"`` (the whole layer under it) or ``"policy"`` (the whole layer
    under it with a selective-checkpoint policy that saves matmul outputs). ``attention``: ``"explicit"``
    or ``"sdpa"`` (``F.scaled_dot_product_attention``, causal)."""

    def __init__(self, hidden: int, heads: int, dropout: float = 0.1, recompute: str = "none",
                 attention: str = "explicit", max_seq: int = 2048):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}, not {recompute!r}")
        if attention not in ("explicit", "sdpa"):
            raise ValueError(f"attention must be 'explicit' or 'sdpa', not {attention!r}")
        self.heads, self.dropout, self.recompute, self.attention = heads, dropout, recompute, attention
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
        # a buffer, not an activation: one bool per (query, key) pair, shared by every layer call
        self.register_buffer("causal", torch.ones(max_seq, max_seq, dtype=torch.bool).triu(1), persistent=False)

    def _attend(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        if self.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                                 is_causal=True)
        elif self.recompute == "selective":
            from torch.utils.checkpoint import checkpoint

            out = checkpoint(core_attention, q, k, v, self.dropout, self.training, self.causal[:s, :s],
                             use_reentrant=False)
        else:
            out = core_attention(q, k, v, self.dropout, self.training, self.causal[:s, :s])
        return self.proj(out.transpose(1, 2).reshape(b, s, h))

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        x = x + F.dropout(self._attend(self.ln1(x)), self.dropout, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.dropout, self.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute in ("full", "policy"):
            from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

            context = {}
            if self.recompute == "policy":
                context["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _save_matmuls)
            if _CHECKPOINT_RESPECTS_HOOKS:  # new (pytorch/pytorch#190581): 2.14.1 has it, 2.10 would pass it to _layer
                context["respect_saved_tensors_hooks"] = True
            return checkpoint(self._layer, x, use_reentrant=False, **context)
        return self._layer(x)


class TinyGPT(nn.Module):
    """A small GPT: token and position embeddings, ``layers`` ``TransformerLayer``s, a final LayerNorm and
    an output projection tied to the token embedding (so its parameters are counted once)."""

    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, seq_len: int, dropout: float = 0.0,
                 recompute: str = "none", attention: str = "explicit"):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, hidden), nn.Embedding(seq_len, hidden)
        self.layers = nn.ModuleList(TransformerLayer(hidden, heads, dropout, recompute, attention, seq_len)
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) @ self.tokens.weight.T  # logits: the tied output projection


def saved_by_shape(run: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> list[dict]:
    """What autograd saves while ``run()`` executes, each storage once (lesson 12's ``SavedTensors``),
    grouped by shape and dtype: ``[{"shape", "dtype", "count", "bytes"}]``, largest first. Pass the
    parameters (and buffers) as ``exclude``: they are state, not activations."""
    from gpucourse.memory import storage_key

    excluded = {storage_key(t) for t in exclude}
    seen: dict = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in excluded and key not in seen:
            seen[key] = (tuple(t.shape), str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    groups: dict = {}
    for shape, dtype, nbytes in seen.values():
        row = groups.setdefault((shape, dtype), {"shape": shape, "dtype": dtype, "count": 0, "bytes": 0})
        row["count"] += 1
        row["bytes"] += nbytes
    return sorted(groups.values(), key=lambda r: -r["bytes"])


def live_bytes(run: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the storages created while ``run()`` executes that are still alive once it has returned
    (and its result dropped), each once: what a forward pass leaves behind for the backward pass,
    whoever holds it (autograd's saved tensors, or a selective-checkpoint policy's cache, which
    ``saved_tensors_hooks`` does not see). Watched with a ``TorchDispatchMode`` that keeps a weak
    reference to every output's storage. ``run`` must return what must stay alive (a loss, whose graph
    holds the activations); its own storage is not counted."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode

    from gpucourse.memory import storage_key

    created: dict = {}

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    key = storage_key(t)  # an address freed and reused is a new storage
                    if key not in created or created[key][0].expired():
                        created[key] = (StorageWeakRef(t.untyped_storage()), t.untyped_storage().nbytes())
            return out

    with Watch():
        result = run()
    skip = {storage_key(t) for t in exclude} | ({storage_key(result)} if isinstance(result, torch.Tensor) else set())
    total = sum(n for key, (ref, n) in created.items() if key not in skip and not ref.expired())
    del result
    return total


def draw_recompute(modes: list[str], saved_bytes: list[int], step_ms: list[float], *, hardware: str,
                   title: str, note: str = ""):
    """Two bar panels, one bar per recompute mode: the bytes kept for backward (MiB) and the time of a
    training step (ms). Returns the ``Figure``."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.bar(modes, [b / 2**20 for b in saved_bytes], color="tab:blue")
    left.set_ylabel("kept for backward (MiB)")
    right.bar(modes, step_ms, color="tab:orange")
    right.set_ylabel("training step, forward + backward (ms)")
    for ax in (left, right):
        ax.set_xlabel("what the backward pass recomputes")
    fig.suptitle(f"{title}\n{hardware}", fontsize=10)
    if note:
        fig.text(0.5, -0.02, note, ha="center", va="top", fontsize=8, wrap=True)
    fig.tight_layout()
    return fig

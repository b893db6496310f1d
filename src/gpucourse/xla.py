"""Lesson 8 (TPUs and XLA): recompilations and host reads, measured with ``torch.compile`` on any machine.

XLA compiles one program per distinct set of input shapes, and reading a value back to the host
(``.item()``, ``print(t)``, ``if t > 0:``) forces the lazily recorded graph to run and waits for it.
Neither effect needs a TPU to be seen: ``torch.compile(..., dynamic=False)`` also builds one graph per
new shape, so a backend that counts the graphs it receives measures the recompilations a TPU would do,
and :func:`count_host_reads` counts the reads that would each stall one.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn


class CountingBackend:
    """A ``torch.compile`` backend that counts the graphs dynamo hands it and runs them unchanged.

    Returning ``gm.forward`` skips code generation (no C compiler needed), so what is measured is
    dynamo's tracing and guarding: the part that repeats for every new shape, as XLA's compiles do.
    """

    def __init__(self) -> None:
        self.graphs = 0
        self.input_shapes: list[list[tuple[int, ...]]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs += 1
        self.input_shapes.append([tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)])
        return gm.forward


@dataclass
class CompileRun:
    """What :func:`run_compiled` measured: graphs built, total seconds, and seconds per call."""

    graphs: int
    seconds: float
    step_seconds: list[float] = field(default_factory=list)
    input_shapes: list = field(default_factory=list)


def run_compiled(fn: Callable, calls: Sequence[tuple], dynamic: bool | None = False,
                 recompile_limit: int = 256) -> CompileRun:
    """Compile ``fn`` with a :class:`CountingBackend` and call it with each argument tuple in ``calls``.

    Starts from an empty compile cache (``torch._dynamo.reset()``) and empties it again afterwards, so
    runs do not see each other's graphs. ``recompile_limit`` is raised for the run only: dynamo's
    default (8 graphs per function) would otherwise stop compiling and quietly run the rest eagerly,
    which hides exactly the growth we want to see.
    """
    torch._dynamo.reset()
    backend = CountingBackend()
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    step_seconds = []
    try:
        with torch._dynamo.config.patch(recompile_limit=recompile_limit):
            for args in calls:
                start = time.perf_counter()
                compiled(*args)
                step_seconds.append(time.perf_counter() - start)
    finally:
        torch._dynamo.reset()
    return CompileRun(backend.graphs, sum(step_seconds), step_seconds, backend.input_shapes)


def token_batches(n_batches: int, batch_size: int, lengths: Sequence[int], vocab: int = 100,
                  seed: int = 0) -> list[list[torch.Tensor]]:
    """``n_batches`` lists of ``batch_size`` 1-D int64 token tensors; lengths drawn from ``lengths``.

    The longest sequence of batch ``i`` has length ``lengths[i % len(lengths)]`` (the others are
    shorter), so a batch padded to its longest sequence has exactly that many columns.
    """
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for i in range(n_batches):
        longest = int(lengths[i % len(lengths)])
        sizes = [longest] + [int(torch.randint(1, longest + 1, (1,), generator=generator)) for _ in range(batch_size - 1)]
        batches.append([torch.randint(1, vocab, (n,), generator=generator) for n in sizes])
    return batches


def pad_to_longest(batch: Sequence[torch.Tensor], pad_value: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D sequences to the longest one: ``(padded, mask)``, mask True on real tokens.

    The usual GPU recipe; its width changes with every batch, so on XLA every new width compiles again.
    """
    padded = nn.utils.rnn.pad_sequence(list(batch), batch_first=True, padding_value=pad_value)
    lengths = torch.tensor([len(seq) for seq in batch])
    mask = torch.arange(padded.shape[1]) < lengths[:, None]
    return padded, mask


class TinyEncoder(nn.Module):
    """Embedding, one tanh layer, masked mean over positions, a linear head: a text classifier's shape.

    The masked mean ignores padding, so padding a batch more never changes its result.
    """

    def __init__(self, vocab: int = 100, dim: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.hidden(self.embed(tokens)))
        weights = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * weights).sum(1) / weights.sum(1).clamp(min=1)
        return self.head(pooled)


# Every Tensor method that copies values to the host. On XLA each forces the pending graph to run and
# waits for it; on a CPU nothing waits, so they are counted instead of timed.
_HOST_READS = ("item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__",
               "__array__", "__format__", "__repr__")


@dataclass
class HostReads:
    """Host reads seen inside :func:`count_host_reads`: how many, and through which methods."""

    count: int = 0
    methods: list[str] = field(default_factory=list)


def _is_cpu(value: Any) -> bool:
    return (isinstance(value, str) and value.split(":")[0] == "cpu") or (
        isinstance(value, torch.device) and value.type == "cpu")


@contextlib.contextmanager
def count_host_reads() -> Iterator[HostReads]:
    """Count reads of tensor values by Python code (``.item()``, ``float(t)``, ``print(t)``, ``if t:``...).

    ``.to("cpu")`` and ``.cpu()`` count too: on an accelerator they are the same wait. A read made
    while handling another (``format`` calling ``item``) counts once. Not thread-safe: patches
    ``torch.Tensor`` for the duration of the block.
    """
    reads = HostReads()
    state = threading.local()
    originals = {name: getattr(torch.Tensor, name) for name in _HOST_READS + ("to",)}

    def counted(name: str, method: Callable) -> Callable:
        def wrapper(self, *args, **kwargs):
            if name == "to" and not any(_is_cpu(a) for a in (*args, kwargs.get("device"))):
                return method(self, *args, **kwargs)
            outermost = not getattr(state, "inside", False)
            if outermost:
                reads.count += 1
                reads.methods.append(name)
                state.inside = True
            try:
                return method(self, *args, **kwargs)
            finally:
                if outermost:
                    state.inside = False
        return wrapper

    for name, method in originals.items():
        setattr(torch.Tensor, name, counted(name, method))
    try:
        yield reads
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


def logged_losses_every_step(step: Callable, batches: Sequence) -> list[float]:
    """The habit the TPU guide warns about: ``loss.item()`` after every step (one host read per step)."""
    return [step(batch).item() for batch in batches]

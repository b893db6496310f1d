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


def draw_tpu_topology(hosts: int = 4, chips_per_host: int = 4, cores_per_chip: int = 2,
                      name: str = "e.g. a v3-32 slice") -> Any:
    """Draw TensorCores on chips, chips on a host, and hosts joined by ICI into a pod slice.

    The defaults are one example, the v3 generation (2 TensorCores per chip, 4 chips per host, so a
    "v3-8" is one host and a "v3-32" four); other generations differ (one TensorCore per chip on
    v5e and v6e, for one): read the generation's page. Returns the matplotlib Figure: left, one host
    with its chips and cores; right, the slice, one box per host.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Rectangle

    def n(count: int, word: str) -> str:  # "1 chip", "4 chips"
        return f"{count} {word}" + ("" if count == 1 else "s")

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [1.1, 1]})
    # left: one host (the TPU VM): CPU and RAM, and its chips, each with TensorCores and HBM
    left.add_patch(FancyBboxPatch((0, 0), 10, 10, boxstyle="round,pad=0.1", fc="#eeeeee", ec="black"))
    left.text(0.3, 9.4, "host (TPU VM): CPU, RAM, disk; runs your script", fontsize=8, va="center")
    cols = 2 if chips_per_host > 1 else 1
    rows = -(-chips_per_host // cols)
    width, height = 9.0 / cols, 8.2 / rows
    for chip in range(chips_per_host):
        r, c = divmod(chip, cols)
        x, y = 0.5 + c * width, 8.6 - (r + 1) * height
        left.add_patch(Rectangle((x + 0.1, y + 0.1), width - 0.2, height - 0.2, fc="#cfe2f3", ec="black"))
        left.text(x + 0.3, y + height - 0.45, f"chip {chip}  (HBM)", fontsize=8)
        core_w = (width - 0.6) / cores_per_chip
        for core in range(cores_per_chip):
            left.add_patch(Rectangle((x + 0.3 + core * core_w, y + 0.3), core_w - 0.15, height - 1.1,
                                     fc="#f9cb9c", ec="black"))
            left.text(x + 0.3 + core * core_w + (core_w - 0.15) / 2, y + 0.3 + (height - 1.1) / 2,
                      f"core\n{chip * cores_per_chip + core}", ha="center", va="center", fontsize=7)
    left.set_xlim(-0.3, 10.3); left.set_ylim(-0.3, 10.3); left.set_aspect("equal"); left.axis("off")
    left.set_title(f"one host: {n(chips_per_host, 'chip')} × {n(cores_per_chip, 'TensorCore')} = "
                   f"{n(chips_per_host * cores_per_chip, 'core')}", fontsize=9)
    # right: the slice, hosts side by side, every chip linked to its neighbours by ICI
    per_row = 2 if hosts > 1 else 1
    host_rows = -(-hosts // per_row)
    for host in range(hosts):
        r, c = divmod(host, per_row)
        x, y = c * 5.2, (host_rows - 1 - r) * 5.2
        right.add_patch(FancyBboxPatch((x, y), 4.4, 4.4, boxstyle="round,pad=0.1", fc="#eeeeee", ec="black"))
        right.text(x + 2.2, y + 4.0, f"host {host}", ha="center", fontsize=8)
        for chip in range(chips_per_host):
            cr, cc = divmod(chip, cols)
            right.add_patch(Rectangle((x + 0.4 + cc * 1.9, y + 2.6 - cr * 1.3), 1.6, 1.0, fc="#cfe2f3", ec="black"))
    centre = {h: ((h % per_row) * 5.2 + 2.2, (host_rows - 1 - h // per_row) * 5.2 + 2.2) for h in range(hosts)}
    for host in range(hosts):  # ICI links between neighbouring hosts' chips (right and below)
        for other in (host + 1 if (host + 1) % per_row else None, host + per_row):
            if other is not None and other < hosts:
                right.annotate("", xy=centre[other], xytext=centre[host],
                               arrowprops=dict(arrowstyle="<->", color="tab:red", lw=1.5))
    right.text(0, -0.8, "red: inter-chip interconnect (ICI); each host runs the same script", fontsize=8, color="tab:red")
    right.set_xlim(-0.5, per_row * 5.2); right.set_ylim(-1.2, host_rows * 5.2); right.set_aspect("equal"); right.axis("off")
    right.set_title(f"{name}: {n(hosts, 'host')} × {n(chips_per_host, 'chip')} = {n(hosts * chips_per_host, 'chip')}, "
                    f"{n(hosts * chips_per_host * cores_per_chip, 'TensorCore')}", fontsize=9)
    fig.suptitle("TPU: TensorCores, chips, hosts and a pod slice (numbers are one example)")
    fig.tight_layout()
    return fig


def plot_recompilation(distinct: Sequence[int], runs: dict[str, Sequence[CompileRun]], n_batches: int,
                       hardware: str) -> Any:
    """Lesson 8's chart: graphs compiled and run time against the number of distinct lengths, one
    line per padding recipe (``runs``: label -> one CompileRun per entry of ``distinct``). A recipe
    with no runs yet (an exercise not answered) is left out and named under the title. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.9))
    missing = [label for label, found in runs.items() if not found]
    for label, found in runs.items():
        if found:
            left.plot(distinct[:len(found)], [r.graphs for r in found], "o-", label=label)
            right.plot(distinct[:len(found)], [r.seconds for r in found], "o-", label=label)
    left.set_ylabel("graphs compiled (count)")
    right.set_ylabel(f"wall time for {n_batches} batches (s)")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(distinct), [str(k) for k in distinct])
        ax.minorticks_off()
        ax.set_xlabel("distinct sequence lengths in the data (count)")
    left.set_title("recompilations (torch.compile, dynamic=False)", fontsize=10)
    right.set_title("time, tracing included", fontsize=10)
    if any(runs.values()):
        left.legend(fontsize=8)
    title = f"Padding and recompilation, measured on {hardware}"
    if missing:
        title += "\n(not measured yet: " + ", ".join(missing) + ")"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig

"""Lesson 4 (automatic mixed precision): CIFAR-10 offline, a pl_bolts-compatible data module, measurements.

``pl_bolts`` (lightning-bolts) is unmaintained and does not import with Lightning 2.x, so
``CIFAR10DataModule`` here is a drop-in with its constructor, built on ``LightningDataModule`` and
torchvision's real ``CIFAR10``. Without a network (CI, many lab machines), ``write_cifar10`` writes a
small CIFAR-10 in the dataset's real on-disk format (pickled batches of uint8 rows in
``cifar-10-batches-py/``) plus a manifest of its md5 sums; ``OfflineCIFAR10`` is torchvision's class
pointed at that manifest, so torchvision's own parsing and integrity checks read it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpucourse import environment

BASE_FOLDER = "cifar-10-batches-py"
MANIFEST = "gpucourse-manifest.json"
LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
OFFLINE_ENV = environment.OFFLINE  # set by `make test` and the grader: never try the network


def write_cifar10(root: str | os.PathLike, per_batch: int = 100, test: int = 100, seed: int = 0) -> Path:
    """A CIFAR-10 of ``5 * per_batch`` training and ``test`` test images, in the real file format.

    Each class gets its own mean colour plus noise, so a model can learn something in a few steps.
    """
    if per_batch < 1 or test < 1:
        raise ValueError("per_batch and test must be at least 1")
    folder = Path(root) / BASE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    colours = torch.randint(40, 216, (10, 3), generator=generator)

    def batch(n: int, label: str) -> dict:
        labels = torch.randint(0, 10, (n,), generator=generator)
        noise = torch.randint(-40, 41, (n, 3, 32 * 32), generator=generator)
        images = (colours[labels][:, :, None] + noise).clamp(0, 255).to(torch.uint8).reshape(n, 3072)
        return {"batch_label": label, "labels": labels.tolist(), "data": images.numpy(),
                "filenames": [f"generated_{label.replace(' ', '_')}_{i}.png" for i in range(n)]}

    files = {f"data_batch_{i}": batch(per_batch, f"training batch {i} of 5") for i in range(1, 6)}
    files["test_batch"] = batch(test, "testing batch 1 of 1")
    files["batches.meta"] = {"label_names": LABELS, "num_cases_per_batch": per_batch, "num_vis": 3072}
    digests = {}
    for name, content in files.items():
        with open(folder / name, "wb") as handle:
            pickle.dump(content, handle, protocol=2)
        digests[name] = hashlib.md5((folder / name).read_bytes()).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(digests, indent=1))
    return folder


def _torchvision_cifar10():
    from torchvision.datasets import CIFAR10

    class OfflineCIFAR10(CIFAR10):
        """torchvision's CIFAR10; for a generated copy, its md5 list comes from the copy's manifest."""

        def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
            manifest = Path(root) / BASE_FOLDER / MANIFEST
            if manifest.is_file():
                digests = json.loads(manifest.read_text())
                self.train_list = [[f"data_batch_{i}", digests[f"data_batch_{i}"]] for i in range(1, 6)]
                self.test_list = [["test_batch", digests["test_batch"]]]
                self.meta = {"filename": "batches.meta", "key": "label_names", "md5": digests["batches.meta"]}
                download = False
            super().__init__(root, train=train, transform=transform, target_transform=target_transform, download=download)

    return OfflineCIFAR10


def OfflineCIFAR10(*args: Any, **kwargs: Any):  # noqa: N802 - a class, built lazily (torchvision is slow to import)
    return _torchvision_cifar10()(*args, **kwargs)


CIFAR10_TRAIN_IMAGES = 50_000  # the real training set, which pl_bolts' integer val_split (5000 by default) counts in


def validation_size(val_split: int | float, images: int, generated: bool) -> int:
    """How many of ``images`` training images ``val_split`` holds out, as pl_bolts' data module does.

    A float is a fraction and an int a count, exactly as in pl_bolts on the real 50,000 images (a count
    that leaves no training data is an error there, and here). On a small generated copy an int counts
    images of the real set, so it is scaled to the same fraction (5000 -> 10%: 50 of 500 images) and one
    line says so: code written for the real dataset runs unchanged offline.
    """
    if isinstance(val_split, float):
        if not 0 <= val_split < 1:
            raise ValueError(f"val_split={val_split} must be a fraction in [0, 1) or a number of images")
        return int(val_split * images)
    if generated and images < CIFAR10_TRAIN_IMAGES and val_split > 0:
        n_val = min(max(1, round(val_split * images / CIFAR10_TRAIN_IMAGES)), images - 1)
        print(f"val_split={val_split} counts images of CIFAR-10's {CIFAR10_TRAIN_IMAGES:,} training images; this "
              f"generated copy has {images}, so {n_val} ({100 * n_val / images:.0f}%) are held out for validation.")
        return n_val
    if not 0 <= val_split < images:
        raise ValueError(f"val_split={val_split} leaves no training data out of {images} images")
    return val_split


def _data_module_class():
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, random_split
    from torchvision import transforms

    class CIFAR10DataModule(pl.LightningDataModule):
        """Drop-in for ``pl_bolts.datamodules.CIFAR10DataModule``: same constructor and loaders.

        ``prepare_data`` (once, on one process) downloads CIFAR-10 when allowed and possible, and
        otherwise writes a small generated copy; ``setup`` (on every process) builds the datasets.
        """

        name, num_classes, dims = "cifar10", 10, (3, 32, 32)

        def __init__(self, data_dir: str | None = None, val_split: int | float = 5000, num_workers: int = 0,
                     normalize: bool = False, batch_size: int = 32, seed: int = 42, shuffle: bool = True,
                     pin_memory: bool = True, drop_last: bool = False, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            self.data_dir = data_dir or os.getcwd()
            self.val_split, self.num_workers, self.normalize = val_split, num_workers, normalize
            self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
            self.pin_memory, self.drop_last = pin_memory and torch.cuda.is_available(), drop_last
            self.generated = False

        def prepare_data(self) -> None:
            folder = Path(self.data_dir) / BASE_FOLDER
            if folder.is_dir():
                return
            if not environment.offline():
                try:
                    from torchvision.datasets import CIFAR10
                    CIFAR10(self.data_dir, train=True, download=True)
                    CIFAR10(self.data_dir, train=False, download=True)
                    return
                except Exception as error:  # no network: fall back to the generated copy
                    print(f"CIFAR-10 could not be downloaded ({type(error).__name__}); writing a small generated copy.")
            write_cifar10(self.data_dir)

        def _transform(self):
            steps = [transforms.ToTensor()]
            if self.normalize:
                steps.append(transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)))
            return transforms.Compose(steps)

        def setup(self, stage: str | None = None) -> None:
            self.generated = (Path(self.data_dir) / BASE_FOLDER / MANIFEST).is_file()
            full = OfflineCIFAR10(self.data_dir, train=True, transform=self._transform())
            n_val = validation_size(self.val_split, len(full), self.generated)
            generator = torch.Generator().manual_seed(self.seed)
            self.dataset_train, self.dataset_val = random_split(full, [len(full) - n_val, n_val], generator=generator)
            self.dataset_test = OfflineCIFAR10(self.data_dir, train=False, transform=self._transform())

        def _loader(self, dataset, shuffle: bool):
            return DataLoader(dataset, batch_size=self.batch_size, shuffle=shuffle, num_workers=self.num_workers,
                              drop_last=self.drop_last, pin_memory=self.pin_memory)

        def train_dataloader(self):
            return self._loader(self.dataset_train, self.shuffle)

        def val_dataloader(self):
            return self._loader(self.dataset_val, False)

        def test_dataloader(self):
            return self._loader(self.dataset_test, False)

    return CIFAR10DataModule


def CIFAR10DataModule(*args: Any, **kwargs: Any):  # noqa: N802 - see OfflineCIFAR10
    return _data_module_class()(*args, **kwargs)


FORMATS = {  # bits: sign, exponent, mantissa; and what they mean
    "float32": (1, 8, 23),
    "float16": (1, 5, 10),
    "bfloat16": (1, 8, 7),
}


def format_table() -> list[dict]:
    """Range and precision of float32, float16 and bfloat16, from torch.finfo."""
    rows = []
    for name, (sign, exponent, mantissa) in FORMATS.items():
        info = torch.finfo(getattr(torch, name))
        rows.append({"dtype": name, "exponent_bits": exponent, "mantissa_bits": mantissa, "max": info.max,
                     "smallest_normal": info.tiny, "epsilon": info.eps})
    return rows


def autocast_dtypes(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> dict[str, str]:
    """The output dtype of common operations on float32 inputs under autocast on ``device_type``."""
    x = torch.randn(8, 8, device=device_type)
    target = torch.randint(0, 8, (8,), device=device_type)
    linear = nn.Linear(8, 8).to(device_type)
    conv = nn.Conv2d(1, 1, 3).to(device_type)
    with torch.autocast(device_type, dtype=dtype):
        ops = {
            "matmul (x @ x)": x @ x,
            "nn.Linear": linear(x),
            "nn.Conv2d": conv(x[None, None]),
            "relu": torch.relu(x),
            "softmax": torch.softmax(x, -1),
            "layer_norm": nn.functional.layer_norm(x, (8,)),
            "cross_entropy": nn.functional.cross_entropy(x, target),
            "x + x": x + x,
        }
    return {name: str(out.dtype).removeprefix("torch.") for name, out in ops.items()}


@dataclass(frozen=True)
class AutocastChoice:
    """What autocast should use on a device: ``dtype``, whether the hardware computes in it natively
    (``native``: autocast pays off; otherwise it is emulated and slower than float32) and why, in words."""

    device_type: str
    dtype: torch.dtype
    native: bool
    reason: str

    @property
    def needs_scaler(self) -> bool:
        """float16 needs a GradScaler against underflow; bfloat16 has float32's range and does not."""
        return self.dtype == torch.float16


def cpu_has_native_bfloat16() -> bool:
    """Whether this CPU has bfloat16 instructions (AVX-512 BF16 or AMX); without them torch emulates bfloat16."""
    probes = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    return any(bool(probe()) for probe in probes if probe is not None)


def autocast_choice(device: torch.device | str, prefer: torch.dtype | None = None) -> AutocastChoice:
    """The autocast dtype for ``device`` on this hardware, and whether it is worth using.

    CUDA: bfloat16 wherever the GPU computes it natively (``torch.cuda.is_bf16_supported``: Ampere,
    compute capability 8.0, and newer), with no GradScaler: it has float32's range, so gradients do not
    underflow, and on those GPUs it runs on the same Tensor Cores as float16. float16 with a GradScaler
    only where bfloat16 is absent (Volta, Turing), or when asked for (``prefer=torch.float16``).
    MPS: float16. CPU: bfloat16, native only with AVX-512 BF16 or AMX; on other CPUs every bfloat16
    operation is emulated, so autocast is slower than float32 there and worth running only at a
    demonstration size.
    """
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        major, minor = torch.cuda.get_device_capability(device)
        where = f"{name} (compute capability {major}.{minor})"
        bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        if bf16 and prefer != torch.float16:
            return AutocastChoice("cuda", torch.bfloat16, True,
                                  f"autocast to bfloat16 on {where}: native on its Tensor Cores, float32's range, "
                                  "so no GradScaler is needed.")
        tensor_cores = major >= 7
        why = ("float16 as asked; bfloat16 is native here too and would need no scaler" if bf16 else
               "no native bfloat16 on this GPU (it starts at compute capability 8.0)")
        return AutocastChoice("cuda", torch.float16, tensor_cores,
                              f"autocast to float16 with a GradScaler on {where}: {why}; "
                              + ("Tensor Cores run float16." if tensor_cores else
                                 "no Tensor Cores either (they start at 7.0), so expect little speed-up."))
    if device.type == "mps":
        return AutocastChoice("mps", torch.float16, True, "autocast to float16 on the Apple GPU (MPS).")
    if device.type == "cpu":
        if cpu_has_native_bfloat16():
            return AutocastChoice("cpu", torch.bfloat16, True,
                                  "autocast to bfloat16 on this CPU: it has bfloat16 instructions (AVX-512 BF16 or AMX).")
        return AutocastChoice("cpu", torch.bfloat16, False,
                              "autocast to bfloat16 on this CPU is emulated (no AVX-512 BF16 or AMX instructions), "
                              "so it is slower than float32 here: autocast runs at a demonstration size only.")
    return AutocastChoice(device.type, torch.float32, False, f"no autocast on {device.type}: float32.")


def autocast_dtype(device: torch.device | str, prefer: torch.dtype | None = None) -> torch.dtype | None:
    """The dtype to autocast to on ``device``, or None where autocast would be slower than float32."""
    choice = autocast_choice(device, prefer)
    return choice.dtype if choice.native else None


def train_step_seconds(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype | None,
                       steps: int = 3) -> float:
    """Mean seconds of ``steps`` training steps (after two warm-up steps) in float32 (``dtype=None``) or
    under autocast to ``dtype``, timed by ``torch.utils.benchmark`` (gpucourse.timing)."""
    from gpucourse.timing import seconds_per_call

    device_type = images.device.type
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == torch.float16)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return seconds_per_call(step, calls=steps)


@contextmanager
def float32_precision(tf32: bool):
    """Run float32 matrix products and convolutions in TF32 (``tf32=True``) or in full float32 ("ieee"),
    then restore the previous settings (lesson 4). Today's switches are
    ``torch.backends.cuda.matmul.fp32_precision`` and ``torch.backends.cudnn.conv.fp32_precision``;
    ``allow_tf32`` is their deprecated spelling. cuDNN convolutions default to TF32, so a float32
    baseline has to ask for "ieee" explicitly (``gpucourse.tensor_cores.tf32`` sets both). No effect on a CPU."""
    from gpucourse.tensor_cores import tf32 as tf32_switches

    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True  # cuDNN picks its fastest kernel per shape, as training code does
    try:
        with tf32_switches(matmul=tf32, cudnn=tf32):
            yield
    finally:
        torch.backends.cudnn.benchmark = before


@dataclass(frozen=True)
class Recipe:
    """One way to run lesson 4's training step: TF32 for float32 work, autocast to a 16-bit dtype, and
    the channels-last memory format (lesson 5)."""

    name: str
    amp_dtype: torch.dtype | None = None
    tf32: bool = False
    channels_last: bool = False


def recipes(amp_dtype: torch.dtype) -> list[Recipe]:
    """Lesson 4's four recipes with autocast to ``amp_dtype``: float32, TF32, AMP, AMP + channels_last.

    On a CUDA GPU without TF32 (before compute capability 8.0: a T4) the second is float32 again,
    labelled so, since TF32 does not exist there; the list keeps its order and length."""
    short = str(amp_dtype).removeprefix("torch.")
    tf32 = Recipe("TF32", tf32=True)
    if torch.cuda.is_available():
        try:  # the capability asked directly: an older torch lacks is_tf32_supported
            major, minor = torch.cuda.get_device_capability()
        except RuntimeError:  # NVML sees a GPU that CUDA cannot start (a driver too old): no CUDA recipe runs
            major, minor = 8, 0
        if major < 8:
            tf32 = Recipe(f"float32 (no TF32 on compute capability {major}.{minor})")
    return [Recipe("float32"), tf32, Recipe(f"AMP {short}", amp_dtype),
            Recipe(f"AMP {short} + channels_last", amp_dtype, channels_last=True)]


@dataclass(frozen=True)
class StepTiming:
    """What :func:`time_recipe` measured: ms per training step and, on CUDA, the step's peak memory."""

    recipe: str
    batch: int
    image_size: int
    ms: float
    peak_mib: float | None
    hardware: str


def _resnet_step(recipe: Recipe, batch: int, image_size: int, device: torch.device | str, seed: int = 0):
    """A torchvision ResNet-18 (10 classes), SGD with momentum, a random batch, and one training step
    under ``recipe``: the model the lesson measures. Returns ``(step, model, optimizer)``."""
    import torchvision

    device = torch.device(device)
    torch.manual_seed(seed)
    fmt = torch.channels_last if recipe.channels_last else torch.contiguous_format
    model = torchvision.models.resnet18(num_classes=10).to(device=device, memory_format=fmt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(batch, 3, image_size, image_size, device=device).to(memory_format=fmt)
    labels = torch.randint(0, 10, (batch,), device=device)
    scaler = torch.amp.GradScaler(device.type, enabled=recipe.amp_dtype == torch.float16)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=recipe.amp_dtype or torch.float32, enabled=recipe.amp_dtype is not None):
            loss = nn.functional.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    return step, model, optimizer


def time_recipe(recipe: Recipe, batch: int, image_size: int, device: torch.device | str = "cpu",
                steps: int = 5) -> StepTiming:
    """Time ResNet-18's training step under ``recipe`` (lesson 4): the mean of ``steps`` steps after two
    warm-up steps (``torch.utils.benchmark``, which waits for the GPU), and on CUDA the peak memory
    (``torch.cuda.max_memory_allocated``: weights, optimizer state, activations, gradients, workspaces)."""
    from gpucourse.reference import this_machine
    from gpucourse.timing import seconds_per_call

    if batch < 1 or image_size < 32 or steps < 1:
        raise ValueError(f"batch ({batch}) and steps ({steps}) must be at least 1, image_size ({image_size}) at least 32")
    device = torch.device(device)
    cuda = device.type == "cuda"
    with float32_precision(recipe.tf32):
        step, _, _ = _resnet_step(recipe, batch, image_size, device)
        step()
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        seconds = seconds_per_call(step, calls=steps)
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
    return StepTiming(recipe.name, batch, image_size, 1000 * seconds, peak, this_machine(device))


def graphed_step_ms(recipe: Recipe, batch: int, image_size: int = 32, replays: int = 20) -> dict[str, float]:
    """ms per training step of ResNet-18 run eagerly and as one CUDA graph (lesson 4, needs CUDA).

    The whole step (forward, backward, optimizer) is captured once with ``torch.cuda.graph`` and
    replayed: one launch instead of hundreds, and no Python per operation. Capture needs static
    shapes and tensors (the batch is overwritten in place between replays), warm-up on a side stream,
    gradients kept allocated (``zero_grad(set_to_none=False)``) and autocast's weight cache off
    (``cache_enabled=False``). No GradScaler inside the graph: use bfloat16 or float32 here.
    Returns ``{"eager": ms, "CUDA graph": ms}``.
    """
    from gpucourse.timing import seconds_per_call

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA graphs need a CUDA GPU; this machine has none")
    if recipe.amp_dtype == torch.float16:
        raise ValueError("a GradScaler's skipped steps cannot be captured in a graph: use bfloat16 or float32")
    import torchvision

    with float32_precision(recipe.tf32):
        torch.manual_seed(0)
        fmt = torch.channels_last if recipe.channels_last else torch.contiguous_format
        model = torchvision.models.resnet18(num_classes=10).to(device="cuda", memory_format=fmt)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        images = torch.randn(batch, 3, image_size, image_size, device="cuda").to(memory_format=fmt)
        labels = torch.randint(0, 10, (batch,), device="cuda")

        def step() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=False)
            with torch.autocast("cuda", dtype=recipe.amp_dtype or torch.float32, enabled=recipe.amp_dtype is not None,
                                cache_enabled=False):
                loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            return loss

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        eager = seconds_per_call(step, calls=replays)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        replayed = seconds_per_call(graph.replay, calls=replays)
    return {"eager": 1000 * eager, "CUDA graph": 1000 * replayed}


def memory_at_backward(model: nn.Module, inputs: torch.Tensor, amp_dtype: torch.dtype | None,
                       optimizer_states: int = 1) -> dict[str, int]:
    """Bytes alive when the backward pass of one training step begins, by what holds them (lesson 4).

    Counted from the parameters: the float32 weights and the optimizer's state (``optimizer_states``
    float32 tensors per weight: 1 for SGD with momentum, 2 for Adam). Measured by
    :func:`saved_activation_bytes`: the activations saved for backward and, under autocast, the 16-bit
    copies of the weights that autocast's cast cache made and backward needs. Also counted: the float32
    gradients backward writes (the same with and without autocast; with ``zero_grad(set_to_none=True)``
    they exist from the backward pass on, not during the forward pass).
    """
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    saved = saved_activation_bytes(model, inputs, amp_dtype)
    return {"float32 weights": weights, "optimizer state": optimizer_states * weights,
            "float32 gradients": weights, "16-bit weight copies": saved["weight_copies"],
            "activations": saved["activations"]}


def amp_saves_memory_from(small: tuple[int, dict, dict], large: tuple[int, dict, dict]) -> int | None:
    """The smallest batch at which autocast holds fewer bytes than float32, from two measurements
    ``(batch, float32 bytes, autocast bytes)`` (:func:`memory_at_backward`) at two batch sizes of the
    same images: each part grows linearly with the batch (activations) or not at all (the rest), so
    the two give the bytes per image and the fixed bytes of each. None: autocast never holds less."""
    (b1, f1, a1), (b2, f2, a2) = small, large
    if b2 <= b1:
        raise ValueError("the second measurement needs the larger batch")
    per_image = ((sum(f2.values()) - sum(f1.values())) - (sum(a2.values()) - sum(a1.values()))) / (b2 - b1)
    extra = (sum(a1.values()) - sum(f1.values())) + per_image * b1  # what autocast adds at batch 0
    if extra < 0:
        return 1
    if per_image <= 0:
        return None
    return int(extra // per_image) + 1


def _machine_in_title(ax, title: str, hardware: str, note: str | None) -> None:
    ax.set_title(f"{title}\nmeasured on {hardware}" + (f"\n{note}" if note else ""), fontsize=9)


def beside(mine: dict[str, float], reference: dict[str, float], **labels):
    """``gpucourse.reference.plot_beside`` (this machine's numbers next to the GPU reference's, both
    machines named) with the legend under the chart, where long machine names fit (lessons 4 and 5).
    Returns the Figure."""
    from gpucourse.reference import plot_beside

    fig = plot_beside(mine, reference, **labels)
    fig.set_size_inches(max(7.0, fig.get_size_inches()[0]), 4.8)
    ax = fig.axes[0]
    handles, names = ax.get_legend_handles_labels()
    ax.get_legend().remove()
    fig.legend(handles, names, loc="outside lower center", fontsize=8, title="hardware", title_fontsize=8)
    return fig


def memory_figure(rows: dict[int, dict[str, dict[str, int]]], image_size: int, hardware: str, note: str | None = None):
    """Lesson 4's memory chart: for each batch (``rows[batch] = {"float32": parts, "AMP ...": parts}``,
    parts from :func:`memory_at_backward`), one stacked bar per precision, every part in MiB.
    Returns the Figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    if not rows:
        raise ValueError("nothing to plot: no batch was measured")
    batches = sorted(rows)
    variants = list(rows[batches[0]])
    parts = list(rows[batches[0]][variants[0]])
    colours = dict(zip(parts, ["#9fc5e8", "#b4a7d6", "#ffe599", "#e06666", "#93c47d"]))
    fig, ax = plt.subplots(figsize=(max(6.5, 1.6 * len(batches) + 2), 4.2), layout="constrained")
    width = 0.8 / len(variants)
    x = np.arange(len(batches))
    for i, variant in enumerate(variants):
        bottom = np.zeros(len(batches))
        offset = (i - (len(variants) - 1) / 2) * width
        for part in parts:
            mib = np.array([rows[b][variant][part] / 2**20 for b in batches])
            ax.bar(x + offset, mib, width * 0.95, bottom=bottom, color=colours[part], edgecolor="white",
                   hatch="//" if i else None, label=part if i == 0 else None)
            bottom += mib
        for xi, total in zip(x + offset, bottom):
            ax.text(xi, total, f"{variant}\n{total:.0f}", ha="center", va="bottom", fontsize=6.5)
    ax.set_xticks(x, [str(b) for b in batches])
    ax.set_xlabel(f"batch size (images of {image_size}x{image_size})")
    ax.set_ylabel("memory when backward begins (MiB)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="held by (hatched: autocast)",
              title_fontsize=7)
    ax.margins(y=0.15)
    _machine_in_title(ax, f"ResNet-18 training step: float32 vs autocast, {image_size}x{image_size} images",
                      hardware, note)
    return fig


def speedups(ms: dict[str, float]) -> dict[str, float]:
    """Each recipe's speed over float32 (float32's ms / the recipe's ms), from one machine's ms per step."""
    if "float32" not in ms:
        raise ValueError("the speed-ups are relative to float32: time the float32 recipe too")
    return {name: ms["float32"] / value for name, value in ms.items()}


REFERENCE_RECIPES = {"fp32": "float32", "tf32": "TF32", "amp fp16": "AMP float16", "amp bf16": "AMP bfloat16",
                     "amp bf16 channels_last": "AMP bfloat16 + channels_last",
                     "amp fp16 channels_last": "AMP float16 + channels_last"}


def reference_step_ms(reference, batch: int, image_size: int, what: str = "resnet18_step_ms") -> dict[str, float]:
    """The GPU reference's ResNet-18 step (``what``: ms, or ``"resnet18_peak_mib"``) at one batch and
    image size, under the recipe names lesson 4 uses (:func:`recipes`)."""
    prefix = f"b{batch} {image_size}px "
    found = {REFERENCE_RECIPES[label[len(prefix):]]: value for label, value in reference.values(what).items()
             if label.startswith(prefix) and label[len(prefix):] in REFERENCE_RECIPES}
    if not found:
        raise KeyError(f"the {reference.short} reference has no ResNet-18 step at batch {batch}, {image_size}x{image_size}")
    return found


# The reference's CUDA-graph rows kept cuDNN's default TF32 convolutions: not lesson 4's float32 recipe.
GRAPH_SETTINGS = (("fp32 cudnn-tf32", "float32 weights, TF32 convolutions"), ("amp bf16", "AMP bfloat16"),
                  (" channels_last", " + channels_last"))


def reference_cuda_graph_ms(reference) -> dict[str, dict[str, float]]:
    """The reference's eager and CUDA-graph ms per step, grouped for :func:`cuda_graph_figure` (empty
    where the reference has none: ``reference.missing("resnet18_cuda_graph_ms")`` says so)."""
    grouped: dict[str, dict[str, float]] = {}
    for label, value in reference.values("resnet18_cuda_graph_ms").items():
        for mode in ("eager", "cuda graph"):
            if label.endswith(" " + mode):
                setting = label[: -len(mode) - 1]
                for old, new in GRAPH_SETTINGS:
                    setting = setting.replace(old, new)
                grouped.setdefault(setting, {})["eager" if mode == "eager" else "CUDA graph"] = value
    return grouped


def step_time_figure(timings: list[StepTiming], note: str | None = None):
    """ms per training step of each recipe on one machine (lesson 4), the peak memory written above each
    bar where it was measured (CUDA). Returns the Figure."""
    import matplotlib.pyplot as plt

    if not timings:
        raise ValueError("nothing to plot: no recipe was timed")
    fig, ax = plt.subplots(figsize=(max(5.5, 1.5 * len(timings) + 1), 3.8), layout="constrained")
    bars = ax.bar([t.recipe for t in timings], [t.ms for t in timings], color="tab:blue")
    ax.bar_label(bars, labels=[f"{t.ms:.3g} ms" + (f"\n{t.peak_mib:.0f} MiB peak" if t.peak_mib else "") for t in timings],
                 fontsize=7)
    ax.set_ylabel("time per training step (ms)")
    ax.set_xlabel("recipe")
    ax.tick_params(axis="x", labelsize=8, rotation=15)
    ax.margins(y=0.2)
    first = timings[0]
    _machine_in_title(ax, f"ResNet-18 training step, batch {first.batch} of {first.image_size}x{first.image_size} images",
                      first.hardware, note)
    return fig


def cuda_graph_figure(ms: dict[str, dict[str, float]], hardware: str, note: str | None = None):
    """Eager vs CUDA-graph ms per step, one pair of bars per setting (``ms[setting] = {"eager": ...,
    "CUDA graph": ...}``; lesson 4's launch-bound step). Returns the Figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    if not ms:
        raise ValueError("nothing to plot: no setting was measured")
    settings = list(ms)
    x = np.arange(len(settings))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * len(settings) + 2), 3.8), layout="constrained")
    for offset, mode, colour in ((-0.2, "eager", "tab:gray"), (0.2, "CUDA graph", "tab:green")):
        bars = ax.bar(x + offset, [ms[s][mode] for s in settings], 0.38, label=mode, color=colour)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks(x, settings, fontsize=8, rotation=10)
    ax.set_xlabel("setting (batch, image size, recipe)")
    ax.set_ylabel("time per training step (ms)")
    ax.legend(fontsize=8, title="how the step is launched", title_fontsize=8)
    _machine_in_title(ax, "ResNet-18 training step: one launch per operation (eager) vs one CUDA graph",
                      hardware, note)
    return fig


FLOAT16_SMALLEST_SUBNORMAL = 2.0 ** -24  # the smallest positive float16; below half of it, a value rounds to 0


def small_gradient_inputs(n: int = 4096, low: float = 1e-5, high: float = 1e-2, seed: int = 0) -> torch.Tensor:
    """``n`` float16 inputs spread log-uniformly over [low, high]: with a mean over ``n``, lesson 4's
    tiny model gets gradients ``inputs / n``, some of them below float16's smallest value."""
    generator = torch.Generator().manual_seed(seed)
    logs = torch.empty(n).uniform_(float(torch.tensor(low).log()), float(torch.tensor(high).log()), generator=generator)
    return logs.exp().half()


@dataclass(frozen=True)
class Float16Step:
    """What one optimizer step of lesson 4's tiny float16 model did (see ``float16_step``)."""

    gradients: int            # how many weights (one gradient each)
    zero_gradients: int       # gradients the optimizer received that are exactly 0
    scaled_zero: int | None   # with a scaler: zeros among the scaled gradients, before unscale_
    scaled_nonfinite: int | None  # with a scaler: inf/NaN among the scaled gradients
    max_relative_error: float | None  # of the nonzero finite gradients, against the exact ones (float64)
    scale_before: float | None
    scale_after: float | None
    weights_changed: bool


def float16_step(inputs: torch.Tensor, scaler: torch.amp.GradScaler | None = None, lr: float = 0.1) -> Float16Step:
    """One SGD step of lesson 4's tiny float16 model, plain (``scaler=None``) or through a GradScaler.

    The model is ``mean(w * inputs)``: float32 weights ``w`` (all 1), cast to float16 for the product,
    as autocast casts weights, so the backward pass computes the gradients ``inputs / n`` in float16,
    where the small ones underflow to 0. With a scaler: ``scale(loss).backward()``, ``unscale_``,
    ``step`` (skipped when a scaled gradient is inf or NaN) and ``update``, as in training.
    """
    inputs = inputs.to(torch.float16)
    weights = nn.Parameter(torch.ones(inputs.shape, dtype=torch.float32))
    optimizer = torch.optim.SGD([weights], lr=lr)
    loss = (weights.half() * inputs).float().mean()
    scaled_zero = scaled_nonfinite = scale_before = scale_after = None
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scale_before = float(scaler.get_scale())
        scaler.scale(loss).backward()
        scaled_zero = int((weights.grad == 0).sum())
        scaled_nonfinite = int((~torch.isfinite(weights.grad)).sum())
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        scale_after = float(scaler.get_scale())
    grad = weights.grad.detach().double()
    exact = inputs.double() / inputs.numel()
    usable = torch.isfinite(grad) & (grad != 0)
    error = float(((grad - exact).abs() / exact)[usable].max()) if usable.any() else None
    return Float16Step(gradients=inputs.numel(), zero_gradients=int((grad == 0).sum()), scaled_zero=scaled_zero,
                       scaled_nonfinite=scaled_nonfinite, max_relative_error=error, scale_before=scale_before,
                       scale_after=scale_after, weights_changed=not torch.equal(weights.detach(), torch.ones_like(weights)))


def _is_weight_copy(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is autocast's low-precision copy of a parameter, or a view of one: its autograd
    history is a cast (and views) of a single leaf, with no other input."""
    node, cast = tensor.grad_fn, False
    while node is not None:
        name = type(node).__name__
        if name == "AccumulateGrad":
            return cast
        inputs = [nxt for nxt, _ in node.next_functions if nxt is not None]
        if len(inputs) != 1 or not name.startswith(("ToCopyBackward", "TBackward", "ViewBackward", "TransposeBackward",
                                                     "PermuteBackward", "ExpandBackward", "UnsqueezeBackward")):
            return False
        cast = cast or name.startswith("ToCopyBackward")
        node = inputs[0]
    return False


def saved_activation_bytes(model: nn.Module, inputs: torch.Tensor, dtype: torch.dtype | None = None) -> dict[str, int]:
    """Bytes of the tensors one forward pass keeps for backward, in float32 (``dtype=None``) or under
    autocast to ``dtype`` (lesson 4: autocast's activation memory, measured on any device).

    A ``torch.autograd.graph.saved_tensors_hooks`` pack hook sees every tensor autograd saves; each
    storage counts once, and the parameters and ``inputs`` (which exist anyway) not at all. Returns
    ``{"activations": ..., "weight_copies": ...}``: under autocast the forward pass also keeps
    low-precision copies of the weights, a cost per model rather than per batch, counted apart.
    """
    existing = {p.untyped_storage().data_ptr() for p in model.parameters()} | {inputs.untyped_storage().data_ptr()}
    saved: dict[int, tuple[int, str]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.layout == torch.strided and tensor.numel():
            pointer = tensor.untyped_storage().data_ptr()
            if pointer not in existing:
                kind = "weight_copies" if _is_weight_copy(tensor) else "activations"
                size = max(saved.get(pointer, (0, kind))[0], tensor.numel() * tensor.element_size())
                saved[pointer] = (size, saved.get(pointer, (0, kind))[1])
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast(inputs.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            model(inputs)
    totals = {"activations": 0, "weight_copies": 0}
    for size, kind in saved.values():
        totals[kind] += size
    return totals


BIT_LAYOUTS = {  # name: (sign, exponent, mantissa bits, torch dtype name or None)
    "float32": (1, 8, 23, "float32"),
    "TF32": (1, 8, 10, None),  # a Tensor Core compute format on Ampere and newer, not a storage dtype
    "float16": (1, 5, 10, "float16"),
    "bfloat16": (1, 8, 7, "bfloat16"),
    "float8 e4m3": (1, 4, 3, "float8_e4m3fn"),
    "float8 e5m2": (1, 5, 2, "float8_e5m2"),
}


def bit_layout_rows() -> list[dict]:
    """Bits, range and precision of each format in ``BIT_LAYOUTS``, from ``torch.finfo`` (TF32, which is
    not a storage dtype, has float32's exponent and float16's mantissa: its range is float32's)."""
    rows = []
    for name, (sign, exponent, mantissa, dtype) in BIT_LAYOUTS.items():
        info = torch.finfo(getattr(torch, dtype or "float32"))
        eps = info.eps if dtype else 2.0 ** -mantissa
        rows.append({"format": name, "sign": sign, "exponent": exponent, "mantissa": mantissa, "max": info.max,
                     "smallest_normal": info.tiny, "epsilon": eps})
    return rows


def bit_layout_figure():
    """Lesson 4's figure: the sign, exponent and mantissa bits of float32, TF32, float16, bfloat16 and
    the two float8 formats, one box per bit, with each format's range and precision written beside it."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows = bit_layout_rows()
    colours = {"sign": "#e06666", "exponent": "#6fa8dc", "mantissa": "#93c47d"}
    fig, ax = plt.subplots(figsize=(12, 0.75 * len(rows) + 1.2))
    for y, row in enumerate(reversed(rows)):
        x = 0
        for part in ("sign", "exponent", "mantissa"):
            for _ in range(row[part]):
                ax.add_patch(Rectangle((x, y + 0.15), 1, 0.7, facecolor=colours[part], edgecolor="white", lw=0.8))
                x += 1
        ax.text(-0.6, y + 0.5, f"{row['format']} ({row['sign'] + row['exponent'] + row['mantissa']} bits)",
                ha="right", va="center", fontsize=9)
        ax.text(33, y + 0.5, f"max {row['max']:.3g}, smallest normal {row['smallest_normal']:.2g}, "
                f"epsilon {row['epsilon']:.2g}", va="center", fontsize=8.5)
    for part, colour in colours.items():
        ax.bar(0, 0, color=colour, label={"sign": "sign", "exponent": "exponent (range)",
                                          "mantissa": "mantissa (precision)"}[part])
    ax.legend(loc="upper center", bbox_to_anchor=(0.35, -0.12), ncol=3, frameon=False, fontsize=9)
    ax.set_xlim(-12, 56)
    ax.set_ylim(0, len(rows))
    ax.set_yticks([])
    ax.set_xticks(range(0, 33, 8))
    ax.set_xlabel("bit position (bits, from the sign bit)")
    ax.set_title("Floating-point formats: exponent bits set the range, mantissa bits the precision")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def confident_classifier(seed: int = 0, width: int = 32, batch: int = 2048, sharpness: float = 30.0):
    """A small Tanh MLP and a batch it already classifies confidently, as late in training: the gradients
    of its loss are tiny, and in float16 many of them underflow (lesson 4's histogram)."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 10))
    inputs = torch.randn(batch, 32, generator=generator)
    with torch.no_grad():
        model[-1].weight.mul_(sharpness)
        targets = model(inputs).argmax(dim=1)  # the labels it already predicts, with large margins
    return model, inputs, targets


def float16_activation_gradients(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                                 scale: float | None = None) -> torch.Tensor:
    """The real gradients of the loss with respect to every Linear layer's output, as backward computes them.

    ``scale=None``: plain float32, no autocast (the reference). Otherwise the forward runs under
    ``torch.autocast("cpu", dtype=torch.float16)``, so those outputs and their gradients are float16, and
    backward starts from ``loss * scale`` (``scale=1``: no loss scaling; ``GradScaler`` multiplies by its
    scale, 65536 by default). Returns the gradients, flattened, in float64 and still multiplied by ``scale``.
    """
    grads: list[torch.Tensor] = []

    def keep_gradient(module, args, out) -> None:
        out.register_hook(lambda g: grads.append(g.detach()))

    handles = [m.register_forward_hook(keep_gradient) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16, enabled=scale is not None):
            loss = nn.functional.cross_entropy(model(inputs), targets)
        (loss * (scale or 1.0)).backward()
    finally:
        for handle in handles:
            handle.remove()
    model.zero_grad(set_to_none=True)
    return torch.cat([g.flatten().double() for g in grads])


def gradient_histogram_figure(reference: torch.Tensor, unscaled: torch.Tensor, scaled: torch.Tensor, scale: float):
    """Histograms of log2 |gradient| (lesson 4): float32, float16 without loss scaling and float16 after
    scaling by ``scale``, with float16's smallest subnormal (2^-24) and smallest normal (2^-14) marked.
    Gradients that are exactly 0 cannot go on a log axis: their count is in each panel's legend."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    panels = [("float32 (reference)", reference), ("float16, no loss scaling", unscaled),
              (f"float16, loss scaled by {scale:g} (= 2^{torch.tensor(scale).log2().item():.0f})", scaled)]
    nonzero = [p[p != 0].abs().log2() for _, p in panels]
    low = min(float(v.min()) for v in nonzero if v.numel())
    high = max(float(v.max()) for v in nonzero if v.numel())
    bins = torch.linspace(min(low, -27) - 0.5, high + 0.5, 60).tolist()
    for ax, (title, values), logs in zip(axes, panels, nonzero):
        zeros = int((values == 0).sum())
        ax.hist(logs.numpy(), bins=bins, color="#6fa8dc", label=f"{zeros} of {values.numel()} are exactly 0")
        ax.axvline(-24, color="#cc0000", ls="--", label="float16 smallest subnormal 2^-24")
        ax.axvline(-14, color="#e69138", ls=":", label="float16 smallest normal 2^-14")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("count")
        ax.legend(fontsize=8, loc="upper left")
    axes[-1].set_xlabel("log2 |gradient| (of the loss w.r.t. each layer's output)")
    fig.suptitle("Real gradients of a small confident classifier, one backward pass")
    fig.tight_layout()
    return fig

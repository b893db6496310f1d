"""Lesson 4 (automatic mixed precision): float formats, autocast's choice of dtype by hardware, the
recipes' step times and memory, CUDA graphs, float16 gradients and loss scaling.

The lesson's one helper module: it also offers the lesson's data (``gpucourse.cifar``: CIFAR-10
offline and the ``pl_bolts`` drop-in data module) and figures (``gpucourse.mixed_precision_figures``), which
live in modules of their own.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

# The lesson's data and figures, from the modules that hold them (the lesson calls them through this one).
from gpucourse.mixed_precision_figures import (  # noqa: F401
    beside, bit_layout_figure, bit_layout_rows, cuda_graph_figure, gradient_histogram_figure, memory_figure,
    step_time_figure)
from gpucourse.cifar import (  # noqa: F401
    LABELS, MANIFEST, OFFLINE_ENV, CIFAR10DataModule, OfflineCIFAR10, validation_size, write_cifar10)

















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



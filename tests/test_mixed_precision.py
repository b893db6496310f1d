"""gpucourse.mixed_precision (lesson 4's helpers): offline CIFAR-10 in the real format, the data module drop-in."""

from __future__ import annotations

import hashlib
import json
import pickle

import pytest
import torch
from torch import nn

from conftest import needs_cuda
from gpucourse import mixed_precision as amp


def test_generated_cifar10_has_the_real_layout(tmp_path):
    folder = amp.write_cifar10(tmp_path, per_batch=4, test=3)
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(["batches.meta", "data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                            "data_batch_5", "test_batch", amp.MANIFEST])
    with open(folder / "data_batch_1", "rb") as handle:
        batch = pickle.load(handle, encoding="latin1")
    assert batch["data"].shape == (4, 3072) and str(batch["data"].dtype) == "uint8" and len(batch["labels"]) == 4
    manifest = json.loads((folder / amp.MANIFEST).read_text())
    assert manifest["test_batch"] == hashlib.md5((folder / "test_batch").read_bytes()).hexdigest()
    with pytest.raises(ValueError):
        amp.write_cifar10(tmp_path, per_batch=0)


def test_torchvision_reads_it_and_still_checks_integrity(tmp_path):
    folder = amp.write_cifar10(tmp_path, per_batch=4, test=3)
    train, test = amp.OfflineCIFAR10(tmp_path, train=True), amp.OfflineCIFAR10(tmp_path, train=False)
    assert (len(train), len(test)) == (20, 3) and train.classes == amp.LABELS
    image, label = train[0]
    assert image.size == (32, 32) and 0 <= label < 10
    (folder / "test_batch").write_bytes(b"corrupted")
    with pytest.raises(RuntimeError, match="corrupted"):
        amp.OfflineCIFAR10(tmp_path, train=False)


def test_data_module_has_pl_bolts_constructor_and_splits(tmp_path, monkeypatch):
    monkeypatch.setenv(amp.OFFLINE_ENV, "1")
    dm = amp.CIFAR10DataModule(data_dir=str(tmp_path), shuffle=True, num_workers=0, normalize=True, batch_size=8, val_split=0.2)
    dm.prepare_data()
    dm.setup()
    assert dm.generated and (len(dm.dataset_train), len(dm.dataset_val), len(dm.dataset_test)) == (400, 100, 100)
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (8, 3, 32, 32) and labels.shape == (8,)
    assert abs(float(images.mean())) < 2  # normalized


def test_data_module_takes_the_original_call_unchanged_offline(tmp_path, monkeypatch, capsys):
    """The original material's call, with pl_bolts' default val_split=5000, on the small generated copy."""
    monkeypatch.setenv(amp.OFFLINE_ENV, "1")
    dm = amp.CIFAR10DataModule(data_dir=str(tmp_path), shuffle=True, num_workers=0, normalize=True, batch_size=8)
    dm.prepare_data()
    dm.setup()
    assert (len(dm.dataset_train), len(dm.dataset_val), len(dm.dataset_test)) == (450, 50, 100)
    lines = [line for line in capsys.readouterr().out.splitlines() if "val_split" in line]
    assert len(lines) == 1 and "val_split=5000" in lines[0] and "50" in lines[0]
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (8, 3, 32, 32) and labels.shape == (8,)
    assert len(dm.val_dataloader()) == 7  # 50 images in batches of 8
    for val_split, n_val in [(50_000, 499), (1, 1), (0, 0), (0.5, 250)]:  # scaled and capped, never failing
        dm = amp.CIFAR10DataModule(data_dir=str(tmp_path), val_split=val_split)
        dm.setup()
        assert (len(dm.dataset_train), len(dm.dataset_val)) == (500 - n_val, n_val)


def test_validation_split_keeps_pl_bolts_behaviour_on_the_real_dataset(capsys):
    assert amp.validation_size(5000, 50_000, generated=False) == 5000  # pl_bolts: an int is a count
    assert amp.validation_size(0.1, 50_000, generated=False) == 5000  # a float is a fraction
    assert amp.validation_size(5000, 50_000, generated=True) == 5000  # a full-size copy is not scaled
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="leaves no training data"):
        amp.validation_size(50_000, 50_000, generated=False)
    with pytest.raises(ValueError, match="leaves no training data"):
        amp.validation_size(5000, 500, generated=False)  # only a generated copy is scaled
    with pytest.raises(ValueError):
        amp.validation_size(1.5, 500, generated=True)


def test_autocast_choice_follows_the_hardware(monkeypatch):
    for avx512_bf16, amx, native in [(False, False, False), (True, False, True), (False, True, True)]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        choice = amp.autocast_choice(torch.device("cpu"))
        assert (choice.device_type, choice.dtype, choice.native, choice.needs_scaler) == ("cpu", torch.bfloat16, native, False)
        assert ("emulated" in choice.reason) != native
        assert amp.autocast_dtype("cpu") == (torch.bfloat16 if native else None)


def test_autocast_choice_on_a_gpu(monkeypatch):
    """bfloat16 with no scaler wherever the GPU has it natively, float16 + GradScaler only where it is
    absent or asked for; Tensor Cores (7.0+) decide whether float16 is worth it."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    asked = []
    for capability, bf16, prefer, expected, native in [((9, 0), True, None, torch.bfloat16, True),
                                                       ((8, 0), True, torch.bfloat16, torch.bfloat16, True),
                                                       ((8, 0), True, torch.float16, torch.float16, True),
                                                       ((7, 5), False, None, torch.float16, True),
                                                       ((7, 0), False, torch.bfloat16, torch.float16, True),
                                                       ((6, 1), False, None, torch.float16, False)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True, b=bf16: asked.append(including_emulation) or b)
        choice = amp.autocast_choice("cuda", prefer=prefer)
        assert (choice.dtype, choice.native, choice.needs_scaler) == (expected, native, expected == torch.float16)
        assert "Test GPU" in choice.reason and f"{capability[0]}.{capability[1]}" in choice.reason
        assert ("GradScaler" in choice.reason) and (("no GradScaler" in choice.reason) == (expected == torch.bfloat16))
    assert asked and not any(asked)  # emulated bfloat16 does not count as having it
    assert amp.autocast_dtype("cuda") is None  # the last GPU: no Tensor Cores, autocast not worth it there


def test_formats_and_autocast_table():
    rows = {r["dtype"]: r for r in amp.format_table()}
    assert rows["float16"]["max"] == 65504 and rows["bfloat16"]["exponent_bits"] == rows["float32"]["exponent_bits"]
    table = amp.autocast_dtypes("cpu", torch.bfloat16)
    assert table["nn.Linear"] == "bfloat16" and table["cross_entropy"] == "float32"


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_train_step_timing(dtype):
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    assert amp.train_step_seconds(model, torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 2, 0]), dtype, steps=1) > 0


def test_float16_gradients_underflow_and_the_scaler_rescues_them():
    inputs = amp.small_gradient_inputs(n=512, low=1e-5, high=1e-2, seed=1)
    plain = amp.float16_step(inputs)
    assert plain.zero_gradients > 0 and plain.scale_before is None  # gradients below float16's range became 0
    assert float(inputs.min()) / 512 < amp.FLOAT16_SMALLEST_SUBNORMAL / 2
    scaled = amp.float16_step(inputs, torch.amp.GradScaler("cpu"))
    assert scaled.zero_gradients == 0 and scaled.scaled_zero == 0 and scaled.scaled_nonfinite == 0
    assert scaled.max_relative_error < 1e-3 and scaled.weights_changed
    assert scaled.scale_before == scaled.scale_after == 2.0 ** 16


def test_a_scale_too_large_makes_the_scaler_skip_the_step():
    skipped = amp.float16_step(amp.small_gradient_inputs(n=64), torch.amp.GradScaler("cpu", init_scale=2.0 ** 30))
    assert skipped.scaled_nonfinite == 64 and not skipped.weights_changed
    assert skipped.scale_after == skipped.scale_before / 2


def test_autocast_saves_fewer_activation_bytes():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    images = torch.randn(4, 3, 8, 8)
    full = amp.saved_activation_bytes(model, images)
    half = amp.saved_activation_bytes(model, images, torch.bfloat16)
    assert full["weight_copies"] == 0 and 0 < half["activations"] < full["activations"]
    weights = sum(m.weight.numel() for m in model if isinstance(m, (nn.Conv2d, nn.Linear)))
    assert half["weight_copies"] == 2 * weights  # the bfloat16 copies of the conv and linear weights


def test_bit_layouts_match_torch_finfo_and_the_figure_is_labelled():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {r["format"]: r for r in amp.bit_layout_rows()}
    assert set(rows) == {"float32", "TF32", "float16", "bfloat16", "float8 e4m3", "float8 e5m2"}
    for name, dtype in [("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float8 e4m3", torch.float8_e4m3fn),
                        ("float8 e5m2", torch.float8_e5m2), ("float32", torch.float32)]:
        info = torch.finfo(dtype)
        assert rows[name]["sign"] + rows[name]["exponent"] + rows[name]["mantissa"] == info.bits
        assert rows[name]["epsilon"] == info.eps == 2.0 ** -rows[name]["mantissa"] and rows[name]["max"] == info.max
    assert rows["TF32"]["max"] == rows["float32"]["max"] and rows["TF32"]["epsilon"] == rows["float16"]["epsilon"]
    fig = amp.bit_layout_figure()
    ax = fig.axes[0]
    assert ax.get_title() and "bit" in ax.get_xlabel()
    bit_boxes = [p for p in ax.patches if p.get_height() == 0.7]  # one box per bit (the legend adds empty bars)
    assert len(bit_boxes) == sum(r["sign"] + r["exponent"] + r["mantissa"] for r in rows.values())
    plt.close(fig)


def test_real_float16_gradients_underflow_and_loss_scaling_keeps_them():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model, inputs, targets = amp.confident_classifier(batch=512)
    reference = amp.float16_activation_gradients(model, inputs, targets)
    unscaled = amp.float16_activation_gradients(model, inputs, targets, scale=1.0)
    scaled = amp.float16_activation_gradients(model, inputs, targets, scale=2.0 ** 16)
    assert reference.numel() == unscaled.numel() == scaled.numel() > 0
    assert int((reference == 0).sum()) == 0  # float32: none is 0 (Tanh, no ReLU zeros)
    assert int((unscaled == 0).sum()) > 0  # float16: real underflow
    assert int((scaled == 0).sum()) < int((unscaled == 0).sum()) and bool(torch.isfinite(scaled).all())
    assert all(p.grad is None for p in model.parameters())  # leaves the model as it found it
    fig = amp.gradient_histogram_figure(reference, unscaled, scaled, 2.0 ** 16)
    assert len(fig.axes) == 3 and all(ax.get_title() and ax.get_ylabel() == "count" for ax in fig.axes)
    assert "log2" in fig.axes[-1].get_xlabel()
    assert any("-24" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    plt.close(fig)


def test_float32_precision_switches_tf32_and_restores():
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = (matmul.fp32_precision, conv.fp32_precision, torch.backends.cudnn.benchmark)
    with amp.float32_precision(True):
        assert (matmul.fp32_precision, conv.fp32_precision) == ("tf32", "tf32")
    with amp.float32_precision(False):
        assert (matmul.fp32_precision, conv.fp32_precision) == ("ieee", "ieee")  # cuDNN's default is TF32
    assert (matmul.fp32_precision, conv.fp32_precision, torch.backends.cudnn.benchmark) == before


def test_recipes_and_a_timed_step_on_this_machine():
    names = [r.name for r in amp.recipes(torch.bfloat16)]
    assert names == ["float32", "TF32", "AMP bfloat16", "AMP bfloat16 + channels_last"]
    assert amp.recipes(torch.float16)[3] == amp.Recipe("AMP float16 + channels_last", torch.float16, channels_last=True)
    timing = amp.time_recipe(amp.Recipe("float32 + channels_last", channels_last=True), batch=2, image_size=32, steps=1)
    assert timing.ms > 0 and timing.peak_mib is None and timing.batch == 2 and "CPU" in timing.hardware
    with pytest.raises(ValueError, match="image_size"):
        amp.time_recipe(amp.Recipe("float32"), batch=2, image_size=8)


def test_cuda_graphs_refuse_without_cuda_or_with_a_scaler(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA"):
        amp.graphed_step_ms(amp.Recipe("float32"), batch=2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="GradScaler"):
        amp.graphed_step_ms(amp.Recipe("AMP float16", torch.float16), batch=2)


def test_memory_counts_every_part_and_finds_where_amp_saves():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(16 * 8 * 8, 10))
    weights = sum(p.numel() * 4 for p in model.parameters())
    parts = {}
    for batch in (1, 4, 64):
        images = torch.randn(batch, 3, 8, 8)
        parts[batch] = (amp.memory_at_backward(model, images, None), amp.memory_at_backward(model, images, torch.bfloat16))
    full, low = parts[4]
    assert set(full) == {"float32 weights", "optimizer state", "float32 gradients", "16-bit weight copies", "activations"}
    assert full["float32 weights"] == full["optimizer state"] == full["float32 gradients"] == low["float32 gradients"] == weights
    assert full["16-bit weight copies"] == 0 and 0 < low["16-bit weight copies"] <= weights // 2
    assert low["activations"] < full["activations"]
    assert amp.memory_at_backward(model, torch.randn(1, 3, 8, 8), None, optimizer_states=2)["optimizer state"] == 2 * weights
    crossover = amp.amp_saves_memory_from((1, *parts[1]), (4, *parts[4]))
    total = {b: (sum(f.values()), sum(a.values())) for b, (f, a) in parts.items()}
    assert crossover is not None and 1 < crossover
    # the prediction from batches 1 and 4 holds where it was not measured: at 64, above the crossover, AMP holds less
    assert (total[64][1] < total[64][0]) == (64 >= crossover)
    # and below it AMP holds more (the weight copies outweigh the activations it saves)
    assert total[1][1] > total[1][0]
    with pytest.raises(ValueError):
        amp.amp_saves_memory_from((4, *parts[4]), (1, *parts[1]))


def test_lesson4_figures_have_titles_units_and_hardware():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpucourse import reference

    ref = reference.load("h100")
    timings = [amp.StepTiming("float32", 8, 32, 20.0, None, "Test CPU"), amp.StepTiming("AMP bfloat16", 8, 32, 10.0, 300.0, "Test CPU")]
    fig = amp.step_time_figure(timings, note="a note")
    ax = fig.axes[0]
    assert "Test CPU" in ax.get_title() and "batch 8" in ax.get_title() and "32x32" in ax.get_title() and "a note" in ax.get_title()
    assert "(ms)" in ax.get_ylabel() and ax.get_xlabel()
    assert any("300 MiB" in t.get_text() for t in ax.texts)
    plt.close(fig)

    graphs = amp.reference_cuda_graph_ms(ref)
    # the probe's "float32" rows ran cuDNN's default TF32 convolutions: never named plain float32
    assert graphs["b512 32px float32 weights, TF32 convolutions"] == {"eager": 11.39, "CUDA graph": 3.99}
    assert "b512 32px float32" not in graphs
    fig = amp.cuda_graph_figure(graphs, ref.label())
    ax = fig.axes[0]
    assert "H100" in ax.get_title() and "(ms)" in ax.get_ylabel() and ax.get_xlabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["eager", "CUDA graph"]
    assert len(ax.patches) == 2 * len(graphs)
    plt.close(fig)

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    rows = {b: {"float32": amp.memory_at_backward(model, torch.randn(b, 3, 8, 8), None),
                "AMP bfloat16": amp.memory_at_backward(model, torch.randn(b, 3, 8, 8), torch.bfloat16)} for b in (1, 2)}
    fig = amp.memory_figure(rows, 8, "Test CPU")
    ax = fig.axes[0]
    assert "Test CPU" in ax.get_title() and "(MiB)" in ax.get_ylabel() and "8x8" in ax.get_xlabel()
    assert {t.get_text() for t in ax.get_legend().get_texts()} == set(rows[1]["float32"])
    assert len(ax.patches) == 2 * 2 * 5  # batches x precisions x parts
    plt.close(fig)
    with pytest.raises(ValueError):
        amp.memory_figure({}, 8, "Test CPU")


def test_reference_steps_under_the_lessons_recipe_names():
    from gpucourse import reference

    ref = reference.load("h100")
    ms = amp.reference_step_ms(ref, 128, 224)
    assert ms["float32"] == 46.97 and ms["AMP float16 + channels_last"] == 13.12 and ms["TF32"] == 28.03
    fast = amp.speedups(ms)
    assert fast["float32"] == 1.0 and fast["AMP float16 + channels_last"] >= 3  # what the lesson says the H100 shows
    assert amp.reference_step_ms(ref, 128, 224, "resnet18_peak_mib")["AMP bfloat16"] == 3013
    with pytest.raises(KeyError):
        amp.reference_step_ms(ref, 64, 224)
    with pytest.raises(ValueError, match="float32"):
        amp.speedups({"TF32": 1.0})


@needs_cuda("CUDA graphs and peak memory need a CUDA GPU")
def test_recipes_and_graphs_on_a_gpu():
    timing = amp.time_recipe(amp.recipes(torch.bfloat16)[3], batch=4, image_size=32, device="cuda", steps=1)
    assert timing.ms > 0 and timing.peak_mib > 0
    ms = amp.graphed_step_ms(amp.Recipe("float32"), batch=4, replays=2)
    assert ms["eager"] > 0 and ms["CUDA graph"] > 0


def test_beside_names_both_machines_under_the_chart():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = amp.beside({"float32": 1.0}, {"float32": 1.0, "TF32": 1.7}, title="speed", unit="x float32's speed",
                     mine_label="Test CPU, batch 4", reference_label="Test GPU, batch 128", note="a note")
    ax, legend = fig.axes[0], fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["Test CPU, batch 4", "Test GPU, batch 128"]
    assert legend.get_title().get_text() == "hardware" and ax.get_legend() is None
    assert "speed" in ax.get_title() and "a note" in ax.get_title() and ax.get_ylabel() == "x float32's speed"
    assert len(ax.patches) == 3
    plt.close(fig)

"""gpucourse.memory_and_mfu (lesson 19): the transformer layer, what it saves, and the figure."""

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from gpucourse import memory_and_mfu as MM


def _layer(**kwargs):
    torch.manual_seed(0)
    return MM.TransformerLayer(32, 4, max_seq=16, **kwargs).train()


def _state(layer):
    return [*layer.parameters(), *layer.buffers()]


def test_saved_by_shape_finds_the_attention_scores_and_the_gelu_tensors():
    layer, x = _layer(), torch.randn(2, 16, 32, requires_grad=True)
    rows = MM.saved_by_shape(lambda: layer(x), exclude=_state(layer))
    shapes = {r["shape"] for r in rows}
    assert (2, 4, 16, 16) in shapes            # softmax output, (b, a, s, s)
    assert (2, 16, 128) in shapes              # GeLU's input, (b, s, 4h)
    assert all(r["bytes"] > 0 and r["count"] >= 1 for r in rows)
    assert [r["bytes"] for r in rows] == sorted((r["bytes"] for r in rows), reverse=True)


def test_selective_recompute_drops_exactly_the_score_part_and_full_keeps_only_the_input():
    x = torch.randn(2, 16, 32, requires_grad=True)
    kept = {}
    for mode in ("none", "selective", "full"):
        layer = _layer(recompute=mode)
        kept[mode] = sum(r["bytes"] for r in MM.saved_by_shape(lambda: layer(x), exclude=_state(layer)))
    scores = 2 * 4 * 16 * 16 * 4 * 3           # b a s s elements, float32, softmax out + dropout mask + dropout out
    assert kept["none"] - kept["selective"] == scores
    assert kept["full"] == x.numel() * 4       # checkpoint saves the layer's input only


def test_live_bytes_sees_what_a_checkpoint_policy_caches():
    x = torch.randn(2, 16, 32, requires_grad=True)
    layer = _layer(recompute="policy")
    alive = MM.live_bytes(lambda: layer(x).sum(), exclude=_state(layer))
    assert alive > 0
    with torch.no_grad():
        assert MM.live_bytes(lambda: layer(x).sum(), exclude=_state(layer)) == 0


def test_every_plan_gives_the_same_gradients():
    x = torch.randn(2, 16, 32)
    grads = {}
    for mode in MM.RECOMPUTE:
        layer = _layer(recompute=mode)
        torch.manual_seed(1)
        layer(x).square().mean().backward()
        grads[mode] = [p.grad for p in layer.parameters()]
    for mode in MM.RECOMPUTE:
        assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(grads[mode], grads["none"]))


def test_layer_refuses_bad_settings():
    with pytest.raises(ValueError):
        MM.TransformerLayer(30, 4)
    with pytest.raises(ValueError):
        MM.TransformerLayer(32, 4, recompute="some")
    with pytest.raises(ValueError):
        MM.TransformerLayer(32, 4, attention="flash")


def test_tiny_gpt_ties_its_output_projection():
    model = MM.TinyGPT(50, 16, 2, 2, 8)
    logits = model(torch.randint(0, 50, (3, 8)))
    assert logits.shape == (3, 8, 50)
    vocab_by_width = [name for name, p in model.named_parameters() if p.shape == (50, 16)]
    assert vocab_by_width == ["tokens.weight"]   # no separate output matrix: the embedding is reused


def test_draw_recompute_labels_its_axes_with_units():
    fig = MM.draw_recompute(["none", "full"], [2**20, 2**19], [3.0, 4.0], hardware="test CPU", title="t")
    left, right = fig.axes
    assert "MiB" in left.get_ylabel() and "ms" in right.get_ylabel()
    assert "test CPU" in fig._suptitle.get_text()


@pytest.mark.parametrize("takes_it", [True, False])
def test_recomputation_runs_whether_or_not_checkpoint_takes_respect_saved_tensors_hooks(monkeypatch, takes_it):
    """torch 2.14.1's checkpoint() has ``respect_saved_tensors_hooks`` and 2.10's has not (the edition runs
    there too: an unknown keyword would reach the layer's own function): the layer passes it only where it
    exists, and full and selective recomputation give the same gradients either way."""
    monkeypatch.setattr(MM, "_CHECKPOINT_RESPECTS_HOOKS", takes_it and MM._checkpoint_takes("respect_saved_tensors_hooks"))
    grads = {}
    for recompute in ("none", "full", "policy"):
        torch.manual_seed(0)
        layer = MM.TransformerLayer(32, 4, dropout=0.0, max_seq=16, recompute=recompute).train()
        x = torch.randn(2, 8, 32, requires_grad=True)
        layer(x).sum().backward()
        grads[recompute] = x.grad
    assert torch.allclose(grads["full"], grads["none"], atol=1e-6)
    assert torch.allclose(grads["policy"], grads["none"], atol=1e-6)


def test_each_gpu_is_set_against_its_own_vendor_figure():
    """Lesson 19 divides a reference's measured matmul by the vendor's dense bfloat16 figure: the figure of that
    reference's GPU (an H200 run once read the H100's datasheet), labelled as a vendor spec, with its source."""
    from gpucourse import reference as R

    for short, spec in MM.BF16_DENSE_SPECS.items():
        assert short in spec["source"] and spec["status"].startswith("vendor spec") and spec["flops"] > 0
    shipped = {R.load(name).short for name in R.names()}
    assert shipped <= set(MM.BF16_DENSE_SPECS), f"a shipped reference without its vendor figure: {shipped - set(MM.BF16_DENSE_SPECS)}"

"""gpucourse.tpus_xla (lesson 8's helpers) and lesson 8's checks against reference and wrong answers."""

from __future__ import annotations

import pytest
import torch

from gpucourse import tpus_xla as X
from gpucourse.checks import PUBLIC, lesson08_tpus_xla as lesson08, run_case  # noqa: F401 - importing lesson08 registers its cases


def _square_sum(x):
    return (x * x).sum()


def test_counting_backend_counts_one_graph_per_shape_with_dynamic_false():
    run = X.run_compiled(_square_sum, [(torch.ones(3),), (torch.ones(3),), (torch.ones(3),)])
    assert run.graphs == 1 and len(run.step_seconds) == 3
    run = X.run_compiled(_square_sum, [(torch.ones(n),) for n in (2, 3, 4, 3, 2)])
    assert run.graphs == 3
    assert sorted(shapes[0] for shapes in run.input_shapes) == [(2,), (3,), (4,)]


def test_recompile_limit_caps_the_count_and_dynamic_shapes_avoid_it():
    calls = [(torch.ones(n),) for n in range(2, 14)]  # 12 shapes
    assert X.run_compiled(_square_sum, calls).graphs == 12  # limit raised for the run
    assert X.run_compiled(_square_sum, calls, recompile_limit=8).graphs == 8
    assert X.run_compiled(_square_sum, calls, dynamic=None).graphs == 2  # static, then one symbolic graph
    assert torch._dynamo.config.recompile_limit == 8  # restored


def test_pad_to_longest_and_token_batches():
    batches = X.token_batches(3, 4, lengths=[5, 9], seed=1)
    assert [max(len(s) for s in b) for b in batches] == [5, 9, 5]
    assert all(s.dtype == torch.int64 and s.dim() == 1 for b in batches for s in b)
    padded, mask = X.pad_to_longest([torch.tensor([1, 2, 3]), torch.tensor([4])], pad_value=-1)
    assert padded.tolist() == [[1, 2, 3], [4, -1, -1]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]


def test_tiny_encoder_ignores_padding():
    torch.manual_seed(0)
    model = X.TinyEncoder().eval()
    seq = torch.tensor([3, 1, 4, 1, 5])
    with torch.no_grad():
        alone = model(seq[None], torch.ones(1, 5, dtype=torch.bool))
        padded = model(torch.cat([seq, torch.zeros(11, dtype=torch.long)])[None],
                       torch.arange(16)[None] < 5)
    assert torch.allclose(alone, padded, atol=1e-6)


def test_count_host_reads_counts_each_kind_once():
    x = torch.arange(4.0)
    with X.count_host_reads() as reads:
        x.sum().item()
        float(x.sum())
        f"{x.sum():.1f}"  # __format__ calls item() inside: one read
        bool(x.sum() > 0)
        x.tolist()
        x.cpu()
        x.to("cpu")
        y = x.to(torch.float64) * 2  # a dtype change is not a read
        z = (y + 1).sum()  # nor is computing
    assert reads.count == 7, reads.methods
    assert reads.methods == ["item", "__float__", "__format__", "__bool__", "tolist", "cpu", "to"]
    assert "wrapper" not in torch.Tensor.item.__qualname__  # patches removed
    assert float(z) == 16.0


def _reference_pad(batch, buckets, pad_value=0):
    if not batch:
        raise ValueError("empty")
    longest = max(len(s) for s in batch)
    fitting = [b for b in buckets if b >= longest]
    if not fitting:
        raise ValueError("too long")
    padded = torch.full((len(batch), min(fitting)), pad_value, dtype=batch[0].dtype)
    mask = torch.zeros(padded.shape, dtype=torch.bool)
    for i, s in enumerate(batch):
        padded[i, :len(s)], mask[i, :len(s)] = s, True
    return padded, mask


def _pads_to_longest(batch, buckets, pad_value=0):
    return X.pad_to_longest(batch, pad_value)


def _reference_log(step, batches, every):
    sums, total, count = [], None, 0
    for b in batches:
        loss = step(b).detach()
        total, count = (loss if total is None else total + loss), count + 1
        if count == every:
            sums.append(total / count)
            total, count = None, 0
    if count:
        sums.append(total / count)
    return torch.stack(sums).tolist() if sums else []


def _item_every_step(step, batches, every):
    values = [step(b).item() for b in batches]
    return [sum(values[i:i + every]) / len(values[i:i + every]) for i in range(0, len(values), every)]


def _hidden():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "autograders" / "checks" / "lesson08_tpus_xla.py"
    spec = importlib.util.spec_from_file_location("lesson08_hidden", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HIDDEN


@pytest.mark.parametrize("exercise,answer,passes", [
    ("pad_to_bucket", _reference_pad, True), ("pad_to_bucket", _pads_to_longest, False),
    ("log_losses", _reference_log, True), ("log_losses", _item_every_step, False),
])
def test_checks_accept_the_reference_and_reject_wrong_answers(exercise, answer, passes):
    cases = PUBLIC[exercise] + _hidden()[exercise]
    failures = [m for m in (run_case(c, {exercise: answer}) for c in cases) if m]
    assert (not failures) == passes, failures


def test_tpu_topology_figure_counts_cores_chips_and_hosts():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = X.draw_tpu_topology(hosts=4, chips_per_host=4, cores_per_chip=2, name="e.g. a v3-32 slice")
    host, slice_ = fig.axes
    assert fig._suptitle is not None and "one example" in fig._suptitle.get_text()
    assert "4 chips × 2 TensorCores = 8 cores" in host.get_title()
    assert "e.g. a v3-32 slice" in slice_.get_title() and "16 chips, 32 TensorCores" in slice_.get_title()
    assert sum(t.get_text().startswith("core") for t in host.texts) == 8
    assert sum(t.get_text().startswith("host ") for t in slice_.texts) == 4
    plt.close(fig)
    one = X.draw_tpu_topology(hosts=1, chips_per_host=1, cores_per_chip=1, name="e.g. a v5e-1")
    assert "1 host × 1 chip = 1 chip, 1 TensorCore" in one.axes[1].get_title()
    plt.close(one)


def test_public_stored_values_agree_with_the_graders_reference():
    """The public case's stored means are the hidden reference's; the public module computes none itself."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "autograders" / "checks" / "lesson08_tpus_xla.py"
    spec = importlib.util.spec_from_file_location("lesson08_hidden_reference", path)
    hidden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hidden)
    assert hidden.reference_log_losses(lesson08.PUBLIC_LOSSES, 3) == lesson08.PUBLIC_MEANS
    assert hidden.reference_log_losses([], 4) == [] and hidden.reference_log_losses([1.0, 3.0], 2 ** 53 + 1) == [2.0]
    padded, mask = hidden.reference_pad_to_bucket([torch.tensor([5, 6, 7]), torch.tensor([1])], (4, 8))
    assert padded.tolist() == [[5, 6, 7, 0], [1, 0, 0, 0]] and mask.dtype == torch.bool
    for name in ("judge_log_losses", "pad_batches", "loss_runs", "expected_pad"):
        assert not hasattr(lesson08, name), f"the public module still holds {name}"

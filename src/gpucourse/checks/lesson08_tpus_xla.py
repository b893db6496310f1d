"""Public checks for lesson 8 (TPUs and XLA). Observers are self-contained: see lesson01_processes_threads.py.

``pad_to_bucket`` is observed on a small batch; ``log_losses`` runs with a step function whose losses
are known, inside ``gpucourse.tpus_xla.count_host_reads`` so that every read of a tensor value by the
student's code (the thing that stalls a TPU) is counted. The public judges compare with stored expected
values; the hidden checks draw their inputs at grading time and hold the reference on the grader's side.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson08_tpus_xla"  # the course folder this module's exercises belong to

# --- Exercise 1: pad_to_bucket -------------------------------------------------------------


def observe_pad_small(ns):
    import torch
    from gpucourse.checks import answer

    pad = answer(ns, "pad_to_bucket")
    padded, mask = pad([torch.tensor([5, 6, 7]), torch.tensor([1])], (4, 8))
    out = {"padded": padded.tolist(), "mask": mask.tolist(), "dtype": str(padded.dtype), "mask_dtype": str(mask.dtype)}
    try:
        pad([torch.arange(1, 10)], (4, 8))
        out["too_long"] = "returned"
    except ValueError:
        out["too_long"] = "ValueError"
    except Exception as error:  # noqa: BLE001 - any other exception is a wrong answer, reported by name
        out["too_long"] = type(error).__name__
    return out


def judge_pad_small(d):
    width = len(d["padded"][0]) if d["padded"] else 0
    if width != 4:
        return f"two sequences (longest 3) with buckets (4, 8) came back {width} wide: pad to the smallest bucket that fits"
    if d["dtype"] != "torch.int64" or d["mask_dtype"] != "torch.bool":
        return f"dtypes {d['dtype']} / {d['mask_dtype']}: keep the tokens' dtype, and make the mask bool"
    if d["mask"] != [[True, True, True, False], [True, False, False, False]]:
        return "the mask must be True exactly on the real tokens, which come first in each row"
    if d["padded"] != [[5, 6, 7, 0], [1, 0, 0, 0]]:
        return "each row must hold its sequence first, then pad_value up to the bucket length"
    if d["too_long"] != "ValueError":
        return f"a sequence longer than the largest bucket must raise ValueError (got: {d['too_long']})"
    return None


register("pad_to_bucket", Case("two sequences, buckets (4, 8); a sequence of 9 tokens", observe_pad_small, judge_pad_small),
         answers=[Answer("pad_to_bucket", "function",
                         "a function pad_to_bucket(batch, buckets, pad_value=0) returning the pair (padded, mask) "
                         "of tensors")], points=3)


# --- Exercise 2: log_losses ----------------------------------------------------------------


def observe_log_losses(ns, losses, every, requires_grad=False, dtype="float32", loader=False):
    """Run ``log_losses`` on batches 0..n-1 whose step returns ``losses[i]`` (a 0-dim tensor of ``dtype``);
    count host reads. ``loader``: the batches come as an iterable with a length but no indexing, as a
    DataLoader gives them, instead of a list."""
    import torch
    from gpucourse.checks import answer
    from gpucourse.tpus_xla import count_host_reads

    weight = torch.ones((), requires_grad=requires_grad, dtype=getattr(torch, dtype))
    values = [torch.tensor(float(v), dtype=getattr(torch, dtype)) for v in losses]
    steps = []

    def step(batch):
        steps.append(batch)
        return weight * values[batch]

    class Loader:  # iterable again and again, with a length; no indexing, no slicing
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __iter__(self):
            return iter(range(self.n))

    batches = Loader(len(losses)) if loader else list(range(len(losses)))
    log_losses = answer(ns, "log_losses")
    with count_host_reads() as reads:
        result = log_losses(step, batches, every)
    return {"result": [float(v) for v in result] if isinstance(result, list) else None,
            "result_type": type(result).__name__,
            # a float subclass (numpy.float64) is a Python float; numpy.float32 or a tensor is not
            "types": sorted({"float" if isinstance(v, float) else f"{type(v).__module__}.{type(v).__qualname__}"
                             for v in result}) if isinstance(result, list) else [],
            "reads": reads.count, "methods": reads.methods[:12], "steps": steps}


def judge_log_record(d, steps, every, expected, last_group=None, rel=1e-5):
    """What is wrong with one ``observe_log_losses`` record of ``steps`` steps logged every ``every``, against
    ``expected`` (the means, worked out by whoever calls this: stored for the public case, the grader's own
    reference for the hidden ones). ``last_group``: the size of a last, shorter group (None if none)."""
    if d["steps"] != list(range(steps)):
        return f"call step once per batch, in order ({steps} batches; saw calls for {d['steps'][:20]})"
    if d["result"] is None:
        return f"return a list of floats, not a {d['result_type']}"
    if d["types"] not in ([], ["float"]):
        return f"the list must hold Python floats, got {d['types']}"
    if len(d["result"]) != len(expected):
        return (f"{steps} steps logged every {every} should give {len(expected)} values, got "
                f"{len(d['result'])}; a last, shorter group is reported too")
    off = [not abs(a - b) <= rel * max(1.0, abs(b)) for a, b in zip(d["result"], expected)]
    if off[-1:] == [True] and not any(off[:-1]) and last_group:
        return (f"the last group has {last_group} step(s), fewer than every={every}: "
                f"report the mean of the steps it has")
    if any(off):
        return "the values must be the mean loss of each group of `every` consecutive steps"
    if d["reads"] > len(expected):
        return (f"{d['reads']} reads of tensor values ({', '.join(sorted(set(d['methods'])))}) for {len(expected)} "
                f"logged values: each one makes a TPU stop and wait; read at most once per logged value")
    return None


PUBLIC_LOSSES = [4.0, 2.0, 3.0, 1.0, 1.5, 0.5, 2.5]
PUBLIC_MEANS = [3.0, 1.0, 2.5]  # the text's rule on PUBLIC_LOSSES, every 3: (4 + 2 + 3) / 3, (1 + 1.5 + 0.5) / 3, 2.5 / 1


def observe_log_losses_public(ns):
    from gpucourse.checks.lesson08_tpus_xla import PUBLIC_LOSSES, observe_log_losses
    return observe_log_losses(ns, PUBLIC_LOSSES, 3)


def judge_log_losses_public(d):
    return judge_log_record(d, len(PUBLIC_LOSSES), 3, PUBLIC_MEANS, last_group=1)


register("log_losses", Case("7 steps logged every 3 steps", observe_log_losses_public, judge_log_losses_public),
         answers=[Answer("log_losses", "function",
                         "a function log_losses(step, batches, every) returning a list of Python floats, "
                         "the mean loss of each group of steps")], points=2)

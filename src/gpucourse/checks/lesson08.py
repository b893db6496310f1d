"""Public checks for lesson 8 (TPUs and XLA). Observers are self-contained: see lesson01.py.

``pad_to_bucket`` is observed on a small batch; ``log_losses`` runs with a step function whose losses
are known, inside ``gpucourse.xla.count_host_reads`` so that every read of a tensor value by the
student's code (the thing that stalls a TPU) is counted. ``pad_batches`` and ``loss_runs`` generate
inputs from a seed, as plain data, wherever they run: an observer builds tensors from them and a
judge recomputes the expected results from the same seed, so expected values never enter the sandbox.
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


def pad_batches(seed: int, count: int) -> list[dict]:
    """``count`` random calls of pad_to_bucket as plain data: buckets (distinct, in random order, a list
    or a tuple), the tokens' dtype, pad_value, and the sequences (some empty, some exactly a bucket long,
    a batch of one, tokens equal to pad_value); about one call in seven has a sequence longer than every bucket.
    """
    import random

    rng = random.Random(seed)
    calls = []
    for _ in range(count):
        buckets = rng.sample(range(1, 40), rng.randint(1, 5))
        dtype = rng.choice(["int64", "int32", "int16", "uint8"])
        pad_value = rng.choice([0, 0, 1, 5] + ([] if dtype == "uint8" else [-1]))
        draw = rng.random()
        if draw < 0.15:
            longest = max(buckets) + rng.randint(1, 5)
        elif draw < 0.5:
            longest = rng.choice(buckets)
        else:
            longest = rng.randint(0, max(buckets))
        lengths = [rng.randint(0, longest) for _ in range(rng.choice([0, 0, 1, 2, 4, 7]))]
        lengths.insert(rng.randint(0, len(lengths)), longest)  # the longest sequence anywhere in the batch
        pool = [pad_value, pad_value, 0, 1, 2, 3, 9]
        calls.append({"buckets": buckets, "as": rng.choice(["list", "tuple"]), "dtype": dtype, "pad_value": pad_value,
                      "sequences": [[rng.choice(pool) for _ in range(n)] for n in lengths]})
    return calls


def observe_pad_calls(ns, calls):
    """Call pad_to_bucket on each of ``calls`` (plain data, as ``pad_batches`` makes them); record the
    results, their dtypes and shapes, or the exception's name, and whether the inputs were changed."""
    import torch
    from gpucourse.checks import answer

    pad = answer(ns, "pad_to_bucket")
    results = []
    for call in calls:
        dtype = getattr(torch, call["dtype"])
        batch = [torch.tensor(s, dtype=dtype) for s in call["sequences"]]
        copies = [t.clone() for t in batch]
        buckets = list(call["buckets"]) if call["as"] == "list" else tuple(call["buckets"])
        try:
            padded, mask = pad(batch, buckets, pad_value=call["pad_value"])
        except ValueError:
            results.append({"error": "ValueError"})
            continue
        except Exception as error:  # noqa: BLE001 - any other exception is a wrong answer, reported by name
            results.append({"error": type(error).__name__})
            continue
        tensors = isinstance(padded, torch.Tensor) and isinstance(mask, torch.Tensor)
        results.append({
            "padded": padded.tolist() if tensors else None, "mask": mask.tolist() if tensors else None,
            "dtype": str(padded.dtype) if tensors else type(padded).__name__,
            "mask_dtype": str(mask.dtype) if tensors else type(mask).__name__,
            "shapes": [list(padded.shape), list(mask.shape)] if tensors else None,
            "inputs_unchanged": len(batch) == len(copies) and all(
                a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(batch, copies))
            and list(buckets) == call["buckets"]})
    return results


register("pad_to_bucket", Case("two sequences, buckets (4, 8); a sequence of 9 tokens", observe_pad_small, judge_pad_small),
         answers=[Answer("pad_to_bucket", "function",
                         "a function pad_to_bucket(batch, buckets, pad_value=0) returning the pair (padded, mask) "
                         "of tensors")], points=3)


# --- Exercise 2: log_losses ----------------------------------------------------------------


def observe_log_losses(ns, losses, every, requires_grad=False):
    """Run ``log_losses`` on batches 0..n-1 whose step returns ``losses[i]``; count host reads."""
    import torch
    from gpucourse.checks import answer
    from gpucourse.xla import count_host_reads

    weight = torch.ones((), requires_grad=requires_grad)
    values = [torch.tensor(float(v)) for v in losses]
    steps = []

    def step(batch):
        steps.append(batch)
        return weight * values[batch]

    log_losses = answer(ns, "log_losses")
    with count_host_reads() as reads:
        result = log_losses(step, list(range(len(losses))), every)
    return {"result": [float(v) for v in result] if isinstance(result, list) else None,
            "result_type": type(result).__name__,
            # a float subclass (numpy.float64) is a Python float; numpy.float32 or a tensor is not
            "types": sorted({"float" if isinstance(v, float) else f"{type(v).__module__}.{type(v).__qualname__}"
                             for v in result}) if isinstance(result, list) else [],
            "reads": reads.count, "methods": reads.methods[:12], "steps": steps}


def judge_log_losses(losses, every):
    """A judge for ``observe_log_losses(ns, losses, every)``: group means, order, and the read budget."""
    groups = [losses[i:i + every] for i in range(0, len(losses), every)]
    expected = [sum(g) / len(g) for g in groups]

    def judge(d):
        if d["steps"] != list(range(len(losses))):
            return f"call step once per batch, in order ({len(losses)} batches; saw calls for {d['steps'][:20]})"
        if d["result"] is None:
            return f"return a list of floats, not a {d['result_type']}"
        if d["types"] not in ([], ["float"]):
            return f"the list must hold Python floats, got {d['types']}"
        if len(d["result"]) != len(expected):
            return (f"{len(losses)} steps logged every {every} should give {len(expected)} values, got "
                    f"{len(d['result'])}; a last, shorter group is reported too")
        off = [not abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(d["result"], expected)]
        if off[-1:] == [True] and not any(off[:-1]) and len(groups[-1]) < every:
            return (f"the last group has {len(groups[-1])} step(s), fewer than every={every}: "
                    f"report the mean of the steps it has")
        if any(off):
            return "the values must be the mean loss of each group of `every` consecutive steps"
        if d["reads"] > len(expected):
            return (f"{d['reads']} reads of tensor values ({', '.join(sorted(set(d['methods'])))}) for {len(expected)} "
                    f"logged values: each one makes a TPU stop and wait; read at most once per logged value")
        return None

    return judge


def loss_runs(seed: int, count: int) -> list[dict]:
    """``count`` random (losses, every) pairs as plain data: 1 to 30 steps, every from 1 to 12 (sometimes
    more than the steps, sometimes dividing them exactly), losses in [0.05, 20] rounded to 2 decimals."""
    import random

    rng = random.Random(seed)
    runs = []
    for _ in range(count):
        steps = rng.randint(1, 30)
        every = rng.choice([rng.randint(1, 12), rng.choice([d for d in range(1, steps + 1) if steps % d == 0])])
        runs.append({"losses": [round(rng.uniform(0.05, 20), 2) for _ in range(steps)], "every": every})
    return runs


PUBLIC_LOSSES = [4.0, 2.0, 3.0, 1.0, 1.5, 0.5, 2.5]


def observe_log_losses_public(ns):
    from gpucourse.checks.lesson08 import PUBLIC_LOSSES, observe_log_losses
    return observe_log_losses(ns, PUBLIC_LOSSES, 3)


register("log_losses", Case("7 steps logged every 3 steps", observe_log_losses_public, judge_log_losses(PUBLIC_LOSSES, 3)),
         answers=[Answer("log_losses", "function",
                         "a function log_losses(step, batches, every) returning a list of Python floats, "
                         "the mean loss of each group of steps")], points=2)

"""Hidden checks for lesson 8 (TPUs and XLA). Never released; see lesson01's file for the form."""

from gpucourse.checks import Case
from gpucourse.checks.lesson08 import judge_log_losses



# --- pad_to_bucket -------------------------------------------------------------------------

def observe_pad_bucket_choice(ns):
    import torch
    from gpucourse.checks import answer

    pad = answer(ns, "pad_to_bucket")
    out = {}
    for name, buckets in [("list", [32, 8, 16]), ("tuple", (16, 32, 8))]:
        widths = []
        for lengths in ([8, 3], [9], [16, 2, 5], [17], [32], [1]):
            padded, mask = pad([torch.arange(1, n + 1) for n in lengths], buckets)
            widths.append([list(padded.shape), list(mask.shape)])
        try:
            pad([torch.arange(33)], buckets)
            widths.append("returned")
        except ValueError:
            widths.append("ValueError")
        except Exception as error:  # noqa: BLE001
            widths.append(type(error).__name__)
        out[name] = widths
    return out


def judge_pad_bucket_choice(d):
    want = [[[2, 8], [2, 8]], [[1, 16], [1, 16]], [[3, 16], [3, 16]], [[1, 32], [1, 32]], [[1, 32], [1, 32]],
            [[1, 8], [1, 8]], "ValueError"]
    for name in ("list", "tuple"):
        got = d[name]
        if got[-1] != "ValueError":
            return f"buckets given as an unsorted {name}: a sequence longer than every bucket must raise ValueError"
        if got != want:
            return (f"buckets given as an unsorted {name}, lengths that fit a bucket exactly and lengths one past it: "
                    f"the width must be the smallest bucket >= the longest sequence, for padded and mask alike")
    return None


def observe_pad_dtype_and_values(ns):
    import torch
    from gpucourse.checks import answer

    pad = answer(ns, "pad_to_bucket")
    batch = [torch.tensor([3, 1], dtype=torch.int32), torch.tensor([7, 7, 7, 9, 2], dtype=torch.int32),
             torch.tensor([], dtype=torch.int32)]
    padded, mask = pad(batch, [6, 12], pad_value=-1)
    out = {"padded": padded.tolist(), "mask": mask.tolist(), "dtype": str(padded.dtype), "mask_dtype": str(mask.dtype),
           "input_untouched": [t.tolist() for t in batch]}
    try:
        pad([], [4])
        out["empty"] = "returned"
    except ValueError:
        out["empty"] = "ValueError"
    except Exception as error:  # noqa: BLE001
        out["empty"] = type(error).__name__
    return out


def judge_pad_dtype_and_values(d):
    if d["dtype"] != "torch.int32" or d["mask_dtype"] != "torch.bool":
        return f"int32 tokens came back as {d['dtype']} (mask {d['mask_dtype']}): keep the dtype; the mask is bool"
    if d["padded"] != [[3, 1, -1, -1, -1, -1], [7, 7, 7, 9, 2, -1], [-1] * 6]:
        return "with pad_value=-1 (and an empty sequence in the batch), rows must be the tokens then pad_value"
    if d["mask"] != [[True, True] + [False] * 4, [True] * 5 + [False], [False] * 6]:
        return "the mask must be True exactly on real tokens (an empty sequence has none)"
    if d["input_untouched"] != [[3, 1], [7, 7, 7, 9, 2], []]:
        return "the input sequences were modified"
    if d["empty"] != "ValueError":
        return f"an empty batch must raise ValueError (got: {d['empty']})"
    return None


def observe_pad_compiles(ns):
    """The point of buckets: 24 batches of random lengths through torch.compile(dynamic=False)."""
    import torch
    from gpucourse.checks import answer
    from gpucourse.xla import TinyEncoder, run_compiled, token_batches

    torch.manual_seed(0)
    buckets = (32, 8, 16)
    generator = torch.Generator().manual_seed(8)
    lengths = [int(n) for n in torch.randint(1, 33, (24,), generator=generator)]
    batches = token_batches(24, 3, lengths, seed=8)
    calls = [answer(ns, "pad_to_bucket")(batch, buckets) for batch in batches]
    model = TinyEncoder().eval()
    widths = sorted({int(padded.shape[1]) for padded, _ in calls})
    with torch.no_grad():
        diffs = []
        for batch, (padded, mask) in zip(batches[:6], calls[:6]):
            alone = torch.cat([model(seq[None], torch.ones(1, len(seq), dtype=torch.bool)) for seq in batch])
            diffs.append(float((model(padded, mask) - alone).abs().max()))
        # compiling one graph per width takes a while; widths outside the buckets already fail
        graphs = run_compiled(model, calls, dynamic=False).graphs if set(widths) <= set(buckets) else -1
    needed = sorted({min(b for b in buckets if b >= max(lengths_i)) for lengths_i in
                     ([len(s) for s in batch] for batch in batches)})
    return {"graphs": graphs, "widths": widths, "needed": needed, "max_diff": max(diffs)}


def judge_pad_compiles(d):
    if d["widths"] != d["needed"]:
        return f"24 random batches were padded to widths {d['widths']}: only the smallest fitting buckets may appear"
    if d["graphs"] > len(d["needed"]):
        return f"torch.compile(dynamic=False) built {d['graphs']} graphs for {len(d['needed'])} buckets"
    if d["max_diff"] > 1e-5:
        return "a masked model gives other results on the padded batch than on each sequence alone: check the mask"
    return None


# --- log_losses ----------------------------------------------------------------------------

LOSSES_10 = [2.0, 4.0, 6.0, 1.0, 1.0, 1.0, 0.25, 0.75, 0.5, 9.0]
LOSSES_4 = [1.0, 3.0, 2.0, 0.5]
LOSSES_6 = [0.5, 1.5, 2.0, 2.0, 3.0, 5.0]


def observe_log_ten(ns):
    from gpucourse.checks.lesson08 import observe_log_losses
    return observe_log_losses(ns, [2.0, 4.0, 6.0, 1.0, 1.0, 1.0, 0.25, 0.75, 0.5, 9.0], 3)


def observe_log_every_step(ns):
    from gpucourse.checks.lesson08 import observe_log_losses
    return observe_log_losses(ns, [1.0, 3.0, 2.0, 0.5], 1)


def observe_log_one_group(ns):
    from gpucourse.checks.lesson08 import observe_log_losses
    return observe_log_losses(ns, [1.0, 3.0, 2.0, 0.5], 10)


def observe_log_with_grad(ns):
    from gpucourse.checks.lesson08 import observe_log_losses
    return observe_log_losses(ns, [0.5, 1.5, 2.0, 2.0, 3.0, 5.0], 2, requires_grad=True)


def observe_log_no_batches(ns):
    from gpucourse.checks.lesson08 import observe_log_losses
    return observe_log_losses(ns, [], 4)


HIDDEN = {
    "pad_to_bucket": [
        Case("unsorted buckets, exact fits, one past a bucket, too long", observe_pad_bucket_choice, judge_pad_bucket_choice),
        Case("int32 tokens, pad_value=-1, an empty sequence, an empty batch", observe_pad_dtype_and_values,
             judge_pad_dtype_and_values),
        Case("24 random batches through torch.compile(dynamic=False)", observe_pad_compiles, judge_pad_compiles),
    ],
    "log_losses": [
        Case("10 steps logged every 3", observe_log_ten, judge_log_losses(LOSSES_10, 3)),
        Case("logged every step", observe_log_every_step, judge_log_losses(LOSSES_4, 1)),
        Case("fewer steps than `every`", observe_log_one_group, judge_log_losses(LOSSES_4, 10)),
        Case("losses that require grad", observe_log_with_grad, judge_log_losses(LOSSES_6, 2)),
        Case("no batches", observe_log_no_batches, judge_log_losses([], 4)),
    ],
}

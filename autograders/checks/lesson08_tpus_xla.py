"""Hidden checks for lesson 8 (TPUs and XLA). Never released; see lesson01's file for the form.

Inputs are plain data: a literal in the observer (which also returns it, so that a judge notices
when the observer's copy and the one it judges against drift apart) or generated from a seed by
``gpucourse.checks.lesson08.pad_batches`` / ``loss_runs`` on both sides. The judges compute what
is expected here, in the grader.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson08 import judge_log_losses, loss_runs, pad_batches


def expected_pad(call: dict):
    """What pad_to_bucket must give for one call of ``pad_batches``: (padded, mask) as lists, or "ValueError"."""
    longest = max(len(s) for s in call["sequences"])
    fitting = [b for b in call["buckets"] if b >= longest]
    if not fitting:
        return "ValueError"
    width = min(fitting)
    return ([s + [call["pad_value"]] * (width - len(s)) for s in call["sequences"]],
            [[True] * len(s) + [False] * (width - len(s)) for s in call["sequences"]])


def judge_pad_calls(calls, results, clauses=None) -> str | None:
    """The first clause of the exercise's text that ``results`` (from ``observe_pad_calls``) break, or None.

    ``clauses`` limits the judging to some of: "width", "dtype", "rows", "mask", "raise", "inputs".
    """
    clauses = set(clauses or ("width", "dtype", "rows", "mask", "raise", "inputs"))
    if len(results) != len(calls):
        return f"expected {len(calls)} results, got {len(results)}"
    for call, got in zip(calls, results):
        want = expected_pad(call)
        lengths = [len(s) for s in call["sequences"]]
        where = (f"lengths {lengths}, buckets {tuple(call['buckets']) if call['as'] == 'tuple' else call['buckets']}, "
                 f"torch.{call['dtype']} tokens, pad_value={call['pad_value']}")
        if want == "ValueError":
            if "raise" in clauses and got.get("error") != "ValueError":
                return f"{where}: a sequence longer than every bucket must raise ValueError (got {got.get('error', 'a result')})"
            continue
        if "error" in got:
            return f"{where}: raised {got['error']}, although a bucket fits the longest sequence"
        padded, mask = want
        if "width" in clauses and (got["shapes"] is None or got["shapes"][0] != [len(padded), len(padded[0])]
                                   or got["shapes"][1] != got["shapes"][0]):
            return (f"{where}: padded and mask came back with shapes {got['shapes']}: "
                    f"(len(batch), the smallest bucket >= the longest sequence) for both")
        if "dtype" in clauses and (got["dtype"] != f"torch.{call['dtype']}" or got["mask_dtype"] != "torch.bool"):
            return f"{where}: dtypes {got['dtype']} / {got['mask_dtype']}: keep the tokens' dtype; the mask is torch.bool"
        if "rows" in clauses and got["padded"] != padded:
            return f"{where}: each row must hold its sequence first, then pad_value up to the bucket length"
        if "mask" in clauses and got["mask"] != mask:
            return f"{where}: the mask must be True exactly on the real tokens, whatever their values"
        if "inputs" in clauses and not got["inputs_unchanged"]:
            return f"{where}: the input sequences or the buckets were modified"
    return None


# --- pad_to_bucket -------------------------------------------------------------------------
# What the exercise's text states, and the hidden case that checks it:
#  1. batch: a non-empty list of 1-D integer tensors; a sequence may be empty ..... "clause 1: ..."
#  2. buckets: a list or tuple of positive ints, in any order ...................... "clauses 2-3: ..."
#  3. padded: shape (len(batch), L), L the smallest bucket >= the longest sequence .. "clauses 2-3: ..."
#  4. padded keeps the sequences' dtype ............................................ "clauses 4, 6: ..."
#  5. each row: its sequence, then pad_value up to L (right padding) ............... "clause 5: ..."
#  6. mask: a torch.bool tensor of padded's shape .................................. "clauses 4, 6: ..."
#  7. mask True exactly on the real tokens, whatever their values (pad_value too) .. "clause 7: ..."
#  8. ValueError when the longest sequence is longer than every bucket ............. "clause 8: ..."
#  9. ValueError for an empty batch ................................................ "clause 9: ..."
# 10. the inputs (the sequences, the buckets) are not modified ...................... "clause 10: ..."
# 11. 24 random batches through torch.compile(dynamic=False): at most one graph per
#     bucket, and the masked model gives each sequence's own result ................. "clause 11: ..."
# 1-10 together, on 60 generated calls (pad_batches) ................................ "clauses 1-10: ..."

def _calls(rows):
    """(buckets, as, dtype, pad_value, sequences) rows as pad_batches' dicts."""
    return [dict(zip(("buckets", "as", "dtype", "pad_value", "sequences"), row)) for row in rows]


PAD_ONE = _calls([
    ([4, 2], "list", "int64", 0, [[3, 1, 4]]),
    ([6, 3], "tuple", "int64", 0, [[8, 8], [], [5, 6, 7, 9]]),
    ([5, 1], "list", "int32", 2, [[], []]),
    ([7], "tuple", "int64", 0, [[1, 2, 3, 4, 5, 6, 7]]),
])


def observe_pad_one_and_empty(ns):
    from gpucourse.checks.lesson08 import observe_pad_calls
    calls = [{"buckets": [4, 2], "as": "list", "dtype": "int64", "pad_value": 0, "sequences": [[3, 1, 4]]},
             {"buckets": [6, 3], "as": "tuple", "dtype": "int64", "pad_value": 0, "sequences": [[8, 8], [], [5, 6, 7, 9]]},
             {"buckets": [5, 1], "as": "list", "dtype": "int32", "pad_value": 2, "sequences": [[], []]},
             {"buckets": [7], "as": "tuple", "dtype": "int64", "pad_value": 0, "sequences": [[1, 2, 3, 4, 5, 6, 7]]}]
    return {"calls": calls, "results": observe_pad_calls(ns, calls)}


PAD_WIDTH = _calls([
    ([32, 8, 16], "list", "int64", 0, [list(range(1, 9)), [1, 2, 3]]),
    ([32, 8, 16], "list", "int64", 0, [list(range(1, 10))]),
    ([16, 32, 8], "tuple", "int64", 0, [list(range(1, 17)), [1, 2], [1, 2, 3, 4, 5]]),
    ([16, 32, 8], "tuple", "int64", 0, [list(range(1, 18))]),
    ([32, 8, 16], "list", "int64", 0, [list(range(1, 33))]),
    ([16, 32, 8], "tuple", "int64", 0, [[1]]),
    ([3, 1, 2], "list", "int64", 0, [[4, 4], [4]]),
    ([10, 30, 20], "tuple", "int64", 0, [[1] * 11, [2] * 20, [3] * 5]),
])


def observe_pad_width(ns):
    from gpucourse.checks.lesson08 import observe_pad_calls
    calls = [{"buckets": [32, 8, 16], "as": "list", "dtype": "int64", "pad_value": 0, "sequences": [list(range(1, 9)), [1, 2, 3]]},
             {"buckets": [32, 8, 16], "as": "list", "dtype": "int64", "pad_value": 0, "sequences": [list(range(1, 10))]},
             {"buckets": [16, 32, 8], "as": "tuple", "dtype": "int64", "pad_value": 0,
              "sequences": [list(range(1, 17)), [1, 2], [1, 2, 3, 4, 5]]},
             {"buckets": [16, 32, 8], "as": "tuple", "dtype": "int64", "pad_value": 0, "sequences": [list(range(1, 18))]},
             {"buckets": [32, 8, 16], "as": "list", "dtype": "int64", "pad_value": 0, "sequences": [list(range(1, 33))]},
             {"buckets": [16, 32, 8], "as": "tuple", "dtype": "int64", "pad_value": 0, "sequences": [[1]]},
             {"buckets": [3, 1, 2], "as": "list", "dtype": "int64", "pad_value": 0, "sequences": [[4, 4], [4]]},
             {"buckets": [10, 30, 20], "as": "tuple", "dtype": "int64", "pad_value": 0, "sequences": [[1] * 11, [2] * 20, [3] * 5]}]
    return {"calls": calls, "results": observe_pad_calls(ns, calls)}


PAD_DTYPE = _calls([
    ([6, 12], "list", "int32", 0, [[3, 1], [7, 7, 7, 9, 2]]),
    ([4], "tuple", "int16", 1, [[300, 2, 3], [9]]),
    ([8, 2], "list", "uint8", 0, [[250, 1, 2], [255]]),
    ([5, 3], "tuple", "int64", 4, [[1, 2, 3]]),
])


def observe_pad_dtypes(ns):
    from gpucourse.checks.lesson08 import observe_pad_calls
    calls = [{"buckets": [6, 12], "as": "list", "dtype": "int32", "pad_value": 0, "sequences": [[3, 1], [7, 7, 7, 9, 2]]},
             {"buckets": [4], "as": "tuple", "dtype": "int16", "pad_value": 1, "sequences": [[300, 2, 3], [9]]},
             {"buckets": [8, 2], "as": "list", "dtype": "uint8", "pad_value": 0, "sequences": [[250, 1, 2], [255]]},
             {"buckets": [5, 3], "as": "tuple", "dtype": "int64", "pad_value": 4, "sequences": [[1, 2, 3]]}]
    return {"calls": calls, "results": observe_pad_calls(ns, calls)}


PAD_ROWS = _calls([
    ([6, 12], "list", "int32", -1, [[3, 1], [7, 7, 7, 9, 2], []]),
    ([4, 8], "tuple", "int64", 7, [[1, 2, 3, 4, 5], [6]]),
    ([3], "list", "int64", 0, [[9, 8, 7], [6, 5]]),
])


def observe_pad_rows(ns):
    from gpucourse.checks.lesson08 import observe_pad_calls
    calls = [{"buckets": [6, 12], "as": "list", "dtype": "int32", "pad_value": -1, "sequences": [[3, 1], [7, 7, 7, 9, 2], []]},
             {"buckets": [4, 8], "as": "tuple", "dtype": "int64", "pad_value": 7, "sequences": [[1, 2, 3, 4, 5], [6]]},
             {"buckets": [3], "as": "list", "dtype": "int64", "pad_value": 0, "sequences": [[9, 8, 7], [6, 5]]}]
    return {"calls": calls, "results": observe_pad_calls(ns, calls)}


PAD_MASK = _calls([
    ([4, 8], "list", "int64", 0, [[0, 4, 0], [0], []]),
    ([3, 6], "tuple", "int32", -1, [[-1, -1], [3, -1, 2, -1]]),
    ([4], "list", "int64", 5, [[5, 5, 5, 5], [5, 5]]),
    ([2, 4], "tuple", "uint8", 0, [[0, 0, 0], [1, 0]]),
])


def observe_pad_mask(ns):
    from gpucourse.checks.lesson08 import observe_pad_calls
    calls = [{"buckets": [4, 8], "as": "list", "dtype": "int64", "pad_value": 0, "sequences": [[0, 4, 0], [0], []]},
             {"buckets": [3, 6], "as": "tuple", "dtype": "int32", "pad_value": -1, "sequences": [[-1, -1], [3, -1, 2, -1]]},
             {"buckets": [4], "as": "list", "dtype": "int64", "pad_value": 5, "sequences": [[5, 5, 5, 5], [5, 5]]},
             {"buckets": [2, 4], "as": "tuple", "dtype": "uint8", "pad_value": 0, "sequences": [[0, 0, 0], [1, 0]]}]
    return {"calls": calls, "results": observe_pad_calls(ns, calls)}


PAD_TOO_LONG = _calls([
    ([16, 4, 8], "list", "int64", 0, [list(range(1, 18))]),
    ([2, 40], "tuple", "int64", 0, [[1, 2, 3], [1] * 41, [1]]),
    ([5], "list", "int64", 0, [[], [1, 2, 3, 4, 5, 6]]),
    ([8, 4], "tuple", "int32", -1, [[1] * 4, [2] * 100]),
])


def observe_pad_too_long(ns):
    from gpucourse.checks.lesson08 import observe_pad_calls
    calls = [{"buckets": [16, 4, 8], "as": "list", "dtype": "int64", "pad_value": 0, "sequences": [list(range(1, 18))]},
             {"buckets": [2, 40], "as": "tuple", "dtype": "int64", "pad_value": 0, "sequences": [[1, 2, 3], [1] * 41, [1]]},
             {"buckets": [5], "as": "list", "dtype": "int64", "pad_value": 0, "sequences": [[], [1, 2, 3, 4, 5, 6]]},
             {"buckets": [8, 4], "as": "tuple", "dtype": "int32", "pad_value": -1, "sequences": [[1] * 4, [2] * 100]}]
    return {"calls": calls, "results": observe_pad_calls(ns, calls)}


def observe_pad_empty_batch(ns):
    from gpucourse.checks import answer

    pad = answer(ns, "pad_to_bucket")
    out = []
    for buckets in ([4], (8, 2)):
        try:
            pad([], buckets)
            out.append("returned")
        except ValueError:
            out.append("ValueError")
        except Exception as error:  # noqa: BLE001
            out.append(type(error).__name__)
    return out


PAD_INPUTS = _calls([
    ([32, 8, 16], "list", "int64", 0, [[5, 4, 3, 2, 1], [9, 9]]),
    ([9, 3, 6], "list", "int32", -1, [[1, 2, 3, 4], []]),
])


def observe_pad_inputs(ns):
    from gpucourse.checks.lesson08 import observe_pad_calls
    calls = [{"buckets": [32, 8, 16], "as": "list", "dtype": "int64", "pad_value": 0, "sequences": [[5, 4, 3, 2, 1], [9, 9]]},
             {"buckets": [9, 3, 6], "as": "list", "dtype": "int32", "pad_value": -1, "sequences": [[1, 2, 3, 4], []]}]
    return {"calls": calls, "results": observe_pad_calls(ns, calls)}


def observe_pad_random(ns):
    from gpucourse.checks.lesson08 import observe_pad_calls, pad_batches
    return {"calls": pad_batches(808, 60), "results": observe_pad_calls(ns, pad_batches(808, 60))}


def _pad_judge(calls, clauses=None):
    def judge(d):
        if d["calls"] != calls:
            return "the observer's inputs differ from the judge's (a grader error)"
        return judge_pad_calls(calls, d["results"], clauses)
    return judge


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
    with torch.random.fork_rng(devices=[]):  # the same weights whatever the answer drew: the judge builds it too
        torch.manual_seed(0)
        model = TinyEncoder().eval()
    widths = sorted({int(padded.shape[1]) for padded, _ in calls})
    with torch.no_grad():  # the padded batches' outputs: the judge computes each sequence's alone
        outputs = [model(padded, mask).double().reshape(-1).tolist() for padded, mask in calls[:6]]
        # compiling one graph per width takes a while; widths outside the buckets already fail
        graphs = run_compiled(model, calls, dynamic=False).graphs if set(widths) <= set(buckets) else -1
    return {"graphs": graphs, "widths": widths, "outputs": outputs}


def compile_alone_outputs() -> list[list[float]]:
    """The first 6 of observe_pad_compiles' batches through the same TinyEncoder, one sequence at a time
    (no padding): what the padded batches must give, computed here."""
    import torch
    from gpucourse.xla import TinyEncoder, token_batches
    lengths = [int(n) for n in torch.randint(1, 33, (24,), generator=torch.Generator().manual_seed(8))]
    from gpucourse.checks.seeded import global_rng  # the grader's threads share torch's generator
    with global_rng():
        torch.manual_seed(0)
        model = TinyEncoder().eval()
    with torch.no_grad():
        return [torch.cat([model(seq[None], torch.ones(1, len(seq), dtype=torch.bool)) for seq in batch]).double().reshape(-1).tolist()
                for batch in token_batches(24, 3, lengths, seed=8)[:6]]


def compile_buckets_needed() -> list[int]:
    """The buckets observe_pad_compiles' 24 batches need, worked out here from the same seed."""
    import torch
    from gpucourse.xla import token_batches
    buckets = (32, 8, 16)
    lengths = [int(n) for n in torch.randint(1, 33, (24,), generator=torch.Generator().manual_seed(8))]
    return sorted({min(b for b in buckets if b >= max(len(s) for s in batch)) for batch in token_batches(24, 3, lengths, seed=8)})


def judge_pad_compiles(d):
    needed = compile_buckets_needed()
    if d["widths"] != needed:
        return f"24 random batches were padded to widths {d['widths']}: only the smallest fitting buckets may appear"
    if not isinstance(d["graphs"], int) or not 1 <= d["graphs"] <= len(needed):
        return f"torch.compile(dynamic=False) built {d['graphs']} graphs for {len(needed)} buckets"
    alone = compile_alone_outputs()
    if len(d["outputs"]) != len(alone) or not all(
            len(got) == len(want) and all(abs(a - b) <= 1e-5 for a, b in zip(got, want)) for got, want in zip(d["outputs"], alone)):
        return "a masked model gives other results on the padded batch than on each sequence alone: check the mask"
    return None


# --- log_losses ----------------------------------------------------------------------------
# What the exercise's text states, and the hidden case that checks it:
#  1. call step(batch) once for each batch, in order ........... every case (judged first)
#  2. return a list of Python floats ........................... every case
#  3. the mean loss of each consecutive group of `every` steps .. "clause 3: ..."
#  4. a last, shorter group is reported too, as its own mean .... "clause 4: ..."
#  5. no batches gives [] ....................................... "clause 5: ..."
#  6. at most one host read per reported value, in total ........ "clause 6: ..." (every case counts them)
#  7. the losses may require grad ............................... "clause 7: ..."
# The loss's device ("whatever device the model is") is a CPU here: not checked.

LOG_FIXED = {  # name -> [(losses, every)]
    "every": [([1.0, 3.0, 2.0, 0.5], 1), ([1.0, 3.0, 2.0, 0.5], 4), ([1.0, 3.0, 2.0, 0.5], 10), ([7.5], 1), ([7.5], 3),
              ([2.0, 4.0, 6.0, 1.0, 1.0, 1.0, 0.25, 0.75, 0.5, 9.0], 3)],
    "last": [([6.0, 2.0, 9.0], 2), ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 30.0], 3), ([4.0] * 12 + [1.0], 4)],
    "reads": [([float(i % 7 + 1) for i in range(30)], 10), ([0.5 * (i + 1) for i in range(24)], 24),
              ([1.0, 2.0] * 9, 5)],
    "grad": [([0.5, 1.5, 2.0, 2.0, 3.0, 5.0], 2), ([3.0, 1.0, 2.0], 2)],
}


def observe_log_every(ns):
    from gpucourse.checks.lesson08 import observe_log_losses
    runs = [([1.0, 3.0, 2.0, 0.5], 1), ([1.0, 3.0, 2.0, 0.5], 4), ([1.0, 3.0, 2.0, 0.5], 10), ([7.5], 1), ([7.5], 3),
            ([2.0, 4.0, 6.0, 1.0, 1.0, 1.0, 0.25, 0.75, 0.5, 9.0], 3)]
    return [observe_log_losses(ns, losses, every) for losses, every in runs]


def observe_log_last(ns):
    from gpucourse.checks.lesson08 import observe_log_losses
    runs = [([6.0, 2.0, 9.0], 2), ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 30.0], 3), ([4.0] * 12 + [1.0], 4)]
    return [observe_log_losses(ns, losses, every) for losses, every in runs]


def observe_log_reads(ns):
    from gpucourse.checks.lesson08 import observe_log_losses
    runs = [([float(i % 7 + 1) for i in range(30)], 10), ([0.5 * (i + 1) for i in range(24)], 24), ([1.0, 2.0] * 9, 5)]
    return [observe_log_losses(ns, losses, every) for losses, every in runs]


def observe_log_with_grad(ns):
    from gpucourse.checks.lesson08 import observe_log_losses
    runs = [([0.5, 1.5, 2.0, 2.0, 3.0, 5.0], 2), ([3.0, 1.0, 2.0], 2)]
    return [observe_log_losses(ns, losses, every, requires_grad=True) for losses, every in runs]


def observe_log_no_batches(ns):
    from gpucourse.checks.lesson08 import observe_log_losses
    return [observe_log_losses(ns, [], 4), observe_log_losses(ns, [], 1)]


def observe_log_random(ns):
    from gpucourse.checks.lesson08 import loss_runs, observe_log_losses
    return [observe_log_losses(ns, run["losses"], run["every"]) for run in loss_runs(88, 14)]


def _log_judge(runs):
    def judge(observed):
        if len(observed) != len(runs):
            return f"expected {len(runs)} runs, got {len(observed)}"
        for (losses, every), d in zip(runs, observed):
            verdict = judge_log_losses(losses, every)(d)
            if verdict:
                return f"{len(losses)} step(s), every={every}: {verdict}"
        return None
    return judge


HIDDEN = {
    "pad_to_bucket": [
        Case("clause 1: a batch of one, empty sequences", observe_pad_one_and_empty, _pad_judge(PAD_ONE)),
        Case("clauses 2-3: unsorted buckets (list, tuple), exact fits, one past a bucket: the smallest bucket that fits",
             observe_pad_width, _pad_judge(PAD_WIDTH, ["width"])),
        Case("clauses 4, 6: int32, int16, uint8 tokens keep their dtype; a bool mask of the same shape",
             observe_pad_dtypes, _pad_judge(PAD_DTYPE, ["width", "dtype"])),
        Case("clause 5: rows hold the tokens, then pad_value (-1, 7, 0)", observe_pad_rows, _pad_judge(PAD_ROWS, ["rows"])),
        Case("clause 7: the mask when real tokens equal pad_value", observe_pad_mask, _pad_judge(PAD_MASK, ["mask"])),
        Case("clause 8: a sequence longer than every bucket, anywhere in the batch", observe_pad_too_long,
             _pad_judge(PAD_TOO_LONG, ["raise"])),
        Case("clause 9: an empty batch", observe_pad_empty_batch,
             lambda d: None if d == ["ValueError", "ValueError"] else f"an empty batch must raise ValueError (got {d})"),
        Case("clause 10: the sequences and the buckets list are left unchanged", observe_pad_inputs,
             _pad_judge(PAD_INPUTS, ["inputs"])),
        Case("clauses 1-10: 60 generated calls (dtypes, pad values, bucket sets, batch sizes)", observe_pad_random,
             _pad_judge(pad_batches(808, 60))),
        Case("clause 11: 24 random batches through torch.compile(dynamic=False)", observe_pad_compiles, judge_pad_compiles),
    ],
    "log_losses": [
        Case("clause 3: every=1, every = the steps, every > the steps", observe_log_every, _log_judge(LOG_FIXED["every"])),
        Case("clause 3: 14 generated step counts and intervals", observe_log_random,
             _log_judge([(r["losses"], r["every"]) for r in loss_runs(88, 14)])),
        Case("clause 4: a last, shorter group", observe_log_last, _log_judge(LOG_FIXED["last"])),
        Case("clause 5: no batches", observe_log_no_batches, _log_judge([([], 4), ([], 1)])),
        Case("clause 6: host reads over 30, 24 and 18 steps", observe_log_reads, _log_judge(LOG_FIXED["reads"])),
        Case("clause 7: losses that require grad", observe_log_with_grad, _log_judge(LOG_FIXED["grad"])),
    ],
}

"""Hidden checks for lesson 8 (TPUs and XLA). Never released.

Every case but the compile one is differential: its calls are drawn at grading time (``Case.draw``,
boundaries first, then random ones from the whole domain the exercise's text states), the sandbox
runs the answer on them, and the judges here compare with the references below, which exist on the
grader's side only (the public package holds stored expected values for its fixed cases and no way
to compute a padded batch or a logged mean).
"""

import math

import torch

from gpucourse.checks import Case
from gpucourse.checks.lesson08_tpus_xla import judge_log_record
from gpucourse.checks.values import rebuild, type_words

from autograders.differential import call, outcome, verdict

# --- pad_to_bucket -------------------------------------------------------------------------
# What the exercise's text states, and the hidden case that checks it (CLAUSES below, by name):
#  1. batch: a non-empty list of 1-D integer tensors; a sequence may be empty (all of them too)
#  2. buckets: a list or tuple of positive ints (NumPy ints too), in any order, repeats allowed, none at all (8.)
#  3. padded: shape (len(batch), L), L the smallest bucket >= the longest sequence (>=: an exact fit is
#     its own bucket; ties between equal buckets do not matter)
#  4. padded keeps the sequences' dtype (int8, int16, int32, int64, uint8)
#  5. each row: its sequence, then pad_value up to L (right padding); pad_value defaults to 0, any int
#     the dtype holds, given by position or by name
#  6. mask: a torch.bool tensor of padded's shape
#  7. mask True exactly on the real tokens, whatever their values (pad_value too)
#  8. ValueError when the longest sequence is longer than every bucket (no bucket at all included)
#  9. ValueError for an empty batch
# 10. the inputs (the sequences, the buckets) are not modified
# 11. 24 random batches through torch.compile(dynamic=False): at most one graph per bucket, and the
#     masked model gives each sequence's own result

RANGES = {"int8": (-128, 127), "int16": (-2 ** 15, 2 ** 15 - 1), "int32": (-2 ** 31, 2 ** 31 - 1),
          "int64": (-2 ** 63, 2 ** 63 - 1), "uint8": (0, 255)}


def reference_pad_to_bucket(batch, buckets, pad_value=0):
    """The text's rule: right padding to the smallest bucket >= the longest sequence, and a bool mask."""
    if len(batch) == 0:
        raise ValueError("an empty batch")
    longest = max(len(seq) for seq in batch)
    fitting = [b for b in buckets if b >= longest]
    if not fitting:
        raise ValueError("longer than every bucket")
    width = int(min(fitting))
    padded = torch.full((len(batch), width), pad_value, dtype=batch[0].dtype)
    mask = torch.zeros((len(batch), width), dtype=torch.bool)
    for row, seq in enumerate(batch):
        padded[row, :len(seq)] = seq
        mask[row, :len(seq)] = True
    return padded, mask


def _tokens(rng, dtype, n, pad_value):
    low, high = RANGES[dtype]
    pool = [pad_value, pad_value, 0, 1, 2, 3, 9, low, high, rng.randint(low, high)]
    return torch.tensor([rng.choice(pool) for _ in range(n)], dtype=getattr(torch, dtype))


def _pad_value(rng, dtype):
    # int64's own limits left out: torch's padding functions (pad_sequence, F.pad) take the value as a double
    low, high = RANGES["int32" if dtype == "int64" else dtype]
    return rng.choice([0, 0, 1, 5, 7, high, rng.randint(max(low, -1000), min(high, 1000))] + ([-1, low] if low < 0 else []))


def _buckets(rng, sizes, kind=None):
    """``sizes`` in random order, as a list or a tuple, some of them NumPy ints."""
    import numpy

    sizes = list(sizes)
    rng.shuffle(sizes)
    sizes = [numpy.int64(b) if rng.random() < 0.2 else b for b in sizes]
    kind = kind or rng.choice(["list", "tuple"])
    return sizes if kind == "list" else tuple(sizes)


def _pad_call(rng, batch, buckets, pad_value):
    """The three ways to pass pad_value: left out (when it is 0), by position, by name."""
    how = rng.choice(["default", "position", "name"]) if pad_value == 0 else rng.choice(["position", "name"])
    if how == "default":
        return call(batch, buckets)
    return call(batch, buckets, pad_value) if how == "position" else call(batch, buckets, pad_value=pad_value)


def _random_pad_call(rng, longest_kind=None):
    dtype = rng.choice(list(RANGES))
    pad_value = _pad_value(rng, dtype)
    sizes = rng.sample(range(1, 40), rng.randint(1, 5))
    if rng.random() < 0.2:
        sizes.append(rng.choice(sizes))  # a repeated bucket
    draw = longest_kind or rng.choice(["fits", "fits", "exact", "exact", "too long"])
    if draw == "too long":
        longest = max(sizes) + rng.randint(1, 5)
    elif draw == "exact":
        longest = rng.choice(sizes)
    else:
        longest = rng.randint(0, max(sizes))
    lengths = [rng.randint(0, longest) for _ in range(rng.choice([0, 0, 1, 2, 4, 7]))]
    lengths.insert(rng.randint(0, len(lengths)), longest)  # the longest sequence anywhere in the batch
    batch = [_tokens(rng, dtype, n, pad_value) for n in lengths]
    return _pad_call(rng, batch, _buckets(rng, sizes), pad_value)


def draw_pad_one_and_empty(rng):
    """A batch of one, empty sequences among others, a batch of empty sequences only (L: the smallest bucket)."""
    calls = [call([torch.tensor([4, 2])], [8, 2]), call([torch.tensor([], dtype=torch.int64)], (3, 1)),
             call([torch.tensor([], dtype=torch.int32), torch.tensor([], dtype=torch.int32)], [5, 2], 1),
             call([torch.tensor([7]), torch.tensor([], dtype=torch.int64), torch.tensor([1, 2, 3])], (4, 16))]
    for _ in range(8):
        dtype = rng.choice(list(RANGES))
        pad_value = _pad_value(rng, dtype)
        sizes = rng.sample(range(1, 30), rng.randint(1, 4))
        lengths = rng.choice([[rng.randint(0, max(sizes))], [0] * rng.randint(1, 5),
                              [0, rng.randint(1, min(sizes))] + [0] * rng.randint(0, 3)])
        rng.shuffle(lengths)
        calls.append(_pad_call(rng, [_tokens(rng, dtype, n, pad_value) for n in lengths], _buckets(rng, sizes), pad_value))
    return calls


def draw_pad_width(rng):
    """Unsorted buckets (a list, a tuple, NumPy ints, repeats), exact fits, one past a bucket, a single bucket.
    (No bucket far larger than the sequences: an answer that picks a wrong bucket would allocate it.)"""
    import numpy

    calls = [call([torch.arange(1, 9)], [16, 8, 32]), call([torch.arange(1, 10)], (32, 8, 16)),
             call([torch.ones(5, dtype=torch.int64), torch.ones(2, dtype=torch.int64)], [numpy.int64(9), numpy.int64(5), 7]),
             call([torch.ones(3, dtype=torch.int64)], (3,)), call([torch.ones(4, dtype=torch.int64)], [6, 6, 4, 4])]
    for _ in range(10):
        sizes = rng.sample(range(1, 64), rng.randint(1, 6))
        longest = rng.choice([rng.choice(sizes), rng.choice(sizes) + 1, rng.randint(0, max(sizes))])
        longest = min(longest, max(sizes))
        lengths = [longest] + [rng.randint(0, longest) for _ in range(rng.randint(0, 4))]
        rng.shuffle(lengths)
        dtype = rng.choice(list(RANGES))
        pad_value = _pad_value(rng, dtype)
        calls.append(_pad_call(rng, [_tokens(rng, dtype, n, pad_value) for n in lengths], _buckets(rng, sizes), pad_value))
    return calls


def draw_pad_dtypes(rng):
    """Every integer dtype of tokens, values up to the dtype's limits."""
    calls = []
    for dtype in RANGES:
        for _ in range(2):
            pad_value = _pad_value(rng, dtype)
            sizes = rng.sample(range(1, 20), rng.randint(1, 3))
            lengths = [rng.randint(0, max(sizes)) for _ in range(rng.randint(1, 4))]
            calls.append(_pad_call(rng, [_tokens(rng, dtype, n, pad_value) for n in lengths], _buckets(rng, sizes), pad_value))
    rng.shuffle(calls)
    return calls


def draw_pad_rows(rng):
    """pad_value left out, by position, by name; 0, negative, the dtype's limits."""
    calls = [call([torch.tensor([3, 1], dtype=torch.int32), torch.tensor([], dtype=torch.int32)], [6, 12], -1),
             call([torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6])], (4, 8), pad_value=7),
             call([torch.tensor([9, 8, 7]), torch.tensor([6, 5])], [3])]
    for _ in range(8):
        calls.append(_random_pad_call(rng, "fits"))
    return calls


def draw_pad_mask(rng):
    """Real tokens equal to pad_value, at the start, the end, everywhere."""
    calls = [call([torch.tensor([0, 4, 0]), torch.tensor([0]), torch.tensor([], dtype=torch.int64)], [4, 8]),
             call([torch.tensor([5, 5, 5, 5]), torch.tensor([5, 5])], [4], pad_value=5)]
    for _ in range(8):
        dtype = rng.choice(list(RANGES))
        pad_value = _pad_value(rng, dtype)
        sizes = rng.sample(range(1, 16), rng.randint(1, 3))
        lengths = [rng.randint(0, max(sizes)) for _ in range(rng.randint(1, 4))]
        batch = [torch.full((n,), pad_value, dtype=getattr(torch, dtype)) if rng.random() < 0.6
                 else _tokens(rng, dtype, n, pad_value) for n in lengths]
        calls.append(_pad_call(rng, batch, _buckets(rng, sizes), pad_value))
    return calls


def draw_pad_too_long(rng):
    """A sequence longer than every bucket, first, last or inside the batch; no bucket at all."""
    calls = [call([torch.arange(1, 18)], [16, 4, 8]), call([torch.ones(3, dtype=torch.int64), torch.ones(41, dtype=torch.int64)], (2, 40)),
             call([torch.tensor([], dtype=torch.int64), torch.arange(6)], [5]), call([torch.tensor([1])], []),
             call([torch.tensor([], dtype=torch.int64)], ())]
    for _ in range(8):
        calls.append(_random_pad_call(rng, "too long"))
    return calls


def draw_pad_empty_batch(rng):
    """An empty batch, with buckets of any kind and any pad_value; next to it, batches of one empty
    sequence, which are not empty batches (they pad to the smallest bucket)."""
    calls = [call([], [4]), call([], (8, 2)), call([], [3], 1), call([torch.tensor([], dtype=torch.int64)], [4])]
    for _ in range(3):
        sizes = _buckets(rng, rng.sample(range(1, 50), rng.randint(1, 4)))
        calls.append(call([], sizes, rng.randint(-5, 5)) if rng.random() < 0.5 else call([], sizes, pad_value=rng.randint(-5, 5)))
    dtype = rng.choice(list(RANGES))
    calls.append(_pad_call(rng, [torch.tensor([], dtype=getattr(torch, dtype))], _buckets(rng, rng.sample(range(1, 50), 2)),
                           _pad_value(rng, dtype)))
    return calls


def draw_pad_inputs(rng):
    """Unsorted bucket lists (an answer that sorts them in place changes them), sequences of every dtype."""
    calls = [call([torch.tensor([5, 4, 3, 2, 1]), torch.tensor([9, 9])], [32, 8, 16]),
             call([torch.tensor([1, 2, 3, 4], dtype=torch.int32), torch.tensor([], dtype=torch.int32)], [9, 3, 6], -1)]
    for _ in range(6):
        sizes = rng.sample(range(1, 40), rng.randint(2, 5))
        sizes.sort(reverse=True)
        dtype = rng.choice(list(RANGES))
        pad_value = _pad_value(rng, dtype)
        lengths = [rng.randint(0, max(sizes)) for _ in range(rng.randint(1, 4))]
        calls.append(_pad_call(rng, [_tokens(rng, dtype, n, pad_value) for n in lengths], sizes, pad_value))
    return calls


def draw_pad_random(rng):
    return [_random_pad_call(rng) for _ in range(40)]


def observe_pad_drawn(ns, calls):
    """pad_to_bucket on each drawn call, as ``observe_calls`` reports it, and whether the call left its
    sequences and its buckets as they were."""
    import torch
    from gpucourse.checks import answer
    from gpucourse.checks.values import describe, rebuild

    pad = answer(ns, "pad_to_bucket")
    found = []
    for spec in calls:
        args, kwargs = rebuild(spec["args"]), rebuild(spec["kwargs"])
        batch, buckets = args[0], args[1]
        copies, kind, sizes = [t.clone() for t in batch], type(buckets), list(buckets)
        try:
            got = {"returned": describe(pad(*args, **kwargs))}
        except NotImplementedError:
            raise
        except Exception as error:  # an exception is an outcome: the judge compares its class
            got = {"raised": [k.__name__ for k in type(error).__mro__]}
        got["unchanged"] = bool(len(batch) == len(copies) and all(
            a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(batch, copies))
            and type(buckets) is kind and list(buckets) == sizes)
        found.append(got)
    return found


def _pad_where(spec):
    """The call in words, without its tokens: lengths, buckets, dtype, pad_value and how it was passed."""
    args, kwargs = rebuild(spec["args"]), rebuild(spec["kwargs"])
    batch, buckets = args[0], args[1]
    dtype = str(batch[0].dtype) if batch else "no"
    pad = (f"pad_value={args[2]} (by position)" if len(args) > 2 else f"pad_value={kwargs['pad_value']}"
           if "pad_value" in kwargs else "pad_value left out")
    shown = [int(b) for b in buckets]
    return (f"lengths {[len(s) for s in batch]}, buckets {tuple(shown) if isinstance(buckets, tuple) else shown}, "
            f"{dtype} tokens, {pad}")


def _pair(data):
    """The two described tensors of a returned pair (a tuple, or a list of two), or None."""
    items = data.get("__tuple__") if isinstance(data, dict) and set(data) == {"__tuple__"} else data
    if isinstance(items, list) and len(items) == 2 and all(isinstance(t, dict) and "__tensor__" in t for t in items):
        return items
    return None


ALL_CLAUSES = ("width", "dtype", "rows", "mask", "raise", "inputs")


def judge_pad(clauses=ALL_CLAUSES):
    """A judge of ``observe_pad_drawn``'s outcomes against ``reference_pad_to_bucket``; ``clauses`` limits it
    to some of "width", "dtype", "rows", "mask", "raise", "inputs" (a case says what it is about)."""
    def judge(observed, calls):
        if not isinstance(observed, list) or len(observed) != len(calls):
            return f"{len(observed) if isinstance(observed, list) else 'no'} outcomes for {len(calls)} calls"
        for spec, got in zip(calls, observed):
            where = _pad_where(spec)
            want = outcome(reference_pad_to_bucket, spec)
            if "raised" in want:
                if "raise" in clauses:
                    wrong = verdict(spec, got, want, "pad_to_bucket")
                    if wrong:
                        reason = "an empty batch" if not rebuild(spec["args"])[0] else "a sequence longer than every bucket"
                        did = f"raised {got['raised'][0]}" if "raised" in got else "returned"
                        return f"{where}: {reason} must raise ValueError ({did})"
                continue
            if "raised" in got:
                return f"{where}: raised {got['raised'][0]}, although a bucket fits the longest sequence"
            pair, (padded, mask) = _pair(got.get("returned")), _pair(want["returned"])
            if pair is None:
                return f"{where}: returned {type_words(got.get('returned'))}: return the pair (padded, mask) of tensors"
            if "width" in clauses and (pair[0]["shape"] != padded["shape"] or pair[1]["shape"] != pair[0]["shape"]):
                return (f"{where}: padded and mask came back with shapes {[pair[0]['shape'], pair[1]['shape']]}: "
                        f"(len(batch), the smallest bucket >= the longest sequence) for both")
            if "dtype" in clauses and (pair[0]["__tensor__"] != padded["__tensor__"] or pair[1]["__tensor__"] != "bool"):
                return (f"{where}: dtypes torch.{pair[0]['__tensor__']} / torch.{pair[1]['__tensor__']}: keep the tokens' "
                        f"dtype; the mask is torch.bool")
            if "rows" in clauses and (pair[0]["shape"] != padded["shape"] or pair[0]["values"] != padded["values"]):
                return f"{where}: each row must hold its sequence first, then pad_value up to the bucket length"
            if "mask" in clauses and (pair[1]["shape"] != mask["shape"] or pair[1]["values"] != mask["values"]):
                return f"{where}: the mask must be True exactly on the real tokens, whatever their values"
            if "inputs" in clauses and not got.get("unchanged"):
                return f"{where}: the input sequences or the buckets were modified"
        return None
    return judge


def observe_pad_compiles(ns, inputs):
    """The point of buckets: 24 batches of random lengths (drawn: the seed, the buckets) through
    torch.compile(dynamic=False)."""
    import torch
    from gpucourse.checks import answer
    from gpucourse.tpus_xla import TinyEncoder, run_compiled, token_batches

    buckets = tuple(inputs["buckets"])
    generator = torch.Generator().manual_seed(inputs["seed"])
    lengths = [int(n) for n in torch.randint(1, 33, (24,), generator=generator)]
    batches = token_batches(24, 3, lengths, seed=inputs["seed"])
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


def draw_compile(rng):
    """The batches' seed and three buckets, one of them fitting the longest sequence (32) and above."""
    buckets = rng.sample(range(4, 32), 2) + [rng.randint(32, 40)]
    rng.shuffle(buckets)
    return {"seed": rng.randrange(10 ** 6), "buckets": buckets}


def _compile_batches(inputs):
    from gpucourse.tpus_xla import token_batches

    lengths = [int(n) for n in torch.randint(1, 33, (24,), generator=torch.Generator().manual_seed(inputs["seed"]))]
    return token_batches(24, 3, lengths, seed=inputs["seed"])


def compile_alone_outputs(inputs) -> list[list[float]]:
    """The first 6 batches through the same TinyEncoder, one sequence at a time (no padding): what the
    padded batches must give, computed here."""
    from gpucourse.checks.seeded import global_rng  # the grader's threads share torch's generator
    from gpucourse.tpus_xla import TinyEncoder

    with global_rng():
        torch.manual_seed(0)
        model = TinyEncoder().eval()
    with torch.no_grad():
        return [torch.cat([model(seq[None], torch.ones(1, len(seq), dtype=torch.bool)) for seq in batch]).double().reshape(-1).tolist()
                for batch in _compile_batches(inputs)[:6]]


def judge_pad_compiles(d, inputs):
    buckets = inputs["buckets"]
    needed = sorted({min(b for b in buckets if b >= max(len(s) for s in batch)) for batch in _compile_batches(inputs)})
    if d["widths"] != needed:
        return f"24 random batches were padded to widths {d['widths']}: only the smallest fitting buckets may appear"
    if not isinstance(d["graphs"], int) or not 1 <= d["graphs"] <= len(needed):
        return f"torch.compile(dynamic=False) built {d['graphs']} graphs for {len(needed)} buckets"
    alone = compile_alone_outputs(inputs)
    if len(d["outputs"]) != len(alone) or not all(
            len(got) == len(want) and all(abs(a - b) <= 1e-5 for a, b in zip(got, want)) for got, want in zip(d["outputs"], alone)):
        return "a masked model gives other results on the padded batch than on each sequence alone: check the mask"
    return None


# --- log_losses ----------------------------------------------------------------------------
# What the exercise's text states (CLAUSES below names the cases):
#  1. call step(batch) once for each batch, in order: the batches a list or any iterable (a DataLoader)
#  2. return a list of Python floats
#  3. the mean loss of each consecutive group of `every` steps, for any every >= 1 (1, the steps, more
#     than the steps, above 2**53), any losses (0 and negative ones too, float32 or float64)
#  4. a last, shorter group is reported too, as its own mean
#  5. no batches gives []
#  6. at most one host read per reported value, in total (t.type(torch.DoubleTensor), a copy to the host
#     like .cpu(), counts too)
#  7. the losses may require grad
# The loss's device ("whatever device the model is") is a CPU here: not checked.

def reference_log_losses(losses, every):
    """The text's rule on the losses a step returns: the mean of each consecutive group of ``every``."""
    return [math.fsum(losses[i:i + every]) / len(losses[i:i + every]) for i in range(0, len(losses), every)]


def _losses(rng, n):
    pool = [0.0, -rng.uniform(0.01, 5)]
    return [rng.choice(pool) if rng.random() < 0.15 else round(rng.uniform(0.05, 20), 3) for _ in range(n)]


def _drawn_run(rng, losses, every, **kw):
    return {"losses": losses, "every": every, "requires_grad": kw.get("requires_grad", rng.random() < 0.3),
            "dtype": kw.get("dtype", rng.choice(["float32", "float32", "float64"])),
            "loader": kw.get("loader", rng.random() < 0.3)}


def draw_log_every(rng):
    """every=1, every = the steps, every > the steps, every above 2**53; then random step counts and intervals."""
    n = rng.randint(2, 9)
    losses = _losses(rng, n)
    runs = [_drawn_run(rng, losses, 1), _drawn_run(rng, losses, n), _drawn_run(rng, losses, n + rng.randint(1, 9)),
            _drawn_run(rng, losses, 2 ** 53 + rng.randint(1, 99)), _drawn_run(rng, [7.5], 1), _drawn_run(rng, [7.5], 3)]
    divisor = rng.choice([d for d in range(1, 13) if 12 % d == 0])
    runs.append(_drawn_run(rng, _losses(rng, 12), divisor))
    return runs


def draw_log_random(rng):
    runs = []
    for _ in range(10):
        steps = rng.randint(1, 30)
        every = rng.choice([rng.randint(1, 12), rng.choice([d for d in range(1, steps + 1) if steps % d == 0])])
        runs.append(_drawn_run(rng, _losses(rng, steps), every))
    return runs


def draw_log_last(rng):
    """Step counts that `every` does not divide: a last group of 1 step, and of every - 1."""
    runs = [_drawn_run(rng, [6.0, 2.0, 9.0], 2)]
    for _ in range(4):
        every = rng.randint(2, 8)
        short = rng.choice([1, every - 1, rng.randint(1, every - 1)])
        runs.append(_drawn_run(rng, _losses(rng, every * rng.randint(1, 4) + short), every))
    return runs


def draw_log_no_batches(rng):
    return [_drawn_run(rng, [], 1), _drawn_run(rng, [], rng.randint(2, 50)), _drawn_run(rng, [], 2 ** 53 + rng.randint(1, 99), loader=True)]


def draw_log_reads(rng):
    """Long runs: 30 steps every 10, a whole run as one group, every 5 over 18 steps, then random ones."""
    runs = [_drawn_run(rng, _losses(rng, 30), 10), _drawn_run(rng, _losses(rng, 24), 24), _drawn_run(rng, _losses(rng, 18), 5)]
    runs += [_drawn_run(rng, _losses(rng, rng.randint(20, 40)), rng.randint(3, 12)) for _ in range(2)]
    return runs


def draw_log_with_grad(rng):
    return [_drawn_run(rng, _losses(rng, rng.randint(1, 12)), rng.randint(1, 5), requires_grad=True) for _ in range(4)]


def draw_log_loader(rng):
    """The batches as an iterable with a length but no indexing (a DataLoader), every a divisor or not."""
    return [_drawn_run(rng, _losses(rng, rng.randint(1, 20)), rng.randint(1, 7), loader=True) for _ in range(4)]


def observe_log_runs(ns, runs):
    """observe_log_losses on each run; ``t.type(torch.DoubleTensor)`` (or any CPU tensor type, by name too)
    counted as a host read as well: on an accelerator it copies the tensor to the host, as ``.cpu()`` does."""
    import torch
    from gpucourse.checks.lesson08_tpus_xla import observe_log_losses

    real_type, moves = torch.Tensor.type, []

    def counted_type(self, *args, **kwargs):
        wanted = args[0] if args else kwargs.get("dtype")
        name = wanted if isinstance(wanted, str) else f"{getattr(wanted, '__module__', '')}.{getattr(wanted, '__name__', '')}"
        if not isinstance(wanted, torch.dtype) and name.count(".") == 1 and name.endswith("Tensor"):  # torch.XTensor: CPU
            moves.append(f"type({name})")
        return real_type(self, *args, **kwargs)

    records = []
    torch.Tensor.type = counted_type
    try:
        for r in runs:
            moves.clear()
            record = observe_log_losses(ns, r["losses"], r["every"], requires_grad=r["requires_grad"], dtype=r["dtype"],
                                        loader=r["loader"])
            records.append(dict(record, reads=record["reads"] + len(moves), methods=(record["methods"] + moves)[:12]))
    finally:
        torch.Tensor.type = real_type
    return records


def judge_log_runs(observed, runs):
    if not isinstance(observed, list) or len(observed) != len(runs):
        return f"expected {len(runs)} runs, got {len(observed) if isinstance(observed, list) else 'none'}"
    for run, d in zip(runs, observed):
        losses, every = run["losses"], run["every"]
        wrong = judge_log_record(d, len(losses), every, reference_log_losses(losses, every),
                                 last_group=len(losses) % every or None)
        if wrong:
            batches = "a DataLoader-like iterable of" if run["loader"] else ""
            return f"{batches} {len(losses)} step(s) ({run['dtype']} losses), every={every}: {wrong}".strip()
    return None


def _case(name, draw, observe, judge):
    return Case(name, observe, judge, draw=draw)


HIDDEN = {
    "pad_to_bucket": [
        _case("clause 1: a batch of one, empty sequences, a batch of empty sequences only", draw_pad_one_and_empty,
              observe_pad_drawn, judge_pad()),
        _case("clauses 2-3: unsorted buckets (list, tuple, NumPy ints, repeats), exact fits, one past a bucket: the smallest "
              "bucket that fits", draw_pad_width, observe_pad_drawn, judge_pad(["width"])),
        _case("clauses 4, 6: int8, int16, int32, int64, uint8 tokens keep their dtype; a bool mask of the same shape",
              draw_pad_dtypes, observe_pad_drawn, judge_pad(["width", "dtype"])),
        _case("clause 5: rows hold the tokens, then pad_value (left out, by position, by name)", draw_pad_rows,
              observe_pad_drawn, judge_pad(["rows"])),
        _case("clause 7: the mask when real tokens equal pad_value", draw_pad_mask, observe_pad_drawn, judge_pad(["mask"])),
        _case("clause 8: a sequence longer than every bucket, anywhere in the batch; no bucket at all", draw_pad_too_long,
              observe_pad_drawn, judge_pad(["raise"])),
        _case("clause 9: an empty batch", draw_pad_empty_batch, observe_pad_drawn, judge_pad(["raise"])),
        _case("clause 10: the sequences and the buckets list are left unchanged", draw_pad_inputs, observe_pad_drawn,
              judge_pad(["inputs"])),
        _case("clauses 1-10: 40 calls drawn from the whole domain (dtypes, pad values, bucket sets, batch sizes)",
              draw_pad_random, observe_pad_drawn, judge_pad()),
        _case("clause 11: 24 random batches through torch.compile(dynamic=False)", draw_compile, observe_pad_compiles,
              judge_pad_compiles),
    ],
    "log_losses": [
        _case("clause 3: every=1, every = the steps, every > the steps (above 2**53 too)", draw_log_every,
              observe_log_runs, judge_log_runs),
        _case("clause 3: drawn step counts, intervals and losses (0, negative, float64)", draw_log_random,
              observe_log_runs, judge_log_runs),
        _case("clause 4: a last, shorter group", draw_log_last, observe_log_runs, judge_log_runs),
        _case("clause 5: no batches", draw_log_no_batches, observe_log_runs, judge_log_runs),
        _case("clause 6: host reads over long runs", draw_log_reads, observe_log_runs, judge_log_runs),
        _case("clause 7: losses that require grad", draw_log_with_grad, observe_log_runs, judge_log_runs),
        _case("clause 1: batches from a DataLoader-like iterable (no indexing), each once, in order", draw_log_loader,
              observe_log_runs, judge_log_runs),
    ],
}

PUBLIC_PAD = "two sequences, buckets (4, 8); a sequence of 9 tokens"
PUBLIC_LOG = "7 steps logged every 3 steps"
_PAD = {case.name.split(":")[0]: case.name for case in HIDDEN["pad_to_bucket"]}
_LOG = [case.name for case in HIDDEN["log_losses"]]
CLAUSES = {
    "pad_to_bucket": {
        "batch: a non-empty list of 1-D integer tensors; a sequence may be empty": [_PAD["clause 1"], _PAD["clauses 1-10"]],
        "buckets: a list or tuple of positive ints, in any order": [_PAD["clauses 2-3"], _PAD["clauses 1-10"]],
        "padded has shape (len(batch), L), L the smallest bucket >= the longest sequence":
            [PUBLIC_PAD, _PAD["clauses 2-3"], _PAD["clause 11"], _PAD["clauses 1-10"]],
        "padded has the same dtype as the sequences": [_PAD["clauses 4, 6"], _PAD["clauses 1-10"]],
        "each row holds its sequence first, then pad_value (right padding)": [PUBLIC_PAD, _PAD["clause 5"], _PAD["clauses 1-10"]],
        "mask is a torch.bool tensor of the same shape": [PUBLIC_PAD, _PAD["clauses 4, 6"]],
        "mask is True exactly on real tokens (a real token may equal pad_value)": [_PAD["clause 7"], _PAD["clause 11"]],
        "raises ValueError if the longest sequence is longer than every bucket": [PUBLIC_PAD, _PAD["clause 8"], _PAD["clauses 1-10"]],
        "raises ValueError for an empty batch": [_PAD["clause 9"]],
        "the inputs must not be modified": [_PAD["clause 10"]],
        "24 random batches through torch.compile(dynamic=False): the graphs counted": [_PAD["clause 11"]],
    },
    "log_losses": {
        "call step(batch) once for each batch, in order": [_LOG[6], _LOG[0], PUBLIC_LOG],
        "return a list of Python floats": [PUBLIC_LOG, _LOG[1]],
        "the mean loss of each consecutive group of `every` steps": [PUBLIC_LOG, _LOG[0], _LOG[1]],
        "a last, shorter group is reported too": [PUBLIC_LOG, _LOG[2]],
        "no batches gives []": [_LOG[3]],
        "read tensor values to the host at most once per reported value in total": [_LOG[4], PUBLIC_LOG],
        "the losses may require grad": [_LOG[5]],
    },
}

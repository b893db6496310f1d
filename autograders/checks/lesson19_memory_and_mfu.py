"""Hidden checks for lesson 19 (a transformer layer's memory and MFU). Never released.

Differential: each case draws its calls at grading time (boundaries first, each named value and "any
other", then random ones from the whole domain the exercise's text states: NumPy ints, sizes whose
products pass 2**53, every recompute mode with and without parallelism); the sandbox calls the answer
on them (``observe_calls``) and the judges call the references below, which exist on the grader's
side only, on the same calls.
"""

import math
import numbers

import numpy as np

from gpucourse.checks import Case
from gpucourse.checks.values import rebuild

from autograders.differential import call, must_raise, shown, unreported

# --- activation_bytes ----------------------------------------------------------------------------


def _whole(v):
    """An int as the text means it: any integer (Python's or NumPy's), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def reference_activation_bytes(seq_len, batch, hidden, heads, layers=1, tensor_parallel=1, sequence_parallel=False,
                               recompute="none", bytes_per_value=2):
    """Korthikanti et al.'s per-layer count, in values of ``bytes_per_value`` bytes and 1-byte dropout masks,
    per tensor-parallel rank, times ``layers``; ValueError outside the text's domain."""
    sizes = (seq_len, batch, hidden, heads, layers, tensor_parallel, bytes_per_value)
    if not all(_whole(v) and v >= 1 for v in sizes):
        raise ValueError("sizes must be ints >= 1")
    if type(sequence_parallel) is not bool:
        raise ValueError("sequence_parallel must be True or False")
    if not isinstance(recompute, str) or recompute not in ("none", "selective", "full"):
        raise ValueError("recompute must be 'none', 'selective' or 'full'")
    s, b, h, a, L, t, p = (int(v) for v in sizes)
    if h % a or a % t or (sequence_parallel and s % t):
        raise ValueError("hidden % heads, heads % tensor_parallel, seq_len % tensor_parallel (with SP) must be 0")
    sbh = s * b * h
    if recompute == "full":
        per_layer = p * sbh // (t if sequence_parallel else 1)
        return L * per_layer
    whole = 4 * p * sbh + 2 * sbh            # LayerNorm and first-linear inputs, two dropout masks
    split = 12 * p * sbh // t                 # Q, K, V, projection input, GeLU input and output
    scores = 0 if recompute == "selective" else (2 * p + 1) * a * s * s * b // t
    if sequence_parallel:
        whole //= t
    return L * (whole + split + scores)


def _ints(rng, values):
    """``values`` as NumPy int64s one time in four (the text allows any integer)."""
    return [np.int64(v) for v in values] if rng.random() < 0.25 else list(values)


def _valid_layer(rng, t=1, sp=False):
    """A valid (s, b, h, a) for tensor_parallel ``t``: heads a multiple of t, hidden of heads."""
    a = t * rng.randint(1, 8)
    h = a * rng.randint(1, 64)
    s = rng.randint(1, 512)
    if sp:
        s = t * rng.randint(1, 256)
    return [s, rng.randint(1, 16), h, a]


def draw_no_parallelism(rng):
    """One rank, every recompute mode, bytes_per_value 2, 4, 1 and any other: the smallest layer (all 1s),
    GPT-3's 175B layer (s 2048, h 12288, a 96), NumPy ints, products above 2**53, layers above 1, NumPy
    int64s only whose products pass 2**63."""
    calls = []
    for mode in ("none", "selective", "full"):
        calls += [call(1, 1, 1, 1, recompute=mode), call(2048, 1, 12288, 96, layers=96, recompute=mode),
                  call(4096, 8, 8192, 64, recompute=mode, bytes_per_value=4),
                  call(128, 4, 256, 8, recompute=mode, bytes_per_value=rng.choice([1, 3, 8, 16])),
                  call(*_ints(rng, [2 ** 20 + 1, 2 ** 12 + 3, 2 ** 15 * 3, 3 * 2 ** 7]), recompute=mode,
                       layers=rng.randint(2, 200))]
    calls.append(call(1024, 2, 4096, 32))  # every default
    # NumPy int64s whose products pass 2**63: the bytes are exact at any size, so int64 arithmetic overflows
    calls += [call(np.int64(2 ** 22), np.int64(2 ** 10), np.int64(2 ** 16), np.int64(2 ** 8)),
              call(np.int64(2 ** 30), np.int64(2 ** 20), np.int64(2 ** 16), np.int64(2 ** 8), layers=np.int64(3),
                   recompute=rng.choice(["selective", "full"]), bytes_per_value=np.int64(4)),
              call(*[np.int64(v) for v in (2 ** 21 * rng.randint(1, 7), 2 ** 11 + rng.randint(0, 99), 2 ** 16, 2 ** 9)],
                   layers=np.int64(rng.randint(1, 96)), bytes_per_value=np.int64(rng.choice([1, 2, 4])))]
    for _ in range(12):
        mode = rng.choice(["none", "selective", "full"])
        calls.append(call(*_ints(rng, _valid_layer(rng)), layers=rng.randint(1, 100), recompute=mode,
                          bytes_per_value=rng.choice([1, 2, 4, rng.randint(1, 16)])))
    return calls


def draw_tensor_parallel(rng):
    """tensor_parallel 2, 4, 8 and others, sequence parallelism off and on, every recompute mode; the
    paper's Table 2 at GPT-3's sizes, then random layers."""
    calls = []
    for t in (2, 4, 8):
        for sp in (False, True):
            for mode in ("none", "selective", "full"):
                calls.append(call(2048, 1, 12288, 96, tensor_parallel=t, sequence_parallel=sp, recompute=mode))
    calls.append(call(8, 1, 8, 8, tensor_parallel=8, sequence_parallel=True))  # one head and one token per rank
    calls.append(call(5, 3, 12, 3, tensor_parallel=3))                          # seq_len not a multiple of t: allowed without SP
    calls.append(call(6, 1, 6, 6, tensor_parallel=1, sequence_parallel=True))  # SP on one rank: no change
    for _ in range(18):
        t = rng.choice([2, 3, 4, 8, rng.randint(2, 16)])
        sp = rng.random() < 0.5
        calls.append(call(*_ints(rng, _valid_layer(rng, t, sp)), layers=rng.randint(1, 64), tensor_parallel=t,
                          sequence_parallel=sp, recompute=rng.choice(["none", "selective", "full"]),
                          bytes_per_value=rng.choice([1, 2, 4, rng.randint(1, 16)])))
    return calls


def draw_activation_bad(rng):
    """Each way out of the domain, one at a time: a size below 1 (each of the seven), a float, a str,
    None or a bool as a size, hidden not a multiple of heads, heads not a multiple of tensor_parallel,
    seq_len not a multiple of tensor_parallel with sequence parallelism, a sequence_parallel that is
    not a bool, a recompute mode that is not one of the three."""
    good = [64, 2, 128, 8]
    names = ["layers", "tensor_parallel", "bytes_per_value"]
    calls = []
    for place in range(4):
        for value in (0, -rng.randint(1, 9), 64.0, np.float64(8.0), "8", None, True):
            args = list(good)
            args[place] = value
            calls.append(call(*args))
    for name in names:
        for value in (0, -rng.randint(1, 9), 2.0, "2", None, True):
            calls.append(call(*good, **{name: value}))
    calls += [call(64, 2, 100, 8), call(64, 2, 12, 8), call(64, 2, 128, 8, tensor_parallel=3),
              call(64, 2, 128, 8, tensor_parallel=16), call(63, 2, 128, 8, tensor_parallel=2, sequence_parallel=True),
              call(10, 2, 128, 8, tensor_parallel=4, sequence_parallel=True, recompute="full")]
    for value in (1, 0, "True", None, np.int64(1)):
        calls.append(call(*good, sequence_parallel=value))
    for mode in ("None", "Selective", "FULL", "partial", "", None, 0, "attention"):
        calls.append(call(*good, recompute=mode))
    for _ in range(4):  # drawn divisibility violations
        t = rng.randint(2, 8)
        a = t * rng.randint(1, 4)
        calls.append(call(t * rng.randint(1, 30) + rng.randint(1, t - 1), 1, a * 8, a, tensor_parallel=t,
                          sequence_parallel=True, recompute=rng.choice(["none", "selective", "full"])))
        calls.append(call(64, 1, a * 8 + rng.randint(1, a - 1) if a > 1 else 7, max(a, 2)))
    return [c for c in calls if _activation_raises(c)]


def _activation_raises(spec):
    try:
        reference_activation_bytes(*rebuild(spec["args"]), **rebuild(spec["kwargs"]))
    except ValueError:
        return True
    return False


def observe_activation_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "activation_bytes", calls)


def _judge_calls(observed, calls, name: str, reference, wrong_value):
    """Per drawn call of ``name``: ValueError where ``reference`` raises one; else ``wrong_value(value, want,
    where)`` (None when the returned value is right) on what the answer returned."""
    if not isinstance(observed, list) or len(observed) != len(calls):
        return f"{len(observed) if isinstance(observed, list) else 'no'} outcomes for {len(calls)} calls"
    for spec, got in zip(calls, observed):
        where = shown(spec, name)
        if found := unreported(got, where):
            return found
        try:
            want = reference(*rebuild(spec["args"]), **rebuild(spec["kwargs"]))
        except ValueError:
            if found := must_raise(got, "ValueError", where):
                return found
            continue
        if "raised" in got:
            return f"{where} raised {got['raised'][0]}"
        if found := wrong_value(rebuild(got["returned"]), want, where):
            return found
    return None


def _wrong_bytes(value, want, where):
    if not _whole(value):
        return f"{where} returned a {type(value).__name__}: return an int (bytes, exact at any size)"
    return f"{where} returned a wrong number of bytes" if int(value) != want else None


def judge_activation_calls(observed, calls):
    """Per call: ValueError where the reference raises one; else an int (Python's or NumPy's) of the same value."""
    return _judge_calls(observed, calls, "activation_bytes", reference_activation_bytes, _wrong_bytes)

_AB = "activation_bytes"
HIDDEN = {_AB: [
    Case("one rank: every recompute mode, bytes_per_value 1, 2, 4 and others, GPT-3's layer, counts above 2**53",
         observe_activation_calls, judge_activation_calls, draw=draw_no_parallelism),
    Case("tensor parallel 2 to 16, with and without sequence parallelism, every recompute mode",
         observe_activation_calls, judge_activation_calls, draw=draw_tensor_parallel),
    Case("bad arguments: ValueError for sizes below 1 or not ints, indivisible sizes, a bad flag or mode",
         observe_activation_calls, judge_activation_calls, draw=draw_activation_bad),
]}


# --- mfu -----------------------------------------------------------------------------------------

def _positive_real(v):
    return (not isinstance(v, (bool, np.bool_)) and isinstance(v, numbers.Real) and math.isfinite(v) and v > 0)


def reference_mfu(params, tokens_per_step, step_seconds, peak_flops, attention=None):
    """Model FLOPs per second over the peak: (6 N + 12 L h s) FLOPs per token; ValueError outside the domain."""
    if not (_whole(params) and params >= 1 and _whole(tokens_per_step) and tokens_per_step >= 1):
        raise ValueError("params and tokens_per_step must be ints >= 1")
    if not (_positive_real(step_seconds) and _positive_real(peak_flops)):
        raise ValueError("step_seconds and peak_flops must be positive finite numbers")
    per_token = 6 * int(params)
    if attention is not None:
        if not isinstance(attention, (tuple, list)) or len(attention) != 3 or not all(
                _whole(v) and v >= 1 for v in attention):
            raise ValueError("attention must be None or (layers, hidden, seq_len), three ints >= 1")
        layers, hidden, seq_len = (int(v) for v in attention)
        per_token += 12 * layers * hidden * seq_len
    return int(tokens_per_step) * per_token / float(step_seconds) / float(peak_flops)


def _real(rng, value):
    """``value`` as a float, an int or a NumPy float64 (the text allows any real number)."""
    pick = rng.random()
    if pick < 0.2:
        return max(1, int(value))
    return np.float64(value) if pick < 0.4 else float(value)


def draw_mfu_model_only(rng):
    """No attention term: a GPT-2-small step, a 7B model's, the smallest (1 parameter, 1 token), NumPy ints,
    parameter counts above 2**53, ints and floats for the time and the peak (NumPy's float32, int64 and int32
    too), results above 1 too."""
    calls = [call(1, 1, 1.0, 6.0), call(124_000_000, 512 * 1024, 0.5, 989.4e12),
             call(7_000_000_000, 4 * 4096, 1.2, 989e12), call(np.int64(350_000_000), np.int64(8192), 0.25, 312e12),
             call(2 ** 53 + 1, 3, 7, 11), call(10 ** 6, 10, 1, 1)]  # the last: MFU far above 1, returned as is
    # NumPy reals that are not Python floats: float32, int64, int32 (and mixed) for the time and the peak
    calls += [call(124_000_000, 512 * 1024, np.float32(0.5), np.float32(989.4e12)),
              call(7_000_000_000, 16384, np.int64(2), np.int64(10 ** 15)),
              call(10 ** 6, 10, np.int32(3), np.int32(10 ** 9)),
              call(350_000_000, 8192, np.float32(rng.uniform(0.01, 10)), np.int64(rng.randint(10 ** 12, 10 ** 16))),
              call(10 ** 9, 4096, np.int32(rng.randint(1, 100)), np.float32(10 ** rng.uniform(12, 16)))]
    for _ in range(14):
        calls.append(call(rng.choice([rng.randint(1, 10 ** 6), rng.randint(10 ** 6, 10 ** 12)]),
                          rng.randint(1, 2 ** 22), _real(rng, 10 ** rng.uniform(-4, 2)),
                          _real(rng, 10 ** rng.uniform(9, 16))))
    return calls


def draw_mfu_attention(rng):
    """With the attention term, as a tuple and as a list: where it is small (short sequences) and where it
    dominates (seq_len above 6 x hidden), NumPy ints inside it, one layer of width 1 and length 1."""
    calls = [call(1, 1, 1.0, 1.0, (1, 1, 1)), call(124_000_000, 512 * 1024, 0.5, 989.4e12, (12, 768, 1024)),
             call(7_000_000_000, 16384, 1.2, 989e12, [32, 4096, 4096]),
             call(1_000_000, 4096, 0.01, 1e13, (2, 128, 65536)),
             call(10 ** 9, 1024, 2.0, 312e12, (np.int64(24), np.int64(2048), np.int64(2048)))]
    for _ in range(14):
        attention = [rng.randint(1, 96), rng.choice([64, 768, rng.randint(1, 16384)]), rng.randint(1, 131072)]
        attention = tuple(attention) if rng.random() < 0.5 else attention
        args = [rng.randint(1, 10 ** 11), rng.randint(1, 2 ** 22), _real(rng, 10 ** rng.uniform(-3, 2)),
                _real(rng, 10 ** rng.uniform(10, 16))]
        calls.append(call(*args, attention=attention) if rng.random() < 0.5 else call(*args, attention))
    return calls


def draw_mfu_bad(rng):
    """Each argument out of its domain, one at a time: params and tokens_per_step below 1, floats, str,
    None, bools; step_seconds and peak_flops zero, negative, infinite, NaN, bools, str, None; attention
    of the wrong length or holding a value below 1, a float, a str, or not a sequence."""
    good = [10 ** 6, 4096, 0.5, 1e13]
    calls = []
    for place in (0, 1):
        for value in (0, -rng.randint(1, 99), 1000.0, np.float64(1000.0), "1000", None, True):
            args = list(good)
            args[place] = value
            calls.append(call(*args))
    for place in (2, 3):
        for value in (0, 0.0, -rng.uniform(0.1, 5), -1, math.inf, -math.inf, math.nan, True, "1.0", None):
            args = list(good)
            args[place] = value
            calls.append(call(*args))
    spoilt = [(2, 64), (2, 64, 128, 1), (), (0, 64, 128), (2, 0, 128), (2, 64, -1), (2.0, 64, 128),
              (2, 64.0, 128), ("2", 64, 128), (2, None, 128), (True, 64, 128), "2,64,128", 12, {"layers": 2}]
    calls += [call(*good, attention) for attention in spoilt]
    return calls


def observe_mfu_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "mfu", calls)


def _wrong_fraction(value, want, where):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, float):
        return f"{where} returned a {type(value).__name__}: return a float (a fraction of the peak)"
    return f"{where} returned a wrong fraction of the peak" if not math.isclose(value, want, rel_tol=1e-9) else None


def judge_mfu_calls(observed, calls):
    """Per call: ValueError where the reference raises one; else a float within 1e-9 of the reference."""
    return _judge_calls(observed, calls, "mfu", reference_mfu, _wrong_fraction)

_MF = "mfu"
HIDDEN[_MF] = [
    Case("model FLOPs only: 6 FLOPs per parameter per token (forward 2, backward 4), any sizes and units",
         observe_mfu_calls, judge_mfu_calls, draw=draw_mfu_model_only),
    Case("with the attention term: 12 x layers x hidden x seq_len more FLOPs per token", observe_mfu_calls,
         judge_mfu_calls, draw=draw_mfu_attention),
    Case("bad arguments: ValueError for counts below 1 or not ints, times and peaks not positive finite, "
         "a malformed attention", observe_mfu_calls, judge_mfu_calls, draw=draw_mfu_bad),
]

_PUBLIC_AB = "GPT-3's layer (s 2048, h 12288, a 96): no parallelism, tensor and sequence parallel, each recompute mode"
_PUBLIC_AB_SMALL = "a small layer in float32 over 4 layers; hidden not a multiple of heads raises ValueError"
_PUBLIC_MF = "a 124M-parameter model with and without the attention term; a zero step time raises ValueError"
_H, _M = HIDDEN[_AB], HIDDEN[_MF]
CLAUSES = {
    _AB: {
        "returns an int, the bytes one tensor-parallel rank keeps, exact at any size": [_PUBLIC_AB, _H[0].name],
        "no parallelism, no recompute, 2 bytes per value: s b h (34 + 5 a s / h) per layer": [_PUBLIC_AB, _H[0].name],
        "values take bytes_per_value bytes, dropout masks 1 byte per element": [_PUBLIC_AB_SMALL, _H[0].name, _H[1].name],
        "layers multiplies the per-layer bytes": [_PUBLIC_AB_SMALL, _H[0].name, _H[1].name],
        "tensor parallel: 4 s b h values and 2 s b h mask bytes kept whole, the rest divided by tensor_parallel":
            [_PUBLIC_AB, _H[1].name],
        "sequence parallel: everything divided by tensor_parallel": [_PUBLIC_AB, _H[1].name],
        "selective: the attention-score part (2 a s^2 b values and a s^2 b mask bytes) is not kept":
            [_PUBLIC_AB, _H[0].name, _H[1].name],
        "full: only the layer's input, s b h values, divided by tensor_parallel with sequence parallelism":
            [_PUBLIC_AB, _H[0].name, _H[1].name],
        "sizes are ints >= 1 (NumPy ints too)": [_H[0].name, _H[1].name, _H[2].name],
        "ValueError for a size below 1 or not an int (a float, a str, None, a bool)": [_H[2].name],
        "ValueError unless hidden is a multiple of heads and heads of tensor_parallel": [_PUBLIC_AB_SMALL, _H[2].name],
        "ValueError with sequence parallelism unless seq_len is a multiple of tensor_parallel": [_H[2].name],
        "ValueError for a sequence_parallel that is not True or False, a recompute not among the three": [_H[2].name],
    },
    _MF: {
        "returns a float: model FLOP/s over peak_flops": [_PUBLIC_MF, _M[0].name, _M[1].name],
        "6 x params FLOPs per token": [_PUBLIC_MF, _M[0].name],
        "with attention=(layers, hidden, seq_len): 12 x layers x hidden x seq_len more per token, a tuple or a list":
            [_PUBLIC_MF, _M[1].name],
        "any ints >= 1 (NumPy ints, above 2**53) and positive finite times and peaks (ints, floats, NumPy floats)":
            [_M[0].name, _M[1].name],
        "a result above 1 is returned as it is": [_M[0].name],
        "ValueError for params or tokens_per_step below 1 or not ints": [_M[2].name],
        "ValueError for a step_seconds or peak_flops that is not a positive finite number": [_PUBLIC_MF, _M[2].name],
        "ValueError for an attention that is not None or three ints >= 1": [_M[2].name],
    },
}

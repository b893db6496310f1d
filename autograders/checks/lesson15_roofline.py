"""Hidden checks for lesson 15 (roofline and launch overhead). Never released.

Differential: each case draws its calls at grading time (boundaries first, then random ones from the
whole domain the exercise's text states: NumPy ints, sizes whose counts pass 2**53, any bytes per
element); the sandbox calls the answers on them (``observe_calls``) and the judges call the references
below, which exist on the grader's side only, on the same calls.
"""

import math
import numbers
from fractions import Fraction

import numpy as np

from gpucourse.checks import Case
from gpucourse.checks.values import rebuild

from autograders.differential import call, must_raise, shown, unreported

# --- arithmetic_intensity ------------------------------------------------------------------------


def _whole(v):
    """An int as the text means it: any integer (Python's or NumPy's), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def reference_intensity(op, shape, bytes_per_elem):
    """The text's counting rules; ValueError for anything outside its domain."""
    if not _whole(bytes_per_elem) or bytes_per_elem < 1:
        raise ValueError("bytes_per_elem must be a positive int")
    if op not in ("matmul", "add", "conv2d"):
        raise ValueError("unknown op")
    shape = tuple(shape)
    if not shape or not all(_whole(v) for v in shape):
        raise ValueError("shape must hold ints")
    b, shape = int(bytes_per_elem), tuple(int(v) for v in shape)
    if op == "matmul":
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError("a matmul is (M, K, N), each at least 1")
        M, K, N = shape
        flops, elements = 2 * M * K * N, M * K + K * N + M * N
    elif op == "add":
        if min(shape) < 1:
            raise ValueError("sizes at least 1")
        flops = math.prod(shape)
        elements = 3 * flops
    else:
        if len(shape) != 9:
            raise ValueError("a conv2d is (N, C, H, W, K, R, S, stride, padding)")
        N, C, H, W, K, R, S, stride, pad = shape
        if min(N, C, H, W, K, R, S, stride) < 1 or pad < 0:
            raise ValueError("sizes and stride at least 1, padding at least 0")
        if H + 2 * pad < R or W + 2 * pad < S:
            raise ValueError("the kernel is larger than the padded input")
        P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
        flops, elements = 2 * N * K * P * Q * C * R * S, N * C * H * W + K * C * R * S + N * K * P * Q
    return {"flops": flops, "bytes": elements * b, "intensity": flops / (elements * b)}


OTHER_BYTES = (3, 5, 6, 12, 16, 32)  # "or any other" bytes per element


def _bytes(rng):
    b = rng.choice([1, 2, 4, 8, rng.choice(OTHER_BYTES), rng.randint(1, 64)])
    return np.int64(b) if rng.random() < 0.2 else b


def _ints(rng, values):
    """``values`` as a tuple, as NumPy int64s one time in three (the text allows any integer)."""
    return tuple(np.int64(v) for v in values) if rng.random() < 1 / 3 else tuple(values)


def draw_matmul(rng):
    """Matmuls: 1x1x1, matrix-vector products both ways, NumPy ints, bytes per element 1, 2, 4, 8 and
    others, FLOPs above 2**53 (a float count rounds there; every count stays below 2**62, where NumPy's
    int64 holds it), then random sizes."""
    calls = [call("matmul", (1, 1, 1), 4), call("matmul", (1, 4096, 4096), 2), call("matmul", (4096, 4096, 1), 2),
             call("matmul", (3, 5, 7), rng.choice(OTHER_BYTES)), call("matmul", (np.int64(8), np.int64(16), np.int64(4)), 4),
             call("matmul", (64, 64, 64), np.int64(rng.choice(OTHER_BYTES)))]
    for _ in range(3):  # odd sizes: 2 M K N then needs more than 53 bits, so a count in floats rounds
        dims = [2 * rng.randint(150_000, 499_999) + 1 for _ in range(3)]
        calls.append(call("matmul", _ints(rng, dims), rng.choice([1, 2, 3, 4])))
    for _ in range(10):
        dims = [rng.choice([1, rng.randint(1, 64), rng.randint(65, 5000)]) for _ in range(3)]
        calls.append(call("matmul", _ints(rng, dims), _bytes(rng)))
    return calls + _another_op(rng, "matmul")


def _another_op(rng, op):
    """One valid call of each other op, so that every argument of a case takes more than one value."""
    others = {"matmul": ("matmul", (rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9))),
              "add": ("add", (rng.randint(1, 99),)), "conv2d": ("conv2d", (1, 2, 6, 6, 3, 3, 3, 1, rng.randint(0, 2)))}
    return [call(name, shape, rng.choice([2, 4])) for name, shape in (others[k] for k in others if k != op)]


def draw_add(rng):
    """Adds on 1 to 5 dimensions (a single element, sizes of 1 among them), NumPy ints, element counts above
    2**53, bytes per element 1, 2, 4, 8 and others."""
    calls = [call("add", (1,), 4), call("add", (1, 1, 1), 2), call("add", (7,), rng.choice(OTHER_BYTES)),
             call("add", (np.int64(3), np.int64(5)), np.int64(2)),
             call("add", (rng.randint(2 ** 27, 2 ** 28), rng.randint(2 ** 27, 2 ** 28)), rng.choice([1, 2, 4]))]
    for _ in range(10):
        calls.append(call("add", _ints(rng, [rng.choice([1, rng.randint(1, 300)]) for _ in range(rng.randint(1, 5))]),
                          _bytes(rng)))
    return calls + _another_op(rng, "add")


def draw_conv(rng):
    """Convolutions: kernels of 1 to 7 (not square), strides 1 to 5 that need not divide the padded size
    (and larger than it), paddings 0 to 3, inputs not square, down to a 1x1 output (the kernel exactly as
    large as the padded input), NumPy ints, any bytes per element."""
    calls = [call("conv2d", (1, 1, 3, 3, 1, 3, 3, 1, 0), 4),            # the kernel exactly the input: 1x1
             call("conv2d", (2, 3, 1, 1, 4, 3, 3, 1, 1), 2),            # 1x1 input padded to 3x3
             call("conv2d", (1, 2, 5, 9, 3, 5, 2, 7, 0), rng.choice(OTHER_BYTES)),  # stride beyond the input
             call("conv2d", tuple(np.int64(v) for v in (2, 3, 8, 6, 4, 3, 2, 2, 1)), np.int64(4))]
    for _ in range(14):
        r, s = rng.randint(1, 7), rng.randint(1, 7)
        pad, stride = rng.randint(0, 3), rng.randint(1, 5)
        smallest_h, smallest_w = max(1, r - 2 * pad), max(1, s - 2 * pad)
        h = smallest_h if rng.random() < 0.2 else rng.randint(smallest_h, smallest_h + 40)
        w = smallest_w if rng.random() < 0.2 else rng.randint(smallest_w, smallest_w + 40)
        shape = [rng.randint(1, 64), rng.randint(1, 256), h, w, rng.randint(1, 256), r, s, stride, pad]
        calls.append(call("conv2d", _ints(rng, shape), _bytes(rng)))
    return calls + _another_op(rng, "conv2d")


def draw_huge_conv(rng):
    """Convolutions whose padded height or width passes 2**53 (the text's shapes hold any integers): the output
    size floors in exact integers, where a float division rounds first (H + 2 padding - R = 2**53 + 1 first), strides
    1 to 5, NumPy ints; every count stays below 2**62."""
    calls = [call("conv2d", (1, 1, 2 ** 53 + 2, 1, 1, 1, 1, 1, 0), 4),       # (2**53 + 1) / 1 rounds to 2**53
             call("conv2d", (1, 1, 1, 2 ** 53 + 2, 1, 1, 1, 1, 0), 2),       # the same along the width
             call("conv2d", (1, 1, 3 * 2 ** 53, 2, 1, 3, 1, 3, 1), 4)]       # (3 * 2**53 - 1) / 3 rounds up to 2**53
    for _ in range(8):
        r, s, pad, stride = rng.randint(1, 3), rng.randint(1, 3), rng.randint(0, 3), rng.randint(1, 5)
        long_side = rng.randint(2 ** 53, 2 ** 53 + 2 ** 52) | 1
        h, w = long_side, max(1, s - 2 * pad) + rng.randint(0, 4)
        if rng.random() < 0.5:
            h, w = max(1, r - 2 * pad) + rng.randint(0, 4), long_side
        calls.append(call("conv2d", _ints(rng, (1, 1, h, w, 1, r, s, stride, pad)), rng.choice([1, 2, 4])))
    return calls + _another_op(rng, "conv2d")


def draw_bad(rng):
    """Each way out of the domain: another op (another case too), a shape of the wrong length or holding
    something else than ints (a float, a NumPy float, a str, None, a bool) at each place, the padding too, a
    size or a stride below 1 at a drawn place, two sizes below 1 at once (a positive product), a negative stride
    with the kernel exactly the padded input, a padding below 0, a kernel larger than the padded input along
    either axis (with strides above 1 too, where the padded size falls short by less than a stride), a
    bytes_per_elem that is not a positive int."""
    good = {"matmul": (4, 5, 6), "add": (3, 4), "conv2d": (1, 3, 8, 8, 4, 3, 3, 1, 1)}
    calls = [call(op, (4, 4, 4), 4) for op in ("mul", "Matmul", "MATMUL", "matmul ", "Add", "conv", "conv2D", "")]
    calls += [call("matmul", (4, 4), 4), call("matmul", (4, 4, 4, 4), 4), call("add", (), 4),
              call("conv2d", (1, 3, 8, 8, 4, 3, 3, 1), 4), call("conv2d", (1, 3, 8, 8, 4, 3, 3, 1, 1, 0), 4)]
    for op, shape in good.items():
        for place in range(len(shape)):  # every place, the padding too
            for other in (4.0, np.float64(4.0), "4", None, True):
                spoilt = list(shape)
                spoilt[place] = other
                calls.append(call(op, tuple(spoilt), 4))
        for b in (0, -rng.randint(1, 8), 2.0, True, "4", None, np.float64(4.0), np.int64(0)):
            calls.append(call(op, shape, b))
        below = op != "conv2d" and range(len(shape)) or range(8)  # sizes and stride; the padding apart
        spoilt = list(shape)
        spoilt[rng.choice(list(below))] = rng.choice([0, -rng.randint(1, 9)])
        calls.append(call(op, _ints(rng, spoilt), 4))
        spoilt = list(shape)  # two sizes below 1 at once: their product is positive
        for place in rng.sample(list(below), 2):
            spoilt[place] = -rng.randint(1, 9)
        calls.append(call(op, _ints(rng, spoilt), 4))
    calls += [call("add", (3, 0), 4), call("add", (5, -2), 2),  # a size below 1 after the first one
              call("add", (-3, -4), 4), call("matmul", (-2, -3, 4), 4), call("matmul", (5, -1, -1), 2),
              call("conv2d", (-1, 3, 8, 8, -4, 3, 3, 1, 1), 4)]
    for place in range(8):  # every size and the stride of a convolution, one at a time
        spoilt = list(good["conv2d"])
        spoilt[place] = 0
        calls.append(call("conv2d", tuple(spoilt), 2))
    r, s = rng.randint(3, 9), rng.randint(3, 9)
    pad = rng.randint(0, (min(r, s) - 1) // 2)
    calls += [call("conv2d", (1, 3, 8, 8, 4, 3, 3, 1, -1), 4),
              call("conv2d", (1, 2, r - 2 * pad - 1, 9, 2, r, 1, 1, pad), 4),    # no output row
              call("conv2d", (1, 2, 9, s - 2 * pad - 1, 2, 1, s, 1, pad), 4),    # no output column
              call("conv2d", _ints(rng, (2, 3, 2, 2, 4, 5, 5, 1, 1)), 4),
              # no output with a stride above 1: (H + 2 padding - R) / stride is between -1 and 0, and int() of it is 0
              call("conv2d", (1, 1, 2, 2, 1, 5, 5, 2, 1), 4), call("conv2d", (1, 1, 9, 2, 1, 3, 5, 2, 1), 2),
              call("conv2d", (1, 1, 2, 9, 1, 5, 3, 3, 1), 4),
              # a negative stride, the kernel exactly the padded input: (H + 2 padding - R) // stride is 0
              call("conv2d", (1, 3, 3, 3, 4, 3, 3, -1, 0), 4), call("conv2d", (2, 2, 1, 1, 2, 3, 3, -2, 1), 2)]
    for _ in range(3):
        stride, r, s = rng.randint(2, 5), rng.randint(3, 9), rng.randint(3, 9)
        pad = rng.randint(0, (min(r, s) - 2) // 2)
        short = rng.randint(1, min(stride - 1, r - 2 * pad - 1))  # the padded height short of the kernel by 1 to stride - 1
        calls.append(call("conv2d", _ints(rng, (1, 2, r - 2 * pad - short, s - 2 * pad + rng.randint(0, 9), 2, r, s, stride, pad)), 4))
        calls.append(call("conv2d", _ints(rng, (1, 2, r - 2 * pad, s - 2 * pad, 2, r, s, -rng.randint(1, 5), pad)), 4))
    return [c for c in calls if _raises(c)]


def _raises(spec):
    try:
        reference_intensity(*rebuild(spec["args"]))
    except ValueError:
        return True
    return False


def observe_intensity_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "arithmetic_intensity", calls)


def judge_intensity_calls(observed, calls):
    """Per call: ValueError where the reference raises one; else a dict of exactly 'flops' and 'bytes' (ints of
    the right value) and 'intensity' (a float, flops / bytes to 1e-9)."""
    if not isinstance(observed, list) or len(observed) != len(calls):
        return f"{len(observed) if isinstance(observed, list) else 'no'} outcomes for {len(calls)} calls"
    for spec, got in zip(calls, observed):
        where = shown(spec, "arithmetic_intensity")
        if found := unreported(got, where):
            return found
        try:
            want = reference_intensity(*rebuild(spec["args"]))
        except ValueError:
            if found := must_raise(got, "ValueError", where):
                return found
            continue
        if "raised" in got:
            return f"{where} raised {got['raised'][0]}"
        value = rebuild(got["returned"])
        if not isinstance(value, dict) or set(value) != {"flops", "bytes", "intensity"}:
            return f"{where}: return a dict with exactly the keys 'flops', 'bytes', 'intensity'"
        for key in ("flops", "bytes"):
            if not _whole(value[key]):
                return f"{where}: {key!r} must be an int, got {type(value[key]).__name__}"
            if int(value[key]) != want[key]:
                return f"{where}: {key!r} is wrong"
        if not isinstance(value["intensity"], float) or not math.isclose(value["intensity"], want["intensity"], rel_tol=1e-9):
            return f"{where}: 'intensity' must be flops / bytes, a float"
    return None


_AI = "arithmetic_intensity"
HIDDEN = {_AI: [
    Case("matmul of other sizes and dtypes (matrix-vector too, NumPy ints, counts above 2**53): 2 FLOPs per "
         "multiply-add, inputs read and output written once", observe_intensity_calls, judge_intensity_calls,
         draw=draw_matmul),
    Case("add on tensors of 1 to 5 dimensions: 1 FLOP and 3 elements per output element", observe_intensity_calls,
         judge_intensity_calls, draw=draw_add),
    Case("conv2d with other kernels, strides and paddings: the output size floors, as PyTorch's",
         observe_intensity_calls, judge_intensity_calls, draw=draw_conv),
    Case("bad arguments: ValueError for an unknown op, a wrong shape, sizes below 1, no output, bad bytes_per_elem",
         observe_intensity_calls, judge_intensity_calls, draw=draw_bad),
    Case("conv2d with a height or width above 2**53: the output size floors in exact integers",
         observe_intensity_calls, judge_intensity_calls, draw=draw_huge_conv),
]}


# --- roofline_bound (attainable, bound) -------------------------------------------------------------

def _positive_finite(v):
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, numbers.Real) and math.isfinite(v) and v > 0


def reference_attainable(intensity, peak_flops, bandwidth):
    if not all(_positive_finite(v) for v in (intensity, peak_flops, bandwidth)):
        raise ValueError("not three positive finite numbers")
    return min(peak_flops, intensity * bandwidth)


def _exact(v):
    return Fraction(int(v)) if isinstance(v, numbers.Integral) else Fraction(float(v))


def reference_bound(intensity, peak_flops, bandwidth):
    """The text's comparison, exactly: intensity * bandwidth as a fraction, not a product rounded to a float."""
    if not all(_positive_finite(v) for v in (intensity, peak_flops, bandwidth)):
        raise ValueError("not three positive finite numbers")
    return "memory" if _exact(intensity) * _exact(bandwidth) < _exact(peak_flops) else "compute"


def _apart(rng, memory):
    """A peak well above (or below) ``memory``: no tie that rounding could decide."""
    return memory * 10 ** rng.uniform(0.05, 3) if rng.random() < 0.5 else memory / 10 ** rng.uniform(0.05, 3)


def _near_ridge(rng):
    """Just off the ridge, on both sides: ints above 2**53 one unit away (where a float rounds the product, or
    the ratio peak / bandwidth, onto the ridge), and floats a relative 1e-12 away whose product intensity *
    bandwidth is exact in floats (a dyadic intensity of at most 12 bits times a bandwidth of at most 40)."""
    calls = [call(1, 2 ** 53 + 2, 2 ** 53 + 1), call(3, 3 * 2 ** 53 + 4, 2 ** 53 + 1),   # 'memory' by one FLOP/s
             call(3, 3 * 2 ** 53 + 2, 2 ** 53 + 1), call(1, 2 ** 53, 2 ** 53 + 1),        # 'compute' by one
             call(1.0, 1e12, 1e12 * (1 - 1e-12)), call(1.0, 1e12 * (1 - 1e-12), 1e12)]
    for _ in range(4):
        intensity, bandwidth = rng.randint(1, 64), rng.randint(2 ** 53 + 1, 2 ** 55)
        calls.append(call(intensity, intensity * bandwidth + rng.choice([1, -1]), bandwidth))
    for _ in range(4):
        intensity = rng.randint(1, 4096) / 2 ** rng.randint(0, 6)
        bandwidth = rng.randint(1, 2 ** 40) * 2.0 ** rng.randint(-10, 10)
        calls.append(call(intensity, intensity * bandwidth * (1 + rng.choice([1e-12, -1e-12])), bandwidth))
    return calls


def draw_roofs(rng):
    """Just off the ridge first (ints above 2**53 one unit away, floats a relative 1e-12 away), then
    intensities, peaks and bandwidths over many orders of magnitude, memory- and compute-bound; ints (above
    2**53 too) and floats (NumPy's among them) for each of the three."""
    calls = _near_ridge(rng)
    for i in range(30):
        intensity, bandwidth = 10 ** rng.uniform(-3, 4), 10 ** rng.uniform(8, 13)
        peak = _apart(rng, intensity * bandwidth)
        kind = i % 5
        if kind == 1:  # every argument an int
            intensity, bandwidth = rng.randint(1, 5000), rng.randint(10 ** 8, 10 ** 13)
            peak = int(_apart(rng, intensity * bandwidth)) + 1
        elif kind == 2:  # integers above 2**53 (below 2**62), far from the ridge
            intensity, bandwidth = rng.randint(1, 16), rng.randint(2 ** 53 + 1, 2 ** 55)
            peak = rng.choice([intensity * bandwidth * rng.randint(2, 7) + rng.randint(1, 99),
                               intensity * bandwidth // rng.randint(2, 9) + 1])
        elif kind == 3:  # one int among floats, at a drawn place
            values = [intensity, peak, bandwidth]
            place = rng.randrange(3)
            values[place] = max(1, int(values[place]))
            intensity, peak, bandwidth = values
            if intensity * bandwidth == peak:
                peak += 1
        elif kind == 4:
            intensity, peak, bandwidth = np.float64(intensity), peak, np.float64(bandwidth)
        calls.append(call(intensity, peak, bandwidth))
    return calls


def draw_ridge(rng):
    """Exactly at the ridge, where intensity * bandwidth == peak_flops and peak_flops / bandwidth ==
    intensity both hold exactly: powers of two and small dyadic floats, and ints whose product is exact, above
    2**53 too (where a float would round the product)."""
    calls = [call(2.0 ** e, 2.0 ** (e + f), 2.0 ** f) for e, f in ((-3, 30), (0, 40), (5, 35), (11, 41))]
    calls += [call(3, 3 * 2 ** 53 + 3, 2 ** 53 + 1), call(7, 7 * (2 ** 54 + 3), 2 ** 54 + 3)]
    for _ in range(3):
        intensity, bandwidth = rng.randint(1, 64), rng.randint(2 ** 53 + 1, 2 ** 55)
        calls.append(call(intensity, intensity * bandwidth, bandwidth))
    for _ in range(6):
        intensity = rng.randint(1, 4096) / 2 ** rng.randint(0, 6)
        bandwidth = rng.randint(1, 4000) * 2.0 ** rng.randint(20, 34)
        calls.append(call(intensity, intensity * bandwidth, bandwidth))
    for _ in range(4):
        intensity, bandwidth = rng.randint(1, 4096), rng.randint(1, 2 ** 40)
        calls.append(call(intensity, intensity * bandwidth, bandwidth))
    return calls


def draw_roof_bad(rng):
    """Each of the three arguments, one at a time, zero (int and float), negative, infinite either way,
    NaN, a bool (NumPy's too), a str and None; the other two valid."""
    bad = [0, 0.0, -1.0, -rng.randint(1, 10 ** 6), math.inf, -math.inf, math.nan, True, False, np.True_, np.False_,
           "10", None]
    calls = []
    for place in range(3):
        for value in bad:
            args = [10 ** rng.uniform(-2, 3), 10 ** rng.uniform(10, 15), 10 ** rng.uniform(9, 12)]
            args[place] = value
            calls.append(call(*args))
    return calls


def observe_roof_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return {"attainable": observe_calls(ns, "attainable", calls), "bound": observe_calls(ns, "bound", calls)}


def _roof_verdict(name, spec, got, reference):
    where = shown(spec, name)
    if found := unreported(got, where):
        return found
    try:
        want = reference(*rebuild(spec["args"]))
    except ValueError:
        return must_raise(got, "ValueError", where)
    if "raised" in got:
        return f"{where} raised {got['raised'][0]}"
    value = rebuild(got["returned"])
    if name == "bound":
        if not isinstance(value, str) or value not in ("memory", "compute"):
            return f"{where} returned {value!r}: return 'memory' or 'compute'"
        if value != want:
            intensity, peak, bandwidth = rebuild(spec["args"])
            at_ridge = _exact(intensity) * _exact(bandwidth) == _exact(peak)
            label = " (at the ridge point the roof is flat: 'compute')" if at_ridge else ""
            return f"{where} returned {value!r}: the wrong side of the roof{label}"
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return f"{where} returned a {type(value).__name__}: return a number (FLOP/s)"
    if not math.isclose(float(value), float(want), rel_tol=1e-9):
        return f"{where} returned a wrong value: the roofline is min(peak_flops, intensity * bandwidth)"
    return None


def judge_roof_calls(observed, calls):
    if not isinstance(observed, dict) or not all(isinstance(observed.get(k), list) and len(observed[k]) == len(calls)
                                                 for k in ("attainable", "bound")):
        return f"not every call of attainable and bound was reported ({len(calls)} made)"
    for i, spec in enumerate(calls):
        for name, reference in (("attainable", reference_attainable), ("bound", reference_bound)):
            found = _roof_verdict(name, spec, observed[name][i], reference)
            if found:
                return found
    return None


_RB = "roofline_bound"
HIDDEN[_RB] = [
    Case("generated intensities, peaks and bandwidths (floats and ints, above 2**53 too, memory- and compute-bound)",
         observe_roof_calls, judge_roof_calls, draw=draw_roofs),
    Case("ridge point exactly: compute-bound, attainable equals the peak", observe_roof_calls, judge_roof_calls,
         draw=draw_ridge),
    Case("bad arguments: ValueError unless all three are positive finite numbers", observe_roof_calls, judge_roof_calls,
         draw=draw_roof_bad),
]

_PUBLIC_MATMUL = "matmul: 4096^3 in float16, 8x512 @ 512x1024 in float32"
_PUBLIC_ADD = "add: 1,000 float32 elements, a 64x3x32x32 float16 tensor"
_PUBLIC_CONV = "conv2d: a 3x3 ResNet layer in float16, a 5x5 stride-2 layer without padding in float32"
_PUBLIC_ROOF = "ridge at 10 FLOP/B: below, above, exactly at it, and an intensity of 0"
_H, _R = HIDDEN[_AI], HIDDEN[_RB]
CLAUSES = {
    _AI: {
        "returns a dict of exactly 'flops' (int), 'bytes' (int), 'intensity' (float, flops / bytes)":
            [_PUBLIC_MATMUL, _H[0].name, _H[1].name, _H[2].name],
        "2 FLOPs per multiply-add": [_PUBLIC_MATMUL, _H[0].name, _H[2].name],
        "each input read once and the output written once, nothing else (no bias, no workspace)":
            [_PUBLIC_MATMUL, _PUBLIC_ADD, _PUBLIC_CONV, _H[0].name, _H[1].name, _H[2].name],
        "bytes_per_elem a positive int: 4, 2, 1 or any other (NumPy ints too)": [_H[0].name, _H[1].name, _H[2].name],
        "matmul (M, K, N): an M x K matrix times a K x N matrix, any sizes": [_PUBLIC_MATMUL, _H[0].name],
        "add: 1 FLOP per output element, on a shape of one or more dimensions": [_PUBLIC_ADD, _H[1].name],
        "conv2d (N, C, H, W, K, R, S, stride, padding): the output size rounded down as nn.Conv2d, no bias":
            [_PUBLIC_CONV, _H[2].name, _H[4].name],
        "shapes hold any integers (NumPy ints, counts above 2**53)": [_H[0].name, _H[1].name, _H[2].name, _H[4].name],
        "ValueError for another op, a shape of the wrong length or holding anything but ints": [_H[3].name],
        "ValueError for a size or stride below 1, a padding below 0": [_H[3].name],
        "ValueError for a kernel larger than the padded input (no output)": [_H[3].name],
        "ValueError for a bytes_per_elem that is not a positive int": [_H[3].name],
    },
    _RB: {
        "attainable returns min(peak_flops, intensity * bandwidth), a number": [_PUBLIC_ROOF, _R[0].name],
        "bound: 'memory' when intensity * bandwidth is below peak_flops, 'compute' otherwise": [_PUBLIC_ROOF, _R[0].name],
        "at the ridge point the answer is 'compute'": [_PUBLIC_ROOF, _R[1].name],
        "both accept ints and floats": [_R[0].name, _R[1].name],
        "ValueError unless all three are positive finite numbers (not zero, negative, infinite, NaN, a bool, a str)":
            [_PUBLIC_ROOF, _R[2].name],
    },
}

"""Hidden checks for lesson 15 (roofline and launch overhead). Never released; see lesson01's file for the form.

Inputs are generated from seeds (``gpucourse.checks.lesson15``); the observers call the answers on
them in the sandbox and report plain data. The judges regenerate the same inputs here and apply the
exercise's counting rules, written out below independently of the public module.
"""

import math
import numbers

from gpucourse.checks import Case
from gpucourse.checks.lesson15 import add_calls, conv_calls, judge_counts, judge_roof, matmul_calls, roof_calls

# --- arithmetic_intensity ------------------------------------------------------------------------
# What the exercise's text states, and the case that checks it:
#  1. a dict with exactly 'flops' (int), 'bytes' (int), 'intensity' (float, flops / bytes) ..... every case
#  2. matmul (M, K, N): 2 FLOPs per multiply-add, 2*M*K*N; bytes (M*K + K*N + M*N) * b:
#     each input read once, the output written once; any sizes, matrix-vector too ........ "matmul ..."
#  3. add, any shape: 1 FLOP per output element, 3 elements moved per output element ......... "add ..."
#  4. conv2d (N, C, H, W, K, R, S, stride, padding), no bias: output P x Q with
#     P = (H + 2 padding - R) // stride + 1 (floor, as PyTorch), Q likewise from W and S;
#     FLOPs 2*N*K*P*Q*C*R*S; bytes (N*C*H*W + K*C*R*S + N*K*P*Q) * b ........................ "conv2d ..."
#  5. bytes_per_elem any positive int (1, 2, 4, 8 ...) ......................................... every case
#  6. ValueError: an unknown op, a shape of the wrong length, a size below 1, a padding below 0,
#     a stride below 1, a non-int size, an output smaller than 1x1, bytes_per_elem not a positive int .. "bad arguments ..."

SHAPE_LENGTH = {"matmul": 3, "conv2d": 9}


def expected_counts(op, shape, b):
    """(flops, bytes) by the exercise's rules, or None where it must raise ValueError."""
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        return None
    if op not in ("matmul", "add", "conv2d") or not isinstance(shape, (list, tuple)):
        return None
    if any(isinstance(v, bool) or not isinstance(v, int) for v in shape):
        return None
    if op in SHAPE_LENGTH and len(shape) != SHAPE_LENGTH[op]:
        return None
    if op == "matmul":
        M, K, N = shape
        if min(shape) < 1:
            return None
        return 2 * M * K * N, (M * K + K * N + M * N) * b
    if op == "add":
        if not shape or min(shape) < 1:
            return None
        n = math.prod(shape)
        return n, 3 * n * b
    N, C, H, W, K, R, S, stride, pad = shape
    if min(N, C, H, W, K, R, S, stride) < 1 or pad < 0:
        return None
    if H + 2 * pad < R or W + 2 * pad < S:
        return None
    P, Q = (H + 2 * pad - R) // stride + 1, (W + 2 * pad - S) // stride + 1
    return 2 * N * K * P * Q * C * R * S, (N * C * H * W + K * C * R * S + N * K * P * Q) * b


BAD_CALLS = [
    ["mul", [4, 4, 4], 4], ["Matmul", [4, 4, 4], 4], ["matmul", [4, 4], 4], ["matmul", [4, 0, 4], 4],
    ["matmul", [4, 4, 4], 0], ["matmul", [4, 4, 4], -2], ["matmul", [4, 4.0, 4], 4], ["matmul", [4, 4, 4], 2.5],
    ["add", [], 4], ["add", [3, 0], 2], ["add", [3, -1], 2],
    ["conv2d", [1, 3, 8, 8, 4, 3, 3, 1], 4],             # 8 numbers: padding missing
    ["conv2d", [1, 3, 8, 8, 4, 3, 3, 0, 1], 4],          # stride 0
    ["conv2d", [1, 3, 8, 8, 4, 3, 3, 1, -1], 4],         # negative padding
    ["conv2d", [1, 3, 2, 8, 4, 5, 3, 1, 1], 4],          # 2 + 2 < 5: no output row
    ["conv2d", [1, 3, 8, 8, 4, 3, 3, 1, 1], True],       # a bool is not a size in bytes
]


def observe_matmul(ns):
    from gpucourse.checks.lesson15 import matmul_calls, observe_intensity

    return observe_intensity(ns, matmul_calls(1501, 12))


def observe_add(ns):
    from gpucourse.checks.lesson15 import add_calls, observe_intensity

    return observe_intensity(ns, add_calls(1502, 8))


def observe_conv(ns):
    from gpucourse.checks.lesson15 import conv_calls, observe_intensity

    return observe_intensity(ns, conv_calls(1503, 16))


def observe_bad(ns):
    from gpucourse.checks.lesson15 import observe_intensity

    calls = [
        ["mul", [4, 4, 4], 4], ["Matmul", [4, 4, 4], 4], ["matmul", [4, 4], 4], ["matmul", [4, 0, 4], 4],
        ["matmul", [4, 4, 4], 0], ["matmul", [4, 4, 4], -2], ["matmul", [4, 4.0, 4], 4], ["matmul", [4, 4, 4], 2.5],
        ["add", [], 4], ["add", [3, 0], 2], ["add", [3, -1], 2],
        ["conv2d", [1, 3, 8, 8, 4, 3, 3, 1], 4],
        ["conv2d", [1, 3, 8, 8, 4, 3, 3, 0, 1], 4],
        ["conv2d", [1, 3, 8, 8, 4, 3, 3, 1, -1], 4],
        ["conv2d", [1, 3, 2, 8, 4, 5, 3, 1, 1], 4],
        ["conv2d", [1, 3, 8, 8, 4, 3, 3, 1, 1], True],
    ]
    return observe_intensity(ns, calls)


def judge_bad(results):
    if any(expected_counts(op, shape, b) is not None for op, shape, b in BAD_CALLS):
        return "a bad-argument case has a valid answer: report this check"
    return judge_counts(results, BAD_CALLS, expected_counts, label="bad arguments: ")


HIDDEN = {"arithmetic_intensity": [
    Case("matmul of other sizes and dtypes (matrix-vector too): 2 FLOPs per multiply-add, inputs read and output written once",
         observe_matmul, lambda d: judge_counts(d, matmul_calls(1501, 12), expected_counts)),
    Case("add on tensors of 1 to 4 dimensions: 1 FLOP and 3 elements per output element", observe_add,
         lambda d: judge_counts(d, add_calls(1502, 8), expected_counts)),
    Case("conv2d with other kernels, strides and paddings: the output size floors, as PyTorch's",
         observe_conv, lambda d: judge_counts(d, conv_calls(1503, 16), expected_counts)),
    Case("bad arguments: ValueError for an unknown op, a wrong shape, sizes below 1, no output, bad bytes_per_elem",
         observe_bad, judge_bad),
]}


# --- roofline_bound (attainable, bound) -------------------------------------------------------------
#  1. attainable = min(peak_flops, intensity * bandwidth), FLOP/s ............................ "generated ..."
#  2. bound: "memory" when intensity * bandwidth < peak_flops, else "compute"; at the ridge point
#     (intensity == peak_flops / bandwidth) "compute" ......................................... "generated ...", "ridge ..."
#  3. ints and floats alike ..................................................................... "generated ..."
#  4. ValueError unless all three are positive finite numbers (a bool is not one) .............. "bad arguments ..."

def expected_roof(intensity, peak, bandwidth):
    for v in (intensity, peak, bandwidth):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
            return None
    memory = intensity * bandwidth
    return (min(peak, memory), "memory" if memory < peak else "compute")


def ridge_calls():
    """Exactly at the ridge, at powers of two: i * b == peak and peak / b == i hold exactly."""
    return [[2.0 ** e, 2.0 ** (e + f), 2.0 ** f] for e, f in ((-3, 30), (0, 40), (5, 35), (11, 41))]


def observe_roof_generated(ns):
    from gpucourse.checks.lesson15 import observe_roof, roof_calls

    return observe_roof(ns, roof_calls(1511, 30))


def observe_ridge(ns):
    from gpucourse.checks.lesson15 import observe_roof

    return observe_roof(ns, [[2.0 ** e, 2.0 ** (e + f), 2.0 ** f] for e, f in ((-3, 30), (0, 40), (5, 35), (11, 41))])


def observe_roof_bad(ns):
    from gpucourse.checks.lesson15 import observe_roof

    inf, nan = float("inf"), float("nan")
    calls = [[-1.0, 1e12, 1e11], [1.0, 0, 1e11], [1.0, 1e12, 0.0], [1.0, -1e12, 1e11], [1.0, 1e12, -5],
             [inf, 1e12, 1e11], [1.0, inf, 1e11], [nan, 1e12, 1e11], [1.0, 1e12, nan], [True, 1e12, 1e11],
             ["10", 1e12, 1e11], [None, 1e12, 1e11]]
    return observe_roof(ns, calls)


ROOF_BAD = [[-1.0, 1e12, 1e11], [1.0, 0, 1e11], [1.0, 1e12, 0.0], [1.0, -1e12, 1e11], [1.0, 1e12, -5],
            [math.inf, 1e12, 1e11], [1.0, math.inf, 1e11], [math.nan, 1e12, 1e11], [1.0, 1e12, math.nan],
            [True, 1e12, 1e11], ["10", 1e12, 1e11], [None, 1e12, 1e11]]


def judge_roof_bad(results):
    if any(expected_roof(*args) is not None for args in ROOF_BAD):
        return "a bad-argument case has a valid answer: report this check"
    return judge_roof(results, ROOF_BAD, expected_roof, label="bad arguments: ")


HIDDEN["roofline_bound"] = [
    Case("generated intensities, peaks and bandwidths (floats and ints, ties at the ridge)",
         observe_roof_generated, lambda d: judge_roof(d, roof_calls(1511, 30), expected_roof)),
    Case("ridge point exactly: compute-bound, attainable equals the peak", observe_ridge,
         lambda d: judge_roof(d, ridge_calls(), expected_roof, label="at the ridge: ")),
    Case("bad arguments: ValueError unless all three are positive finite numbers", observe_roof_bad, judge_roof_bad),
]

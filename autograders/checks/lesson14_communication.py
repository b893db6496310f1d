"""Hidden checks for lesson 14 (the cost of communication). Never released.

Differential: each case draws its inputs at grading time (boundaries first, then random ones from the
whole domain the exercise's text states); the sandbox calls the answer on them and the judges call the
references below, which exist on the grader's side only, on the same inputs.
"""

import math

from gpucourse.checks import Case
from gpucourse.checks.values import describe, rebuild

from autograders.differential import call, judge_calls, must_raise, shown, unreported

# --- fit_alpha_beta ------------------------------------------------------------------------------------

FIT_RELATIVE = 1e-6  # the text's accuracy: beta to a relative 1e-6, alpha to 1e-6 of the largest time


def reference_fit(sizes_bytes, seconds):
    """The text's rule: the ordinary least-squares line t = a + s n over all the points (centered sums,
    exactly rounded), (a, 1 / s); ValueError for lengths that differ, fewer than 2 distinct sizes, a size
    or time <= 0, or a slope that is not positive."""
    sizes, times = [float(n) for n in sizes_bytes], [float(t) for t in seconds]
    if len(sizes) != len(times):
        raise ValueError("lengths differ")
    if len(set(sizes)) < 2:
        raise ValueError("fewer than 2 distinct sizes")
    if min(sizes) <= 0 or min(times) <= 0:
        raise ValueError("a size or a time <= 0")
    mean_n, mean_t = math.fsum(sizes) / len(sizes), math.fsum(times) / len(times)
    slope = (math.fsum((n - mean_n) * (t - mean_t) for n, t in zip(sizes, times))
             / math.fsum((n - mean_n) ** 2 for n in sizes))
    if not slope > 0:
        raise ValueError("the slope is not positive")
    return (mean_t - slope * mean_n, 1 / slope)


FORMS = ("list", "tuple", "numpy")


def fit_call(rng, sizes, seconds, forms=None):
    """One call: ``sizes`` and ``seconds`` each as a list, a tuple or a NumPy array (``forms``, drawn when None)."""
    forms = forms or (rng.choice(FORMS), rng.choice(FORMS))
    spec = call(tuple(sizes) if forms[0] == "tuple" else list(sizes), tuple(seconds) if forms[1] == "tuple" else list(seconds))
    spec["numpy"] = [forms[0] == "numpy", forms[1] == "numpy"]
    return spec


def _link_sizes(rng, distinct):
    """``distinct`` sizes from 1 KiB to 1 GiB, one per octave drawn (ints or floats, not only powers of 2)."""
    octaves = rng.sample(range(10, 30), distinct)
    sizes = []
    for k in octaves:
        size = rng.choice([2 ** k, rng.randint(2 ** k, 2 ** (k + 1) - 1)])
        sizes.append(size if rng.random() < 0.5 else float(size) + rng.choice([0.0, 0.5]))
    return sizes


def _measure(rng, sizes, alpha, beta, noise):
    return [max(1e-7, (alpha + n / beta) * (1 + rng.uniform(-noise, noise))) for n in sizes]


def _close_sizes_link(rng):
    """Large sizes close together (a spread a few millionths of the size): t = alpha + n / beta exactly,
    the time growing by a few millionths across them. Sums of squares of the sizes cancel there."""
    base = rng.randint(2 ** 20, 2 ** 30)
    count = rng.randint(3, 5)
    step = max(1, round(base / 10 ** rng.uniform(5.5, 6.5) / (count - 1)))
    sizes = [base + i * step for i in range(count)]
    t0 = 10 ** rng.uniform(-4, 0)
    slope = t0 * 10 ** rng.uniform(-6, -5) / (sizes[-1] - base)
    alpha = t0 - slope * base
    rng.shuffle(sizes)
    return sizes, [alpha + slope * n for n in sizes]


def draw_links(rng):
    """Generated links: a latency of 1 µs to 2 ms and a bandwidth of 0.1 to 50 GB/s, 2 to 9 distinct
    sizes, some repeated, in any order, times with 0 to 30% noise; lists, tuples and NumPy arrays, ints
    and floats. Boundaries first: two distinct sizes (one repeated, in either order), an exact line
    whose intercept is negative (alpha as the fit gives it), and large sizes close together (float64 holds
    the fit to far better than 1e-6 there only when the sums are centered, not as sums of squares)."""
    calls = [fit_call(rng, [1e9, 1e9 + 1e3, 1e9 + 2e3], [1.0, 1.0 + 1e-6, 1.0 + 2.2e-6]),
             fit_call(rng, [1048576, 1048577, 1048578], [1e-3, 1.00001e-3, 1.00002e-3])]
    for _ in range(4):
        calls.append(fit_call(rng, *_close_sizes_link(rng)))
    for forms in [("list", "list"), ("tuple", "tuple"), ("numpy", "numpy"), ("list", "numpy"), ("numpy", "tuple")]:
        sizes = [4096, 1048576] if rng.random() < 0.5 else [1048576.0, 4096.0]
        calls.append(fit_call(rng, sizes, _measure(rng, sizes, 3e-4, 1.5e9, 0.0), forms))
    sizes = [65536, 65536, 262144]
    calls.append(fit_call(rng, sizes, [2e-4, 3e-4, 4e-4]))
    beta = 10 ** rng.uniform(8.5, 10)
    sizes = [2 ** k for k in range(16, 24)]
    rng.shuffle(sizes)
    alpha = -0.5 * min(sizes) / beta  # every time still positive, the intercept below 0
    calls.append(fit_call(rng, sizes, [alpha + n / beta for n in sizes]))
    for _ in range(18):
        alpha, beta = 10 ** rng.uniform(-6, -2.7), 10 ** rng.uniform(8, 10.7)
        distinct = _link_sizes(rng, rng.randint(2, 9))
        sizes = [s for s in distinct for _ in range(rng.choice([1, 1, 3]))]
        if max(distinct) < 4 * alpha * beta:  # the largest size shows the bandwidth above the noise
            sizes.append(2 ** math.ceil(math.log2(4 * alpha * beta)))
        rng.shuffle(sizes)
        calls.append(fit_call(rng, sizes, _measure(rng, sizes, alpha, beta, rng.choice([0.0, 0.05, 0.3]))))
    return calls


def draw_bad_fits(rng):
    """Each way out of the domain, at a drawn position: lengths that differ, nothing, one point, one
    distinct size repeated, a size or a time of 0 or below, times that fall with the size, and a slope
    of exactly 0 (times mirrored around the middle size: the centered sums cancel exactly)."""
    def good(count):
        sizes = _link_sizes(rng, count)
        return sizes, _measure(rng, sizes, 10 ** rng.uniform(-5, -3), 10 ** rng.uniform(8.5, 10), 0.05)

    calls = [fit_call(rng, [], []), fit_call(rng, [8192.0], [1e-3]), fit_call(rng, [8192, 8192], [1e-3, 2e-3])]
    for _ in range(2):
        sizes, times = good(rng.randint(2, 6))
        calls.append(fit_call(rng, sizes, times[:-1]))                           # one time short
        calls.append(fit_call(rng, sizes[:-1], times))                           # one size short
        size = float(rng.randint(1, 2 ** 30))
        repeated = [size] * rng.randint(2, 5)
        calls.append(fit_call(rng, repeated, _measure(rng, repeated, 1e-4, 1e9, 0.3)))
        for bad in (0, 0.0, -1.0, -rng.randint(1, 2 ** 20)):
            sizes, times = good(rng.randint(3, 6))
            spoilt = list(sizes)
            spoilt[rng.randrange(len(spoilt))] = bad
            calls.append(fit_call(rng, spoilt, times))
            spoilt = list(times)
            spoilt[rng.randrange(len(spoilt))] = -abs(bad) * 1e-6 if bad else bad
            calls.append(fit_call(rng, sizes, spoilt))
        sizes, times = good(rng.randint(2, 6))
        calls.append(fit_call(rng, sorted(sizes), sorted(times, reverse=True)))  # falling
    for _ in range(4):  # slope exactly 0: sizes m - d, m, m + d, the outer two times equal, dyadic
        middle = rng.randint(2 ** 12, 2 ** 24)
        step = rng.randint(1, middle // 2)
        sizes = [middle - step, middle, middle + step]
        outer = rng.randint(1, 64) * 2.0 ** -16
        inner = rng.choice([outer * 2, outer / 2, 2.0 ** -rng.randint(8, 20)])
        times = [outer, inner if inner != outer else outer * 4, outer]
        order = rng.sample(range(3), 3)
        calls.append(fit_call(rng, [sizes[i] for i in order], [times[i] for i in order]))
    return calls


def observe_fit_calls(ns, calls):
    from gpucourse.checks import AnswerError, answer
    from gpucourse.checks.values import describe, rebuild

    function = answer(ns, "fit_alpha_beta")
    outcomes = []
    for spec in calls:
        args = rebuild(spec["args"])
        if any(spec.get("numpy", [])):
            import numpy as np

            args = [np.asarray(a) if as_array else a for a, as_array in zip(args, spec["numpy"])]
        try:
            outcomes.append({"returned": describe(function(*args))})
        except (AnswerError, NotImplementedError):
            raise
        except Exception as error:
            outcomes.append({"raised": [k.__name__ for k in type(error).__mro__]})
    return outcomes


def _fit_where(spec):
    sizes, seconds = rebuild(spec["args"])
    kinds = ["a NumPy array" if numpy else type(v).__name__ for v, numpy in zip((sizes, seconds), spec["numpy"])]
    text = shown({"args": describe([list(sizes), list(seconds)])}, "fit_alpha_beta", limit=140)
    return f"{text} (given as {kinds[0]} and {kinds[1]})"


def judge_fit_calls(observed, calls):
    if not isinstance(observed, list) or len(observed) != len(calls):
        return f"{len(observed) if isinstance(observed, list) else 'no'} outcomes for {len(calls)} calls"
    for spec, got in zip(calls, observed):
        sizes, seconds = rebuild(spec["args"])
        where = _fit_where(spec)
        if found := unreported(got, where):
            return found
        try:
            alpha, beta = reference_fit(sizes, seconds)
        except ValueError:
            if "returned" in got and _within_rounding_of_zero_slope(sizes, seconds, rebuild(got["returned"])):
                continue
            if found := must_raise(got, "ValueError", where):
                return found
            continue
        if "raised" in got:
            return f"{where} raised {got['raised'][0]}"
        value = rebuild(got["returned"])
        if not (isinstance(value, tuple) and len(value) == 2
                and all(isinstance(v, float) and math.isfinite(v) for v in value)):
            return f"{where} returned {_kind(got['returned'])}: return a tuple of two floats (alpha, beta)"
        if not abs(value[1] - beta) <= FIT_RELATIVE * beta:
            return (f"{where}: beta is not the least-squares fit of t = alpha + n / beta to a relative "
                    f"{FIT_RELATIVE:g} (a line in linear space through all the points; beta = 1 / slope)")
        if not abs(value[0] - alpha) <= FIT_RELATIVE * max(seconds):
            return (f"{where}: alpha is not the least-squares intercept to {FIT_RELATIVE:g} of the largest time "
                    "(alpha as the fit gives it, even below 0)")
    return None


def _within_rounding_of_zero_slope(sizes, seconds, value):
    """Whether ``value`` is a fit of a least-squares slope of exactly 0 that rounding left a hair above 0
    (a solver by QR or SVD, as numpy.polyfit): beta beyond 1e6 times the sizes' spread over the times',
    and alpha the mean time. Only where the exact slope is 0: a falling line must raise."""
    sizes, times = [float(n) for n in sizes], [float(t) for t in seconds]
    if (len(sizes) != len(times) or len(set(sizes)) < 2 or min(sizes) <= 0 or min(times) <= 0
            or len(set(times)) < 2):
        return False
    mean_n, mean_t = math.fsum(sizes) / len(sizes), math.fsum(times) / len(times)
    if math.fsum((n - mean_n) * (t - mean_t) for n, t in zip(sizes, times)) != 0:
        return False
    if not (isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, float) and math.isfinite(v) for v in value)):
        return False
    alpha, beta = value
    spread = (max(sizes) - min(sizes)) / (max(times) - min(times))
    return beta >= 1e6 * spread and abs(alpha - mean_t) <= FIT_RELATIVE * max(times)


def _kind(data):
    from gpucourse.checks.values import type_words

    if isinstance(data, dict) and "__tuple__" in data:
        return f"a tuple of {', '.join(type_words(v) for v in data['__tuple__'])}"
    return type_words(data)


HIDDEN = {
    "fit_alpha_beta": [
        Case("generated links (noisy, repeated and shuffled sizes, two sizes, large sizes close together, lists, "
             "tuples and NumPy arrays): the least-squares alpha and beta", observe_fit_calls, judge_fit_calls,
             draw=draw_links),
        Case("bad input raises ValueError (lengths, fewer than 2 sizes, sizes or times <= 0, a slope <= 0)",
             observe_fit_calls, judge_fit_calls, draw=draw_bad_fits),
    ],
}


# --- comm_bytes_per_step -------------------------------------------------------------------------------

def reference_comm_bytes(strategy, n_params, world_size, bytes_per_elem):
    """The text's count: ring phases of N - 1 chunks of ceil(P / N) elements each; DDP, ZeRO-1 and ZeRO-2
    two phases, ZeRO-3 three; ValueError for another strategy or a size out of its domain."""
    phases = {"ddp": 2, "zero1": 2, "zero2": 2, "zero3": 3}
    if not isinstance(strategy, str) or strategy not in phases:
        raise ValueError(f"unknown strategy {strategy!r}")
    if world_size < 1 or n_params < 0 or bytes_per_elem < 1:
        raise ValueError("a size out of its domain")
    return phases[strategy] * (world_size - 1) * (-(-n_params // world_size)) * bytes_per_elem


STRATEGIES = ("ddp", "zero1", "zero2", "zero3")


def draw_every_strategy(rng):
    """Every strategy on 1 to 9 ranks and on many, with parameter counts 0, divisible, not divisible and
    large; element sizes 1, 2, 4, 8 and any other; integers above 2**53 (a float division rounds there)."""
    calls = []
    for strategy in STRATEGIES:
        for world in range(1, 10):
            for n_params in (0, world * rng.randint(1, 999), world * rng.randint(1, 999) + rng.randint(1, world - 1 or 1),
                             rng.randint(10 ** 6, 10 ** 10)):
                calls.append(call(strategy, n_params, world, rng.choice([1, 2, 4, 8, rng.randint(1, 64)])))
        big = 2 ** 53 + rng.randint(1, 10 ** 9)
        world = rng.randint(2, 4096)
        calls += [call(strategy, big * world + rng.randint(1, world - 1), world, rng.choice([1, 2, 4])),
                  call(strategy, rng.randint(2 ** 54, 2 ** 80), rng.randint(3, 10 ** 6), rng.randint(1, 16)),
                  call(strategy, rng.randint(0, 10 ** 6), 1, rng.randint(1, 16)),
                  call(strategy, rng.randint(1, 10 ** 6), rng.randint(10, 10 ** 5), rng.randint(1, 2 ** 40))]
    rng.shuffle(calls)
    return calls


def draw_few_parameters(rng):
    """Fewer parameters than ranks (and none): chunks of one padded element, or nothing."""
    calls = [call("ddp", 3, 8, 4), call("zero3", 1, 5, 2), call("zero1", 5, 7, 8), call("zero2", 2, 3, 1),
             call("zero3", 0, 6, 2)]
    for _ in range(8):
        world = rng.randint(2, 64)
        calls.append(call(rng.choice(STRATEGIES), rng.randint(0, world - 1), world, rng.randint(1, 8)))
    return calls


def draw_bad_bytes(rng):
    """Every way out of the domain: another strategy (another case, spaces, a near name), world_size < 1,
    n_params < 0, bytes_per_elem < 1; also on one rank and with no parameters, where nothing is sent
    (named values first: no parameters on no ranks, parameters on one rank with elements of no bytes)."""
    others = ["DDP", "Zero1", "ZERO3", " ddp", "zero2 ", "zero", "zero4", "zero0", "fsdp", "dp", "", "ddp\n"]
    calls = [call("ddp", 0, 0, 4), call("zero3", 0, -3, 2), call("ddp", 10, 1, 0), call("zero1", 5, 1, -2)]
    for strategy in others:
        calls.append(call(strategy, rng.randint(0, 10 ** 6), rng.randint(1, 9), rng.choice([1, 2, 4])))
    calls += [call(rng.choice(others), 100, 1, 4), call(rng.choice(others), 0, 4, 4), call(rng.choice(others), 0, 1, 2)]
    for _ in range(3):
        strategy = rng.choice(STRATEGIES)
        calls += [call(strategy, rng.randint(0, 10 ** 6), rng.randint(-5, 0), rng.choice([1, 2, 4])),
                  call(strategy, -rng.randint(1, 10 ** 6), rng.randint(1, 9), rng.choice([1, 2, 4])),
                  call(strategy, -1, 1, 4),
                  call(strategy, rng.randint(0, 10 ** 6), rng.randint(1, 9), rng.randint(-4, 0)),
                  call(strategy, 0, 1, 0)]
    return calls


def observe_bytes_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "comm_bytes_per_step", calls)


HIDDEN["comm_bytes_per_step"] = [
    Case("every strategy, 1 to 9 ranks and more, parameter counts that do and do not divide, up to integers above 2**53",
         observe_bytes_calls, judge_calls(reference_comm_bytes, "comm_bytes_per_step"), draw=draw_every_strategy),
    Case("fewer parameters than ranks: chunks of one padded element", observe_bytes_calls,
         judge_calls(reference_comm_bytes, "comm_bytes_per_step"), draw=draw_few_parameters),
    Case("bad input raises ValueError (another strategy, world_size < 1, n_params < 0, bytes_per_elem < 1)",
         observe_bytes_calls, judge_calls(reference_comm_bytes, "comm_bytes_per_step"), draw=draw_bad_bytes),
]


FIT_PUBLIC_CASE = "an exact line and a noisy measurement: the least-squares alpha and beta"
FIT_BAD_PUBLIC_CASE = "lengths that differ, one distinct size: ValueError"
BYTES_PUBLIC_CASE = "DDP, ZeRO-1 and ZeRO-3 on 4 ranks, a padded buffer, one rank"
BYTES_BAD_PUBLIC_CASE = "an unknown strategy, world_size 0: ValueError"
_FIT, _BYTES = HIDDEN["fit_alpha_beta"], HIDDEN["comm_bytes_per_step"]
CLAUSES = {
    "fit_alpha_beta": {
        "the ordinary least-squares line t = a + s n over all the points, in linear space (not log space)":
            [FIT_PUBLIC_CASE, _FIT[0].name],
        "alpha = a in seconds, beta = 1 / s in bytes per second": [FIT_PUBLIC_CASE, _FIT[0].name],
        "lists, tuples or 1-D NumPy arrays of numbers, of equal length": [_FIT[0].name],
        "sizes may repeat and come in any order; two distinct sizes are enough": [_FIT[0].name],
        "return a tuple of two floats": [FIT_PUBLIC_CASE, _FIT[0].name],
        "alpha as the fit gives it, even slightly negative": [_FIT[0].name],
        "beta within a relative 1e-6, alpha within 1e-6 x the largest time (float64, large close sizes too)":
            [FIT_PUBLIC_CASE, _FIT[0].name],
        "ValueError when the lengths differ": [FIT_BAD_PUBLIC_CASE, _FIT[1].name],
        "ValueError for fewer than 2 distinct sizes": [FIT_BAD_PUBLIC_CASE, _FIT[1].name],
        "ValueError when any size or time is <= 0": [_FIT[1].name],
        "ValueError when the fitted slope is not positive (exactly 0 included)": [_FIT[1].name],
    },
    "comm_bytes_per_step": {
        "returns an int": [BYTES_PUBLIC_CASE, _BYTES[0].name],
        "ring collectives: N - 1 chunks per phase per rank; an all-reduce is two phases":
            [BYTES_PUBLIC_CASE, _BYTES[0].name],
        "the buffer padded to N c elements, c = ceil(n_params / N)": [BYTES_PUBLIC_CASE, _BYTES[0].name, _BYTES[1].name],
        "ddp: one all-reduce; zero1 and zero2: a reduce-scatter and an all-gather; zero3: two all-gathers and a reduce-scatter":
            [BYTES_PUBLIC_CASE, _BYTES[0].name],
        "any n_params >= 0, world_size >= 1, bytes_per_elem >= 1 (ints, integers above 2**53 too)": [_BYTES[0].name],
        "one rank sends nothing": [BYTES_PUBLIC_CASE, _BYTES[0].name],
        "ValueError for any other strategy (the four names exactly, in lower case)":
            [BYTES_BAD_PUBLIC_CASE, _BYTES[2].name],
        "ValueError for world_size < 1, n_params < 0 or bytes_per_elem < 1": [BYTES_BAD_PUBLIC_CASE, _BYTES[2].name],
    },
}

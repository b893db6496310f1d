"""Public checks for lesson 14 (the cost of communication). Observers are self-contained: see lesson01.py.

The judges recompute every expected value from the inputs they generate themselves (seeded): the least-
squares line of t = alpha + n / beta, and a ring's bytes per rank; they never read an expectation from
an observation.
"""

from __future__ import annotations

import math

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson14_communication"  # the course folder this module's exercises belong to

FIT_RELATIVE = 1e-6  # beta within 1e-6 of itself; alpha within 1e-6 of the largest time given


# --- Exercise 1: the latency-bandwidth fit ------------------------------------------------------------

def fit_inputs(seed: int, count: int) -> list[list[list[float]]]:
    """``count`` measurements ``[sizes_bytes, seconds]`` of a made-up link: a latency of 5 µs to 2 ms, a
    bandwidth of 0.2 to 20 GB/s, sizes from 1 KiB to 256 MiB (some repeated, as repetitions are), times
    with up to 30% noise, each point at least 0.1 µs. Seeded: the observer and the judge build the same."""
    import math
    import random

    rng = random.Random(seed)
    found = []
    for i in range(count):
        alpha, beta = 10 ** rng.uniform(-5.3, -2.7), 10 ** rng.uniform(8.3, 10.3)
        distinct = sorted({2 ** rng.randint(10, 28) for _ in range(rng.randint(2, 9))})
        if len(distinct) < 2:
            distinct = [distinct[0], distinct[0] * 4]
        if distinct[-1] < 4 * alpha * beta:  # the largest size shows the bandwidth above the noise
            distinct.append(2 ** math.ceil(math.log2(4 * alpha * beta)))
        sizes = [s for s in distinct for _ in range(rng.choice([1, 1, 3]))]
        rng.shuffle(sizes)  # a measurement need not come sorted
        noise = 0.0 if i == 0 else rng.choice([0.05, 0.3])
        seconds = [max(1e-7, (alpha + s / beta) * (1 + rng.uniform(-noise, noise))) for s in sizes]
        found.append([[float(s) for s in sizes], seconds])
    return found


def expected_fit(sizes, seconds) -> tuple[float, float] | None:
    """The ordinary least-squares line t = a + s * n (centered sums, in float64); ``(a, 1 / s)``, or None
    where the slope is not positive."""
    n = len(sizes)
    mean_n, mean_t = sum(sizes) / n, sum(seconds) / n
    spread = sum((x - mean_n) ** 2 for x in sizes)
    slope = sum((x - mean_n) * (t - mean_t) for x, t in zip(sizes, seconds)) / spread
    if not slope > 0:
        return None
    return mean_t - slope * mean_n, 1 / slope


FIT_PUBLIC = [
    [[1024.0, 4096.0, 16384.0, 65536.0], [1e-4 + 1024 / 2e9, 1e-4 + 4096 / 2e9, 1e-4 + 16384 / 2e9, 1e-4 + 65536 / 2e9]],
    [[1e3, 1e4, 1e5, 1e6, 1e7, 1e7], [2.2e-4, 1.8e-4, 3.5e-4, 1.2e-3, 1.05e-2, 0.95e-2]],
]
FIT_BAD_PUBLIC = [
    [[1024.0, 2048.0], [1e-3]],                  # lengths differ
    [[4096.0, 4096.0, 4096.0], [1e-3, 2e-3, 3e-3]],  # one distinct size
]


def observe_fits(ns, inputs=None, bad=None, forms=("list",)):
    """``fit_alpha_beta`` on each ``[sizes, seconds]`` of ``inputs`` (FIT_PUBLIC by default), passed as
    each of ``forms`` ("list", "tuple", "numpy"); and what each of ``bad`` raises. Results as data: two
    floats, or a description of what came back."""
    import numbers

    import numpy as np

    from gpucourse.checks import answer
    from gpucourse.checks.lesson14 import FIT_BAD_PUBLIC, FIT_PUBLIC

    def describe(got):
        if (isinstance(got, tuple) and len(got) == 2
                and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in got)):
            return [float(v) for v in got]
        return f"a {type(got).__name__} {str(got)[:60]}"

    convert = {"list": list, "tuple": tuple, "numpy": np.array}
    function = answer(ns, "fit_alpha_beta")
    results = []
    for sizes, seconds in FIT_PUBLIC if inputs is None else inputs:
        for form in forms:
            given = (convert[form](list(sizes)), convert[form](list(seconds)))
            try:
                got = describe(function(*given))
            except Exception as error:
                got = f"raised {type(error).__name__}: {str(error)[:80]}"
            results.append([sizes, seconds, form, got])
    raised = []
    for sizes, seconds in FIT_BAD_PUBLIC if bad is None else bad:
        try:
            raised.append([sizes, seconds, f"returned {str(function(list(sizes), list(seconds)))[:60]}"])
        except Exception as error:
            raised.append([sizes, seconds, type(error).__name__])
    return {"results": results, "raised": raised}


def judge_fits(d, inputs=None, forms=("list",)):
    """Every fit within the tolerance of the least-squares line the judge computes from the inputs."""
    from gpucourse.checks.lesson14 import FIT_PUBLIC, FIT_RELATIVE, expected_fit

    inputs = FIT_PUBLIC if inputs is None else inputs
    wanted = [[s, t, form] for s, t in inputs for form in forms]
    if [row[:3] for row in d["results"]] != wanted:
        return "the inputs were changed while checking"
    for sizes, seconds, form, got in d["results"]:
        shown = f"fit_alpha_beta(sizes={_short(sizes)}, seconds={_short(seconds)}) given as {form}s"
        fit = expected_fit(sizes, seconds)
        if fit is None:  # times that fall with size: no bandwidth to fit
            if not (isinstance(got, str) and got.startswith("raised ValueError")):
                what = got if isinstance(got, str) else f"returned {tuple(got)}"
                return f"{shown}: the least-squares slope is not positive, so it must raise ValueError, but it {what}"
            continue
        if isinstance(got, str):
            return f"{shown} {got if got.startswith('raised') else 'returned ' + got}: return a tuple of two floats (alpha, beta)"
        alpha, beta = fit
        if not abs(got[1] - beta) <= FIT_RELATIVE * beta:
            return (f"{shown}: beta {got[1]:.6g} B/s, the least-squares fit of t = alpha + n / beta gives {beta:.6g} "
                    f"(to a relative {FIT_RELATIVE:g})")
        if not abs(got[0] - alpha) <= FIT_RELATIVE * max(seconds):
            return (f"{shown}: alpha {got[0]:.6g} s, the least-squares fit of t = alpha + n / beta gives {alpha:.6g} "
                    f"(to {FIT_RELATIVE:g} of the largest time)")
    return None


def judge_fit_errors(d, bad=None):
    """Every bad input raised ValueError."""
    from gpucourse.checks.lesson14 import FIT_BAD_PUBLIC

    bad = FIT_BAD_PUBLIC if bad is None else bad
    if [row[:2] for row in d["raised"]] != bad:
        return "the inputs were changed while checking"
    for sizes, seconds, got in d["raised"]:
        if got != "ValueError":
            what = got if got.startswith("returned") else f"raised {got}"
            return f"fit_alpha_beta(sizes={_short(sizes)}, seconds={_short(seconds)}) must raise ValueError, but it {what}"
    return None


def _short(values) -> str:
    shown = ", ".join(f"{v:.4g}" for v in values[:4])
    return f"[{shown}{', ...' if len(values) > 4 else ''}] ({len(values)} values)" if len(values) > 4 else f"[{shown}]"


register("fit_alpha_beta",
         Case("an exact line and a noisy measurement: the least-squares alpha and beta", observe_fits, judge_fits),
         Case("lengths that differ, one distinct size: ValueError", observe_fits, judge_fit_errors),
         answers=[Answer("fit_alpha_beta", "function",
                         "a function fit_alpha_beta(sizes_bytes, seconds) returning (alpha, beta), the least-squares "
                         "fit of t = alpha + n / beta")],
         points=3)


# --- Exercise 2: bytes each rank sends per step ---------------------------------------------------------

STRATEGY_PHASES = {"ddp": 2, "zero1": 2, "zero2": 2, "zero3": 3}  # ring phases of N - 1 chunks per step


def ring_bytes_per_rank(strategy: str, n_params: int, world_size: int, bytes_per_elem: int) -> int:
    """Ring collectives on the flat buffer padded to world_size * ceil(n_params / world_size) elements:
    each phase (a reduce-scatter, or an all-gather) sends world_size - 1 chunks of ceil(n_params /
    world_size) elements per rank; all-reduce is two phases. DDP, ZeRO-1 and ZeRO-2: two phases;
    ZeRO-3: three (the parameters gathered in forward and again in backward)."""
    chunk = math.ceil(n_params / world_size)
    return STRATEGY_PHASES[strategy] * (world_size - 1) * chunk * bytes_per_elem


BYTES_PUBLIC = [["ddp", 1000, 4, 4], ["zero1", 1000, 4, 4], ["zero3", 1000, 4, 4], ["ddp", 10, 3, 2],
                ["zero2", 7, 1, 4]]
BYTES_BAD_PUBLIC = [["fsdp", 1000, 4, 4], ["ddp", 1000, 0, 4]]


def observe_bytes(ns, inputs=None, bad=None):
    """``comm_bytes_per_step`` on each ``[strategy, n_params, world_size, bytes_per_elem]`` of ``inputs``
    (BYTES_PUBLIC by default), and what each of ``bad`` raises."""
    from gpucourse.checks import answer
    from gpucourse.checks.lesson14 import BYTES_BAD_PUBLIC, BYTES_PUBLIC

    function = answer(ns, "comm_bytes_per_step")
    results = []
    for args in BYTES_PUBLIC if inputs is None else inputs:
        try:
            got = function(*args)
            got = got if type(got) is int else f"a {type(got).__name__} {str(got)[:40]}"
        except Exception as error:
            got = f"raised {type(error).__name__}: {str(error)[:80]}"
        results.append([*args, got])
    raised = []
    for args in BYTES_BAD_PUBLIC if bad is None else bad:
        try:
            raised.append([*args, f"returned {str(function(*args))[:40]}"])
        except Exception as error:
            raised.append([*args, type(error).__name__])
    return {"results": results, "raised": raised}


def judge_bytes(d, inputs=None):
    from gpucourse.checks.lesson14 import BYTES_PUBLIC, ring_bytes_per_rank

    inputs = BYTES_PUBLIC if inputs is None else inputs
    if [row[:4] for row in d["results"]] != [list(a) for a in inputs]:
        return "the inputs were changed while checking"
    for strategy, n_params, world, elem, got in d["results"]:
        call = f"comm_bytes_per_step({strategy!r}, {n_params}, {world}, {elem})"
        if isinstance(got, str):
            return f"{call} {got if got.startswith('raised') else 'returned ' + got}: return an int (bytes)"
        want = ring_bytes_per_rank(strategy, n_params, world, elem)
        if got != want:
            return f"{call} returned {got}; ring collectives on the padded buffer send {want} bytes per rank"
    return None


def judge_bytes_errors(d, bad=None):
    from gpucourse.checks.lesson14 import BYTES_BAD_PUBLIC

    bad = BYTES_BAD_PUBLIC if bad is None else bad
    if [row[:4] for row in d["raised"]] != [list(a) for a in bad]:
        return "the inputs were changed while checking"
    for strategy, n_params, world, elem, got in d["raised"]:
        if got != "ValueError":
            what = got if got.startswith("returned") else f"raised {got}"
            return f"comm_bytes_per_step({strategy!r}, {n_params}, {world}, {elem}) must raise ValueError, but it {what}"
    return None


register("comm_bytes_per_step",
         Case("DDP, ZeRO-1 and ZeRO-3 on 4 ranks, a padded buffer, one rank", observe_bytes, judge_bytes),
         Case("an unknown strategy, world_size 0: ValueError", observe_bytes, judge_bytes_errors),
         answers=[Answer("comm_bytes_per_step", "function",
                         "a function comm_bytes_per_step(strategy, n_params, world_size, bytes_per_elem) returning "
                         "the bytes one rank sends per step with ring collectives")],
         points=3)

"""Public checks for lesson 14 (the cost of communication). Observers are self-contained: see lesson01_processes_threads.py.

The public cases call the answers on fixed inputs and compare with expected values stored here, worked
out once (``FIT_PUBLIC_WANT``, ``BYTES_PUBLIC_WANT``): this module holds no way to compute a fit or a
byte count. Grading draws other inputs and compares with the grader's own reference.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson14_communication"  # the course folder this module's exercises belong to

FIT_RELATIVE = 1e-6  # beta within 1e-6 of itself; alpha within 1e-6 of the largest time given


# --- Exercise 1: the latency-bandwidth fit ------------------------------------------------------------

FIT_PUBLIC = [
    [[1024.0, 4096.0, 16384.0, 65536.0], [1e-4 + 1024 / 2e9, 1e-4 + 4096 / 2e9, 1e-4 + 16384 / 2e9, 1e-4 + 65536 / 2e9]],
    [[1e3, 1e4, 1e5, 1e6, 1e7, 1e7], [2.2e-4, 1.8e-4, 3.5e-4, 1.2e-3, 1.05e-2, 0.95e-2]],
]
# the least-squares (alpha, beta) of each FIT_PUBLIC measurement: an exact line of 100 µs and 2 GB/s, then a noisy one
FIT_PUBLIC_WANT = [(1e-4, 2e9), (0.00021549177169864374, 1021975579.4772581)]
FIT_BAD_PUBLIC = [
    [[1024.0, 2048.0], [1e-3]],                  # lengths differ
    [[4096.0, 4096.0, 4096.0], [1e-3, 2e-3, 3e-3]],  # one distinct size
]


def observe_fits(ns):
    """``fit_alpha_beta`` on each ``[sizes, seconds]`` of FIT_PUBLIC (lists), and what each of FIT_BAD_PUBLIC
    raises. Results as data: two numbers, or a description of what came back."""
    import numbers

    from gpucourse.checks import answer
    from gpucourse.checks.lesson14_communication import FIT_BAD_PUBLIC, FIT_PUBLIC

    def describe(got):
        if (isinstance(got, tuple) and len(got) == 2
                and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in got)):
            return [float(v) for v in got]
        return f"a {type(got).__name__} {str(got)[:60]}"

    function = answer(ns, "fit_alpha_beta")
    results = []
    for sizes, seconds in FIT_PUBLIC:
        try:
            got = describe(function(list(sizes), list(seconds)))
        except Exception as error:
            got = f"raised {type(error).__name__}: {str(error)[:80]}"
        results.append([sizes, seconds, got])
    raised = []
    for sizes, seconds in FIT_BAD_PUBLIC:
        try:
            raised.append([sizes, seconds, f"returned {str(function(list(sizes), list(seconds)))[:60]}"])
        except Exception as error:
            raised.append([sizes, seconds, type(error).__name__])
    return {"results": results, "raised": raised}


def judge_fits(d):
    """Every public fit within the tolerance of the stored least-squares values."""
    from gpucourse.checks.lesson14_communication import FIT_PUBLIC, FIT_PUBLIC_WANT, FIT_RELATIVE

    if [row[:2] for row in d["results"]] != FIT_PUBLIC:
        return "the inputs were changed while checking"
    for (sizes, seconds, got), (alpha, beta) in zip(d["results"], FIT_PUBLIC_WANT):
        shown = f"fit_alpha_beta(sizes={_short(sizes)}, seconds={_short(seconds)})"
        if isinstance(got, str):
            return f"{shown} {got if got.startswith('raised') else 'returned ' + got}: return a tuple of two floats (alpha, beta)"
        if not abs(got[1] - beta) <= FIT_RELATIVE * beta:
            return (f"{shown}: beta {got[1]:.6g} B/s is not the least-squares fit of t = alpha + n / beta "
                    f"(to a relative {FIT_RELATIVE:g}); is beta the inverse of the slope, fitted in linear space?")
        if not abs(got[0] - alpha) <= FIT_RELATIVE * max(seconds):
            return (f"{shown}: alpha {got[0]:.6g} s is not the least-squares intercept "
                    f"(to {FIT_RELATIVE:g} of the largest time); fit a line through all the points")
    return None


def judge_fit_errors(d):
    """Every bad public input raised ValueError."""
    from gpucourse.checks.lesson14_communication import FIT_BAD_PUBLIC

    if [row[:2] for row in d["raised"]] != FIT_BAD_PUBLIC:
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

BYTES_PUBLIC = [["ddp", 1000, 4, 4], ["zero1", 1000, 4, 4], ["zero3", 1000, 4, 4], ["ddp", 10, 3, 2],
                ["zero2", 7, 1, 4]]
BYTES_PUBLIC_WANT = [6000, 6000, 9000, 32, 0]  # as the exercise's text works them out (one rank sends nothing)
BYTES_BAD_PUBLIC = [["fsdp", 1000, 4, 4], ["ddp", 1000, 0, 4]]


def observe_bytes(ns):
    """``comm_bytes_per_step`` on each ``[strategy, n_params, world_size, bytes_per_elem]`` of BYTES_PUBLIC,
    and what each of BYTES_BAD_PUBLIC raises."""
    from gpucourse.checks import answer
    from gpucourse.checks.lesson14_communication import BYTES_BAD_PUBLIC, BYTES_PUBLIC

    function = answer(ns, "comm_bytes_per_step")
    results = []
    for args in BYTES_PUBLIC:
        try:
            got = function(*args)
            got = got if type(got) is int else f"a {type(got).__name__} {str(got)[:40]}"
        except Exception as error:
            got = f"raised {type(error).__name__}: {str(error)[:80]}"
        results.append([*args, got])
    raised = []
    for args in BYTES_BAD_PUBLIC:
        try:
            raised.append([*args, f"returned {str(function(*args))[:40]}"])
        except Exception as error:
            raised.append([*args, type(error).__name__])
    return {"results": results, "raised": raised}


def judge_bytes(d):
    from gpucourse.checks.lesson14_communication import BYTES_PUBLIC, BYTES_PUBLIC_WANT

    if [row[:4] for row in d["results"]] != [list(a) for a in BYTES_PUBLIC]:
        return "the inputs were changed while checking"
    for (strategy, n_params, world, elem, got), want in zip(d["results"], BYTES_PUBLIC_WANT):
        call = f"comm_bytes_per_step({strategy!r}, {n_params}, {world}, {elem})"
        if isinstance(got, str):
            return f"{call} {got if got.startswith('raised') else 'returned ' + got}: return an int (bytes)"
        if got != want:
            return (f"{call} returned {got}, not what ring collectives on the padded buffer send per rank "
                    "(the exercise's text works this example out)")
    return None


def judge_bytes_errors(d):
    from gpucourse.checks.lesson14_communication import BYTES_BAD_PUBLIC

    if [row[:4] for row in d["raised"]] != [list(a) for a in BYTES_BAD_PUBLIC]:
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

"""Public checks for lesson 15 (roofline and launch overhead). Observers are self-contained: see lesson01_processes_threads.py.

``arithmetic_intensity`` counts the FLOPs and the least traffic of a matmul, an elementwise add and
a convolution; ``attainable`` and ``bound`` read the roofline. The observers call the answers on
literal inputs and report what came back as plain data; the public judges compare with values worked
out by hand and stored here (in the comments): this module holds no way to count them. Grading draws
other inputs and compares with the grader's own reference.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson15_roofline"  # the course folder this module's exercises belong to


def plain_number(value):
    """A returned number as JSON data: an int stays an int, a real number becomes a float; anything
    else becomes a description, ``"<type>"``."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"<{type(value).__name__}>"
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value)


# --- Exercise 1: arithmetic_intensity ----------------------------------------------------------

def call_intensity(fn, op, shape, bytes_per_elem) -> dict:
    """What ``fn(op, shape, bytes_per_elem)`` returned (its three values) or raised (the error's name)."""
    try:
        got = fn(op, shape, bytes_per_elem)
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - reported by name
        return {"error": type(error).__name__, "message": str(error)[:200]}
    from gpucourse.checks.lesson15_roofline import plain_number

    if not isinstance(got, dict):
        return {"type": type(got).__name__}
    out = {"type": "dict", "keys": sorted(map(str, got))}
    for key in ("flops", "bytes", "intensity"):
        out[key] = plain_number(got.get(key))
    return out


def observe_intensity(ns, calls):
    """The answer for each ``[op, shape, bytes_per_elem]`` of ``calls`` (shapes as lists; passed as tuples)."""
    from gpucourse.checks import answer
    from gpucourse.checks.lesson15_roofline import call_intensity

    fn = answer(ns, "arithmetic_intensity")
    return [call_intensity(fn, op, tuple(shape) if isinstance(shape, list) else shape, b) for op, shape, b in calls]


def judge_counts(results, calls, expected, label="") -> str | None:
    """Compare each result with ``expected(op, shape, bytes_per_elem)`` -> (flops, bytes) or None (must
    raise ValueError)."""
    if not isinstance(results, list) or len(results) != len(calls):
        return f"expected {len(calls)} answers, got {len(results) if isinstance(results, list) else 'none'}"
    for (op, shape, b), got in zip(calls, results):
        where = f"{label}{op} {tuple(shape) if isinstance(shape, list) else shape!r}, {b!r} bytes per element"
        want = expected(op, shape, b)
        if not isinstance(got, dict):
            return f"{where}: no answer was recorded"
        if want is None:
            if got.get("error") != "ValueError":
                return f"{where}: raise ValueError for this input (got {got.get('error') or got.get('type')})"
            continue
        if "error" in got:
            return f"{where}: raised {got['error']}: {got.get('message', '')}"
        if got.get("type") != "dict" or got.get("keys") != ["bytes", "flops", "intensity"]:
            return f"{where}: return a dict with exactly the keys 'flops', 'bytes', 'intensity', not {got}"
        flops, nbytes = want
        for key, value in (("flops", flops), ("bytes", nbytes)):
            if not isinstance(got[key], int):
                return f"{where}: {key!r} must be an int, got {got[key]!r}"
            if got[key] != value:
                return f"{where}: {key!r} is {got[key]:,}, expected {value:,}"
        ratio = flops / nbytes
        if not isinstance(got["intensity"], float) or not abs(got["intensity"] - ratio) <= 1e-9 * ratio:
            return f"{where}: 'intensity' is {got['intensity']!r}, but flops / bytes is {ratio!r} (a float)"
    return None


# Worked by hand: matmul 2*M*K*N FLOPs, (M*K + K*N + M*N) elements moved; add 1 FLOP and 3 elements per
# output element; conv2d P = (H + 2 pad - R) // stride + 1, 2*N*K*P*Q*C*R*S FLOPs,
# N*C*H*W + K*C*R*S + N*K*P*Q elements.
PUBLIC_MATMUL = [["matmul", [4096, 4096, 4096], 2], ["matmul", [8, 512, 1024], 4]]
PUBLIC_MATMUL_WANT = [(137_438_953_472, 100_663_296), (8_388_608, 2_146_304)]
PUBLIC_ADD = [["add", [1000], 4], ["add", [64, 3, 32, 32], 2]]
PUBLIC_ADD_WANT = [(1000, 12_000), (196_608, 1_179_648)]
PUBLIC_CONV = [["conv2d", [8, 64, 56, 56, 128, 3, 3, 1, 1], 2],   # P = Q = 56
               ["conv2d", [2, 3, 32, 32, 16, 5, 5, 2, 0], 4]]     # P = Q = (32 - 5) // 2 + 1 = 14
PUBLIC_CONV_WANT = [(3_699_376_128, 9_781_248), (940_800, 54_464)]


def _table(calls, wanted):
    table = {repr((op, tuple(shape), b)): want for (op, shape, b), want in zip(calls, wanted)}
    return lambda op, shape, b: table[repr((op, tuple(shape), b))]


def observe_public_matmul(ns):
    from gpucourse.checks.lesson15_roofline import PUBLIC_MATMUL, observe_intensity

    return observe_intensity(ns, PUBLIC_MATMUL)


def observe_public_add(ns):
    from gpucourse.checks.lesson15_roofline import PUBLIC_ADD, observe_intensity

    return observe_intensity(ns, PUBLIC_ADD)


def observe_public_conv(ns):
    from gpucourse.checks.lesson15_roofline import PUBLIC_CONV, observe_intensity

    return observe_intensity(ns, PUBLIC_CONV)


register("arithmetic_intensity",
         Case("matmul: 4096^3 in float16, 8x512 @ 512x1024 in float32", observe_public_matmul,
              lambda d: judge_counts(d, PUBLIC_MATMUL, _table(PUBLIC_MATMUL, PUBLIC_MATMUL_WANT))),
         Case("add: 1,000 float32 elements, a 64x3x32x32 float16 tensor", observe_public_add,
              lambda d: judge_counts(d, PUBLIC_ADD, _table(PUBLIC_ADD, PUBLIC_ADD_WANT))),
         Case("conv2d: a 3x3 ResNet layer in float16, a 5x5 stride-2 layer without padding in float32",
              observe_public_conv, lambda d: judge_counts(d, PUBLIC_CONV, _table(PUBLIC_CONV, PUBLIC_CONV_WANT))),
         answers=[Answer("arithmetic_intensity", "function",
                         "a function arithmetic_intensity(op, shape, bytes_per_elem) returning a dict "
                         "{'flops': int, 'bytes': int, 'intensity': float}")],
         points=3)


# --- Exercise 2: attainable and bound -----------------------------------------------------------

def call_roof(fn, args) -> dict:
    """What ``fn(*args)`` returned (a number or a str, as data) or raised (the error's name)."""
    try:
        got = fn(*args)
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - reported by name
        return {"error": type(error).__name__, "message": str(error)[:200]}
    from gpucourse.checks.lesson15_roofline import plain_number

    if isinstance(got, str):
        return {"type": "str", "value": got}
    return {"type": type(got).__name__, "value": plain_number(got)}


def observe_roof(ns, calls):
    """For each ``[intensity, peak_flops, bandwidth]``: what ``attainable`` and ``bound`` gave."""
    from gpucourse.checks import answer
    from gpucourse.checks.lesson15_roofline import call_roof

    attainable, bound = answer(ns, "attainable"), answer(ns, "bound")
    return [{"attainable": call_roof(attainable, args), "bound": call_roof(bound, args)} for args in calls]


def judge_roof(results, calls, expected, label="") -> str | None:
    """``expected(intensity, peak, bandwidth)`` -> (attainable FLOP/s, "memory" or "compute"), or None
    where both must raise ValueError."""
    if not isinstance(results, list) or len(results) != len(calls):
        return f"expected {len(calls)} answers, got {len(results) if isinstance(results, list) else 'none'}"
    for args, got in zip(calls, results):
        where = f"{label}intensity {args[0]!r} FLOP/B, peak {args[1]!r} FLOP/s, bandwidth {args[2]!r} B/s"
        want = expected(*args)
        if not isinstance(got, dict) or not all(isinstance(got.get(k), dict) for k in ("attainable", "bound")):
            return f"{where}: no answer was recorded"
        if want is None:
            for name in ("attainable", "bound"):
                if got[name].get("error") != "ValueError":
                    return f"{where}: {name} must raise ValueError (got {got[name].get('error') or got[name].get('value')!r})"
            continue
        for name in ("attainable", "bound"):
            if "error" in got[name]:
                return f"{where}: {name} raised {got[name]['error']}: {got[name].get('message', '')}"
        flops, which = want
        value = got["attainable"].get("value")
        if isinstance(value, str) or value is None or not abs(value - flops) <= 1e-9 * flops:
            return f"{where}: attainable gave {value!r}, expected {flops!r} FLOP/s"
        if got["bound"].get("value") != which:
            return f"{where}: bound gave {got['bound'].get('value')!r}, expected {which!r}"
    return None


# Worked by hand: the ridge point is peak / bandwidth FLOP per byte.
PUBLIC_ROOF = [[0.25, 1e12, 1e11],    # ridge 10: memory, 0.25 * 1e11 = 2.5e10
               [100.0, 1e12, 1e11],   # compute, 1e12
               [10.0, 1e12, 1e11],    # exactly at the ridge: compute, 1e12
               [0, 1e12, 1e11]]       # not positive: ValueError
PUBLIC_ROOF_WANT = [(2.5e10, "memory"), (1e12, "compute"), (1e12, "compute"), None]


def observe_public_roof(ns):
    from gpucourse.checks.lesson15_roofline import PUBLIC_ROOF, observe_roof

    return observe_roof(ns, PUBLIC_ROOF)


register("roofline_bound",
         Case("ridge at 10 FLOP/B: below, above, exactly at it, and an intensity of 0", observe_public_roof,
              lambda d: judge_roof(d, PUBLIC_ROOF, lambda *a: PUBLIC_ROOF_WANT[PUBLIC_ROOF.index(list(a))])),
         answers=[Answer("attainable", "function",
                         "a function attainable(intensity, peak_flops, bandwidth) returning the attainable FLOP/s (a number)"),
                  Answer("bound", "function",
                         "a function bound(intensity, peak_flops, bandwidth) returning 'memory' or 'compute'")],
         points=2)

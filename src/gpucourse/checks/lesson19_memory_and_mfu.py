"""Public checks for lesson 19 (a transformer layer's memory and MFU). Observers are self-contained: see lesson01_processes_threads.py.

The public cases call the answers on fixed inputs and compare with values worked out once from the
exercise's text and stored here (``ACTIVATION_PUBLIC``, ``MFU_PUBLIC``): this module holds no way to
count activation bytes or model FLOPs. Grading draws other inputs and compares with the grader's own
reference.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson19_memory_and_mfu"  # the course folder this module's exercises belong to


def observe_stored(ns, name, table):
    """``name`` called on each ``[args, kwargs, expected]`` of ``table``, as ``observe_calls`` reports it."""
    from gpucourse.checks import observe_calls
    from gpucourse.checks.values import describe

    return observe_calls(ns, name, [{"args": describe(list(args)), "kwargs": describe(dict(kwargs))}
                                    for args, kwargs, _ in table])


def judge_stored(observed, name, table, kind) -> str | None:
    """Each outcome against its stored value: ``"ValueError"`` must be raised; an int must be that int
    (``kind="int"``), a float within 1e-9 of it (``kind="float"``)."""
    import math
    import numbers

    from gpucourse.checks.values import rebuild, type_words

    if not isinstance(observed, list) or len(observed) != len(table):
        return "the answer was not called on every public case"
    for (args, kwargs, want), got in zip(table, observed):
        shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        where = f"{name}({shown})"
        if not isinstance(got, dict) or ("returned" in got) == ("raised" in got):
            return f"{where}: no outcome was reported"
        if want == "ValueError":
            if "raised" not in got:
                return f"{where} returned {type_words(got['returned'])}; it must raise ValueError"
            if "ValueError" not in got["raised"]:
                return f"{where} raised {got['raised'][0]}; it must raise ValueError"
            continue
        if "raised" in got:
            return f"{where} raised {got['raised'][0]}"
        value = rebuild(got["returned"])
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                return f"{where} returned {type_words(got['returned'])}: return an int (bytes, exact at any size)"
            if int(value) != want:
                return f"{where} returned {int(value):,} bytes, not what the text's count gives"
        else:
            if isinstance(value, bool) or not isinstance(value, float):
                return f"{where} returned {type_words(got['returned'])}: return a float"
            if not math.isclose(value, want, rel_tol=1e-9):
                return f"{where} returned {value!r}, not model FLOP/s over peak_flops"
    return None


# --- Exercise 1: activation_bytes ----------------------------------------------------------------

# [args, kwargs, bytes], worked out from the text: at 2 bytes per value they are Korthikanti et al.'s
# Table 2 for GPT-3's layer (s = 2048, b = 1, h = 12288, a = 96, t = 8): sbh (34 + 5as/h),
# sbh (10 + 24/t + 5as/(ht)), sbh/t (34 + 5as/h), 34 sbh/t, sbh (10 + 24/t), 2 sbh, and 2 sbh / t.
GPT3 = [2048, 1, 12288, 96]
ACTIVATION_PUBLIC = [
    [GPT3, {}, 2_868_903_936],
    [GPT3, {"tensor_parallel": 8}, 578_813_952],
    [GPT3, {"tensor_parallel": 8, "sequence_parallel": True}, 358_612_992],
    [GPT3, {"tensor_parallel": 8, "sequence_parallel": True, "recompute": "selective"}, 106_954_752],
    [GPT3, {"tensor_parallel": 8, "recompute": "selective"}, 327_155_712],
    [GPT3, {"recompute": "full"}, 50_331_648],
    [GPT3, {"tensor_parallel": 8, "sequence_parallel": True, "recompute": "full"}, 6_291_456],
]
# float32 values (masks still 1 byte), 4 layers: 4 x (64 sbh + 8 as^2 b + 2 sbh + as^2 b), then without the s^2 part
ACTIVATION_SMALL = [
    [[128, 4, 256, 8], {"layers": 4, "bytes_per_value": 4}, 53_477_376],
    [[128, 4, 256, 8], {"layers": 4, "bytes_per_value": 4, "recompute": "selective"}, 34_603_008],
    [[64, 2, 100, 8], {}, "ValueError"],  # 100 is not a multiple of 8 heads
]


def observe_activation_public(ns):
    from gpucourse.checks.lesson19_memory_and_mfu import ACTIVATION_PUBLIC, observe_stored

    return observe_stored(ns, "activation_bytes", ACTIVATION_PUBLIC)


def observe_activation_small(ns):
    from gpucourse.checks.lesson19_memory_and_mfu import ACTIVATION_SMALL, observe_stored

    return observe_stored(ns, "activation_bytes", ACTIVATION_SMALL)


register("activation_bytes",
         Case("GPT-3's layer (s 2048, h 12288, a 96): no parallelism, tensor and sequence parallel, each recompute mode",
              observe_activation_public, lambda d: judge_stored(d, "activation_bytes", ACTIVATION_PUBLIC, "int")),
         Case("a small layer in float32 over 4 layers; hidden not a multiple of heads raises ValueError",
              observe_activation_small, lambda d: judge_stored(d, "activation_bytes", ACTIVATION_SMALL, "int")),
         answers=[Answer("activation_bytes", "function",
                         "a function activation_bytes(seq_len, batch, hidden, heads, layers=1, tensor_parallel=1, "
                         "sequence_parallel=False, recompute='none', bytes_per_value=2) returning the bytes (an int)")],
         points=3)


# --- Exercise 2: mfu -------------------------------------------------------------------------------

# [args, kwargs, fraction]: 124e6 parameters, 524,288 tokens in 0.5 s against 989.4 TFLOP/s: 6 N tokens / t / peak;
# then with 12 x 12 x 768 x 1024 FLOPs per token more; then a step time of 0.
MFU_PUBLIC = [
    [[124_000_000, 524_288, 0.5, 989.4e12], {}, 0.7884986294724076],
    [[124_000_000, 524_288, 0.5, 989.4e12], {"attention": (12, 768, 1024)}, 0.9085180915704548],
    [[124_000_000, 524_288, 0, 989.4e12], {}, "ValueError"],
]


def observe_mfu_public(ns):
    from gpucourse.checks.lesson19_memory_and_mfu import MFU_PUBLIC, observe_stored

    return observe_stored(ns, "mfu", MFU_PUBLIC)


register("mfu",
         Case("a 124M-parameter model with and without the attention term; a zero step time raises ValueError",
              observe_mfu_public, lambda d: judge_stored(d, "mfu", MFU_PUBLIC, "float")),
         answers=[Answer("mfu", "function",
                         "a function mfu(params, tokens_per_step, step_seconds, peak_flops, attention=None) returning "
                         "the model FLOPs utilization (a float)")],
         points=2)

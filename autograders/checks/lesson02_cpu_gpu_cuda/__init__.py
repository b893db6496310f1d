"""Hidden checks for lesson 2 (CPU vs GPU, and CUDA). Never released; see lesson 1's for the form.
One module per exercise; this one gathers their cases.

Every hidden case of a code exercise draws its inputs at grading time (``draw=``: boundaries first,
then random draws from the whole domain the text states): the sandbox gets them after the last cell,
and the judges compute the expected values here. ``CLAUSES`` (at the end) maps every clause of each
exercise's text to the cases that hold it.
"""

from gpucourse.checks import Case

from . import add_positions as positions, measure, sync_lines as sync, triton_scaled_add as triton


HIDDEN = {
    "add_positions": [
        Case("values: x + p on random x of other shapes (length 1, length 0, long lengths, an empty batch, non-contiguous)",
             positions.observe_positions,
             positions.judge_positions_values, draw=positions.draw_positions_values),
        Case("dtype, device and shape follow x (every floating dtype, meta, long float16 and bfloat16)", positions.observe_positions,
             positions.judge_positions_follow_x, draw=positions.draw_positions_follow_x),
        Case("a new tensor, x unchanged (length 1, empty x, random x)", positions.observe_positions, positions.judge_positions_new_tensor,
             draw=positions.draw_positions_new_tensor),
    ],
    "measure": [
        Case("the median of the repeats (an odd count)", measure.observe_measure_plan, measure.judge_measure_plan,
             draw=measure.draw_measure_median(odd=True)),
        Case("the median of the repeats (an even count: between the two middle times)", measure.observe_measure_plan,
             measure.judge_measure_plan, draw=measure.draw_measure_median(odd=False)),
        Case("warm-up calls run first and stay out of the result; positional arguments", measure.observe_measure_warmup,
             measure.judge_measure_warmup, draw=measure.draw_measure_warmup),
        Case("one repeat: the warm-up's queued work is not timed", measure.observe_measure_one_repeat, measure.judge_measure_one_repeat,
             draw=measure.draw_measure_one_repeat),
        Case("the defaults (warmup=2, repeats=5), each alone too, and a float", measure.observe_measure_defaults,
             measure.judge_measure_defaults, draw=measure.draw_measure_defaults),
        Case("work done on the host inside run(), calls under a millisecond: seconds, unrounded",
             measure.observe_measure_host_work, measure.judge_measure_host_work, draw=measure.draw_measure_host_work),
    ],
    "sync_lines": [
        Case("line numbers are ints", sync.observe_sync_lines_as_given, sync.judge_sync_ints),
        Case("lines where a GPU value becomes a Python value", sync.observe_sync_lines_as_given,
             sync._sync_judge({4, 8, 10}, "lines where a GPU value becomes a Python value")),
        Case("copies to the CPU and data-dependent sizes", sync.observe_sync_lines_as_given,
             sync._sync_judge({6, 11}, "copies to the CPU and data-dependent sizes")),
        Case("explicit waits", sync.observe_sync_lines_as_given, sync._sync_judge({13}, "explicit waits")),
        Case("lines that only queue work", sync.observe_sync_lines_as_given, sync.judge_sync_only_queue),
    ],
    "triton_scaled_add": [
        Case("generated sizes next to multiples of the block, any alpha (0, negative)", triton.observe_triton_launches,
             triton.judge_triton_launches, draw=triton.draw_triton_sizes),
        Case("large blocks (512, 1024)", triton.observe_triton_launches, triton.judge_triton_launches, draw=triton.draw_triton_large),
        Case("float64 and float16, other sizes", triton.observe_triton_launches, triton.judge_triton_launches,
             draw=triton.draw_triton_dtypes),
        Case("one pass: one kernel launch (alpha 0 too), block_size elements per program (512, 1024, the default 128), "
             "no temporary tensor",
             triton.observe_triton_one_pass, triton.judge_triton_one_pass, draw=triton.draw_triton_one_pass),
    ],
}

_AP = [case.name for case in HIDDEN["add_positions"]]
_ME = [case.name for case in HIDDEN["measure"]]
_TR = [case.name for case in HIDDEN["triton_scaled_add"]]
CLAUSES = {
    "add_positions": {
        "returns x + p with p[j] = j / length (one value per position, whatever the length), the same for every batch element and feature":
            ["float32 on the CPU: values, shape, input untouched", _AP[0], _AP[1]],
        "for x of shape (batch, length, dim), whatever they are (length 1, length 0, an empty batch, not contiguous)": [_AP[0]],
        "the result has x's device, dtype and shape, whatever they are":
            ["follows x to another device and dtype (meta, float16)", _AP[1]],
        "a new tensor; x left unchanged (length 1 and empty x too)": ["float32 on the CPU: values, shape, input untouched", _AP[2]],
    },
    "measure": {
        "measure(run, synchronize, warmup=2, repeats=5): those defaults, each alone too": [_ME[4]],
        "warmup and repeats given by position too": [_ME[2]],
        "calls run exactly warmup + repeats times (warmup 0 too, repeats 1 too)": [_ME[0], _ME[2], _ME[3]],
        "leaves the warm-up calls out of the result, and the work they queued too": [_ME[2], _ME[3]],
        "run only queues work: each call timed up to the end of its work (synchronize)":
            ["20 ms of asynchronous work per call measures as about 20 ms", _ME[2]],
        "each call timed from before run() (its host work counts: on a CPU it is all the work)": [_ME[5]],
        "the median seconds, as measured (calls under a millisecond too: no rounding)": [_ME[5]],
        "the median seconds per call over the repeats (not the mean, a trimmed mean, total or minimum)": [_ME[0], _ME[1]],
        "with an even number of repeats, either middle time or the mean of the two": [_ME[1]],
        "returns a float": [_ME[4]],
    },
    "triton_scaled_add": {
        "out = alpha * x + y for any n >= 1: one element, fewer than a block, whole blocks, a partial last block":
            ["n smaller than one block", "a partial last block", _TR[0], _TR[1]],
        "alpha is any Python float (0, negative)": [_TR[0], _TR[3]],
        "any block_size (a power of two) the launcher is given, each program handling block_size elements":
            [_TR[0], _TR[1], _TR[3]],
        "block_size=128 when the launcher is not given one": [_TR[3]],
        "the same dtype for x, y and out: float32, float16 or float64, computed to that dtype's precision":
            ["float16", _TR[2]],
        "writes nothing outside out[0] .. out[n-1]; leaves x and y unchanged": [_TR[0], _TR[1], _TR[2]],
        "a masked kernel (section 7): no load past the end of x and y either (on a GPU, an illegal address)":
            [_TR[0], _TR[1], _TR[2]],
        "one pass: one kernel, no temporary tensor": [_TR[3]],
        "writes the result into out (no other allocated) and returns out": [_TR[0], _TR[3]],
    },
}

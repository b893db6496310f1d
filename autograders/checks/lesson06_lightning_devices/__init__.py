"""Hidden checks for lesson 6 (Lightning on many devices). Never released.

Every case whose answer depends on inputs draws them at grading time (``Case.draw``: the text's
boundaries first, then random ones from the whole domain it states): statistics, sizes, dtypes and
devices for AgnosticStandardize; noise levels (ints, 0, by position), inputs, weights and seeds for
SpawnSafeRegressor; the arguments of effective_batch_size and scaled_learning_rate (NumPy ints,
integers above 2**53, counts of 0.5). The references (the module's output, the
augmentation and the loss, the batch size and the rate) live here, on the grader's side only.
"""

from gpucourse.checks import Case

from .device_agnostic import _draw_dtype, draw_agnostic_meta, draw_agnostic_sizes, judge_agnostic_drawn, observe_agnostic_drawn
from .effective_batch import (JUDGE_BATCH, JUDGE_LR, draw_batch_below_one, draw_batch_positional, draw_batch_strategies,
                              draw_batch_strategy_names, draw_lr_rule, observe_batch_calls, observe_lr_calls)
from .picklable import (draw_own_noise, draw_picklable_default, draw_picklable_levels, draw_picklable_like_x,
                        draw_picklable_no_noise, judge_optimizer, judge_own_noise, judge_picklable_module,
                        judge_picklable_runs, observe_optimizer, observe_own_noise, observe_picklable_module,
                        observe_picklable_runs)


def _case(name, draw, observe, judge):
    return Case(name, observe, judge, draw=draw)


HIDDEN = {
    "device_agnostic": [
        _case("other sizes: drawn features and batches (1 of each too), statistics as lists, tuples or ints",
              draw_agnostic_sizes, observe_agnostic_drawn, judge_agnostic_drawn()),
        _case("float64: dtype and values", _draw_dtype("float64"), observe_agnostic_drawn, judge_agnostic_drawn()),
        _case("bfloat16: dtype and values", _draw_dtype("bfloat16"), observe_agnostic_drawn, judge_agnostic_drawn()),
        _case("float16: dtype and values", _draw_dtype("float16"), observe_agnostic_drawn, judge_agnostic_drawn()),
        _case("meta device and float64 at once, other dtypes too", draw_agnostic_meta, observe_agnostic_drawn, judge_agnostic_drawn()),
        _case("the statistics are not parameters", draw_agnostic_sizes, observe_agnostic_drawn, judge_agnostic_drawn(True)),
    ],
    "picklable": [
        Case("a LightningModule with NoisyRegressor's net", observe_picklable_module, judge_picklable_module),
        _case("noise=0.1 by default", draw_picklable_default, observe_picklable_runs, judge_picklable_runs),
        _case("other noise levels, before and after pickling (ints, by position)", draw_picklable_levels,
              observe_picklable_runs, judge_picklable_runs),
        _case("noise=0: only the model", draw_picklable_no_noise, observe_picklable_runs, judge_picklable_runs),
        _case("float64, float16 and meta inputs: the noise made like x", draw_picklable_like_x, observe_picklable_runs,
              judge_picklable_runs),
        _case("each module keeps its own noise, pickled or not", draw_own_noise, observe_own_noise, judge_own_noise),
        Case("the same optimizer", observe_optimizer, judge_optimizer),
    ],
    "effective_batch": [
        _case("every strategy of the table, with nodes and accumulation (NumPy ints, above 2**53, a product above 2**63)",
              draw_batch_strategies,
              observe_batch_calls, JUDGE_BATCH),
        _case("positional arguments and defaults", draw_batch_positional, observe_batch_calls, JUDGE_BATCH),
        _case("other and removed strategies raise ValueError (\"auto\" and variants not in the table too)", draw_batch_strategy_names,
              observe_batch_calls, JUDGE_BATCH),
        _case("values below 1 raise ValueError, 1 is allowed (0, negative, 0.5)", draw_batch_below_one, observe_batch_calls,
              JUDGE_BATCH),
        _case("the linear scaling rule, as a float", draw_lr_rule, observe_lr_calls, JUDGE_LR),
    ],
}

_A = [case.name for case in HIDDEN["device_agnostic"]]
_P = [case.name for case in HIDDEN["picklable"]]
_B = [case.name for case in HIDDEN["effective_batch"]]
PUBLIC_AGNOSTIC = "same function; follows .to(device) and .double()"
PUBLIC_PICKLE = "pickles like ddp_spawn does, and behaves the same"
PUBLIC_BATCH = "the seed's examples and one with accumulation"
CLAUSES = {
    "device_agnostic": {
        "the same function as Standardize: standardize, the read-out self.readout, add 1": [PUBLIC_AGNOSTIC, _A[0]],
        "runs on whatever device the module and its input were moved to": [PUBLIC_AGNOSTIC, _A[4]],
        "runs in whatever dtype: .double(), .to(torch.bfloat16), and others": [PUBLIC_AGNOSTIC, _A[1], _A[2], _A[3], _A[4]],
        "the statistics are not parameters (parameters() is the read-out's weight and bias)": [PUBLIC_AGNOSTIC, _A[5]],
    },
    "picklable": {
        "a LightningModule with the same net": [_P[0], PUBLIC_PICKLE],
        "noise=0.1 by default": [_P[1]],
        "augment(x) returns x + noise * torch.randn_like(x)": [PUBLIC_PICKLE, _P[2], _P[3], _P[4]],
        "the same training_step": [PUBLIC_PICKLE, _P[2]],
        "the same optimizer": [_P[6]],
        "it can be pickled, and a pickled and unpickled copy behaves the same": [PUBLIC_PICKLE, _P[2], _P[5]],
    },
    "effective_batch": {
        "effective_batch_size: samples per optimizer step for ddp, ddp_spawn, ddp_notebook, fsdp, deepspeed":
            [PUBLIC_BATCH, _B[0]],
        "num_nodes=1, strategy='ddp', accumulate_grad_batches=1 by default, in that order": [_B[1]],
        "effective_batch_size returns an int (exact, whatever its size)": [_B[0], _B[1]],
        "ValueError for any other strategy, the removed ones, 'auto' and names outside the table included": [_B[2]],
        "ValueError for a batch size, device count, node count or accumulation below 1": [_B[3]],
        "scaled_learning_rate: the linear scaling rule, a float": [PUBLIC_BATCH, _B[4]],
    },
}

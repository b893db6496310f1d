"""Hidden checks for lesson 12 (where the memory goes). Never released; see lesson01's file for the form.

Models and block stacks are generated from seeded specs (``gpucourse.checks.lesson12``); the
observers build them in the sandbox, call the answer, and (for the unsharded state) train one step and
measure the storages. The judges rebuild the same models here: they count the parameters themselves,
apply the exercise's arithmetic, and re-measure every checkpointing plan, so no expected value comes
from the sandbox.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson12 import counts, judge_against_measurement, judge_plans, model_specs, sharding_cases, stack_specs

# --- training_bytes ----------------------------------------------------------------------------
# What the exercise's text states, and the case that checks it:
#  1. a dict with exactly 'params', 'grads', 'optimizer', ints, bytes per rank ........ every case
#  2. fp32: 4 / 4 / 8 bytes per element, plus 4 bytes per trainable tensor (Adam's float32 step),
#     equal to one measured Adam step ............................................... "generated models ..."
#  3. amp (torch.autocast): the same as fp32 (float32 params, so float32 grads) ...... "generated models ..."
#  4. bf16: 2 / 2 / 12 (float32 master + exp_avg + exp_avg_sq), plus the steps ....... "generated models ..."
#  5. a parameter shared by two modules counts once ................................... "tied weights ..."
#  6. frozen parameters: in 'params', no gradient, no optimizer state ................. "frozen layers ..."
#  7. stage 1 shards the optimizer's per-element state, 2 also the grads, 3 also the params:
#     ceil(elements / world_size) per rank; the step counters stay whole on every rank;
#     world_size 1 = unsharded; any model, also on the meta device .................... "ZeRO stages ..."
#  8. ValueError for an unknown recipe, a stage outside 0-3, a world size below 1 ..... "bad arguments ..."


def expected_bytes(P, P_t, T_t, recipe, stage=0, world_size=1):
    """The exercise's arithmetic, written out here independently of the public module."""
    def per_rank(n, sharded):
        return (n + world_size - 1) // world_size if sharded else n

    weight = {"fp32": 4, "amp": 4, "bf16": 2}[recipe]
    state = {"fp32": 8, "amp": 8, "bf16": 12}[recipe]
    return {"params": weight * per_rank(P, stage >= 3), "grads": weight * per_rank(P_t, stage >= 2),
            "optimizer": state * per_rank(P_t, stage >= 1) + 4 * T_t}


def _measured(seed, count, label, **kinds):
    specs = model_specs(seed, count, **kinds)
    return lambda results: judge_against_measurement(results, specs, expected_bytes, label=label)


def observe_generated(ns):
    from gpucourse.checks.lesson12 import model_specs, observe_measured

    return observe_measured(ns, model_specs(1201, 6))


def observe_tied(ns):
    from gpucourse.checks.lesson12 import model_specs, observe_measured

    return observe_measured(ns, model_specs(1202, 3, tied=True))


def observe_frozen(ns):
    from gpucourse.checks.lesson12 import model_specs, observe_measured

    return observe_measured(ns, model_specs(1203, 2, frozen=True) + model_specs(1204, 2, tied=True, frozen=True))


def observe_zero(ns):
    from gpucourse.checks.lesson12 import observe_sharding, sharding_cases

    return observe_sharding(ns, sharding_cases(1205, 24))


def judge_zero(results, cases=None):
    cases = cases or sharding_cases(1205, 24)
    if not isinstance(results, list) or len(results) != len(cases):
        return f"expected {len(cases)} answers"
    for c, got in zip(cases, results):
        P, P_t, T_t = counts(c["spec"])
        want = expected_bytes(P, P_t, T_t, c["recipe"], c["stage"], c["world_size"])
        where = (f"{P:,} parameters ({P_t:,} trainable in {T_t} tensors), recipe {c['recipe']!r}, "
                 f"stage {c['stage']}, {c['world_size']} ranks")
        if not isinstance(got, dict):
            return f"{where}: no answer was recorded"
        if "error" in got:
            return f"{where}: raised {got['error']}: {got.get('message', '')}"
        if got.get("type") != "dict" or got.get("keys") != ["grads", "optimizer", "params"]:
            return f"{where}: return a dict with exactly the keys 'params', 'grads', 'optimizer'"
        for key in ("params", "grads", "optimizer"):
            if got[key] != want[key]:
                return f"{where}: {key!r} is {got[key]} bytes per rank, expected {want[key]}"
    return None


def observe_bad_arguments(ns):
    from gpucourse.checks import answer
    from gpucourse.checks.lesson12 import build_model, call_training_bytes

    fn = answer(ns, "training_bytes")
    model = build_model({"widths": [5, 3], "seed": 0})
    calls = [("fp16", 0, 1), ("FP32", 0, 1), ("fp32", 4, 2), ("bf16", -1, 2), ("amp", 1, 0), ("fp32", 3, -2)]
    return [call_training_bytes(fn, model, recipe, stage=stage, world_size=n) for recipe, stage, n in calls]


def judge_bad_arguments(results):
    labels = ["recipe 'fp16'", "recipe 'FP32'", "stage 4", "stage -1", "world_size 0", "world_size -2"]
    if not isinstance(results, list) or len(results) != len(labels):
        return f"expected {len(labels)} answers"
    for label, got in zip(labels, results):
        if not isinstance(got, dict) or got.get("error") != "ValueError":
            got = got if isinstance(got, dict) else {}
            return f"{label}: raise ValueError (got {got.get('error') or got.get('type')})"
    return None


HIDDEN = {"training_bytes": [
    Case("generated models, three recipes: the prediction equals one measured training step", observe_generated,
         _measured(1201, 6, "generated model")),
    Case("tied weights: a parameter shared by two modules counts once", observe_tied,
         _measured(1202, 3, "model with tied weights", tied=True)),
    Case("frozen layers: parameters, but no gradient and no optimizer state", observe_frozen,
         lambda d: judge_against_measurement(d, model_specs(1203, 2, frozen=True) + model_specs(1204, 2, tied=True, frozen=True),
                                             expected_bytes, label="model with a frozen layer")),
    Case("ZeRO stages 0-3 on 1 to 1000 ranks, sizes not divisible (ceil), meta-device models up to 10^9 parameters",
         observe_zero, judge_zero),
    Case("bad arguments: ValueError for an unknown recipe, a stage outside 0-3, a world size below 1",
         observe_bad_arguments, judge_bad_arguments),
]}


# --- choose_segments ---------------------------------------------------------------------------
# What the exercise's text states, and the case that checks it:
#  1. a plan is k = 1..len(blocks) segments of checkpoint_sequential(..., use_reentrant=False) .. every case
#  2. its bytes: the distinct storages autograd saves in the forward, each once, parameters left out
#     (ReLU/Tanh save their output, which the next Linear saves again) ............ "generated stacks ..."
#  3. fits: bytes <= budget (a budget exactly at a plan's bytes fits) ................ "budgets exactly at ..."
#  4. the rule: fewest recomputed blocks ((k-1) * (n // k)), then fewest bytes, then fewest segments
#     (the fewest segments that fit is not always it) ............................... "generated stacks ...", "deep stacks ..."
#  5. ValueError when no plan fits .................................................. "nothing fits ..."
#  6. one block: the only plan is 1 segment ........................................... "one block ..."
#  7. other dtypes (float64, bfloat16), inputs with or without requires_grad .......... "other dtypes ..."
#  8. the blocks left as they were: parameters unchanged, no gradients ............... every case

def observe_stacks(ns):
    from gpucourse.checks.lesson12 import observe_plans, stack_specs

    return observe_plans(ns, stack_specs(1211, 10))


def observe_exact(ns):
    from gpucourse.checks.lesson12 import observe_plans, stack_specs

    return observe_plans(ns, stack_specs(1212, 6, pick="exact", acts=("relu", "tanh")))


def observe_deep(ns):
    from gpucourse.checks.lesson12 import observe_plans, stack_specs

    return observe_plans(ns, stack_specs(1213, 6, bulge=True))


def observe_nothing_fits(ns):
    from gpucourse.checks.lesson12 import observe_plans, stack_specs

    return observe_plans(ns, stack_specs(1214, 3, pick="none"))


def observe_one_block(ns):
    from gpucourse.checks.lesson12 import observe_plans, stack_specs

    return observe_plans(ns, stack_specs(1215, 2, blocks=(1, 1)) + stack_specs(1216, 1, blocks=(1, 1), pick="none"))


def observe_dtypes(ns):
    from gpucourse.checks.lesson12 import observe_plans, stack_specs

    return observe_plans(ns, stack_specs(1217, 4, dtypes=("float64", "bfloat16")))


def _plans(seed, count, label, **kinds):
    return lambda results: judge_plans(results, stack_specs(seed, count, **kinds), label=label)


HIDDEN["choose_segments"] = [
    Case("generated stacks (1-8 blocks, other widths and activations): the rule's plan, measured",
         observe_stacks, _plans(1211, 10, "stack")),
    Case("budgets exactly at a plan's bytes, ReLU/Tanh stacks (a storage saved twice counts once)",
         observe_exact, _plans(1212, 6, "stack", pick="exact", acts=("relu", "tanh"))),
    Case("deep stacks (9-12 blocks, wide in the middle): fewest recomputed blocks, not fewest segments", observe_deep,
         _plans(1213, 6, "deep stack", bulge=True)),
    Case("nothing fits: ValueError", observe_nothing_fits, _plans(1214, 3, "stack", pick="none")),
    Case("one block: one plan, or ValueError", observe_one_block,
         lambda d: judge_plans(d, stack_specs(1215, 2, blocks=(1, 1)) + stack_specs(1216, 1, blocks=(1, 1), pick="none"),
                               label="one-block stack")),
    Case("other dtypes (float64, bfloat16)", observe_dtypes,
         _plans(1217, 4, "stack", dtypes=("float64", "bfloat16"))),
]

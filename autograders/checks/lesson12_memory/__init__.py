"""Hidden checks for lesson 12 (where the memory goes). Never released; see lesson 1's for the form.
One module per exercise; this one gathers their cases.

Every hidden case draws its inputs at grading time (``Case.draw``, a generator seeded per submission on
the grader's side): model specs and arguments for ``training_bytes``, block stacks and budgets for
``choose_segments``, boundaries first, then random ones from the whole domain the exercise's text
states. The observers build the models and stacks the specs describe in the sandbox
(``gpucourse.checks.lesson12_memory``; ``observe_odd_stacks`` builds stacks of other blocks itself, and the
judges call it to build the same ones), call the answer and report what it returned or raised; the judges
rebuild the same models and stacks here and compute the expected values with the references below,
which exist on the grader's side only (the public module stores its few expected values as literals).
"""

from gpucourse.checks import Case

from .choose_segments import (draw_deep, draw_dtypes, draw_exact, draw_modes, draw_nothing_fits, draw_odd_blocks, draw_one_block,
                              draw_stacks, judge_odd_stacks, judge_stack_calls, observe_odd_stacks, observe_stack_calls)
from .training_bytes import (draw_bad_arguments, draw_frozen, draw_generated, draw_tied, draw_zero, judge_training_bytes,
                             observe_training_bytes_calls)


HIDDEN = {"training_bytes": [
    Case("generated models, three recipes: the state one Adam step leaves, unsharded (stage 0, or one rank)",
         observe_training_bytes_calls, judge_training_bytes("generated model"), draw=draw_generated),
    Case("tied weights: a parameter shared by two modules counts once", observe_training_bytes_calls,
         judge_training_bytes("model with tied weights"), draw=draw_tied),
    Case("frozen layers: parameters, but no gradient and no optimizer state", observe_training_bytes_calls,
         judge_training_bytes("model with frozen parameters"), draw=draw_frozen),
    Case("ZeRO stages 0-3 on 1 to 1000 ranks, sizes not divisible (ceil), meta-device models up to 10^9 parameters",
         observe_training_bytes_calls, judge_training_bytes("sharded"), draw=draw_zero),
    Case("bad arguments: ValueError for a recipe other than the three strings, an int stage other than 0-3, "
         "an int world_size < 1; TypeError for a stage or world_size that is not an int (bool, float, str, NumPy)",
         observe_training_bytes_calls, judge_training_bytes("bad arguments"),
         draw=draw_bad_arguments),
]}


HIDDEN["choose_segments"] = [
    Case("generated stacks (1-12 blocks, other widths and activations): the rule's plan, measured",
         observe_stack_calls, judge_stack_calls("stack"), draw=draw_stacks),
    Case("budgets exactly at a plan's bytes, ReLU/Tanh stacks (a storage saved twice counts once)",
         observe_stack_calls, judge_stack_calls("stack"), draw=draw_exact),
    Case("deep stacks (9-12 blocks, wide in the middle): fewest recomputed blocks, not fewest segments; "
         "equal costs: fewer bytes, then fewer segments", observe_stack_calls, judge_stack_calls("deep stack"),
         draw=draw_deep),
    Case("nothing fits: ValueError", observe_stack_calls, judge_stack_calls("stack"), draw=draw_nothing_fits),
    Case("one block: one plan, or ValueError", observe_stack_calls, judge_stack_calls("one-block stack"),
         draw=draw_one_block),
    Case("other dtypes (float64, bfloat16), inputs with and without requires_grad", observe_stack_calls,
         judge_stack_calls("stack"), draw=draw_dtypes),
    Case("other blocks (nested, Identity, views of wider outputs): each storage's whole bytes; equal cost and "
         "bytes: the fewest segments", observe_odd_stacks, judge_odd_stacks("stack"), draw=draw_odd_blocks),
    Case("blocks in train mode, eval mode or a mix: each module left in its mode", observe_odd_stacks,
         judge_odd_stacks("stack"), draw=draw_modes),
]

_T, _C = HIDDEN["training_bytes"], HIDDEN["choose_segments"]
T_PUBLIC = ["a 6-10-4 MLP, three recipes: the bytes of one Adam step's state", "the same MLP on 2 ranks, stages 0 to 3 (fp32)"]
C_PUBLIC = "6 equal blocks: a tight budget, a budget everything fits, one nothing fits"
CLAUSES = {
    "training_bytes": {
        "returns a dict {'params', 'grads', 'optimizer'} of ints, bytes per rank": [T_PUBLIC[0], _T[0].name, _T[3].name],
        "model: any nn.Module of float32 parameters, also on the meta device (count, do not run)": [_T[0].name, _T[3].name],
        "each parameter once, as model.parameters() does (a weight shared by two modules is one parameter)":
            [_T[1].name],
        "P, P_t (requires_grad=True), T_t: frozen parameters are held but have no gradient and no optimizer state":
            [_T[2].name, _T[3].name],
        "fp32: 4 / 4 / 8 bytes per element": [T_PUBLIC[0], _T[0].name],
        "amp: the same as fp32": [T_PUBLIC[0], _T[0].name],
        "bf16: 2 / 2 / 12 bytes per element": [T_PUBLIC[0], _T[0].name],
        "Adam's step counters: 4 * T_t in 'optimizer', every recipe and stage, on every rank":
            [T_PUBLIC[0], _T[0].name, _T[3].name],
        "stage 0 (DDP): every rank holds everything; world_size=1: nothing changes": [T_PUBLIC[1], _T[0].name, _T[3].name],
        "stage 1 shards the optimizer's per-element state, 2 also the gradients, 3 also the parameters":
            [T_PUBLIC[1], _T[3].name],
        "a sharded quantity of n elements: ceil(n / world_size) per rank (params shard P, grads and state P_t)":
            [_T[3].name],
        "ValueError for a recipe other than the three strings 'fp32', 'amp', 'bf16' (of any type, unhashable too)":
            [_T[4].name],
        "ValueError for an int stage other than 0, 1, 2, 3": [_T[4].name],
        "ValueError for an int world_size below 1": [_T[4].name],
        "TypeError for a stage or world_size that is not an int: a bool (False too, although below 1), a float "
        "(even 2.0), a str, None, a NumPy integer": [_T[4].name],
        "sharding pads each quantity as one flat buffer (ZeRO's padding), not per parameter (FSDP2's)": [_T[3].name],
    },
    "choose_segments": {
        "blocks: an nn.Sequential of n >= 1 blocks (any modules: nested, Identity, views)": [_C[0].name, _C[4].name, _C[6].name],
        "x: float32, float64 or bfloat16, requiring grad or not": [_C[5].name, _C[0].name],
        "a plan: k = 1..n segments of checkpoint_sequential(blocks, k, x, use_reentrant=False)": [C_PUBLIC, _C[0].name],
        "saved bytes: distinct storages saved for backward, each once, the parameters' storages left out":
            [_C[1].name, _C[0].name],
        "each storage counted whole, untyped_storage().nbytes() (a view of a wider tensor counts the wider storage)":
            [_C[6].name],
        "cost, by the exercise's definition: (k - 1) * (n // k) blocks recomputed (a count, not a time)":
            [_C[2].name, _C[0].name],
        "fits: saved bytes <= budget_bytes": [_C[1].name, _C[0].name],
        "the lowest cost among the plans that fit, then fewer saved bytes, then the fewest segments": [_C[2].name, _C[6].name],
        "returns the number of segments, an int": [C_PUBLIC, _C[0].name],
        "ValueError when no plan fits": [C_PUBLIC, _C[3].name, _C[4].name],
        "leave the blocks as they were: no parameter changed, no gradient left": [C_PUBLIC, _C[0].name, _C[1].name, _C[3].name],
        "leave the blocks as they were: every module in the train or eval mode it was in": [_C[7].name],
    },
}

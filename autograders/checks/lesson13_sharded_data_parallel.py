"""Hidden checks for lesson 13 (sharded data parallel). Never released.

ShardedAdam runs as a script. The public launch (2 ranks, 1082 parameters, one weight holding 960 of them)
is judged first; a submission that fails it is not launched again, and the hidden judges report the
public record's failure. Otherwise two more launches with generated inputs (gpucourse.checks.lesson13's
generated_inputs, seeded here): 2 ranks on models of an odd parameter count, and 3 ranks on models whose
parameter count leaves each non-zero remainder. The judges rebuild the inputs from the seed and train the
expected weights themselves.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson13 import generated_inputs, judge_shard_ranges, judge_state, judge_weights

# ShardedAdam:
# 1. step() averages the gradients over all processes (a mean, as DDP)        -> every weights case (eps 1e-3 makes a sum visible)
# 2. updates with Adam: lr, betas and eps as given, bias-corrected            -> every weights case
#                                                                               (other betas, lr, eps in the generated ones)
# 3. every rank ends each step with all the updated parameters, identical     -> every weights case, after every step
# 4. for any parameter count, divisible by the world size or not              -> "does not divide"
# 5. for any number of processes                                              -> "3 ranks"
# 6. each rank keeps optimizer state for its shard only: at most 3 * ceil(P/N) + 64 elements
#    (parameter-level partitions fail where one weight is most of the model)  -> public state case, "3 ranks: ... shard"
# 7. works with the parameters' dtype (float64 here)                           -> every case

TWO_RANKS, THREE_RANKS = 1313, 1317  # seeds of generated_inputs; the observers repeat them (they run as source)


def observe_two_ranks_generated(ns):
    from gpucourse.checks.ddp import run_exercise_script
    from gpucourse.checks.lesson13 import generated_inputs, judge_state, judge_weights

    public = run_exercise_script(ns, "sharded_adam")
    if judge_weights(public) is not None or judge_state(public) is not None:
        return {**public, "public_only": True}
    return run_exercise_script(ns, "sharded_adam", inputs=generated_inputs(1313, 2), world_size=2)


def observe_three_ranks_generated(ns):
    from gpucourse.checks.ddp import run_exercise_script
    from gpucourse.checks.lesson13 import generated_inputs, judge_state, judge_weights

    public = run_exercise_script(ns, "sharded_adam")
    if judge_weights(public) is not None or judge_state(public) is not None:
        return {**public, "public_only": True}
    return run_exercise_script(ns, "sharded_adam", inputs=generated_inputs(1317, 3), world_size=3)


def judge_generated(judge, seed, world_size):
    """``judge`` on the generated launch; on the public record when the public launch failed."""
    def run(d):
        if d.get("public_only"):  # not launched again: the public launch's failure is the reason
            verdict = judge(d)
            return verdict and f"(the public 2-process launch already failed) {verdict}"
        return judge(d, inputs=generated_inputs(seed, world_size), world_size=world_size)
    return run


HIDDEN = {
    "sharded_adam": [
        Case("a parameter count 2 ranks do not divide: DDP + Adam's weights, other Adam settings",
             observe_two_ranks_generated, judge_generated(judge_weights, TWO_RANKS, 2)),
        Case("a parameter count 2 ranks do not divide: each rank keeps only its shard of optimizer state",
             observe_two_ranks_generated, judge_generated(judge_state, TWO_RANKS, 2)),
        Case("3 ranks, parameter counts 3 does not divide: DDP + Adam's weights, identical on every rank",
             observe_three_ranks_generated, judge_generated(judge_weights, THREE_RANKS, 3)),
        Case("3 ranks: each rank keeps only its shard of optimizer state",
             observe_three_ranks_generated, judge_generated(judge_state, THREE_RANKS, 3)),
    ],
}


# shard_range:
# 1. (start, stop), a tuple of two ints                                  -> every case (a list or floats read as wrong)
# 2. chunks of ceil(numel / world_size), rank r's starting at r * chunk   -> "every numel up to 40"
# 3. the padding dropped: stop never past numel; a rank wholly in the padding gets (numel, numel)
#                                                                         -> "fewer elements than ranks", "every numel up to 40"
# 4. any numel >= 0 and world_size >= 1, rank in range(world_size)        -> "every numel up to 40" (numel 0, world_size 1)
# 5. ValueError for a rank outside range(world_size), world_size < 1, numel < 0 -> "bad input raises ValueError"

GRID = [[n, w] for n in range(0, 41) for w in range(1, 8)]
BAD = [[10, 4, 4], [10, -1, 4], [10, 0, 0], [-1, 0, 2]]


def observe_shard_grid(ns):
    from gpucourse.checks.lesson13 import observe_shard_ranges

    return observe_shard_ranges(ns, grid=[[n, w] for n in range(0, 41) for w in range(1, 8)])


def observe_few_elements(ns):
    from gpucourse.checks.lesson13 import observe_shard_ranges

    return observe_shard_ranges(ns, grid=[[2, 5], [1, 3], [5, 7], [0, 3]])


def observe_bad_input(ns):
    from gpucourse.checks.lesson13 import observe_shard_ranges

    return observe_shard_ranges(ns, grid=[[4, 2]], bad=[[10, 4, 4], [10, -1, 4], [10, 0, 0], [-1, 0, 2]])


def judge_bad_input(d):
    for numel, rank, world, got in d["raised"]:
        if got != "ValueError":
            what = got if got.startswith("returned") else "raised " + got
            return f"shard_range({numel}, {rank}, {world}) must raise ValueError, but it {what}"
    if [row[:3] for row in d["raised"]] != BAD:
        return "the inputs were changed while checking"
    return judge_shard_ranges(d, grid=[[4, 2]])


HIDDEN["shard_range"] = [
    Case("every numel up to 40 on 1 to 7 ranks", observe_shard_grid, lambda d: judge_shard_ranges(d, grid=GRID)),
    Case("fewer elements than ranks: the last ranks get (numel, numel)", observe_few_elements,
         lambda d: judge_shard_ranges(d, grid=[[2, 5], [1, 3], [5, 7], [0, 3]])),
    Case("bad input raises ValueError", observe_bad_input, judge_bad_input),
]

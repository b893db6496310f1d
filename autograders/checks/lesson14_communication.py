"""Hidden checks for lesson 14 (the cost of communication). Never released.

Inputs are generated here (seeded) or written out; observers repeat them (they run as source), and the
judges recompute the expected values from the same inputs with gpucourse.checks.lesson14's arithmetic.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson14 import fit_inputs, judge_bytes, judge_bytes_errors, judge_fit_errors, judge_fits

# fit_alpha_beta:
# 1. the ordinary least-squares line t = alpha + n / beta in linear space (not log space, not two
#    points, not through the origin); (alpha, beta), beta the inverse of the slope  -> "generated links"
# 2. within 1e-6 relative on beta, 1e-6 of the largest time on alpha             -> every fit case
# 3. sizes may repeat and come in any order; two sizes are enough                -> "generated links", "two sizes"
# 4. lists, tuples or 1-D NumPy arrays                                           -> "tuples and NumPy arrays"
# 5. a tuple of two floats                                                       -> every fit case
# 6. ValueError: lengths differ, fewer than 2 distinct sizes, a size or time <= 0, slope <= 0
#                                                                               -> "bad input raises ValueError"

FIT_SEED = 1414
TWO_SIZES = [[[4096.0, 1048576.0], [3e-4, 9e-4]], [[1048576.0, 4096.0], [9e-4, 3e-4]],
             [[65536.0, 65536.0, 262144.0], [2e-4, 3e-4, 4e-4]]]
FIT_BAD = [
    [[1024.0, 2048.0, 4096.0], [1e-4, 2e-4]],          # lengths differ
    [[], []],                                          # nothing
    [[8192.0], [1e-3]],                                # one point
    [[8192.0, 8192.0], [1e-3, 2e-3]],                  # one distinct size
    [[0.0, 1024.0, 2048.0], [1e-4, 2e-4, 3e-4]],       # a size of 0
    [[-1024.0, 1024.0, 2048.0], [1e-4, 2e-4, 3e-4]],   # a negative size
    [[1024.0, 2048.0, 4096.0], [1e-4, 0.0, 3e-4]],     # a time of 0
    [[1024.0, 2048.0, 4096.0], [1e-4, -2e-4, 3e-4]],   # a negative time
    [[1024.0, 2048.0, 4096.0], [3e-4, 2e-4, 1e-4]],    # times falling with size: no positive slope
    [[4096.0, 1024.0, 2048.0, 8192.0], [2e-4, 5e-4, 3e-4, 1e-4]],  # falling, shuffled
]


def observe_generated_fits(ns):
    from gpucourse.checks.lesson14 import fit_inputs, observe_fits

    return observe_fits(ns, inputs=fit_inputs(1414, 24), bad=[])


def observe_two_sizes(ns):
    from gpucourse.checks.lesson14 import observe_fits

    return observe_fits(ns, inputs=[[[4096.0, 1048576.0], [3e-4, 9e-4]], [[1048576.0, 4096.0], [9e-4, 3e-4]],
                                    [[65536.0, 65536.0, 262144.0], [2e-4, 3e-4, 4e-4]]], bad=[])


def observe_forms(ns):
    from gpucourse.checks.lesson14 import fit_inputs, observe_fits

    return observe_fits(ns, inputs=fit_inputs(1415, 4), bad=[], forms=("tuple", "numpy"))


def observe_fit_errors(ns):
    from gpucourse.checks.lesson14 import observe_fits

    bad = [
        [[1024.0, 2048.0, 4096.0], [1e-4, 2e-4]],
        [[], []],
        [[8192.0], [1e-3]],
        [[8192.0, 8192.0], [1e-3, 2e-3]],
        [[0.0, 1024.0, 2048.0], [1e-4, 2e-4, 3e-4]],
        [[-1024.0, 1024.0, 2048.0], [1e-4, 2e-4, 3e-4]],
        [[1024.0, 2048.0, 4096.0], [1e-4, 0.0, 3e-4]],
        [[1024.0, 2048.0, 4096.0], [1e-4, -2e-4, 3e-4]],
        [[1024.0, 2048.0, 4096.0], [3e-4, 2e-4, 1e-4]],
        [[4096.0, 1024.0, 2048.0, 8192.0], [2e-4, 5e-4, 3e-4, 1e-4]],
    ]
    return observe_fits(ns, inputs=[], bad=bad)


HIDDEN = {
    "fit_alpha_beta": [
        Case("generated links (noisy, repeated and shuffled sizes): the least-squares alpha and beta",
             observe_generated_fits, lambda d: judge_fits(d, inputs=fit_inputs(FIT_SEED, 24))),
        Case("two sizes, in either order, one of them repeated", observe_two_sizes,
             lambda d: judge_fits(d, inputs=TWO_SIZES)),
        Case("tuples and NumPy arrays as input", observe_forms,
             lambda d: judge_fits(d, inputs=fit_inputs(FIT_SEED + 1, 4), forms=("tuple", "numpy"))),
        Case("bad input raises ValueError (lengths, fewer than 2 sizes, sizes or times <= 0, no positive slope)",
             observe_fit_errors, lambda d: judge_fit_errors(d, bad=FIT_BAD) or judge_fits(d, inputs=[])),
    ],
}


# comm_bytes_per_step:
# 1. ddp: 2 (N - 1) chunks; zero1, zero2: 2 (N - 1); zero3: 3 (N - 1); a chunk ceil(P / N) elements
#                                                                       -> "every strategy, 1 to 9 ranks"
# 2. the padding: N need not divide P (chunks of ceil(P / N))            -> "every strategy", "fewer parameters than ranks"
# 3. one rank sends nothing; P = 0 sends nothing                          -> "every strategy" (N = 1, P = 0 in the grid)
# 4. any bytes_per_elem >= 1                                              -> "every strategy" (1, 2, 4, 8)
# 5. an int                                                               -> every bytes case
# 6. ValueError: an unknown strategy (case matters), world_size < 1, n_params < 0, bytes_per_elem < 1
#                                                                       -> "bad input raises ValueError"

BYTES_SEED = 1441


def bytes_grid(seed: int) -> list[list]:
    """Every strategy on 1 to 9 ranks, with parameter counts 0, divisible, not divisible, fewer than the
    ranks and large; element sizes 1, 2, 4 and 8. Seeded."""
    import random

    rng = random.Random(seed)
    grid = []
    for strategy in ("ddp", "zero1", "zero2", "zero3"):
        for world in range(1, 10):
            for n_params in (0, world * rng.randint(1, 999), world * rng.randint(1, 999) + rng.randint(1, world),
                             rng.randint(1, world), rng.randint(10**6, 10**10)):
                grid.append([strategy, n_params, world, rng.choice([1, 2, 4, 8])])
    return grid


BYTES_BAD = [["DDP", 100, 2, 4], ["zero4", 100, 2, 4], ["fsdp", 100, 2, 4], ["ddp", 100, 0, 4], ["zero3", 100, -2, 4],
             ["zero1", -1, 2, 4], ["zero2", 100, 2, 0]]


def observe_bytes_grid(ns):
    import random

    from gpucourse.checks.lesson14 import observe_bytes

    rng = random.Random(1441)
    grid = []
    for strategy in ("ddp", "zero1", "zero2", "zero3"):
        for world in range(1, 10):
            for n_params in (0, world * rng.randint(1, 999), world * rng.randint(1, 999) + rng.randint(1, world),
                             rng.randint(1, world), rng.randint(10**6, 10**10)):
                grid.append([strategy, n_params, world, rng.choice([1, 2, 4, 8])])
    return observe_bytes(ns, inputs=grid, bad=[])


def observe_few_parameters(ns):
    from gpucourse.checks.lesson14 import observe_bytes

    return observe_bytes(ns, inputs=[["ddp", 3, 8, 4], ["zero3", 1, 5, 2], ["zero1", 5, 7, 8], ["zero2", 2, 3, 1]], bad=[])


def observe_bytes_errors(ns):
    from gpucourse.checks.lesson14 import observe_bytes

    return observe_bytes(ns, inputs=[["ddp", 8, 2, 4]], bad=[
        ["DDP", 100, 2, 4], ["zero4", 100, 2, 4], ["fsdp", 100, 2, 4], ["ddp", 100, 0, 4], ["zero3", 100, -2, 4],
        ["zero1", -1, 2, 4], ["zero2", 100, 2, 0]])


HIDDEN["comm_bytes_per_step"] = [
    Case("every strategy, 1 to 9 ranks, parameter counts that do and do not divide", observe_bytes_grid,
         lambda d: judge_bytes(d, inputs=bytes_grid(BYTES_SEED))),
    Case("fewer parameters than ranks: chunks of one padded element", observe_few_parameters,
         lambda d: judge_bytes(d, inputs=[["ddp", 3, 8, 4], ["zero3", 1, 5, 2], ["zero1", 5, 7, 8], ["zero2", 2, 3, 1]])),
    Case("bad input raises ValueError (unknown strategy, world_size < 1, n_params < 0, bytes_per_elem < 1)",
         observe_bytes_errors,
         lambda d: judge_bytes_errors(d, bad=BYTES_BAD) or judge_bytes(d, inputs=[["ddp", 8, 2, 4]])),
]

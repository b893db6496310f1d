"""Hidden checks for lesson 13 (sharded data parallel). Never released.

ShardedAdam runs as a script. The public launch (2 ranks, 1082 parameters, one weight holding 960 of them)
is judged first; a submission that fails it is not launched again, and the hidden judges report the
public record's failure. Otherwise two more launches, with inputs drawn at grading time (``Case.draw``):
2 ranks on models whose parameter count 2 divides and does not, and 3 ranks on models of every remainder
and of fewer parameters than processes; other Adam settings, steps and ways of building the optimizer
(keywords, positional, the text's defaults); one run of each launch in float32 (the state must be in the
parameters' dtype); in each launch a last run whose steps leave some parameters
without .grad on one rank or on all (the text: zeros there). Besides the weights and the size of the kept
state, each rank must keep at least Adam's two moments of its own chunk r (ceil(P/N) elements from
r * ceil(P/N)), in the parameters' dtype (``judge_state_of_own_chunk``). The judges train DDP + Adam themselves (``reference_weights``,
on this side only) to know the expected weights. Three launches per submission, as before.
"""

import math

from gpucourse.checks import Case
from gpucourse.checks.lesson13_sharded_data_parallel import (build_model, judge_state, judge_weights, launch_problem, parameter_count,
                                       rank_rows, run_settings, run_words)

from autograders.differential import call, judge_calls


def reference_weights(inputs, run, world_size):
    """The weights after every step when one process averages every rank's gradient and steps
    ``torch.optim.Adam``: what DDP + Adam computes, from the inputs alone."""
    import torch
    from torch.nn import functional as F

    s = run_settings(inputs, run)
    widths = s["widths"]
    model = build_model(widths, s["seed"], s.get("dtype"))
    params = list(model.parameters())
    adam = torch.optim.Adam(params, lr=s["lr"], betas=tuple(s["betas"]), eps=s["eps"])
    after = []
    for step in range(s["steps"]):
        mean = [torch.zeros_like(p) for p in params]
        for rank in range(world_size):
            adam.zero_grad(set_to_none=True)
            x, y = rank_rows(widths, s["seed"], step, rank, s["rows"], s.get("dtype"))
            (F.mse_loss(model(x), y) / world_size).backward()
            dropped = {d["param"] for d in s.get("drop", []) if d["step"] == step and rank in d["ranks"]}
            for i, p in enumerate(params):
                if i not in dropped:  # the text: a parameter without .grad counts as zeros on that process
                    mean[i] += p.grad
        for p, g in zip(params, mean):
            p.grad = g  # a tensor (zeros where every process dropped it), never None: Adam updates every parameter
        adam.step()
        after.append([float(w) for p in model.parameters() for w in p.detach().reshape(-1)])
    return after


def judge_drawn_weights(d, inputs, world_size):
    """Every drawn run on every rank: it ran, the same weights on every rank after every step, and DDP +
    Adam's (recomputed here) to 1e-9 (float64: only rounding differs; 1e-5 in a float32 run)."""
    problem = launch_problem(d, inputs, world_size)
    if problem:
        return problem
    for i, run in enumerate(inputs["runs"]):
        s = run_settings(inputs, run)
        mine = d["ranks"]["0"]["runs"][i]["weights"]
        dtype, tolerance = s.get("dtype", "float64"), 1e-5 if s.get("dtype") == "float32" else 1e-9
        for step, expected in enumerate(reference_weights(inputs, run, world_size)):
            gap = max((abs(a - b) if a == a else math.inf for a, b in zip(mine[step], expected)), default=0.0)
            if not gap <= tolerance:
                return (f"{run_words(s, world_size)}: after step {step + 1} the weights differ from DDP + Adam's by up "
                        f"to {gap:.3g} ({dtype}, so only rounding may differ)")
    return None


def judge_state_of_own_chunk(d, inputs, world_size):
    """Every drawn run, every rank: the optimizer keeps, in the parameters' dtype, at least Adam's two moments
    of the real elements of chunk r (ceil(P/N) elements from r * ceil(P/N), the padding left out). A rank
    that keeps another chunk (floor(P/N) each, the rest on the last rank) or the state in another dtype
    fails. Records without the per-dtype bytes (made by hand in tests) are not judged here."""
    for i, run in enumerate(inputs["runs"]):
        s = run_settings(inputs, run)
        numel = parameter_count(s["widths"])
        dtype = f"torch.{s.get('dtype', 'float64')}"
        for rank, r in sorted(d["ranks"].items()):
            got = r["runs"][i]
            kept = got.get("state_by_dtype")
            if not isinstance(kept, dict):
                continue
            start, stop = reference_shard_range(numel, int(rank), world_size)
            itemsize = 4 if dtype == "torch.float32" else 8
            need, mine = 2 * (stop - start) * itemsize, kept.get(dtype, 0)
            if mine >= need:
                continue
            others = sorted(k for k, v in kept.items() if k != dtype and "float" in k and v)
            if others:
                return (f"{run_words(s, world_size)}: rank {rank} keeps its optimizer state in {', '.join(others)}, "
                        f"not in the parameters' dtype ({dtype}): use the parameters' dtype")
            return (f"{run_words(s, world_size)}: rank {rank} keeps {mine // itemsize} elements of optimizer state, "
                    f"fewer than Adam's two moments of its chunk need (2 x {stop - start}: elements {start} to "
                    f"{stop - 1} of the flat vector, chunk {rank} of {world_size} chunks of ceil(P/N))")
    return None


# --- what is drawn: Adam settings, steps and the way the optimizer is built, per run ---------------------

def _widths(rng, world_size, remainder=None, fewer=False):
    """Widths of 1 to 3 Linear layers (widths 1 to 11) whose parameter count leaves ``remainder`` when divided
    by ``world_size`` (any when None); ``fewer``: fewer parameters than processes (Linear(1, 1): 2)."""
    if fewer:
        return [1, 1]
    while True:
        widths = [rng.randint(1, 11) for _ in range(rng.randint(2, 4))]
        if remainder is None or parameter_count(widths) % world_size == remainder:
            return widths


def _drawn_run(rng, widths, how):
    """A run: its own seed, rows, steps (1 to 6), and Adam settings; ``how`` the optimizer is built. eps is
    large in most runs (a summed gradient shows only where eps matters); "defaults" uses the text's."""
    run = {"widths": widths, "seed": rng.randint(1, 999), "rows": rng.randint(1, 7), "steps": rng.randint(1, 6),
           "call": how}
    if how == "defaults":
        run.update(lr=1e-3, betas=[0.9, 0.999], eps=1e-8)
    else:
        run.update(lr=rng.choice([0.02, 0.005, round(10 ** rng.uniform(-3, -1.3), 6)]),
                   betas=[rng.choice([0.8, 0.85, 0.9, round(rng.uniform(0.5, 0.95), 3)]),
                          rng.choice([0.95, 0.97, 0.999, round(rng.uniform(0.9, 0.999), 4)])],
                   eps=rng.choice([1e-3, 3e-3, round(10 ** rng.uniform(-4, -2), 7)]))
        if how == "lr_only":
            run.update(betas=[0.9, 0.999], eps=1e-8)
    return run


def _drops(rng, widths, steps, world_size):
    """Which parameters lose their .grad, where: at the first step one tensor on every rank (the mean is zero
    there; an answer that cannot take a missing .grad then fails on every rank alike, and no rank is left
    waiting in a collective), at the second one on one rank only, at the third one on every rank again (the
    moments are not zero by then: Adam still moves it), then a few at random."""
    tensors = 2 * (len(widths) - 1)
    drops = [{"step": 0, "param": rng.randrange(tensors), "ranks": list(range(world_size))}]
    if steps > 1:
        drops.append({"step": 1, "param": rng.randrange(tensors), "ranks": [rng.randrange(world_size)]})
    if steps > 2:  # on every rank after a step: the moments are not zero, so Adam still moves that parameter
        drops.append({"step": 2, "param": rng.randrange(tensors), "ranks": list(range(world_size))})
    for step in range(3, steps):
        if rng.random() < 0.5:
            drops.append({"step": step, "param": rng.randrange(tensors),
                          "ranks": sorted(rng.sample(range(world_size), rng.randint(1, world_size)))})
    return drops


def _drawn_launch(rng, world_size, widths_list):
    """The runs of one launch (the text's defaults always among them), then one more whose steps leave some
    parameters without .grad on some ranks."""
    hows = (["keywords", "positional", "defaults", "lr_only"] + ["keywords"] * len(widths_list))[:len(widths_list)]
    rng.shuffle(hows)
    runs = [_drawn_run(rng, widths, how) for widths, how in zip(widths_list, hows)]
    # one run in float32 (a model of at least N parameters): the state in the parameters' dtype, not float64
    rng.choice([run for run in runs if parameter_count(run["widths"]) >= world_size])["dtype"] = "float32"
    missing = _drawn_run(rng, _widths(rng, world_size), "keywords")
    missing["steps"] = rng.randint(3, 5)
    missing["drop"] = _drops(rng, missing["widths"], missing["steps"], world_size)
    return {"world_size": world_size, "launch": {"runs": runs + [missing]}}


def draw_two_ranks(rng):
    """2 ranks: a parameter count 2 does not divide (twice) and one it divides."""
    return _drawn_launch(rng, 2, [_widths(rng, 2, 1), _widths(rng, 2, 0), _widths(rng, 2, 1)])


def draw_three_ranks(rng):
    """3 ranks: every remainder of P / 3 (0, 1, 2), and fewer parameters than processes (P = 2)."""
    return _drawn_launch(rng, 3, [_widths(rng, 3, 1), _widths(rng, 3, 2), _widths(rng, 3, 0), _widths(rng, 3, fewer=True)])


def observe_drawn_launch(ns, inputs):
    from gpucourse.checks.ddp import run_exercise_script
    from gpucourse.checks.lesson13_sharded_data_parallel import judge_state, judge_weights

    public = run_exercise_script(ns, "sharded_adam")
    if judge_weights(public) is not None or judge_state(public) is not None:
        return {**public, "public_only": True}
    return run_exercise_script(ns, "sharded_adam", inputs=inputs["launch"], world_size=inputs["world_size"])


def judge_drawn_launch(d, inputs):
    """The drawn launch's weights and state; the public record's failure when the public launch failed."""
    if not isinstance(d, dict):
        return "no record of the launch"
    if d.get("public_only"):  # not launched again: the public launch's failure is the reason
        verdict = judge_weights(d) or judge_state(d)
        if verdict is None:
            return "the drawn launch did not run, yet the public launch passed"
        return f"(the public 2-process launch already failed) {verdict}"
    world = inputs["world_size"]
    return (judge_drawn_weights(d, inputs["launch"], world) or judge_state(d, inputs["launch"], world)
            or judge_state_of_own_chunk(d, inputs["launch"], world))


HIDDEN = {
    "sharded_adam": [
        Case("2 ranks, drawn models (a parameter count 2 does not divide, and one it does, float32 too), Adam "
             "settings, ways to build it, parameters without .grad: DDP + Adam's weights on every rank, only its "
             "own chunk of optimizer state, in the parameters' dtype",
             observe_drawn_launch, judge_drawn_launch, draw=draw_two_ranks),
        Case("3 ranks, drawn models (every remainder of P / 3, fewer parameters than processes, float32 too), "
             "parameters without .grad: DDP + Adam's weights on every rank, only its own chunk of optimizer state, "
             "in the parameters' dtype",
             observe_drawn_launch, judge_drawn_launch, draw=draw_three_ranks),
    ],
}


# shard_range: differential. Each case draws its calls at grading time (boundaries first, then random
# ones from the whole domain the text states); the sandbox calls the answer on them and the judge calls
# the reference below, which exists on the grader's side only.

def reference_shard_range(numel, rank, world_size):
    """The text's rule: chunks of ceil(numel / world_size); the padding dropped; ValueError outside the domain."""
    if world_size < 1 or numel < 0 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank}, world_size {world_size}, numel {numel}")
    chunk = -(-numel // world_size)
    return (min(rank * chunk, numel), min((rank + 1) * chunk, numel))


def _every_rank(pairs):
    return [call(numel, rank, world) for numel, world in pairs for rank in range(world)]


def draw_divisible_and_not(rng):
    """Boundaries (numel 0, one rank, numel a multiple of the ranks and one past it, integers above 2**53),
    then numel and world_size drawn at random, every rank of each."""
    big = 2 ** 53 + 2 * rng.randint(0, 10 ** 6) + 1  # odd: a float cannot hold it, so float division shows
    pairs = [(0, 1), (1, 1), (8, 2), (9, 2), (12, 4), (13, 4), (10, 4), (2 ** 53 + 1, 1), (big, 3), (big, 1), (40, 7)]
    pairs += [(rng.randint(0, 500), rng.randint(1, 9)) for _ in range(12)]
    pairs += [(rng.randint(10 ** 6, 10 ** 12), rng.randint(2, 64)) for _ in range(3)]
    return _every_rank(pairs)


def draw_fewer_elements_than_ranks(rng):
    """numel below world_size (and 0), where the last ranks' chunks are all padding."""
    pairs = [(2, 5), (1, 3), (5, 7), (0, 3), (1, 2)]
    for _ in range(6):
        world = rng.randint(2, 16)
        pairs.append((rng.randint(0, world - 1), world))
    return _every_rank(pairs)


def draw_bad_input(rng):
    """Each way out of the domain: rank == world_size, rank < 0, world_size < 1, numel < 0; named values first,
    also with no elements and on one rank (where every rank in range owns everything or nothing: the rank is
    still checked)."""
    calls = [call(10, 4, 4), call(10, -1, 4), call(10, 0, 0), call(-1, 0, 2), call(5, 0, -3)]
    calls += [call(0, 5, 3), call(0, -1, 2), call(0, 0, 0), call(10, 1, 1), call(10, -1, 1)]
    for _ in range(6):
        world = rng.randint(1, 12)
        numel = rng.randint(0, 100)
        calls += [call(numel, world + rng.randint(0, 3), world), call(numel, -rng.randint(1, 5), world),
                  call(-rng.randint(1, 50), rng.randrange(world), world), call(numel, 0, -rng.randint(0, 3))]
    return calls


def observe_shard_range_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "shard_range", calls)


HIDDEN["shard_range"] = [
    Case("any numel, divisible by world_size or not, up to integers above 2**53", observe_shard_range_calls,
         judge_calls(reference_shard_range, "shard_range"), draw=draw_divisible_and_not),
    Case("fewer elements than ranks: the last ranks get (numel, numel)", observe_shard_range_calls,
         judge_calls(reference_shard_range, "shard_range"), draw=draw_fewer_elements_than_ranks),
    Case("bad input raises ValueError", observe_shard_range_calls,
         judge_calls(reference_shard_range, "shard_range"), draw=draw_bad_input),
]

PUBLIC_CASE = "10 elements on 4 ranks, 8 on 2, 3 on 1: chunks of ceil(numel / world_size)"
_S = HIDDEN["sharded_adam"]
_S_PUBLIC = ["2 ranks, 4 steps: every rank ends each step with DDP + Adam's weights",
             "each rank keeps only its shard of optimizer state"]
CLAUSES = {
    "sharded_adam": {
        "ShardedAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8): keywords, positional, the defaults":
            [_S[0].name, _S[1].name],
        "step() averages the gradients over all processes (a mean, as DDP)": [_S_PUBLIC[0], _S[0].name, _S[1].name],
        "Adam with its bias correction, eps added to sqrt(v_hat): DDP + torch.optim.Adam(params, lr, betas, eps)":
            [_S_PUBLIC[0], _S[0].name, _S[1].name],
        "every process holds all the updated parameters, identical on every process, after every step":
            [_S_PUBLIC[0], _S[0].name, _S[1].name],
        "state only for its shard: at most 3 * ceil(P/N) + 64 elements kept between steps (state set on the "
        "parameters' tensors counts too)": [_S_PUBLIC[1], _S[0].name, _S[1].name],
        "rank r's shard is chunk r of the vector padded to N * ceil(P/N) and cut into N equal chunks (its two "
        "moments kept there)": [_S[0].name, _S[1].name],
        "any P, divisible by the number of processes N or not (also P < N)": [_S[0].name, _S[1].name],
        "any N (2 and 3 processes)": [_S_PUBLIC[0], _S[1].name],
        "the parameters' dtype (float64 in the check; a float32 run in grading), the state too":
            [_S_PUBLIC[0], _S[0].name, _S[1].name],
        "a parameter whose .grad is None on a process counts as zeros there: it enters the mean, and Adam still "
        "updates it, even when the mean is zero on every process": [_S[0].name, _S[1].name],
    },
    "shard_range": {
        "returns (start, stop), a tuple of two ints": [PUBLIC_CASE, HIDDEN["shard_range"][0].name],
        "chunks of ceil(numel / world_size), rank r's starting at r * chunk": [PUBLIC_CASE, HIDDEN["shard_range"][0].name],
        "the padding dropped: stop never past numel; a rank wholly in the padding gets (numel, numel)":
            [HIDDEN["shard_range"][1].name, HIDDEN["shard_range"][0].name],
        "any numel >= 0 and world_size >= 1, rank in range(world_size)": [HIDDEN["shard_range"][0].name],
        "ValueError for a rank outside range(world_size), world_size < 1 or numel < 0": [HIDDEN["shard_range"][2].name],
    },
}

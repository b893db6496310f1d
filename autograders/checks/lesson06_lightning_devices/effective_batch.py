"""effective_batch_size and scaled_learning_rate: the references and drawn cases of lesson 6's effective_batch.
Never released; the package's docstring says how its cases are drawn."""

from gpucourse.checks.values import describe, rebuild, type_words

from autograders.differential import call, must_raise, outcome, same, shown, unreported


# --- effective_batch ------------------------------------------------------------------------------
# 1. samples per optimizer step: batch_size x devices x num_nodes x accumulate_grad_batches, for ddp,
#    ddp_spawn, ddp_notebook, fsdp and deepspeed; any counts (NumPy ints, integers above 2**53, a product
#    above 2**63: exact, no int64 wrap-around)
# 2. defaults num_nodes=1, strategy="ddp", accumulate_grad_batches=1, in that order (by position or name)
# 3. an int
# 4. ValueError for any other strategy: the removed ones, "", Lightning's "auto" and the registry's variants
#    of the table's names (ddp_find_unused_parameters_true, deepspeed_stage_2, fsdp_cpu_offload, ...: not in
#    the table) (not another case of a table name: Lightning lowers the case of a strategy's name itself, so
#    the text leaves "DDP" open; nor "ddp_fork", which the table gives as another name of ddp_notebook)
# 5. ValueError for a batch size, device count, node count or accumulation below 1 (0, negative, 0.5)
# 6. scaled_learning_rate: the linear rule, base_lr x effective / base_batch (a rate of 0 too)
# 7. scaled_learning_rate returns a float

STRATEGIES = ("ddp", "ddp_spawn", "ddp_notebook", "fsdp", "deepspeed")


def reference_effective_batch_size(batch_size, devices, num_nodes=1, strategy="ddp", accumulate_grad_batches=1):
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}")
    if min(batch_size, devices, num_nodes, accumulate_grad_batches) < 1:
        raise ValueError("a count below 1")
    return int(batch_size) * int(devices) * int(num_nodes) * int(accumulate_grad_batches)


def reference_scaled_learning_rate(base_lr, base_batch_size, effective_batch_size):
    return float(base_lr * effective_batch_size / base_batch_size)


def _count(rng, big=False):
    import numpy

    value = rng.choice([1, 1, 2, 3, 8, rng.randint(1, 96)] + ([2 ** 53 + rng.randint(1, 999)] if big else []))
    return numpy.int64(value) if value < 2 ** 31 and rng.random() < 0.2 else value


def _batch_call(rng, strategy=None, **fixed):
    """A call with every factor drawn (or ``fixed``), the optional ones left out, by position or by name."""
    values = {"batch_size": _count(rng, big=True), "devices": _count(rng), "num_nodes": _count(rng),
              "strategy": strategy or rng.choice(STRATEGIES), "accumulate_grad_batches": _count(rng)}
    values.update(fixed)
    if any(type(v) is int and v > 2 ** 31 for v in values.values()):  # no NumPy int next to a big one: int64 would overflow
        values = {k: int(v) if hasattr(v, "dtype") else v for k, v in values.items()}
    order = ["batch_size", "devices", "num_nodes", "strategy", "accumulate_grad_batches"]
    defaults = {"num_nodes": 1, "strategy": "ddp", "accumulate_grad_batches": 1}
    positional = rng.randint(2, 5)
    args = [values[k] for k in order[:positional]]
    kwargs = {k: values[k] for k in order[positional:] if not (values[k] == defaults.get(k, object()) and rng.random() < 0.5)
              or k not in defaults}
    return call(*args, **kwargs)


def draw_batch_strategies(rng):
    calls = [call(1, 1, 1, "fsdp", 1), call(7, 8, num_nodes=10, strategy="ddp_spawn"), call(2 ** 53 + 1, 3, strategy="deepspeed"),
             call(2 ** 53 + 1, 64, 64, "ddp", 64)]  # a product above 2**63: an int64 product wraps around
    for strategy in STRATEGIES:
        calls += [_batch_call(rng, strategy) for _ in range(2)]
    return calls


def draw_batch_positional(rng):
    calls = [call(5, 3), call(5, 3, 2), call(4, 2, 3, "fsdp"), call(4, 2, 3, "deepspeed", 6), call(9, 1, 1, "ddp_spawn", 1),
             call(6, 2, accumulate_grad_batches=3), call(6, 4, strategy="ddp_notebook")]
    return calls + [_batch_call(rng) for _ in range(5)]


REMOVED = ["dp", "ddp2", "horovod", "ddp_sharded", "ddp_cpu", "ddp_fully_sharded", "tpu_spawn", "single_device",
           "fsdp_native", ""]


# names Lightning accepts that the text's table does not list: its default, and its registry's variants
AUTO_AND_VARIANTS = {
    "ddp": ["ddp_find_unused_parameters_true", "ddp_find_unused_parameters_false", "ddp_spawn_find_unused_parameters_true",
            "ddp_notebook_find_unused_parameters_false", "ddp_fork_find_unused_parameters_true"],
    "deepspeed": ["deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
                  "deepspeed_stage_3_offload", "deepspeed_stage_3_offload_nvme"],
    "fsdp": ["fsdp_cpu_offload"],
}


def draw_batch_strategy_names(rng):
    """The removed dp and ddp2; "auto" and a variant of each table name Lightning's registry holds; then
    drawn removed and variant names."""
    calls = [call(8, 2, 1, "dp"), call(8, 4, 3, "dp", 2), call(8, 2, strategy="ddp2"), call(8, 2, strategy="auto"),
             call(8, 2, 1, "auto", 2)]
    calls += [call(8, 2, strategy=rng.choice(names)) for names in AUTO_AND_VARIANTS.values()]
    others = REMOVED + [name for names in AUTO_AND_VARIANTS.values() for name in names]
    return calls + [_batch_call(rng, strategy=rng.choice(others)) for _ in range(6)]


def draw_batch_below_one(rng):
    """Each count at 0, negative, 0.5 (the others valid), and every count at exactly 1."""
    import numpy

    names = ["batch_size", "devices", "num_nodes", "accumulate_grad_batches"]
    calls = [call(1, 1, 1, "ddp", 1), call(3, 2, num_nodes=1), call(3, 2, accumulate_grad_batches=1)]
    for name in names:
        for value in (0, -1, 0.5, rng.choice([-rng.randint(2, 100), numpy.int64(0), -0.25])):
            calls.append(_batch_call(rng, **{name: value}))
    return calls


def draw_lr_rule(rng):
    import numpy

    calls = [call(1, 3, 7), call(0.05, 96, 56), call(2e-3, 48, 80), call(0, 8, 64), call(0.0, 256, 1024),
             call(0.1, 256, 2 ** 53 + 1), call(0.1, numpy.int64(32), numpy.int64(96)), call(3, 4, 6)]
    for _ in range(4):
        calls.append(call(rng.choice([round(rng.uniform(1e-5, 0.5), 6), rng.randint(0, 3)]), rng.randint(1, 512),
                          rng.choice([rng.randint(1, 4096), 2 ** 53 + rng.randint(1, 99)])))
    return calls


def observe_batch_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "effective_batch_size", calls)


def observe_lr_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "scaled_learning_rate", calls)


def _plain(data):
    """A described NumPy scalar as the Python number it holds (an int64 is "an int", a float64 "a float")."""
    if isinstance(data, dict) and "__numpy__" in data:
        value = rebuild(data)
        if data["__numpy__"].startswith(("int", "uint")):
            return int(value)
        if data["__numpy__"].startswith("float"):
            return describe(float(value))
    return data


def judge_numbers(reference, name, wrong_value):
    """A judge of ``observe_calls`` outcomes: the answer's exception must be the reference's class; a number
    must be of the reference's type (NumPy ints count as ints, NumPy floats as floats) and value."""
    def judge(observed, calls):
        if not isinstance(observed, list) or len(observed) != len(calls):
            return f"{len(observed) if isinstance(observed, list) else 'no'} outcomes for {len(calls)} calls"
        for spec, got in zip(calls, observed):
            where = shown(spec, name)
            want = outcome(reference, spec)
            if found := unreported(got, where):
                return found
            if "raised" in want:
                if found := must_raise(got, want["raised"][0], where):
                    return found
                continue
            if "raised" in got:
                return f"{where} raised {got['raised'][0]}"
            value, expected = _plain(got["returned"]), want["returned"]
            if type_words(value) != type_words(expected):
                return f"{where} returned {type_words(value)}; it must return {type_words(expected)}"
            if not same(value, expected, rel=1e-9, abs_tol=1e-15):
                return f"{where} returned {rebuild(value)!r}, {wrong_value}"
        return None
    return judge


JUDGE_BATCH = judge_numbers(reference_effective_batch_size, "effective_batch_size", "not the effective batch size")
JUDGE_LR = judge_numbers(reference_scaled_learning_rate, "scaled_learning_rate", "not the linearly scaled rate")

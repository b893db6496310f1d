"""Hidden checks for lesson 6 (Lightning on many devices). Never released.

Each exercise lists the requirements its text states, numbered, and the case that tests each one.
Inputs are generated from fixed seeds inside the observers (other sizes, noise levels and strategies
than the text's examples).
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson06 import judge_batch, judge_picklable, outputs_close, readout_values, standardize_expected  # noqa: F401


# --- device_agnostic ------------------------------------------------------------------------------
# 1. the same function as Standardize: (x - mean) / std, the read-out self.readout, plus 1  -> "other sizes"
# 2. runs on the device the module and its input were moved to (.to(device))               -> "meta device" (+ public)
# 3. follows the dtype: .double() and .to(torch.bfloat16) give outputs of that dtype       -> "float64", "bfloat16"
# 4. the statistics are not parameters: parameters() is the read-out's weight and bias     -> "not parameters" (+ public)

def observe_agnostic_sizes(ns):
    import torch
    from gpucourse.checks import answer

    g = torch.Generator().manual_seed(63)
    record = {}
    for features, batch in ((1, 4), (7, 1), (3, 13)):
        mean = (torch.randn(features, generator=g) * 3).tolist()
        std = (torch.rand(features, generator=g) * 4 + 0.25).tolist()
        torch.manual_seed(features)
        model = answer(ns, "AgnosticStandardize")(mean, std)
        x = torch.randn(batch, features, generator=g) * 2 + 1
        key = f"{features} feature(s), a batch of {batch}"
        try:
            out = model(x)
            record[key] = {"shape": list(out.shape), "out": out.detach().double().reshape(-1).tolist(),
                           "readout": {"weight": model.readout.weight.detach().double().reshape(-1).tolist(),
                                       "bias": model.readout.bias.detach().double().reshape(-1).tolist()}}
        except Exception as error:
            record[key] = f"{type(error).__name__}: {str(error)[:200]}"
    return record


def agnostic_size_inputs():
    """observe_agnostic_sizes' inputs, rebuilt here: key -> (mean, std, x, batch)."""
    import torch
    g = torch.Generator().manual_seed(63)
    inputs = {}
    for features, batch in ((1, 4), (7, 1), (3, 13)):
        mean = (torch.randn(features, generator=g) * 3).tolist()
        std = (torch.rand(features, generator=g) * 4 + 0.25).tolist()
        x = (torch.randn(batch, features, generator=g) * 2 + 1).double().tolist()
        inputs[f"{features} feature(s), a batch of {batch}"] = (mean, std, x, batch)
    return inputs


def judge_agnostic_sizes(d):
    inputs = agnostic_size_inputs()
    if sorted(d) != sorted(inputs):
        return "not every size was tried"
    for key, (mean, std, x, batch) in inputs.items():
        value = d[key]
        if not isinstance(value, dict):
            return f"with {key}: {value}"
        if value["shape"] != [batch, 1]:
            return f"with {key} the output has shape {value['shape']}"
        if not outputs_close(value["out"], standardize_expected(x, mean, std, value["readout"]), 1e-4, 1e-5):
            return f"with {key} the output is not (x - mean) / std, the read-out, plus 1"
    return None


def observe_agnostic_dtypes(ns):
    import torch
    from gpucourse.checks import answer

    g = torch.Generator().manual_seed(64)
    mean, std = [0.5, -1.5, 2.0, 0.0, 3.0], [0.5, 2.0, 1.5, 1.0, 0.75]
    record = {}
    for dtype, atol in ((torch.float64, 1e-6), (torch.bfloat16, 0.1)):
        torch.manual_seed(4)
        model = answer(ns, "AgnosticStandardize")(mean, std)
        x = torch.randn(6, 5, generator=g)
        readout = {"weight": model.readout.weight.detach().double().reshape(-1).tolist(),
                   "bias": model.readout.bias.detach().double().reshape(-1).tolist()}
        try:
            moved = model.to(dtype)
            out = moved(x.to(dtype))
            record[str(dtype)] = {"dtype": str(out.dtype), "device": str(out.device), "shape": list(out.shape),
                                  "out": out.detach().double().reshape(-1).tolist(), "readout": readout}
        except Exception as error:
            record[str(dtype)] = f"{type(error).__name__}: {str(error)[:200]}"
    return record


def judge_agnostic_dtype(d, dtype):
    import torch
    value = d[dtype]
    if not isinstance(value, dict):
        return f"after .to({dtype}) with a {dtype} input: {value}"
    if value["dtype"] != dtype:
        return f"after .to({dtype}) with a {dtype} input the output is {value['dtype']}: new tensors must follow the input's dtype"
    g = torch.Generator().manual_seed(64)  # observe_agnostic_dtypes' inputs: float64 first, then bfloat16
    xs = {name: torch.randn(6, 5, generator=g) for name in ("torch.float64", "torch.bfloat16")}
    cast = getattr(torch, dtype.removeprefix("torch."))
    x = xs[dtype].to(cast).double().tolist()
    readout = {k: torch.tensor(v).to(cast).double().tolist() for k, v in value["readout"].items()}
    atol, rtol = (1e-6, 1e-6) if dtype == "torch.float64" else (0.1, 0.02)
    want = standardize_expected(x, [0.5, -1.5, 2.0, 0.0, 3.0], [0.5, 2.0, 1.5, 1.0, 0.75], readout)
    if value["shape"] != [6, 1] or not outputs_close(value["out"], want, atol, rtol):
        return f"after .to({dtype}) the output is not (x - mean) / std, the read-out, plus 1"
    return None


def observe_agnostic_meta(ns):
    import torch
    from gpucourse.checks import answer

    model = answer(ns, "AgnosticStandardize")([0.0, 1.0], [1.0, 3.0])
    try:
        moved = model.to("meta", torch.float64)
        out = moved(torch.randn(3, 2, device="meta", dtype=torch.float64))
        return {"device": str(out.device), "dtype": str(out.dtype), "shape": list(out.shape)}
    except Exception as error:
        return f"{type(error).__name__}: {str(error)[:200]}"


def judge_agnostic_meta(d):
    if d != {"device": "meta", "dtype": "torch.float64", "shape": [3, 1]}:
        return f"after .to('meta', torch.float64) with an input there: {d}"
    return None


def observe_agnostic_parameters(ns):
    from gpucourse.checks import answer
    model = answer(ns, "AgnosticStandardize")([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 2.0, 2.0])
    return {"names": sorted(name for name, _ in model.named_parameters()),
            "count": sum(1 for _ in model.parameters())}


def judge_agnostic_parameters(d):
    if d["names"] != ["readout.bias", "readout.weight"] or d["count"] != 2:
        return f"parameters() must hold the read-out's weight and bias only, not the statistics (even frozen); got {d['names']}"
    return None


# --- picklable ----------------------------------------------------------------------------------
# 1. a LightningModule with the same net (nn.Linear(4, 1))                                  -> "a LightningModule"
# 2. noise defaults to 0.1                                                                  -> "noise=0.1 by default"
# 3. augment(x) returns x + noise * torch.randn_like(x)                                     -> "other noise levels" (+ public)
# 4. the same training_step: MSE of net(augment(x)).squeeze(-1) against y                   -> "other noise levels" (+ public)
# 5. the same optimizer: SGD, lr 0.05, over the module's parameters                         -> "the same optimizer"
# 6. it pickles as ddp_spawn pickles it, and the copy behaves the same (its own noise too)  -> "other noise levels",
#                                                                                              "each module keeps its own noise"

def observe_picklable_module(ns):
    import torch
    from gpucourse.checks import answer
    model = answer(ns, "SpawnSafeRegressor")()
    net = getattr(model, "net", None)
    return {"lightning": any(c.__name__ == "LightningModule" for c in type(model).__mro__),
            "net": type(net).__name__, "shape": [getattr(net, "in_features", None), getattr(net, "out_features", None)],
            "linear": isinstance(net, torch.nn.Linear)}


def judge_picklable_module(d):
    if not d["lightning"]:
        return "SpawnSafeRegressor must be a LightningModule"
    if not d["linear"] or d["shape"] != [4, 1]:
        return f"net must be NoisyRegressor's net; got {d['net']} {d['shape']}"
    return None


def observe_picklable_default(ns):
    import torch
    from gpucourse.checks import answer
    model = answer(ns, "SpawnSafeRegressor")()
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(70))
    torch.manual_seed(7)
    return torch.as_tensor(model.augment(x)).detach().double().reshape(-1).tolist()


def judge_picklable_default(d):
    import torch
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(70))
    want = (x + 0.1 * torch.randn(5, 4, generator=torch.Generator().manual_seed(7))).double().reshape(-1).tolist()
    return None if outputs_close(d, want, 1e-6, 1e-5) else "SpawnSafeRegressor() must augment with noise 0.1, like NoisyRegressor()"


def observe_picklable_levels(ns):
    import random
    from gpucourse.checks.lesson06 import observe_picklable
    rng = random.Random(65)
    return [observe_picklable(ns, noise=round(rng.uniform(0.05, 4.0), 3)) for _ in range(2)]


def picklable_levels():
    import random
    rng = random.Random(65)  # observe_picklable_levels' noise levels
    return [round(rng.uniform(0.05, 4.0), 3) for _ in range(2)]


def judge_picklable_levels(d):
    levels = picklable_levels()
    if len(d) != len(levels):
        return "not every noise level was tried"
    for record, noise in zip(d, levels):
        verdict = judge_picklable(record, noise)
        if verdict:
            return verdict
    return None


def observe_picklable_no_noise(ns):
    from gpucourse.checks.lesson06 import observe_picklable
    return observe_picklable(ns, noise=0.0)


def observe_own_noise(ns):
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch
    from gpucourse.checks import answer

    cls = answer(ns, "SpawnSafeRegressor")
    quiet, loud = cls(noise=0.01), cls(noise=3.0)
    clones = [pickle.loads(bytes(ForkingPickler.dumps(m))) for m in (quiet, loud)]
    x = torch.zeros(2000, 4)
    stds = []
    for m in (quiet, loud, *clones):
        torch.manual_seed(3)
        stds.append(round(float(m.augment(x).std()), 3))
    return stds


def judge_own_noise(d):
    if len(d) != 4 or not all(isinstance(v, float) for v in d):
        return "four noise levels expected"
    quiet, loud, quiet_clone, loud_clone = d
    if not (abs(quiet - 0.01) < 0.002 and abs(loud - 3.0) < 0.3):
        return "with noise=0.01 and noise=3.0, augment does not add each module's own level of noise"
    if (quiet_clone, loud_clone) != (quiet, loud):
        return "after a pickle round trip a module augments with another noise level"
    return None


def observe_optimizer(ns):
    from gpucourse.checks import answer
    model = answer(ns, "SpawnSafeRegressor")(noise=0.2)
    configured = model.configure_optimizers()
    if isinstance(configured, dict):
        configured = configured.get("optimizer")
    while isinstance(configured, (list, tuple)) and configured:
        configured = configured[0]
    if isinstance(configured, dict):
        configured = configured.get("optimizer")
    groups = getattr(configured, "param_groups", None)
    if not groups:
        return {"type": type(configured).__name__}
    ids = sorted(id(p) for group in groups for p in group["params"])
    return {"type": type(configured).__name__, "lr": [group["lr"] for group in groups],
            "momentum": [group.get("momentum", 0) for group in groups],
            "all_parameters": ids == sorted(id(p) for p in model.parameters())}


def judge_optimizer(d):
    if d.get("type") != "SGD" or d.get("lr") != [0.05] or d.get("momentum") != [0] or not d.get("all_parameters"):
        return "configure_optimizers must give NoisyRegressor's optimizer, over all of the module's parameters"
    return None


# --- effective_batch ------------------------------------------------------------------------------
# 1. samples per optimizer step: batch_size x devices x num_nodes x accumulate_grad_batches,
#    for ddp, ddp_spawn, ddp_notebook, fsdp and deepspeed                          -> "every strategy of the table"
# 2. defaults num_nodes=1, strategy="ddp", accumulate_grad_batches=1, in that order -> "positional arguments and defaults"
# 3. an int                                                                       -> "every strategy of the table"
# 4. ValueError for any other strategy, the removed ones included                 -> "other and removed strategies"
# 5. ValueError for a batch size, device count, node count or accumulation below 1 -> "values below 1"
# 6. scaled_learning_rate: the linear rule, base_lr x effective / base_batch       -> "the linear scaling rule"
# 7. scaled_learning_rate returns a float                                         -> "the linear scaling rule"

STRATEGIES = ("ddp", "ddp_spawn", "ddp_notebook", "fsdp", "deepspeed")


def observe_batch_strategies(ns):
    import random
    from gpucourse.checks.lesson06 import observe_batch
    rng = random.Random(66)
    cases = [{"batch_size": 1, "devices": 1, "num_nodes": 1, "strategy": "fsdp", "accumulate_grad_batches": 1}]
    for strategy in ("ddp", "ddp_spawn", "ddp_notebook", "fsdp", "deepspeed"):
        for _ in range(2):
            cases.append({"batch_size": rng.randint(1, 96), "devices": rng.randint(1, 8), "num_nodes": rng.randint(1, 12),
                          "strategy": strategy, "accumulate_grad_batches": rng.randint(1, 9)})
    return {"cases": cases, **observe_batch(ns, cases, [])}


def batch_strategy_cases():
    """observe_batch_strategies' cases, rebuilt here (the same seed)."""
    import random
    rng = random.Random(66)
    cases = [{"batch_size": 1, "devices": 1, "num_nodes": 1, "strategy": "fsdp", "accumulate_grad_batches": 1}]
    for strategy in STRATEGIES:
        for _ in range(2):
            cases.append({"batch_size": rng.randint(1, 96), "devices": rng.randint(1, 8), "num_nodes": rng.randint(1, 12),
                          "strategy": strategy, "accumulate_grad_batches": rng.randint(1, 9)})
    return cases


def judge_batch_strategies(d):
    cases = batch_strategy_cases()
    want = [c["batch_size"] * c["devices"] * c["num_nodes"] * c["accumulate_grad_batches"] for c in cases]
    return judge_batch(d, want, [], cases)


def observe_batch_positional(ns):
    from gpucourse.checks.lesson06 import observe_batch
    cases = [[5, 3], [5, 3, 2], [4, 2, 3, "fsdp"], [4, 2, 3, "deepspeed", 6], [9, 1, 1, "ddp_spawn", 1]]
    return {"cases": cases, **observe_batch(ns, cases, [])}


POSITIONAL_CASES = [[5, 3], [5, 3, 2], [4, 2, 3, "fsdp"], [4, 2, 3, "deepspeed", 6], [9, 1, 1, "ddp_spawn", 1]]


def judge_batch_positional(d):
    return judge_batch(d, [15, 30, 24, 144, 9], [], POSITIONAL_CASES)


def observe_batch_strategy_names(ns):
    from gpucourse.checks.lesson06 import observe_batch
    cases = [{"batch_size": 8, "devices": 2, "num_nodes": 1, "strategy": s}
             for s in ("dp", "ddp2", "horovod", "ddp_sharded", "ddp_cpu", "single_device", "fsdp_native", "")]
    cases.append({"batch_size": 8, "devices": 4, "num_nodes": 3, "strategy": "dp", "accumulate_grad_batches": 2})
    return {"cases": cases, **observe_batch(ns, cases, [])}


def observe_batch_below_one(ns):
    from gpucourse.checks.lesson06 import observe_batch
    base = {"batch_size": 3, "devices": 2, "num_nodes": 2, "strategy": "ddp", "accumulate_grad_batches": 2}
    cases = [dict(base, **{name: value}) for name in ("batch_size", "devices", "num_nodes", "accumulate_grad_batches")
             for value in (0, -1, -4)]
    cases += [dict(base, batch_size=1, devices=1, num_nodes=1, accumulate_grad_batches=1),
              dict(base, devices=1), dict(base, num_nodes=1), dict(base, accumulate_grad_batches=1)]
    return {"cases": cases, **observe_batch(ns, cases, [])}


def judge_batch_below_one(d):
    return judge_batch(d, ["ValueError"] * 12 + [1, 12, 12, 12], [], None)


def observe_lr_rule(ns):
    import random
    from gpucourse.checks.lesson06 import observe_batch
    rng = random.Random(67)
    lr_cases = [{"base_lr": 1, "base_batch_size": 3, "effective_batch_size": 7},
                {"base_lr": 0.05, "base_batch_size": 96, "effective_batch_size": 56},
                [2e-3, 48, 80]]
    for _ in range(4):
        lr_cases.append({"base_lr": round(rng.uniform(1e-5, 0.5), 6), "base_batch_size": rng.randint(1, 512),
                         "effective_batch_size": rng.randint(1, 4096)})
    return {"lr_cases": lr_cases, **observe_batch(ns, [], lr_cases)}


def lr_rule_cases():
    """observe_lr_rule's cases, rebuilt here (the same seed)."""
    import random
    rng = random.Random(67)
    lr_cases = [{"base_lr": 1, "base_batch_size": 3, "effective_batch_size": 7},
                {"base_lr": 0.05, "base_batch_size": 96, "effective_batch_size": 56},
                [2e-3, 48, 80]]
    for _ in range(4):
        lr_cases.append({"base_lr": round(rng.uniform(1e-5, 0.5), 6), "base_batch_size": rng.randint(1, 512),
                         "effective_batch_size": rng.randint(1, 4096)})
    return lr_cases


def judge_lr_rule(d):
    cases = lr_rule_cases()
    args = [c if isinstance(c, list) else [c["base_lr"], c["base_batch_size"], c["effective_batch_size"]] for c in cases]
    return judge_batch(d, [], [lr * effective / base for lr, base, effective in args], None, cases)


HIDDEN = {
    "device_agnostic": [
        Case("other sizes: 1 and 7 features, a batch of 1", observe_agnostic_sizes, judge_agnostic_sizes),
        Case("float64: dtype and values", observe_agnostic_dtypes, lambda d: judge_agnostic_dtype(d, "torch.float64")),
        Case("bfloat16: dtype and values", observe_agnostic_dtypes, lambda d: judge_agnostic_dtype(d, "torch.bfloat16")),
        Case("meta device and float64 at once", observe_agnostic_meta, judge_agnostic_meta),
        Case("the statistics are not parameters", observe_agnostic_parameters, judge_agnostic_parameters),
    ],
    "picklable": [
        Case("a LightningModule with NoisyRegressor's net", observe_picklable_module, judge_picklable_module),
        Case("noise=0.1 by default", observe_picklable_default, judge_picklable_default),
        Case("other noise levels, before and after pickling", observe_picklable_levels, judge_picklable_levels),
        Case("noise=0: only the model", observe_picklable_no_noise, lambda d: judge_picklable(d, 0.0)),
        Case("each module keeps its own noise, pickled or not", observe_own_noise, judge_own_noise),
        Case("the same optimizer", observe_optimizer, judge_optimizer),
    ],
    "effective_batch": [
        Case("every strategy of the table, with nodes and accumulation", observe_batch_strategies, judge_batch_strategies),
        Case("positional arguments and defaults", observe_batch_positional, judge_batch_positional),
        Case("other and removed strategies raise ValueError", observe_batch_strategy_names,
             lambda d: judge_batch(d, ["ValueError"] * 9, [], None)),
        Case("values below 1 raise ValueError, 1 is allowed", observe_batch_below_one, judge_batch_below_one),
        Case("the linear scaling rule, as a float", observe_lr_rule, judge_lr_rule),
    ],
}

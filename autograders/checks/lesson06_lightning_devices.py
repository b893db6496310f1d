"""Hidden checks for lesson 6 (Lightning on many devices). Never released.

Every case whose answer depends on inputs draws them at grading time (``Case.draw``: the text's
boundaries first, then random ones from the whole domain it states): statistics, sizes, dtypes and
devices for AgnosticStandardize; noise levels (ints, 0, by position), inputs, weights and seeds for
SpawnSafeRegressor; the arguments of effective_batch_size and scaled_learning_rate (NumPy ints,
integers above 2**53, counts of 0.5). The references (the module's output, the
augmentation and the loss, the batch size and the rate) live here, on the grader's side only.
"""

import torch

from gpucourse.checks import Case
from gpucourse.checks.lesson06_lightning_devices import outputs_close
from gpucourse.checks.values import describe, rebuild, type_words

from autograders.differential import call, must_raise, outcome, same, shown, unreported

# --- device_agnostic ------------------------------------------------------------------------------
# 1. the same function as Standardize: (x - mean) / std, the read-out self.readout, plus 1, for any
#    number of features and any batch (1 too), statistics given as lists or tuples, floats or ints
# 2. runs on the device the module and its input were moved to (.to(device))
# 3. follows the dtype: .double(), .to(torch.bfloat16), and any other (float16, float32), by .to(dtype)
#    or its shorthand
# 4. the statistics are not parameters: parameters() is the read-out's weight and bias

DTYPES = {"float32": 2.0 ** -23, "float64": 2.0 ** -23, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
# float64 keeps the float32 tolerance: statistics stored as float32 and then moved are as right as float64 ones


def reference_standardize(config):
    """Standardize's output for ``config`` (inputs and weights first rounded to its dtype), in float64,
    with the tolerance that dtype allows: ``(outputs, tolerances)``."""
    dtype = getattr(torch, config["dtype"])

    def held(values):
        return torch.tensor(values, dtype=torch.float64).to(dtype).double()

    x, mean, std = held(config["x"]), held(config["mean"]), held(config["std"])
    weight, bias = held(config["weight"]), float(held([config["bias"]])[0])
    terms = (x - mean) / std * weight
    out = terms.sum(1) + bias + 1
    eps = DTYPES[config["dtype"]]
    scale = terms.abs().sum(1) + abs(bias) + 1
    return out.tolist(), (16 * eps * scale + 1e-5).tolist()


def _agnostic_config(rng, dtype="float32", device="cpu", features=None, batch=None):
    features = features or rng.choice([1, 1, 2, 3, 5, 7, rng.randint(1, 16)])
    batch = batch or rng.choice([1, 1, 2, 4, 13, rng.randint(1, 32)])
    ints = rng.random() < 0.25  # statistics given as ints: torch.tensor makes int64 of them
    mean = [rng.randint(-3, 3) if ints else round(rng.uniform(-3, 3), 4) for _ in range(features)]
    std = [rng.randint(1, 4) if ints else round(rng.uniform(0.25, 4.25), 4) for _ in range(features)]
    return {"mean": mean, "std": std, "as": rng.choice(["list", "list", "tuple"]),
            "x": [[round(rng.uniform(-3, 3), 4) for _ in range(features)] for _ in range(batch)],
            "weight": [round(rng.uniform(-1, 1), 4) for _ in range(features)], "bias": round(rng.uniform(-1, 1), 4),
            "dtype": dtype, "device": device, "move": rng.choice(["to", "shorthand"])}


def draw_agnostic_sizes(rng):
    """1 feature, a batch of 1, both at once, then drawn sizes: float32 on the CPU."""
    return ([_agnostic_config(rng, features=1, batch=4), _agnostic_config(rng, features=7, batch=1),
             _agnostic_config(rng, features=1, batch=1)] + [_agnostic_config(rng) for _ in range(4)])


def _draw_dtype(dtype):
    def draw(rng):
        return [_agnostic_config(rng, dtype) for _ in range(4)]
    draw.__name__ = f"draw_agnostic_{dtype}"
    return draw


def draw_agnostic_meta(rng):
    """The meta device (no data: a tensor left on the CPU fails), with float64 and with drawn dtypes."""
    return [_agnostic_config(rng, "float64", "meta")] + [_agnostic_config(rng, rng.choice(list(DTYPES)), "meta")
                                                          for _ in range(3)]


def observe_agnostic_drawn(ns, configs):
    """Build AgnosticStandardize from each config's statistics, set its read-out's weights, move it to the
    config's device and dtype (by .to or the shorthand: .double(), .half(), .bfloat16(), .float()), and run
    it on an input there: the output's dtype, device, shape and values, and the module's parameter names."""
    import torch
    from gpucourse.checks import answer

    cls = answer(ns, "AgnosticStandardize")
    found = []
    for c in configs:
        mean, std = (c["mean"], c["std"]) if c["as"] == "list" else (tuple(c["mean"]), tuple(c["std"]))
        try:
            model = cls(mean, std)
            with torch.no_grad():
                model.readout.weight.copy_(torch.tensor([c["weight"]]))
                model.readout.bias.fill_(c["bias"])
            names = sorted(name for name, _ in model.named_parameters())
            dtype = getattr(torch, c["dtype"])
            if c["move"] == "shorthand":
                model = getattr(model, {"float64": "double", "float16": "half", "bfloat16": "bfloat16",
                                        "float32": "float"}[c["dtype"]])()
                model = model.to(c["device"])
            else:
                model = model.to(c["device"], dtype)
            x = torch.tensor(c["x"], dtype=dtype).to(c["device"])
            kept = x.clone()
            out = model(x)
            found.append({"dtype": str(out.dtype).removeprefix("torch."), "device": out.device.type,
                          "shape": list(out.shape), "parameters": names,
                          "input_changed": x.device.type != "meta" and not torch.equal(x, kept),
                          "out": None if out.device.type == "meta" else out.detach().double().reshape(-1).tolist()})
        except Exception as error:
            found.append({"error": f"{type(error).__name__}: {str(error)[:200]}"})
    return found


def _moved(c):
    how = (f".to({c['device']!r}, torch.{c['dtype']})" if c["move"] == "to" else
           {"float64": ".double()", "float16": ".half()", "bfloat16": ".bfloat16()", "float32": ".float()"}[c["dtype"]]
           + (f".to({c['device']!r})" if c["device"] != "cpu" else ""))
    return f"{len(c['mean'])} feature(s), a batch of {len(c['x'])}, after {how} with a torch.{c['dtype']} input"


def judge_agnostic_drawn(parameters_only=False):
    def judge(found, configs):
        if not isinstance(found, list) or len(found) != len(configs):
            return "not every module was tried"
        for c, d in zip(configs, found):
            where = _moved(c)
            if "error" in d:
                return f"{where}: {d['error']}"
            if parameters_only:
                if d["parameters"] != ["readout.bias", "readout.weight"]:
                    return ("parameters() must hold the read-out's weight and bias only, not the statistics (even "
                            f"frozen); got {d['parameters']}")
                continue
            if d.get("input_changed"):
                return f"{where} the input batch was changed: Standardize leaves x as it was (no in-place ops on it)"
            if d["dtype"] != c["dtype"]:
                return f"{where} the output is torch.{d['dtype']}: new tensors must follow the input's dtype"
            if d["device"] != c["device"]:
                return f"{where} the output is on {d['device']}: new tensors must follow the input's device"
            if d["shape"] != [len(c["x"]), 1]:
                return f"{where} the output has shape {d['shape']}"
            if d["out"] is not None:
                want, tolerance = reference_standardize(c)
                if len(d["out"]) != len(want) or not all(abs(g - w) <= t for g, w, t in zip(d["out"], want, tolerance)):
                    return f"{where} the output is not (x - mean) / std, the read-out, plus 1"
        return None
    return judge


# --- picklable ----------------------------------------------------------------------------------
# 1. a LightningModule with the same net (nn.Linear(4, 1))
# 2. noise defaults to 0.1
# 3. augment(x) returns x + noise * torch.randn_like(x), for any noise (an int, 0, large), given by
#    name or by position; the noise made like x (its dtype, its device)
# 4. the same training_step: MSE of net(augment(x)).squeeze(-1) against y
# 5. the same optimizer: SGD, lr 0.05, over the module's parameters
# 6. it pickles as ddp_spawn pickles it, and the copy behaves the same (its own noise too)

def reference_augment(x, noise, seed, dtype="float32"):
    """x + noise * torch.randn_like(x), the noise drawn after torch.manual_seed(seed), as float64 values."""
    x = torch.tensor(x, dtype=getattr(torch, dtype))
    draw = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(seed))
    return (x + noise * draw).double().reshape(-1).tolist()


def reference_loss(run):
    """NoisyRegressor's training_step on ``run``'s batch, net weights and seed."""
    x = torch.tensor(run["x"], dtype=torch.float32)
    noise = 0.1 if run["how"] == "default" else run["noise"]
    noisy = (x + noise * torch.randn(x.shape, generator=torch.Generator().manual_seed(run["loss_seed"]))).double()
    weight = torch.tensor(run["weight"], dtype=torch.float32).double().reshape(1, 4)
    bias = float(torch.tensor(run["bias"], dtype=torch.float32))
    return float(((noisy @ weight.T + bias).squeeze(-1) - torch.tensor(run["y"], dtype=torch.float32).double()).pow(2).mean())


def _noise_run(rng, noise=None, how=None, dtype="float32", device="cpu", mode="train"):
    if noise is None:
        noise = rng.choice([round(rng.uniform(0.05, 4.0), 3), rng.randint(1, 5), 0, 0.0, round(rng.uniform(10, 500), 2)])
    how = how or rng.choice(["name", "position"])
    n = rng.randint(1, 8)
    return {"noise": noise, "how": how, "dtype": dtype, "device": device, "mode": mode,
            "x": [[round(rng.uniform(-3, 3), 4) for _ in range(4)] for _ in range(n)],
            "y": [round(rng.uniform(-2, 2), 4) for _ in range(n)],
            "weight": [round(rng.uniform(-1, 1), 4) for _ in range(4)], "bias": round(rng.uniform(-1, 1), 4),
            "seed": rng.randrange(10 ** 6), "loss_seed": rng.randrange(10 ** 6)}


def draw_picklable_default(rng):
    return [_noise_run(rng, how="default") for _ in range(3)]


def draw_picklable_levels(rng):
    """Drawn noise levels (floats, ints, large ones), by name and by position; one module in eval mode (augment
    is the same function in either mode)."""
    return [_noise_run(rng, noise=round(rng.uniform(0.05, 4.0), 3)), _noise_run(rng, noise=rng.randint(1, 5), how="position")] + [
        _noise_run(rng) for _ in range(2)] + [_noise_run(rng, noise=round(rng.uniform(0.05, 4.0), 3), mode="eval")]


def draw_picklable_no_noise(rng):
    """noise=0 and 0.0: the noise is still drawn (randn_like), so the global random stream moves on as with any level."""
    return [_noise_run(rng, noise=0.0, how="name"), _noise_run(rng, noise=0, how="position")]


def _not_float32(rng, low, high):
    """A level float32 does not hold exactly (0.107, say): a level kept in float32 changes a float64 input's noise."""
    while True:
        level = round(rng.uniform(low, high), 3)
        if float(torch.tensor(level, dtype=torch.float32)) != level:
            return level


def draw_picklable_like_x(rng):
    """augment on float64 and float16 input, and on the meta device (no data: a noise made on the CPU fails)."""
    return [_noise_run(rng, dtype="float64", noise=_not_float32(rng, 0.05, 4.0)),
            _noise_run(rng, dtype="float16", noise=round(rng.uniform(0.05, 2), 2)),
            _noise_run(rng, dtype=rng.choice(["float32", "float64"]), device="meta")]


def observe_picklable_runs(ns, runs):
    """Per run: build SpawnSafeRegressor (noise left out, by name or by position), set net's weights, pickle it
    as ddp_spawn does; augment x with the original and the copy (after torch.manual_seed(seed)), and (float32
    on the CPU) training_step's loss after torch.manual_seed(loss_seed); after each augment, the global random
    stream's next values (augment draws its noise from it, whatever the level). Modules of runs in "eval" mode
    are put in eval mode first."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch
    from gpucourse.checks import answer

    cls = answer(ns, "SpawnSafeRegressor")
    found = []
    for run in runs:
        model = cls() if run["how"] == "default" else cls(run["noise"]) if run["how"] == "position" else cls(noise=run["noise"])
        with torch.no_grad():
            model.net.weight.copy_(torch.tensor([run["weight"]]))
            model.net.bias.fill_(run["bias"])
        try:
            clone = pickle.loads(bytes(ForkingPickler.dumps(model)))  # what ddp_spawn does to your module
        except Exception as error:
            found.append({"pickled": f"{type(error).__name__}: {str(error)[:200]}"})
            continue
        x = torch.tensor(run["x"], dtype=getattr(torch, run["dtype"])).to(run["device"])
        record = {"pickled": "ok", "same_weights": bool(torch.equal(model.net.weight, clone.net.weight))}
        if run.get("mode") == "eval":
            model.eval()
            clone.eval()
        for name, m in (("original", model), ("unpickled", clone)):
            torch.manual_seed(run["seed"])
            try:
                out = torch.as_tensor(m.augment(x))
                record[f"{name}_stream_after"] = torch.rand(3, dtype=torch.float64).tolist()
                record[name] = {"dtype": str(out.dtype).removeprefix("torch."), "device": out.device.type,
                                "shape": list(out.shape),
                                "values": None if out.device.type == "meta" else out.detach().double().reshape(-1).tolist()}
            except Exception as error:
                record[name] = f"{type(error).__name__}: {str(error)[:200]}"
        if run["dtype"] == "float32" and run["device"] == "cpu":
            torch.manual_seed(run["loss_seed"])
            model.train()
            loss = model.training_step((x, torch.tensor(run["y"])), 0)
            if isinstance(loss, dict):  # Lightning takes {"loss": loss} as well as the loss itself
                loss = loss.get("loss")
            record["loss"] = float(torch.as_tensor(loss).detach().reshape(-1)[0])
        found.append(record)
    return found


def judge_picklable_runs(found, runs):
    if not isinstance(found, list) or len(found) != len(runs):
        return "not every noise level was tried"
    for run, d in zip(runs, found):
        noise = 0.1 if run["how"] == "default" else run["noise"]
        made = ("SpawnSafeRegressor()" if run["how"] == "default" else f"SpawnSafeRegressor({noise!r})"
                if run["how"] == "position" else f"SpawnSafeRegressor(noise={noise!r})")
        where = f"{made}, a {run['dtype']} input on {run['device']} of {len(run['x'])} rows"
        if d["pickled"] != "ok":
            return f"{where}: pickling the module failed, as it would under ddp_spawn: {d['pickled']}"
        want = None if run["device"] == "meta" else reference_augment(run["x"], noise, run["seed"], run["dtype"])
        tolerance = {"float64": (1e-12, 1e-12), "float32": (1e-6, 1e-5), "float16": (1e-3, 1e-3)}[run["dtype"]]
        for name in ("original", "unpickled"):
            got = d[name]
            if isinstance(got, str):
                return f"{where}: augment(x) raised {got}: the noise made like x (torch.randn_like) follows its device"
            if got["dtype"] != run["dtype"] or got["device"] != run["device"] or got["shape"] != [len(run["x"]), 4]:
                return (f"{where}: augment(x) gave a torch.{got['dtype']} tensor on {got['device']} of shape {got['shape']}: "
                        f"the noise made like x (torch.randn_like) keeps x's dtype, device and shape")
            if want is not None and not outputs_close(got["values"], want, *tolerance):
                if name == "original":
                    mode = " (in eval mode)" if run.get("mode") == "eval" else ""
                    return f"{where}{mode}: augment(x) is not x + noise * torch.randn_like(x)"
                return f"{where}: after a pickle round trip the module behaves differently"
            if d.get(f"{name}_stream_after") != _stream_after(run):
                return (f"{where}: after augment(x) the global random stream is not where torch.randn_like(x) leaves it "
                        "(augment draws the noise whatever its level, 0 too)")
        if not d["same_weights"]:
            return f"{where}: after a pickle round trip the module behaves differently"
        if "loss" in d:
            reference = reference_loss(run)
            if not abs(d["loss"] - reference) <= 1e-5 * max(1.0, abs(reference)):
                return f"{where}: training_step's loss differs from NoisyRegressor's"
    return None


def _stream_after(run):
    """The global random stream's next 3 values after torch.manual_seed(seed) and one torch.randn_like(x)."""
    x = torch.empty(len(run["x"]), 4, dtype=getattr(torch, run["dtype"]), device=run["device"])
    state = torch.get_rng_state()
    try:
        torch.manual_seed(run["seed"])
        torch.randn_like(x)
        return torch.rand(3, dtype=torch.float64).tolist()
    finally:
        torch.set_rng_state(state)


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


def draw_own_noise(rng):
    """Two modules of different noise levels, made one after the other, and their pickled copies."""
    quiet, loud = round(rng.uniform(0.001, 0.05), 4), rng.choice([round(rng.uniform(2, 9), 3), rng.randint(2, 9)])
    return {"levels": [quiet, loud] if rng.random() < 0.5 else [loud, quiet], "rows": rng.randint(1, 6),
            "seed": rng.randrange(10 ** 6)}


def observe_own_noise(ns, inputs):
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch
    from gpucourse.checks import answer

    cls = answer(ns, "SpawnSafeRegressor")
    first, second = (cls(noise=level) for level in inputs["levels"])
    clones = [pickle.loads(bytes(ForkingPickler.dumps(m))) for m in (first, second)]
    x = torch.zeros(inputs["rows"], 4)
    outs = []
    for m in (first, second, *clones):
        torch.manual_seed(inputs["seed"])
        outs.append(torch.as_tensor(m.augment(x)).detach().double().reshape(-1).tolist())
    return outs


def judge_own_noise(outs, inputs):
    if not isinstance(outs, list) or len(outs) != 4:
        return "four modules expected"
    first, second = (reference_augment([[0.0] * 4] * inputs["rows"], level, inputs["seed"]) for level in inputs["levels"])
    levels = inputs["levels"]
    if not (outputs_close(outs[0], first, 1e-6, 1e-5) and outputs_close(outs[1], second, 1e-6, 1e-5)):
        return f"with noise={levels[0]} and then noise={levels[1]}, augment does not add each module's own level of noise"
    if not (outputs_close(outs[2], first, 1e-6, 1e-5) and outputs_close(outs[3], second, 1e-6, 1e-5)):
        return "after a pickle round trip a module augments with another noise level"
    return None


def observe_optimizer(ns):
    from gpucourse.checks import answer
    model = answer(ns, "SpawnSafeRegressor")(noise=0.2)
    configured = returned = model.configure_optimizers()
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
    scheduler = (isinstance(returned, dict) and returned.get("lr_scheduler") is not None) or (
        isinstance(returned, (list, tuple)) and len(returned) > 1 and bool(returned[1]))
    return {"type": type(configured).__name__, "lr": [group["lr"] for group in groups],
            "momentum": [group.get("momentum", 0) for group in groups],
            "others": [{k: v for k, v in group.items() if k in ("weight_decay", "dampening", "nesterov", "maximize")}
                       for group in groups],
            "scheduler": bool(scheduler),
            "all_parameters": ids == sorted(id(p) for p in model.parameters())}


def judge_optimizer(d):
    if d.get("type") != "SGD" or d.get("lr") != [0.05] or d.get("momentum") != [0] or not d.get("all_parameters"):
        return "configure_optimizers must give NoisyRegressor's optimizer, over all of the module's parameters"
    defaults = {"weight_decay": 0, "dampening": 0, "nesterov": False, "maximize": False}
    if any(group.get(k, v) != v for group in d.get("others", []) for k, v in defaults.items()):
        return f"configure_optimizers must give NoisyRegressor's optimizer: SGD(lr=0.05) and nothing else set, got {d['others']}"
    if d.get("scheduler"):
        return "configure_optimizers must give NoisyRegressor's optimizer alone: NoisyRegressor has no learning-rate scheduler"
    return None


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

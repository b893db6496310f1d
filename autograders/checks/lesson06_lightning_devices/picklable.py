"""SpawnSafeRegressor: the references and drawn cases of lesson 6's picklable.
Never released; the package's docstring says how its cases are drawn."""

import torch

from gpucourse.checks.lesson06_lightning_devices import outputs_close


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

"""AgnosticStandardize: the references and drawn cases of lesson 6's device_agnostic.
Never released; the package's docstring says how its cases are drawn."""

import torch


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

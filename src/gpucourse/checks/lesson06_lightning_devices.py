"""Public checks for lesson 6 (Lightning on many devices). Observers are self-contained: see lesson01_processes_threads.py.

The public judges compare with stored values; the hidden checks draw their inputs at grading time and
hold their reference (the module's output, the augmentation, the loss, the batch size) on the grader's side.
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson06_lightning_devices"  # the course folder this module's exercises belong to

# --- Exercise 1: a device-agnostic module -------------------------------------------------------
# The public case sets the read-out's weights itself and compares with outputs stored here, worked out
# by hand from the text's rule ((x - mean) / std, the read-out, plus 1): this module computes none.

AGNOSTIC_X = [[0.5, -1.0, 2.0], [3.0, 0.0, -0.5], [-2.0, -2.5, 1.5], [1.0, -2.0, 0.5], [0.25, 4.0, -3.0]]
AGNOSTIC_READOUT = {"weight": [0.5, -1.0, 2.0], "bias": 0.25}
AGNOSTIC_EXPECTED = [2.125, -4.25, 3.5, 1.25, -17.9375]  # mean [1, -2, 0.5], std [2, 0.5, 1]


def observe_agnostic(ns):
    import torch
    from gpucourse.checks import answer
    from gpucourse.checks.lesson06_lightning_devices import AGNOSTIC_READOUT, AGNOSTIC_X

    mean, std = [1.0, -2.0, 0.5], [2.0, 0.5, 1.0]
    model = answer(ns, "AgnosticStandardize")(mean, std)
    with torch.no_grad():
        model.readout.weight.copy_(torch.tensor([AGNOSTIC_READOUT["weight"]]))
        model.readout.bias.fill_(AGNOSTIC_READOUT["bias"])
    x = torch.tensor(AGNOSTIC_X)
    out = model(x)
    record = {"cpu": {"shape": list(out.shape), "out": out.detach().double().reshape(-1).tolist()},
              "parameters": sorted(name for name, _ in model.named_parameters())}
    twin = answer(ns, "AgnosticStandardize")(mean, std).double()
    try:
        out64 = twin(x.double())
        record["float64"] = {"dtype": str(out64.dtype), "device": str(out64.device)}
    except Exception as error:
        record["float64"] = f"{type(error).__name__}: {str(error)[:200]}"
    try:
        moved = model.to("meta")  # a device with no data: any tensor left on the CPU is an error
        out_meta = moved(torch.randn(5, 3, device="meta"))
        record["meta"] = {"device": str(out_meta.device), "shape": list(out_meta.shape)}
    except Exception as error:
        record["meta"] = f"{type(error).__name__}: {str(error)[:200]}"
    return record


def outputs_close(got: list, want: list, atol: float, rtol: float = 0.0) -> bool:
    return len(got) == len(want) and all(abs(g - w) <= atol + rtol * abs(w) for g, w in zip(got, want))  # NaN fails


def judge_agnostic(d):
    if d["cpu"]["shape"] != [5, 1] or not outputs_close(d["cpu"]["out"], AGNOSTIC_EXPECTED, 1e-5):
        return "on the CPU the output differs from Standardize's: (x - mean) / std, the read-out, plus 1"
    if d["parameters"] != ["readout.bias", "readout.weight"]:
        return f"the statistics must not be parameters; parameters are {d['parameters']}"
    if d["float64"] != {"dtype": "torch.float64", "device": "cpu"}:
        return f"after .double() with float64 input: {d['float64']}"
    if d["meta"] != {"device": "meta", "shape": [5, 1]}:
        return f"after .to(another device) with input on that device: {d['meta']}"
    return None


register("device_agnostic", Case("same function; follows .to(device) and .double()", observe_agnostic, judge_agnostic),
         answers=[Answer("AgnosticStandardize", "class",
                         "an nn.Module class AgnosticStandardize(mean, std) with a read-out layer self.readout")],
         points=2)


# --- Exercise 2: picklable for ddp_spawn -------------------------------------------------------
# The public case: noise 0.3 on zeros(2, 4), so that augment's output is the noise itself, drawn after
# torch.manual_seed(1); the loss with net's weights set here, after torch.manual_seed(2). Both stored.

PICKLE_AUGMENT = [0.1984056532382965, 0.08007723838090897, 0.018503177911043167, 0.18639519810676575,
                  -0.13557179272174835, -0.0498390719294548, -0.45683056116104126, 0.11450517922639847]
PICKLE_NET = {"weight": [0.5, -0.25, 1.0, 0.75], "bias": 0.1}
PICKLE_Y = [0.5, -1.0]
PICKLE_LOSS = 1.5154906511306763


def observe_picklable(ns):
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch
    from gpucourse.checks import answer
    from gpucourse.checks.lesson06_lightning_devices import PICKLE_NET, PICKLE_Y

    model = answer(ns, "SpawnSafeRegressor")(noise=0.3)
    with torch.no_grad():
        model.net.weight.copy_(torch.tensor([PICKLE_NET["weight"]]))
        model.net.bias.fill_(PICKLE_NET["bias"])
    try:
        clone = pickle.loads(bytes(ForkingPickler.dumps(model)))  # what ddp_spawn does to your module
    except Exception as error:
        return {"pickled": f"{type(error).__name__}: {str(error)[:200]}"}
    x, y = torch.zeros(2, 4), torch.tensor(PICKLE_Y)
    results = {}
    for name, m in (("original", model), ("unpickled", clone)):
        torch.manual_seed(1)
        results[name] = torch.as_tensor(m.augment(x)).detach().double().reshape(-1).tolist()
    torch.manual_seed(2)
    loss = model.training_step((x, y), 0)
    if isinstance(loss, dict):  # Lightning takes {"loss": loss} as well as the loss itself
        loss = loss.get("loss")
    return {"pickled": "ok", "augment": results, "same_weights": bool(torch.equal(model.net.weight, clone.net.weight)),
            "loss": float(torch.as_tensor(loss).detach().reshape(-1)[0])}


def judge_picklable(d):
    if d["pickled"] != "ok":
        return f"pickling the module failed, as it would under ddp_spawn: {d['pickled']}"
    if not outputs_close(d["augment"]["original"], PICKLE_AUGMENT, 1e-6, 1e-5):
        return "augment(x) is not x + noise * torch.randn_like(x)"
    if not outputs_close(d["augment"]["unpickled"], PICKLE_AUGMENT, 1e-6, 1e-5) or not d["same_weights"]:
        return "after a pickle round trip the module behaves differently"
    if not abs(d["loss"] - PICKLE_LOSS) <= 1e-5 * max(1.0, abs(PICKLE_LOSS)):
        return "training_step's loss differs from NoisyRegressor's"
    return None


register("picklable", Case("pickles like ddp_spawn does, and behaves the same", observe_picklable, judge_picklable),
         answers=[Answer("SpawnSafeRegressor", "class",
                         "a LightningModule class SpawnSafeRegressor(noise=0.1) with net, augment(x) and training_step")],
         points=2)


# --- Exercise 3: effective batch size and learning rate -------------------------------------------

BATCH_CASES = [
    {"batch_size": 7, "devices": 8, "num_nodes": 1, "strategy": "ddp"},
    {"batch_size": 7, "devices": 8, "num_nodes": 10, "strategy": "ddp_spawn"},
    {"batch_size": 32, "devices": 2, "num_nodes": 1, "strategy": "ddp_notebook", "accumulate_grad_batches": 4},
]


def observe_batch(ns, cases, lr_cases):
    """Each case is keyword arguments (a dict) or positional ones (a list). A batch size is recorded as an
    int only when it is an integer (``56.0`` is "returned a float"); a learning rate only when it is a float."""
    import numbers
    from gpucourse.checks import answer
    effective_batch_size, scaled_learning_rate = answer(ns, "effective_batch_size"), answer(ns, "scaled_learning_rate")

    def call(function, case):
        return function(*case) if isinstance(case, list) else function(**case)

    results = []
    for case in cases:
        try:
            got = call(effective_batch_size, case)
            ok = isinstance(got, numbers.Integral) and not isinstance(got, bool)
            results.append(int(got) if ok else f"returned a value of type {type(got).__name__} ({str(got)[:40]})")
        except ValueError:
            results.append("ValueError")
        except Exception as error:
            results.append(f"raised {type(error).__name__}")
    lrs = []
    for case in lr_cases:
        try:
            got = call(scaled_learning_rate, case)
            lrs.append(float(got) if isinstance(got, float) else f"returned a value of type {type(got).__name__} ({str(got)[:40]})")
        except Exception as error:
            lrs.append(f"raised {type(error).__name__}")
    return {"batch": results, "lr": lrs}


LR_CASES = [{"base_lr": 0.1, "base_batch_size": 256, "effective_batch_size": 1024}]


def judge_batch(d, want_batch, want_lr, cases=None, lr_cases=None):
    if len(d["batch"]) != len(want_batch) or len(d["lr"]) != len(want_lr):
        return "not every case was run"
    for i, (got, want) in enumerate(zip(d["batch"], want_batch)):
        if got != want:
            where = f" for {cases[i]}" if cases else ""
            if isinstance(got, str) and got.startswith("returned a ") and isinstance(want, int):
                return f"effective_batch_size {got}{where}: it must return an int"
            return f"effective_batch_size gave {got!r}{where}; that is not the effective batch size"
    for i, (got, want) in enumerate(zip(d["lr"], want_lr)):
        where = f" for {lr_cases[i]}" if lr_cases else ""
        if isinstance(got, str) and got.startswith("returned a "):
            return f"scaled_learning_rate {got}{where}: it must return a float"
        if not isinstance(got, float) or not abs(got - want) <= 1e-9 * max(1, abs(want)):
            return f"scaled_learning_rate gave {got!r}{where}, not the linearly scaled rate"
    return None


def observe_batch_examples(ns):
    from gpucourse.checks.lesson06_lightning_devices import BATCH_CASES, LR_CASES, observe_batch
    return observe_batch(ns, BATCH_CASES, LR_CASES)


register("effective_batch", Case("the seed's examples and one with accumulation", observe_batch_examples,
                                 lambda d: judge_batch(d, [56, 560, 256], [0.4], BATCH_CASES, LR_CASES)),
         answers=[Answer("effective_batch_size", "function",
                         "a function effective_batch_size(batch_size, devices, num_nodes=1, strategy=\"ddp\", "
                         "accumulate_grad_batches=1) returning samples per optimizer step, an int"),
                  Answer("scaled_learning_rate", "function",
                         "a function scaled_learning_rate(base_lr, base_batch_size, effective_batch_size) "
                         "returning the scaled learning rate, a float")], points=2)

"""Hidden checks for lesson 6 (Lightning on many devices). Never released.

``parse_devices`` meets more inputs, judged against Lightning's parser; the device-agnostic module
meets other shapes and bfloat16; the picklable module other noise levels; the batch-size functions
more strategies, including the ones Lightning removed.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson06 import judge_batch, judge_parse, judge_picklable



# --- parse_devices ------------------------------------------------------------------------------

def observe_more_devices(ns):
    from gpucourse.checks.lesson06 import observe_parse
    cases = [("0", 4), ([], 4), (" 2 ", 4), ("2,", 4), ("0,2", 4), ([2], 4), ([3, 0], 4), (1, 1), (-1, 2),
             ("-1", 1), (-1, 0), (1, 0), ([4], 4), ([1, 1], 4), (-2, 4), ("cpu", 4), (None, 4), (2.0, 4),
             ([1.0], 4), (["1"], 4), (True, 4), (8, 8)]
    return {"cases": [list(c) for c in cases], "results": observe_parse(ns, cases)}


def judge_more_devices(d):
    return judge_parse(d["results"], [tuple(c) for c in d["cases"]])


# --- device_agnostic ------------------------------------------------------------------------------

def observe_agnostic_elsewhere(ns):
    import torch
    from gpucourse.checks import answer

    record = {}
    for features, batch in ((6, 1), (2, 9)):
        mean, std = [0.5 * i for i in range(features)], [1.0 + i for i in range(features)]
        torch.manual_seed(features)
        model = answer(ns, "AgnosticStandardize")(mean, std)
        x = torch.randn(batch, features)
        w, b = model.readout.weight.detach(), model.readout.bias.detach()
        expected = ((x - torch.tensor(mean)) / torch.tensor(std)) @ w.T + b + 1
        key = f"{features}x{batch}"
        try:
            out = model(x)
            record[key] = {"shape": list(out.shape), "close": bool(torch.allclose(out, expected, atol=1e-5))}
        except Exception as error:
            record[key] = f"{type(error).__name__}: {str(error)[:200]}"
        try:
            out16 = model.to(torch.bfloat16)(x.to(torch.bfloat16))
            record[key + " bf16"] = str(out16.dtype)
        except Exception as error:
            record[key + " bf16"] = f"{type(error).__name__}: {str(error)[:200]}"
    return record


def judge_agnostic_elsewhere(d):
    for key, value in d.items():
        if key.endswith("bf16"):
            if value != "torch.bfloat16":
                return f"after .to(torch.bfloat16) with bfloat16 input, got {value}: new tensors must follow the input's dtype"
        elif not isinstance(value, dict) or not value["close"] or value["shape"] != [int(key.split("x")[1]), 1]:
            return f"with {key.split('x')[0]} features and a batch of {key.split('x')[1]}: {value}"
    return None


# --- picklable ----------------------------------------------------------------------------------

def observe_picklable_no_noise(ns):
    from gpucourse.checks.lesson06 import observe_picklable
    return observe_picklable(ns, noise=0.0)


def observe_picklable_more_noise(ns):
    from gpucourse.checks.lesson06 import observe_picklable
    return observe_picklable(ns, noise=2.5)


# --- effective_batch ------------------------------------------------------------------------------

def observe_more_batches(ns):
    from gpucourse.checks.lesson06 import observe_batch
    cases = [
        {"batch_size": 16, "devices": 4, "num_nodes": 2, "strategy": "fsdp"},
        {"batch_size": 16, "devices": 4, "num_nodes": 2, "strategy": "deepspeed", "accumulate_grad_batches": 2},
        {"batch_size": 5, "devices": 1, "num_nodes": 1, "strategy": "ddp"},
        {"batch_size": 7, "devices": 8, "num_nodes": 1, "strategy": "dp"},
        {"batch_size": 7, "devices": 8, "num_nodes": 10, "strategy": "ddp2"},
        {"batch_size": 7, "devices": 8, "num_nodes": 1, "strategy": "horovod"},
        {"batch_size": 7, "devices": 8, "num_nodes": 1, "strategy": "ddp_sharded"},
        {"batch_size": 7, "devices": 0, "num_nodes": 1, "strategy": "ddp"},
        {"batch_size": 7, "devices": 2, "num_nodes": 0, "strategy": "ddp"},
        {"batch_size": 0, "devices": 2, "num_nodes": 1, "strategy": "ddp"},
        {"batch_size": 8, "devices": 2, "num_nodes": 1, "strategy": "ddp", "accumulate_grad_batches": 0},
    ]
    lr_cases = [{"base_lr": 3e-4, "base_batch_size": 64, "effective_batch_size": 32},
                {"base_lr": 0.1, "base_batch_size": 256, "effective_batch_size": 256},
                {"base_lr": 0.02, "base_batch_size": 32, "effective_batch_size": 2048}]
    return observe_batch(ns, cases, lr_cases)


HIDDEN = {
    "parse_devices": [Case("22 more inputs and machines, as Lightning parses them", observe_more_devices, judge_more_devices)],
    "device_agnostic": [Case("other sizes, and bfloat16", observe_agnostic_elsewhere, judge_agnostic_elsewhere)],
    "picklable": [Case("noise=0: only the model", observe_picklable_no_noise, judge_picklable),
                  Case("noise=2.5", observe_picklable_more_noise, judge_picklable)],
    "effective_batch": [Case("other strategies, removed strategies and bad arguments", observe_more_batches,
                             lambda d: judge_batch(d, [128, 256, 5] + ["ValueError"] * 8, [1.5e-4, 0.1, 1.28]))],
}

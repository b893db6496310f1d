"""Hidden checks for lesson 3 (Tensor Cores). Never released; see lesson01's file for the form."""

from gpucourse.checks import Case
from gpucourse.checks.seeded import filled
from gpucourse.checks.lesson03 import observe_case_answers  # same observation, exact judges


# --- pad_mlp --------------------------------------------------------------------------------
# What the exercise text, stub and answer line require:
#  1. `pad_mlp(model, multiple=8)`: 8 when `multiple` is not given, any other multiple when it is
#     -> "widths: ..." (the default, 3, 4, 16)
#  2. every hidden width rounded *up* to a multiple of `multiple` -> "widths: ..." (an already aligned
#     width is its own multiple: it stays, verdict "already aligned")
#  3. input and output widths stay the same (a single layer has no hidden width) -> "widths: ..."
#  4. the new model computes the same function, whatever the activations (sigmoid and softplus are
#     not 0 at 0; LeakyReLU(0.2), ELU(0.5) carry settings) -> "the same function ..."
#  5. Linear layers may have no bias -> "layers without a bias ..."
#  6. the same function in the model's own dtype (float64 in the public check) -> "float32 and
#     bfloat16 models keep their dtype"
#  7. a *new* nn.Sequential; `model` unchanged -> "a new nn.Sequential, the original untouched"

def observe_pad_widths(ns):
    import random

    from torch import nn
    from gpucourse.checks import answer
    from gpucourse.tensor_cores import example_mlp

    rng = random.Random(3)
    # (widths, multiple): None leaves the default; each a few layers (deep copies of modules cost)
    specs = [([15, 9, 20, 3], None), ([64, 100, 7, 50, 10], None), ([20, 24, 9, 2], 16), ([12, 10, 5, 6], 4),
             ([7, 11, 1, 4], 3), ([8, 16, 8], None), ([5, 32, 48, 4], 16), ([7, 3], None)]
    specs += [([rng.randint(1, 40) for _ in range(rng.randint(3, 5))], rng.choice([None, 4, 8, 16])) for _ in range(2)]
    result = []
    for widths, multiple in specs:
        model = example_mlp(widths, rng.choice([nn.ReLU, nn.Tanh, nn.GELU]))
        padded = answer(ns, "pad_mlp")(model) if multiple is None else answer(ns, "pad_mlp")(model, multiple=multiple)
        result.append({"widths": widths, "multiple": multiple,
                       "got": [[m.in_features, m.out_features] for m in padded.modules() if isinstance(m, nn.Linear)]})
    return result


def pad_width_specs():
    """observe_pad_widths' (widths, multiple) pairs, rebuilt here (the same seed)."""
    import random
    rng = random.Random(3)
    specs = [([15, 9, 20, 3], None), ([64, 100, 7, 50, 10], None), ([20, 24, 9, 2], 16), ([12, 10, 5, 6], 4),
             ([7, 11, 1, 4], 3), ([8, 16, 8], None), ([5, 32, 48, 4], 16), ([7, 3], None)]
    specs += [([rng.randint(1, 40) for _ in range(rng.randint(3, 5))], rng.choice([None, 4, 8, 16])) for _ in range(2)]
    return specs


def _rows(d):
    """The observed rows, each given the widths and multiple the judge knows it was asked for; ValueError
    when the observation does not answer exactly those."""
    specs = pad_width_specs()
    if len(d) != len(specs) or any([r["widths"], r["multiple"]] != [w, m] for r, (w, m) in zip(d, specs)):
        raise ValueError("the observation does not answer the generated models")
    return d


def _hidden(widths):
    return widths[1:-1]


def _got_hidden(got):
    return [layer[1] for layer in got[:-1]]


def judge_round_up(d):
    for row in _rows(d):
        m = row["multiple"] or 8
        hidden, got = _hidden(row["widths"]), _got_hidden(row["got"])
        if len(got) != len(hidden):
            return f"widths {row['widths']}: the padded model has {len(row['got'])} Linear layers"
        if any(w % m and (g % m or g < w or g - w >= m) for w, g in zip(hidden, got)):  # aligned ones: judge_aligned
            called = "the default multiple" if row["multiple"] is None else f"multiple={m}"
            return f"with {called}, hidden widths {hidden} became {got}: each must round up to the next multiple"
    return None


def judge_aligned(d):
    for row in _rows(d):
        m = row["multiple"] or 8
        hidden, got = _hidden(row["widths"]), _got_hidden(row["got"])
        if len(got) != len(hidden):
            return f"widths {row['widths']}: the padded model has {len(row['got'])} Linear layers"
        for w, g in zip(hidden, got):
            if w % m == 0 and g != w:
                return f"a hidden width of {w} with multiple={m} is already aligned but became {g}"
    return None


def judge_io(d):
    for row in _rows(d):
        got = row["got"]
        if not got or got[0][0] != row["widths"][0] or got[-1][1] != row["widths"][-1]:
            return (f"widths {row['widths']}: input and output widths must stay as they are, got "
                    f"{got[0][0] if got else None} in and {got[-1][1] if got else None} out")
    return None


def judge_widths(d):  # one observation, three requirements: each says which it is
    return judge_round_up(d) or judge_aligned(d) or judge_io(d)


def observe_pad_function(ns):
    import torch
    from torch import nn
    from gpucourse.checks import answer
    from gpucourse.checks.seeded import filled

    # the judge computes in full float32 precision; the notebook may have set "high" (TF32 or bf16 passes)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        g = torch.Generator().manual_seed(5)
        torch.manual_seed(5)
        models = {
            "sigmoid": nn.Sequential(nn.Linear(6, 9), nn.Sigmoid(), nn.Linear(9, 13), nn.Sigmoid(), nn.Linear(13, 2)),
            "LeakyReLU(0.2) and ELU(0.5)": nn.Sequential(nn.Linear(4, 3), nn.LeakyReLU(0.2), nn.Linear(3, 17), nn.ELU(0.5),
                                                         nn.Linear(17, 5)),
            "softplus(beta=2), multiple=16": nn.Sequential(nn.Linear(3, 21), nn.Softplus(beta=2.0), nn.Linear(21, 1)),
        }
        result = {}
        for name, model in models.items():
            model = filled(model.double(), 5)  # weights no other draw can change: the judge fills the same
            padded = answer(ns, "pad_mlp")(model, **({"multiple": 16} if "16" in name else {}))
            x = 10 * torch.randn(64, model[0].in_features, generator=g, dtype=torch.float64)
            with torch.no_grad():  # the padded model's output: the judge computes the original's itself
                result[name] = padded(x).double().reshape(-1).tolist()
        return result
    finally:
        torch.set_float32_matmul_precision(precision)


PAD_FUNCTION_MODELS = ["sigmoid", "LeakyReLU(0.2) and ELU(0.5)", "softplus(beta=2), multiple=16"]


def pad_function_expected() -> dict:
    """observe_pad_function's models and inputs, rebuilt here (the same seeds): name -> the original
    model's output, flattened. The grader's random state is kept."""
    import torch
    from torch import nn
    g = torch.Generator().manual_seed(5)
    from gpucourse.checks.seeded import global_rng  # the grader's threads share torch's generator
    with global_rng():
        torch.manual_seed(5)
        models = {
            "sigmoid": nn.Sequential(nn.Linear(6, 9), nn.Sigmoid(), nn.Linear(9, 13), nn.Sigmoid(), nn.Linear(13, 2)),
            "LeakyReLU(0.2) and ELU(0.5)": nn.Sequential(nn.Linear(4, 3), nn.LeakyReLU(0.2), nn.Linear(3, 17), nn.ELU(0.5),
                                                         nn.Linear(17, 5)),
            "softplus(beta=2), multiple=16": nn.Sequential(nn.Linear(3, 21), nn.Softplus(beta=2.0), nn.Linear(21, 1)),
        }
    expected = {}
    for name, model in models.items():
        model = filled(model.double(), 5)
        x = 10 * torch.randn(64, model[0].in_features, generator=g, dtype=torch.float64)
        with torch.no_grad():
            expected[name] = model(x).reshape(-1).tolist()
    return expected


def _max_diff(got, want) -> float:
    if not isinstance(got, list) or len(got) != len(want):
        return float("inf")
    return max((abs(a - b) for a, b in zip(got, want)), default=float("inf"))


def judge_function(d):
    expected = pad_function_expected()
    if sorted(d) != sorted(expected):
        return "not every model was padded"
    bad = [name for name, want in expected.items() if not _max_diff(d[name], want) < 1e-9]
    return f"the padded model computes something else with {', '.join(bad)}" if bad else None


def observe_pad_without_bias(ns):
    import torch
    from torch import nn
    from gpucourse.checks import answer
    from gpucourse.checks.seeded import filled

    # the judge computes in full float32 precision; the notebook may have set "high" (TF32 or bf16 passes)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        torch.manual_seed(6)
        models = {
            "no bias anywhere": nn.Sequential(nn.Linear(10, 13, bias=False), nn.GELU(), nn.Linear(13, 5, bias=False)),
            "no bias, then a bias": nn.Sequential(nn.Linear(7, 5, bias=False), nn.Sigmoid(), nn.Linear(5, 11),
                                                  nn.Tanh(), nn.Linear(11, 3, bias=False)),
        }
        g = torch.Generator().manual_seed(6)
        result = {}
        for name, model in models.items():
            model = filled(model.double(), 6)  # weights no other draw can change: the judge fills the same
            padded = answer(ns, "pad_mlp")(model)
            x = torch.randn(16, model[0].in_features, generator=g, dtype=torch.float64)
            with torch.no_grad():
                result[name] = {"out": padded(x).double().reshape(-1).tolist(),
                                "widths": [m.out_features for m in padded.modules() if isinstance(m, nn.Linear)][:-1]}
        return result
    finally:
        torch.set_float32_matmul_precision(precision)


WITHOUT_BIAS_HIDDEN = {"no bias anywhere": [16], "no bias, then a bias": [8, 16]}  # 13 -> 16; 5, 11 -> 8, 16


def without_bias_expected() -> dict:
    """observe_pad_without_bias' models and inputs, rebuilt here: name -> the original model's output."""
    import torch
    from torch import nn
    from gpucourse.checks.seeded import global_rng  # the grader's threads share torch's generator
    with global_rng():
        torch.manual_seed(6)
        models = {
            "no bias anywhere": nn.Sequential(nn.Linear(10, 13, bias=False), nn.GELU(), nn.Linear(13, 5, bias=False)),
            "no bias, then a bias": nn.Sequential(nn.Linear(7, 5, bias=False), nn.Sigmoid(), nn.Linear(5, 11),
                                                  nn.Tanh(), nn.Linear(11, 3, bias=False)),
        }
    g = torch.Generator().manual_seed(6)
    expected = {}
    for name, model in models.items():
        model = filled(model.double(), 6)
        x = torch.randn(16, model[0].in_features, generator=g, dtype=torch.float64)
        with torch.no_grad():
            expected[name] = model(x).reshape(-1).tolist()
    return expected


def judge_without_bias(d):
    if sorted(d) != sorted(WITHOUT_BIAS_HIDDEN):
        return "not every model was padded"
    expected = without_bias_expected()
    for name, r in d.items():
        if r["widths"] != WITHOUT_BIAS_HIDDEN[name]:
            return f"{name}: hidden widths {r['widths']} are not each rounded up to the next multiple of 8"
        if not _max_diff(r["out"], expected[name]) < 1e-9:
            return f"{name}: the padded model computes something else"
    return None


def observe_pad_dtypes(ns):
    import torch
    from torch import nn
    from gpucourse.checks import answer
    from gpucourse.checks.seeded import filled
    from gpucourse.tensor_cores import example_mlp

    # the judge computes in full float32 precision; the notebook may have set "high" (TF32 or bf16 passes)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        g = torch.Generator().manual_seed(7)
        result = {}
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(7)
            model = filled(example_mlp([12, 19, 6, 3], nn.Sigmoid), 7).to(dtype)
            padded = answer(ns, "pad_mlp")(model)
            x = torch.randn(8, 12, generator=g).to(dtype)
            with torch.no_grad():
                out = padded(x)
            result[str(dtype)] = {"params": sorted({str(p.dtype) for p in padded.parameters()}), "out": str(out.dtype),
                                  "values": out.double().reshape(-1).tolist()}
        return result
    finally:
        torch.set_float32_matmul_precision(precision)


def dtypes_expected() -> list[float]:
    """observe_pad_dtypes' float32 model and input, rebuilt here: the original model's output."""
    import torch
    from torch import nn
    from gpucourse.tensor_cores import example_mlp
    from gpucourse.checks.seeded import global_rng  # the grader's threads share torch's generator
    with global_rng():
        torch.manual_seed(7)
        model = filled(example_mlp([12, 19, 6, 3], nn.Sigmoid), 7)
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        return model(x).double().reshape(-1).tolist()


def judge_dtypes(d):
    if sorted(d) != ["torch.bfloat16", "torch.float32"]:
        return "not every dtype was tried"
    for dtype, r in d.items():
        if r["params"] != [dtype] or r["out"] != dtype:
            return f"a {dtype.removeprefix('torch.')} model came back with {', '.join(r['params'])} parameters"
    if not _max_diff(d["torch.float32"]["values"], dtypes_expected()) < 1e-5:
        return "a float32 model: the padded model computes something else"
    return None


def observe_pad_new_model(ns):
    import torch
    from torch import nn
    from gpucourse.checks import answer

    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2, bias=False))
    layers = list(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    padded = answer(ns, "pad_mlp")(model)
    return {"type": f"{type(padded).__module__}.{type(padded).__qualname__}", "same_object": padded is model,
            "layers_kept": list(model) == layers and len(model) == len(layers),
            "widths_kept": [[m.in_features, m.out_features] for m in model if isinstance(m, nn.Linear)] == [[5, 6], [6, 8], [8, 2]],
            "values_kept": model.state_dict().keys() == before.keys()
            and all(torch.equal(before[k], v) for k, v in model.state_dict().items())}


def judge_new_model(d):
    if d["type"] != "torch.nn.modules.container.Sequential":
        return f"return an nn.Sequential, not a {d['type'].rpartition('.')[2]}"
    if d["same_object"]:
        return "return a new model, not the one passed in"
    if not (d["layers_kept"] and d["widths_kept"] and d["values_kept"]):
        return "the original model was changed: build a new one"
    return None


# --- case_answers ---------------------------------------------------------------------------
# What the exercise text and answer line require:
#  1. a dict from each case number 1, 2, 3 (ints) -> the public form check ("cases 1-3, ...")
#  2. each value a set of codes (any collection of str, not a str) -> the public form check
#  3. each code a key of T.CODES -> the public form check
#  4-6. for each case, exactly the codes that apply -> "case 1: ...", "case 2: ...", "case 3: ..."
#     (case 3's 3 input and 1 output channels count either way: the text asks for a justification)

REQUIRED = {
    "1": {"dims_not_multiple_of_8", "input_shape_mismatch", "output_size_mismatch", "no_activation_between_linears"},
    "2": {"input_shape_mismatch", "dataloader_passed_to_model", "batch_not_multiple_of_8"},
    "3": {"missing_comma", "dataloader_passed_to_model", "output_size_mismatch"},
}
OPTIONAL = {"1": set(), "2": set(), "3": {"dims_not_multiple_of_8"}}  # 3 image channels, a 1-channel mask: defensible both ways


def judge_case(case):
    def judge(d):
        if "error" in d:
            return d["error"]
        given = set(d["answers"].get(case, []))
        if not REQUIRED[case] <= given or not given <= REQUIRED[case] | OPTIONAL[case]:
            return f"reconsider the codes of case {case}"
        return None
    return judge


HIDDEN = {
    "pad_mlp": [
        Case("widths: hidden ones rounded up to the next multiple (the default, 3, 4, 16), aligned ones and "
             "input and output kept (a single layer too)", observe_pad_widths, judge_widths),
        Case("the same function with sigmoid, softplus, LeakyReLU(0.2), ELU(0.5)", observe_pad_function, judge_function),
        Case("layers without a bias, alone and mixed", observe_pad_without_bias, judge_without_bias),
        Case("float32 and bfloat16 models keep their dtype", observe_pad_dtypes, judge_dtypes),
        Case("a new nn.Sequential, the original untouched", observe_pad_new_model, judge_new_model),
    ],
    "case_answers": [Case(f"case {case}: the codes that apply", observe_case_answers, judge_case(case)) for case in "123"],
}

"""Hidden checks for lesson 3 (Tensor Cores). Never released; see lesson 1's for the form.

pad_mlp's cases draw their models at grading time (``draw=``): widths, the activation modules between
the Linear layers (their settings drawn too), bias flags, the dtype, ``multiple`` and the weights' seed;
the sandbox builds each model (``gpucourse.checks.lesson03_tensor_cores.build_mlp``: inputs only), pads it with the
answer and reports the padded model's widths, dtypes and output; the judges rebuild the same models
here and compute the original model's output and the padded widths themselves. ``CLAUSES`` (at the end)
maps every clause of the exercise's text to the cases that hold it.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson03_tensor_cores import build_mlp, observe_case_answers  # inputs only; same observation, exact judges
from gpucourse.checks.seeded import global_rng

# --- pad_mlp --------------------------------------------------------------------------------

MULTIPLES = [None, 1, 2, 3, 4, 5, 8, 16, 32, 64]  # None: the default (8), not given


def _activation(rng, name=None):
    """An activation module as ``[name, kwargs]``, its settings drawn (never the defaults)."""
    name = name or rng.choice(["ReLU", "Tanh", "GELU", "Sigmoid", "SiLU", "Softsign", "Mish", "Hardsigmoid", "Identity",
                               "Softplus", "LeakyReLU", "ELU", "CELU", "Hardtanh"])
    settings = {
        "Softplus": lambda: {"beta": rng.choice([0.5, 2.0, 3.0])},
        "LeakyReLU": lambda: {"negative_slope": rng.choice([0.2, -0.3, 0.5, 1.5])},
        "ELU": lambda: {"alpha": rng.choice([0.5, 2.0])},
        "CELU": lambda: {"alpha": rng.choice([0.5, 3.0])},
        "Hardtanh": lambda: {"min_val": rng.choice([-0.5, 0.25]), "max_val": rng.choice([0.75, 2.0])},
    }
    return [name, settings[name]() if name in settings else {}]


def _spec(rng, widths, multiple=None, between=None, bias=None, dtype="float64", scale=1.0, by_position=False):
    """``multiple``: None leaves it out (the default); ``by_position``: pad_mlp(model, multiple), else by keyword."""
    pairs = len(widths) - 2
    return {"widths": widths, "multiple": multiple, "by_position": by_position and multiple is not None, "dtype": dtype,
            "seed": rng.randrange(2 ** 31), "batch": rng.randint(3, 12),
            "scale": scale, "bias": bias if bias is not None else [True for _ in widths[1:]],  # biasless: its own case
            "between": between if between is not None else [[_activation(rng)] for _ in range(max(pairs, 0))]}


def _widths(rng, low=1, high=70):
    return [rng.randint(low, high) for _ in range(rng.randint(3, 5))]


def reference_padded_widths(widths, multiple):
    """Every hidden width rounded up to a multiple of ``multiple`` (8 when not given); input and output kept."""
    m = 8 if multiple is None else multiple
    return [widths[0]] + [-(-w // m) * m for w in widths[1:-1]] + [widths[-1]]


def _words(spec) -> str:
    def one(name, kwargs):
        return f"{name}({', '.join(f'{k}={v}' for k, v in kwargs.items())})"
    acts = [one(*a) for between in spec["between"] for a in between]
    return ", ".join(dict.fromkeys(acts)) or "no activation"


def observe_padded(ns, specs):
    import torch
    from torch import nn

    from gpucourse.checks import answer
    from gpucourse.checks.lesson03_tensor_cores import build_mlp

    # the judges compute in full float32 precision; the notebook may have set "high" (TF32 or bf16 passes)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        found = []
        for spec in specs:
            model, x = build_mlp(spec)
            layers = list(model)
            before = {k: v.clone() for k, v in model.state_dict().items()}
            if spec.get("by_position"):
                padded = answer(ns, "pad_mlp")(model, spec["multiple"])
            else:
                kwargs = {} if spec["multiple"] is None else {"multiple": spec["multiple"]}
                padded = answer(ns, "pad_mlp")(model, **kwargs)
            entry = {"type": f"{type(padded).__module__}.{type(padded).__qualname__}", "same_object": padded is model,
                     "layers_kept": list(model) == layers,
                     "values_kept": model.state_dict().keys() == before.keys()
                     and all(torch.equal(before[k], v) for k, v in model.state_dict().items())}
            if isinstance(padded, nn.Module):
                entry["linears"] = [[m.in_features, m.out_features] for m in padded.modules() if isinstance(m, nn.Linear)]
                entry["params"] = sorted({str(p.dtype).removeprefix("torch.") for p in padded.parameters()})
                try:
                    with torch.no_grad():
                        out = padded(x)
                    entry.update(out_dtype=str(out.dtype).removeprefix("torch."), shape=list(out.shape),
                                 values=out.double().reshape(-1).tolist())
                except Exception as error:
                    entry["error"] = f"{type(error).__name__}: {error}"[:200]
            found.append(entry)
        return found
    finally:
        torch.set_float32_matmul_precision(precision)


def _expected_output(spec):
    import torch

    with global_rng():  # nn.Linear draws its first weights from the global generator: judges run in threads
        model, x = build_mlp(spec)
    with torch.no_grad():
        return model(x).double().reshape(-1).tolist()


TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "bfloat16": 2 ** -4, "float16": 2 ** -7}


def _count(found, specs):
    if not isinstance(found, list) or len(found) != len(specs):
        return "not every model was padded"
    for got in found:
        if "linears" not in got:
            return f"return an nn.Sequential, not a {got['type'].rpartition('.')[2]}"
    return None


def _judge_widths(found, specs):
    for spec, got in zip(specs, found):
        widths, m = spec["widths"], spec["multiple"] or 8
        called = "the default multiple" if spec["multiple"] is None else \
            f"pad_mlp(model, {m})" if spec.get("by_position") else f"multiple={m}"
        want = reference_padded_widths(widths, spec["multiple"])
        chain = [got["linears"][0][0]] + [out for _, out in got["linears"]] if got["linears"] else []
        if len(got["linears"]) != len(widths) - 1:
            return f"widths {widths}: the padded model has {len(got['linears'])} Linear layers"
        hidden, new = widths[1:-1], chain[1:-1]
        for w, g, expected in zip(hidden, new, want[1:-1]):
            if w % m and g != expected:
                return f"with {called}, hidden widths {hidden} became {new}: each must round up to the next multiple"
        for w, g in zip(hidden, new):
            if w % m == 0 and g != w:
                return f"a hidden width of {w} with {called} is already aligned but became {g}"
        if chain[0] != widths[0] or chain[-1] != widths[-1]:
            return (f"widths {widths}: input and output widths must stay as they are, got "
                    f"{chain[0]} in and {chain[-1]} out")
    return None


def _judge_function(found, specs):
    for spec, got in zip(specs, found):
        if "error" in got:
            return f"the padded model raised {got['error']} (with {_words(spec)})"
        want = _expected_output(spec)
        tolerance = TOLERANCE[spec["dtype"]]
        values = got.get("values")
        if values is None or len(values) != len(want) or not all(
                abs(a - b) <= tolerance * max(1.0, abs(b)) for a, b in zip(values, want)):  # NaN is never close
            return f"the padded model computes something else with {_words(spec)}"
    return None


def draw_pad_widths(rng):
    """The default multiple, multiple=16 (by keyword, then by position), 1 (nothing to pad), 3 and 5 (not
    powers of two), drawn ones up to 64 (by keyword or position); a single Linear layer (no hidden width), a
    hidden width of 1, widths already aligned."""
    specs = [_spec(rng, [rng.randint(1, 30), rng.choice([9, 13, 20, 30]), rng.choice([3, 17, 33]), rng.randint(1, 9)], 16),
             _spec(rng, [rng.randint(1, 30), rng.choice([9, 13, 20, 30]), rng.choice([3, 17, 33]), rng.randint(1, 9)], 16,
                   by_position=True),
             _spec(rng, _widths(rng), None),
             _spec(rng, [rng.randint(1, 9), rng.randint(1, 9)], rng.choice(MULTIPLES)),
             _spec(rng, [5, 1, rng.randint(2, 40), 4], rng.choice([None, 3, 4])),
             _spec(rng, [7, 24, 48, 2], rng.choice([None, 8, 16])),
             _spec(rng, _widths(rng), 1),
             _spec(rng, _widths(rng), rng.choice([3, 5])),
             _spec(rng, [12, 10, 5, 6], 4)]
    specs += [_spec(rng, _widths(rng), rng.choice(MULTIPLES), by_position=rng.random() < 0.5) for _ in range(3)]
    return specs


def judge_pad_widths(found, specs):
    return _count(found, specs) or _judge_widths(found, specs)


def draw_pad_function(rng):
    """Activations not 0 at 0 (Sigmoid, Softplus, Hardsigmoid), carrying settings (LeakyReLU, ELU, CELU,
    Hardtanh, drawn), two activation modules in a row, inputs far from 0; then drawn models."""
    specs = [_spec(rng, [6, rng.choice([9, 10, 13]), rng.choice([13, 21]), 2], None,
                   between=[[_activation(rng, "Sigmoid")], [_activation(rng, "Sigmoid")]], scale=10.0),
             _spec(rng, [4, 3, 17, 5], rng.choice([None, 4]),
                   between=[[_activation(rng, "LeakyReLU")], [_activation(rng, "ELU")]], scale=10.0),
             _spec(rng, [3, 21, rng.randint(2, 9)], 16,
                   between=[[_activation(rng, "Softplus"), _activation(rng, rng.choice(["Tanh", "Hardsigmoid"]))]],
                   scale=10.0),
             _spec(rng, [5, 11, 6, 3], rng.choice(MULTIPLES[1:]),
                   between=[[_activation(rng, "CELU")], [_activation(rng, "Hardtanh"), _activation(rng)]], scale=10.0)]
    specs += [_spec(rng, _widths(rng, high=40), rng.choice(MULTIPLES), scale=rng.choice([1.0, 10.0])) for _ in range(3)]
    return specs


def judge_pad_function(found, specs):
    return _count(found, specs) or _judge_function(found, specs)


def draw_pad_without_bias(rng):
    """No bias anywhere, then mixed (a biased layer between biasless ones, and the other way round)."""
    specs = [_spec(rng, [10, 13, 5], None, bias=[False, False]),
             _spec(rng, [7, 5, 11, 3], None, bias=[False, True, False]),
             _spec(rng, [9, 6, 3], rng.choice(MULTIPLES), bias=[True, False])]
    specs += [_spec(rng, _widths(rng, high=30), rng.choice(MULTIPLES), bias=[rng.random() < 0.5 for _ in range(4)])
              for _ in range(2)]
    for spec in specs[-2:]:
        spec["bias"] = spec["bias"][:len(spec["widths"]) - 1]
    return specs


def judge_pad_without_bias(found, specs):
    return _count(found, specs) or _judge_widths(found, specs) or _judge_function(found, specs)


def draw_pad_dtypes(rng):
    """float32, bfloat16 and float16 models (and float64), widths drawn."""
    return [_spec(rng, _widths(rng, high=30), rng.choice(MULTIPLES), dtype=dtype)
            for dtype in ("float32", "bfloat16", "float16", "float64")]


def judge_pad_dtypes(found, specs):
    problem = _count(found, specs)
    if problem:
        return problem
    for spec, got in zip(specs, found):
        dtype = spec["dtype"]
        if "error" in got:
            return f"a {dtype} model: the padded model raised {got['error']}"
        if got["params"] != [dtype] or got["out_dtype"] != dtype:
            return f"a {dtype} model came back with {', '.join(got['params'])} parameters"
    problem = _judge_function(found, specs)
    return f"in the model's dtype: {problem}" if problem else None


def draw_pad_new_model(rng):
    return [_spec(rng, _widths(rng, high=30), rng.choice(MULTIPLES), dtype=rng.choice(["float64", "float32"]))
            for _ in range(2)]


def judge_pad_new_model(found, specs):
    if not isinstance(found, list) or len(found) != len(specs):
        return "not every model was padded"
    for got in found:
        if got["type"] != "torch.nn.modules.container.Sequential":
            return f"return an nn.Sequential, not a {got['type'].rpartition('.')[2]}"
        if got["same_object"]:
            return "return a new model, not the one passed in"
        if not (got["layers_kept"] and got["values_kept"]):
            return "the original model was changed: build a new one"
    return None


HIDDEN = {
    "pad_mlp": [
        Case("widths: hidden ones rounded up to the next multiple (the default, 16, 1, 3 or 5, drawn; given by keyword "
             "or by position), aligned ones and input and output kept (a single layer too)", observe_padded, judge_pad_widths,
             draw=draw_pad_widths),
        Case("the same function whatever the activations (not 0 at 0, with settings, two in a row)", observe_padded,
             judge_pad_function, draw=draw_pad_function),
        Case("layers without a bias, alone and mixed", observe_padded, judge_pad_without_bias, draw=draw_pad_without_bias),
        Case("float32, bfloat16 and float16 models keep their dtype", observe_padded, judge_pad_dtypes, draw=draw_pad_dtypes),
        Case("a new nn.Sequential, the original untouched", observe_padded, judge_pad_new_model, draw=draw_pad_new_model),
    ],
}

_PAD = [case.name for case in HIDDEN["pad_mlp"]]
_PUBLIC = "15-30-20-3 with ReLU: widths, same function, original untouched"
CLAUSES = {
    "pad_mlp": {
        "pad_mlp(model, multiple=8): 8 when multiple is not given, any other multiple when it is (by keyword or by position)":
            [_PUBLIC, _PAD[0]],
        "every hidden width rounded up to a multiple of multiple (an aligned one stays)": [_PUBLIC, _PAD[0], _PAD[2]],
        "the input and output widths stay the same": [_PUBLIC, _PAD[0]],
        "the new model computes the same function as the old one": [_PUBLIC, _PAD[1]],
        "whatever its activations (any, some carrying settings, between the Linear layers)": [_PAD[1]],
        "in the model's dtype": [_PAD[3]],
        "Linear layers may have no bias": [_PAD[2]],
        "returns a new model (an nn.Sequential); model left unchanged": [_PUBLIC, _PAD[4]],
    },
}


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


HIDDEN["case_answers"] = [Case(f"case {case}: the codes that apply", observe_case_answers, judge_case(case)) for case in "123"]

"""Public checks for lesson 3 (Tensor Cores). Observers are self-contained: see lesson01_processes_threads.py."""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson03_tensor_cores"  # the course folder this module's exercises belong to


# Activation modules by name, for the models a check builds (``build_mlp``): each with the settings it carries.
ACTIVATIONS = ("ReLU", "Tanh", "GELU", "Sigmoid", "SiLU", "Softsign", "Mish", "Hardsigmoid", "Identity", "Softplus",
               "LeakyReLU", "ELU", "CELU", "Hardtanh")


def build_mlp(spec: dict):
    """The model and input a spec describes (inputs only: what the padded model must compute is the
    judges' business): ``widths``; ``bias``, one flag per Linear layer; ``between``, per pair of Linear
    layers the activation modules between them (``[name, kwargs]``, names from ACTIVATIONS); ``dtype``;
    weights drawn from ``seed`` (``seeded.filled``, the same everywhere) and an input of ``batch`` rows."""
    import torch
    from torch import nn

    from gpucourse.checks.seeded import filled

    widths, layers = spec["widths"], []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b, bias=spec["bias"][i], dtype=torch.float64))
        if i < len(widths) - 2:
            layers += [getattr(nn, name)(**kwargs) for name, kwargs in spec["between"][i]]
    model = filled(nn.Sequential(*layers), spec["seed"]).to(getattr(torch, spec["dtype"]))
    generator = torch.Generator().manual_seed(spec["seed"])
    x = (spec.get("scale", 1.0) * torch.randn(spec["batch"], widths[0], generator=generator, dtype=torch.float64))
    return model, x.to(getattr(torch, spec["dtype"]))


def observe_pad_mlp(ns):
    import torch
    from torch import nn
    from gpucourse.checks import answer
    from gpucourse.tensor_cores import example_mlp

    torch.manual_seed(0)
    model = example_mlp([15, 30, 20, 3]).double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    padded = answer(ns, "pad_mlp")(model)
    x = torch.randn(16, 15, dtype=torch.float64)
    with torch.no_grad():
        diff = (padded(x) - model(x)).abs().max().item()
    return {"widths": [[m.in_features, m.out_features] for m in padded.modules() if isinstance(m, nn.Linear)],
            "diff": diff, "unchanged": all(torch.equal(before[k], v) for k, v in model.state_dict().items())}


def _judge_pad_mlp(d):
    if d["widths"] != [[15, 32], [32, 24], [24, 3]]:
        return f"widths 15-30-20-3 should become 15-32-24-3, got {d['widths']}"
    if not d["diff"] < 1e-9:
        return f"the padded model computes something else (max difference {d['diff']:.3g})"
    return None if d["unchanged"] else "the original model was changed: build a new one"


register("pad_mlp", Case("15-30-20-3 with ReLU: widths, same function, original untouched", observe_pad_mlp, _judge_pad_mlp),
         answers=[Answer("pad_mlp", "function",
                         "a function pad_mlp(model, multiple=8) returning a new nn.Sequential with padded hidden widths")],
         points=2)


def observe_case_answers(ns):
    from gpucourse.checks import answer
    from gpucourse.tensor_cores import CODES

    answers = answer(ns, "case_answers")
    out = {}
    if any(type(case) is not int for case in answers):
        return {"error": f"the case numbers must be ints 1, 2, 3, got {sorted(map(repr, answers))}"}
    for case, codes in answers.items():
        if isinstance(codes, (str, bytes)) or not hasattr(codes, "__iter__"):
            return {"error": f"case {case!r}: give a set of codes, not a {type(codes).__name__}"}
        out[str(case)] = sorted(str(c) for c in codes)
    unknown = sorted({c for codes in out.values() for c in codes} - set(CODES))
    return {"answers": out, "unknown": unknown}


def _judge_case_form(d):
    if "error" in d:
        return d["error"]
    if sorted(d["answers"]) != ["1", "2", "3"]:
        return f"answer cases 1, 2 and 3, got {sorted(d['answers'])}"
    return f"unknown codes {d['unknown']}: use the keys of CODES" if d["unknown"] else None


def _every_set_of_codes() -> list[set[str]]:
    """Every set of T.CODES' keys, the empty one included: the form of one case's answer."""
    import itertools

    from gpucourse.tensor_cores import CODES

    codes = sorted(CODES)
    return [set(c) for r in range(len(codes) + 1) for c in itertools.combinations(codes, r)]


register("case_answers", Case("cases 1-3, each a set of known codes", observe_case_answers, _judge_case_form),
         answers=[Answer("case_answers", "dict",
                         "a dict from each case number 1, 2, 3 (ints) to a set of codes, each code a str key of T.CODES")],
         points=2, kind="answer", choices=lambda solution: {k: _every_set_of_codes() for k in solution})

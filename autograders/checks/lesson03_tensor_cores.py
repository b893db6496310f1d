"""Hidden checks for lesson 3 (Tensor Cores). Never released; see lesson01's file for the form."""

from gpucourse.checks import Case
from gpucourse.checks.lesson03 import observe_case_answers  # same observation, exact judge



def observe_pad_mlp_everywhere(ns):
    import torch
    from torch import nn
    from gpucourse.checks import answer
    from gpucourse.tensor_cores import example_mlp

    torch.manual_seed(1)
    models = {
        "sigmoid 64-100-7-50-10": (example_mlp([64, 100, 7, 50, 10], nn.Sigmoid), 64, {}),
        "tanh, multiple=16": (example_mlp([20, 24, 9], nn.Tanh), 20, {"multiple": 16}),
        "no bias, gelu": (nn.Sequential(nn.Linear(10, 13, bias=False), nn.GELU(), nn.Linear(13, 5, bias=False)), 10, {}),
        "already aligned": (example_mlp([8, 16, 8]), 8, {}),
    }
    result = {}
    for name, (model, width, kwargs) in models.items():
        model = model.double()
        padded = answer(ns, "pad_mlp")(model, **kwargs)
        x = torch.randn(32, width, dtype=torch.float64)
        with torch.no_grad():
            diff = (padded(x) - model(x)).abs().max().item()
        result[name] = {"widths": [[m.in_features, m.out_features] for m in padded.modules() if isinstance(m, nn.Linear)],
                        "diff": diff}
    return result


WIDTHS = {
    "sigmoid 64-100-7-50-10": [[64, 104], [104, 8], [8, 56], [56, 10]],
    "tanh, multiple=16": [[20, 32], [32, 9]],
    "no bias, gelu": [[10, 16], [16, 5]],
    "already aligned": [[8, 16], [16, 8]],
}


def judge_pad_mlp_everywhere(d):
    for name, widths in WIDTHS.items():
        if d[name]["widths"] != widths:
            return f"{name}: wrong widths"
        if not d[name]["diff"] < 1e-9:
            return f"{name}: the padded model computes something else"
    return None


REQUIRED = {
    "1": {"dims_not_multiple_of_8", "input_shape_mismatch", "output_size_mismatch", "no_activation_between_linears"},
    "2": {"input_shape_mismatch", "dataloader_passed_to_model", "batch_not_multiple_of_8"},
    "3": {"missing_comma", "dataloader_passed_to_model", "output_size_mismatch"},
}
OPTIONAL = {"1": set(), "2": set(), "3": {"dims_not_multiple_of_8"}}  # 3 image channels, a 1-channel mask: defensible both ways


def judge_cases(d):
    if "error" in d:
        return d["error"]
    wrong = []
    for case, required in REQUIRED.items():
        given = set(d["answers"].get(case, []))
        if not required <= given or not given <= required | OPTIONAL[case]:
            wrong.append(case)
    return f"reconsider case(s) {', '.join(wrong)}" if wrong else None


HIDDEN = {
    "pad_mlp": [Case("sigmoid, tanh with multiple=16, no bias, already aligned", observe_pad_mlp_everywhere, judge_pad_mlp_everywhere)],
    "case_answers": [Case("the three cases", observe_case_answers, judge_cases)],
}

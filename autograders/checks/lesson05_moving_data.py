"""Hidden checks for lesson 5 (moving data). Never released; see lesson01's file for the form."""

from gpucourse.checks import Case
from gpucourse.checks.lesson05 import observe_loader_settings  # same observation, exact judge



def observe_to_device_shapes(ns):
    import torch
    from gpucourse.checks import answer
    from gpucourse.checks.lesson05 import recording_moves

    with recording_moves() as (pinned_ids, calls):
        nested = [torch.full((1,), 1.0), [torch.full((1,), 2.0), (torch.full((1,), 3.0),)]]
        pinned_ids.add(id(nested[1][0]))
        moved = answer(ns, "to_device")(nested, "cuda:0")
        result = {"types": [type(moved).__name__, type(moved[1]).__name__, type(moved[1][1]).__name__],
                  "calls": sorted(calls, key=lambda c: c["leaf"])}
        calls.clear()
        single = torch.full((1,), 9.0)
        pinned_ids.add(id(single))
        answer(ns, "to_device")(single, torch.device("cuda"))
        result["single"] = list(calls)
    return result


def judge_to_device_shapes(d):
    if d["types"] != ["list", "list", "tuple"]:
        return "lists stay lists and tuples stay tuples, at every depth"
    if [(c["leaf"], c["non_blocking"]) for c in d["calls"]] != [(1.0, False), (2.0, True), (3.0, False)]:
        return "a nested list to 'cuda:0': non_blocking only for the pinned tensor"
    if [c["non_blocking"] for c in d["single"]] != [True]:
        return "a single pinned tensor must move with non_blocking=True"
    return None


def observe_channels_last_deeper(ns):
    import torch
    from torch import nn
    from gpucourse.checks import answer

    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 8, 1),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2)).eval()
    images = torch.randn(4, 3, 12, 12)
    original_strides = images.stride()
    with torch.no_grad():
        expected = model(images)
    new_model, new_images = answer(ns, "to_channels_last")(model, images)
    with torch.no_grad():
        out = new_model(new_images)
    return {"nhwc": bool(new_images.is_contiguous(memory_format=torch.channels_last)),
            "weights": [bool(m.weight.is_contiguous(memory_format=torch.channels_last)) for m in new_model.modules()
                        if isinstance(m, nn.Conv2d)],
            "original_untouched": images.stride() == original_strides, "diff": float((out - expected).abs().max())}


def judge_channels_last_deeper(d):
    if not d["nhwc"] or not all(d["weights"]):
        return "with BatchNorm, 1×1 convolutions and a Linear head, images and conv weights must be channels-last"
    if d["diff"] >= 1e-5:
        return "the converted model computes something else"
    return None if d["original_untouched"] else "the caller's images tensor was changed"


def judge_loader_settings(d):
    if "error" in d:
        return d["error"]
    wrong = []
    a, b, c, dd = (d.get(k, {}) for k in "abcd")
    if not (a.get("pin_memory") and 4 <= a.get("num_workers", -1) <= 8):
        wrong.append("a")
    if b.get("pin_memory") or b.get("num_workers") != 0:
        wrong.append("b")
    if c.get("pin_memory") or c.get("num_workers") != 0:
        wrong.append("c")
    if not (dd.get("pin_memory") and 2 <= dd.get("num_workers", -1) <= 4 and dd.get("persistent_workers")):
        wrong.append("d")
    return f"reconsider scenario(s) {', '.join(wrong)}" if wrong else None


HIDDEN = {
    "to_device": [Case("nested lists and tuples, a device string, a single tensor", observe_to_device_shapes, judge_to_device_shapes)],
    "to_channels_last": [Case("BatchNorm, 1×1 convolutions, a Linear head", observe_channels_last_deeper, judge_channels_last_deeper)],
    "loader_settings": [Case("the four scenarios", observe_loader_settings, judge_loader_settings)],
}

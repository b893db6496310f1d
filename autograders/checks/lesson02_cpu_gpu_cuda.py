"""Hidden checks for lesson 2 (CPU vs GPU, and CUDA). Never released; see lesson01's file for the form."""

from gpucourse.checks import Case
from gpucourse.checks.lesson02 import observe_sync_lines  # same observation, exact judge



def observe_positions_everywhere(ns):
    import torch
    from gpucourse.checks import answer
    result = {}
    for device, dtype in [("cpu", torch.float64), ("cpu", torch.bfloat16), ("meta", torch.bfloat16), ("meta", torch.float32)]:
        x = torch.ones(3, 8, 2, device=device, dtype=dtype)
        out = answer(ns, "add_positions")(x)
        entry = {"device": str(out.device), "dtype": str(out.dtype), "shape": list(out.shape)}
        if device == "cpu":
            entry["values"] = out.float()[:, :, 1].tolist()
        result[f"{device}/{dtype}"] = entry
    return result


def judge_positions_everywhere(d):
    for key, entry in d.items():
        device, dtype = key.split("/")
        if (entry["device"], entry["dtype"], entry["shape"]) != (device, dtype, [3, 8, 2]):
            return f"for x on {device} as {dtype} the result was {entry['device']}/{entry['dtype']}/{entry['shape']}"
    expected = [1 + j / 8 for j in range(8)]
    for key in ("cpu/torch.float64", "cpu/torch.bfloat16"):
        rows = d[key]["values"]
        tolerance = 1e-9 if "64" in key else 1e-2
        if any(abs(a - b) > tolerance for row in rows for a, b in zip(row, expected)):
            return f"wrong values for {key.split('/')[1]}"
    return None


def observe_measure_in_detail(ns):
    from gpucourse.checks import answer
    from gpucourse.cuda import AsyncDevice
    result = {}
    for warmup, repeats, work in [(2, 5, 0.02), (3, 4, 0.03)]:
        device = AsyncDevice()
        seconds = answer(ns, "measure")(lambda: device.launch(work), device.synchronize, warmup=warmup, repeats=repeats)
        result[f"{warmup}/{repeats}/{work}"] = {"seconds": float(seconds), "launches": device.launches}
    return result


def judge_measure_in_detail(d):
    for key, entry in d.items():
        warmup, repeats, work = key.split("/")
        if entry["launches"] != int(warmup) + int(repeats):
            return f"with warmup={warmup}, repeats={repeats} the code should run {int(warmup) + int(repeats)} times, ran {entry['launches']}"
        if not 0.6 * float(work) <= entry["seconds"] <= 1.8 * float(work):
            return f"measured {1000 * entry['seconds']:.1f} ms per call for {1000 * float(work):.0f} ms of work (warm-up and synchronization?)"
    return None


SYNC_LINES = {4, 6, 8, 10, 11, 13}


def judge_sync_lines(d):
    if "error" in d:
        return d["error"]
    chosen = set(d["lines"])
    missed, extra = len(SYNC_LINES - chosen), len(chosen - SYNC_LINES)
    return None if not missed and not extra else f"{missed} synchronizing line(s) missed, {extra} line(s) that do not synchronize"


HIDDEN = {
    "add_positions": [Case("float64, bfloat16 and meta inputs", observe_positions_everywhere, judge_positions_everywhere)],
    "measure": [Case("warm-up count, repeats and other work sizes", observe_measure_in_detail, judge_measure_in_detail)],
    "sync_lines": [Case("the synchronizing lines", observe_sync_lines, judge_sync_lines)],
}

"""Public checks for lesson 5 (moving data). Observers are self-contained: see lesson01_processes_threads.py.

``to_device`` is observed without a GPU: the observer records every ``Tensor.to``/``Tensor.cuda``
call (device and ``non_blocking``) and answers "pinned" for the tensors it marked, since real pinning
needs an NVIDIA driver.
"""

from __future__ import annotations

import contextlib

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson05_moving_data"  # the course folder this module's exercises belong to


@contextlib.contextmanager
def recording_moves():
    """Record every ``Tensor.to``/``Tensor.cuda`` call; "cuda" copies are stood in for by clones.

    Yields ``(pinned_ids, calls)``: put ``id(t)`` in ``pinned_ids`` to make ``t.is_pinned()`` true;
    ``calls`` collects ``{"leaf", "device", "non_blocking"}`` (leaf: the tensor's first value).
    """
    import torch

    pinned_ids, calls = set(), []
    real_to, real_cuda, real_is_pinned = torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.is_pinned

    def fake_to(self, *args, **kwargs):
        device = kwargs.get("device", args[0] if args else None)
        blocking = kwargs.get("non_blocking", next((a for a in args[1:] if isinstance(a, bool)), False))
        calls.append({"leaf": float(self.flatten()[0]) if self.numel() else None, "device": str(device),
                      "non_blocking": bool(blocking)})
        if str(device).startswith("cuda"):
            return self.clone()
        return real_to(self, *args, **{k: v for k, v in kwargs.items() if k != "non_blocking"})

    torch.Tensor.to = fake_to
    torch.Tensor.cuda = lambda self, device=None, non_blocking=False, **k: fake_to(self, "cuda", non_blocking=non_blocking)
    torch.Tensor.is_pinned = lambda self, *a, **k: id(self) in pinned_ids
    try:
        yield pinned_ids, calls
    finally:
        torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.is_pinned = real_to, real_cuda, real_is_pinned


def observe_to_device(ns):
    import torch
    from gpucourse.checks import answer
    from gpucourse.checks.lesson05_moving_data import recording_moves

    batch = {"x": torch.full((2, 2), 1.0), "pair": (torch.full((3,), 2.0), torch.full((1,), 3.0)), "name": "b0", "index": 7}
    with recording_moves() as (pinned_ids, calls):
        pinned_ids.update({id(batch["x"]), id(batch["pair"][0])})
        moved = answer(ns, "to_device")(batch, torch.device("cuda"))
        to_gpu = list(calls)
        calls.clear()
        back = answer(ns, "to_device")({"y": torch.full((2,), 4.0)}, torch.device("cpu"))
        to_cpu = list(calls)
    return {"gpu_calls": sorted(to_gpu, key=lambda c: c["leaf"] or 0), "cpu_calls": to_cpu,
            "structure": {"type": type(moved).__name__, "keys": sorted(moved) if isinstance(moved, dict) else None,
                          "pair_type": type(moved["pair"]).__name__ if isinstance(moved, dict) and "pair" in moved else None,
                          "name": moved.get("name") if isinstance(moved, dict) else None,
                          "index": moved.get("index") if isinstance(moved, dict) else None,
                          "back_type": type(back).__name__}}


def _judge_to_device(d):
    s = d["structure"]
    if s["type"] != "dict" or s["keys"] != ["index", "name", "pair", "x"] or s["pair_type"] != "tuple":
        return f"the batch's structure changed: {s}"
    if s["name"] != "b0" or s["index"] != 7:
        return "values that are not tensors must come back unchanged"
    flags = {c["leaf"]: c["non_blocking"] for c in d["gpu_calls"] if c["device"].startswith("cuda")}
    if sorted(flags) != [1.0, 2.0, 3.0]:
        return f"every tensor must be moved to the GPU once with .to(device, ...), saw {d['gpu_calls']}"
    if flags != {1.0: True, 2.0: True, 3.0: False}:
        return "non_blocking=True exactly for pinned tensors going to a CUDA device"
    if any(c["non_blocking"] for c in d["cpu_calls"]):
        return "a copy to the CPU must block: the values are read right after"
    return None


register("to_device", Case("a nested batch to CUDA (two pinned tensors, one not) and back", observe_to_device, _judge_to_device),
         answers=[Answer("to_device", "function",
                         "a function to_device(batch, device) returning the same structure with every tensor moved")],
         points=2)


def observe_loader_settings(ns):
    from gpucourse.checks import answer
    settings = answer(ns, "loader_settings")

    def _refused(settings: dict) -> str | None:  # nested: an observer is self-contained
        """What DataLoader says to ``settings`` as given, other keys too (``prefetch_factor`` with no workers is
        refused, as is a key it does not take), or None where it takes them."""
        import warnings

        from torch.utils.data import DataLoader
        try:
            with warnings.catch_warnings():  # "will create 8 worker processes": this machine's cores are not the scenario's
                warnings.simplefilter("ignore")
                DataLoader(range(4), **{str(k): v for k, v in settings.items()})
        except Exception as e:  # noqa: BLE001 - whatever DataLoader raises is its refusal, named to the student
            return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        return None

    out = {}
    for key, value in settings.items():
        if not isinstance(value, dict):
            return {"error": f"scenario {key!r}: give a dict of settings"}
        if not isinstance(key, str):
            return {"error": f"scenario {key!r}: the scenario keys are the strs \"a\" to \"d\""}
        out[key] = {name: {"type": type(value[name]).__name__ if name in value else "missing",
                           "value": value[name] if type(value.get(name)) in (bool, int) else None}
                    for name in ("pin_memory", "num_workers", "persistent_workers")}
        out[key]["refused"] = _refused(value)
    return out


def _judge_loader_form(d):
    if "error" in d:
        return d["error"]
    if sorted(d) != ["a", "b", "c", "d"]:
        return f"answer scenarios a-d, got {sorted(d)}"
    for key, settings in sorted(d.items()):
        for name, want in (("pin_memory", "bool"), ("num_workers", "int"), ("persistent_workers", "bool")):
            if settings[name]["type"] != want:
                got = "nothing" if settings[name]["type"] == "missing" else f"a {settings[name]['type']}"
                return f"scenario {key!r}: {name} must be a {want}, got {got}"
    bad = [k for k, v in sorted(d.items()) if v["num_workers"]["value"] < 0
           or (v["persistent_workers"]["value"] and v["num_workers"]["value"] == 0)]
    if bad:
        return f"scenario(s) {bad}: num_workers >= 0, and persistent_workers needs workers"
    refused = [(k, v.get("refused")) for k, v in sorted(d.items()) if v.get("refused")]
    return (f"scenario {refused[0][0]!r}: DataLoader refuses these settings ({refused[0][1]})" if refused else None)


register("loader_settings", Case("scenarios a-d: the three settings each, of the types asked", observe_loader_settings, _judge_loader_form),
         answers=[Answer("loader_settings", "dict",
                         'a dict from each scenario key "a", "b", "c", "d" to a dict of its settings: '
                         '{"pin_memory": bool, "num_workers": int, "persistent_workers": bool}')],
         points=2, kind="answer",
         choices=lambda solution: {k: [{"pin_memory": pin, "num_workers": workers, "persistent_workers": keep}
                                       for pin in (False, True) for workers in range(0, 33) for keep in (False, True)]
                                   for k in solution})

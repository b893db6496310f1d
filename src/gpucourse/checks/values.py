"""Values as plain data and back, keeping their types: what crosses between the grader and a sandbox.

JSON keeps ``True`` apart from ``1`` and ``1`` apart from ``1.0``, and integers of any size; it loses
tuples, dicts with keys that are not strings, sets, NumPy scalars and tensors. ``describe`` writes those
as one-key dicts (``{"__tuple__": [...]}``), and ``rebuild`` reads them back, so that a check can send
``numpy.int64(5)`` or ``(2, 3)`` as an input and tell a tuple from a list in an answer. Every dict is
written as ``{"__dict__": [[key, value], ...]}``, so no answer's own dict can pose as a tagged value.
"""

from __future__ import annotations

import math
from typing import Any

TAGS = ("__tuple__", "__dict__", "__set__", "__float__", "__numpy__", "__tensor__", "__bytes__", "__object__")


def _float(value: float) -> Any:
    return value if math.isfinite(value) else {"__float__": repr(value)}  # nan, inf: not standard JSON


def describe(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON data that says what it is (see the module's docstring)."""
    if depth > 20:
        return {"__object__": "nested too deep"}
    if value is None or isinstance(value, (bool, str)):
        return value
    if type(value) is int:
        return value
    if type(value) is float:
        return _float(value)
    if isinstance(value, tuple):
        return {"__tuple__": [describe(v, depth + 1) for v in value]}
    if isinstance(value, list):
        return [describe(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {"__dict__": [[describe(k, depth + 1), describe(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        return {"__set__": sorted((describe(v, depth + 1) for v in value), key=repr)}
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    kind = type(value)
    if kind.__module__ == "numpy" and hasattr(value, "dtype") and getattr(value, "shape", None) == ():
        item = value.item()
        return {"__numpy__": str(value.dtype), "value": _float(item) if isinstance(item, float) else item}
    if kind.__module__.startswith("torch") and hasattr(value, "tolist") and hasattr(value, "dtype"):
        values = value.detach().cpu()
        return {"__tensor__": str(values.dtype).removeprefix("torch."), "shape": list(values.shape),
                "values": describe(values.float().tolist() if values.is_floating_point() else values.tolist(), depth + 1)}
    return {"__object__": f"{kind.__module__}.{kind.__qualname__}"}


def rebuild(data: Any) -> Any:
    """The value ``describe`` wrote (a NumPy scalar or a tensor comes back as one; an ``__object__`` as
    its description)."""
    if isinstance(data, list):
        return [rebuild(v) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) == 1 and "__tuple__" in data:
        return tuple(rebuild(v) for v in data["__tuple__"])
    if len(data) == 1 and "__dict__" in data:
        return {_hashable(rebuild(k)): rebuild(v) for k, v in data["__dict__"]}
    if len(data) == 1 and "__set__" in data:
        return {_hashable(rebuild(v)) for v in data["__set__"]}
    if len(data) == 1 and "__float__" in data:
        return float(data["__float__"])
    if len(data) == 1 and "__bytes__" in data:
        return bytes.fromhex(data["__bytes__"])
    if "__numpy__" in data:
        import numpy

        value = data["value"]
        return numpy.dtype(data["__numpy__"]).type(float(value["__float__"]) if isinstance(value, dict) else value)
    if "__tensor__" in data:
        import torch

        return torch.tensor(rebuild(data["values"]), dtype=getattr(torch, data["__tensor__"])).reshape(data["shape"])
    return data


def _hashable(value: Any) -> Any:
    return tuple(map(_hashable, value)) if isinstance(value, list) else value


def type_words(data: Any) -> str:
    """What a described value is, in a few words: "an int", "a tuple", "a float32 tensor"..."""
    if isinstance(data, bool):
        return "a bool"
    if isinstance(data, int):
        return "an int"
    if isinstance(data, float):
        return "a float"
    if isinstance(data, str):
        return "a str"
    if data is None:
        return "None"
    if isinstance(data, list):
        return "a list"
    tag = next((t for t in TAGS if isinstance(data, dict) and t in data), None)
    if tag == "__numpy__":
        return f"a NumPy {data['__numpy__']}"
    if tag == "__tensor__":
        return f"a {data['__tensor__']} tensor"
    if tag == "__float__":
        return "a float"
    if tag == "__object__":
        return f"a {data['__object__']}"
    return {"__tuple__": "a tuple", "__dict__": "a dict", "__set__": "a set", "__bytes__": "bytes"}.get(tag, "something else")

"""Hidden checks for lesson 5 (moving data). Never released; see lesson13's file for the form.

No GPU here: the to_device observer records every ``Tensor.to``/``.cuda``/``.cpu`` call with its device and
``non_blocking``, stands in clones for CUDA copies and answers ``is_pinned()`` for the tensors a drawn
batch marks pinned. The batches and devices are drawn at grading time; the judges know from the draw alone
what must come back.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson05_moving_data import observe_loader_settings  # same observation, exact judges


# --- to_device ------------------------------------------------------------------------------
# Differential: each case draws its batches and devices at grading time (boundaries first, then random
# trees), the sandbox builds them and calls the answer under a recorder of every Tensor.to/.cuda call,
# and the judge compares with what the text's rule gives (reference_moves below, grader side only).
#
# A drawn run: {"device": <device>, "batch": <node>}; <device> is "cuda:1" (a str) or ["torch.device", "cuda:1"];
# <node> is ["tensor", index, dtype, shape, pinned], ["dict", [[key, node], ...]], ["list", [nodes]],
# ["tuple", [nodes]] or ["value", kind] (kinds: VALUE_KINDS, built in the sandbox, each its own object).

VALUE_KINDS = ["none", "str", "int", "big int", "float", "bool", "bytes", "object", "ndarray", "empty str", "module"]
# a tensor node may carry a sixth item, {"param": True} (an nn.Parameter, a Tensor subclass) and/or
# {"on": "cuda:1"} (a tensor already on that GPU: it answers .device, .is_cuda and .get_device() so)
DTYPES = ["torch.float32", "torch.float64", "torch.float16", "torch.bfloat16", "torch.int64", "torch.int32",
          "torch.uint8", "torch.bool"]


def observe_to_device_runs(ns, runs):
    """Each run's batch built here (tensors numbered, pinned ones answering is_pinned() True), the answer
    called under a recorder of every Tensor.to/.cuda/.cpu call; returns the calls and what came back."""
    import numpy as np
    import torch
    from gpucourse.checks import answer

    real_to, real_cuda, real_cpu, real_pinned = torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.is_pinned
    real_device, real_is_cuda, real_get_device = (torch._C.TensorBase.device, torch._C.TensorBase.is_cuda,
                                                  torch._C.TensorBase.get_device)
    results = []
    for run in runs:
        index_of, pinned, made, originals, calls, on_gpu = {}, set(), {}, [], [], {}

        def build(node):
            kind = node[0]
            if kind == "tensor":
                _, number, dtype, shape, is_pinned = node[:5]
                extra = node[5] if len(node) > 5 else {}  # _extra(node), here in the self-contained observer
                count = 1
                for n in shape:
                    count *= n
                t = (torch.arange(count) % 7 + number).to(getattr(torch, dtype.split(".")[1])).reshape(shape)
                if extra.get("param"):
                    t = torch.nn.Parameter(t, requires_grad=t.is_floating_point())
                if extra.get("on"):
                    on_gpu[id(t)] = extra["on"]
                index_of[id(t)] = number
                made[number] = t
                if is_pinned:
                    pinned.add(id(t))
                return t
            if kind == "dict":
                return {key: build(value) for key, value in node[1]}
            if kind in ("list", "tuple"):
                items = [build(value) for value in node[1]]
                return items if kind == "list" else tuple(items)
            # a module is not a tensor, but it has .to(): it must come back as it was, not moved
            value = torch.nn.Linear(2, 2) if node[1] == "module" else {
                "none": None, "str": "text", "int": 3, "big int": 2 ** 70 + 1, "float": 2.5, "bool": True,
                "bytes": b"raw", "object": object(), "ndarray": np.arange(3), "empty str": ""}[node[1]]
            originals.append(value)
            return value

        def record(tensor, device, non_blocking, result):
            if id(tensor) in index_of:
                calls.append({"tensor": index_of[id(tensor)], "device": str(device), "non_blocking": bool(non_blocking)})
                index_of[id(result)] = index_of[id(tensor)]
                made.setdefault(("moved", id(result)), result)

        def fake_to(self, *args, **kwargs):
            device = kwargs.get("device", args[0] if args else None)
            blocking = kwargs.get("non_blocking", next((a for a in args[1:] if isinstance(a, bool)), False))
            if (isinstance(device, (str, torch.device)) and torch.device(device).type not in ("cpu", "meta")) or (
                    id(self) in on_gpu):
                result = self.clone()  # no GPU (or XPU, MPS) here: a clone stands in for the copy
            else:
                result = real_to(self, *args, **{k: v for k, v in kwargs.items() if k != "non_blocking"})
            if isinstance(device, (str, torch.device)):
                record(self, device, blocking, result)
            return result

        def fake_cuda(self, device=None, non_blocking=False, **kwargs):
            result = self.clone()
            record(self, "cuda" if device is None else torch.device("cuda", device) if isinstance(device, int) else device,
                   non_blocking, result)
            return result

        def fake_cpu(self, *args, **kwargs):
            result = real_cpu(self, *args, **kwargs)
            record(self, "cpu", False, result)
            return result

        batch = build(run["batch"])
        spec = run["device"]
        device = torch.device(spec[1]) if isinstance(spec, list) else spec
        modules = [(o, [(q.data_ptr(), str(q.device), q.dtype) for q in o.parameters()])
                   for o in originals if isinstance(o, torch.nn.Module)]
        torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu = fake_to, fake_cuda, fake_cpu
        torch.Tensor.is_pinned = lambda self, *a, **k: id(self) in pinned
        if on_gpu:  # tensors that stand for ones on a GPU say so
            torch.Tensor.device = property(lambda self: torch.device(on_gpu[id(self)]) if id(self) in on_gpu
                                           else real_device.__get__(self))
            torch.Tensor.is_cuda = property(lambda self: id(self) in on_gpu or real_is_cuda.__get__(self))
            torch.Tensor.get_device = lambda self: (torch.device(on_gpu[id(self)]).index or 0 if id(self) in on_gpu
                                                    else real_get_device(self))
        try:
            moved = answer(ns, "to_device")(batch, device)
        finally:
            torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.is_pinned = (
                real_to, real_cuda, real_cpu, real_pinned)
            for name in ("device", "is_cuda", "get_device"):
                if name in torch.Tensor.__dict__:
                    delattr(torch.Tensor, name)
        changed = [i for i, (o, before) in enumerate(modules)
                   if [(q.data_ptr(), str(q.device), q.dtype) for q in o.parameters()] != before]

        def describe(x, depth=0):
            if depth > 40:
                return ["too deep"]
            if isinstance(x, torch.Tensor):
                number = index_of.get(id(x))
                return ["tensor", number, str(x.dtype), list(x.shape),
                        "original" if number is not None and made.get(number) is x else "moved" if number is not None else "other"]
            if isinstance(x, dict):
                return ["dict", [[k if isinstance(k, (str, int)) else repr(k), describe(v, depth + 1)] for k, v in x.items()]]
            if type(x) in (list, tuple):
                return [type(x).__name__, [describe(v, depth + 1) for v in x]]
            return ["value", [i for i, o in enumerate(originals) if o is x], type(x).__name__]  # None is None, twice

        results.append({"calls": calls, "returned": describe(moved), "modules_changed": changed})
    return results


def device_words(spec) -> str:
    return f"torch.device({spec[1]!r})" if isinstance(spec, list) else repr(spec)


def _device_type(spec) -> str:
    text = spec[1] if isinstance(spec, list) else spec
    return text.split(":")[0]


def _same_device(got: str, spec) -> bool:
    want = spec[1] if isinstance(spec, list) else spec
    return got.replace("cuda:0", "cuda") == want.replace("cuda:0", "cuda")


def reference_to_device(node):
    """The text's rule, as the observer describes a result: the same containers (dicts, lists, tuples), each
    tensor moved (same dtype and shape), every other value the very object it was."""
    kind = node[0]
    if kind == "tensor":
        return ["tensor", node[1], node[2], node[3]]
    if kind == "dict":
        return ["dict", [[k, reference_to_device(v)] for k, v in node[1]]]
    if kind in ("list", "tuple"):
        return [kind, [reference_to_device(v) for v in node[1]]]
    return ["value"]


def _extra(node) -> dict:
    """A tensor node's sixth item ({"param": True}, {"on": "cuda:1"}), or {} where it has none."""
    return node[5] if len(node) > 5 else {}


def _tensors(node):
    if node[0] == "tensor":
        return [node]
    if node[0] == "dict":
        return [t for _, v in node[1] for t in _tensors(v)]
    if node[0] in ("list", "tuple"):
        return [t for v in node[1] for t in _tensors(v)]
    return []


def _structure_problem(want, got, values, found=None):
    """What is wrong where ``got`` (the observer's description) leaves ``want``'s: "structure" (containers,
    keys, dtypes, shapes, a tensor not moved) before "value" (a value that is not the very object it was),
    or None. ``values``: the non-tensor values met so far, in the order the observer built them."""
    found = set() if found is None else found
    if not isinstance(got, list) or not got:
        found.add("structure")
    elif want[0] == "tensor":
        if got[0] != "tensor" or got[2:4] != want[2:4] or got[1] != want[1]:
            found.add("structure")
    elif want[0] == "value":
        index = len(values)
        values.append(index)
        if got[0] != "value":
            found.add("structure")
        elif not (isinstance(got[1], list) and index in got[1]):
            found.add("value")
    elif got[0] != want[0] or len(got[1]) != len(want[1]):
        found.add("structure")
    else:
        if want[0] == "dict":
            if [k for k, _ in got[1]] != [k for k, _ in want[1]]:
                found.add("structure")
            pairs = zip((v for _, v in want[1]), (v for _, v in got[1]))
        else:
            pairs = zip(want[1], got[1])
        for w, g in pairs:
            _structure_problem(w, g, values, found)
    return "structure" if "structure" in found else "value" if found else None


def _what(node) -> str:
    return {"tensor": "a single tensor", "dict": "a dict", "list": "a list", "tuple": "a tuple"}.get(node[0], "a value")


def judge_moves(run, got) -> str | None:
    """Every tensor moved once with .to(device, ...) to the device given (one on the CPU may stay when the
    CPU is asked for), non_blocking exactly for a pinned tensor going to CUDA."""
    device = run["device"]
    target = device_words(device)
    by_tensor = {}
    for call in got["calls"]:
        by_tensor.setdefault(call["tensor"], []).append(call)
    for node in _tensors(run["batch"]):
        number, dtype, shape, pinned = node[1:5]
        on = _extra(node).get("on")
        kind = "an nn.Parameter" if _extra(node).get("param") else "a tensor"
        where = (f"{kind} on {on} to {target}" if on else
                 f"{'a pinned' if pinned else 'a pageable'} {kind.removeprefix('a ').removeprefix('an ')} to {target}")
        moves = by_tensor.get(number, [])
        if not moves and (_same_device(on, device) if on else _device_type(device) == "cpu"):
            continue  # already there: may come back as it is
        if len(moves) != 1 or not _same_device(moves[0]["device"], device):
            return f"{where}: move it once with .to(device, ...) to the device given, saw {[m['device'] for m in moves]}"
        if moves[0]["non_blocking"] != (pinned and not on and _device_type(device) == "cuda"):
            return (f"{where}: wrong non_blocking (non_blocking=True exactly when the copy goes to a CUDA device "
                    "from pinned memory)")
    return None


def judge_to_device_runs(focus):
    """A judge of ``observe_to_device_runs``: structure and values, then the moves (``focus`` orders them)."""
    def judge(observed, runs):
        if not isinstance(observed, list) or len(observed) != len(runs):
            return "the answer was not called on every drawn batch"
        for run, got in zip(runs, observed):
            problem = _structure_problem(reference_to_device(run["batch"]), got.get("returned"), [])
            where = f"{_what(run['batch'])} to {device_words(run['device'])}"
            if problem == "structure":
                return (f"{where} came back with another structure, or other dtypes (dicts stay dicts, lists "
                        "lists, tuples tuples, at every depth; every tensor moved, keeping its dtype)")
            if problem == "value":
                return f"{where}: values that are not tensors must come back unchanged: the same objects"
            if got.get("modules_changed"):
                return (f"{where}: values that are not tensors must come back unchanged: an nn.Module in the batch "
                        "(it has a .to() too) was moved")
            moves = judge_moves(run, got)
            if moves:
                return moves
        return None
    return judge


def _devices_everywhere(rng):
    """Every form of device the text allows, boundaries first: str and torch.device, CUDA with and without
    an index, the CPU, and a device that is neither (where no copy is non-blocking)."""
    index = rng.randint(2, 7)
    return ["cuda:1", ["torch.device", "cuda"], "cpu", ["torch.device", "cpu"], ["torch.device", "cuda:0"], "cuda",
            f"cuda:{index}", ["torch.device", f"cuda:{index}"], "meta", ["torch.device", "meta"],
            rng.choice(["xpu", "mps", "xpu:1"]), ["torch.device", rng.choice(["xpu", "mps"])]]


def _drawn_tensor(rng, counter, pinned=None, param=None):
    shape = rng.choice([[], [0], [1], [3], [2, 2], [rng.randint(1, 4), rng.randint(1, 3)]])
    node = ["tensor", next(counter), rng.choice(DTYPES), shape, rng.random() < 0.5 if pinned is None else pinned]
    if param or (param is None and rng.random() < 0.2):
        node.append({"param": True})
    return node


def draw_single_tensors(rng):
    """A single tensor, pinned and pageable, to every form of device (XPU and MPS among them); an nn.Parameter
    (a Tensor subclass) to CUDA, the CPU and meta; dtypes and shapes drawn."""
    import itertools

    counter = itertools.count(10)
    runs = [{"device": device, "batch": _drawn_tensor(rng, counter, pinned)}
            for device in _devices_everywhere(rng) for pinned in (True, False)]
    runs += [{"device": device, "batch": _drawn_tensor(rng, counter, True, param=True)} for device in ("cuda", "cpu", "meta")]
    return runs


def _tree(rng, counter, depth):
    kind = rng.choice(["dict", "list", "tuple", "tensor", "tensor", "value"] if depth < 5 else ["tensor", "value"])
    if kind == "tensor":
        return _drawn_tensor(rng, counter)
    if kind == "value":
        return ["value", rng.choice(VALUE_KINDS)]
    items = [_tree(rng, counter, depth + 1) for _ in range(rng.choice([0, 1, 1, 2, 3]))]
    if kind == "dict":
        keys = rng.sample(["x", "y", "mask", 0, 1, 7, "meta"], len(items))
        return ["dict", [[k, v] for k, v in zip(keys, items)]]
    return [kind, items]


def draw_nested_batches(rng):
    """Boundaries first (empty containers, a one-element tuple, a list at the top, deep nesting, every kind
    of non-tensor value), then random trees up to 5 deep, to every form of device."""
    import itertools

    counter = itertools.count(100)
    devices = _devices_everywhere(rng)
    fixed = [
        ["dict", [["x", _drawn_tensor(rng, counter)], ["name", ["value", "str"]], ["index", ["value", "int"]]]],
        ["dict", []], ["list", []], ["tuple", []],
        ["tuple", [_drawn_tensor(rng, counter, True)]],
        ["list", [_drawn_tensor(rng, counter, True), ["value", "str"], ["tuple", [_drawn_tensor(rng, counter, False), ["value", "none"]]]]],
        ["dict", [[0, _drawn_tensor(rng, counter, True)], ["labels", ["list", [["value", kind] for kind in VALUE_KINDS]]]]],
        ["dict", [["a", ["list", [["tuple", [["dict", [["b", ["list", [_drawn_tensor(rng, counter, True)]]]]]]]]]]]],
        ["tuple", [["list", []], ["dict", [["empty", ["tuple", []]]]], ["value", "ndarray"], ["value", "object"]]],
    ]
    runs = [{"device": devices[i % len(devices)], "batch": batch} for i, batch in enumerate(fixed)]
    for _ in range(14):
        top = rng.choice(["dict", "list", "tuple"])
        items = [_tree(rng, counter, 1) for _ in range(rng.randint(1, 4))]
        batch = ["dict", [[f"k{i}", v] for i, v in enumerate(items)]] if top == "dict" else [top, items]
        runs.append({"device": rng.choice(devices), "batch": batch})
    return runs


def draw_pinned_everywhere(rng):
    """Pinned and pageable tensors mixed at every depth, each batch sent to every form of device."""
    import itertools

    counter = itertools.count(1000)
    runs = []
    for device in _devices_everywhere(rng):
        items = [_drawn_tensor(rng, counter, True), _drawn_tensor(rng, counter, False), _tree(rng, counter, 2), _tree(rng, counter, 3)]
        runs.append({"device": device, "batch": ["dict", [["inputs", ["list", items[:2]]], ["extra", ["tuple", items[2:]]]]]})
    return runs


def draw_already_on_a_gpu(rng):
    """Tensors already on a GPU (not pinned memory, so never non_blocking): to the CPU, to the same GPU
    (they may stay), to another GPU; beside a pinned and a pageable CPU tensor; an nn.Parameter among them."""
    import itertools

    counter = itertools.count(5000)
    runs = []
    for device in ["cpu", ["torch.device", "cpu"], "cuda:0", ["torch.device", "cuda:1"], "cuda", f"cuda:{rng.randint(2, 7)}"]:
        on = rng.choice(["cuda:0", "cuda:1"])
        gpu = _drawn_tensor(rng, counter, False, param=False) + [{"on": on}]
        gpu_param = _drawn_tensor(rng, counter, False, param=False) + [{"on": on, "param": True}]
        runs.append({"device": device, "batch": ["tuple", [gpu, _drawn_tensor(rng, counter, True), ["list", [gpu_param]],
                                                           _drawn_tensor(rng, counter, False)]]})
    runs.append({"device": "cpu", "batch": _drawn_tensor(rng, counter, False, param=False) + [{"on": "cuda:1"}]})
    return runs


HIDDEN = {
    "to_device": [
        Case("a single tensor, pinned or not, any dtype and shape, to every form of device (str or torch.device; "
             "'cuda', 'cuda:N', 'cpu', 'meta')", observe_to_device_runs, judge_to_device_runs("single"),
             draw=draw_single_tensors),
        Case("nested batches keep their structure and dtypes; values that are not tensors come back as they were",
             observe_to_device_runs, judge_to_device_runs("structure"), draw=draw_nested_batches),
        Case("non_blocking exactly for pinned tensors going to CUDA, at every depth, for every form of device",
             observe_to_device_runs, judge_to_device_runs("flags"), draw=draw_pinned_everywhere),
        Case("tensors already on a GPU, to the CPU or a GPU: moved, never non_blocking (not pinned memory); "
             "nn.Parameters too", observe_to_device_runs, judge_to_device_runs("gpu"), draw=draw_already_on_a_gpu),
    ],
}


# --- loader_settings ------------------------------------------------------------------------
# What the exercise text and answer line require:
#  1. scenario keys "a" to "d", each a dict with pin_memory (bool), num_workers (int) and
#     persistent_workers (bool) -> the public form check
#  2. persistent_workers only with workers, and any other key only as DataLoader takes it (prefetch_factor
#     only with workers): what DataLoader refuses -> the public form check
#  3. a: a CUDA GPU, JPEG decoding and augmentation on 8 cores: pinned, 4 to 8 workers -> "scenario a"
#  4. b: CPU only, a tensor in memory: nothing pinned, no workers -> "scenario b"
#  5. c: the dataset already on the GPU: nothing pinned, no workers -> "scenario c"
#  6. d: a CUDA GPU, heavy augmentation on 4 cores, epochs of a second: pinned, 2 to 4 workers
#     kept between epochs -> "scenario d"

def _setting(d, key, name):
    return d.get(key, {}).get(name, {}).get("value")


LOADER_RULES = {
    "a": lambda pin, workers, persistent: pin is True and isinstance(workers, int) and 4 <= workers <= 8,
    "b": lambda pin, workers, persistent: pin is False and workers == 0,
    "c": lambda pin, workers, persistent: pin is False and workers == 0,
    "d": lambda pin, workers, persistent: pin is True and isinstance(workers, int) and 2 <= workers <= 4 and persistent is True,
}


def judge_scenario(key):
    def judge(d):
        if "error" in d:
            return d["error"]
        values = [_setting(d, key, n) for n in ("pin_memory", "num_workers", "persistent_workers")]
        return None if LOADER_RULES[key](*values) else f"reconsider scenario {key}"
    return judge


HIDDEN["loader_settings"] = [Case(f"scenario {key}", observe_loader_settings, judge_scenario(key)) for key in "abcd"]

PUBLIC_CASE = "a nested batch to CUDA (two pinned tensors, one not) and back"
SINGLE, NESTED, FLAGS, ON_GPU = (case.name for case in HIDDEN["to_device"])
CLAUSES = {
    "to_device": {
        "batch may be a single tensor": [SINGLE],
        "or a (nested) dict, list or tuple of tensors and other values, at any depth, empty ones too": [NESTED, PUBLIC_CASE],
        "returns the same structure: dicts stay dicts, lists lists, tuples tuples": [NESTED, PUBLIC_CASE],
        "values that are not tensors come back unchanged (an nn.Module too: it has .to(), it is not a tensor)":
            [NESTED, PUBLIC_CASE],
        "every tensor moved with tensor.to(device, ...), keeping its dtype (subclasses such as nn.Parameter too)":
            [SINGLE, NESTED, FLAGS, ON_GPU, PUBLIC_CASE],
        "non_blocking True exactly when the copy goes to a CUDA device from pinned memory (not from a GPU, not to "
        "another device type)": [SINGLE, FLAGS, ON_GPU, PUBLIC_CASE],
        "device may be a torch.device or a string (any device type, any CUDA index)": [SINGLE, FLAGS],
    },
}

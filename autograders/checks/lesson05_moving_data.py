"""Hidden checks for lesson 5 (moving data). Never released; see lesson01's file for the form.

No GPU here: ``recording_moves`` (gpucourse.checks.lesson05) records every ``Tensor.to``/``.cuda`` call
with its device and ``non_blocking``, stands in clones for CUDA copies and answers ``is_pinned()``
for the tensors an observer marks.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson05 import observe_loader_settings  # same observation, exact judges


# --- to_device ------------------------------------------------------------------------------
# What the exercise text and answer line require:
#  1. `batch` may be a single tensor -> "a single tensor ..."
#  2. nested dicts, lists and tuples keep their types at every depth (empty ones too)
#     -> "random nested batches keep their structure"
#  3. values that are not tensors come back unchanged (the same objects) -> "values that are not tensors ..."
#  4. every tensor moved once with `tensor.to(device, ...)`, keeping its dtype (one already on the
#     CPU may come back as it is when the CPU is asked for) -> "random nested batches ..." and "a single tensor ..."
#  5. non_blocking True exactly for a pinned tensor going to a CUDA device, False for unpinned
#     ones and for copies to the CPU -> "non_blocking exactly ..." and "a single tensor ..."
#  6. `device` a torch.device or a str ("cuda", "cuda:1", "cpu") -> "a single tensor ..."

def observe_to_device_single(ns):
    import torch
    from gpucourse.checks import answer
    from gpucourse.checks.lesson05 import recording_moves

    result = []
    for device, pinned in [("cuda:1", True), (torch.device("cuda"), False), ("cpu", True), (torch.device("cpu"), False),
                           (torch.device("cuda", 0), True)]:
        with recording_moves() as (pinned_ids, calls):
            tensor = torch.arange(3, dtype=torch.int64) + 40
            if pinned:
                pinned_ids.add(id(tensor))
            moved = answer(ns, "to_device")(tensor, device)
            result.append({"device": str(device), "pinned": pinned, "calls": list(calls),
                           "returned": type(moved).__name__, "dtype": str(getattr(moved, "dtype", None))})
    return result


SINGLE_MOVES = [("cuda:1", True), ("cuda", False), ("cpu", True), ("cpu", False), ("cuda:0", True)]  # (device, pinned)


def judge_to_device_single(d):
    if [(r["device"], r["pinned"]) for r in d] != SINGLE_MOVES:
        return "not every device was tried"
    for r in d:
        where = f"a {'pinned' if r['pinned'] else 'pageable'} tensor to {r['device']!r}"
        if r["returned"] != "Tensor" or r["dtype"] != "torch.int64":
            return f"{where}: must come back a tensor of the same dtype"
        already = r["device"] == "cpu"  # a tensor already there may be returned as it is, without .to
        if len(r["calls"]) > 1 or (not r["calls"] and not already) or any(
                c["device"].replace("cuda:0", "cuda") != r["device"].replace("cuda:0", "cuda") for c in r["calls"]):
            return f"{where}: move it once with .to(device, ...) to the device given, saw {r['calls']}"
        if any(c["non_blocking"] != (r["pinned"] and r["device"].startswith("cuda")) for c in r["calls"]):
            return f"{where}: wrong non_blocking"
    return None


def observe_to_device_random(ns):
    import random

    import torch
    from gpucourse.checks import answer
    from gpucourse.checks.lesson05 import recording_moves

    rng = random.Random(11)
    counter = iter(range(100, 10_000))
    marker = object()

    def tree(depth, pinned_ids):
        kind = rng.choice(["dict", "list", "tuple", "leaf", "leaf"] if depth < 3 else ["leaf"])
        if kind == "leaf":
            choice = rng.random()
            if choice < 0.5:
                t = torch.full((rng.randint(1, 3),), float(next(counter)), dtype=rng.choice([torch.float32, torch.float64, torch.int64]))
                if rng.random() < 0.5:
                    pinned_ids.add(id(t))
                return t
            return rng.choice([None, "text", 3, 2.5, marker, b"raw"])
        items = [tree(depth + 1, pinned_ids) for _ in range(rng.randint(0, 3))]
        if kind == "dict":
            return {f"k{i}": v for i, v in enumerate(items)}
        return items if kind == "list" else tuple(items)

    def describe(x):
        if isinstance(x, torch.Tensor):
            return ["tensor", str(x.dtype), float(x.flatten()[0])]
        if isinstance(x, dict):
            return ["dict", {str(k): describe(v) for k, v in x.items()}]
        if isinstance(x, (list, tuple)):
            return [type(x).__name__, [describe(v) for v in x]]
        return ["value", type(x).__name__]

    def tensors(x):
        if isinstance(x, torch.Tensor):
            return [x]
        values = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else []
        return [t for v in values for t in tensors(v)]

    def same_leaves(a, b):
        if isinstance(a, dict) and isinstance(b, dict):
            return all(same_leaves(a[k], b.get(k)) for k in a)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(map(same_leaves, a, b))
        return isinstance(a, torch.Tensor) or a is b

    result = []
    for device in ("cuda", torch.device("cuda:1"), "cpu"):
        for _ in range(3):
            with recording_moves() as (pinned_ids, calls):
                batch = {"inputs": tree(1, pinned_ids), "labels": tree(1, pinned_ids), "extra": tree(0, pinned_ids)}
                pinned = sorted(float(t.flatten()[0]) for t in tensors(batch) if id(t) in pinned_ids)
                expected = describe(batch)
                moved = answer(ns, "to_device")(batch, device)
                result.append({"device": str(device), "expected": expected, "got": describe(moved),
                               "pinned": pinned, "calls": sorted(calls, key=lambda c: c["leaf"] or 0),
                               "same_leaves": same_leaves(batch, moved)})
    return result




def random_batches() -> list[tuple[str, list, list]]:
    """observe_to_device_random's batches, rebuilt here from the same seed without torch: (device, the
    batch's description as the observer's describe() writes it, the first values of its pinned tensors)."""
    import random

    rng = random.Random(11)
    counter = iter(range(100, 10_000))
    kinds = {None: "NoneType", "text": "str", 3: "int", 2.5: "float", "marker": "object", b"raw": "bytes"}

    def tree(depth, pinned):
        kind = rng.choice(["dict", "list", "tuple", "leaf", "leaf"] if depth < 3 else ["leaf"])
        if kind == "leaf":
            if rng.random() < 0.5:
                rng.randint(1, 3)  # the tensor's length (its first value is what is described)
                value = float(next(counter))
                dtype = rng.choice(["torch.float32", "torch.float64", "torch.int64"])
                if rng.random() < 0.5:
                    pinned.append(value)
                return ["tensor", dtype, value]
            return ["value", kinds[rng.choice([None, "text", 3, 2.5, "marker", b"raw"])]]
        items = [tree(depth + 1, pinned) for _ in range(rng.randint(0, 3))]
        if kind == "dict":
            return ["dict", {f"k{i}": v for i, v in enumerate(items)}]
        return [kind, items]

    batches = []
    for device in ("cuda", "cuda:1", "cpu"):
        for _ in range(3):
            pinned = []
            described = ["dict", {"inputs": tree(1, pinned), "labels": tree(1, pinned), "extra": tree(0, pinned)}]
            batches.append((device, described, sorted(pinned)))
    return batches


def _with_expected(d):
    """The observed rows, each with the judge's own expected description and pinned tensors."""
    batches = random_batches()
    if len(d) != len(batches) or any(r["device"] != device for r, (device, _, _) in zip(d, batches)):
        raise ValueError("the observation does not answer the generated batches")
    return [dict(r, expected=expected, pinned=pinned) for r, (_, expected, pinned) in zip(d, batches)]


def judge_to_device_structure(d):
    for r in _with_expected(d):
        if r["got"] != r["expected"]:
            return f"a nested batch to {r['device']!r} came back with another structure, or other dtypes"
    return None


def judge_to_device_values(d):
    for r in _with_expected(d):
        if r["got"] == r["expected"] and not r["same_leaves"]:
            return "values that are not tensors must come back unchanged: the same objects"
    return None


def judge_to_device_flags(d):
    for r in _with_expected(d):
        tensors = sorted(leaf for leaf in _leaves(r["expected"]))
        moved = [c for c in r["calls"] if c["device"].replace("cuda:0", "cuda") == r["device"]]
        leaves = sorted(c["leaf"] for c in moved)
        stayed = r["device"] == "cpu" and len(set(leaves)) == len(leaves) and set(leaves) <= set(tensors)  # already there
        if len(moved) != len(r["calls"]) or (leaves != tensors and not stayed):
            return f"to {r['device']!r}: every tensor must be moved once with .to(device, ...) to the device given"
        cuda = r["device"].startswith("cuda")
        if any(c["non_blocking"] != (cuda and c["leaf"] in r["pinned"]) for c in moved):
            return f"to {r['device']!r}: non_blocking=True exactly for pinned tensors going to a CUDA device"
    return None


def _leaves(description):
    kind, value = description[0], description[1:]
    if kind == "tensor":
        return [value[1]]
    if kind == "dict":
        return [t for v in value[0].values() for t in _leaves(v)]
    if kind in ("list", "tuple"):
        return [t for v in value[0] for t in _leaves(v)]
    return []


# --- loader_settings ------------------------------------------------------------------------
# What the exercise text and answer line require:
#  1. scenario keys "a" to "d", each a dict with pin_memory (bool), num_workers (int) and
#     persistent_workers (bool) -> the public form check
#  2. persistent_workers only with workers (DataLoader refuses it otherwise) -> the public form check
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


HIDDEN = {
    "to_device": [
        Case("a single tensor, pinned or not, to 'cuda:1', torch.device('cuda') and the CPU", observe_to_device_single,
             judge_to_device_single),
        Case("random nested batches keep their structure and dtypes", observe_to_device_random, judge_to_device_structure),
        Case("values that are not tensors come back as they were", observe_to_device_random, judge_to_device_values),
        Case("non_blocking exactly for pinned tensors going to CUDA, at every depth", observe_to_device_random,
             judge_to_device_flags),
    ],
    "loader_settings": [Case(f"scenario {key}", observe_loader_settings, judge_scenario(key)) for key in "abcd"],
}

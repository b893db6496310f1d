"""Hidden checks for lesson 17 (FSDP2 in practice). Never released.

Differential: each case draws its calls at grading time (boundaries first, then random ones from the
whole domain the exercise's text states); the sandbox calls the answer on them and the judges call the
references below, which exist on the grader's side only, on the same calls.
"""

from gpucourse.checks import Case

from autograders.differential import call, judge_calls

# --- hsdp_mesh -----------------------------------------------------------------------------------------


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def reference_hsdp_mesh(world_size, gpus_per_node):
    """The text's rule: TypeError unless both are ints (bools are not); ValueError unless both are >= 1 and
    gpus_per_node divides world_size; the mesh is arange(world_size) viewed as (nodes, gpus_per_node)."""
    if not (_is_count(world_size) and _is_count(gpus_per_node)):
        raise TypeError("world_size and gpus_per_node must be ints")
    if world_size < 1 or gpus_per_node < 1 or world_size % gpus_per_node:
        raise ValueError("gpus_per_node must be >= 1 and divide world_size >= 1")
    nodes = world_size // gpus_per_node
    return {"shape": (nodes, gpus_per_node),
            "shard_groups": [list(range(r // gpus_per_node * gpus_per_node, (r // gpus_per_node + 1) * gpus_per_node))
                             for r in range(world_size)],
            "replicate_groups": [[r % gpus_per_node + k * gpus_per_node for k in range(nodes)]
                                 for r in range(world_size)]}


def draw_clusters(rng):
    """Every divisor pair of 1..12 ranks (one node, one GPU per node, square and not), then random clusters
    of 2 to 64 nodes of 1, 2, 4, 8 or any other number of GPUs."""
    calls = [call(w, g) for w in range(1, 13) for g in range(1, w + 1) if w % g == 0]
    for _ in range(10):
        gpus = rng.choice([1, 2, 4, 8, rng.randint(3, 16)])
        calls.append(call(gpus * rng.randint(2, 64), gpus))
    rng.shuffle(calls)
    return calls


def draw_bad_meshes(rng):
    """Sizes that do not divide (gpus_per_node above world_size too), 0 and negative sizes, and each
    argument as a float, a string, None or a bool, also where the values would be wrong too: a call
    with a type fault and a value fault raises TypeError (checked first), whichever argument has which."""
    calls = [call(6, 4), call(2, 4), call(0, 1), call(4, 0), call(-4, 2), call(4, -2), call(0, 0),
             call(rng.randint(2, 50) * 8 + rng.randint(1, 7), 8)]
    # checked first: a value fault in one argument and a type fault in the other (either way round)
    calls += [call(0, "2"), call(0, None), call(-4, 2.0), call(0, True), call("8", 0), call(None, -2),
              call(6, 4.0), call(2, "4")]
    for _ in range(2):
        bad_type = rng.choice([float(rng.randint(1, 8)), str(rng.randint(1, 8)), None, True, False, 2.5])
        bad_value = rng.choice([0, -rng.randint(1, 64)])
        calls.append(call(bad_value, bad_type) if rng.random() < 0.5 else call(bad_type, bad_value))
    for _ in range(4):
        gpus = rng.randint(2, 9)
        world = gpus * rng.randint(1, 8)
        bad = rng.choice([float(world), str(world), None, True, world + 0.5])
        calls.append(call(bad, gpus))
        calls.append(call(world, rng.choice([float(gpus), str(gpus), None, True, False])))
    calls += [call(True, True), call(4, True), call(2.0, 0), call("8", 3), call(False, 1)]
    rng.shuffle(calls)
    return calls


def observe_mesh_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "hsdp_mesh", calls)


HIDDEN = {"hsdp_mesh": [
    Case("every divisor pair up to 12 ranks and random clusters: shape, shard and replicate groups",
         observe_mesh_calls, judge_calls(reference_hsdp_mesh, "hsdp_mesh"), draw=draw_clusters),
    Case("bad input: ValueError for sizes that do not divide or are < 1, TypeError for non-ints and bools, "
         "checked first",
         observe_mesh_calls, judge_calls(reference_hsdp_mesh, "hsdp_mesh"), draw=draw_bad_meshes),
]}


# --- fsdp_step_traffic ---------------------------------------------------------------------------------


def reference_traffic(shapes, world_size, reshard_after_forward, param_bytes, reduce_bytes):
    """The text's count for one FSDP unit on ``world_size`` ranks, one forward and backward.

    TypeError: a count or a dimension that is not an int (bools are not), shapes not a list or tuple of
    lists or tuples, a setting neither a bool nor an int. ValueError: world_size, param_bytes or
    reduce_bytes < 1, a shape with no dimension or a dimension < 1, an int setting outside 1..world_size
    or not dividing it. c = sum of ceil(rows / N) x the other dimensions; forward: (N - 1) c param_bytes;
    backward all-gather: the same for True or k = N, nothing for False or k = 1, (k - 1) (N c / k)
    param_bytes otherwise; reduce-scatter (N - 1) c reduce_bytes."""
    if not isinstance(shapes, (list, tuple)) or not all(isinstance(s, (list, tuple)) for s in shapes):
        raise TypeError("shapes must be a list of shapes")
    counts = [world_size, param_bytes, reduce_bytes] + [d for s in shapes for d in s]
    if not all(_is_count(v) for v in counts) or not isinstance(reshard_after_forward, int):
        raise TypeError("counts must be ints; reshard_after_forward a bool or an int")
    if world_size < 1 or param_bytes < 1 or reduce_bytes < 1 or any(len(s) == 0 or min(s) < 1 for s in shapes):
        raise ValueError("a size < 1")
    n = world_size
    setting = reshard_after_forward
    if not isinstance(setting, bool) and (setting < 1 or setting > n or n % setting):
        raise ValueError("an int reshard_after_forward must divide world_size")
    chunk = 0
    for shape in shapes:
        rest = 1
        for d in shape[1:]:
            rest *= d
        chunk += -(-shape[0] // n) * rest
    forward = (n - 1) * chunk * param_bytes
    if setting is True or (not isinstance(setting, bool) and setting == n):
        backward = forward
    elif setting is False or setting == 1:
        backward = 0
    else:
        backward = (setting - 1) * (n * chunk // setting) * param_bytes
    return {"all_gather": forward + backward, "reduce_scatter": (n - 1) * chunk * reduce_bytes}


def _shapes(rng, count=None):
    shapes = []
    for _ in range(rng.randint(1, 4) if count is None else count):
        rank = rng.choice([1, 1, 2, 2, 2, 3])
        shapes.append([rng.choice([1, 2, 3, rng.randint(1, 4096)]) for _ in range(rank)])
    return shapes if rng.random() < 0.7 else [tuple(s) for s in shapes]


def draw_settings(rng):
    """1, 2, 3, 4, 6 and 8 ranks with every setting (True, False, each divisor as an int, 1 and N
    included), rows that divide and do not, fewer rows than ranks, 1-, 2- and 3-D shapes, byte sizes 1,
    2, 4 and others; then larger worlds and counts above 2**53."""
    calls = []
    for n in (1, 2, 3, 4, 6, 8):
        for setting in [True, False] + [k for k in range(1, n + 1) if n % k == 0]:
            shapes = _shapes(rng)
            if rng.random() < 0.5:
                shapes.append([n * rng.randint(1, 64), rng.randint(1, 64)])  # rows that divide
            shapes.append([rng.randint(1, max(1, n - 1))])  # fewer rows than ranks (or 1)
            calls.append(call(shapes, n, setting, rng.choice([1, 2, 4]), rng.choice([2, 4, 8])))
    calls.append(call([], 4, True, 2, 4))
    calls.append(call((), 3, 3, 2, 4))
    for _ in range(6):
        gpus = rng.choice([2, 4, 8])
        n = gpus * rng.randint(2, 128)
        calls.append(call(_shapes(rng), n, rng.choice([True, False, gpus, n, 1]), rng.randint(1, 8), rng.randint(1, 8)))
    big = 2 ** 53 + rng.randint(1, 10 ** 6)
    calls.append(call([[big, 3], [rng.randint(2 ** 54, 2 ** 60)]], 4, 2, 2, 4))
    calls.append(call([[7, 5]], 2, True, 2 ** 55 + 1, 3))
    for n, k in ((4, 2), (8, 4)):  # an int setting with an odd chunk above 2**54: N c / k in floats loses its last bits
        calls.append(call([[n * (2 ** 54 + 2 * rng.randint(0, 2 ** 20) + 1)]], n, k, rng.randint(1, 4), 4))
    for n in (4, 8):  # rows one past a multiple of N above 2**54: a float division rounds the remainder away
        rows = n * rng.randint(2 ** 52, 2 ** 53 - 1) + 1
        calls.append(call([[rows, rng.randint(1, 9)]], n, rng.choice([True, False, 2]), 2, 4))
    rng.shuffle(calls)
    return calls


def draw_bad_traffic(rng):
    """Each way out of the domain: an int setting that does not divide, 0, negative or above world_size;
    a float or string setting; world_size, param_bytes or reduce_bytes 0, negative, a float or a bool; a
    shape with no dimension, a 0 or negative dimension, a float dimension; and calls with a type fault
    and a value fault at once, in any two places: TypeError, which the text checks first."""
    good = [[30, 30], [30]]
    calls = [call(good, 4, 3, 4, 4), call(good, 4, 0, 4, 4), call(good, 4, -2, 4, 4), call(good, 4, 8, 4, 4),
             call(good, 6, 4, 2, 4), call(good, 4, 2.0, 4, 4), call(good, 4, "2", 4, 4), call(good, 4, None, 4, 4),
             call(good, 0, True, 4, 4), call(good, -2, False, 4, 4), call(good, 4, True, 0, 4),
             call(good, 4, True, 4, 0), call(good, 4, True, -1, 4), call(good, 4.0, True, 4, 4),
             call(good, True, True, 4, 4), call(good, 4, True, 2.0, 4), call(good, 4, True, 4, False),
             call([[]], 4, True, 4, 4), call([[0, 3]], 4, True, 4, 4), call([[5, -1]], 4, True, 4, 4),
             call([[5.0, 3]], 4, True, 4, 4), call([[5, 3], [2, True]], 4, True, 4, 4), call([5, 3], 4, True, 4, 4)]
    # checked first: a type fault (a dimension, a count, the setting) with a value fault elsewhere
    calls += [call([[2.0]], 0, True, 4, 4), call([[30, 30]], 4, "x", 0, 4), call(good, 0, True, 4.0, 4),
              call(good, -2, None, 4, 4), call([[0, 3.0]], 4, True, 4, 4), call([[]], 4, 2.5, 4, 4),
              call([[30]], 4, 3, 4, "4"), call([[5, True]], 0, True, 4, 4), call([[0, 3]], 4.0, True, 4, 4),
              call(good, 4, True, -1, None), call([[30], []], 4, True, 4, 2.0), call([[30], 30], 0, True, 4, 4)]
    type_faults = [("dim", 3.0), ("world", 4.0), ("setting", "2"), ("param", True), ("reduce", None)]
    value_faults = [("dim", 0), ("world", 0), ("setting", 3), ("param", 0), ("reduce", -rng.randint(1, 9))]
    for _ in range(2):
        (t_place, t_bad), (v_place, v_bad) = rng.choice([(t, v) for t in type_faults for v in value_faults
                                                         if t[0] != v[0]])
        args = {"dim": [[30, 30], [30]], "world": 4, "setting": True, "param": 4, "reduce": 4}
        for place, bad in ((t_place, t_bad), (v_place, v_bad)):
            args[place] = [[30, bad], [30]] if place == "dim" else bad
        calls.append(call(args["dim"], args["world"], args["setting"], args["param"], args["reduce"]))
    n = rng.choice([4, 6, 8, 12])
    calls.append(call(_shapes(rng), n, rng.choice([k for k in range(2, 2 * n) if n % k]), 2, 4))
    calls.append(call(_shapes(rng), n, rng.choice([True, False, 2]), 4, 4.0))
    rng.shuffle(calls)
    return calls


def observe_traffic_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "fsdp_step_traffic", calls)


HIDDEN["fsdp_step_traffic"] = [
    Case("every setting on 1 to 8 ranks and more: padded shards, True, False, each divisor as an int",
         observe_traffic_calls, judge_calls(reference_traffic, "fsdp_step_traffic"), draw=draw_settings),
    Case("bad input: ValueError for sizes < 1 and an int setting that does not divide, TypeError for non-ints, "
         "checked first",
         observe_traffic_calls, judge_calls(reference_traffic, "fsdp_step_traffic"), draw=draw_bad_traffic),
]

MESH_PUBLIC_CASE = "4 ranks on nodes of 2, 6 on nodes of 3, one node: shape and groups"
MESH_BAD_PUBLIC_CASE = "nodes that do not divide, zero GPUs, a float: ValueError or TypeError"
TRAFFIC_PUBLIC_CASE = "a 30-wide Linear on 4 ranks: True, False (bf16), 2; one rank"
TRAFFIC_BAD_PUBLIC_CASE = "3 does not divide 4, a float setting, world_size 0: ValueError or TypeError"
_MESH, _TRAFFIC = HIDDEN["hsdp_mesh"], HIDDEN["fsdp_step_traffic"]
CLAUSES = {
    "hsdp_mesh": {
        "returns a dict with exactly shape, shard_groups and replicate_groups": [MESH_PUBLIC_CASE, _MESH[0].name],
        "shape is the tuple (world_size // gpus_per_node, gpus_per_node)": [MESH_PUBLIC_CASE, _MESH[0].name],
        "shard_groups[r]: the ranks of r's node, in order": [MESH_PUBLIC_CASE, _MESH[0].name],
        "replicate_groups[r]: the ranks with r's local index on every node, in order": [MESH_PUBLIC_CASE, _MESH[0].name],
        "one node (replicate 1) and one GPU per node (shard 1) are allowed": [MESH_PUBLIC_CASE, _MESH[0].name],
        "ValueError when a size is < 1 or gpus_per_node does not divide world_size": [MESH_BAD_PUBLIC_CASE, _MESH[1].name],
        "TypeError when an argument is not an int (a bool is not), checked first": [MESH_BAD_PUBLIC_CASE, _MESH[1].name],
    },
    "fsdp_step_traffic": {
        "returns a dict of two ints, all_gather and reduce_scatter": [TRAFFIC_PUBLIC_CASE, _TRAFFIC[0].name],
        "each parameter sharded on dim 0 in ceil(rows / N) rows per rank (padded)": [TRAFFIC_PUBLIC_CASE, _TRAFFIC[0].name],
        "forward all-gather: (N - 1) c param_bytes": [TRAFFIC_PUBLIC_CASE, _TRAFFIC[0].name],
        "True: the backward all-gather again; False: none": [TRAFFIC_PUBLIC_CASE, _TRAFFIC[0].name],
        "an int k: backward all-gather in groups of k, (k - 1) (N c / k) param_bytes; k = 1 as False, k = N as True":
            [TRAFFIC_PUBLIC_CASE, _TRAFFIC[0].name],
        "True and False are bools, not the ints 1 and 0": [TRAFFIC_PUBLIC_CASE, _TRAFFIC[0].name],
        "reduce-scatter: (N - 1) c reduce_bytes": [TRAFFIC_PUBLIC_CASE, _TRAFFIC[0].name],
        "shapes: a list or tuple of shapes (lists or tuples), possibly empty; any ints, above 2**53 too":
            [_TRAFFIC[0].name],
        "one rank receives nothing": [TRAFFIC_PUBLIC_CASE, _TRAFFIC[0].name],
        "ValueError: sizes < 1, a shape with no dimension, an int setting outside 1..N or not dividing N":
            [TRAFFIC_BAD_PUBLIC_CASE, _TRAFFIC[1].name],
        "TypeError: a non-int count or dimension (bools included), a setting neither bool nor int, checked first":
            [TRAFFIC_BAD_PUBLIC_CASE, _TRAFFIC[1].name],
    },
}

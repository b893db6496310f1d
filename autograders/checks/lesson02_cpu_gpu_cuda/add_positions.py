"""Hidden checks for lesson 2: add_positions (the package's docstring says how every part works)."""

# --- add_positions ------------------------------------------------------------------------
# x is drawn here (shape, values, dtype, device, a non-contiguous layout); the observers build it in
# the sandbox from the drawn values and report the result; the judges compute x + p here.

FLOATS = ["float64", "float32", "float16", "bfloat16"]
TOLERANCE = {"float64": 1e-6, "float32": 1e-5, "float16": 2 ** -9, "bfloat16": 2 ** -6}  # a few of the dtype's ulps


def _shape(rng):
    return [rng.randint(1, 4), rng.randint(1, 40), rng.randint(1, 4)]


def _x_spec(rng, shape, dtype="float64", device="cpu", transposed=False):
    size = shape[0] * shape[1] * shape[2]
    return {"shape": shape, "dtype": dtype, "device": device, "transposed": transposed,
            "values": [round(rng.uniform(-4, 4), 4) for _ in range(size)]}


def build_x(spec):
    """The tensor a drawn spec stands for (the observers hold the same lines): values in row-major
    order of ``shape``; ``transposed`` stores them as (length, batch, dim) and transposes, so x is not
    contiguous."""
    import torch

    batch, length, dim = spec["shape"]
    values = torch.tensor(spec["values"], dtype=torch.float64).reshape(batch, length, dim)
    x = values.transpose(0, 1).contiguous().transpose(0, 1) if spec["transposed"] else values
    return x.to(dtype=getattr(torch, spec["dtype"]))


def reference_positions(spec):
    """x + p, p[j] = j / length, in float64 from x's values as x's dtype holds them (None on meta)."""
    import torch

    x = build_x(spec).double()
    length = x.shape[1]
    return (x + (torch.arange(length, dtype=torch.float64) / length).view(1, length, 1)).reshape(-1).tolist()


def observe_positions(ns, specs):
    import torch

    from gpucourse.checks import answer

    found = []
    for spec in specs:
        batch, length, dim = spec["shape"]
        values = torch.tensor(spec["values"], dtype=torch.float64).reshape(batch, length, dim)
        x = values.transpose(0, 1).contiguous().transpose(0, 1) if spec["transposed"] else values
        x = x.to(dtype=getattr(torch, spec["dtype"])).to(spec["device"])
        kept = x.clone()
        out = answer(ns, "add_positions")(x)
        entry = {"type": type(out).__name__}
        if isinstance(out, torch.Tensor):
            entry.update(device=str(out.device), dtype=str(out.dtype).removeprefix("torch."), shape=list(out.shape),
                         same_object=out is x)
            if x.device.type != "meta":
                entry["shares_memory"] = out.numel() > 0 and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
                entry["x_unchanged"] = bool(torch.equal(x, kept))
                if out.device.type == "cpu" and list(out.shape) == list(x.shape):
                    entry["values"] = out.double().reshape(-1).tolist()
        found.append(entry)
    return found


def _judge_positions(found, specs, check_values=True, check_new=False):
    if not isinstance(found, list) or len(found) != len(specs):
        return "the answer was not called on every drawn x"
    for spec, got in zip(specs, found):
        where = f"x of shape {spec['shape']} as {spec['dtype']} on {spec['device']}" + \
            (", not contiguous" if spec["transposed"] else "")
        if got["type"] != "Tensor":
            return f"for {where} the result is a {got['type']}, not a tensor"
        if (got["device"], got["dtype"], got["shape"]) != (spec["device"], spec["dtype"], spec["shape"]):
            return f"for {where} the result was {got['device']}/{got['dtype']}/{got['shape']}: dtype, device and shape follow x"
        if check_new and spec["device"] != "meta":
            if not got["x_unchanged"]:
                return f"for {where}: x was changed: leave it as it was"
            if got["same_object"] or got["shares_memory"]:
                return f"for {where}: the result is x itself (or shares its memory): return a new tensor"
        if check_values and spec["device"] == "cpu":
            want = reference_positions(spec)
            tolerance = TOLERANCE[spec["dtype"]]
            values = got.get("values")
            if values is None or len(values) != len(want) or not all(
                    abs(v - w) <= tolerance * max(1.0, abs(w)) for v, w in zip(values, want)):  # NaN is never close
                return f"for {where} (random values) the result is not x + p"
    return None


# lengths where torch.arange(0, 1, 1 / length) gives length + 1 values (its size is computed from a
# rounded float step): p must have exactly one value per position
FLOAT_STEP_OVERSHOOTS = [98, 103, 107, 196, 197, 206, 214]


def draw_positions_values(rng):
    """float64 x: length 1, batch 1, dim 1, lengths where a float step 1/length overshoots (49, one
    more), length 0, an empty batch, an empty dim, a non-contiguous x, then drawn shapes."""
    shapes = [[1, 7, 1], [3, 1, 2], [2, 13, 1], [2, 49, 2], [1, rng.choice(FLOAT_STEP_OVERSHOOTS), 1],
              [2, 0, 3], [0, 5, 3], [2, 9, 0]]
    specs = [_x_spec(rng, shape) for shape in shapes]
    specs.append(_x_spec(rng, [rng.randint(2, 4), rng.randint(2, 12), rng.randint(2, 4)], transposed=True))
    specs += [_x_spec(rng, _shape(rng), transposed=rng.random() < 0.5) for _ in range(3)]
    return specs


def draw_positions_follow_x(rng):
    """Every floating dtype on the CPU, and on the meta device; shapes drawn, one of them long enough
    for float16's and bfloat16's integers to run out (length above 256)."""
    specs = [_x_spec(rng, _shape(rng), dtype) for dtype in FLOATS]
    specs.append(_x_spec(rng, [1, rng.randint(257, 600), 1], rng.choice(["float16", "bfloat16"])))
    specs += [_x_spec(rng, _shape(rng), dtype, device="meta") for dtype in rng.sample(FLOATS, 2)]
    return specs


def draw_positions_new_tensor(rng):
    """Boundaries first (length 1, where p is all zeros; length 0, an empty batch, an empty dim, where
    there is nothing to add), then drawn x: every time a new tensor, x unchanged."""
    specs = [_x_spec(rng, shape) for shape in ([3, 1, 2], [2, 0, 3], [0, 5, 3], [2, 9, 0])]
    return specs + [_x_spec(rng, _shape(rng), rng.choice(FLOATS), transposed=rng.random() < 0.5) for _ in range(2)]


def judge_positions_values(found, specs):
    return _judge_positions(found, specs)


def judge_positions_follow_x(found, specs):
    return _judge_positions(found, specs)


def judge_positions_new_tensor(found, specs):
    return _judge_positions(found, specs, check_values=False, check_new=True)

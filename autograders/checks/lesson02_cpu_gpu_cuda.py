"""Hidden checks for lesson 2 (CPU vs GPU, and CUDA). Never released; see lesson01's file for the form.

Every hidden case of a code exercise draws its inputs at grading time (``draw=``: boundaries first,
then random draws from the whole domain the text states): the sandbox gets them after the last cell,
and the judges compute the expected values here. ``CLAUSES`` (at the end) maps every clause of each
exercise's text to the cases that hold it.
"""

from gpucourse.checks import Case

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


def draw_positions_values(rng):
    """float64 x: length 1, batch 1, dim 1, an empty batch, a non-contiguous x, then drawn shapes."""
    shapes = [[1, 7, 1], [3, 1, 2], [2, 13, 1], [0, 5, 3], [2, 9, 0]]
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
    return [_x_spec(rng, _shape(rng), rng.choice(FLOATS), transposed=rng.random() < 0.5) for _ in range(2)]


def judge_positions_values(found, specs):
    return _judge_positions(found, specs)


def judge_positions_follow_x(found, specs):
    return _judge_positions(found, specs)


def judge_positions_new_tensor(found, specs):
    return _judge_positions(found, specs, check_values=False, check_new=True)


# --- measure ------------------------------------------------------------------------------
# The per-call times, warm-up and repeat counts are drawn here; the sandbox runs them on
# gpucourse.cpu_gpu_cuda.AsyncDevice (whose first `cold_launches` launches are slower, as a GPU's are) and
# reports the answer's seconds and the number of launches; the judges compute the median here.

def draw_measure_median(odd):
    def draw(rng):
        """Per-call times in an order drawn here: a few short, the median, as many long ones (so that a
        mean, a trimmed mean or a minimum is far from the median); warmup drawn from 0 to 2. The gaps
        leave an honest median at least 25 ms under the upper bound (a busy machine's late wake-ups add
        to every call; long calls of 0.16-0.24 s left as little as 8.6 ms, which a loaded run used up),
        a mean 25 ms above it and a minimum 13 ms under the lower one (worst of 80,000 sampled draws)."""
        plans = []
        for n in ([5, 7] if odd else [6, 4]):
            half = (n - 1) // 2 if odd else n // 2 - 1
            short = [round(rng.uniform(0.005, 0.012), 4) for _ in range(half)]
            middle = [round(rng.uniform(0.03, 0.045), 4) for _ in range(1 if odd else 2)]
            long = [round(rng.uniform(0.3, 0.36), 4) for _ in range(half)]
            plan = short + middle + long
            rng.shuffle(plan)
            plans.append({"warmup": rng.randint(0, 2), "plan": plan})
        return plans[0] if rng.random() < 0.5 else plans[1]
    return draw


def observe_measure_plan(ns, drawn):
    from gpucourse.checks import answer
    from gpucourse.cpu_gpu_cuda import AsyncDevice

    device = AsyncDevice(cold_launches=0)  # the warm-up cases check warm-up
    work = [0.02] * drawn["warmup"] + drawn["plan"]
    seconds = answer(ns, "measure")(lambda: device.launch(work[min(device.launches, len(work) - 1)]),
                                    device.synchronize, warmup=drawn["warmup"], repeats=len(drawn["plan"]))
    return {"seconds": float(seconds), "launches": device.launches}


def reference_median_bounds(plan):
    """What the text accepts: the middle time, or for an even count anything from the lower middle to
    the upper one; the upper bound halfway to the mean leaves room for a busy machine's delays."""
    times = sorted(plan)
    n = len(times)
    low, high = times[(n - 1) // 2], times[n // 2]
    return 0.85 * low, (high + sum(times) / n) / 2


def judge_measure_plan(d, drawn):
    warmup, n = drawn["warmup"], len(drawn["plan"])
    if d["launches"] != warmup + n:
        return f"with warmup={warmup}, repeats={n}, run should be called {warmup + n} times, was called {d['launches']}"
    low, high = reference_median_bounds(drawn["plan"])
    if not low <= d["seconds"] <= high:
        return (f"repeats={n} whose calls take different times: measured {1000 * d['seconds']:.1f} ms, "
                "not the median of the per-call times")
    return None


def draw_measure_warmup(rng):
    """warmup=0 (no warm-up at all), then 1 to 4; repeats drawn from 1 to 4; arguments given by position."""
    return [{"warmup": 0, "repeats": rng.randint(2, 4), "work": round(rng.uniform(0.02, 0.035), 4)},
            {"warmup": rng.randint(1, 4), "repeats": rng.randint(1, 4), "work": round(rng.uniform(0.02, 0.035), 4)}]


def observe_measure_warmup(ns, runs):
    from gpucourse.checks import answer
    from gpucourse.cpu_gpu_cuda import AsyncDevice

    result = []
    for run in runs:
        device = AsyncDevice(cold_launches=run["warmup"], cold_seconds=0.06)
        seconds = answer(ns, "measure")(lambda: device.launch(run["work"]), device.synchronize,
                                        run["warmup"], run["repeats"])  # positional
        result.append({"seconds": float(seconds), "launches": device.launches})
    return result


def _judge_runs(found, runs):
    """Each run: ``warmup``, ``repeats`` (None: the default) and ``work`` seconds per call."""
    if not isinstance(found, list) or len(found) != len(runs):
        return "the answer was not called on every drawn input"
    for run, got in zip(runs, found):
        warmup = 2 if run.get("warmup") is None else run["warmup"]
        repeats = 5 if run.get("repeats") is None else run["repeats"]
        if got["launches"] != warmup + repeats:
            return (f"with warmup={warmup}, repeats={repeats}, run should be called {warmup + repeats} times, "
                    f"was called {got['launches']}")
        expected, seconds = run["work"], got["seconds"]
        if not 0.6 * expected <= seconds <= 1.8 * expected:
            return (f"with warmup={warmup}, repeats={repeats}: measured {1000 * seconds:.1f} ms per call for "
                    f"{1000 * expected:.0f} ms of work per call")
    return None


def judge_measure_warmup(found, runs):
    return _judge_runs(found, runs)


def draw_measure_one_repeat(rng):
    """repeats=1 after 1 to 3 slow warm-up calls: their queued work must not reach the one timed call."""
    return [{"warmup": rng.randint(1, 3), "repeats": 1, "work": round(rng.uniform(0.015, 0.025), 4)}]


def observe_measure_one_repeat(ns, runs):
    from gpucourse.checks import answer
    from gpucourse.cpu_gpu_cuda import AsyncDevice

    result = []
    for run in runs:
        device = AsyncDevice(cold_launches=run["warmup"], cold_seconds=0.08)
        seconds = answer(ns, "measure")(lambda: device.launch(run["work"]), device.synchronize,
                                        warmup=run["warmup"], repeats=run["repeats"])
        result.append({"seconds": float(seconds), "launches": device.launches})
    return result


def judge_measure_one_repeat(found, runs):
    return _judge_runs(found, runs)


def draw_measure_defaults(rng):
    """Both defaults (warmup=2, repeats=5), then each given alone (the other left to its default)."""
    return [{"warmup": None, "repeats": None, "work": round(rng.uniform(0.02, 0.03), 4)},
            {"warmup": None, "repeats": rng.choice([1, 3]), "work": round(rng.uniform(0.02, 0.03), 4)},
            {"warmup": rng.choice([0, 1, 3]), "repeats": None, "work": round(rng.uniform(0.015, 0.02), 4)}]


def observe_measure_defaults(ns, runs):
    from gpucourse.checks import answer
    from gpucourse.cpu_gpu_cuda import AsyncDevice

    result = []
    for run in runs:
        given = {k: run[k] for k in ("warmup", "repeats") if run[k] is not None}
        device = AsyncDevice(cold_launches=given.get("warmup", 2), cold_seconds=0.06)  # as the warm-up calls absorb
        seconds = answer(ns, "measure")(lambda: device.launch(run["work"]), device.synchronize, **given)
        result.append({"type": f"{type(seconds).__module__}.{type(seconds).__qualname__}",
                       "is_float": isinstance(seconds, float), "seconds": float(seconds), "launches": device.launches})
    return result


def judge_measure_defaults(found, runs):
    for got in found if isinstance(found, list) else []:
        if not got["is_float"]:
            return f"measure returned a {got['type']}: return the seconds as a float"
    return _judge_runs(found, runs)


# --- sync_lines ---------------------------------------------------------------------------
# 1. a set of ints (a list or tuple is read as one), numbers 1 to 14                 -> "ints" (and public)
# 2. every line where a GPU value becomes a Python value                             -> "a GPU value ..."
# 3. every copy to the CPU and every operation whose output size depends on the data -> "copies to the CPU ..."
# 4. every explicit wait                                                             -> "explicit waits"
# 5. no line that only queues work                                                   -> "lines that only queue work"

def observe_sync_lines_as_given(ns):
    import numbers
    from gpucourse.checks import answer
    lines = answer(ns, "sync_lines")
    items = list(lines)
    ints = [int(n) for n in items if isinstance(n, numbers.Integral) and not isinstance(n, bool)]
    return {"lines": sorted(set(ints)), "not_ints": [f"{type(n).__name__} {n!r}"[:40] for n in items
                                                     if not isinstance(n, numbers.Integral) or isinstance(n, bool)]}


def _sync_judge(expected, what):
    def judge(d):
        if not d["lines"] and not d["not_ints"]:
            return "no line numbers given"
        if d["not_ints"]:
            return None  # reported once, by the "ints" case
        missed = len(set(expected) - set(d["lines"]))
        return f"{missed} of the {what} missed" if missed else None
    return judge


SYNC_LINES = {4, 6, 8, 10, 11, 13}


def judge_sync_ints(d):
    if d["not_ints"]:
        return f"give the line numbers as ints, got {d['not_ints'][0]}"
    return None if d["lines"] else "no line numbers given"


def judge_sync_only_queue(d):
    if not d["lines"]:
        return "no line numbers given"
    extra = len(set(d["lines"]) - SYNC_LINES)
    return f"{extra} line(s) chosen that only queue work" if extra else None




# --- triton_scaled_add ----------------------------------------------------------------------
# Sizes, block sizes, dtypes, alphas and the inputs' seed are drawn here. The sandbox launches the
# answer in Triton's interpreter on guarded CPU tensors in a child process and reports what it wrote
# (every value of out), whether anything around out or in x and y changed; the judges build the same
# x and y from the drawn seed and compute alpha * x + y here. Alphas are drawn among floats that
# float32 holds exactly (Triton passes a Python float to a kernel as a float32).

BLOCKS = [16, 32, 64, 128, 256, 512, 1024]
ALPHAS = [0.0, -1.0, 1.0, 0.5, -0.75, 2.5, -3.0, 1024.0, 0.015625, -96.5]
RTOL = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-2}
ATOL = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-2}


def _kernel_launch_draw(rng, n, block, dtype, alpha=None):
    return {"n": n, "block_size": block, "dtype": dtype, "alpha": rng.choice(ALPHAS) if alpha is None else alpha,
            "seed": rng.randrange(2 ** 31)}


def draw_triton_sizes(rng):
    """float32: one element, fewer than a block, whole blocks, one past and one short of a multiple of
    the block, with blocks of 16 to 256 and alphas drawn (0 and negative among them)."""
    configs = []
    for n_of in (lambda b: 1, lambda b: rng.randint(2, b - 1), lambda b: b * rng.randint(2, 5),
                 lambda b: b * rng.randint(2, 5) + 1, lambda b: b * rng.randint(2, 5) - 1,
                 lambda b: rng.randint(b + 1, 6 * b)):
        block = rng.choice(BLOCKS[:5])
        configs.append(_kernel_launch_draw(rng, n_of(block), block, "float32"))
    configs[rng.randrange(len(configs))]["alpha"] = 0.0
    configs[rng.randrange(len(configs))]["alpha"] = rng.choice([-0.75, -3.0, -96.5])
    return configs


def draw_triton_large(rng):
    """Blocks of 512 and 1024: one element, a partial last block, whole blocks."""
    return [_kernel_launch_draw(rng, 1, 1024, "float32"), _kernel_launch_draw(rng, rng.randint(1025, 2047), 1024, "float32"),
            _kernel_launch_draw(rng, 512 * rng.randint(2, 4), 512, rng.choice(["float32", "float16"]))]


def draw_triton_dtypes(rng):
    """float64 and float16, each twice: sizes and blocks drawn, a partial last block among them."""
    configs = []
    for dtype in ("float64", "float16"):
        block = rng.choice(BLOCKS[:5])
        configs += [_kernel_launch_draw(rng, rng.randint(1, block - 1) if rng.random() < 0.5 else 1, block, dtype),
                    _kernel_launch_draw(rng, block * rng.randint(1, 4) + rng.randint(1, block - 1), block, dtype)]
    return configs


def build_inputs(config):
    """x and y of a drawn config, from its seed (the observers hold the same lines)."""
    import torch

    generator = torch.Generator().manual_seed(config["seed"])
    dtype = getattr(torch, config["dtype"])
    x = torch.randn(config["n"], generator=generator, dtype=torch.float64).to(dtype)
    y = torch.randn(config["n"], generator=generator, dtype=torch.float64).to(dtype)
    return x, y


def observe_triton_launches(ns, configs):
    from gpucourse.checks import answer
    from gpucourse.kernels import GUARD, INTERPRET_ENV, have_triton, kernels_as, run_isolated

    launcher = answer(ns, "scaled_add")

    def rows():
        import contextlib
        import os

        import torch

        os.environ[INTERPRET_ENV] = "1"
        kernels = kernels_as("interpreted", ns, launcher) if have_triton() else contextlib.nullcontext()
        with kernels:
            for config in configs:
                n, dtype = config["n"], getattr(torch, config["dtype"])
                generator = torch.Generator().manual_seed(config["seed"])
                buffers, views = [], []
                for fill, values in ((0.5, torch.randn(n, generator=generator, dtype=torch.float64)),
                                     (0.25, torch.randn(n, generator=generator, dtype=torch.float64)),
                                     (-3.0, None)):
                    base = torch.full((2 * GUARD + n,), fill, dtype=dtype)
                    view = base[GUARD:GUARD + n]
                    view.copy_(values.to(dtype)) if values is not None else view.fill_(float("nan"))
                    buffers.append(base)
                    views.append(view)
                kept = [b.clone() for b in buffers]
                x, y, out = views
                row = {"n": n}
                try:
                    returned = launcher(x, y, config["alpha"], out, block_size=config["block_size"])
                except Exception as error:
                    row["error"] = f"{type(error).__name__}: {error}"[:300]
                    yield row
                    continue
                around = torch.cat([buffers[2][:GUARD], buffers[2][GUARD + n:]])
                kept_around = torch.cat([kept[2][:GUARD], kept[2][GUARD + n:]])
                row.update({"returned_out": returned is out, "out": out.double().tolist(),
                            "past_end": not torch.equal(around, kept_around),
                            "inputs_changed": not (torch.equal(buffers[0], kept[0]) and torch.equal(buffers[1], kept[1]))})
                yield row

    return run_isolated(rows)


def judge_triton_launches(rows, configs):
    import math


    for config, row in zip(configs, rows):
        where = f"n={config['n']}, block_size={config['block_size']}, {config['dtype']}, alpha={config['alpha']}"
        if "crashed" in row:
            return f"the process running the kernel died ({row['crashed']}): a load or store far outside the tensors?"
        if "timeout" in row:
            return f"the launches did not finish within {row['timeout']:g} s"
        if "error" in row:
            return f"{where}: raised {row['error']}"
        if row.get("n") != config["n"]:
            return "the launches were not the drawn ones"
        if row["past_end"]:
            return f"{where}: wrote past the end of out"
        if row["inputs_changed"]:
            return f"{where}: changed x or y"
        if not row["returned_out"]:
            return f"{where}: did not return out (write into the out tensor you are given)"
        got = row["out"]
        unwritten = [i for i, v in enumerate(got) if isinstance(v, float) and math.isnan(v)]
        if unwritten:
            return f"{where}: {len(unwritten)} of {config['n']} elements of out never written (the first at index {unwritten[0]})"
        x, y = build_inputs(config)
        dtype = x.dtype
        want = (config["alpha"] * x.double() + y.double()).to(dtype).double().tolist()
        rtol, atol = RTOL[config["dtype"]], ATOL[config["dtype"]]
        wrong = sum(1 for g, w in zip(got, want) if not math.isclose(g, w, rel_tol=rtol, abs_tol=atol))
        if wrong or len(got) != len(want):
            return f"{where}: {wrong} of {config['n']} values differ from alpha * x + y (to {config['dtype']} precision)"
    if len(rows) < len(configs):
        error = next((r for r in rows if "error" in r or "crashed" in r or "timeout" in r), None)
        return f"only {len(rows)} of {len(configs)} launches reported" + (f" ({error})" if error else "")
    return None


def draw_triton_one_pass(rng):
    """(n, block_size, dtype) with one element, a partial block, whole blocks; alpha and the seed drawn."""
    configs = [[1, rng.choice(BLOCKS[:3]), "float32"]]
    for _ in range(4):
        block = rng.choice(BLOCKS[:5])
        configs.append([rng.choice([block * rng.randint(1, 3), rng.randint(2, 3 * block)]), block, "float32"])
    configs.append([rng.randint(2, 100), rng.choice(BLOCKS[:3]), rng.choice(["float16", "float64"])])
    return {"configs": configs, "alpha": rng.choice([a for a in ALPHAS if a]), "seed": rng.randrange(2 ** 31)}


def observe_triton_one_pass(ns, drawn):
    """Each launch in a child process, in Triton's interpreter: the output, how many kernel launches ran,
    the widths of the kernel's tl.arange, and the torch operations the launcher ran outside its kernel."""
    import os
    from gpucourse.checks import answer
    from gpucourse.kernels import INTERPRET_ENV, kernels_as, run_isolated
    launcher = answer(ns, "scaled_add")
    configs, alpha, seed = drawn["configs"], drawn["alpha"], drawn["seed"]

    def rows():
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from triton.runtime import interpreter
        os.environ[INTERPRET_ENV] = "1"
        seen = {"widths": set(), "launches": 0, "inside": 0, "ops": []}
        make_range, run = interpreter.InterpreterBuilder.create_make_range, interpreter.InterpretedFunction.run

        def counted_range(self, ret_ty, start, stop):
            seen["widths"].add(int(stop) - int(start))
            return make_range(self, ret_ty, start, stop)

        def counted_run(self, *args, **kwargs):
            seen["launches"] += 1
            seen["inside"] += 1
            try:
                return run(self, *args, **kwargs)
            finally:
                seen["inside"] -= 1

        class TorchOutside(TorchDispatchMode):  # what the launcher computes or allocates in torch itself
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                result = func(*args, **(kwargs or {}))
                if not seen["inside"] and not getattr(func, "is_view", False):
                    outputs = result if isinstance(result, (tuple, list)) else [result]
                    if any(isinstance(t, torch.Tensor) and t.numel() > 1 for t in outputs):
                        seen["ops"].append(str(func.overloadpacket.__name__))
                return result

        interpreter.InterpreterBuilder.create_make_range = counted_range
        interpreter.InterpretedFunction.run = counted_run
        generator = torch.Generator().manual_seed(seed)
        with kernels_as("interpreted", ns, launcher):
            for n, block_size, dtype_name in configs:
                dtype = getattr(torch, dtype_name)
                x = torch.randn(n, generator=generator).to(dtype)
                y = torch.randn(n, generator=generator).to(dtype)
                out = torch.full((n,), float("nan"), dtype=dtype)
                seen.update(widths=set(), launches=0, inside=0, ops=[])
                row = {"n": n, "block_size": block_size, "dtype": dtype_name}
                try:
                    with TorchOutside():
                        returned = launcher(x, y, alpha, out, block_size=block_size)
                except Exception as error:
                    row["error"] = f"{type(error).__name__}: {error}"[:300]
                    yield row
                    continue
                row.update({"out": out.double().tolist(), "returned_out": returned is out,
                            "widths": sorted(seen["widths"]), "launches": seen["launches"], "ops": sorted(set(seen["ops"]))})
                yield row

    return run_isolated(rows)


def judge_triton_one_pass(d, drawn):
    import math
    import torch
    configs = drawn["configs"]
    generator = torch.Generator().manual_seed(drawn["seed"])
    if len(d) < len(configs):
        return next((f"raised {r['error']}" for r in d if "error" in r), None) or \
            next((f"the process running the kernel died ({r['crashed']})" for r in d if "crashed" in r), None) or \
            f"only {len(d)} of {len(configs)} launches reported"
    for (n, block_size, dtype_name), row in zip(configs, d):
        dtype = getattr(torch, dtype_name)
        x = torch.randn(n, generator=generator).to(dtype)
        y = torch.randn(n, generator=generator).to(dtype)
        where = f"n={n}, block_size={block_size}, {dtype_name}"
        if "error" in row:
            return f"{where}: raised {row['error']}"
        if row["launches"] != 1:
            return f"{where}: {row['launches']} kernel launches for one call: compute alpha * x + y in one kernel"
        if row["ops"]:
            return (f"{where}: the launcher computed or allocated tensors in torch ({', '.join(row['ops'])}): "
                    "one pass, no temporary tensor")
        if not row["widths"] or max(row["widths"]) != block_size:
            return (f"{where}: the kernel's blocks are {max(row['widths'], default=0)} elements wide, not "
                    "block_size: pass block_size to the kernel as its tl.constexpr block")
        if not row["returned_out"]:
            return f"{where}: did not return out"
        want = (drawn["alpha"] * x.double() + y.double()).to(dtype).double().tolist()
        tolerance = {torch.float16: 1e-2, torch.float64: 1e-12}.get(dtype, 1e-5)
        got = row["out"]
        if len(got) != n or not all(isinstance(g, float) and math.isclose(g, w, rel_tol=tolerance, abs_tol=tolerance)
                                    for g, w in zip(got, want)):
            return f"{where}: out differs from alpha * x + y"
    return None


HIDDEN = {
    "add_positions": [
        Case("values: x + p on random x of other shapes (length 1, an empty batch, non-contiguous)", observe_positions,
             judge_positions_values, draw=draw_positions_values),
        Case("dtype, device and shape follow x (every floating dtype, meta, long float16 and bfloat16)", observe_positions,
             judge_positions_follow_x, draw=draw_positions_follow_x),
        Case("a new tensor, x unchanged (random x)", observe_positions, judge_positions_new_tensor,
             draw=draw_positions_new_tensor),
    ],
    "measure": [
        Case("the median of the repeats (an odd count)", observe_measure_plan, judge_measure_plan,
             draw=draw_measure_median(odd=True)),
        Case("the median of the repeats (an even count: between the two middle times)", observe_measure_plan,
             judge_measure_plan, draw=draw_measure_median(odd=False)),
        Case("warm-up calls run first and stay out of the result; positional arguments", observe_measure_warmup,
             judge_measure_warmup, draw=draw_measure_warmup),
        Case("one repeat: the warm-up's queued work is not timed", observe_measure_one_repeat, judge_measure_one_repeat,
             draw=draw_measure_one_repeat),
        Case("the defaults (warmup=2, repeats=5), each alone too, and a float", observe_measure_defaults,
             judge_measure_defaults, draw=draw_measure_defaults),
    ],
    "sync_lines": [
        Case("line numbers are ints", observe_sync_lines_as_given, judge_sync_ints),
        Case("lines where a GPU value becomes a Python value", observe_sync_lines_as_given,
             _sync_judge({4, 8, 10}, "lines where a GPU value becomes a Python value")),
        Case("copies to the CPU and data-dependent sizes", observe_sync_lines_as_given,
             _sync_judge({6, 11}, "copies to the CPU and data-dependent sizes")),
        Case("explicit waits", observe_sync_lines_as_given, _sync_judge({13}, "explicit waits")),
        Case("lines that only queue work", observe_sync_lines_as_given, judge_sync_only_queue),
    ],
    "triton_scaled_add": [
        Case("generated sizes next to multiples of the block, any alpha (0, negative)", observe_triton_launches,
             judge_triton_launches, draw=draw_triton_sizes),
        Case("large blocks (512, 1024)", observe_triton_launches, judge_triton_launches, draw=draw_triton_large),
        Case("float64 and float16, other sizes", observe_triton_launches, judge_triton_launches, draw=draw_triton_dtypes),
        Case("one pass: one kernel launch, block_size elements per program, no temporary tensor",
             observe_triton_one_pass, judge_triton_one_pass, draw=draw_triton_one_pass),
    ],
}

_AP = [case.name for case in HIDDEN["add_positions"]]
_ME = [case.name for case in HIDDEN["measure"]]
_TR = [case.name for case in HIDDEN["triton_scaled_add"]]
CLAUSES = {
    "add_positions": {
        "returns x + p with p[j] = j / length, the same for every batch element and feature":
            ["float32 on the CPU: values, shape, input untouched", _AP[0], _AP[1]],
        "for x of shape (batch, length, dim), whatever they are (length 1, an empty batch, not contiguous)": [_AP[0]],
        "the result has x's device, dtype and shape, whatever they are":
            ["follows x to another device and dtype (meta, float16)", _AP[1]],
        "a new tensor; x left unchanged": ["float32 on the CPU: values, shape, input untouched", _AP[2]],
    },
    "measure": {
        "measure(run, synchronize, warmup=2, repeats=5): those defaults, each alone too": [_ME[4]],
        "warmup and repeats given by position too": [_ME[2]],
        "calls run exactly warmup + repeats times (warmup 0 too, repeats 1 too)": [_ME[0], _ME[2], _ME[3]],
        "leaves the warm-up calls out of the result, and the work they queued too": [_ME[2], _ME[3]],
        "run only queues work: each call timed up to the end of its work (synchronize)":
            ["20 ms of asynchronous work per call measures as about 20 ms", _ME[2]],
        "the median seconds per call over the repeats (not the mean, a trimmed mean, total or minimum)": [_ME[0], _ME[1]],
        "with an even number of repeats, either middle time or the mean of the two": [_ME[1]],
        "returns a float": [_ME[4]],
    },
    "triton_scaled_add": {
        "out = alpha * x + y for any n >= 1: one element, fewer than a block, whole blocks, a partial last block":
            ["n smaller than one block", "a partial last block", _TR[0], _TR[1]],
        "alpha is any Python float (0, negative)": [_TR[0], _TR[3]],
        "any block_size (a power of two) the launcher is given, each program handling block_size elements":
            [_TR[0], _TR[1], _TR[3]],
        "the same dtype for x, y and out: float32, float16 or float64, computed to that dtype's precision":
            ["float16", _TR[2]],
        "writes nothing outside out[0] .. out[n-1]; leaves x and y unchanged": [_TR[0], _TR[1], _TR[2]],
        "one pass: one kernel, no temporary tensor": [_TR[3]],
        "writes the result into out (no other allocated) and returns out": [_TR[0], _TR[3]],
    },
}

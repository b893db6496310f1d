"""Hidden checks for lesson 2 (CPU vs GPU, and CUDA). Never released; see lesson01's file for the form.

Above each exercise's cases: the clauses its text states, numbered, and the case that checks each.
"""

from gpucourse.checks import Case


# --- add_positions ------------------------------------------------------------------------
# 1. x + p with p[j] = j / length, the same for every batch element and feature    -> "values ..." (and public)
#    (random x, lengths 1 to 13, batch and dim of 1, a non-contiguous x)
# 2. the result has x's shape, dtype and device, whatever they are                 -> "dtype, device and shape ..."
# 3. a new tensor, and x left unchanged                                            -> "a new tensor ..."

def observe_positions_values(ns):
    import torch
    from gpucourse.checks import answer
    g = torch.Generator().manual_seed(2)
    inputs = [torch.randn(1, 7, 1, generator=g, dtype=torch.float64), torch.randn(3, 13, 2, generator=g, dtype=torch.float64),
              torch.randn(2, 1, 4, generator=g, dtype=torch.float64),
              torch.randn(5, 2, 3, generator=g, dtype=torch.float64).transpose(0, 1)]  # (2, 5, 3), not contiguous
    result = []
    for x in inputs:
        given = x.tolist()
        out = torch.as_tensor(answer(ns, "add_positions")(x))
        result.append({"shape": list(x.shape), "x": given, "out_shape": list(out.shape),
                       "out": out.double().tolist() if list(out.shape) == list(x.shape) else None})
    return result


def _positions_inputs():
    """observe_positions_values' inputs, rebuilt here (the same seed), as nested lists."""
    import torch
    g = torch.Generator().manual_seed(2)
    inputs = [torch.randn(1, 7, 1, generator=g, dtype=torch.float64), torch.randn(3, 13, 2, generator=g, dtype=torch.float64),
              torch.randn(2, 1, 4, generator=g, dtype=torch.float64),
              torch.randn(5, 2, 3, generator=g, dtype=torch.float64).transpose(0, 1)]
    return [x.tolist() for x in inputs]


def judge_positions_values(d):
    inputs = _positions_inputs()
    if len(d) != len(inputs):
        return f"{len(d)} of {len(inputs)} inputs observed"
    for x, entry in zip(inputs, d):
        shape = [len(x), len(x[0]), len(x[0][0])]
        batch, length, dim = shape
        if entry["out_shape"] != shape:
            return f"for x of shape {shape} the result has shape {entry['out_shape']}"
        for b in range(batch):
            for j in range(length):
                for k in range(dim):
                    # float32 positions cast to float64 are fine: an off-by-one is off by 1/length
                    if not abs(entry["out"][b][j][k] - (x[b][j][k] + j / length)) <= 1e-6:  # NaN is never close
                        return f"for x of shape {shape} (random values) the result is not x + p"
    return None


def observe_positions_follow_x(ns):
    import torch
    from gpucourse.checks import answer
    g = torch.Generator().manual_seed(3)
    result = {}
    for device, dtype, shape in [("cpu", torch.float64, (2, 6, 3)), ("cpu", torch.bfloat16, (3, 9, 2)),
                                 ("cpu", torch.float16, (1, 5, 4)), ("meta", torch.bfloat16, (4, 3, 1)),
                                 ("meta", torch.float64, (2, 11, 5))]:
        base = torch.rand(shape, generator=g) * 2 - 1
        x = base.to(device=device, dtype=dtype)
        out = answer(ns, "add_positions")(x)
        entry = {"device": str(out.device), "dtype": str(out.dtype), "shape": list(out.shape)}
        if device == "cpu" and out.device.type == "cpu" and list(out.shape) == list(shape):
            entry["x"] = x.double().tolist()
            entry["out"] = out.double().tolist()
        result[f"{device}/{dtype}/{list(shape)}"] = entry
    return result


def _follow_x_inputs():
    """observe_positions_follow_x's inputs, rebuilt here: key -> x as nested lists (None on meta)."""
    import torch
    g = torch.Generator().manual_seed(3)
    inputs = {}
    for device, dtype, shape in [("cpu", torch.float64, (2, 6, 3)), ("cpu", torch.bfloat16, (3, 9, 2)),
                                 ("cpu", torch.float16, (1, 5, 4)), ("meta", torch.bfloat16, (4, 3, 1)),
                                 ("meta", torch.float64, (2, 11, 5))]:
        base = torch.rand(shape, generator=g) * 2 - 1
        inputs[f"{device}/{dtype}/{list(shape)}"] = base.to(dtype).double().tolist() if device == "cpu" else None
    return inputs


def judge_positions_follow_x(d):
    tolerance = {"torch.float64": 1e-6, "torch.bfloat16": 2**-6, "torch.float16": 2**-9}  # a few of the dtype's ulps
    inputs = _follow_x_inputs()
    if sorted(d) != sorted(inputs):
        return "not every device, dtype and shape was tried"
    for key, x in inputs.items():
        entry = d[key]
        device, dtype, shape = key.split("/")
        if (entry["device"], entry["dtype"], str(entry["shape"])) != (device, dtype, shape):
            return (f"for x on {device} as {dtype} of shape {shape} the result was "
                    f"{entry['device']}/{entry['dtype']}/{entry['shape']}")
        if x is not None:
            if "out" not in entry:
                return f"for x on {device} as {dtype} the result could not be read"
            length = len(x[0])
            if len(entry["out"]) != len(x):
                return f"for x as {dtype} the values are not x + p (to {dtype} precision)"
            for xb, ob in zip(x, entry["out"]):
                for j, (xr, orow) in enumerate(zip(xb, ob)):
                    for xv, ov in zip(xr, orow):
                        want = xv + j / length
                        if not abs(ov - want) <= tolerance[dtype] * max(1.0, abs(want)):
                            return f"for x as {dtype} the values are not x + p (to {dtype} precision)"
    return None


def observe_positions_new_tensor(ns):
    import torch
    from gpucourse.checks import answer
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 6, 3, generator=g)
    kept = x.clone()
    out = answer(ns, "add_positions")(x)
    return {"same_object": out is x, "shares_memory": isinstance(out, torch.Tensor) and out.data_ptr() == x.data_ptr(),
            "x_unchanged": bool(torch.equal(x, kept))}


def judge_positions_new_tensor(d):
    if not d["x_unchanged"]:
        return "x was changed: leave it as it was"
    if d["same_object"] or d["shares_memory"]:
        return "the result is x itself (or shares its memory): return a new tensor"
    return None


# --- measure ------------------------------------------------------------------------------
# 1. measure(run, synchronize, warmup=2, repeats=5): those defaults, positional too  -> "the defaults ..."
# 2. calls run exactly warmup + repeats times                                       -> every case ("ran ... times")
# 3. leaves the warm-up calls out of the result (their queued work too)              -> "warm-up ...", "one repeat ..."
# 4. times each call up to the end of its work: run only queues, synchronize waits    -> every case (values)
# 5. the median seconds per call over the repeats (not the mean, total or minimum);  -> "the median ..."
#    for an even count, anything between the two middle times
# 6. a float                                                                          -> "the defaults ..., a float"
# Work runs on gpucourse.cuda.AsyncDevice, whose first `cold_launches` launches are slower, as a GPU's are.

def observe_measure_median_odd(ns):
    import random
    from gpucourse.checks import answer
    from gpucourse.cuda import AsyncDevice
    plan = [0.02, 0.3, 0.06, 0.04, 0.1]  # median 60 ms, mean 104 ms, minimum 20 ms
    random.Random(5).shuffle(plan)
    device = AsyncDevice(cold_launches=0)  # the warm-up cases check warm-up
    work = [0.02] + plan  # one warm-up call, then the repeats
    seconds = answer(ns, "measure")(lambda: device.launch(work[min(device.launches, len(work) - 1)]),
                                    device.synchronize, warmup=1, repeats=len(plan))
    return {str(len(plan)): {"seconds": float(seconds), "launches": device.launches, "plan": sorted(plan)}}


def observe_measure_median_even(ns):
    import random
    from gpucourse.checks import answer
    from gpucourse.cuda import AsyncDevice
    plan = [0.04, 0.3, 0.02, 0.07]  # middle times 40 and 70 ms, mean 108 ms
    random.Random(4).shuffle(plan)
    device = AsyncDevice(cold_launches=0)  # the warm-up cases check warm-up
    work = [0.02] + plan
    seconds = answer(ns, "measure")(lambda: device.launch(work[min(device.launches, len(work) - 1)]),
                                    device.synchronize, warmup=1, repeats=len(plan))
    return {str(len(plan)): {"seconds": float(seconds), "launches": device.launches, "plan": sorted(plan)}}


MEASURE_PLANS = {"5": [0.02, 0.3, 0.06, 0.04, 0.1], "4": [0.04, 0.3, 0.02, 0.07]}  # the observers' per-call times


def judge_measure_median(d):
    if len(d) != 1 or next(iter(d)) not in MEASURE_PLANS:
        return "one measurement of a known plan expected"
    for repeats, got in d.items():
        n = int(repeats)
        if got["launches"] != 1 + n:
            return f"with warmup=1, repeats={n}, run should be called {1 + n} times, was called {got['launches']}"
        times = sorted(MEASURE_PLANS[repeats])
        low, high = times[(n - 1) // 2], times[n // 2]  # the middle one, or the two middle ones
        mean = sum(times) / n  # the bound halfway to the mean leaves room for a busy machine's delays
        if not 0.85 * low <= got["seconds"] <= (high + mean) / 2:
            return (f"repeats={n} whose calls take different times: measured {1000 * got['seconds']:.1f} ms, "
                    "not the median of the per-call times")
    return None


def observe_measure_warmup(ns):
    from gpucourse.checks import answer
    from gpucourse.cuda import AsyncDevice
    result = {}
    for warmup, repeats in [(3, 3), (0, 3)]:
        device = AsyncDevice(cold_launches=warmup, cold_seconds=0.06)
        seconds = answer(ns, "measure")(lambda: device.launch(0.03), device.synchronize, warmup, repeats)  # positional
        result[f"{warmup}/{repeats}"] = {"seconds": float(seconds), "launches": device.launches}
    return result


def observe_measure_one_repeat(ns):
    from gpucourse.checks import answer
    from gpucourse.cuda import AsyncDevice
    device = AsyncDevice(cold_launches=2, cold_seconds=0.08)
    seconds = answer(ns, "measure")(lambda: device.launch(0.02), device.synchronize, warmup=2, repeats=1)
    return {"2/1": {"seconds": float(seconds), "launches": device.launches, "work": 0.02}}


def observe_measure_defaults(ns):
    from gpucourse.checks import answer
    from gpucourse.cuda import AsyncDevice
    device = AsyncDevice(cold_launches=2, cold_seconds=0.06)  # as the defaults' two warm-up calls absorb
    seconds = answer(ns, "measure")(lambda: device.launch(0.025), device.synchronize)
    return {"type": f"{type(seconds).__module__}.{type(seconds).__qualname__}", "is_float": isinstance(seconds, float),
            "2/5": {"seconds": float(seconds), "launches": device.launches, "work": 0.025}}


def _judge_runs_and_seconds(d, runs=None):
    """``runs``: {"warmup/repeats": seconds of work per call}, what the observer ran (the judge's own)."""
    runs = runs if runs is not None else {"3/3": 0.03, "0/3": 0.03}
    for key, expected in runs.items():
        got = d[key]
        warmup, repeats = (int(v) for v in key.split("/"))
        if got["launches"] != warmup + repeats:
            return f"with warmup={warmup}, repeats={repeats}, run should be called {warmup + repeats} times, was called {got['launches']}"
        seconds = got["seconds"]
        if not 0.6 * expected <= seconds <= 1.8 * expected:
            return (f"with warmup={warmup}, repeats={repeats}: measured {1000 * seconds:.1f} ms per call for "
                    f"{1000 * expected:.0f} ms of work per call")
    return None


def judge_measure_defaults(d):
    if not d["is_float"]:
        return f"measure returned a {d['type']}: return the seconds as a float"
    return _judge_runs_and_seconds(d, {"2/5": 0.025})


def judge_measure_one_repeat(d):
    return _judge_runs_and_seconds(d, {"2/1": 0.02})


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
# 1. out = alpha * x + y for any n >= 1: one element, below one block, whole blocks, a partial last  -> "generated sizes ..."
#    block (seeded sizes next to multiples of the block), and for any alpha (0, negative)         (and public)
# 2. for any block_size the launcher is given (powers of two, 16 to 1024)                      -> "generated sizes ...", "large blocks ..."
# 3. in out's dtype: float16 and float64 too                                                     -> "float64 and float16 ..."
# 4. writes nothing outside out, leaves x and y unchanged, returns out itself                      -> every case (each row records it)
# 5. one pass: one kernel launch per call, no tensor computed or allocated in torch around it      -> "one pass ..."
# 6. each program handles block_size elements: the kernel's tl.arange is block_size wide           -> "one pass ..."
#    (a kernel with its own fixed block ignores the argument even where its results are right)
# The launches run in Triton's interpreter on guarded CPU tensors in a child process (probe_launch).

def observe_triton_generated(ns):
    import random
    from gpucourse.checks import answer
    from gpucourse.kernels import probe_launch
    rng = random.Random(12)
    configs = []
    for block in (16, 32, 64):
        for n in (block * rng.randint(2, 5) + rng.choice([-1, 1]), rng.randint(2, block - 1)):
            configs.append((n, block, "float32"))
    return {"configs": len(configs),
            "rows": probe_launch(answer(ns, "scaled_add"), configs, alpha=-0.75, namespaces=[ns], seed=12)}


def observe_triton_large_blocks(ns):
    from gpucourse.checks import answer
    from gpucourse.kernels import probe_launch
    configs = [(1, 1024, "float32"), (1500, 1024, "float32"), (2048, 256, "float32")]
    return {"configs": len(configs),
            "rows": probe_launch(answer(ns, "scaled_add"), configs, alpha=0.0, namespaces=[ns], seed=13)}


def observe_triton_dtypes(ns):
    from gpucourse.checks import answer
    from gpucourse.kernels import probe_launch
    configs = [(45, 16, "float64"), (129, 64, "float64"), (1, 32, "float16"), (513, 256, "float16")]
    return {"configs": len(configs),
            "rows": probe_launch(answer(ns, "scaled_add"), configs, alpha=1.25, namespaces=[ns], seed=14)}


TRITON_GENERATED = 6  # launches each case makes: the judges count them, never the observation
TRITON_LARGE = 3
TRITON_DTYPES = 4


def _judge_triton_rows(count):
    def judge(d):
        from gpucourse.kernels import probe_problem
        rows = d["rows"]
        if len(rows) < count:  # a crash or a timeout ends the rows early: say that first
            return probe_problem(rows) or f"only {len(rows)} of {count} launches reported"
        return probe_problem(rows, configs=count)
    return judge


judge_triton_generated = _judge_triton_rows(TRITON_GENERATED)
judge_triton_large = _judge_triton_rows(TRITON_LARGE)
judge_triton_dtypes = _judge_triton_rows(TRITON_DTYPES)

TRITON_ONE_PASS = [(1, 16, "float32"), (37, 16, "float32"), (100, 32, "float32"), (64, 64, "float32"),
                   (300, 128, "float32"), (77, 32, "float16")]  # (n, block_size, dtype)
TRITON_ONE_PASS_ALPHA = 1.5


def observe_triton_one_pass(ns):
    """Each launch in a child process, in Triton's interpreter: the output, how many kernel launches ran,
    the widths of the kernel's tl.arange, and the torch operations the launcher ran outside its kernel."""
    import os
    from gpucourse.checks import answer
    from gpucourse.kernels import INTERPRET_ENV, kernels_as, run_isolated
    launcher = answer(ns, "scaled_add")
    configs = [(1, 16, "float32"), (37, 16, "float32"), (100, 32, "float32"), (64, 64, "float32"),
               (300, 128, "float32"), (77, 32, "float16")]

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
        generator = torch.Generator().manual_seed(21)
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
                        returned = launcher(x, y, 1.5, out, block_size=block_size)
                except Exception as error:
                    row["error"] = f"{type(error).__name__}: {error}"[:300]
                    yield row
                    continue
                row.update({"out": out.double().tolist(), "returned_out": returned is out,
                            "widths": sorted(seen["widths"]), "launches": seen["launches"], "ops": sorted(set(seen["ops"]))})
                yield row

    return run_isolated(rows)


def judge_triton_one_pass(d):
    import math
    import torch
    generator = torch.Generator().manual_seed(21)
    if len(d) < len(TRITON_ONE_PASS):
        return next((f"raised {r['error']}" for r in d if "error" in r), None) or \
            next((f"the process running the kernel died ({r['crashed']})" for r in d if "crashed" in r), None) or \
            f"only {len(d)} of {len(TRITON_ONE_PASS)} launches reported"
    for (n, block_size, dtype_name), row in zip(TRITON_ONE_PASS, d):
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
        want = (TRITON_ONE_PASS_ALPHA * x.double() + y.double()).to(dtype).double().tolist()
        tolerance = 1e-2 if dtype == torch.float16 else 1e-5
        got = row["out"]
        if len(got) != n or not all(isinstance(g, float) and math.isclose(g, w, rel_tol=tolerance, abs_tol=tolerance)
                                    for g, w in zip(got, want)):
            return f"{where}: out differs from alpha * x + y"
    return None


HIDDEN = {
    "add_positions": [
        Case("values: x + p on random x of other shapes (length 1, non-contiguous)", observe_positions_values,
             judge_positions_values),
        Case("dtype, device and shape follow x (float64, bfloat16, float16, meta)", observe_positions_follow_x,
             judge_positions_follow_x),
        Case("a new tensor, x unchanged (random x)", observe_positions_new_tensor, judge_positions_new_tensor),
    ],
    "measure": [
        Case("the median of the repeats (an odd count)", observe_measure_median_odd, judge_measure_median),
        Case("the median of the repeats (an even count: between the two middle times)", observe_measure_median_even,
             judge_measure_median),
        Case("warm-up calls run first and stay out of the result; positional arguments", observe_measure_warmup,
             _judge_runs_and_seconds),
        Case("one repeat: the warm-up's queued work is not timed", observe_measure_one_repeat, judge_measure_one_repeat),
        Case("the defaults (warmup=2, repeats=5), and a float", observe_measure_defaults, judge_measure_defaults),
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
        Case("generated sizes next to multiples of the block, negative alpha", observe_triton_generated,
             judge_triton_generated),
        Case("large blocks (1024), alpha = 0", observe_triton_large_blocks, judge_triton_large),
        Case("float64 and float16, other sizes", observe_triton_dtypes, judge_triton_dtypes),
        Case("one pass: one kernel launch, block_size elements per program, no temporary tensor",
             observe_triton_one_pass, judge_triton_one_pass),
    ],
}

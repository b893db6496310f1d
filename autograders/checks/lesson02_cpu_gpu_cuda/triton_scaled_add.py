"""Hidden checks for lesson 2: triton_scaled_add (the package's docstring says how every part works)."""

# --- triton_scaled_add ----------------------------------------------------------------------
# Sizes, block sizes, dtypes, alphas and the inputs' seed are drawn here. The sandbox launches the
# answer in Triton's interpreter on guarded CPU tensors in a child process and reports what it wrote
# (every value of out), whether anything around out or in x and y changed; the judges build the same
# x and y from the drawn seed and compute alpha * x + y here; and whether a load read a guard area (an
# unmasked load of the last block: on a GPU an illegal address, or silently another tensor's bytes).
# Alphas are drawn among floats that float32 holds exactly (Triton passes a Python float to a kernel as a
# float32).

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
        guards, reads = [], {"outside": 0}  # (start, end) byte ranges of the guard areas; lanes loaded from them
        if have_triton():
            import numpy
            from triton.runtime import interpreter

            real_load = interpreter.InterpreterBuilder.create_masked_load

            def watched_load(self, ptrs, mask, *args, **kwargs):  # every tl.load comes here, block pointers too
                active = ptrs.data[numpy.broadcast_to(mask.data.astype(bool), ptrs.data.shape)]
                reads["outside"] += sum(int(((active >= lo) & (active < hi)).sum()) for lo, hi in guards)
                return real_load(self, ptrs, mask, *args, **kwargs)

            interpreter.InterpreterBuilder.create_masked_load = watched_load
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
                size = x.element_size()
                guards[:] = [(b.data_ptr(), v.data_ptr()) for b, v in zip(buffers, views)] + [
                    (v.data_ptr() + n * size, b.data_ptr() + b.numel() * size) for b, v in zip(buffers, views)]
                reads["outside"] = 0
                try:
                    returned = launcher(x, y, config["alpha"], out, block_size=config["block_size"])
                except Exception as error:
                    row["error"] = f"{type(error).__name__}: {error}"[:300]
                    yield row
                    continue
                around = torch.cat([buffers[2][:GUARD], buffers[2][GUARD + n:]])
                kept_around = torch.cat([kept[2][:GUARD], kept[2][GUARD + n:]])
                row.update({"returned_out": returned is out, "out": out.double().tolist(),
                            "past_end": not torch.equal(around, kept_around), "read_outside": reads["outside"],
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
        if row.get("read_outside"):
            return (f"{where}: loaded {row['read_outside']} element(s) from outside x, y and out: mask the loads too"
                    " (on a GPU, reading past the end of a tensor is an illegal address)")
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
    """(n, block_size, dtype, alpha): one element with alpha 0 (a shortcut that skips the kernel is no pass),
    partial and whole blocks with blocks of 16 to 1024 (512 and 1024 always), float16 or float64, and a call
    that leaves block_size to its default (None here: 128 elements per program); alphas and the seed drawn."""
    configs = [[1, rng.choice(BLOCKS[:3]), "float32", 0.0]]
    for _ in range(3):
        block = rng.choice(BLOCKS[:5])
        configs.append([rng.choice([block * rng.randint(1, 3), rng.randint(2, 3 * block)]), block, "float32", rng.choice(ALPHAS)])
    configs.append([rng.randint(2, 2 * 512), 512, "float32", rng.choice(ALPHAS)])
    configs.append([rng.randint(1025, 2047), 1024, "float32", rng.choice(ALPHAS)])
    configs.append([rng.randint(2, 100), rng.choice(BLOCKS[:3]), rng.choice(["float16", "float64"]), rng.choice(ALPHAS)])
    configs.append([rng.randint(129, 600), None, "float32", rng.choice([a for a in ALPHAS if a])])
    configs[rng.randrange(1, len(configs))][3] = 0.0
    return {"configs": configs, "seed": rng.randrange(2 ** 31)}


def observe_triton_one_pass(ns, drawn):
    """Each launch in a child process, in Triton's interpreter: the output, how many kernel launches ran,
    the widths of the kernel's tl.arange, and the torch operations the launcher ran outside its kernel."""
    import os
    from gpucourse.checks import answer
    from gpucourse.kernels import INTERPRET_ENV, kernels_as, run_isolated
    launcher = answer(ns, "scaled_add")
    configs, seed = drawn["configs"], drawn["seed"]

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
            for n, block_size, dtype_name, alpha in configs:
                dtype = getattr(torch, dtype_name)
                x = torch.randn(n, generator=generator).to(dtype)
                y = torch.randn(n, generator=generator).to(dtype)
                out = torch.full((n,), float("nan"), dtype=dtype)
                seen.update(widths=set(), launches=0, inside=0, ops=[])
                row = {"n": n, "block_size": block_size, "dtype": dtype_name}
                try:
                    with TorchOutside():
                        returned = (launcher(x, y, alpha, out) if block_size is None
                                    else launcher(x, y, alpha, out, block_size=block_size))
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
    for (n, block_size, dtype_name, alpha), row in zip(configs, d):
        dtype = getattr(torch, dtype_name)
        x = torch.randn(n, generator=generator).to(dtype)
        y = torch.randn(n, generator=generator).to(dtype)
        where = (f"n={n}, block_size left to its default, {dtype_name}, alpha={alpha}" if block_size is None
                 else f"n={n}, block_size={block_size}, {dtype_name}, alpha={alpha}")
        block_size = 128 if block_size is None else block_size  # the text's default
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
        want = (alpha * x.double() + y.double()).to(dtype).double().tolist()
        tolerance = {torch.float16: 1e-2, torch.float64: 1e-12}.get(dtype, 1e-5)
        got = row["out"]
        if len(got) != n or not all(isinstance(g, float) and math.isclose(g, w, rel_tol=tolerance, abs_tol=tolerance)
                                    for g, w in zip(got, want)):
            return f"{where}: out differs from alpha * x + y"
    return None

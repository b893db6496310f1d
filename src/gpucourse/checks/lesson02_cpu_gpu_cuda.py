"""Public checks for lesson 2 (CPU vs GPU, and CUDA). Observers are self-contained: see lesson01_processes_threads.py."""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson02_cpu_gpu_cuda"  # the course folder this module's exercises belong to


# --- Exercise 1: device-agnostic code ------------------------------------------------------

def observe_positions_cpu(ns):
    import torch
    from gpucourse.checks import answer
    x = torch.zeros(2, 4, 3)
    out = answer(ns, "add_positions")(x)
    return {"device": str(out.device), "dtype": str(out.dtype), "shape": list(out.shape),
            "values": out[0, :, 0].tolist(), "input_untouched": bool((x == 0).all())}


def _judge_positions_cpu(d):
    if d["shape"] != [2, 4, 3] or d["dtype"] != "torch.float32":
        return f"expected a float32 tensor of shape [2, 4, 3], got {d['dtype']} {d['shape']}"
    if [round(v, 6) for v in d["values"]] != [0.0, 0.25, 0.5, 0.75]:
        return f"position j of 4 should add j/4, got {d['values']}"
    return None if d["input_untouched"] else "x was changed: return a new tensor"


def observe_positions_meta(ns):
    import torch
    from gpucourse.checks import answer
    out = answer(ns, "add_positions")(torch.empty(2, 5, 3, device="meta", dtype=torch.float16))
    return {"device": str(out.device), "dtype": str(out.dtype), "shape": list(out.shape)}


register(
    "add_positions",
    Case("float32 on the CPU: values, shape, input untouched", observe_positions_cpu, _judge_positions_cpu),
    Case("follows x to another device and dtype (meta, float16)", observe_positions_meta,
         lambda d: None if d == {"device": "meta", "dtype": "torch.float16", "shape": [2, 5, 3]}
         else f"expected meta/float16/[2, 5, 3], got {d['device']}/{d['dtype']}/{d['shape']}"),
    answers=[Answer("add_positions", "function",
                    "a function add_positions(x) returning a new tensor with x's shape, dtype and device")],
    points=2,
)


# --- Exercise 3: a timing harness -----------------------------------------------------------

def observe_measure(ns):
    from gpucourse.checks import answer
    from gpucourse.cpu_gpu_cuda import AsyncDevice
    device = AsyncDevice()
    seconds = answer(ns, "measure")(lambda: device.launch(0.02), device.synchronize, warmup=2, repeats=5)
    return {"seconds": float(seconds), "launches": device.launches}


register("measure", Case("20 ms of asynchronous work per call measures as about 20 ms", observe_measure,
                         lambda d: None if 0.012 <= d["seconds"] <= 0.05
                         else f"measured {1000 * d['seconds']:.3f} ms per call for 20 ms of device work"),
         answers=[Answer("measure", "function",
                         "a function measure(run, synchronize, warmup=2, repeats=5) returning the median seconds "
                         "per call of run(), a float")], points=2)


# --- Exercise 2: synchronization points ------------------------------------------------------

def observe_sync_lines(ns):
    from gpucourse.checks import answer
    lines = answer(ns, "sync_lines")
    return {"lines": sorted(int(n) for n in lines)}


def read_sync_lines(ns, exercise):
    """Self-check reads ``sync_lines`` as the grader does (hidden checks): ints only, a list or tuple read
    as the set of its items."""
    import numbers

    from gpucourse.checks import answer

    items = list(answer(ns, "sync_lines"))
    if any(not isinstance(n, numbers.Integral) or isinstance(n, bool) for n in items):
        raise ValueError("line numbers that are not ints")
    return sorted({int(n) for n in items})


register("sync_lines", Case("a set of line numbers between 1 and 14", observe_sync_lines,
                            lambda d: d.get("error") or (None if d["lines"] and all(1 <= n <= 14 for n in d["lines"])
                                                         else f"line numbers must be 1..14, got {d['lines']}")),
         answers=[Answer("sync_lines", "set",
                         "a set of ints, the numbers (1 to 14) of the lines that make the CPU wait for the GPU")],
         points=2, kind="answer", reads=read_sync_lines)


# --- Exercise 4: a Triton kernel, masked and blocked ---------------------------------------
# The launches run in Triton's interpreter on CPU tensors, in a child process, between guard areas
# (gpucourse.kernels.probe_launch): a kernel without a mask writes into a guard, not into the grader.

def observe_triton_smaller_than_block(ns):
    from gpucourse.checks import answer
    from gpucourse.kernels import probe_launch
    return probe_launch(answer(ns, "scaled_add"), [(1, 16, "float32"), (5, 16, "float32")], alpha=2.0, namespaces=[ns])


def observe_triton_full_blocks(ns):
    from gpucourse.checks import answer
    from gpucourse.kernels import probe_launch
    return probe_launch(answer(ns, "scaled_add"), [(64, 16, "float32"), (96, 32, "float32")], alpha=-1.5,
                        namespaces=[ns])


def observe_triton_tail(ns):
    from gpucourse.checks import answer
    from gpucourse.kernels import probe_launch
    return probe_launch(answer(ns, "scaled_add"), [(70, 16, "float32"), (1000, 128, "float32")], alpha=0.5,
                        namespaces=[ns])


def observe_triton_float16(ns):
    from gpucourse.checks import answer
    from gpucourse.kernels import probe_launch
    return probe_launch(answer(ns, "scaled_add"), [(37, 16, "float16"), (300, 64, "float16")], alpha=3.0,
                        namespaces=[ns])


def judge_triton_rows(d):
    from gpucourse.kernels import probe_problem
    return probe_problem(d, configs=2)


register(
    "triton_scaled_add",
    Case("n smaller than one block", observe_triton_smaller_than_block, judge_triton_rows),
    Case("several full blocks", observe_triton_full_blocks, judge_triton_rows),
    Case("a partial last block", observe_triton_tail, judge_triton_rows),
    Case("float16", observe_triton_float16, judge_triton_rows),
    answers=[Answer("scaled_add", "function",
                    "a function scaled_add(x, y, alpha, out, block_size=128) that launches your Triton kernel, "
                    "block_size elements per block, to write alpha * x + y into out, and returns out")],
    points=2,
)

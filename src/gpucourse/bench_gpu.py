"""`make bench-gpu`: a new GPU reference, measured on this machine in a few minutes.

Writes one JSON file in the schema of ``gpucourse.reference`` (``validate()`` passes; status
"measured, not estimated"; device, capability, versions, date and commit read from this machine):
every measurement of ``gpucourse.reference.MEASUREMENTS``, under its declared labels, so that what
this command writes is exactly what the lessons read. A label it cannot measure here is left out of
``values`` and listed under ``absent`` with the reason, never written as zero; a run that leaves a
declared label neither measured nor explained refuses to write.

Each entry carries its recipe (:data:`RECIPES`): TF32 for matmuls and for cuDNN, memory layout,
when the peak was reset, and how host buffers were made (every pageable buffer is written before it
is copied: an untouched buffer's pages do not exist yet). Capability gate: before compute capability
8.0 (T4, V100) there is no TF32 (its rows are absent) and bfloat16 is emulated (its labels end in
" emulated").

    python -m gpucourse.bench_gpu [--out FILE] [--quick]

``--quick`` keeps the sizes and labels and shortens the timing (``make test-gpu``). Every time is the
median of ``torch.utils.benchmark`` (``blocked_autorange``) with a synchronize inside the timed
statement unless the entry's method says otherwise. Without CUDA it refuses. ``--tiny`` is a dry run:
every part at tiny sizes, on a GPU or (``--device cpu``) a CPU, to see the script work before a GPU's
minutes are spent on it; its file has the status "test fixture" and is never a reference (the test
suite runs it so on CI's CPU).
What each entry records and how (sizes, descriptions, recipes, the ``Bench``, provenance) is in
``gpucourse.bench_gpu_recording``; this module holds what is measured, part by part, and writes the file.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from gpucourse import reference
from gpucourse.bench_gpu_recording import (  # noqa: F401 - the file's schema, recipes and provenance
    FILLED, FULL, MODES, NA, OFF, PER_LABEL, QUICK, RECIPES, ROWS_TF32, SOURCE, TINY, WHAT, Bench, Sizes, header, machine,
    short_name, unexplained)
from gpucourse.reference import GRAPH_RECIPES
from gpucourse.tensor_cores import tf32  # the one TF32 switch (lesson 3), for matmuls and cuDNN apart
from gpucourse.moving_data import filled_host


MATMUL_DTYPES = {"float32": (torch.float32, False), "tf32": (torch.float32, True),
                 "float16": (torch.float16, False), "bfloat16": (torch.bfloat16, False)}
STEP_RECIPES = {"fp32": (None, False), "tf32": (None, True), "amp fp16": (torch.float16, False),
                "amp bf16": (torch.bfloat16, False)}  # each also run with channels_last


def free(b: Bench) -> None:
    """Free what earlier parts left, so that a peak counts only its own step."""
    gc.collect()
    if b.cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def matmul(b: Bench) -> None:
    for label, (dtype, use_tf32) in MATMUL_DTYPES.items():
        for n in b.sizes.matmul:
            name = b.label(f"{label} {n}", dtype)
            if use_tf32 and b.no_tf32("matmul_tflops", name):
                continue
            x = torch.randn(n, n, device=b.device, dtype=dtype)
            y = torch.randn(n, n, device=b.device, dtype=dtype)
            with tf32(use_tf32, False):
                b.put("matmul_tflops", name, 2 * n**3 / b.seconds(lambda: x @ y) / 1e12)


def lesson02(b: Bench) -> None:
    """Lesson 2: float32 products by size (GPU, and one CPU thread), one product timed four ways, streams."""
    from gpucourse import cpu_gpu_cuda as C

    with tf32(False, False):
        with _one_thread():
            for n in b.sizes.by_size_cpu:
                x, y = torch.randn(n, n), torch.randn(n, n)
                b.put("lesson02_matmul_tflops", f"CPU float32 {n}", 2 * n**3 / Bench("cpu", b.sizes).seconds(lambda: x @ y) / 1e12)
        n = b.sizes.timing_n
        timing = ("naive", "your measure", "CUDA events", "torch.utils.benchmark")
        if not b.cuda:
            b.skip_all("lesson02_matmul_tflops", [f"GPU float32 {n}" for n in b.sizes.by_size_gpu], "needs a GPU")
            b.skip_all("lesson02_timing_ms", timing, "the four clocks differ only on a GPU")
            b.skip_all("lesson02_streams_ms", ("one stream", "copy stream + events"), "CUDA streams need a GPU")
            return
        for size in b.sizes.by_size_gpu:
            x, y = torch.randn(size, size, device="cuda"), torch.randn(size, size, device="cuda")
            b.put("lesson02_matmul_tflops", f"GPU float32 {size}", 2 * size**3 / b.seconds(lambda: x @ y) / 1e12)
        a = torch.randn(n, n, device="cuda")

        def synchronized(repeats: int = 10) -> float:  # what the lesson's exercise builds: a host clock, synchronized
            for _ in range(b.sizes.warmup):
                a @ a
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(repeats):
                a @ a
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / repeats

        b.put("lesson02_timing_ms", "naive", 1000 * C.naive_seconds(lambda: a @ a), "host clock, no synchronize, 5 calls")
        b.put("lesson02_timing_ms", "your measure", 1000 * synchronized(), "host clock around 10 calls and a synchronize")
        b.put("lesson02_timing_ms", "CUDA events", C.cuda_event_ms(lambda: a @ a), "median of 20 CUDA-event pairs")
        b.put("lesson02_timing_ms", "torch.utils.benchmark", 1000 * b.seconds(lambda: a @ a))
        size, batches = b.sizes.streams
        host = [torch.randn(size, size).pin_memory() for _ in range(batches)]
        w = torch.randn(size, size, device="cuda")
        copy_stream = torch.cuda.Stream()

        def serial():
            for h in host:
                torch.relu(h.to("cuda") @ w)

        def overlapped():
            compute = torch.cuda.current_stream()
            for h in host:
                with torch.cuda.stream(copy_stream):
                    x = h.to("cuda", non_blocking=True)
                    copied = torch.cuda.Event()
                    copied.record(copy_stream)
                compute.wait_event(copied)
                x.record_stream(compute)
                torch.relu(x @ w)

        for label, fn in (("one stream", serial), ("copy stream + events", overlapped)):
            b.put("lesson02_streams_ms", label, 1000 * b.seconds(fn))


@contextlib.contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def lesson_kernel(path: Path | None = None):
    """Lesson 2's ``scaled_add`` (solutions notebook, cell ``triton-08``) as an importable module: Triton
    compiles a kernel from its source file. None where this checkout has no solutions."""
    path = path or Path(__file__).resolve().parents[2] / "solutions" / "lesson02_cpu_gpu_cuda" / "cpu_gpu_cuda.ipynb"
    if not path.exists():
        return None
    cell = next((c for c in json.loads(path.read_text())["cells"] if c.get("id") == "triton-08"), None)
    if cell is None:
        return None
    module_path = Path(tempfile.mkdtemp()) / "lesson02_scaled_add.py"
    module_path.write_text("".join(cell["source"]))
    spec = importlib.util.spec_from_file_location("lesson02_scaled_add", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.scaled_add


def scaled_add(b: Bench) -> None:
    n = b.sizes.scaled_add_n
    x, y = torch.randn(n, device=b.device), torch.randn(n, device=b.device)
    out = torch.empty_like(x)
    b.put("lesson02_scaled_add_ms", "torch 2.0 * x + y", 1000 * b.seconds(lambda: 2.0 * x + y))
    label = "Triton scaled_add (fused)"
    if not b.cuda:
        return b.skip("lesson02_scaled_add_ms", label, "a compiled Triton kernel needs a GPU")
    try:
        kernel = lesson_kernel()
    except ImportError as error:
        return b.skip("lesson02_scaled_add_ms", label, f"Triton is not importable here: {error}")
    if kernel is None:
        return b.skip("lesson02_scaled_add_ms", label, "the lesson's kernel (solutions/) is not in this checkout")
    kernel(x, y, 2.0, out, block_size=1024)  # the first launch compiles
    if not torch.allclose(out, 2.0 * x + y):
        raise RuntimeError("lesson 2's scaled_add kernel does not compute 2.0 * x + y: nothing to time")
    b.put("lesson02_scaled_add_ms", label, 1000 * b.seconds(lambda: kernel(x, y, 2.0, out, block_size=1024)))


def alignment(b: Bench) -> None:
    from gpucourse import tensor_cores as T

    base = b.sizes.alignment_base
    dtype = torch.float16 if b.cuda else torch.float32  # a CPU's float16 products are not what lesson 3 shows
    for n, tflops in T.alignment_benchmark(base, dtype, b.device, min_seconds=b.sizes.min_run_time).items():
        b.put("lesson03_alignment_tflops", f"float16 {n}" if b.cuda else f"float32 {n}", tflops)


def resnet_step(b: Bench, batch: int, pixels: int, amp: torch.dtype | None, channels_last: bool, momentum: float = 0.9):
    """A ResNet-18 training step (SGD, as in the H100 probe) and its model, on ``b.device``."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).to(b.device)
    x = torch.randn(batch, 3, pixels, pixels, device=b.device)
    y = torch.randint(0, 10, (batch,), device=b.device)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=momentum)
    scaler = torch.amp.GradScaler(b.device, enabled=b.cuda and amp == torch.float16)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(b.device, dtype=amp or torch.float32, enabled=amp is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    return step


def resnet18(b: Bench) -> None:
    torch.backends.cudnn.benchmark = b.cuda
    for batch, pixels in b.sizes.resnet:
        for recipe, (amp, use_tf32) in STEP_RECIPES.items():
            for channels_last in (False, True):
                label = b.label(f"b{batch} {pixels}px {recipe}{' channels_last' if channels_last else ''}", amp)
                if use_tf32 and (b.no_tf32("resnet18_step_ms", label) | b.no_tf32("resnet18_peak_mib", label)):
                    continue
                if amp == torch.float16 and not b.cuda:  # seconds per step on a CPU, and no lesson's recipe there
                    b.skip_all("resnet18_step_ms", [label], "autocast float16 on a CPU is emulated: not a GPU recipe")
                    b.skip_all("resnet18_peak_mib", [label], "peak memory is read from the CUDA caching allocator")
                    continue
                free(b)
                with tf32(use_tf32, use_tf32):
                    step = resnet_step(b, batch, pixels, amp, channels_last)
                    for _ in range(b.sizes.warmup):  # cuDNN's autotuning happens here, outside the peak
                        step()
                    if b.cuda:
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                    b.put("resnet18_step_ms", label, 1000 * b.seconds(step))
                if b.cuda:
                    b.put("resnet18_peak_mib", label, torch.cuda.max_memory_allocated() / 2**20,
                          "torch.cuda.max_memory_allocated")
                else:
                    b.skip("resnet18_peak_mib", label, "peak memory is read from the CUDA caching allocator")
                del step
    torch.backends.cudnn.benchmark = False


def bench_peak(b: Bench) -> None:
    """Lesson 12's measured peak: gpucourse.bench's step (plain SGD), the peak reset before warm-up."""
    batch = b.sizes.bench_peak_batch
    for label, amp in (("fp32", None), ("autocast fp16", torch.float16)):
        name = f"b{batch} 32px {label}"
        if not b.cuda:
            b.skip("resnet18_bench_peak_mib", name, "peak memory is read from the CUDA caching allocator")
            continue
        free(b)
        with tf32(False, True):
            step = resnet_step(b, batch, 32, amp, False, momentum=0.0)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            b.seconds(step)
        b.put("resnet18_bench_peak_mib", name, torch.cuda.max_memory_allocated() / 2**20, "torch.cuda.max_memory_allocated")
        del step


def saved_bytes(b: Bench) -> None:
    import torchvision

    from gpucourse import mixed_precision as amp

    batch = b.sizes.saved_batch
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).to(b.device)
    images = torch.randn(batch, 3, 32, 32, device=b.device)
    low = torch.float16 if b.cuda else torch.bfloat16  # float16 autocast on a CPU is not lesson 4's recipe
    low_name = "float16" if b.cuda else "bfloat16"
    plain, mixed = amp.saved_activation_bytes(model, images), amp.saved_activation_bytes(model, images, low)
    method = "gpucourse.mixed_precision.saved_activation_bytes (saved_tensors_hooks)"
    b.put("lesson04_saved_mib", f"b{batch} 32px float32 activations", plain["activations"] / 2**20, method)
    b.put("lesson04_saved_mib", f"b{batch} 32px autocast {low_name} activations", mixed["activations"] / 2**20, method)
    b.put("lesson04_saved_mib", f"b{batch} 32px autocast {low_name} weight copies", mixed["weight_copies"] / 2**20, method)


def copies(b: Bench) -> None:
    labels = ("pageable", "pinned", "pinned 1GiB")
    if not b.cuda:
        return b.skip_all("h2d_gbps", labels, "a host-to-GPU copy needs a GPU")
    for label, mib, pinned in (("pageable", b.sizes.copy_mib, False), ("pinned", b.sizes.copy_mib, True),
                               ("pinned 1GiB", b.sizes.big_copy_mib, True)):
        host = filled_host(mib, pinned)
        device = torch.empty_like(host, device="cuda")
        b.put("h2d_gbps", label, host.numel() / b.seconds(lambda: device.copy_(host, non_blocking=True)) / 1e9)
    free(b)


def lesson05(b: Bench) -> None:
    """Lesson 5: copies on a side stream next to products (pageable vs pinned), and a float16 convolution
    in both memory layouts."""
    from gpucourse import moving_data as X

    mib, batches, size = b.sizes.side_stream
    if not b.cuda:
        b.skip_all("lesson05_side_stream_ms", ("pageable", "pinned"), "copies to a GPU need a GPU")
        b.skip_all("lesson05_conv_ms", ("float16 NCHW", "float16 channels_last"), "float16 convolutions are a GPU's")
        return
    for label, pinned in (("pageable", False), ("pinned", True)):
        hosts = [filled_host(mib, pinned) for _ in range(batches)]
        first = torch.randn(size, size, device="cuda")
        copy_stream = torch.cuda.Stream()

        def pipeline():
            a = first
            for host in hosts:
                with torch.cuda.stream(copy_stream):
                    host.to("cuda", non_blocking=pinned)
                a = a @ a
                a = a / a.norm()

        with tf32(False, False):
            b.put("lesson05_side_stream_ms", label, 1000 * b.seconds(pipeline))
    batch, channels, pixels = b.sizes.conv
    for label, channels_last in (("float16 NCHW", False), ("float16 channels_last", True)):
        seconds = X.conv_seconds(channels_last, batch=batch, channels=channels, size=pixels, device="cuda",
                                 dtype=torch.float16, min_seconds=b.sizes.min_run_time)
        b.put("lesson05_conv_ms", label, 1000 * seconds, "gpucourse.moving_data.conv_seconds")
    free(b)


def overlap(b: Bench) -> None:
    labels = ("copy only", "matmul only", "serial, one stream", "copy on a side stream")
    if not b.cuda:
        return b.skip_all("copy_compute_overlap_ms", labels, "copy/compute overlap needs CUDA streams")
    n = b.sizes.overlap_matmul
    host = filled_host(b.sizes.copy_mib, True)
    target = torch.empty_like(host, device="cuda")
    x = torch.randn(n, n, device="cuda")
    side = torch.cuda.Stream()

    def serial():
        target.copy_(host, non_blocking=True)  # queued on the default stream: the matmul waits for it
        x @ x

    def side_stream():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            target.copy_(host, non_blocking=True)
        x @ x  # runs while the copy engine copies
        torch.cuda.current_stream().wait_stream(side)

    runs = (lambda: target.copy_(host, non_blocking=True), lambda: x @ x, serial, side_stream)
    with tf32(False, False):
        for label, fn in zip(labels, runs):
            b.put("copy_compute_overlap_ms", label, 1000 * b.seconds(fn))


def sync_loop(b: Bench) -> None:
    batch, pixels = b.sizes.resnet[0]
    with tf32(False, False):
        step = resnet_step(b, batch, pixels, None, False)
        steps = b.sizes.loop_steps

        def every_step():
            return [step().item() for _ in range(steps)]  # .item() waits for the GPU each time

        def no_sync():
            return [step().detach() for _ in range(steps)]  # read later, once

        for label, fn in (("item every step", every_step), ("no sync", no_sync)):
            b.put("sync_loop_ms", f"b{batch} {pixels}px fp32 {label}", 1000 * b.seconds(fn) / steps,
                  f"torch.utils.benchmark median of a loop of {steps} steps, per step")


def cuda_graph(b: Bench) -> None:
    """The launch-bound step, eager and replayed from one CUDA graph (as probe_cuda_graphs.py did: cuDNN's
    TF32 left on, PyTorch's default, so that a new file measures what the shipped one did)."""
    for batch in b.sizes.graph_batches:
        for recipe, amp, channels_last in ((GRAPH_RECIPES[0], None, False), (GRAPH_RECIPES[1], torch.bfloat16, True)):
            base = f"b{batch} 32px {recipe}"
            eager, graphed = b.label(f"{base} eager", amp), b.label(f"{base} cuda graph", amp)  # " emulated" last
            if not b.cuda:
                b.skip_all("resnet18_cuda_graph_ms", (eager, graphed), "CUDA graphs need CUDA")
                continue
            import torchvision

            free(b)
            with tf32(False, True):
                torch.manual_seed(0)
                model = torchvision.models.resnet18(num_classes=10).cuda()
                x = torch.randn(batch, 3, 32, 32, device="cuda")
                y = torch.randint(0, 10, (batch,), device="cuda")
                if channels_last:
                    model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

                def step():
                    optimizer.zero_grad(set_to_none=False)  # a graph replays into the same gradient buffers
                    with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None, cache_enabled=False):
                        loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    optimizer.step()
                    return loss

                warm = torch.cuda.Stream()  # capture needs warm-up iterations on a side stream
                warm.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(warm):
                    for _ in range(3):
                        step()
                torch.cuda.current_stream().wait_stream(warm)
                b.put("resnet18_cuda_graph_ms", eager, 1000 * b.seconds(step))
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                b.put("resnet18_cuda_graph_ms", graphed, 1000 * b.seconds(graph.replay))
                del graph


def profile(b: Bench) -> None:
    """Lesson 11's profiled loop (tiny model, batch 8, loss.item() every step) and its table's totals."""
    from torch.utils.data import DataLoader

    from gpucourse import profiling as P

    labels = ("self CPU time, 3 steps", "self CUDA time, 3 steps")
    if not b.cuda:
        return b.skip_all("lesson11_gpu_profile_us", labels, "the GPU's share of the loop needs a GPU")
    torch.manual_seed(0)
    net = P.tiny_model()
    loader = DataLoader(P.SlowDataset(n=256, delay=0.0), batch_size=8, shuffle=True)
    with tf32(False, False):
        totals = P.profile_totals(P.profile_training(loader, net, torch.optim.SGD(net.parameters(), lr=0.05),
                                                     device="cuda", sync=True))
    for label in labels:
        if label in totals:
            b.put("lesson11_gpu_profile_us", label, totals[label], "torch.profiler key_averages totals (profiling.profile_totals)")
        else:
            b.skip("lesson11_gpu_profile_us", label, f"the profiler's table had no such total ({', '.join(totals)})")


def lesson01(b: Bench) -> None:
    """Lesson 1 on this machine's CPU cores (the reference's host). --quick: processes only, one run each."""
    from gpucourse import processes_threads as P

    n, tasks, workers = b.sizes.primes
    cores = P.usable_cores()
    if not b.tiny:  # as gpucourse.bench's lesson 1 part: up to the cores, and twice as many
        workers = tuple(sorted({1, 2, 4, 8, cores, 2 * cores}))
    quick = b.mode == "quick"
    repeats = 1 if b.mode != "full" else 3
    args = [n] * tasks
    serial = P.time_run("serial", P.count_primes, args, 1, repeats)
    for kind in ("threads", "processes"):
        for count in workers:
            if quick and kind == "threads":
                b.skip("lesson01_count_primes_speedup", f"{kind} x{count}", "--quick measures processes only")
                continue
            if kind == "threads" and not b.tiny and count not in (1, 2, cores):
                # held by the GIL, threads stay at serial speed or below (h100.json: 0.61-0.85x at 1-32 threads);
                # each count costs a serial run's time, which a lease of minutes on a GPU cannot spare
                b.skip("lesson01_count_primes_speedup", f"{kind} x{count}", "threads measured at 1, 2 and every core only")
                continue
            b.put("lesson01_count_primes_speedup", f"{kind} x{count}",
                  serial / P.time_run(kind, P.count_primes, args, count, repeats),
                  f"best wall time of {repeats} run(s) per kind and worker count (gpucourse.processes_threads.time_run)")


PARTS: list[tuple[str, Callable[[Bench], None]]] = [
    ("matmul per dtype", matmul), ("lesson 2: products, clocks, streams", lesson02), ("lesson 2: Triton scaled_add", scaled_add),
    ("lesson 3: aligned sizes", alignment), ("ResNet-18 step", resnet18), ("lesson 12: ResNet-18 peak", bench_peak),
    ("lesson 4: bytes saved for backward", saved_bytes), ("host-to-GPU copies", copies),
    ("lesson 5: side stream, memory layout", lesson05), ("copy/compute overlap", overlap), ("synchronizing loop", sync_loop),
    ("CUDA graph", cuda_graph), ("lesson 11: profiled loop", profile), ("lesson 1: CPU processes", lesson01)]


def progress(parts, device: str):
    """One line per part as it starts and ends (tqdm's bar over the parts where tqdm is installed)."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    bar = tqdm(total=len(parts), desc=f"bench-gpu on {device}", unit="part", file=sys.stdout) if tqdm else None
    for i, (title, fn) in enumerate(parts, 1):
        (bar.write if bar else print)(f"[{i}/{len(parts)}] {title} ...")
        start = time.perf_counter()
        yield fn
        (bar.write if bar else print)(f"[{i}/{len(parts)}] {title} done in {time.perf_counter() - start:.1f} s")
        if bar:
            bar.update(1)
    if bar:
        bar.close()


def run(device: str, mode: str = "full", parts=None, keep_going: bool = False, partial: Path | None = None) -> dict:
    """Measure every part (``mode``: full, quick or tiny) and return the reference's data (not yet written).

    ``keep_going``: a part that raises is recorded under ``failed`` (its traceback) and the next part runs, so
    that one broken part of a short GPU lease does not lose the others. ``partial``: after each part, what is
    measured so far is written there (unvalidated), so a run stopped by a time limit still leaves its numbers.
    """
    bench = Bench(device, MODES[mode], mode)
    tiny = mode == "tiny"
    failed: dict[str, str] = {}
    found, software = machine(device)  # read once: the partial file is rewritten after every part

    def data_so_far() -> dict:
        data = header(found, software, reference.FIXTURE_STATUS if tiny else reference.STATUS)
        data.update(measurements=bench.measurements, run=mode)
        if bench.absent:
            data["absent"] = bench.absent
        if failed:
            data["failed"] = failed
        if tiny:
            data["note"] = f"test mode (--tiny, a dry run): every part at tiny sizes on {device}; not a reference for any lesson"
        return data

    chosen = parts or PARTS
    titles = {fn: title for title, fn in chosen}
    for fn in progress(chosen, device):
        try:
            fn(bench)
        except Exception:  # noqa: BLE001 - recorded whole, and raised again unless asked to keep going
            if not keep_going:
                raise
            failed[titles[fn]] = traceback.format_exc()
            print(f"FAILED: {titles[fn]}\n{failed[titles[fn]]}", file=sys.stderr)
        free(bench)
        if partial is not None:
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(data_so_far(), indent=1, ensure_ascii=False) + "\n")
    return data_so_far()


def write(data: dict, out: Path) -> Path:
    """Validate ``data`` (every declared label measured or explained, unless it is a test fixture) and
    write it to ``out``; refuses with the list of problems."""
    fixture_ok = data.get("status") == reference.FIXTURE_STATUS
    problems = reference.validate(data, fixture=fixture_ok)
    if data.get("status") == reference.STATUS:
        problems += [f"{what} was neither measured nor listed absent" for what in unexplained(data)]
    if problems:
        raise RuntimeError("the reference does not validate: " + "; ".join(problems))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the file to write (default bench/results/reference-<gpu>.json)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="the same sizes and labels, shorter timing (make test-gpu)")
    parser.add_argument("--tiny", action="store_true", help="a dry run at tiny sizes (a GPU, or --device cpu): "
                        "every part runs; the file is a test fixture, never a reference")
    parser.add_argument("--keep-going", action="store_true", help="a part that fails is recorded and the others "
                        "still run; what was measured is written to <out>.partial.json after every part, and a run "
                        "with a failed part writes only that file and exits 1 (for a short lease on a GPU)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("make bench-gpu measures an NVIDIA GPU, and torch sees no CUDA device here: nothing was "
              "measured. Run it on a machine with a GPU (python -m gpucourse doctor says what torch sees).",
              file=sys.stderr)
        return 2
    if args.device == "cpu" and not args.tiny:
        print("--device cpu exists only with --tiny (a dry run): a CPU's numbers are no GPU reference.",
              file=sys.stderr)
        return 2
    start = time.perf_counter()
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    name = short_name(torch.cuda.get_device_name()) if args.device == "cuda" else "cpu"
    out = args.out or Path("bench/results") / f"reference-{name.lower()}.json"
    partial = out.with_suffix(".partial.json") if args.keep_going else None
    data = run(args.device, mode, keep_going=args.keep_going, partial=partial)
    if data.get("failed"):
        print(f"{len(data['failed'])} part(s) failed: {', '.join(data['failed'])}; what was measured is in {partial} "
              f"(not a reference: {out} was not written)", file=sys.stderr)
        return 1
    write(data, out)
    if partial is not None:
        partial.unlink(missing_ok=True)
    print(f"wrote {out} ({sum(len(m['values']) for m in data['measurements'].values())} values, "
          f"{sum(len(v) for v in data.get('absent', {}).values())} absent with a reason, "
          f"{time.perf_counter() - start:.0f} s). To ship it: copy it to src/gpucourse/reference/<name>.json.")
    return 0

if __name__ == "__main__":
    sys.exit(main())

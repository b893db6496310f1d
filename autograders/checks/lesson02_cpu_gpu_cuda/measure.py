"""Hidden checks for lesson 2: measure (the package's docstring says how every part works)."""

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
    from gpucourse.timing import fastest_attempt  # a time that load pushed out is measured again

    def once():
        device = AsyncDevice(cold_launches=0)  # the warm-up cases check warm-up
        work = [0.02] * drawn["warmup"] + drawn["plan"]
        seconds = answer(ns, "measure")(lambda: device.launch(work[min(device.launches, len(work) - 1)]),
                                        device.synchronize, warmup=drawn["warmup"], repeats=len(drawn["plan"]))
        return {"seconds": float(seconds), "launches": device.launches}

    return fastest_attempt(once, sorted(drawn["plan"])[len(drawn["plan"]) // 2])


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
    from gpucourse.timing import fastest_attempt  # a time that load pushed out is measured again

    def once(run):
        device = AsyncDevice(cold_launches=run["warmup"], cold_seconds=0.06)
        seconds = answer(ns, "measure")(lambda: device.launch(run["work"]), device.synchronize,
                                        run["warmup"], run["repeats"])  # positional
        return {"seconds": float(seconds), "launches": device.launches}

    return [fastest_attempt(lambda: once(run), run["work"]) for run in runs]


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
    from gpucourse.timing import fastest_attempt  # a time that load pushed out is measured again

    def once(run):
        device = AsyncDevice(cold_launches=run["warmup"], cold_seconds=0.08)
        seconds = answer(ns, "measure")(lambda: device.launch(run["work"]), device.synchronize,
                                        warmup=run["warmup"], repeats=run["repeats"])
        return {"seconds": float(seconds), "launches": device.launches}

    return [fastest_attempt(lambda: once(run), run["work"]) for run in runs]


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
    from gpucourse.timing import fastest_attempt  # a time that load pushed out is measured again

    def once(run):
        given = {k: run[k] for k in ("warmup", "repeats") if run[k] is not None}
        device = AsyncDevice(cold_launches=given.get("warmup", 2), cold_seconds=0.06)  # as the warm-up calls absorb
        seconds = answer(ns, "measure")(lambda: device.launch(run["work"]), device.synchronize, **given)
        return {"type": f"{type(seconds).__module__}.{type(seconds).__qualname__}",
                "is_float": isinstance(seconds, float), "seconds": float(seconds), "launches": device.launches}

    return [fastest_attempt(lambda: once(run), run["work"]) for run in runs]


def judge_measure_defaults(found, runs):
    for got in found if isinstance(found, list) else []:
        if not got["is_float"]:
            return f"measure returned a {got['type']}: return the seconds as a float"
    return _judge_runs(found, runs)


def draw_measure_host_work(rng):
    """run() that does its work on the host, as on a CPU (synchronize has nothing to wait for): once 15 to
    30 ms per call, once 0.2 to 0.45 ms (under a millisecond: a result rounded to ms, or a clock read in
    whole ms, gives 0); warmup and repeats drawn."""
    return [{"warmup": rng.randint(0, 2), "repeats": rng.choice([3, 5]), "work": round(rng.uniform(0.015, 0.03), 4)},
            {"warmup": rng.randint(1, 3), "repeats": rng.choice([5, 7]), "work": round(rng.uniform(0.0002, 0.00045), 6)}]


def observe_measure_host_work(ns, runs):
    import time

    from gpucourse.checks import answer
    from gpucourse.timing import fastest_attempt  # a time that load pushed out is measured again

    def once(run):
        calls = [0]

        def work():  # a spin on the wall clock: load can only make a call longer, never shorter
            calls[0] += 1
            end = time.perf_counter() + run["work"]
            while time.perf_counter() < end:
                pass

        seconds = answer(ns, "measure")(work, lambda: None, warmup=run["warmup"], repeats=run["repeats"])
        return {"seconds": float(seconds), "launches": calls[0]}

    return [fastest_attempt(lambda: once(run), run["work"]) for run in runs]


def judge_measure_host_work(found, runs):
    """At least 0.6x the work per call (a spin never runs short); at most twice it and 20 ms more (load may
    add to a host-bound call; a result in ms, not seconds, is 1000x too large)."""
    if not isinstance(found, list) or len(found) != len(runs):
        return "the answer was not called on every drawn input"
    for run, got in zip(runs, found):
        warmup, repeats, expected, seconds = run["warmup"], run["repeats"], run["work"], got["seconds"]
        if got["launches"] != warmup + repeats:
            return (f"with warmup={warmup}, repeats={repeats}, run should be called {warmup + repeats} times, "
                    f"was called {got['launches']}")
        if not 0.6 * expected <= seconds <= 2 * expected + 0.02:
            return (f"run() doing {1000 * expected:.2f} ms of work on the host per call (synchronize waits for "
                    f"nothing): measured {1000 * seconds:.3f} ms: time run() and synchronize() together, in "
                    "unrounded seconds")
    return None

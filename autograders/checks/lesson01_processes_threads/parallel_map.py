"""Hidden checks for lesson 1: parallel_map (the package's docstring says how every part works)."""

from gpucourse.checks.values import describe, type_words

from autograders.differential import same, unreported

# --- parallel_map -------------------------------------------------------------------------
# Each case draws its items (ints up to 2**70 and below -2**53, floats, strs, None, tuples, lists),
# the function applied (a module-level function from FUNCTIONS), the workers and the kinds; the
# sandbox calls the answer and reports the results as ``describe`` writes them (a tuple is not a list,
# 2 is not 2.0); the judges compute ``[fn(x) for x in items]`` here. Which process or thread ran an
# item is read from ``gpucourse.processes_threads.worker_identity`` in the sandbox; the items it returns are
# checked here. A process id is what the answer's own process reports, so whether kind='cpu' ran fn
# elsewhere is decided by what the grader sees from outside that process: its CPU time while fn's work
# ran (``judge_cpu_time``). That work is a time-lock puzzle (``gpucourse.processes_threads.square_chain``) whose
# results the grader checks with a trapdoor only it holds: an answer cannot skip fn and pass.

# The functions a case may apply, by name: picklable and module-level, as the text promises. The
# observers hold the same table (they cannot read this module).
def _functions():
    import math
    import operator

    from gpucourse.processes_threads import square

    return {"square": square, "abs": abs, "repr": repr, "operator.neg": operator.neg, "math.floor": math.floor,
            "str.upper": str.upper, "len": len}


def _number(rng):
    """An int or a float from the whole line: 0, small, around 2**31 and 2**53, beyond 2**64; negative too."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randint(-50, 50)
    if kind == 1:
        return rng.choice([1, -1]) * (2 ** rng.choice([31, 53, 63, 64, 70]) + rng.randint(-3, 3))
    if kind == 2:
        return rng.choice([0, -0.0, 0.5, -2.25, 1e300, -1e-300])
    if kind == 3:
        return round(rng.uniform(-1e6, 1e6), rng.randint(0, 6))
    if kind == 4:
        return rng.choice([True, False, 0])
    return rng.randint(-10 ** 12, 10 ** 12)


def _word(rng):
    letters = "abcXYZ éßq_ 09"
    return "".join(rng.choice(letters) for _ in range(rng.randint(0, 8)))


def _anything(rng, depth=0):
    kind = rng.randrange(6 if depth < 2 else 3)
    if kind == 0:
        return _number(rng)
    if kind == 1:
        return _word(rng)
    if kind == 2:
        return None
    if kind == 3:
        return tuple(_anything(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    if kind == 4:
        return [_anything(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return _number(rng)


# fn name -> a draw of one item fn accepts
ITEM_DRAWS = {
    "square": _number,
    "abs": _number,
    "operator.neg": _number,
    "repr": _anything,
    "math.floor": lambda rng: rng.choice([rng.uniform(-1e3, 1e3), float(rng.randint(-9, 9)), -0.5, 2.0 ** 60]),
    "str.upper": _word,
    "len": lambda rng: rng.choice([_word(rng), [_anything(rng, 2) for _ in range(rng.randint(0, 4))],
                                   tuple(range(rng.randint(0, 5)))]),
}


def reference_parallel_map(fn, items, kind, workers=None):
    """What the text asks for, computed serially: [fn(x) for x in items]; ValueError for another kind."""
    if not isinstance(kind, str) or kind not in ("cpu", "io"):
        raise ValueError(f"kind must be 'cpu' or 'io', not {kind!r}")
    return [fn(x) for x in items]


def _items(spec):
    """The items a drawn spec stands for: ``{"range": [start, stop, step]}`` or described values."""
    from gpucourse.checks.values import rebuild

    if "range" in spec:
        return range(*spec["range"])
    return rebuild(spec["items"])


def draw_applied(rng):
    """A drawn function and its items (a list, a tuple or a range), then one item and none, each under
    both kinds, with workers drawn (None, 1 to 4)."""
    names = sorted(ITEM_DRAWS)
    runs = []
    for kind in ("io", "cpu"):
        fn = rng.choice(names)
        count = rng.randint(2, 9)
        container = rng.choice(["list", "tuple", "range"] if fn in ("square", "abs", "operator.neg", "repr") else ["list", "tuple"])
        if container == "range":
            start = rng.randint(-2 ** 60, 2 ** 60) if rng.random() < 0.3 else rng.randint(-20, 20)
            step = rng.choice([1, 2, 3, -1, -7])
            spec = {"range": [start, start + step * count, step]}
        else:
            values = [ITEM_DRAWS[fn](rng) for _ in range(count)]
            spec = {"items": describe(tuple(values) if container == "tuple" else values)}
        runs.append({"fn": fn, "kind": kind, "workers": rng.choice([None, 1, 2, 3, 4]), **spec})
        one = rng.choice(names)
        runs.append({"fn": one, "kind": kind, "workers": rng.choice([None, 1, 2]), "items": describe([ITEM_DRAWS[one](rng)])})
        runs.append({"fn": rng.choice(names), "kind": kind, "workers": rng.choice([None, 2]),
                     "items": describe(rng.choice([[], ()]))})
        # an item on which fn raises: [fn(x) for x in items] raises, and so must parallel_map (the same type)
        fn, bad = rng.choice([("math.floor", float("inf")), ("math.floor", float("nan")), ("str.upper", rng.randint(-9, 9))])
        values = [ITEM_DRAWS[fn](rng) for _ in range(rng.randint(1, 4))]
        values.insert(rng.randint(0, len(values)), bad)
        runs.append({"fn": fn, "kind": kind, "workers": rng.choice([None, 1, 2]), "items": describe(values)})
    return runs


def observe_applied(ns, runs):
    import math
    import operator

    from gpucourse.checks import answer
    from gpucourse.checks.values import describe, rebuild
    from gpucourse.processes_threads import square

    functions = {"square": square, "abs": abs, "repr": repr, "operator.neg": operator.neg, "math.floor": math.floor,
                 "str.upper": str.upper, "len": len}
    parallel_map = answer(ns, "parallel_map")
    found = []
    for run in runs:
        items = range(*run["range"]) if "range" in run else rebuild(run["items"])
        try:
            found.append({"returned": describe(parallel_map(functions[run["fn"]], items, run["kind"], workers=run["workers"]))})
        except NotImplementedError:
            raise
        except Exception as error:
            found.append({"raised": [k.__name__ for k in type(error).__mro__]})
    return found


def _run_words(run) -> str:
    items = f"range({', '.join(map(str, run['range']))})" if "range" in run else type_words(run["items"])
    size = "" if "range" in run else f" of {len(_items(run))} item(s)"
    workers = "" if run["workers"] is None else f", workers={run['workers']}"
    return f"parallel_map({run['fn']}, <{items}{size}>, {run['kind']!r}{workers})"


def judge_applied(found, runs):
    if not isinstance(found, list) or len(found) != len(runs):
        return "the answer was not called on every drawn input"
    functions = _functions()
    for run, got in zip(runs, found):
        where = _run_words(run)
        if found := unreported(got, where):
            return found
        try:
            want = describe(reference_parallel_map(functions[run["fn"]], _items(run), run["kind"]))
        except Exception as error:  # fn raises on an item: the list comprehension raises it
            if type(error).__name__ not in got.get("raised", []):
                return (f"{where}: fn raises {type(error).__name__} on an item, so [fn(x) for x in items] raises it; "
                        f"parallel_map {'raised ' + got['raised'][0] if got.get('raised') else 'returned'} instead")
            continue
        if "raised" in got:
            return f"{where} raised {(got['raised'] or ['an exception'])[0]}"
        if not same(got["returned"], want, rel=0, abs_tol=0):
            if type_words(got["returned"]) != "a list":
                return f"{where} returned {type_words(got['returned'])}, not a list"
            size = len(_items(run))
            what = "an empty list of items" if size == 0 else "a single item" if size == 1 else "these items"
            return f"kind={run['kind']!r} with {what}: results are not [fn(x) for x in items]"
    return None


def draw_io_threads(rng):
    """workers=1 (the boundary), 2 to 4, and None (the pool's default), each over drawn items."""
    return [{"workers": workers, "items": describe([_number(rng) for _ in range(rng.randint(7, 10))])}
            for workers in (1, rng.randint(2, 4), None)]


def observe_io_threads(ns, runs):
    import os
    import threading

    from gpucourse.checks import answer
    from gpucourse.checks.values import describe, rebuild
    from gpucourse.processes_threads import worker_identity

    parallel_map = answer(ns, "parallel_map")
    result = {"me": os.getpid(), "main_thread": threading.get_ident(), "runs": []}
    for run in runs:
        rows = parallel_map(worker_identity, rebuild(run["items"]), "io", workers=run["workers"])
        result["runs"].append({"xs": describe([row[0] for row in rows]), "pids": sorted({row[1] for row in rows}),
                               "threads": len({row[2] for row in rows}),
                               "main_thread_used": any(row[2] == threading.get_ident() for row in rows)})
    return result


def judge_io_threads(d, runs):
    if len(d["runs"]) != len(runs):
        return "the answer was not called on every drawn input"
    for run, got in zip(runs, d["runs"]):
        workers = run["workers"]
        if not same(got["xs"], run["items"], rel=0, abs_tol=0):
            return f"kind='io', workers={workers}: results are not [fn(x) for x in items]"
        if got["pids"] != [d["me"]]:
            return "kind='io' left this process: waiting needs threads, not processes"
        if got["main_thread_used"]:
            return "kind='io' ran fn in the calling thread, not in a pool of threads"
        if workers is not None and got["threads"] > workers:
            return f"kind='io' with workers={workers} used {got['threads']} threads"
    return None


def draw_cpu_processes(rng):
    """One process pool (each costs a start-up): workers=1, the boundary (one worker process, still not this
    one), over drawn items."""
    return {"workers": 1, "items": describe([_number(rng) for _ in range(rng.randint(5, 9))])}


def draw_io_default(rng):
    """workers=None (by name, or left out) over more items than the threads every pool's default runs at once,
    on a machine that reports a drawn number of cores (5 to 16: never the 2 or 4 of a laptop, so a count
    written into the answer instead of the pool's default is found)."""
    return {"by_name": rng.random() < 0.5, "extra": rng.randint(1, 4), "cores": rng.randint(5, 16)}


def observe_io_default(ns, drawn):
    """parallel_map(meet, items, "io") with workers=None, while the machine reports ``drawn["cores"]`` cores (every
    way Python counts them answers that count during the call): the first min(cores, 32) calls wait for each other
    (a barrier, 10 s at most): every pool's default runs at least that many threads at once (ThreadPoolExecutor's
    is min(32, cores + 4), multiprocessing's ThreadPool's is cores), so they meet; one thread, or a fixed small
    count, does not. The wait also ends when 3 s pass with no call arriving: a pool's threads start within
    milliseconds of each other, so a pool too small to meet is known then, not after the whole 10 s."""
    import multiprocessing
    import os
    import threading
    import time

    from gpucourse.checks import answer

    cores = drawn["cores"]
    parties = min(cores, 32)  # ThreadPoolExecutor's default stops at 32 threads however many cores there are
    items = list(range(parties + drawn["extra"]))
    idle, most = 3.0, 10.0  # seconds with no call arriving, and in all, before the meeting is given up
    meeting, state = threading.Condition(), {"arrived": 0, "first": None, "last": None, "broken": False}

    def meet(x):
        with meeting:
            state["arrived"] += 1
            if state["arrived"] > parties:  # past the meeting's size: nothing to wait for
                return [x, True]
            now = time.monotonic()
            state["first"], state["last"] = state["first"] or now, now
            meeting.notify_all()
            while state["arrived"] < parties and not state["broken"]:
                now = time.monotonic()
                left = min(idle - (now - state["last"]), most - (now - state["first"]))
                if left <= 0:
                    state["broken"] = True
                    meeting.notify_all()
                else:
                    meeting.wait(left)
            return [x, not state["broken"]]

    counts = {"cpu_count": lambda: cores, "process_cpu_count": lambda: cores,
              "sched_getaffinity": lambda pid=0: set(range(cores))}
    saved = {name: getattr(os, name) for name in counts if hasattr(os, name)}
    saved_mp = multiprocessing.cpu_count
    kwargs = {"workers": None} if drawn["by_name"] else {}
    try:
        for name in saved:
            setattr(os, name, counts[name])
        multiprocessing.cpu_count = counts["cpu_count"]
        rows = answer(ns, "parallel_map")(meet, items, "io", **kwargs)
    finally:
        for name, function in saved.items():
            setattr(os, name, function)
        multiprocessing.cpu_count = saved_mp
    return {"xs": [row[0] for row in rows], "met": all(row[1] for row in rows)}


def judge_io_default(d, drawn):
    call = "workers=None" if drawn["by_name"] else "workers left out"
    cores = drawn["cores"]  # the count the observer made the machine report during the call
    parties = min(cores, 32)
    if d["xs"] != list(range(parties + drawn["extra"])):
        return f"kind='io', {call}: results are not [fn(x) for x in items]"
    if not d["met"]:
        return (f"kind='io', {call}: fewer than {parties} threads ran at once on a machine with {cores} cores: workers=None "
                "means the pool's default, and every pool's default runs one thread per core at once (up to 32)")
    return None


def observe_cpu_processes(ns, run):
    import os

    from gpucourse.checks import answer
    from gpucourse.checks.values import describe, rebuild
    from gpucourse.processes_threads import worker_identity

    rows = answer(ns, "parallel_map")(worker_identity, rebuild(run["items"]), "cpu", workers=run["workers"])
    return {"me": os.getpid(), "xs": describe([row[0] for row in rows]), "pids": sorted({row[1] for row in rows})}


def judge_cpu_processes(d, run):
    workers = run["workers"]
    if not same(d["xs"], run["items"], rel=0, abs_tol=0):
        return f"kind='cpu', workers={workers}: results are not [fn(x) for x in items]"
    if d["me"] in d["pids"]:
        return "kind='cpu' ran fn in this process: GIL-bound work needs processes"
    if len(d["pids"]) > workers:
        return f"kind='cpu' with workers={workers} used {len(d['pids'])} processes"
    return None


# The time-lock trapdoor (gpucourse.processes_threads.square_chain): the two primes whose product is the public
# MODULUS. They exist here only: with them the grader checks a chain of squarings in milliseconds; without
# them the only known way to its result is to do every squaring.
_PRIME_P = int(
    "fc5f83185a80607f27d34d9e487f733b15a0c8cb0e1cc83c108303db0f08dd8fcaf00b45534686d84bc070e3f8fa3c9d"
    "1c39ccca314d1a5fabb491018e251444754c410ebbb115b76ae1973326a0432803eee163f43292258f8b5f2fd570c152"
    "2131d6c66ba12cf53b0f23380cd517d3930f36a7a11c7c36f5c3d406272caf29"
    , 16)
_PRIME_Q = int(
    "debb7f5c72d45ae23590a969af62091aa60d1aaab83fb504ff480edeefbaca057cf0396819a6cdc33cf7bd190e1959ac"
    "b7ee1fa5301150d024975abf31299b155925f2cd39a5b8946867f9d9611892b3da3514cfa0406ca4ca0a8e6fef5d4190"
    "7dcce040a8d0da9e55f16666861d4d327602613ca116867661fc28d2927b8115"
    , 16)
# Squarings per item: 0.05 to 0.08 s of CPU each at the 76,000 squarings per CPU-second (median of 15
# timings) this 2048-bit modulus took with CPython 3.11's ints on a 2-core build machine; 8 items, 0.63 s
# at most. The judge measures the cost on the grading machine itself (``_squaring_seconds``) and compares
# it with the caller's user time only: honest pools of every start method cost the caller 0.002-0.008 s of
# it (measured on 8 items, idle and with both cores busy), where the work run in the caller costs all of it.
SQUARINGS = (4_000, 6_000)


def reference_square_chain(base, squarings):
    """``base ** (2 ** squarings) % MODULUS`` through the trapdoor, whatever the number of squarings: the
    exponent reduced modulo p - 1 and q - 1 (Fermat), the two halves joined by the Chinese remainder theorem.
    (A reduced exponent is never 0, p - 1 having odd factors, so a base that p divides still gives 0.)"""
    low = pow(base % _PRIME_P, pow(2, squarings, _PRIME_P - 1), _PRIME_P)
    high = pow(base % _PRIME_Q, pow(2, squarings, _PRIME_Q - 1), _PRIME_Q)
    return high + _PRIME_Q * ((low - high) * pow(_PRIME_Q, -1, _PRIME_P) % _PRIME_P)


_PER_SQUARING: list[float] = []  # the fastest timing of one squaring (seconds) this grading process has seen


def _squaring_seconds(count, samples=5, steps=2_000):
    """This grader's CPU time for ``count`` squarings modulo MODULUS: ``count`` times the cost of one, the
    fastest timing of ``steps`` squarings this process has seen: ``samples`` of them the first time a judge
    asks, one more each time after (one squaring of this fixed modulus costs the same whatever the chain;
    five timings for every submission cost the pool's threads time on every judgement). This thread's CPU
    time, so other threads of the grader do not count; the fastest, because a busy machine slows a sample
    (caches, a shared core) and the work must not be overstated: an answer fails when its process spent
    three quarters of it."""
    import secrets
    import time

    from gpucourse.processes_threads import MODULUS

    value = secrets.randbelow(MODULUS - 3) + 2
    for _ in range(1 if _PER_SQUARING else samples):
        start = time.thread_time()
        for _ in range(steps):
            value = value * value % MODULUS
        seconds = (time.thread_time() - start) / steps
        _PER_SQUARING[:] = [min(_PER_SQUARING + [seconds])]
    return _PER_SQUARING[0] * count


def draw_cpu_time(rng):
    """6 to 8 items ``(x, base, squarings)``: x drawn from the whole line, base from 2 .. MODULUS - 2,
    squarings from ``SQUARINGS`` (about 0.05 to 0.08 s of CPU each); workers 1 or 2."""
    from gpucourse.processes_threads import MODULUS

    items = [(_number(rng), rng.randint(2, MODULUS - 2), rng.randint(*SQUARINGS)) for _ in range(rng.randint(6, 8))]
    return {"items": describe(items), "workers": rng.choice([1, 2])}


def observe_cpu_time(ns, drawn):
    from gpucourse.checks import answer
    from gpucourse.checks.values import describe, rebuild
    from gpucourse.processes_threads import square_chain

    return describe(answer(ns, "parallel_map")(square_chain, rebuild(drawn["items"]), "cpu", workers=drawn["workers"]))


def judge_cpu_time(results, drawn, seen):
    """Was fn's work done, and whose CPU did it. Each result of ``square_chain`` is checked through the
    trapdoor: only doing the squarings gives it, so an answer cannot return the items' values without
    running fn. Then the user time of the process that called the answer, measured from outside it
    (``Case.seen``), which no code of the answer can change, unlike a process id it reports: run in that
    process (any thread of it), fn's work makes it grow by all of it; run in others, by what feeding them
    costs. The work is what the squarings cost this grader, measured on this machine."""
    from gpucourse.checks.values import rebuild

    items = rebuild(drawn["items"])
    where = f"kind='cpu', workers={drawn['workers']}"
    want = [describe((x, reference_square_chain(base, squarings))) for x, base, squarings in items]
    if not same(results, want, rel=0, abs_tol=0):
        if type_words(results) != "a list" or len(results) != len(items):
            return f"{where}: results are not [fn(x) for x in items]"
        if sorted(map(repr, results)) == sorted(map(repr, want)):
            return f"{where}: results are not in the order of items"
        return f"{where}: the results are not fn(x): fn was not run on every item"
    work = _squaring_seconds(sum(squarings for _, _, squarings in items))
    spent = seen.get("worker_user_s") if isinstance(seen, dict) else None
    if type(spent) not in (int, float) or not spent >= 0:  # NaN too
        return "the grader did not see the CPU time of the process that ran this check: a person should look"
    # fn run in this process costs it the whole work in user time (more on a busy machine). Its system time is
    # not counted: processes started for the work cost the caller forks of itself (a forkserver, a resource
    # tracker, the workers), whose page tables a loaded machine takes tenths of a second to copy, and an honest
    # forkserver pool once passed half the work, counted with them, under the suite's load
    if spent >= 0.75 * work:
        return (f"kind='cpu' ran fn in this process (its CPU time, measured from outside, grew by {spent:.2f} s "
                f"in user mode for {work:.2f} s of work): GIL-bound work needs processes")
    return None


def draw_item_order(rng):
    """Drawn numbers (a repeated one among them, never already in sorted order), the first items sleeping
    longest so that the calls finish roughly in reverse; a tuple of items; workers drawn from 2 to 4."""
    values = [_number(rng) for _ in range(rng.randint(6, 8))]
    values[rng.randrange(2, len(values))] = values[1]  # a repeated value
    if sorted(values) == values:
        values[0], values[-1] = values[-1], values[0]
    if sorted(values) == values:  # every value equal
        values[0] = values[0] + 1
    pairs = tuple((v, round(max(0.0, 0.12 - 0.02 * i), 3)) for i, v in enumerate(values))
    return {"pairs": describe(pairs), "workers": rng.randint(2, 4)}


def observe_item_order(ns, drawn):
    from gpucourse.checks import answer
    from gpucourse.checks.values import describe, rebuild
    from gpucourse.processes_threads import sleep_then_return

    pairs = rebuild(drawn["pairs"])
    return {kind: describe(answer(ns, "parallel_map")(sleep_then_return, pairs, kind, workers=drawn["workers"]))
            for kind in ("io", "cpu")}


def judge_item_order(d, drawn):
    from gpucourse.checks.values import rebuild

    expected = describe([value for value, _ in rebuild(drawn["pairs"])])
    for kind in ("io", "cpu"):
        got = d.get(kind)
        if not same(got, expected, rel=0, abs_tol=0):
            if isinstance(got, list) and sorted(map(repr, got)) == sorted(map(repr, expected)):
                return f"kind='{kind}': the right results in another order: keep the order of items"
            if type_words(got) != "a list":
                return f"kind='{kind}' returned {type_words(got)}, not a list"
            return f"kind='{kind}': results are not [fn(x) for x in items]"
    return None


# "any other kind": a name in another case or with spaces, other tools' names, other types (None,
# numbers, bytes, a bool), the empty string, random words; with items and without
NAMED_KINDS = ["CPU", "IO", "Cpu", "iO", " cpu", "cpu ", "io\n", "", "gpu", "threads", "processes", "serial", "asyncio",
               None, 0, 1.5, True, b"cpu", b"io", ("cpu",)]


def draw_other_kinds(rng):
    kinds = list(NAMED_KINDS)
    while len(kinds) < len(NAMED_KINDS) + 4:
        word = "".join(rng.choice("cpuioCPUIO gx") for _ in range(rng.randint(1, 5)))
        if word not in ("cpu", "io"):
            kinds.append(word)
    calls = [{"kind": describe(kind), "items": describe([rng.randint(-9, 9) for _ in range(rng.choice([0, 1, 2, 3]))])}
             for kind in kinds]
    calls.append({"kind": describe(rng.choice(["gpu", "CPU", None])), "items": []})  # no items: the kind is still checked
    return calls


def observe_other_kinds(ns, calls):
    from gpucourse.checks import answer
    from gpucourse.checks.values import rebuild
    from gpucourse.processes_threads import square

    parallel_map = answer(ns, "parallel_map")  # a missing answer is reported as such, not as a wrong error
    outcomes = []
    for call in calls:
        try:
            parallel_map(square, rebuild(call["items"]), rebuild(call["kind"]))
            outcomes.append("no error")
        except NotImplementedError:
            raise
        except Exception as error:
            outcomes.append([k.__name__ for k in type(error).__mro__])
    return outcomes


def judge_other_kinds(outcomes, calls):
    from gpucourse.checks.values import rebuild

    if not isinstance(outcomes, list) or len(outcomes) != len(calls):
        return "not every other kind was tried"
    for call, got in zip(calls, outcomes):
        if not (isinstance(got, list) and "ValueError" in got):
            what = "no error" if got == "no error" else got[0] if isinstance(got, list) and got else "something else"
            return f"kind={rebuild(call['kind'])!r} with {len(call['items'])} item(s) gave {what}, not ValueError"
    return None

"""Hidden checks for lesson 1. Never released, never readable from the sandbox.

``HIDDEN`` adds cases to the exercises gpucourse.checks.lesson01_processes_threads declares; the grader runs an
exercise's public cases and the hidden ones below, and gives its test cell the declared points only
when every case passes. Observers are self-contained (imports inside): their source is sent into the
sandbox. Every hidden case of a code or script exercise draws its inputs at grading time (``draw=``:
boundaries first, then random draws from the whole domain the text states); the sandbox sees them
only after the last cell, and the judges compute the expected values here, with references that
exist on the grader's side only (``reference_*``). ``CLAUSES`` (at the end) maps every clause of each
exercise's text to the cases that hold it. Judges say what is wrong in words that do not give the
answer away.
"""

from gpucourse.checks import Case
from gpucourse.checks.ddp import first_raised, judge_script_ran
from gpucourse.checks.lesson01_processes_threads import observe_choices  # same observation, stricter judges
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
        if "raised" in got:
            return f"{where} raised {(got['raised'] or ['an exception'])[0]}"
        want = describe(reference_parallel_map(functions[run["fn"]], _items(run), run["kind"]))
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
    """One process pool (each costs a start-up): workers 1 or 2, over drawn items."""
    return {"workers": rng.choice([1, 2]), "items": describe([_number(rng) for _ in range(rng.randint(5, 9))])}


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
# Squarings per item: 0.16 to 0.21 s of CPU each at the 76,000 squarings per CPU-second (median of 15
# timings) this 2048-bit modulus took with CPython 3.11's ints on a 2-core build machine; 8 items, 1.7 s
# at most. The judge measures the cost on the grading machine itself (``_squaring_seconds``).
SQUARINGS = (12_000, 16_000)


def reference_square_chain(base, squarings):
    """``base ** (2 ** squarings) % MODULUS`` through the trapdoor, whatever the number of squarings: the
    exponent reduced modulo p - 1 and q - 1 (Fermat), the two halves joined by the Chinese remainder theorem.
    (A reduced exponent is never 0, p - 1 having odd factors, so a base that p divides still gives 0.)"""
    low = pow(base % _PRIME_P, pow(2, squarings, _PRIME_P - 1), _PRIME_P)
    high = pow(base % _PRIME_Q, pow(2, squarings, _PRIME_Q - 1), _PRIME_Q)
    return high + _PRIME_Q * ((low - high) * pow(_PRIME_Q, -1, _PRIME_P) % _PRIME_P)


def _squaring_seconds(count, samples=5, share=50):
    """This grader's CPU time for ``count`` squarings modulo MODULUS, scaled from the fastest of ``samples``
    timings of ``count // share`` of them (a tenth of the work in all). This thread's CPU time, so other
    threads of the grader do not count; the fastest, because a busy machine slows a sample (caches, a
    shared core) and the work must not be overstated: an answer fails when its process spent half of it."""
    import secrets
    import time

    from gpucourse.processes_threads import MODULUS

    steps = max(1, count // share)
    value = secrets.randbelow(MODULUS - 3) + 2
    fastest = float("inf")
    for _ in range(samples):
        start = time.thread_time()
        for _ in range(steps):
            value = value * value % MODULUS
        fastest = min(fastest, time.thread_time() - start)
    return fastest * count / steps


def draw_cpu_time(rng):
    """6 to 8 items ``(x, base, squarings)``: x drawn from the whole line, base from 2 .. MODULUS - 2,
    squarings from ``SQUARINGS`` (about 0.16 to 0.21 s of CPU each); workers 1 or 2."""
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
    running fn. Then the CPU time of the process that called the answer, measured from outside it
    (``Case.seen``), which no code of the answer can change, unlike a process id it reports: run in that
    process, fn's work makes it grow by all of it; run in others, by what starting and feeding them costs.
    The work is what the squarings cost this grader, measured now on this machine."""
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
    spent = seen.get("worker_cpu_s") if isinstance(seen, dict) else None
    if type(spent) not in (int, float) or not spent >= 0:  # NaN too
        return "the grader did not see the CPU time of the process that ran this check: a person should look"
    if spent >= work / 2:
        return (f"kind='cpu' ran fn in this process (its CPU time, measured from outside, grew by {spent:.2f} s "
                f"of {work:.2f} s of work): GIL-bound work needs processes")
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


# --- LinesDataset -------------------------------------------------------------------------
# The files are drawn here and written in the sandbox by the observers themselves (plain open()):
# integers from the whole range a torch.tensor holds (0, negative, around 2**31 and 2**53, the int64
# limits), with and without a newline after the last line; the judges know every line.

INT64 = (-(2 ** 63), 2 ** 63 - 1)


def _line_value(rng):
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randint(-999, 999)
    if kind == 1:
        return rng.choice([1, -1]) * (2 ** rng.choice([31, 32, 53, 54, 62]) + rng.randint(-3, 3))
    if kind == 2:
        return rng.choice([0, *INT64])
    if kind == 3:
        return rng.randint(*INT64)
    return rng.randint(-10 ** 6, 10 ** 6)


def _file(rng, count, newline_at_end):
    values = [_line_value(rng) for _ in range(count)]
    return {"values": values, "newline_at_end": newline_at_end}


def draw_dataset_items(rng):
    """Two files (a newline after the last line, and none), each with 0, 2**53 + 1 and the int64 limits
    among drawn integers; the items read in a drawn order, some through NumPy indices."""
    files = []
    for newline_at_end in (True, False):
        f = _file(rng, rng.randint(8, 16), newline_at_end)
        for value in (0, 2 ** 53 + 1, -(2 ** 53) - 3, *INT64):
            f["values"][rng.randrange(len(f["values"]))] = value
        order = list(range(len(f["values"])))
        rng.shuffle(order)
        f["order"] = order
        f["numpy"] = sorted(rng.sample(order, 2))
        files.append(f)
    return files


def observe_dataset_items(ns, files):
    import tempfile
    from pathlib import Path

    import numpy
    import torch
    from torch.utils.data import Dataset

    from gpucourse.checks import answer

    folder = Path(tempfile.mkdtemp())
    result = []
    for number, f in enumerate(files):
        path = folder / f"lines{number}.txt"
        path.write_text("\n".join(str(v) for v in f["values"]) + ("\n" if f["newline_at_end"] and f["values"] else ""))
        dataset = answer(ns, "LinesDataset")(str(path))
        items = {}
        for i in f["order"]:
            index = numpy.int64(i) if i in f["numpy"] else i
            try:
                item = dataset[index]
                if type(item) is not torch.Tensor:
                    items[str(i)] = f"a {type(item).__module__}.{type(item).__qualname__}"
                elif item.numel() != 1:
                    items[str(i)] = f"a tensor of shape {list(item.shape)}"
                else:
                    items[str(i)] = int(item.reshape(-1)[0])
            except Exception as error:
                items[str(i)] = f"{type(error).__name__}"
        result.append({"len": len(dataset), "is_dataset": isinstance(dataset, Dataset), "items": items})
    return result


def judge_dataset_items(d, files):
    if len(d) != len(files):
        return "not every file was read"
    for f, got in zip(files, d):
        values = f["values"]
        where = "a file without a newline after its last line" if not f["newline_at_end"] else f"a {len(values)}-line file"
        if not got["is_dataset"]:
            return "LinesDataset must be a torch.utils.data.Dataset"
        if got["len"] != len(values):
            return f"len(ds) is not the number of lines for {where}"
        odd = [v for v in got["items"].values() if isinstance(v, str)]
        if odd:
            return f"ds[i] must be a torch.tensor holding line i's integer, got {odd[0]} ({where})"
        wrong = [i for i, want in enumerate(values) if got["items"].get(str(i)) != want]
        if wrong:
            return f"{len(wrong)} of {len(values)} items do not hold exactly the integer on their line ({where})"
    return None


def draw_dataset_bounds(rng):
    """Files of no lines, one line and a drawn number; the indices just outside each end, far outside
    (beyond 2**63), and a NumPy one."""
    files = []
    for count in (0, 1, rng.randint(2, 12)):
        f = _file(rng, count, rng.random() < 0.5)
        n = count
        far = rng.choice([2 ** 63, 2 ** 64 + rng.randint(0, 9), 10 ** 30])
        f["indices"] = sorted({-1, -n, -n - 1, n, n + rng.randint(1, 5), far, -far}, key=lambda i: (i < 0, abs(i)))
        f["numpy"] = [i for i in (n, -1) if i in f["indices"]][:1]
        files.append(f)
    return files


def observe_dataset_bounds(ns, files):
    import tempfile
    from pathlib import Path

    import numpy

    from gpucourse.checks import answer

    folder = Path(tempfile.mkdtemp())
    result = []
    for number, f in enumerate(files):
        path = folder / f"bounds{number}.txt"
        path.write_text("\n".join(str(v) for v in f["values"]) + ("\n" if f["newline_at_end"] and f["values"] else ""))
        dataset = answer(ns, "LinesDataset")(str(path))
        outcomes = []
        for index in f["indices"]:
            try:
                dataset[numpy.int64(index) if index in f["numpy"] else index]
                outcomes.append("no error")
            except IndexError:
                outcomes.append("IndexError")
            except Exception as error:
                outcomes.append(type(error).__name__)
        first = None
        if f["values"]:
            try:
                first = int(dataset[0])
            except Exception as error:
                first = type(error).__name__
        result.append({"len": len(dataset), "first": first, "outcomes": outcomes})
    return result


def judge_dataset_bounds(d, files):
    if len(d) != len(files):
        return "not every file was read"
    for f, got in zip(files, d):
        n = len(f["values"])
        name = {0: "no lines", 1: "one line"}.get(n, f"{n} lines")
        if got["len"] != n or got["first"] != (f["values"][0] if n else None):
            return f"a file of {name}: wrong len(ds) or ds[0]"
        if len(got["outcomes"]) != len(f["indices"]):
            return f"a file of {name}: not every index outside 0 .. len-1 was tried"
        # past the end first: the negative indices are the clause a list's own indexing gets wrong
        for index, outcome in sorted(zip(f["indices"], got["outcomes"]), key=lambda pair: pair[0] < 0):
            if outcome != "IndexError":
                side = "a negative index" if index < 0 else "an index past the end"
                return f"{side} ({index}, file of {name}) must raise IndexError, got {outcome}"
    return None


def draw_dataset_pickle_and_workers(rng):
    """A drawn file, a batch size drawn from 1 to 5."""
    return {**_file(rng, rng.randint(7, 13), True), "batch_size": rng.randint(1, 5)}


def observe_dataset_pickle_and_workers(ns, f):
    import pickle
    import tempfile
    from pathlib import Path

    from torch.utils.data import DataLoader

    from gpucourse.checks import answer

    path = Path(tempfile.mkdtemp()) / "loaded.txt"
    path.write_text("\n".join(str(v) for v in f["values"]) + "\n")
    dataset = answer(ns, "LinesDataset")(str(path))
    read_first = [int(dataset[i]) for i in range(len(f["values"]))]  # items read before pickling, as training does
    try:
        copy = pickle.loads(pickle.dumps(dataset))
        copied = [int(copy[i]) for i in range(len(f["values"]))]
    except Exception as error:
        copied = f"{type(error).__name__}: {error}"[:200]
    loaded = [int(v) for batch in DataLoader(dataset, batch_size=f["batch_size"], num_workers=2) for v in batch.reshape(-1)]
    return {"read": read_first, "copied": copied, "loaded": loaded}


def judge_dataset_pickle_and_workers(d, f):
    if isinstance(d["copied"], str):
        return f"after reading items, the dataset no longer pickles ({d['copied']})"
    if d["copied"] != f["values"]:
        return "the unpickled dataset gives other items than the file holds"
    if d["loaded"] != f["values"]:
        return "DataLoader(num_workers=2) gives other items than the file holds"
    return None


# --- choose_tools -------------------------------------------------------------------------
# 1. a dict with exactly the keys "a" .. "f"                          -> public
# 2. each value one of "serial", "threads", "processes", "asyncio"    -> public
# 3. the tool with the most speedup for the least cost on GIL CPython, per workload:
#    pure-Python / PIL work (a, d)                                    -> "work that holds the GIL ..."
#    work in C that releases the GIL, blocking waits (b, f)            -> "work that releases the GIL ..."
#    10,000 idle connections (c)                                      -> "thousands of idle connections"
#    a tiny job, once (e)                                             -> "a tiny job ..."

ACCEPTED = {"a": {"processes"}, "b": {"threads"}, "c": {"asyncio"}, "d": {"processes"}, "e": {"serial"}, "f": {"threads"}}


def _choices_judge(keys):
    def judge(d):
        wrong = [k for k in keys if d.get(k) not in ACCEPTED[k]]
        return f"reconsider {', '.join(repr(k) for k in wrong)}" if wrong else None
    return judge


# --- average_across_ranks (a 2-process script) ---------------------------------------------
# The public case launches 2 ranks on fixed inputs; the hidden cases share one launch of 3 ranks (an
# "all ranks" that is not 2) on inputs drawn at grading time: shard_indices calls for other n, ranks
# and world sizes, and per-rank tensors of other shapes and dtypes. The ranks' drivers
# (gpucourse.checks.lesson01_processes_threads.drive_average_across_ranks) only call the answer and report what it
# returned; the expected indices and means are computed here. No launch is made when the public one
# did not run: ranks take seconds to start.

HIDDEN_WORLD_SIZE = 3


def reference_shard_indices(n, rank, world_size):
    return list(range(rank, n, world_size))


def draw_rank_inputs(rng):
    pairs = [(0, 1), (0, 3), (1, 1), (1, 4), (2, 5), (3, 3)]
    for _ in range(2):
        w = rng.randint(2, 7)
        k = rng.randint(1, 6)
        pairs += [(w * k, w), (w * k + 1, w), (w * k + w - 1, w)]
    pairs += [(rng.randint(0, 200), rng.randint(1, 9)) for _ in range(4)]
    pairs.append((rng.randint(1000, 5000), rng.randint(10, 40)))
    pairs = list(dict.fromkeys(pairs))  # each (n, world_size) once: the judge puts each one's ranks together
    shards = [[n, rank, w] for n, w in pairs for rank in range(w)]
    tensors = []
    layouts = [("float64", []), ("float32", [rng.randint(1, 5)]), ("float64", [rng.randint(1, 4), rng.randint(1, 4)]),
               ("float32", [2, rng.randint(1, 3), rng.randint(1, 3)]), ("float16", [rng.randint(1, 6)]),
               ("bfloat16", [rng.randint(1, 3), 2])]
    for dtype, shape in layouts:
        size = 1
        for s in shape:
            size *= s
        if dtype in ("float16", "bfloat16"):  # values the dtype holds exactly, sums too
            values = {str(r): [rng.randint(-32, 32) / 4 for _ in range(size)] for r in range(HIDDEN_WORLD_SIZE)}
        else:
            values = {str(r): [round(rng.uniform(-100, 100), rng.randint(0, 6)) for _ in range(size)]
                      for r in range(HIDDEN_WORLD_SIZE)}
        tensors.append({"dtype": dtype, "shape": shape, "values": values})
    return {"shards": shards, "tensors": tensors}


def observe_generated_ranks(ns, inputs):
    from gpucourse.checks.ddp import run_exercise_script

    public = run_exercise_script(ns, "average_across_ranks")  # launched by the public case already
    if public.get("returncode") != 0 or sorted(public.get("ranks", {})) != ["0", "1"]:
        return {**public, "world_size": 2}  # a script that did not run is not launched again
    return {**run_exercise_script(ns, "average_across_ranks", inputs=inputs, world_size=3), "world_size": 3}


def _launched(d):
    """What is wrong with the launch itself, or None."""
    ran = judge_script_ran(d, world_size=d.get("world_size", 2))
    if ran:
        return ran
    if any("generated" not in record for record in d["ranks"].values()):
        return "the ranks did not report the drawn inputs"
    return None


def judge_generated_shards(d, inputs):
    launched = _launched(d)
    if launched:
        return launched
    calls = d["ranks"]["0"]["generated"]["shards"]
    if [c.get("args") for c in calls] != inputs["shards"]:
        return "shard_indices was not called on every drawn input"
    for call in calls:
        n, rank, world_size = call["args"]
        where = f"shard_indices({n}, {rank}, {world_size})"
        if "error" in call:
            return f"{where} raised {call['error']}"
        if not (call["is_list"] and call["ints"]):
            return f"{where} returned a {call['type']}: return a list of ints"
    shards = {tuple(c["args"]): c["indices"] for c in calls}  # a repeated call counts once
    for n, world_size in sorted({(n, w) for n, _, w in shards}):
        together = sorted(i for rank in range(world_size) for i in shards.get((n, rank, world_size), []))
        if together != list(range(n)):
            return f"with n={n} and world_size={world_size} the ranks together do not cover each index exactly once"
    for call in calls:
        n, rank, world_size = call["args"]
        if call["indices"] != reference_shard_indices(n, rank, world_size):
            return f"with n={n} and world_size={world_size}, rank {rank} does not take every world_size-th index from its rank"
    return None


def _average_raised(d, inputs) -> str | None:
    """The first drawn tensor on which a rank's answer raised, named with that rank's own error (a peer of it
    stops there too, with gloo's lost connection: ``ddp.settle``), or None."""
    runs = {rank: {"runs": record["generated"]["averages"]} for rank, record in d["ranks"].items()}
    raised = first_raised(runs, len(inputs["tensors"]))
    if raised is None:
        return None
    i, rank, error = raised
    spec = inputs["tensors"][i]
    return f"rank {rank}: average_across_ranks raised {error} for a {spec['dtype']} tensor of shape {spec['shape']}"


def judge_generated_new_tensor(d, inputs):
    launched = _launched(d) or _average_raised(d, inputs)
    if launched:
        return launched
    for rank, record in sorted(d["ranks"].items()):
        if len(record["generated"]["averages"]) != len(inputs["tensors"]):
            return f"rank {rank}: average_across_ranks was not called on every drawn tensor"
        for spec, got in zip(inputs["tensors"], record["generated"]["averages"]):
            if "error" in got:
                return f"average_across_ranks raised {got['error']} for a {spec['dtype']} tensor of shape {spec['shape']}"
            if not got["input_unchanged"]:
                return f"average_across_ranks changed its input (rank {rank}, shape {spec['shape']})"
            if not got["is_tensor"] or got["same_object"]:
                return "average_across_ranks must return a new tensor, not its input"
    return None


EPS = {"float64": 1e-12, "float32": 1e-6, "float16": 2 ** -9, "bfloat16": 2 ** -6}  # a few of the dtype's ulps


def reference_mean(spec, world_size):
    """The element-wise mean over the ranks of the values each rank held (in its dtype), in float64."""
    import torch

    held = [torch.tensor(spec["values"][str(r)], dtype=getattr(torch, spec["dtype"])).double() for r in range(world_size)]
    return (torch.stack(held).sum(0) / world_size).tolist()


def judge_generated_mean(d, inputs):
    launched = _launched(d) or _average_raised(d, inputs)
    if launched:
        return launched
    world_size = d["world_size"]
    results = {rank: record["generated"]["averages"] for rank, record in d["ranks"].items()}
    if any(len(averages) != len(inputs["tensors"]) for averages in results.values()):
        return "average_across_ranks was not called on every drawn tensor"
    for i, spec in enumerate(inputs["tensors"]):
        mean = reference_mean(spec, world_size)
        for rank, averages in sorted(results.items()):
            got = averages[i]
            what = f"a {spec['dtype']} tensor of shape {spec['shape']}"
            if "error" in got:
                return f"average_across_ranks raised {got['error']} for {what}"
            if got["shape"] != spec["shape"]:
                return f"for {what} the result has shape {got['shape']}"
            eps = EPS[spec["dtype"]]  # relative to the largest value summed: a sum's rounding is as large as that
            scales = [max([1.0] + [abs(v[k]) for v in spec["values"].values()]) for k in range(len(mean))]
            close = (abs(a - b) <= 4 * eps * scale for a, b, scale in zip(got["values"], mean, scales))  # NaN is never close
            if len(got["values"]) != len(mean) or not all(close):
                return f"{world_size} ranks, rank {rank}: not the element-wise mean over all ranks for {what}"
    return None


HIDDEN = {
    "parallel_map": [
        Case("kind='io': threads of this process, at most `workers`", observe_io_threads, judge_io_threads,
             draw=draw_io_threads),
        Case("kind='cpu': other processes, at most `workers`", observe_cpu_processes, judge_cpu_processes,
             draw=draw_cpu_processes),
        Case("results follow the order of items (a tuple), whatever finishes first", observe_item_order, judge_item_order,
             draw=draw_item_order),
        Case("a list of [fn(x) for x in items]: drawn functions and items, one item, no items", observe_applied,
             judge_applied, draw=draw_applied),
        Case("other kinds raise ValueError", observe_other_kinds, judge_other_kinds, draw=draw_other_kinds),
        Case("kind='cpu': fn's CPU time is spent outside the calling process (seen by the grader)", observe_cpu_time,
             judge_cpu_time, draw=draw_cpu_time, seen=True),
    ],
    "lines_dataset": [
        Case("other files: len and every item (negative, zero, up to the int64 limits, no newline at the end)",
             observe_dataset_items, judge_dataset_items, draw=draw_dataset_items),
        Case("indices outside 0 .. len-1 raise IndexError (negative ones too), one line, no lines", observe_dataset_bounds,
             judge_dataset_bounds, draw=draw_dataset_bounds),
        Case("pickled after use, and through DataLoader(num_workers=2)", observe_dataset_pickle_and_workers,
             judge_dataset_pickle_and_workers, draw=draw_dataset_pickle_and_workers),
    ],
    "choose_tools": [
        Case("work that holds the GIL", observe_choices, _choices_judge("ad")),
        Case("work that releases the GIL or waits on a blocking call", observe_choices, _choices_judge("bf")),
        Case("thousands of idle connections", observe_choices, _choices_judge("c")),
        Case("a tiny job, once", observe_choices, _choices_judge("e")),
    ],
    "average_across_ranks": [
        Case("shard_indices: a list, other n, ranks and world sizes", observe_generated_ranks, judge_generated_shards,
             draw=draw_rank_inputs),
        Case("average_across_ranks: a new tensor, input unchanged", observe_generated_ranks, judge_generated_new_tensor,
             draw=draw_rank_inputs),
        Case("average_across_ranks: the mean over all ranks (3 of them), other shapes and dtypes", observe_generated_ranks,
             judge_generated_mean, draw=draw_rank_inputs),
    ],
}

_PM = [case.name for case in HIDDEN["parallel_map"]]
_LD = [case.name for case in HIDDEN["lines_dataset"]]
_AR = [case.name for case in HIDDEN["average_across_ranks"]]
_PM_PUBLIC = ["kind='io' returns [fn(x) for x in items]", "kind='cpu' returns [fn(x) for x in items]",
              "kind='cpu' runs in other processes"]
CLAUSES = {
    "parallel_map": {
        "returns [fn(x) for x in items], a list, for any picklable module-level fn and any items": [*_PM_PUBLIC[:2], _PM[3]],
        "in the order of items, not the order the calls finish in (nor sorted)": [_PM[2]],
        'kind="cpu": fn runs in processes (other than the caller)': [_PM_PUBLIC[2], _PM[1], _PM[5]],
        'kind="io": fn runs in threads of this process (not the calling thread)': [_PM[0]],
        "any other kind raises ValueError (other case, spaces, other types, with or without items)": [_PM[4]],
        "workers: at most that many threads or processes; None means the pool's default": [_PM[0], _PM[1], _PM[3]],
        "items may be empty: the result is []": [_PM[3]],
    },
    "lines_dataset": {
        "a torch.utils.data.Dataset; len(ds) is the number of lines": [_LD[0], _LD[1]],
        "ds[i] is line i (from 0) as a torch.tensor holding exactly that integer": ["len, ds[0] and a pickle round trip", _LD[0]],
        "any file of one integer per line: no lines, one line, no newline after the last": [_LD[0], _LD[1]],
        "an index outside 0 .. len(ds)-1 raises IndexError, negative ones included": [_LD[1]],
        "survives pickle (keeps no open file), also after items were read": ["len, ds[0] and a pickle round trip", _LD[2]],
        "loads correctly through a DataLoader with num_workers=2": [_LD[2]],
    },
    "average_across_ranks": {
        "shard_indices returns a list of ints": [_AR[0]],
        "every world_size-th index of 0 .. n-1 starting at rank": ["both ranks finish and agree", _AR[0]],
        "the ranks together cover each index exactly once, for any n >= 0 and world_size >= 1": [_AR[0]],
        "average_across_ranks returns a new tensor and leaves its input unchanged": [_AR[1]],
        "the element-wise mean over all ranks (any number of ranks, shapes and dtypes)": ["both ranks finish and agree", _AR[2]],
        "the same on every rank": ["both ranks finish and agree", _AR[2]],
    },
}

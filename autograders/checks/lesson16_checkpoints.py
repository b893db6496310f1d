"""Hidden checks for lesson 16 (checkpoints and restarts). Never released; see lesson 1's for the form.

Every case draws its inputs at grading time (``Case.draw``: boundaries first, then random ones from the whole
domain the exercise's text states). ``latest_complete_checkpoint``: the draws are layouts (plain data, see
``gpucourse.checks.lesson16_checkpoints``), built in temporary folders in the sandbox; the judge picks the expected folder
with the reference below, which exists on the grader's side only. ``checkpoint_every``: differential, the
sandbox calls the answer on the drawn calls and the judge calls the reference on the same calls.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, localcontext

from autograders.differential import call, outcome, verdict
from gpucourse.checks import Case
from gpucourse.checks.lesson16_checkpoints import describe_layout, shown_result

# --- latest_complete_checkpoint ---------------------------------------------------------------------------
# The text's rule: a name that is exactly step_ followed by ASCII digits 0-9, leading zeros allowed. So step_007
# counts, as N = 7, and the path returned is that folder's own (root / "step_007"); where step_7 and step_007
# are both complete and the largest, either is right (the text says so). Non-ASCII decimal digits (step_٩٩,
# which int() reads as 99) and step_99 followed by a newline (which re.match with $ accepts) are drawn as lookalikes
# to ignore. Complete means a .metadata *file* inside: a folder named .metadata, or only a .metadata.tmp, does not
# make a folder complete; an empty .metadata file does (layout entries step_9/.metadata, step_9/.metadata.tmp and
# a complete of "empty").

STEP_NAME = re.compile(r"step_([0-9]+)")


def reference_latest(layout) -> set:
    """The names the text allows as the answer (several only for N written with and without leading zeros),
    or {None}."""
    if layout.get("missing"):
        return {None}
    best, names = None, set()
    for name, kind, complete, _ in layout["entries"]:
        match = STEP_NAME.fullmatch(name)
        if kind != "dir" or not complete or "/" in name or not match:
            continue
        n = int(match.group(1))
        if best is None or n > best:
            best, names = n, {name}
        elif n == best:
            names.add(name)
    return names or {None}


def _why(layout, name) -> str:
    """Why a wrong pick is wrong, from the layout (never the expected answer)."""
    entries = {e[0]: e for e in layout.get("entries", [])}
    if layout.get("missing"):
        return ""
    if "/" in name:
        return f" ({name} is not directly under root: only root's own folders count)"
    entry = entries.get(name)
    if entry is None:
        return f" (root / {name!r} does not exist: return the path of the folder as it is named)"
    _, kind, complete, _ = entry
    if kind != "dir" or not STEP_NAME.fullmatch(name):
        return f" ({name!r} is not a folder named exactly step_ followed by decimal digits: ignore it)"
    if not complete:
        if any(other.startswith(name + "/.metadata") for other in entries):
            return f" ({name} holds no .metadata file (a folder named .metadata or a .metadata.tmp is not one): it is not complete)"
        return f" ({name} has no .metadata of its own: its save never completed)"
    if any(e[2] == "empty" for e in entries.values() if e[0] in reference_latest(layout)):
        return " (an empty .metadata file is still a .metadata file: the folder with the largest N holding one counts)"
    return " (not the largest N, compared as numbers, whatever the names' text or modification times)"


def judge_layouts(results, layouts):
    if not isinstance(results, list) or len(results) != len(layouts):
        return f"{len(results) if isinstance(results, list) else 'no'} results for {len(layouts)} layouts"
    for layout, got in zip(layouts, results):
        allowed = reference_latest(layout)
        name = got.get("name") if isinstance(got, dict) else None
        if (got is None and None in allowed) or (name is not None and name in allowed):
            continue
        given = {"path": "a pathlib.Path", "str": "a str", "str/": "a str ending in /"}.get(layout.get("root"), "a path")
        if got is None:
            return f"{describe_layout(layout)} (root given as {given}): returned None, but a complete step_<N> folder is there"
        if None in allowed and name is not None:
            return (f"{describe_layout(layout)} (root given as {given}): {shown_result(got)}; no folder counts here: "
                    f"None{_why(layout, name)}")
        return f"{describe_layout(layout)} (root given as {given}): {shown_result(got)}{_why(layout, name) if name else ''}"
    return None


def observe_layout_calls(ns, layouts):
    from gpucourse.checks.lesson16_checkpoints import observe_layouts

    return observe_layouts(ns, layouts)


ROOTS = ("path", "str", "str/")


def _layout(rng, entries, root=None, missing=False):
    rng.shuffle(entries)
    return {"entries": entries, "root": root or rng.choice(ROOTS), "missing": missing}


def _numbers(rng, count):
    """Step numbers of every scale: 0, one digit to 30 digits, above 2**53."""
    pool = [rng.randint(0, 9), rng.randint(10, 99), rng.randint(100, 9999), rng.randint(10**4, 10**6),
            2**53 + rng.randint(1, 10**6), rng.randint(10**17, 10**30)]
    return list(dict.fromkeys(rng.sample(pool, min(count, len(pool))) + [rng.randint(0, 10**5) for _ in range(count)]))[:count]


def _spread(rng, numbers, best_recent=False):
    """step_<N> entries, the largest complete one neither the largest as text nor (unless asked) the most recent."""
    entries = [[f"step_{n}", "dir", rng.random() < 0.6, rng.randint(100, 10**6)] for n in numbers]
    done = [e for e in entries if e[2]]
    if done:
        best = max(done, key=lambda e: int(e[0][5:]))
        best[3] = 1 if best_recent else 10**7  # the oldest: the most recently modified is another one
    return entries


def draw_generated(rng):
    """The largest N, as a number, of complete step_<N> folders: N = 0, 9 against 10, 99 against 100, 1 to 30 digits,
    above 2**53; incomplete folders with larger N; the root as a Path, a str and a str ending in /."""
    big = 2**53 + rng.randint(1, 10**6)
    layouts = [
        _layout(rng, [["step_9", "dir", True, 5], ["step_10", "dir", True, 900], ["step_100", "dir", False, 1]], "path"),
        _layout(rng, [["step_99", "dir", True, 2], ["step_100", "dir", True, 800], ["step_1000", "dir", False, 3]], "str"),
        _layout(rng, [["step_0", "dir", True, 40]], "str/"),
        _layout(rng, [["step_0", "dir", True, 4], ["step_1", "dir", False, 3]], rng.choice(ROOTS)),
        _layout(rng, [[f"step_{big}", "dir", True, 500], [f"step_{big - 1}", "dir", True, 1], [f"step_{big + 1}", "dir", False, 2],
                      ["step_999999999999999", "dir", True, 3]], rng.choice(ROOTS)),
        _layout(rng, [["step_5", "dir", True, 7], ["step_50", "dir", False, 1], ["step_6", "dir", True, 9]], rng.choice(ROOTS)),
    ]
    for _ in range(6):
        numbers = _numbers(rng, rng.randint(1, 6))
        entries = _spread(rng, numbers)
        if not any(e[2] for e in entries):
            entries[0][2] = True
        layouts.append(_layout(rng, entries))
    return layouts


# Names a looser parse than "exactly step_ then decimal digits" accepts, each with what it would read as N
def _lookalikes(n):
    return [f"step_{n}.tmp", f"step_{n}_old", f"step_{n}_tmp", f"Step_{n}", f"STEP_{n}", f"ckpt_{n}", f"step{n}",
            f"step-{n}", f"step__{n}", f" step_{n}", f"step_{n} ", f"step_ {n}", f"step_+{n}", f"step_{n}.0",
            f"step_{n}e3", f"step_1_{n:03d}", f"step_0x{n}", f"step_{n}/", f"step_{n}\n", "step_", "step_x", "latest"]


def draw_lookalikes(rng):
    """Names that are not exactly step_ followed by ASCII digits, complete and with larger N than the answer
    (step_7_tmp, Step_7, step_+7, "step_7 ", "step_99\n", step_1_000 which int() reads as 1000, step_7.0, step_٩٩
    with non-ASCII digits...), step_-1 as the only complete one, and step_<N> files."""
    layouts = [
        _layout(rng, [["step_-1", "dir", True, 1], ["step_2", "dir", False, 2]]),
        _layout(rng, [["step_-5", "dir", True, 1], ["step_3", "dir", True, 50]]),
        _layout(rng, [["step_1_000", "dir", True, 1], ["step_999", "dir", True, 50]]),
        _layout(rng, [["step_7_tmp", "dir", True, 1], ["step_6", "dir", True, 50]]),
        _layout(rng, [["Step_7", "dir", True, 1], ["step_6", "dir", True, 50]]),
        _layout(rng, [["step_80", "file", False, 1], ["step_8", "dir", True, 50]]),
        _layout(rng, [["step_٩٩", "dir", True, 1], ["step_12", "dir", True, 50]]),  # Arabic-Indic 99: not ASCII
        _layout(rng, [["step_99\n", "dir", True, 1], ["step_12", "dir", True, 50]]),  # re.match's $ allows a final newline
    ]
    for _ in range(8):
        answer = rng.randint(0, 500)
        entries = [[f"step_{answer}", "dir", True, 10**6], [f"step_{rng.randint(0, answer)}", "dir", True, 10**5]]
        names = rng.sample([x for x in _lookalikes(answer + rng.randint(1, 10**4)) if not x.endswith("/")], 6)
        entries += [[x, "dir", True, rng.randint(1, 100)] for x in names if x not in {e[0] for e in entries}]
        entries.append([f"step_{answer + rng.randint(1, 10**4)}", "file", False, 3])
        entries = list({e[0]: e for e in entries}.values())
        layouts.append(_layout(rng, entries))
    # only lookalikes complete: None
    names = rng.sample([x for x in _lookalikes(rng.randint(1, 999)) if not x.endswith("/")], 5)
    layouts.append(_layout(rng, [[x, "dir", True, rng.randint(1, 100)] for x in names] + [["step_4", "dir", False, 9]]))
    return layouts


def draw_nested(rng):
    """Only folders directly under root count: complete step_<N> folders deeper down (in another folder, inside a
    step folder), a .metadata only in a subfolder of step_<N>, a .metadata file in root itself."""
    layouts = [
        _layout(rng, [["old", "dir", False, 5], ["old/step_900", "dir", True, 1], ["step_12", "dir", True, 50]]),
        _layout(rng, [["step_5", "dir", True, 50], ["step_5/step_700", "dir", True, 1]]),
        _layout(rng, [["step_40", "dir", False, 5], ["step_40/shard", "dir", True, 1], ["step_30", "dir", True, 50]]),
        _layout(rng, [["archive/run1/step_9999", "dir", True, 1]]),
        _layout(rng, [[".metadata", "file", False, 1], ["step_3", "dir", False, 2]]),
    ]
    for _ in range(5):
        answer = rng.randint(0, 10**4)
        deeper = answer + rng.randint(1, 10**5)
        holder = rng.choice(["old", "backup", f"step_{answer}", "runs/a", f"step_{deeper + 1}"])
        entries = [[f"step_{answer}", "dir", True, 10**6], [f"{holder}/step_{deeper}", "dir", True, 1],
                   [f"step_{deeper + 2}", "dir", False, 3], [f"step_{deeper + 2}/inner", "dir", True, 2]]
        entries = list({e[0]: e for e in entries}.values())
        layouts.append(_layout(rng, entries))
    return layouts


def draw_leading_zeros(rng):
    """Names with leading zeros are step_ then decimal digits: step_007 is N = 7, and its path is root / "step_007"
    (not a rebuilt root / "step_7"); step_007 against step_10 and step_6; step_7 and step_007 both (either is right)."""
    layouts = [
        _layout(rng, [["step_007", "dir", True, 50], ["step_6", "dir", True, 1]]),
        _layout(rng, [["step_007", "dir", True, 1], ["step_10", "dir", True, 50]]),
        _layout(rng, [["step_0010", "dir", True, 50], ["step_9", "dir", True, 1], ["step_11", "dir", False, 2]]),
        _layout(rng, [["step_00", "dir", True, 5]]),
        _layout(rng, [["step_7", "dir", True, 5], ["step_007", "dir", True, 6], ["step_3", "dir", True, 1]]),
    ]
    for _ in range(4):
        n = rng.randint(1, 10**5)
        padded = f"step_{'0' * rng.randint(1, 4)}{n}"
        entries = [[padded, "dir", True, 10**6], [f"step_{rng.randint(0, n - 1)}", "dir", True, 1],
                   [f"step_{n + rng.randint(1, 99)}", "dir", False, 2]]
        layouts.append(_layout(rng, list({e[0]: e for e in entries}.values())))
    return layouts


def draw_metadata(rng):
    """Complete means a .metadata file in the folder itself: a folder named .metadata or only a .metadata.tmp (with
    the largest N) does not count, an empty .metadata file does; then drawn N for each, and None when only such
    folders are there."""
    layouts = [
        _layout(rng, [["step_9", "dir", False, 1], ["step_9/.metadata", "dir", False, 1], ["step_3", "dir", True, 50]]),
        _layout(rng, [["step_9", "dir", False, 1], ["step_9/.metadata.tmp", "file", False, 1], ["step_3", "dir", True, 50]]),
        _layout(rng, [["step_9", "dir", "empty", 50], ["step_3", "dir", True, 1]]),
        _layout(rng, [["step_4", "dir", False, 1], ["step_4/.metadata", "dir", False, 1],
                      ["step_2", "dir", False, 2], ["step_2/.metadata.tmp", "file", False, 2]]),
        _layout(rng, [["step_1", "dir", "empty", 5]]),
    ]
    for _ in range(6):
        answer = rng.randint(0, 10**4)
        larger = answer + rng.randint(1, 10**4)
        smaller = rng.randint(0, answer)
        inside = rng.choice([[f"step_{larger}/.metadata", "dir", False, 1], [f"step_{larger}/.metadata.tmp", "file", False, 1]])
        entries = [[f"step_{answer}", "dir", rng.choice([True, "empty"]), 10**6], [f"step_{larger}", "dir", False, 1], inside,
                   [f"step_{smaller}", "dir", True, 10**5]]
        layouts.append(_layout(rng, list({e[0]: e for e in entries}.values())))
    return layouts


def draw_none(rng):
    """None: nothing complete, an empty root, a root that does not exist (as a Path, a str, a str ending in /),
    only files and lookalikes complete."""
    layouts = [_layout(rng, [], root) for root in ROOTS]
    layouts += [_layout(rng, [], root, missing=True) for root in ROOTS]
    layouts.append(_layout(rng, [["step_5", "dir", False, 10], ["step_50", "dir", False, 20], ["step_7", "file", False, 1]]))
    layouts.append(_layout(rng, [["step_1.tmp", "dir", True, 3], ["checkpoint", "dir", True, 2], ["latest", "file", False, 1]]))
    for _ in range(3):
        layouts.append(_layout(rng, [[f"step_{n}", "dir", False, rng.randint(1, 100)] for n in _numbers(rng, rng.randint(1, 5))]))
    return layouts


HIDDEN = {"latest_complete_checkpoint": [
    Case("generated layouts: the largest N as a number (0 to 30 digits), complete, whatever the modification times",
         observe_layout_calls, judge_layouts, draw=draw_generated),
    Case("names that are not exactly step_ then ASCII digits are ignored (step_7_tmp, Step_7, step_-1, step_+7, step_٩٩, files)",
         observe_layout_calls, judge_layouts, draw=draw_lookalikes),
    Case("nested folders: only the folders directly under root count", observe_layout_calls, judge_layouts,
         draw=draw_nested),
    Case("leading zeros: step_007 is N = 7, returned as the folder it is", observe_layout_calls, judge_layouts,
         draw=draw_leading_zeros),
    Case("nothing complete, an empty root, a missing root (as a Path or a str): None", observe_layout_calls,
         judge_layouts, draw=draw_none),
    Case("complete means a .metadata file: not a folder named .metadata, not a .metadata.tmp alone; an empty one counts",
         observe_layout_calls, judge_layouts, draw=draw_metadata),
]}


# --- checkpoint_every -------------------------------------------------------------------------------------

def _exact_steps(save, mtbf, step) -> Decimal:
    with localcontext() as context:
        context.prec = 60
        return (2 * Decimal(save) * Decimal(mtbf)).sqrt() / Decimal(step)


def reference_checkpoint_every(save_seconds, mtbf_seconds, step_seconds):
    """Young's interval sqrt(2 C M) in steps, the nearest whole number, at least 1; ValueError outside the domain."""
    for value in (save_seconds, mtbf_seconds, step_seconds):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{value}")
    steps = _exact_steps(save_seconds, mtbf_seconds, step_seconds)
    return max(1, int((steps + Decimal("0.5")).to_integral_value(rounding="ROUND_FLOOR")))


def _fair(save, mtbf, step) -> bool:
    """Inside what the text promises: the result at least 0.002 from a half, the product a normal float, the
    result below 10**12 (so that a float computation knows it)."""
    product = 2.0 * float(save) * float(mtbf)
    if not 1e-290 < product < 1e290:
        return False
    steps = _exact_steps(save, mtbf, step)
    return steps < 10**12 and abs(steps - int(steps) - Decimal("0.5")) > Decimal("0.002")


def _value(rng, low_exp, high_exp, kind=None):
    """A positive number between 10**low_exp and 10**high_exp: an int, a float or a numpy.float64 (a float)."""
    import numpy

    x = 10 ** rng.uniform(low_exp, high_exp)
    kind = kind or rng.choice(["int", "float", "float", "numpy"])
    if kind == "int" and x >= 1:
        return int(x)
    return numpy.float64(x) if kind == "numpy" else x


def _fair_calls(rng, make, count):
    calls = []
    while len(calls) < count:
        args = make()
        if _fair(*args):
            calls.append(call(*args))
    return calls


def draw_scales(rng):
    """Every scale of save time, MTBF and step time, ints, floats and numpy floats; integers above 2**53; small ints
    whose square root is not whole (sqrt(8) is nearer 3 than 2); results of 10**5 to 10**9 steps, where a float32
    computation is off by one or more."""
    big = 2**53 + rng.randint(1, 10**6)
    named = [(60, 86400, 2.0), (60.0, 86400.0, 2), (10, 3600, 30), (1, 1, 1.0), (big, 3, 2**40), (7, big, 10**6),
             (2**60 + 1, 2**62 + 3, 2**55 + 5), (0.25, 8.0, 1), (300, 10**7, 0.5), (1, 4, 1), (1, 7, 1), (3, 26, 1),
             (418.7676499077862, 2804425.486107992, 0.0295214568264605)]
    calls = [call(*args) for args in named if _fair(*args)]
    calls += _fair_calls(rng, lambda: (rng.randint(1, 100), rng.randint(1, 1000), rng.randint(1, 4)), 8)
    calls += _fair_calls(rng, lambda: (_value(rng, 0, 3), _value(rng, 4, 8), _value(rng, -3, 0, rng.choice(["float", "numpy"]))), 12)
    calls += _fair_calls(rng, lambda: (_value(rng, -2, 3), _value(rng, 1, 7), _value(rng, -2, 3)), 30)
    calls += _fair_calls(rng, lambda: (_value(rng, 15.96, 20, "int"), _value(rng, 0, 6, "int"), _value(rng, 6, 12, "int")), 5)
    return calls


def draw_short(rng):
    """An interval shorter than one step (and one step and a bit): still 1; the smallest positive inputs."""
    named = [(0.5, 100.0, 60.0), (1, 10, 300), (0.01, 60, 1), (2.0, 50.0, 14.2), (1e-300, 1e-3, 1.0), (5, 5, 10**9),
             (1, 2, 2), (2, 1, 1.5)]
    calls = [call(*args) for args in named if _fair(*args)]
    calls += _fair_calls(rng, lambda: (_value(rng, -3, 1), _value(rng, 0, 3), _value(rng, 2, 5)), 12)
    return calls


def draw_bad(rng):
    """Each input in turn zero (0, 0.0, -0.0), negative, nan, inf or -inf, the others valid: ValueError."""
    import numpy

    bad = [0, 0.0, -0.0, -1, -rng.uniform(0.001, 1e6), -(2**53 + 7), float("nan"), float("inf"), float("-inf"),
           numpy.float64("nan"), numpy.float64("inf")]
    calls = []
    for position in range(3):
        for value in bad:
            args = [_value(rng, 0, 3), _value(rng, 2, 6), _value(rng, -1, 2)]
            args[position] = value
            calls.append(call(*args))
    calls.append(call(-1, -1, 1.0))  # a product that is positive
    calls.append(call(float("nan"), float("inf"), 0))
    return calls


def judge_intervals(observed, calls):
    if not isinstance(observed, list) or len(observed) != len(calls):
        return f"{len(observed) if isinstance(observed, list) else 'no'} outcomes for {len(calls)} calls"
    for spec, got in zip(calls, observed):
        found = verdict(spec, got, outcome(reference_checkpoint_every, spec), "checkpoint_every")
        if found:
            return found
    return None


def observe_interval_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "checkpoint_every", calls)


HIDDEN["checkpoint_every"] = [
    Case("every scale of save time, MTBF and step time, ints and floats, integers above 2**53", observe_interval_calls,
         judge_intervals, draw=draw_scales),
    Case("an interval shorter than a step still gives 1", observe_interval_calls, judge_intervals, draw=draw_short),
    Case("bad input raises ValueError: zero, negative, nan or infinite, in each position", observe_interval_calls,
         judge_intervals, draw=draw_bad),
]

PUBLIC_LATEST = "step_9 and step_10: the largest N, numerically, of the complete step_<N> folders; none: None"
PUBLIC_INTERVAL = "Young's interval sqrt(2 C M) in the nearest whole number of steps, at least 1"
_L, _I = [c.name for c in HIDDEN["latest_complete_checkpoint"]], [c.name for c in HIDDEN["checkpoint_every"]]
CLAUSES = {
    "latest_complete_checkpoint": {
        "returns the folder's path, root / 'step_<N>', as a pathlib.Path or a str": [PUBLIC_LATEST, _L[0], _L[3]],
        "only folders count (files named step_<N> are ignored)": [_L[1], _L[4]],
        "only folders directly under root count (nested layouts)": [_L[2]],
        "the name is exactly step_ followed by ASCII digits 0-9; anything else is ignored "
        "(step_12.tmp, step_3_old, ckpt_9, Step_4, step_, latest, step_-1, step_+7, step_7_tmp, step_٩٩, step_99 and a newline)":
            [PUBLIC_LATEST, _L[1]],
        "N is the digits read as a number, leading zeros allowed (step_007 counts, as 7)": [_L[3]],
        "a folder with leading zeros is returned as it is named (root / 'step_007'); on a tie for the largest N "
        "(step_7 and step_007) either": [_L[3]],
        "complete means the folder itself holds a .metadata file; others never count":
            [PUBLIC_LATEST, _L[0], _L[2], _L[5]],
        "newest is the largest N as a number (step_9 < step_10 < step_100, N of any size), "
        "not the largest name as text nor the most recently modified": [PUBLIC_LATEST, _L[0]],
        "None when no folder is complete, when root is empty, and when root does not exist": [PUBLIC_LATEST, _L[4]],
        "root may be given as a str or as a pathlib.Path": [_L[0], _L[4]],
    },
    "checkpoint_every": {
        "Young's interval sqrt(2 * save_seconds * mtbf_seconds) divided by step_seconds": [PUBLIC_INTERVAL, _I[0]],
        "rounded to the nearest whole number": [PUBLIC_INTERVAL, _I[0]],
        "at least 1": [PUBLIC_INTERVAL, _I[1]],
        "returns an int (not a float)": [PUBLIC_INTERVAL, _I[0], _I[1]],
        "the inputs may be ints or floats (of any size)": [_I[0], _I[1]],
        "ValueError when any input is zero, negative, nan or infinite": [_I[2]],
    },
}

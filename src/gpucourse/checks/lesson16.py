"""Public checks for lesson 16 (checkpoints and restarts). Observers are self-contained: see lesson01.py.

``latest_complete_checkpoint`` is called on folders the observer builds in a temporary folder from a
*layout* (plain data: names, folder or file, complete or not, modification times); the judges rebuild the
layout themselves (from its seed, for generated ones) and work out the expected answer; they never read it
from the observation. ``checkpoint_every`` is judged against Young's interval, recomputed by the judge.
"""

from __future__ import annotations

import math
import re

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson16_checkpoints"  # the course folder this module's exercises belong to

STEP_NAME = re.compile(r"step_(\d+)")  # the whole name: step_ then digits, nothing after

# A layout: entries [name, kind, complete, age]; kind "dir" or "file"; complete: a .metadata file inside (dirs
# only); age: seconds before now of the entry's modification time (smaller = more recently modified).
PUBLIC_LAYOUTS = [
    [["step_3", "dir", True, 10], ["step_9", "dir", True, 300], ["step_10", "dir", True, 400],
     ["step_12", "dir", False, 5], ["latest", "file", False, 1], ["step_11.tmp", "dir", True, 2]],
    [],  # an empty root
    [["step_4", "dir", False, 30], ["step_8", "dir", False, 20]],  # nothing complete
]


def expected_checkpoint(layout) -> str | None:
    """The name the exercise asks for: the largest N among folders named step_<N> that hold .metadata."""
    steps = [int(STEP_NAME.fullmatch(name).group(1)) for name, kind, complete, _ in layout
             if kind == "dir" and complete and STEP_NAME.fullmatch(name)]
    return f"step_{max(steps)}" if steps else None


def describe_layout(layout, missing: bool = False) -> str:
    if missing:
        return "a root folder that does not exist"
    if not layout:
        return "an empty root folder"
    parts = [f"{name}/ ({'complete' if complete else 'no .metadata'})" if kind == "dir" else f"{name} (a file)"
             for name, kind, complete, _ in layout]
    return "root holding " + ", ".join(parts)


def build_layout(root, layout) -> None:
    """Make ``layout`` under ``root`` (a folder that exists) and set every entry's modification time."""
    import os
    import time
    from pathlib import Path

    now = time.time()
    for name, kind, complete, age in layout:
        path = Path(root) / name
        if kind == "dir":
            path.mkdir()
            (path / "__0_0.distcp").write_bytes(b"\0" * 16)
            if complete:
                (path / ".metadata").write_bytes(b"\0" * 8)
        else:
            path.write_text("step_0\n")
    for name, kind, complete, age in layout:  # after every file is written: writing inside a folder touches it
        os.utime(Path(root) / name, (now - age, now - age))


def generated_layout(seed: int, decoys: bool = True) -> list:
    """A layout of 4 to 9 step_<N> folders with N of 1 to 5 digits, where the answer differs from the
    largest N as text, from the largest N of any folder, and from the most recently modified complete one;
    with ``decoys``, names that are not step_<N> folders (files, suffixes, other prefixes) with larger N."""
    import random

    rng = random.Random(seed)
    while True:
        numbers = rng.sample(range(0, 100_000), 1) + rng.sample(range(1, 100), rng.randint(1, 3)) + \
            rng.sample(range(100, 10_000), rng.randint(1, 3)) + rng.sample(range(10_000, 100_000), rng.randint(0, 2))
        numbers = list(dict.fromkeys(numbers))
        layout = [[f"step_{n}", "dir", rng.random() < 0.6, rng.randint(1, 10_000)] for n in numbers]
        complete = [n for n in numbers if layout[numbers.index(n)][2]]
        if not complete:
            continue
        best, biggest = max(complete), max(numbers)
        as_text = max(f"step_{n}" for n in complete)
        newest = min((age, name) for name, _, done, age in layout if done)[1]
        if biggest != best and as_text != f"step_{best}" and newest != f"step_{best}":
            break
    if decoys:
        top = max(numbers) + rng.randint(1, 900)
        layout += [[f"step_{top}", "file", False, 3], [f"step_{top + 1}.tmp", "dir", True, 4],
                   [f"step_{top + 2}_old", "dir", True, 6], [f"ckpt_{top + 3}", "dir", True, 7],
                   [f"Step_{top + 4}", "dir", True, 8], ["step_", "dir", True, 9], ["step_x", "dir", True, 2],
                   ["latest", "file", False, 1]]
        rng.shuffle(layout)
    return layout


def observe_latest_checkpoints(ns, layouts=None, as_str=False, missing=False):
    """``latest_complete_checkpoint`` on every layout of ``layouts`` (PUBLIC_LAYOUTS by default), each built in a
    fresh temporary folder (``as_str``: the root given as a str, else a pathlib.Path; ``missing``: also a root
    that does not exist). What came back, as data: the name of a folder directly under the root, None, or a
    description."""
    import os
    import tempfile
    from pathlib import Path

    from gpucourse.checks import answer
    from gpucourse.checks.lesson16 import PUBLIC_LAYOUTS, build_layout

    function = answer(ns, "latest_complete_checkpoint")

    def call(root):
        given = str(root) if as_str else Path(root)
        try:
            got = function(given)
        except Exception as error:
            return f"raised {type(error).__name__}: {str(error)[:80]}"
        if got is None:
            return None
        if not isinstance(got, (str, os.PathLike)):
            return f"a {type(got).__name__} ({str(got)[:60]}), not a path"
        path = Path(os.fspath(got))
        if not path.is_absolute() or path.parent.resolve() != Path(root).resolve():
            return f"{os.fspath(got)[:120]!r}, not a folder directly under the root"
        return {"name": path.name}

    results = []
    for layout in (PUBLIC_LAYOUTS if layouts is None else layouts):
        with tempfile.TemporaryDirectory(prefix="gpucourse-ckpt-check-") as root:
            build_layout(root, layout)
            results.append(call(root))
    if missing:
        with tempfile.TemporaryDirectory(prefix="gpucourse-ckpt-check-") as parent:
            results.append(call(Path(parent) / "never_written"))
    return {"results": results}


def _diagnosis(layout, got_name) -> str:
    """Why a wrong pick is wrong, from the layout (the judge's own)."""
    entry = next((e for e in layout if e[0] == got_name), None)
    if entry is None:
        return ""
    name, kind, complete, _ = entry
    if kind != "dir" or not STEP_NAME.fullmatch(name):
        return f" ({name} is not a folder named step_<N>: ignore it)"
    if not complete:
        return f" ({name} has no .metadata: its save never completed)"
    dirs = [e for e in layout if e[1] == "dir" and e[2] and STEP_NAME.fullmatch(e[0])]
    if name == max(e[0] for e in dirs):
        return " (the largest name as text: compare N as numbers, step_9 < step_10)"
    if name == min((e[3], e[0]) for e in dirs)[1]:
        return " (the most recently modified, not the largest N)"
    return ""


def judge_latest_checkpoints(d, layouts=None, missing=False):
    from gpucourse.checks.lesson16 import PUBLIC_LAYOUTS, describe_layout, expected_checkpoint

    layouts = PUBLIC_LAYOUTS if layouts is None else layouts
    wanted = [(layout, False) for layout in layouts] + ([([], True)] if missing else [])
    if len(d["results"]) != len(wanted):
        return "the inputs were changed while checking"
    for (layout, gone), got in zip(wanted, d["results"]):
        want = None if gone else expected_checkpoint(layout)
        got_name = got["name"] if isinstance(got, dict) else None
        if isinstance(got, str) or got_name != want:
            shown = (f"returned root / {got_name!r}" if isinstance(got, dict) else
                     "returned None" if got is None else got if got.startswith("raised") else f"returned {got}")
            expected = f"root / {want!r}" if want else "None"
            return (f"{describe_layout(layout, gone)}: {shown}; the newest complete checkpoint is {expected}"
                    f"{_diagnosis(layout, got_name) if got_name else ''}")
    return None


register("latest_complete_checkpoint",
         Case("step_9 and step_10: the largest N, numerically, of the complete step_<N> folders; none: None",
              observe_latest_checkpoints, judge_latest_checkpoints),
         answers=[Answer("latest_complete_checkpoint", "function",
                         "a function latest_complete_checkpoint(root) returning the path of the newest complete "
                         "step_<N> checkpoint folder under root, or None")],
         points=2)


# --- Exercise 2: how often to checkpoint (Young's interval, in whole steps) ---------------------------

INTERVAL_PUBLIC = [[60, 86400, 2.0], [10.0, 3600, 30.0], [0.5, 100.0, 60.0]]  # [save_seconds, mtbf_seconds, step_seconds]


def expected_interval(save_seconds, mtbf_seconds, step_seconds) -> int:
    """Young's interval sqrt(2 C M) in steps, the nearest whole number, at least 1."""
    return max(1, math.floor(math.sqrt(2 * save_seconds * mtbf_seconds) / step_seconds + 0.5))


def interval_grid(seed: int, count: int = 60) -> list:
    """Inputs of every scale (ints and floats), none within 1e-3 of a half step, some below one step."""
    import random

    rng = random.Random(seed)
    grid = []
    while len(grid) < count:
        save = rng.choice([rng.randint(1, 600), round(rng.uniform(0.01, 900), 3)])
        mtbf = rng.choice([rng.randint(60, 10**7), round(10 ** rng.uniform(1, 7), 2)])
        step = rng.choice([rng.randint(1, 120), round(10 ** rng.uniform(-2, 3), 4)])
        ratio = math.sqrt(2 * save * mtbf) / step
        if abs(ratio - math.floor(ratio) - 0.5) > 1e-3:
            grid.append([save, mtbf, step])
    return grid


def observe_intervals(ns, grid=None, bad=()):
    """``checkpoint_every`` on every ``[save, mtbf, step]`` of ``grid`` (INTERVAL_PUBLIC by default) and what each
    of ``bad`` raises; as data."""
    import math

    from gpucourse.checks import answer
    from gpucourse.checks.lesson16 import INTERVAL_PUBLIC

    function = answer(ns, "checkpoint_every")

    def describe(got):
        if type(got) is int:
            return got
        return f"a {type(got).__name__} {str(got)[:40]}"

    results = []
    for args in (INTERVAL_PUBLIC if grid is None else grid):
        try:
            results.append([args, describe(function(*args))])
        except Exception as error:
            results.append([args, f"raised {type(error).__name__}"])
    raised = []
    for args in bad:
        shown = [a if math.isfinite(a) else str(a) for a in args]
        try:
            raised.append([shown, f"returned {str(function(*args))[:40]}"])
        except Exception as error:
            raised.append([shown, type(error).__name__])
    return {"results": results, "raised": raised}


def judge_intervals(d, grid=None):
    from gpucourse.checks.lesson16 import INTERVAL_PUBLIC, expected_interval

    grid = INTERVAL_PUBLIC if grid is None else grid
    if [row[0] for row in d["results"]] != grid:
        return "the inputs were changed while checking"
    for (save, mtbf, step), got in d["results"]:
        want = expected_interval(save, mtbf, step)
        call = f"checkpoint_every({save}, {mtbf}, {step})"
        if isinstance(got, str):
            return f"{call} {got if got.startswith('raised') else 'returned ' + got}: return an int, {want} here"
        if got != want:
            return (f"{call} returned {got}; sqrt(2 * {save} * {mtbf}) = {math.sqrt(2 * save * mtbf):.4g} s is "
                    f"{math.sqrt(2 * save * mtbf) / step:.4g} steps of {step} s: the nearest whole number, at least 1, is {want}")
    return None


register("checkpoint_every",
         Case("Young's interval sqrt(2 C M) in the nearest whole number of steps, at least 1",
              observe_intervals, judge_intervals),
         answers=[Answer("checkpoint_every", "function",
                         "a function checkpoint_every(save_seconds, mtbf_seconds, step_seconds) returning how many "
                         "training steps to run between checkpoints, an int")],
         points=1)

"""Hidden checks for lesson 16 (checkpoints and restarts). Never released; see lesson01's file for the form.

Checkpoint layouts are generated from seeds (``gpucourse.checks.lesson16.generated_layout``); the observers
build them in temporary folders in the sandbox and call the answer; the judges rebuild the layouts from the
same seeds and pick the expected folder with the rule written out again here. ``checkpoint_every`` is judged
on seeded grids against Young's interval, also written out here.
"""

import math
import re

from gpucourse.checks import Case
from gpucourse.checks.lesson16 import describe_layout, generated_layout, interval_grid, judge_intervals

# --- latest_complete_checkpoint -----------------------------------------------------------------
# What the exercise's text states, and the case that checks it:
#  1. only folders directly under root named exactly step_<N> (N decimal digits) count; files, other
#     names (step_12.tmp, step_3_old, ckpt_9, Step_4, step_, step_x) are ignored .... "names that are not ..."
#  2. complete = the folder holds a .metadata file; incomplete ones never win ........ every generated case
#  3. newest = the largest N as a number (step_9 < step_10 < step_100), never by
#     modification time (the generated mtimes put another folder last) .............. "generated layouts ..."
#  4. returns the folder's path (root / name; str or pathlib.Path) ................... every case
#  5. None when no folder is complete, when root is empty, when root does not exist .. "nothing complete ..."
#  6. root may be given as a str or as a pathlib.Path .................................. "root as a str ..."

SEEDS = [1601, 1602, 1603, 1604, 1605, 1606]
NONE_LAYOUTS = [[], [["step_5", "dir", False, 10], ["step_50", "dir", False, 20], ["step_7", "file", False, 1]],
                [["step_1.tmp", "dir", True, 3], ["checkpoint", "dir", True, 2]]]


def newest_complete(layout):
    """The rule, again: the largest N of step_<N> folders holding .metadata, or None."""
    best = None
    for name, kind, complete, _ in layout:
        match = re.fullmatch(r"step_([0-9]+)", name)
        if kind == "dir" and complete and match and (best is None or int(match.group(1)) > best):
            best = int(match.group(1))
    return None if best is None else f"step_{best}"


def judge_layouts(layouts, missing=False):
    def judge(d):
        wanted = [(layout, False) for layout in layouts] + ([([], True)] if missing else [])
        if len(d["results"]) != len(wanted):
            return "the inputs were changed while checking"
        for (layout, gone), got in zip(wanted, d["results"]):
            want = None if gone else newest_complete(layout)
            name = got["name"] if isinstance(got, dict) else None
            if isinstance(got, str) or name != want:
                shown = (f"returned root / {name!r}" if isinstance(got, dict) else
                         "returned None" if got is None else got if got.startswith("raised") else f"returned {got}")
                from gpucourse.checks.lesson16 import _diagnosis
                return (f"{describe_layout(layout, gone)}: {shown}; the newest complete checkpoint is "
                        f"{'root / ' + repr(want) if want else 'None'}{_diagnosis(layout, name) if name else ''}")
        return None
    return judge


def observe_generated(ns):
    from gpucourse.checks.lesson16 import generated_layout, observe_latest_checkpoints

    return observe_latest_checkpoints(ns, [generated_layout(s, decoys=False) for s in [1601, 1602, 1603, 1604, 1605, 1606]])


def observe_decoys(ns):
    from gpucourse.checks.lesson16 import generated_layout, observe_latest_checkpoints

    return observe_latest_checkpoints(ns, [generated_layout(s, decoys=True) for s in [1601, 1602, 1603, 1604, 1605, 1606]])


def observe_none(ns):
    from gpucourse.checks.lesson16 import observe_latest_checkpoints

    return observe_latest_checkpoints(ns, [[], [["step_5", "dir", False, 10], ["step_50", "dir", False, 20], ["step_7", "file", False, 1]],
                                           [["step_1.tmp", "dir", True, 3], ["checkpoint", "dir", True, 2]]], missing=True)


def observe_as_str(ns):
    from gpucourse.checks.lesson16 import generated_layout, observe_latest_checkpoints

    return observe_latest_checkpoints(ns, [generated_layout(s, decoys=True) for s in [1601, 1604]], as_str=True, missing=True)


HIDDEN = {"latest_complete_checkpoint": [
    Case("generated layouts: the largest N of 1 to 5 digits, complete, whatever the modification times",
         observe_generated, judge_layouts([generated_layout(s, decoys=False) for s in SEEDS])),
    Case("names that are not step_<N> folders are ignored (files, step_12.tmp, step_3_old, ckpt_9, Step_4)",
         observe_decoys, judge_layouts([generated_layout(s, decoys=True) for s in SEEDS])),
    Case("nothing complete, an empty root, a missing root: None", observe_none,
         judge_layouts(NONE_LAYOUTS, missing=True)),
    Case("root as a str, and a missing root given as a str", observe_as_str,
         judge_layouts([generated_layout(s, decoys=True) for s in (1601, 1604)], missing=True)),
]}


# --- checkpoint_every ---------------------------------------------------------------------------
#  1. Young's interval sqrt(2 * save_seconds * mtbf_seconds), in seconds, turned into steps of
#     step_seconds: the nearest whole number (no input lies within 1e-3 of a half) .. "every scale ..."
#  2. at least 1, even when the interval is shorter than one step .................... "shorter than a step"
#  3. an int (not a float, not a numpy number) ......................................... every case
#  4. ints or floats as inputs ........................................................... "every scale ..."
#  5. ValueError when an input is zero, negative, nan or infinite ...................... "bad input raises ValueError"

GRID_SEED = 1616
SHORT = [[0.5, 100.0, 60.0], [1, 10, 300], [0.01, 60, 1], [2.0, 50.0, 14.2]]
BAD = [[0, 3600, 1.0], [-5, 3600, 1.0], [10, 0, 1.0], [10, -1.0, 1.0], [10, 3600, 0],
       [10, 3600, -2.0], [float("nan"), 3600, 1.0], [10, float("inf"), 1.0], [10, 3600, float("nan")]]


def young_steps(save, mtbf, step):
    return max(1, int(math.floor(math.sqrt(2.0 * save * mtbf) / step + 0.5)))


def judge_grid(grid):
    def judge(d):
        if [row[0] for row in d["results"]] != grid:
            return "the inputs were changed while checking"
        for args, got in d["results"]:
            if got != young_steps(*args) or type(got) is not int:
                return judge_intervals(d, grid=grid) or f"checkpoint_every{tuple(args)} returned {got}"
        return None
    return judge


def observe_grid(ns):
    from gpucourse.checks.lesson16 import interval_grid, observe_intervals

    return observe_intervals(ns, grid=interval_grid(1616))


def observe_short(ns):
    from gpucourse.checks.lesson16 import observe_intervals

    return observe_intervals(ns, grid=[[0.5, 100.0, 60.0], [1, 10, 300], [0.01, 60, 1], [2.0, 50.0, 14.2]])


def observe_bad(ns):
    from gpucourse.checks.lesson16 import observe_intervals

    nan, inf = float("nan"), float("inf")
    return observe_intervals(ns, grid=[[10, 3600, 1.0]],
                             bad=[[0, 3600, 1.0], [-5, 3600, 1.0], [10, 0, 1.0], [10, -1.0, 1.0], [10, 3600, 0],
                                  [10, 3600, -2.0], [nan, 3600, 1.0], [10, inf, 1.0], [10, 3600, nan]])


def judge_bad(d):
    shown = [[a if math.isfinite(a) else str(a) for a in args] for args in BAD]
    if [row[0] for row in d["raised"]] != shown:
        return "the inputs were changed while checking"
    for args, got in d["raised"]:
        if got != "ValueError":
            what = got if got.startswith("returned") else "raised " + got
            return f"checkpoint_every{tuple(args)} must raise ValueError, but it {what}"
    return judge_grid([[10, 3600, 1.0]])(d)


HIDDEN["checkpoint_every"] = [
    Case("every scale of save time, MTBF and step time, ints and floats", observe_grid,
         judge_grid(interval_grid(GRID_SEED))),
    Case("an interval shorter than a step still gives 1", observe_short, judge_grid(SHORT)),
    Case("bad input raises ValueError", observe_bad, judge_bad),
]

"""Hidden checks for lesson 1. Never released, never readable from the sandbox. One module per exercise
(``parallel_map``, ``lines_dataset``, ``average_across_ranks``; ``choose_tools`` is here); this one gathers
their cases.

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
from gpucourse.checks.lesson01_processes_threads import observe_choices  # same observation, stricter judges

from . import average_across_ranks as ranks, lines_dataset as lines, parallel_map as pmap

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


HIDDEN = {
    "parallel_map": [
        Case("kind='io': threads of this process, at most `workers`", pmap.observe_io_threads, pmap.judge_io_threads,
             draw=pmap.draw_io_threads),
        Case("kind='cpu': other processes, at most `workers`", pmap.observe_cpu_processes, pmap.judge_cpu_processes,
             draw=pmap.draw_cpu_processes),
        Case("results follow the order of items (a tuple), whatever finishes first", pmap.observe_item_order, pmap.judge_item_order,
             draw=pmap.draw_item_order),
        Case("a list of [fn(x) for x in items]: drawn functions and items, one item, no items", pmap.observe_applied,
             pmap.judge_applied, draw=pmap.draw_applied),
        Case("other kinds raise ValueError", pmap.observe_other_kinds, pmap.judge_other_kinds, draw=pmap.draw_other_kinds),
        Case("kind='cpu': fn's CPU time is spent outside the calling process (seen by the grader)", pmap.observe_cpu_time,
             pmap.judge_cpu_time, draw=pmap.draw_cpu_time, seen=True),
        Case("kind='io', workers=None: the pool's default, one thread per core at once (up to 32)", pmap.observe_io_default,
             pmap.judge_io_default, draw=pmap.draw_io_default),
    ],
    "lines_dataset": [
        Case("other files: len and every item (negative, zero, up to the int64 limits, no newline at the end)",
             lines.observe_dataset_items, lines.judge_dataset_items, draw=lines.draw_dataset_items),
        Case("indices outside 0 .. len-1 raise IndexError (negative ones too), one line, no lines", lines.observe_dataset_bounds,
             lines.judge_dataset_bounds, draw=lines.draw_dataset_bounds),
        Case("keeps no open file, pickled after use, and through DataLoader(num_workers=2)", lines.observe_dataset_pickle_and_workers,
             lines.judge_dataset_pickle_and_workers, draw=lines.draw_dataset_pickle_and_workers),
    ],
    "choose_tools": [
        Case("work that holds the GIL", observe_choices, _choices_judge("ad")),
        Case("work that releases the GIL or waits on a blocking call", observe_choices, _choices_judge("bf")),
        Case("thousands of idle connections", observe_choices, _choices_judge("c")),
        Case("a tiny job, once", observe_choices, _choices_judge("e")),
    ],
    "average_across_ranks": [
        Case("shard_indices: a list of Python ints, other n, ranks and world sizes", ranks.observe_generated_ranks,
             ranks.judge_generated_shards, draw=ranks.draw_rank_inputs),
        Case("average_across_ranks: a new tensor, input unchanged (3 ranks, and 1)", ranks.observe_generated_ranks,
             ranks.judge_generated_new_tensor, draw=ranks.draw_rank_inputs),
        Case("average_across_ranks: the mean over all ranks (3 of them, and 1), other shapes and dtypes (integers: the true mean)",
             ranks.observe_generated_ranks, ranks.judge_generated_mean, draw=ranks.draw_rank_inputs),
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
        "workers: at most that many threads or processes; None means the pool's default": [_PM[0], _PM[1], _PM[3], _PM[6]],
        "items may be empty: the result is []": [_PM[3]],
        "fn raising on an item: the list comprehension raises, and so does parallel_map (the same exception type)": [_PM[3]],
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

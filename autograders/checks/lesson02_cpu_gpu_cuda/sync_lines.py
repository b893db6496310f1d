"""Hidden checks for lesson 2: sync_lines (the package's docstring says how every part works)."""

# --- sync_lines ---------------------------------------------------------------------------
# 1. a set of ints (a list or tuple is read as one), numbers 1 to 14                 -> "ints" (and public)
# 2. every line where a GPU value becomes a Python value                             -> "a GPU value ..."
# 3. every copy to the CPU and every operation whose output size depends on the data -> "copies to the CPU ..."
# 4. every explicit wait                                                             -> "explicit waits"
# 5. no line that only queues work                                                   -> "lines that only queue work"

def observe_sync_lines_as_given(ns):
    import numbers
    from gpucourse.checks import answer
    lines = answer(ns, "sync_lines")
    items = list(lines)
    ints = [int(n) for n in items if isinstance(n, numbers.Integral) and not isinstance(n, bool)]
    return {"lines": sorted(set(ints)), "not_ints": [f"{type(n).__name__} {n!r}"[:40] for n in items
                                                     if not isinstance(n, numbers.Integral) or isinstance(n, bool)]}


def _sync_judge(expected, what):
    def judge(d):
        if not d["lines"] and not d["not_ints"]:
            return "no line numbers given"
        if d["not_ints"]:
            return None  # reported once, by the "ints" case
        missed = len(set(expected) - set(d["lines"]))
        return f"{missed} of the {what} missed" if missed else None
    return judge


SYNC_LINES = {4, 6, 8, 10, 11, 13}


def judge_sync_ints(d):
    if d["not_ints"]:
        return f"give the line numbers as ints, got {d['not_ints'][0]}"
    return None if d["lines"] else "no line numbers given"


def judge_sync_only_queue(d):
    if not d["lines"]:
        return "no line numbers given"
    extra = len(set(d["lines"]) - SYNC_LINES)
    return f"{extra} line(s) chosen that only queue work" if extra else None

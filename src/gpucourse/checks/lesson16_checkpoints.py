"""Public checks for lesson 16 (checkpoints and restarts). Observers are self-contained: see lesson01_processes_threads.py.

``latest_complete_checkpoint`` is called on folders the observer builds in a temporary folder from a
*layout* (plain data: paths under the root, folder or file, complete or not, modification times). The public
cases store the answer the exercise's text gives for each layout (``PUBLIC_LAYOUTS``), and
``checkpoint_every`` its value for each public call (``INTERVAL_PUBLIC``): this module holds no way to work
either out (the grader's references live with its hidden checks, which draw their inputs at grading time).
"""

from __future__ import annotations

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson16_checkpoints"  # the course folder this module's exercises belong to

# A layout: {"entries": [[path, kind, complete, age], ...], "root": how the root is given, "missing": bool}.
# path: relative to the root, "/"-separated (a nested one makes its parent folders, without .metadata);
# kind "dir" or "file"; complete: a .metadata file inside (dirs only; "empty": an empty .metadata file); age:
# seconds before now of the entry's modification time (smaller = more recently modified). root: "path" (a
# pathlib.Path), "str", or "str/" (a str ending in a slash). missing: the root does not exist (entries ignored).
# Each public layout with the answer the text gives ("name": the folder under the root, or None) and, for the
# wrong picks a student is likely to make, why they are wrong.
PUBLIC_LAYOUTS = [
    {"layout": {"entries": [["step_3", "dir", True, 10], ["step_9", "dir", True, 300], ["step_10", "dir", True, 400],
                            ["step_12", "dir", False, 5], ["latest", "file", False, 1], ["step_11.tmp", "dir", True, 2]],
                "root": "path", "missing": False},
     "name": "step_10",
     "why": {"step_9": "the largest name as text: compare N as numbers, step_9 < step_10",
             "step_12": "step_12 has no .metadata: its save never completed",
             "step_11.tmp": "step_11.tmp is not a folder named step_<N>: ignore it",
             "step_3": "the most recently modified, not the largest N",
             "latest": "latest is not a folder named step_<N>: ignore it"}},
    {"layout": {"entries": [], "root": "str", "missing": False}, "name": None, "why": {}},  # an empty root
    {"layout": {"entries": [["step_4", "dir", False, 30], ["step_8", "dir", False, 20]], "root": "path", "missing": False},
     "name": None, "why": {}},  # nothing complete
]


def _shown_entry(name, kind, complete) -> str:
    shown = name if name.isprintable() else repr(name)  # a name holding a newline, quoted
    if kind != "dir":
        return f"{shown} (a file)"
    if name.rsplit("/", 1)[-1] == ".metadata":
        return f"{shown}/ (a folder)"
    return f"{shown}/ ({'complete: an empty .metadata' if complete == 'empty' else 'complete' if complete else 'no .metadata'})"


def describe_layout(layout) -> str:
    """A layout in words, for messages."""
    if layout.get("missing"):
        return "a root folder that does not exist"
    entries = layout["entries"]
    if not entries:
        return "an empty root folder"
    parts = [_shown_entry(name, kind, complete) for name, kind, complete, _ in entries]
    shown = ", ".join(parts)
    return "root holding " + (shown if len(shown) < 400 else shown[:396] + " ...")


def build_layout(root, entries) -> None:
    """Make ``entries`` (a layout's) under ``root`` (a folder that exists) and set every entry's modification time."""
    import os
    import time
    from pathlib import Path

    now = time.time()
    for name, kind, complete, age in entries:
        path = Path(root, *name.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "dir":
            path.mkdir(exist_ok=True)
            (path / "__0_0.distcp").write_bytes(b"\0" * 16)
            if complete:
                (path / ".metadata").write_bytes(b"" if complete == "empty" else b"\0" * 8)
        else:
            path.write_text("step_0\n")
    for name, kind, complete, age in entries:  # after every file is written: writing inside a folder touches it
        os.utime(Path(root, *name.split("/")), (now - age, now - age))


def observe_layouts(ns, layouts):
    """``latest_complete_checkpoint`` on every layout of ``layouts``, each built in a fresh temporary folder. What
    came back, as data: ``{"name": <its path relative to the root>}`` (for a path under the root), ``None``,
    ``{"raised": [class names]}``, or ``{"other": <what else>}``."""
    import os
    import tempfile
    from pathlib import Path

    from gpucourse.checks import answer
    from gpucourse.checks.lesson16_checkpoints import build_layout

    function = answer(ns, "latest_complete_checkpoint")
    results = []
    for layout in layouts:
        with tempfile.TemporaryDirectory(prefix="gpucourse-ckpt-check-") as parent:
            root = Path(parent) / "checkpoints"
            if not layout.get("missing"):
                root.mkdir()
                build_layout(root, layout["entries"])
            given = {"path": root, "str": str(root), "str/": str(root) + os.sep}[layout.get("root", "path")]
            try:
                got = function(given)
            except NotImplementedError:
                raise
            except Exception as error:  # noqa: BLE001 - reported by class: the judge says which layout raised it
                results.append({"raised": [k.__name__ for k in type(error).__mro__]})
                continue
            if got is None:
                results.append(None)
            elif not isinstance(got, (str, os.PathLike)):
                results.append({"other": f"a {type(got).__name__} ({str(got)[:60]}), not a path"})
            else:
                path = Path(os.fspath(got))
                inside = path.is_absolute() and (path.resolve() == root.resolve() or root.resolve() in path.resolve().parents)
                if inside and path.resolve() != root.resolve():
                    results.append({"name": path.resolve().relative_to(root.resolve()).as_posix()})
                else:
                    results.append({"other": f"{os.fspath(got)[:120]!r}, not a folder under the root"})
    return results


def shown_result(got) -> str:
    """What the answer did, in words (the judge's)."""
    if got is None:
        return "returned None"
    if isinstance(got, dict) and isinstance(got.get("name"), str):
        return f"returned root / {got['name']!r}"
    if isinstance(got, dict) and isinstance(got.get("raised"), list) and got["raised"]:
        return f"raised {got['raised'][0]}"
    if isinstance(got, dict) and "other" in got:
        return f"returned {got['other']}"
    return "reported nothing"


def observe_public_layouts(ns):
    from gpucourse.checks.lesson16_checkpoints import PUBLIC_LAYOUTS, observe_layouts

    return observe_layouts(ns, [case["layout"] for case in PUBLIC_LAYOUTS])


def judge_public_layouts(results):
    from gpucourse.checks.lesson16_checkpoints import PUBLIC_LAYOUTS, describe_layout, shown_result

    if not isinstance(results, list) or len(results) != len(PUBLIC_LAYOUTS):
        return "the answer was not called on every public layout"
    for case, got in zip(PUBLIC_LAYOUTS, results):
        want = case["name"]
        name = got.get("name") if isinstance(got, dict) else None
        if (got is None and want is None) or (name is not None and name == want):
            continue
        why = case["why"].get(name, "") if name else ""
        expected = f"root / {want!r}" if want else "None"
        return (f"{describe_layout(case['layout'])}: {shown_result(got)}; the newest complete checkpoint is {expected}"
                + (f" ({why})" if why else ""))
    return None


register("latest_complete_checkpoint",
         Case("step_9 and step_10: the largest N, numerically, of the complete step_<N> folders; none: None",
              observe_public_layouts, judge_public_layouts),
         answers=[Answer("latest_complete_checkpoint", "function",
                         "a function latest_complete_checkpoint(root) returning the path of the newest complete "
                         "step_<N> checkpoint folder under root, or None")],
         points=2)


# --- Exercise 2: how often to checkpoint (Young's interval, in whole steps) ---------------------------

# [save_seconds, mtbf_seconds, step_seconds] -> the answer the text gives, stored (not computed here)
INTERVAL_PUBLIC = [([60, 86400, 2.0], 1610), ([10.0, 3600, 30.0], 9), ([0.5, 100.0, 60.0], 1)]


def observe_public_intervals(ns):
    """``checkpoint_every`` on the public calls, as ``observe_calls`` reports it."""
    from gpucourse.checks import observe_calls
    from gpucourse.checks.lesson16_checkpoints import INTERVAL_PUBLIC
    from gpucourse.checks.values import describe

    return observe_calls(ns, "checkpoint_every", [{"args": describe(list(args)), "kwargs": describe({})}
                                                  for args, _ in INTERVAL_PUBLIC])


def judge_public_intervals(observed):
    from gpucourse.checks.lesson16_checkpoints import INTERVAL_PUBLIC
    from gpucourse.checks.values import type_words

    if not isinstance(observed, list) or len(observed) != len(INTERVAL_PUBLIC):
        return "the answer was not called on every public case"
    for (args, want), got in zip(INTERVAL_PUBLIC, observed):
        where = f"checkpoint_every{tuple(args)}"
        if not isinstance(got, dict) or "returned" not in got:
            raised = got.get("raised", ["an exception"])[0] if isinstance(got, dict) else "nothing"
            return f"{where} raised {raised}"
        if type(got["returned"]) is not int:
            return f"{where} returned {type_words(got['returned'])}: return an int"
        if got["returned"] != want:
            return (f"{where} returned {got['returned']}; Young's interval sqrt(2 * {args[0]} * {args[1]}) s in steps of "
                    f"{args[2]} s, the nearest whole number, at least 1, is {want}")
    return None


register("checkpoint_every",
         Case("Young's interval sqrt(2 C M) in the nearest whole number of steps, at least 1",
              observe_public_intervals, judge_public_intervals),
         answers=[Answer("checkpoint_every", "function",
                         "a function checkpoint_every(save_seconds, mtbf_seconds, step_seconds) returning how many "
                         "training steps to run between checkpoints, an int")],
         points=1)

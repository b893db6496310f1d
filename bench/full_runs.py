"""`make full-run`: execute every lesson notebook at FULL size and time it, lesson by lesson and cell by cell.

CI runs the notebooks in the smoke setting only (GPUCOURSE_SMOKE=1); this is the maintainer's check that
a student's full run, and nbgrader's Validate (which runs the full size), fit a laptop. Each notebook of
``solutions/`` (the released ``course/`` notebooks have unanswered exercises) runs headless in a real
Jupyter kernel with GPUCOURSE_SMOKE=0 in a fresh temporary folder, with the per-cell limit of Validate
(600 s). Results are merged into ``full_runs.json`` (a later ``--only`` run replaces that lesson's entry)
and written out as ``full_runs.md``: wall time per lesson and its slowest cells.

    python bench/full_runs.py [--only lesson04_mixed_precision ...] [--out bench/results] [--offline 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from gpucourse import environment

ROOT = Path(__file__).resolve().parent.parent
CELL_LIMIT_S = 600  # nbgrader Validate's per-cell timeout, set in autograders/nbgrader_config.py
SLOW_S = 300  # a lesson's full run should fit in about five minutes on a laptop CPU


def notebooks(folder: Path, only: list[str]) -> list[Path]:
    paths = sorted(p for p in folder.glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    return [p for p in paths if not only or p.parent.name in only]


def machine() -> dict:
    import torch

    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def run_notebook(path: Path, cell_limit: int) -> dict:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(path, as_version=4)
    timings: list[dict] = []

    def cell_done(cell, cell_index, execute_reply=None, **_):
        meta = cell.get("metadata", {}).get("execution", {})
        start, end = meta.get("iopub.execute_input"), meta.get("shell.execute_reply")
        seconds = None
        if start and end:
            parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
            seconds = (parse(end) - parse(start)).total_seconds()
        timings.append({"cell": cell_index, "id": cell.get("id"), "first_line": cell.source.splitlines()[0] if cell.source else "",
                        "seconds": seconds})

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    error = None
    with tempfile.TemporaryDirectory(prefix=f"full-run-{path.parent.name}-") as workdir:
        client = NotebookClient(nb, timeout=cell_limit, kernel_name="python3", record_timing=True,
                                on_cell_executed=cell_done, resources={"metadata": {"path": workdir}})
        start = time.perf_counter()
        try:
            client.execute()
        except (CellExecutionError, CellTimeoutError) as exc:
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}"
        except Exception as exc:  # a kernel that died, a missing kernel: record it, go on with the next lesson
            error = f"{type(exc).__name__}: {exc}"[:300]
        wall = time.perf_counter() - start
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    timed = [t for t in timings if t["seconds"] is not None]
    return {"notebook": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path), "wall_s": round(wall, 1), "cells": len(timed),
            "error": error, "load_1min_before": load_before, "load_1min_after": load_after,
            "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "slowest": sorted(timed, key=lambda t: -t["seconds"])[:5],
            "all_cells": timed}


def write_report(results: dict, out: Path) -> Path:
    lines = ["# Full-size runs of every lesson notebook", "",
             "Each notebook of `solutions/` executed top to bottom in a Jupyter kernel with `GPUCOURSE_SMOKE=0` "
             f"(`GPUCOURSE_OFFLINE={results['offline']}`), the per-cell limit of nbgrader's Validate "
             f"({CELL_LIMIT_S} s). Written by `make full-run` (`bench/full_runs.py`); "
             "the 1-minute load average before and after each lesson shows how busy the machine was.", "",
             f"Machine: {results['machine']['cpus']} CPUs, {results['machine']['platform']}, Python "
             f"{results['machine']['python']}, torch {results['machine']['torch']}, GPU: {results['machine']['cuda'] or 'none'}.", "",
             "| lesson | wall time | status | load before → after | slowest cells (seconds) |", "|---|---:|---|---|---|"]
    lessons = results["lessons"]
    for name in sorted(lessons):
        r = lessons[name]
        status = "error: " + r["error"].replace("|", "\\|") if r["error"] else ("over 5 min" if r["wall_s"] > SLOW_S else "ok")
        slow = ", ".join(f"[{t['cell']}] {t['seconds']:.0f} s" for t in r["slowest"][:3])
        load = f"{r['load_1min_before']:.1f} → {r['load_1min_after']:.1f}" if r["load_1min_before"] is not None else "-"
        lines.append(f"| {name} | {r['wall_s']:.0f} s | {status} | {load} | {slow} |")
    total = sum(r["wall_s"] for r in lessons.values())
    lines += ["", f"Total: {total:.0f} s ({total / 60:.1f} min) for {len(lessons)} notebooks.", "",
              "## Slowest cells", ""]
    for name in sorted(lessons):
        lines.append(f"**{name}** (finished {lessons[name]['finished_utc']})")
        lines.append("")
        for t in lessons[name]["slowest"]:
            lines.append(f"- cell {t['cell']}: {t['seconds']:.1f} s, `{t['first_line'][:90]}`")
        lines.append("")
    path = out / "full_runs.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=ROOT / "solutions", help="notebooks' folder (default solutions/)")
    parser.add_argument("--only", nargs="*", default=[], help="assignment folders to run, e.g. lesson04_mixed_precision")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--offline", default="1",  # `make full-run` passes the caller's GPUCOURSE_OFFLINE
                        help="GPUCOURSE_OFFLINE for the kernels (1: the generated CIFAR-10; 0: download the real one)")
    parser.add_argument("--cell-limit", type=int, default=CELL_LIMIT_S)
    args = parser.parse_args(argv)
    os.environ[environment.SMOKE] = "0"  # kernels inherit this environment
    os.environ[environment.OFFLINE] = args.offline
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "full_runs.json"
    paths = notebooks(args.folder, args.only)
    if not paths:
        print(f"no notebooks in {args.folder} match {args.only}", file=sys.stderr)
        return 2
    failed = 0
    for path in paths:
        print(f"{path.parent.name}: running at full size ...", flush=True)
        result = run_notebook(path, args.cell_limit)
        failed += bool(result["error"])
        results = json.loads(store.read_text()) if store.is_file() else {"lessons": {}}  # read again: merge
        results.update(machine=machine(), offline=args.offline)
        results["lessons"][path.parent.name] = result
        store.write_text(json.dumps(results, indent=1))
        report = write_report(results, args.out)
        slow = ", ".join(f"cell {t['cell']} {t['seconds']:.0f} s" for t in result["slowest"][:3])
        error = f" ERROR {result['error']}" if result["error"] else ""
        print(f"{path.parent.name}: {result['wall_s']:.0f} s ({slow}){error}", flush=True)
    print(f"wrote {report} and {store}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

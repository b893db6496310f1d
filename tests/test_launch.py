"""gpucourse.launch (one torchrun launcher, one reader of rank reports), gpucourse.timing, and the
rule that lessons never import the checks."""

from __future__ import annotations

import ast
import json
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from gpucourse import launch, timing


def _alive(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.slow  # torchrun launches that are timed out or interrupted (10-20 s): `make test`, not `make test-fast`
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
def test_timeout_leaves_no_rank_behind(tmp_path):
    """Ranks that sleep (and a child of one started in a session of its own would not count: it is
    not torchrun's); at the timeout the launcher and every rank are gone."""
    marker = f"gpucourse-rank-{uuid.uuid4().hex}"
    script = tmp_path / "sleeper.py"
    script.write_text(textwrap.dedent(f"""
        import os, subprocess, sys, time
        # a grandchild too, as a data-loader worker would be
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"])
        # one write per line: two ranks share the pipe, and print() writes its pieces one by one
        os.write(1, ("rank " + os.environ["RANK"] + " sleeping" + chr(10)).encode())
        time.sleep(600)
    """))
    result = launch.torchrun([str(script), marker], nproc=2, timeout=20)
    assert result.timed_out and result.returncode is None
    assert "rank 0 sleeping" in result.output and "rank 1 sleeping" in result.output, result.output[-2000:]
    time.sleep(0.5)
    assert not _alive(marker), "a rank or its child outlived the launch"


@pytest.mark.slow  # torchrun launches that are timed out or interrupted (10-20 s): `make test`, not `make test-fast`
def test_interrupt_leaves_no_rank_behind(tmp_path, monkeypatch):
    """An exception while waiting (a notebook's interrupt, a check's alarm) kills the group too."""
    marker = f"gpucourse-rank-{uuid.uuid4().hex}"
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(600)\n")
    real = launch.subprocess.Popen.communicate

    def interrupted(self, *args, **kwargs):
        deadline = time.time() + 30
        while len(_alive(marker)) < 3 and time.time() < deadline:  # the launcher and both ranks
            time.sleep(0.2)
        raise KeyboardInterrupt

    monkeypatch.setattr(launch.subprocess.Popen, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launch.torchrun([str(script), marker], nproc=2, timeout=60)
    monkeypatch.setattr(launch.subprocess.Popen, "communicate", real)
    time.sleep(0.5)
    assert not _alive(marker)


def test_torchrun_runs_ranks_and_reads_their_reports(tmp_path):
    script = tmp_path / "report.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        from pathlib import Path
        rank = int(os.environ["RANK"])
        Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world": int(os.environ["WORLD_SIZE"])}))
    """))
    result = launch.torchrun([str(script), str(tmp_path)], nproc=2, timeout=120)
    assert result.returncode == 0 and not result.timed_out and result.seconds > 0, result.output[-2000:]
    assert launch.read_rank_reports(tmp_path) == {0: {"rank": 0, "world": 2}, 1: {"rank": 1, "world": 2}}


def test_rank_reports_are_ordered_by_number_and_checked(tmp_path):
    for rank in (10, 2, 0):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({"rank": rank}))
    (tmp_path / "rank1.json.partial").write_text("{")  # not a report
    (tmp_path / "inputs.json").write_text("[]")
    assert list(launch.read_rank_reports(tmp_path)) == [0, 2, 10]
    (tmp_path / "rank3.json").write_text("{not json")
    with pytest.raises(ValueError, match="rank3.json"):
        launch.read_rank_reports(tmp_path)
    assert launch.read_rank_reports(tmp_path, strict=False)[3] == {"unreadable": True}


def test_seconds_per_call_uses_the_benchmark_timer():
    x, calls = torch.randn(64, 64), []
    assert timing.seconds_per_call(lambda: calls.append(x @ x), min_seconds=0.05) > 0
    assert len(calls) > 1  # block size estimated, then blocks of calls
    calls.clear()
    assert timing.seconds_per_call(lambda: calls.append(1), calls=3) > 0
    assert len(calls) == 2 + 3  # two warm-up calls, then exactly the calls asked for


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_lesson_module_imports_the_checks():
    """The checks build on the lessons' helpers, never the other way round (a check may change
    without a lesson noticing, and the released package must work without the graded parts)."""
    offenders = {path.name: sorted(n for n in _imports(path) if n == "gpucourse.checks" or n.startswith("gpucourse.checks."))
                 for path in sorted((ROOT / "src" / "gpucourse").glob("*.py"))}
    assert not {name: found for name, found in offenders.items() if found}


def test_a_launch_that_fails_for_the_machine_is_tried_again_then_reported(monkeypatch):
    """Under load torchrun's start can fail outside the student's code (the rendezvous store cannot
    be reached, a thread cannot start): tried again; failing every time, the record says why, and
    the grader turns that into a flag (engine.infrastructure), never a silent 0."""
    import sys

    from gpucourse.checks import ddp

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "autograders"))
    from autograders import engine

    failures = ["torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed.",
                "RuntimeError: cannot join thread before it is started"]
    ok = ({"returncode": 0, "ranks": {"0": {"rank": 0}}, "tail": ""}, "")
    outcomes = iter([({"returncode": 1, "ranks": {}, "tail": f}, f) for f in failures] + [ok])
    monkeypatch.setattr(ddp, "_launch_once", lambda *a: next(outcomes))
    assert ddp._launch("src", 2, "m:f") == ok[0]

    monkeypatch.setattr(ddp, "_launch_once", lambda *a: ({"returncode": 1, "ranks": {}, "tail": failures[0]}, failures[0]))
    record = ddp._launch("src", 2, "m:f")
    assert record["infrastructure"] == f"RendezvousConnectionError in each of {ddp.policy().tries} launches"
    notes = engine.infrastructure({engine.CaseRef("average_across_ranks", "public", 0): {"ok": True, "data": record}})
    assert notes and "RendezvousConnectionError" in notes[0]

    wrong = "ValueError: the student's own error"  # the answer's failure: launched once, no flag
    calls = []
    monkeypatch.setattr(ddp, "_launch_once", lambda *a: calls.append(1) or ({"returncode": 1, "ranks": {}, "tail": wrong}, wrong))
    assert "infrastructure" not in ddp._launch("src", 2, "m:f") and len(calls) == 1

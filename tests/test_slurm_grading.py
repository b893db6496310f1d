"""A class graded as one Slurm job array (`make grade GRADE_ARGS=--slurm`, autograders/slurm_grade.py).

On lesson 10's local cluster (conftest.local_cluster: two emulated nodes, started here where it can
run): a class with every kind of exercise (code, answer, a 2-process script) gets exactly the grades,
flags and files of the local pool on the same submissions and seed; array tasks killed from outside
while they grade (``scancel --signal=KILL --full``, as a node's out-of-memory killer or a node failure
ends them) are submitted again and resume after what they saved, and what a task never graded is
flagged and listed with Slurm's reason, never scored. Where no cluster
can start these skip, saying what is missing (GPUCOURSE_REQUIRE_SLURM=1 fails instead). How the
class is dealt into shards, the time limit and a result that cannot be read are tested everywhere.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from traitlets.config import Config

from autograders import classroom, grade, slurm_grade
from autograders.settings import Grading, SlurmGrading
from conftest import local_cluster

from gpucourse import local_slurm as LS

# every kind of exercise: lesson 1 has code, answer and 2-process script exercises; the quiz answers only
KINDS = [("reference", "lesson01_processes_threads"), ("unanswered", "lesson01_processes_threads"),
         ("wrong-1", "quiz_gpu_data_parallel")]
QUIZ = [("reference", "quiz_gpu_data_parallel"), ("right-1", "quiz_gpu_data_parallel"),
        ("unanswered", "quiz_gpu_data_parallel"), ("wrong-1", "quiz_gpu_data_parallel"),
        ("wrong-2", "quiz_gpu_data_parallel")]


@pytest.fixture(scope="module")
def slurm():
    """The local cluster, up for this module's cluster tests (stopped after if it was down). Skips where it
    cannot start, saying what is missing; GPUCOURSE_REQUIRE_SLURM=1 fails instead."""
    with local_cluster() as up:
        if not up:
            pytest.skip("no local Slurm cluster: " + "; ".join(LS.missing()))
        yield LS


def _class(folder: Path, pairs: list[tuple[str, str]]) -> tuple[Path, dict]:
    """The classroom's submissions ``pairs`` in ``folder/submitted``, and the scores each should get."""
    built = folder / "built"
    expected = {}
    for aid in sorted({aid for _, aid in pairs}):
        expected.update(classroom.build(built / aid, only=aid))
    submitted = folder / "submitted"
    for student, aid in pairs:
        shutil.copytree(built / aid / student / aid, submitted / student / aid)
    return submitted, {pair: expected[pair] for pair in pairs}


def _on_slurm(**settings) -> Config:
    config = Config()
    for name, value in {"poll_seconds": 1.0, "cpus_per_task": 1, **settings}.items():
        setattr(config.SlurmGrading, name, value)
    return config


def _grades(results: Path) -> dict[tuple[str, str], tuple[str, str]]:
    with open(results / "grades.csv") as f:
        return {(row["student_id"], row["assignment"]): (row["score"], row["max_score"]) for row in csv.DictReader(f)}


def _files(results: Path) -> set[str]:
    return {str(p.relative_to(results)) for p in results.rglob("*") if p.is_file()}


def _scores(results: Path, student: str, aid: str) -> dict[str, float]:
    """Each test cell's score in the autograded notebook (metadata.gpucourse)."""
    path = next((results / "nbgrader" / "autograded" / student / aid).glob("*.ipynb"))
    return {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["gpucourse"]["score"]
            for c in json.loads(path.read_text())["cells"] if "score" in c.get("metadata", {}).get("gpucourse", {})}


def _grade_jobs() -> int:
    """How many jobs named ``grade`` the cluster ran (sacct --completion: one line per array task)."""
    return sum(1 for line in LS.sacct().splitlines()[2:] if line.split()[1:2] == ["grade"])


def _holds_expected(results: Path, expected: dict) -> None:
    for (student, aid), cells in expected.items():
        scores = _scores(results, student, aid)
        for cell, want in cells.items():
            assert (scores[cell] > 0) == (want == "full"), (student, aid, cell, scores[cell])


@pytest.mark.slow
def test_the_array_grades_every_kind_exactly_as_the_local_pool(slurm, tmp_path):
    submitted, expected = _class(tmp_path, KINDS)
    local = grade.grade(submitted, tmp_path / "local", jobs=2)
    before = _grade_jobs()
    on_slurm = grade.grade(submitted, tmp_path / "slurm", jobs=2, slurm=True, config_overrides=_on_slurm(shard_size=2))
    assert _grade_jobs() - before == 2  # ceil(3 / 2) shards: one array of two tasks, each run once
    _holds_expected(tmp_path / "local", expected)  # the comparison is with a local run that grades right
    assert _grades(tmp_path / "slurm") == _grades(tmp_path / "local")
    for student, aid in KINDS:
        assert _scores(tmp_path / "slurm", student, aid) == _scores(tmp_path / "local", student, aid)
    for name in ("flagged.txt", "problems.txt"):
        assert (tmp_path / "slurm" / name).read_text() == (tmp_path / "local" / name).read_text()
    assert sorted(on_slurm.flagged) == sorted(local.flagged) and on_slurm.problems == local.problems == []
    assert _files(tmp_path / "slurm") == _files(tmp_path / "local")  # no shard left behind: the same files


class Killer(threading.Thread):
    """Kills running array tasks from outside the grader, as a node failure or an out-of-memory killer would:
    SIGKILL to the task's batch script and every process under it (``scancel --signal=KILL --full
    JOB_INDEX``). ``at[index]``: for each try of task ``index`` in turn, how many results its folder must
    hold (saved by this try and the earlier ones) when this try is killed."""

    def __init__(self, folder: Path, at: dict[int, list[int]]):
        super().__init__(daemon=True)
        self.folder, self.at, self.done = folder, at, threading.Event()
        self.kills: dict[int, list[tuple[str, int]]] = {index: [] for index in at}  # index -> (job_index, saved)
        self.errors: list[str] = []

    def saved(self, index: int) -> int:
        return len(list((self.folder / f"task-{index}").glob("*.json")))

    def running(self, index: int) -> str | None:
        """The running task ``JOB_index`` of the grading array (squeue lists each array task on its own line)."""
        out = subprocess.run(["squeue", "-h", "-r", "--name=grade", "-t", "RUNNING", "-o", "%i"], capture_output=True,
                             text=True, timeout=30, env=slurm_grade.slurm_env()).stdout.split()
        return next((task for task in reversed(sorted(out)) if task.endswith(f"_{index}")), None)

    def run(self) -> None:
        while not self.done.is_set():
            for index, thresholds in self.at.items():
                tries = len(self.kills[index])
                if tries < len(thresholds) and self.saved(index) >= thresholds[tries]:
                    task = self.running(index)
                    if task is None or any(task == killed for killed, _ in self.kills[index]):
                        continue  # its next try is not running yet
                    killed = subprocess.run(["scancel", "--signal=KILL", "--full", task], capture_output=True,
                                            text=True, timeout=30, env=slurm_grade.slurm_env())
                    if killed.returncode:
                        self.errors.append(f"scancel {task}: {killed.stderr.strip()}")
                    self.kills[index].append((task, self.saved(index)))
            time.sleep(0.05)


@pytest.mark.slow
def test_a_failed_task_is_retried_from_where_it_stopped_then_its_rest_is_flagged(slurm, tmp_path):
    """Five quiz submissions in shards of 3 and 2, each task grading one at a time. Task 1 is killed once,
    once it saved its first submission: its retry grades only the second. Task 0 is killed on both tries,
    once each saved one submission: its third is flagged and listed, with what Slurm said about each try."""
    submitted, expected = _class(tmp_path, QUIZ)
    results = tmp_path / "results"
    before = _grade_jobs()
    killer = Killer(results / "nbgrader" / "slurm", {0: [1, 2], 1: [1]})
    killer.start()
    try:
        batch = grade.grade(submitted, results, jobs=2, slurm=True,
                            config_overrides=_on_slurm(shard_size=3, retries=1))
    finally:
        killer.done.set()
        killer.join()
    assert not killer.errors, killer.errors
    # each kill landed while its try had saved exactly the results it was waiting for, no more
    assert {i: [saved for _, saved in kills] for i, kills in killer.kills.items()} == {0: [1, 2], 1: [1]}, killer.kills
    assert _grade_jobs() - before == 4  # tasks 0 and 1, then both again
    plan = json.loads((results / "nbgrader" / "slurm" / "plan.json").read_text())
    shards = [[tuple(pair) for pair in shard] for shard in plan["shards"]]
    assert [len(s) for s in shards] == [3, 2]
    ungraded = [line for line in batch.flagged if "not graded" in line]
    assert len(ungraded) == 1, batch.flagged
    student, aid = ungraded[0].split(":", 1)[0].split("/")
    assert (student, aid) in shards[0]
    assert "its Slurm array task 0 failed 2 time(s)" in ungraded[0]
    # what Slurm said about each try: the very task killed, which Slurm reports CANCELLED (scancel sent the signal)
    for n, (task, _) in enumerate(killer.kills[0], 1):
        assert f"try {n}: job {task}: CANCELLED" in ungraded[0], (task, ungraded[0])
    assert (results / "flagged.txt").read_text().count("not graded") == 1
    assert batch.problems == [f"{student}/{aid}: could not be graded: NotGraded: " + ungraded[0].split("not graded: ", 1)[1]]
    assert (results / "problems.txt").read_text() == batch.problems[0] + "\n"
    # never scored: no autograded notebook, no grade, no log for it; everything else graded right
    assert not (results / "nbgrader" / "autograded" / student).exists()
    assert not (results / "logs" / f"{student}__{aid}.log").exists()
    graded = {pair: cells for pair, cells in expected.items() if pair != (student, aid)}
    _holds_expected(results, graded)
    assert {pair for pair in _grades(results) if pair in graded} == set(graded)
    # each retry resumed after what its task had saved
    first, retry = (results / "nbgrader" / "slurm" / f"task-1-try{n}.out" for n in (1, 2))
    assert "2 of 2 submission(s) to grade" in first.read_text() and "1 of 2 submission(s) to grade" in retry.read_text()
    assert "2 of 3 submission(s) to grade" in (results / "nbgrader" / "slurm" / "task-0-try2.out").read_text()


@pytest.mark.bench
def test_the_bench_compares_the_pool_with_the_array(slurm, tmp_path):
    from autograders import bench_grading

    assert bench_grading.main(["--slurm", "--out", str(tmp_path), "--limit", "2", "--only", "quiz_gpu_data_parallel",
                               "--shard-size", "1"]) == 0
    results = json.loads((tmp_path / "grading-slurm.json").read_text())
    assert (results["submissions"], results["tasks"], results["same_grades"]) == (2, 2, True)
    assert results["overhead"] == pytest.approx(results["slurm_s"] / results["pool_s"] - 1)
    assert all(run["problems"] == 0 and run["load_before"] for run in results["runs"].values())
    assert "| Slurm job array |" in (tmp_path / "grading-slurm.md").read_text()


# --- without a cluster ----------------------------------------------------------------------------

def test_the_class_is_dealt_round_the_shards_longest_first():
    pairs = [(f"s{k}", "a") for k in range(7)]
    dealt = slurm_grade.shards(pairs, 3)
    assert dealt == [[pairs[0], pairs[3], pairs[6]], [pairs[1], pairs[4]], [pairs[2], pairs[5]]]
    assert slurm_grade.shards(pairs[:2], 8) == [pairs[:2]]
    assert slurm_grade.shards(pairs[:3], 1) == [[p] for p in pairs[:3]]
    assert sorted(p for shard in slurm_grade.shards(pairs, 2) for p in shard) == pairs


def test_the_time_limit_is_the_shard_at_its_slowest_unless_set():
    slurm = SlurmGrading()
    assert slurm_grade.time_limit(slurm, 8, 2, 600) == 4 * 10 + 10
    assert slurm_grade.time_limit(slurm, 3, 1, 90) == 5 + 10  # 270 s rounds up to 5 minutes
    assert slurm_grade.time_limit(SlurmGrading(time_minutes=7), 8, 2, 600) == 7


def test_a_result_that_cannot_be_read_is_a_grader_fault_not_a_score(tmp_path):
    """What the grader reads back from a task: a result for another pair, or not JSON, becomes a problem
    ("could not be graded: UnreadableResult: ..."); a grader fault in the task keeps its class name."""
    array = object.__new__(slurm_grade.Array)
    array.work, array.grading = tmp_path, Grading()
    other = tmp_path / "0.json"
    other.write_text(json.dumps({"student": "bob", "assignment": "a"}))
    fault = array._read(other, "ada", "a")
    assert type(fault).__name__ == "UnreadableResult" and "holds bob/a" in str(fault)
    other.write_text("{not json")
    assert type(array._read(other, "ada", "a")).__name__ == "UnreadableResult"
    other.write_text(json.dumps({"student": "ada", "assignment": "a", "error": {"type": "ValueError", "message": "m"}}))
    fault = array._read(other, "ada", "a")
    assert (type(fault).__name__, str(fault)) == ("ValueError", "m")


def test_a_controller_that_stops_answering_ends_the_grading_instead_of_a_wait_forever(monkeypatch):
    """squeue failing (a controller restarting) is looked at again, for UNANSWERED_SECONDS; then the grader stops,
    saying why, rather than polling a cluster that is gone; one answer in between starts the wait again."""
    array = object.__new__(slurm_grade.Array)
    array.env, array.unanswered_since = {}, None
    now = [1000.0]
    answers = []
    monkeypatch.setattr(slurm_grade.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(slurm_grade.subprocess, "run", lambda *a, **k: answers.pop(0))
    down = subprocess.CompletedProcess([], 1, "", "slurm_load_jobs error: Unable to contact slurm controller")
    answers += [down, subprocess.CompletedProcess([], 0, "RUNNING\n", ""), down, down]
    assert array.running(7)  # unknown: still running, for now
    now[0] += slurm_grade.UNANSWERED_SECONDS + 1
    assert array.running(7)  # it answered: the wait starts again
    assert array.running(7)
    now[0] += slurm_grade.UNANSWERED_SECONDS + 1
    with pytest.raises(SystemExit, match="squeue has failed for .* Unable to contact slurm controller"):
        array.running(7)
    answers.append(subprocess.CompletedProcess([], 1, "", "slurm_load_jobs error: Invalid job id specified"))
    assert not array.running(7)  # Slurm forgot it: it ended

    def too_busy(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"])

    array.unanswered_since = None
    monkeypatch.setattr(slurm_grade.subprocess, "run", too_busy)
    assert array.running(7)  # a controller too busy to answer in time is one more unanswered look
    now[0] += slurm_grade.UNANSWERED_SECONDS + 1
    with pytest.raises(SystemExit, match="squeue has failed for .* did not answer within 30 s"):
        array.running(7)

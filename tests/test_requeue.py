"""Lesson 10 with lesson 16 on the local Slurm cluster (gpucourse.requeue.requeue_after_drain): a training job
whose node is drained and which is requeued starts again on the other node, resumes from its last complete
DCP checkpoint, and ends with the weights of a run that was never interrupted. Skips where no cluster can
start, saying what is missing (GPUCOURSE_REQUIRE_SLURM=1 fails instead). The recording lesson 10 shows
where no cluster runs, and at smoke size, is checked everywhere: a run like that, with those weights."""

from __future__ import annotations

import pytest
from conftest import local_cluster

from gpucourse import requeue as RQ
from gpucourse import local_slurm as LS
from gpucourse import checkpoints as resilience


@pytest.fixture(scope="module")
def slurm():
    with local_cluster() as up:
        if not up:
            pytest.skip("no local Slurm cluster: " + "; ".join(LS.missing()))
        yield LS


@pytest.mark.slow
def test_a_requeued_job_resumes_on_the_other_node_from_its_checkpoint(slurm, tmp_path):
    run = RQ.requeue_after_drain(before=4, steps=6, every=2)
    assert run["state"] == "COMPLETED" and run["exit_code"] == "0:0", run["output"]
    first, second = run["nodes"]
    assert first == run["drained"] and second != first and {first, second} == set(LS.NODES)
    # the first start began from nothing; the second from the checkpoint the first completed (step 2: the
    # loop saves every 2 steps, never at its last step, 4)
    assert run["resumed_from"] == [0, 2]
    assert run["restart_count"] == "1"
    # what the lesson says happens between the two starts: the node drains (its job still on it), and the
    # requeued job waits in the queue until its deferred start (Reason=BeginTime), which the demo brings forward
    assert "DRAIN" in run["drained_node"]["State"] and run["drained_node"]["Reason"].startswith("lesson10:")
    assert (run["requeued"]["state"], run["requeued"]["reason"]) == ("PENDING", "BeginTime"), run["requeued"]
    assert run["requeued"]["eligible_in_s"] > 0 and "(BeginTime)" in run["requeued"]["squeue"]
    assert all(state.rstrip("*~#") in ("idle", "mixed", "allocated", "completing")
               for state in slurm.node_states().values())  # the drained node is back in service
    reports, _ = resilience.run("train", 1, tmp_path / "ckpt", out=tmp_path / "out", steps=6, every=2, width=64, depth=2)
    assert run["weights"] == pytest.approx(reports[0]["weights"], abs=1e-6)  # as if never interrupted


@pytest.mark.slow  # replays the recorded requeue through two launches (about 15 s): `make test`, not `make test-fast`
def test_the_recorded_requeue_is_a_run_that_resumed_and_ends_as_never_interrupted(tmp_path):
    """What lesson 10 shows at smoke size and without a cluster (RQ.recorded_requeue): a real run, labelled with
    its machine and date, whose second start resumed on the other node from the first's checkpoint, and whose
    final weights are those of an uninterrupted run of the same size, computed here."""
    recorded = RQ.recorded_requeue()
    assert recorded["machine"] and recorded["date"]
    run = recorded["run"]
    assert (run["state"], run["exit_code"], run["restart_count"]) == ("COMPLETED", "0:0", "1")
    assert run["nodes"][0] == run["drained"] != run["nodes"][1] and run["resumed_from"] == [0, 2]
    assert (run["requeued"]["state"], run["requeued"]["reason"]) == ("PENDING", "BeginTime")
    assert "DUE TO JOB REQUEUE" in run["output"] and f"trained to step 6 on {run['nodes'][1]}" in run["output"]
    assert run["script"] == RQ.REQUEUE_SCRIPT.format(before=4, steps=6, every=2, width=64)  # the demo's defaults
    reports, _ = resilience.run("train", 1, tmp_path / "ckpt", out=tmp_path / "out", steps=6, every=2, width=64, depth=2)
    assert run["weights"] == pytest.approx(reports[0]["weights"], abs=1e-6)

"""gpucourse.local_slurm (lesson 10's real cluster) and sbatch_for judged by running it (autograders/slurm_jobs.py).

The tests that need the cluster start it (root, Debian's slurm-wlm) and stop it after, unless it was up
before; elsewhere they skip, saying what is missing, and GPUCOURSE_REQUIRE_SLURM=1 (.ci/run, in CI) makes
that a failure. The judge of a job's data and the restatement of Lightning's launch checks are tested
everywhere, without a cluster.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import local_cluster

from gpucourse import beyond_one_machine as C
from gpucourse import local_slurm as LS
from gpucourse.checks.lesson10_beyond_one_machine import judge_sbatch

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "lesson10_beyond_one_machine"
RUN_REQUEST = {"nodes": len(LS.NODES), "gpus": LS.GPUS_PER_NODE, "command": "python train.py --max-epochs 3"}


def _hidden():
    from autograders import engine

    return engine.load_checks("lesson10_beyond_one_machine")


@pytest.fixture(scope="module")
def slurm():
    """The local cluster, up for this module's tests (conftest.local_cluster: started here, and stopped after,
    if it was down; held against lesson 10's notebook run, which uses it too). Skips where it cannot start,
    saying what is missing; GPUCOURSE_REQUIRE_SLURM=1 fails instead."""
    with local_cluster() as up:
        if not up:
            pytest.skip("no local Slurm cluster: " + "; ".join(LS.missing()))
        yield LS


@pytest.fixture
def judged_by_running(monkeypatch):
    """The hidden check runs scripts on the cluster (the suite's default, conftest.py, judges their text)."""
    monkeypatch.setenv("GPUCOURSE_SLURM_JUDGE", "1")


def test_missing_names_root_and_the_packages(monkeypatch):
    monkeypatch.setattr(LS.shutil, "which", lambda name: None)
    monkeypatch.setattr(LS.os, "geteuid", lambda: 1000)
    problems = " | ".join(LS.missing())
    assert "needs root" in problems
    for package in ("munge", "slurmctld", "slurmd", "slurm-client"):
        assert package in problems
    with pytest.raises(RuntimeError, match="cannot start the local Slurm cluster: .*needs root"):
        monkeypatch.setattr(LS, "is_up", lambda: False)
        LS.start()


def test_the_generated_configuration_is_cgroup_free_with_two_nodes_on_their_own_ports(tmp_path):
    conf = dict(line.split("=", 1) for line in LS.slurm_conf(tmp_path).splitlines()
                if "=" in line and not line.startswith(("#", "NodeName", "PartitionName")))
    assert (conf["ProctrackType"], conf["TaskPlugin"]) == ("proctrack/linuxproc", "task/none")
    assert (conf["AccountingStorageType"], conf["JobCompType"]) == ("accounting_storage/none", "jobcomp/filetxt")
    nodes = [line for line in LS.slurm_conf(tmp_path).splitlines() if line.startswith("NodeName=")]
    assert [line.split()[0] for line in nodes] == [f"NodeName={n}" for n in LS.NODES]
    assert len({line.split("Port=")[1].split()[0] for line in nodes}) == len(LS.NODES)
    assert all(f"Gres=gpu:{LS.GPU_TYPE}:{LS.GPUS_PER_NODE}" in line for line in nodes)
    assert LS.gres_conf(tmp_path).count("Name=gpu") == len(LS.NODES)


def _run(result_state="COMPLETED", exit_code="0:0", reports=None, submitted=True, **extra):
    return {"submitted": submitted, "state": result_state, "exit_code": exit_code, "reports": reports or [],
            "output": "", **extra}


def _reports(envs, argv=("--max-epochs", "3")):
    return [{"argv": list(argv), "env": env} for env in envs]


def test_the_run_judge_reads_jobs_as_lightning_would():
    judge = _hidden().judge_run
    lightning = [{**e, "SLURMD_NODENAME": f"node{int(e['SLURM_NODEID']) + 1}"} for e in C.srun_environments(2, 2)]
    torchrun = [{**e, "SLURMD_NODENAME": f"node{int(e['GROUP_RANK']) + 1}"} for e in C.torchrun_environments(2, 2)]
    assert judge(RUN_REQUEST, _run(reports=_reports(lightning))) is None
    assert judge(RUN_REQUEST, _run(reports=_reports(torchrun))) is None
    assert "sbatch refused" in judge(RUN_REQUEST, _run(submitted=False, error="Requested node configuration is not available"))
    assert "ended FAILED (exit code 1:0)" in judge(RUN_REQUEST, _run("FAILED", "1:0", _reports(torchrun)))
    assert "2 process(es)" in judge(RUN_REQUEST, _run(reports=_reports(lightning[:2])))
    assert "not ['--max-epochs', '3']" in judge(RUN_REQUEST, _run(reports=_reports(lightning, argv=["train.py"])))
    no_per_node = [{k: v for k, v in e.items() if k != "SLURM_NTASKS_PER_NODE"} for e in lightning]
    assert "--ntasks=4 without --ntasks-per-node" in judge(RUN_REQUEST, _run(reports=_reports(no_per_node)))
    same_node = [{**e, "GROUP_RANK": "0", "RANK": e["LOCAL_RANK"], "WORLD_SIZE": "2"} for e in torchrun]
    assert "world sizes" in judge(RUN_REQUEST, _run(reports=_reports(same_node)))
    one_host = [{**e, "SLURMD_NODENAME": "node1"} for e in lightning]
    assert "processes per node" in judge(RUN_REQUEST, _run(reports=_reports(one_host)))


def test_no_warning_signal_a_script_may_ask_for_arrives_while_the_grader_waits():
    """Slurm sends ``--signal=SIG@N`` N s (up to 60 s more) before the job's limit, N up to 65535 (sbatch(1));
    the grader's limit overrides the script's, so it must leave every N beyond the grader's own wait. At 2 min,
    lesson 10's own ``--signal=SIGUSR1@90`` killed an honest job 30 s in (CI, exit code 138 = 128 + SIGUSR1)."""
    import inspect

    from autograders.slurm_jobs import TIME_LIMIT_MIN, run_script

    waited = inspect.signature(run_script).parameters["timeout"].default
    assert TIME_LIMIT_MIN * 60 - 65535 - 60 > waited


def test_waiting_outlasts_a_controller_too_busy_to_answer(monkeypatch):
    """A loaded machine's controller may not answer one squeue in time (CI saw one take over 10 s): waiting asks
    again instead of failing, reads a job Slurm already forgot as ended, and still gives up at its deadline."""
    asked = []

    def answers(replies):
        def fake(args, timeout=20, check=False, environment=None):
            asked.append(args[0])
            if args[0] == "scontrol":
                return subprocess.CompletedProcess(args, 0, "JobId=7 JobState=COMPLETED ExitCode=0:0\n", "")
            reply = replies.pop(0) if replies else ("", "", 0)
            if reply == "busy":
                raise subprocess.TimeoutExpired(args, timeout)
            return subprocess.CompletedProcess(args, reply[2], reply[0], reply[1])
        return fake

    monkeypatch.setattr(LS.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(LS, "_run", answers(["busy", ("RUNNING\n", "", 0), "busy", ("", "", 0)]))
    assert LS.wait(7, timeout=60)["JobState"] == "COMPLETED"
    assert asked.count("squeue") == 4

    asked.clear()
    monkeypatch.setattr(LS, "_run", answers([("", "slurm_load_jobs error: Invalid job id specified", 1)]))
    assert LS.wait(7, timeout=60)["JobState"] == "COMPLETED" and asked == ["squeue", "scontrol"]

    clock = iter(range(0, 10_000, 50))
    monkeypatch.setattr(LS.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(LS, "_run", answers(["busy"] * 1000))
    asked.clear()
    assert LS.wait(7, timeout=120)["JobState"] == "TIMEOUT" and "scancel" in asked


def test_slurms_own_failure_is_tried_again_and_then_not_judged_never_blamed_on_the_script(monkeypatch, tmp_path):
    """Seen in CI under load: srun could not confirm a job the controller still listed as pending, waited, and
    the job was cancelled at the grader's timeout; the judge read that as the script's failure. Now run_script
    submits such a job again (up to TRIES), and when every try failed so, the judge raises NotJudged (the
    grader flags it for a person) instead of failing the script. A job that ended well is never tried again,
    whatever it printed, and a script's own srun errors are its own."""
    from autograders import slurm_jobs
    from gpucourse.checks import NotJudged

    stuck = "srun: error: Unable to confirm allocation for job 767: Job is pending execution"
    assert slurm_jobs.trouble_in(f"starting\n{stuck}\nsrun: Check SLURM_JOB_ID environment variable") == stuck
    assert slurm_jobs.trouble_in("sbatch: error: Batch job submission failed: Unable to contact slurm controller "
                                 "(connect failure)").startswith("sbatch: error:")
    for own in ("srun: error: Unable to create step for job 5: More processors requested than permitted",
                "sbatch: error: Batch job submission failed: Requested node configuration is not available",
                "Unable to confirm allocation", ""):
        assert slurm_jobs.trouble_in(own) is None, own

    monkeypatch.setattr(slurm_jobs, "_lock_path", lambda: tmp_path / "lock")
    monkeypatch.setattr(slurm_jobs, "_runs_dir", lambda: tmp_path)
    tried = []

    def runs(results):
        def fake(folder, text, probe_name, timeout):
            tried.append(folder)
            return dict(results.pop(0))
        return fake

    troubled = _run("TIMEOUT", "0:0", trouble=stuck, output=stuck)
    monkeypatch.setattr(slurm_jobs, "_run_in", runs([troubled, _run("FAILED", "1:0", trouble=None)]))
    result = slurm_jobs.run_script("#!/bin/bash\n")
    assert result["tries"] == 2 and result["state"] == "FAILED" and "infrastructure" not in result
    assert "ended FAILED" in _hidden().judge_run(RUN_REQUEST, result)

    tried.clear()
    monkeypatch.setattr(slurm_jobs, "_run_in", runs([troubled] * slurm_jobs.TRIES))
    result = slurm_jobs.run_script("#!/bin/bash\n")
    assert len(tried) == slurm_jobs.TRIES == result["tries"] and stuck in result["infrastructure"]
    with pytest.raises(NotJudged, match="the local Slurm cluster failed, not the script"):
        _hidden().judge_run(RUN_REQUEST, result)
    assert not list(tmp_path.glob("job-*")), "every try's folder is removed"


def test_the_restated_launch_checks_equal_lightnings_own():
    """lightning_launch_view (the grader's) against Lightning's real environments, on every kind of task."""
    from lightning_fabric.plugins.environments import SLURMEnvironment

    view = _hidden().lightning_launch_view
    envs = C.srun_environments(2, 2) + C.srun_environments(2, 4) + C.torchrun_environments(2, 2)
    envs.append({k: v for k, v in C.srun_environments(2, 2)[1].items() if k != "SLURM_NTASKS_PER_NODE"})
    envs.append(C.interactive_environment("bash"))
    for env in envs:
        mine = view(env, devices=2, num_nodes=2)
        real = C.lightning_view(env)
        if "error" in real:
            assert "error" in mine, env
            continue
        if real["environment"] == "SLURMEnvironment":
            with C.patched_environ(env):
                try:
                    SLURMEnvironment().validate_settings(num_devices=2, num_nodes=2)
                except ValueError:
                    assert "error" in mine, env
                    continue
        assert {k: mine[k] for k in ("global_rank", "local_rank", "node_rank", "world_size")} == {
            k: real[k] for k in ("global_rank", "local_rank", "node_rank", "world_size")}, env


@pytest.mark.slow  # needs the local Slurm cluster up (starting it takes about 20 s): `make test`, not `make test-fast`
def test_the_cluster_runs_srun_across_both_nodes(slurm):
    assert set(slurm.node_states()) == set(LS.NODES)
    done = subprocess.run(["srun", "-N2", "-n2", "bash", "-c", 'echo "$SLURMD_NODENAME $SLURM_NODEID $SLURM_PROCID"'],
                          capture_output=True, text=True, timeout=60, env=slurm.env())
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["node1 0 0", "node2 1 1"]
    hosts = subprocess.run(["scontrol", "show", "hostnames", "node[1-2]"], capture_output=True, text=True,
                           env=slurm.env()).stdout.split()
    assert hosts == C.hostnames("node[1-2]") == list(LS.NODES)


@pytest.mark.slow  # needs the local Slurm cluster up (starting it takes about 20 s): `make test`, not `make test-fast`
def test_a_job_array_runs_every_task_and_sacct_lists_them(slurm):
    job = C.submit_and_watch(C.ARRAY_SCRIPT, timeout=120)
    assert job["state"] == "COMPLETED" and job["exit_code"] == "0:0"
    lines = sorted(text.strip() for text in job["outputs"].values())
    assert len(lines) == 4
    for k, line in enumerate(lines):
        host = line.split(" on ")[1].split(":")[0]
        assert line == f"array task {k} of job {job['job_id']} on {host}: seed {1000 + k}" and host in LS.NODES
    assert job["sacct"].count("COMPLETED") == 4


# Wrong fixtures whose fault this cluster cannot show by running them: both of its nodes are this one machine,
# so a rendezvous on a loopback address, or on each node's own host name, still meets. Reading flags them
# (tests/test_checks.py); on a cluster of several machines their torchruns never meet.
ONE_HOST_CANNOT_SHOW = {"sbatch_for__rdzv_localhost", "sbatch_for__static_master_addr_localhost",
                        "sbatch_for__rdzv_hostname_per_task"}


def _sbatch_fixtures():
    return [pytest.param(path, id=f"{path.parent.name}/{path.stem}")
            for kind in ("right", "wrong") for path in sorted((FIXTURES / kind).glob("sbatch_for__*.py"))
            if path.stem not in ONE_HOST_CANNOT_SHOW]


def test_the_fixtures_one_host_cannot_show_are_wrong_ones_that_reading_flags():
    for stem in sorted(ONE_HOST_CANNOT_SHOW):
        path = FIXTURES / "wrong" / f"{stem}.py"
        namespace = {}
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        read = judge_sbatch(RUN_REQUEST, namespace["sbatch_for"](RUN_REQUEST["nodes"], RUN_REQUEST["gpus"], RUN_REQUEST["command"]))
        assert read is not None and "host" in read, (stem, read)  # the rendezvous host the nodes share


@pytest.mark.slow
@pytest.mark.parametrize("path", _sbatch_fixtures())
def test_running_and_reading_agree_on_every_fixture(slurm, path):
    """Each sbatch_for fixture's script for the cluster's shape, judged by running it and by reading it:
    both pass a right fixture and both fail a wrong one."""
    from autograders.slurm_jobs import run_script

    namespace = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    text = namespace["sbatch_for"](RUN_REQUEST["nodes"], RUN_REQUEST["gpus"], RUN_REQUEST["command"])
    read = judge_sbatch(RUN_REQUEST, text)
    result = run_script(text)
    ran = _hidden().judge_run(RUN_REQUEST, result)
    right = path.parent.name == "right"
    assert (read is None) == right, read
    assert (ran is None) == right, (ran, result.get("output"))


@pytest.mark.slow  # needs the local Slurm cluster up (starting it takes about 20 s): `make test`, not `make test-fast`
def test_the_hidden_case_runs_the_script_when_the_cluster_is_up(slurm, judged_by_running):
    hidden = _hidden()
    assert hidden.slurm_judging()
    reference = {"nodes": 2, "gpus": 2, "command": "python train.py"}
    script = C.render_sbatch(2, 2, "train.py", launcher="torchrun")  # the section-5 template runs as it reads
    assert hidden.judge_by_running([script], [reference]) is None
    once = C.STATIC_NODE_RANK_ONCE
    assert "ended FAILED" in hidden.judge_by_running([once], [reference])


@pytest.mark.slow  # needs the local Slurm cluster up (starting it takes about 20 s): `make test`, not `make test-fast`
def test_stop_ends_the_daemons_it_started_and_start_brings_them_back(slurm):
    pids = [LS._pid(path) for path in LS._pid_files(LS.state_dir())]
    assert all(pids), pids
    ended = LS.stop(quiet=True)
    assert len(ended) == len(pids) and not LS.is_up()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "gpucourse local Slurm" not in Path("/etc/hosts").read_text()
    LS.start()
    assert LS.is_up()

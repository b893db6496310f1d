"""Lesson 10 with lesson 16, on the local Slurm cluster: a ``--requeue`` job whose node is drained under it
starts again on the other node and resumes from its last complete checkpoint (``requeue_after_drain``), and
the recording the lesson shows where Slurm cannot run or at smoke size (``recorded_requeue``).

    python -m gpucourse.requeue record   (with the local cluster up: make cluster)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from gpucourse.beyond_one_machine import RECORDING, _recorded_where, _since


# A training job that survives losing its node: lesson 16's resumable loop (gpucourse.checkpoints train: DCP
# checkpoints, a LATEST pointer written once a checkpoint is complete) as a requeueable batch job. Its first
# start trains BEFORE steps and then waits, standing for the rest of a long run; a start after a requeue
# (SLURM_RESTART_COUNT >= 1) trains to STEPS, resuming from the last complete checkpoint.
REQUEUE_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=resume
#SBATCH --nodes=1
#SBATCH --ntasks=1
# requeue instead of ending when the node is lost or an administrator requeues it
#SBATCH --requeue
# every start appends to the same output file
#SBATCH --open-mode=append
#SBATCH --output=resume.out

start=${{SLURM_RESTART_COUNT:-0}}
echo "start $start on $SLURMD_NODENAME"
if [ "$start" = 0 ]; then steps={before}; else steps={steps}; fi
python -m torch.distributed.run --standalone --nproc-per-node=1 -m gpucourse.checkpoints train \\
    --ckpt ckpt --out "out-$start" --width {width} --depth 2 --steps "$steps" --every {every}
echo "trained to step $steps on $SLURMD_NODENAME"
if [ "$start" = 0 ]; then sleep 600; fi  # the rest of a long run: its node is drained while it is here
"""


def requeue_after_drain(before: int = 4, steps: int = 6, every: int = 2, width: int = 64,
                        timeout: float = 300) -> dict:
    """Lesson 10 with lesson 16, on the local cluster: submit :data:`REQUEUE_SCRIPT`; once its first start has
    trained ``before`` steps (checkpointing every ``every``), drain its node and requeue the job, as an
    administrator taking a node out of service does (``scontrol update State=DRAIN``, ``scontrol requeue``);
    Slurm starts it again on the other node, where it resumes from its last complete checkpoint and trains to
    ``steps``. The drained node is put back in service (``State=RESUME``) afterwards, whatever happened.

    Returns plain data: the job id, the nodes of each start, the step each start resumed from (from the
    loop's own events), its final state and exit code as Slurm reports them, the job's output, ``sacct``'s
    lines for it, and the final weights (``rank0.json`` of the last start), which equal an uninterrupted
    run's of ``steps`` steps."""
    import tempfile

    from gpucourse import local_slurm

    runs = local_slurm.state_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="lesson10-requeue-", dir=runs))
    script = REQUEUE_SCRIPT.format(before=before, steps=steps, every=every, width=width)
    (folder / "job.sbatch").write_text(script)
    environ = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    job = local_slurm.sbatch(folder / "job.sbatch", f"--chdir={folder}", workdir=folder, environ=environ)
    deadline = time.monotonic() + timeout
    while "trained to step" not in _read(folder / "resume.out"):  # its first leg ended, it waits for the rest
        if time.monotonic() > deadline or local_slurm.job_info(job).get("JobState") in local_slurm.FINAL_STATES:
            subprocess.run(["scancel", str(job)], env=local_slurm.env(), capture_output=True, timeout=30)
            raise RuntimeError(f"the job's first start never finished its first leg:\n{_read(folder / 'resume.out')}")
        time.sleep(0.5)
    drained = local_slurm.job_info(job).get("NodeList", "")

    def scontrol(*args: str) -> str:
        done = subprocess.run(["scontrol", *args], env=local_slurm.env(), capture_output=True, text=True, timeout=30)
        if done.returncode:
            raise RuntimeError(f"scontrol {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    try:
        scontrol("update", f"NodeName={drained}", "State=DRAIN", "Reason=lesson10: taken out of service")
        node = _fields(scontrol("show", "node", "-o", drained))  # DRAINING while the job still runs there
        scontrol("requeue", str(job))
        held = _pending(job, deadline)
        # Slurm defers a requeued job's start (its EligibleTime, Reason=BeginTime); an administrator may start it now
        scontrol("update", f"JobId={job}", "StartTime=now")
        info = local_slurm.wait(job, timeout=max(30.0, deadline - time.monotonic()))
    finally:
        scontrol("update", f"NodeName={drained}", "State=RESUME")
    output = _read(folder / "resume.out")
    starts = [line.split()[1::2] for line in output.splitlines() if line.startswith("start ")]  # start N on NODE
    resumed = []
    for start, _ in starts:
        events = folder / f"out-{start}" / "events_rank0_attempt0.json"
        found = [e for e in json.loads(events.read_text()) if e["event"] == "resumed"] if events.exists() else []
        resumed.append(found[0]["step"] if found else None)
    last = folder / f"out-{starts[-1][0]}" / "rank0.json" if starts else None
    return {"job_id": job, "script": script, "drained": drained, "nodes": [node for _, node in starts],
            "drained_node": {key: node.get(key, "") for key in ("State", "Reason")}, "requeued": held,
            "resumed_from": resumed, "restart_count": info.get("Restarts"), "state": info.get("JobState"),
            "exit_code": info.get("ExitCode"), "output": output, "sacct": _since(local_slurm.sacct(), job),
            "weights": json.loads(last.read_text())["weights"] if last and last.exists() else None}


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _fields(line: str) -> dict:
    """``scontrol show ... -o``'s one line as ``{field: value}`` (a value may hold spaces: ``Reason=...``)."""

    return {key: value.strip() for key, value in re.findall(r"(\w[\w:/]*)=(.*?)(?=\s+\w[\w:/]*=|$)", line.strip())}


def _pending(job: int, deadline: float) -> dict:
    """Job ``job`` once Slurm has put it back in the queue after ``scontrol requeue`` (the old start's processes
    end first): its state and reason, ``squeue``'s line, and how many seconds ahead its EligibleTime was set."""
    import datetime

    from gpucourse import local_slurm

    while True:
        info = local_slurm.job_info(job)
        if info.get("JobState") == "PENDING" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    eligible = info.get("EligibleTime", "")
    try:
        ahead = round((datetime.datetime.fromisoformat(eligible) - datetime.datetime.now()).total_seconds())
    except ValueError:  # "Unknown": no deferred start
        ahead = None
    return {"state": info.get("JobState"), "reason": info.get("Reason"), "eligible_in_s": ahead,
            "squeue": local_slurm.squeue()}


REQUEUE_RECORDING = RECORDING.with_name("lesson10_requeue.json")


def recorded_requeue() -> dict:
    """Lesson 10's requeue demo as shipped with the course (:func:`record_requeue` wrote it, on a machine with the
    local cluster up): shown where Slurm cannot run and at smoke size, labelled with its machine and date."""
    return json.loads(REQUEUE_RECORDING.read_text())


def record_requeue(path: Path = REQUEUE_RECORDING, **sizes) -> dict:
    """Run :func:`requeue_after_drain` (``sizes``: its keyword arguments) on the local cluster, which must be up,
    and write the recording that :func:`recorded_requeue` reads."""
    data = {**_recorded_where(), "run": requeue_after_drain(**sizes)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def main(argv: list[str] | None = None) -> int:
    """``python -m gpucourse.requeue record``: record lesson 10's requeue demo (the local cluster up)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["record"]:
        print("usage: python -m gpucourse.requeue record   (with the local cluster up: make cluster)",
              file=sys.stderr)
        return 2
    run = record_requeue()["run"]
    print(f"job {run['job_id']}: {run['state']} on {' then '.join(run['nodes'])}, resumed from steps "
          f"{run['resumed_from']}; written to {REQUEUE_RECORDING}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

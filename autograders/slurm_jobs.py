"""Running an untrusted sbatch script on the local Slurm cluster (gpucourse.local_slurm) and reading
what happened, from outside: the job's final state and exit code as Slurm reports them, and one report
per process that ran the command the grader gave (a small probe that writes its environment).

The script is a student's answer: it runs as an ordinary account (``nobody`` when the grader is root and
``nobody`` can reach this Python; a Python under /root, as in a root container, cannot be: the job then
runs as the grader's own user, and :func:`account` says so), in a folder of its own, with a minimal
environment (PATH to this Python, SLURM_CONF), under a time limit given on sbatch's command line (it
overrides the script's own ``--time``), and is cancelled when it outlives the grader's timeout. One job
at a time (a lock file): every job of the one host would otherwise compete for the same rendezvous port.
A script can write reports itself (it runs as the probe's account): the run case adds the facts Slurm
reports (sbatch's refusal, the final state and exit code); the text cases still read every script.
Lesson 10's hidden checks interpret the reports.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpucourse import local_slurm

# The command's program: it records what each process was started with and exits. Plain Python, so a
# process starts in milliseconds (torchrun itself imports torch; the workers it starts do not need to).
PROBE = '''\
import json, os, sys, uuid
KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RUN_ID")
env = {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SLURMD_")) or k in KEYS}
os.makedirs("reports", exist_ok=True)
with open(os.path.join("reports", uuid.uuid4().hex + ".json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "env": env, "pid": os.getpid()}, f)
'''

# Slurm's own limit on the job, only a backstop: run_script's timeout (150 s) cancels a job long before it. It
# must stay above any warning a script may ask for: lesson 10 teaches `--signal=SIGUSR1@90`, which Slurm sends
# 90 s (up to 60 s earlier still) before the limit, so a 2-minute limit signalled an honest job 30 s in and
# killed it. sbatch(1): "sig_time must have an integer value between 0 and 65535" s, so 1100 min clears them all.
TIME_LIMIT_MIN = 1100
NOBODY = 65534
# Slurm's own failures, not the script's: its controller not answering, or a step that cannot confirm a job
# the controller still lists as pending. Seen on a loaded machine: "srun: error: Unable to confirm
# allocation for job 767: Job is pending execution", then srun waited until the job was cancelled. A job
# that met one is submitted again, up to TRIES times in all; after that the case is not judged (the grader
# tells a person), so that a right script never loses its point to the machine. Printing such a line
# from a script gains nothing: the case then scores 0 and is flagged.
TROUBLE = re.compile(r"(?:srun|sbatch|salloc): error: .*(?:Unable to confirm allocation|Job is pending execution|"
                     r"Unable to contact slurm controller|Socket timed out on send/recv|"
                     r"Zero Bytes were transmitted or received|Communication connection failure)", re.I)
TRIES = 3


def _reachable_by_others(path: Path) -> bool:
    """Whether an account with no rights of its own can run ``path`` (every folder above it enterable)."""
    real = path.resolve()
    folders = [p for p in real.parents if p != Path("/")]
    return all(p.stat().st_mode & 0o001 for p in folders) and bool(real.stat().st_mode & 0o005 == 0o005)


def account() -> tuple[int | None, str]:
    """(uid to submit as or None for the grader's own, why): ``nobody`` wherever it can run this Python."""
    if os.geteuid() != 0:
        return None, f"the grader's own account (uid {os.geteuid()})"
    if _reachable_by_others(Path(sys.executable)):
        return NOBODY, "nobody"
    return None, f"root: nobody cannot reach {Path(sys.executable).resolve()}"


def _lock_path() -> Path:
    return Path(tempfile.gettempdir()) / "gpucourse-slurm-judge.lock"


def run_script(text: str, probe_name: str = "train.py", timeout: float = 150) -> dict:
    """Submit ``text`` as an sbatch script (the probe saved as ``probe_name`` in its folder) and wait.

    Returns plain data: ``submitted`` (False with ``error``, sbatch's message, when it refused the script),
    ``state`` and ``exit_code`` (from Slurm), ``reports`` (one dict per process that ran the probe: its
    arguments and SLURM_*/torchrun variables), ``output`` (the job's last lines), ``seconds`` and ``tries``.
    A job that did not end well and met Slurm's own failure (``TROUBLE``) is submitted again, up to ``TRIES``
    times; if every try met one, ``infrastructure`` says which (the last try's line): then nothing in it
    judges the script.
    """
    started = time.monotonic()
    with open(_lock_path(), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for tries in range(1, TRIES + 1):
            folder = Path(tempfile.mkdtemp(prefix="job-", dir=_runs_dir()))
            try:
                result = _run_in(folder, text, probe_name, timeout)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            trouble = result.pop("trouble", None)
            if trouble is None:
                break
        result.update(seconds=round(time.monotonic() - started, 1), tries=tries)
        if trouble is not None:
            result["infrastructure"] = f"{trouble} (each of {tries} tries)"
        return result


def trouble_in(output: str) -> str | None:
    """The first line of ``output`` (a job's, or sbatch's) that is Slurm's own failure (``TROUBLE``), or None."""
    return next((line.strip()[:300] for line in output.splitlines() if TROUBLE.search(line)), None)


def _runs_dir() -> Path:
    runs = local_slurm.state_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    return runs


def _run_in(folder: Path, text: str, probe_name: str, timeout: float) -> dict:
    (folder / "job.sbatch").write_text(text)
    (folder / probe_name).write_text(PROBE)
    # the job's home: a login shell (#!/bin/bash -l) resets PATH from /etc/profile, then reads this, as a
    # cluster user's profile puts their Python environment first
    (folder / ".bash_profile").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')
    user, who = account()
    if user is not None:
        for path in [folder, *folder.iterdir()]:
            os.chown(path, user, user)
    environ = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(folder),
               "LANG": "C.UTF-8"}
    try:
        job = local_slurm.sbatch(folder / "job.sbatch", f"--time={TIME_LIMIT_MIN}", f"--chdir={folder}",
                                 f"--output={folder}/job.out", f"--error={folder}/job.out",
                                 workdir=folder, environ=environ, user=user)
    except RuntimeError as error:
        return {"submitted": False, "error": str(error), "reports": [], "account": who, "trouble": trouble_in(str(error))}
    except subprocess.TimeoutExpired as error:  # the controller did not answer sbatch: not the script's doing
        return {"submitted": False, "error": f"sbatch did not answer within {error.timeout:.0f} s", "reports": [],
                "account": who, "trouble": f"sbatch: error: no answer within {error.timeout:.0f} s"}
    info = local_slurm.wait(job, timeout=timeout)
    reports = []
    for path in sorted((folder / "reports").glob("*.json")) if (folder / "reports").is_dir() else []:
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            reports.append({"unreadable": path.name})
    output = (folder / "job.out").read_text(errors="replace") if (folder / "job.out").exists() else ""
    state, exit_code = info.get("JobState", "unknown"), info.get("ExitCode", "?")
    ended_well = state == "COMPLETED" and exit_code == "0:0"  # a job that ended well met no trouble that mattered
    return {"submitted": True, "job_id": job, "account": who, "state": state, "exit_code": exit_code,
            "nodes": info.get("NodeList", ""), "reports": reports, "output": "\n".join(output.splitlines()[-12:]),
            "trouble": None if ended_well else trouble_in(output)}

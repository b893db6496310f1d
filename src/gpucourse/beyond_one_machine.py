"""Lesson 10 (beyond one machine): SLURM batch scripts, and the ranks Lightning derives from them.

On a SLURM cluster nobody types ``python train.py`` on each node: ``sbatch`` queues a script, and
``srun`` inside it starts the tasks on the allocated nodes, telling each task who it is through
environment variables (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_NTASKS``...).
Lightning's ``SLURMEnvironment`` reads them; ``torchrun`` sets its own (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``GROUP_RANK``), read by ``TorchElasticEnvironment``.

This module renders both kinds of batch script, simulates the environment ``srun``/``torchrun`` give
each task (no cluster needed), and asks Lightning's real cluster environments what they derive from
it. Lightning is imported inside the functions that need it: importing it takes seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# One task per GPU: srun starts nodes * gpus_per_node copies of the script and Lightning does not
# spawn any more (SLURMEnvironment.creates_processes_externally is True). The numbers must match
# Trainer(num_nodes=..., devices=...): Lightning checks SLURM_NNODES and SLURM_NTASKS_PER_NODE.
SBATCH_LIGHTNING = """\
#!/bin/bash
# Lightning on SLURM: srun starts one task per GPU, Lightning reads SLURM_* to know its rank.
#SBATCH --job-name={job_name}
# --nodes must equal Trainer(num_nodes={nodes})
#SBATCH --nodes={nodes}
# one task per GPU: --ntasks-per-node must equal Trainer(devices={gpus_per_node})
#SBATCH --ntasks-per-node={gpus_per_node}
# GPUs per node (not in total)
#SBATCH --gres=gpu:{gpus_per_node}
#SBATCH --cpus-per-task={cpus_per_task}
#SBATCH --time={time}
# SIGUSR1 90 s before the time limit: Lightning saves a checkpoint and requeues the job
#SBATCH --signal=SIGUSR1@90
#SBATCH --output=%x-%j.out

# while debugging communication problems only (NCCL prints its setup, rings and transports):
# export NCCL_DEBUG=INFO
export PYTHONFAULTHANDLER=1

srun {command}
"""

# One task per node: srun starts one torchrun per node, and each torchrun starts gpus_per_node
# workers itself; they meet at the rendezvous endpoint on the first node of the allocation.
SBATCH_TORCHRUN = """\
#!/bin/bash
# torchrun on SLURM: srun starts one torchrun per node, torchrun starts one worker per GPU.
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
# one task per node: torchrun is the task, its workers are not SLURM tasks
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:{gpus_per_node}
# the single task holds the CPUs of all its workers
#SBATCH --cpus-per-task={cpus_all_workers}
#SBATCH --time={time}
#SBATCH --output=%x-%j.out

# the rendezvous runs on the first node of the allocation
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# export NCCL_DEBUG=INFO

srun torchrun \\
    --nnodes={nodes} \\
    --nproc-per-node={gpus_per_node} \\
    --rdzv-id="$SLURM_JOB_ID" \\
    --rdzv-backend=c10d \\
    --rdzv-endpoint="$head:29500" \\
    {command}
"""


def render_sbatch(nodes: int, gpus_per_node: int, command: str = "train.py", *, cpus_per_task: int = 8,
                  time: str = "02:00:00", job_name: str = "train", launcher: str = "lightning") -> str:
    """The text of an sbatch script for ``nodes`` × ``gpus_per_node`` GPUs.

    ``launcher="lightning"``: one task per GPU, ``srun python <command>``; Lightning's SLURM detection
    does the rest (match it with ``Trainer(num_nodes=nodes, devices=gpus_per_node)``).
    ``launcher="torchrun"``: one task per node, ``srun torchrun ... <command>``. ``cpus_per_task`` is
    the CPU cores of one training process (one GPU) in both cases.
    """
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("nodes and gpus_per_node must be at least 1")
    fields = dict(nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_task, time=time, job_name=job_name)
    if launcher == "lightning":
        return SBATCH_LIGHTNING.format(command=f"python {command}", **fields)
    if launcher == "torchrun":
        return SBATCH_TORCHRUN.format(command=command, cpus_all_workers=cpus_per_task * gpus_per_node, **fields)
    raise ValueError(f"launcher must be 'lightning' or 'torchrun', not {launcher!r}")


def hostlist(prefix: str, numbers: list[int], width: int = 3) -> str:
    """SLURM's compressed host list: ``hostlist("gpu", [17, 18])`` -> ``"gpu[017-018]"``."""
    if len(numbers) == 1:
        return f"{prefix}{numbers[0]:0{width}d}"
    runs = [[numbers[0], numbers[0]]]  # consecutive numbers become one "first-last" range
    for number in numbers[1:]:
        if number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    parts = [f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in runs]
    return f"{prefix}[{','.join(parts)}]"


def hostnames(nodelist: str) -> list[str]:
    """Expand a SLURM host list, as ``scontrol show hostnames "$SLURM_JOB_NODELIST"`` prints it.

    ``hostnames("gpu[017-018],login-2")`` -> ``["gpu017", "gpu018", "login-2"]``; ranges keep their
    zero padding (``node[003,007-009]``), and ``gpu[8-10]`` gives ``gpu8``, ``gpu9``, ``gpu10``.
    """
    hosts, part, depth = [], "", 0
    for char in nodelist.strip() + ",":
        if char == "," and depth == 0:
            if part:
                hosts += _expand_one(part)
            part = ""
            continue
        depth += (char == "[") - (char == "]")
        part += char
    return hosts


def _expand_one(pattern: str) -> list[str]:
    """``"gpu[017-018]x"`` -> ``["gpu017x", "gpu018x"]`` (the first bracket; later ones recursively)."""
    if "[" not in pattern:
        return [pattern]
    prefix, rest = pattern.split("[", 1)
    inside, suffix = rest.split("]", 1)
    names = []
    for item in inside.split(","):
        first, _, last = item.partition("-")
        numbers = range(int(first), int(last or first) + 1)
        names += [f"{prefix}{n:0{len(first)}d}" for n in numbers]
    return [name + tail for name in names for tail in _expand_one(suffix)]


def rank_table(nodes: int, tasks_per_node: int, distribution: str = "block") -> list[dict]:
    """Where each task of a ``nodes`` × ``tasks_per_node`` job runs, and its ranks, as ints.

    One dict per task (``rank`` = SLURM_PROCID = RANK, ``local_rank`` = SLURM_LOCALID = LOCAL_RANK,
    ``node_rank`` = SLURM_NODEID = NODE_RANK, ``host``), read from :func:`srun_environments`: the
    figure of :func:`draw_rank_grid` and the lesson's tables come from the same function.
    """
    return [{"rank": int(e["SLURM_PROCID"]), "local_rank": int(e["SLURM_LOCALID"]),
             "node_rank": int(e["SLURM_NODEID"]), "host": e["SLURMD_NODENAME"]}
            for e in srun_environments(nodes, tasks_per_node, distribution=distribution)]


def draw_rank_grid(nodes: int = 2, tasks_per_node: int = 4, distribution: str = "block") -> Any:
    """Draw the nodes of a job as rows and their GPUs as boxes, each labelled with its task's ranks.

    One task per GPU (Lightning under srun): the task with local rank *k* drives ``cuda:k`` of its
    node. The labels come from :func:`rank_table`, i.e. from the variables :func:`srun_environments`
    gives each task. Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    table = rank_table(nodes, tasks_per_node, distribution)
    fig, ax = plt.subplots(figsize=(1.9 * tasks_per_node + 1.6, 1.5 * nodes + 0.9))
    for task in table:
        x, y = task["local_rank"], nodes - 1 - task["node_rank"]
        ax.add_patch(Rectangle((x + 0.06, y + 0.1), 0.88, 0.8, fc=plt.cm.tab10(task["node_rank"] % 10), alpha=0.35,
                               ec="black"))
        ax.text(x + 0.5, y + 0.5, f"cuda:{task['local_rank']}\nRANK {task['rank']}\nLOCAL_RANK {task['local_rank']}\n"
                f"NODE_RANK {task['node_rank']}", ha="center", va="center", fontsize=8)
    hosts = {t["node_rank"]: t["host"] for t in table}
    ax.set_yticks([nodes - 1 - n + 0.5 for n in range(nodes)], [f"node {n}\n{hosts[n]}" for n in range(nodes)])
    ax.set_xticks([k + 0.5 for k in range(tasks_per_node)], [f"GPU {k}" for k in range(tasks_per_node)])
    ax.set_xlim(0, tasks_per_node); ax.set_ylim(0, nodes)
    ax.set_xlabel("GPU of the node (= LOCAL_RANK, one task per GPU)")
    ax.set_ylabel("node (= NODE_RANK)")
    ax.tick_params(length=0)
    ax.set_title(f"{nodes} nodes × {tasks_per_node} GPUs, srun --distribution={distribution}: "
                 f"WORLD_SIZE {nodes * tasks_per_node}\n(simulated: the variables srun would set; no cluster, "
                 "nothing measured)", fontsize=10)
    fig.tight_layout()
    return fig


def srun_environments(nodes: int, tasks_per_node: int, *, prefix: str = "gpu", numbers: list[int] | None = None,
                      job_id: int = 4242017, job_name: str = "train", distribution: str = "block") -> list[dict]:
    """The SLURM variables ``srun`` gives each task of a job, one dict per task, in SLURM_PROCID order.

    ``distribution`` is srun's ``--distribution``: ``"block"`` (the default: tasks 0..n-1 on the
    first node) or ``"cyclic"`` (round-robin over the nodes), which is why ranks are read, not computed.
    """
    numbers = numbers or list(range(17, 17 + nodes))
    hosts = [f"{prefix}{n:03d}" for n in numbers]
    nodelist = hostlist(prefix, numbers)
    ntasks = nodes * tasks_per_node
    job = {"SLURM_JOB_ID": str(job_id), "SLURM_JOBID": str(job_id), "SLURM_JOB_NAME": job_name,
           "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist, "SLURM_NNODES": str(nodes),
           "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks),
           "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
           "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})" if nodes > 1 else str(tasks_per_node),
           "SLURM_GPUS_ON_NODE": str(tasks_per_node), "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(tasks_per_node))),
           "SLURM_STEP_ID": "0", "SLURM_DISTRIBUTION": distribution}
    envs = []
    for procid in range(ntasks):
        if distribution == "block":
            node, local = divmod(procid, tasks_per_node)
        elif distribution == "cyclic":
            local, node = divmod(procid, nodes)
        else:
            raise ValueError("distribution must be 'block' or 'cyclic'")
        envs.append({**job, "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
                     "SLURMD_NODENAME": hosts[node]})
    return envs


def interactive_environment(job_name: str = "interactive") -> dict:
    """The variables of ``srun --pty --job-name interactive bash`` (one task, a shell on a GPU node)."""
    env = srun_environments(1, 1, job_name=job_name)[0]
    return env


def torchrun_environments(nodes: int, nproc_per_node: int, *, job_id: int = 4242017, head: str = "gpu017",
                          master_port: int = 29500) -> list[dict]:
    """The variables each torchrun worker sees in the torchrun template above (one dict per worker).

    The SLURM part is the one-task-per-node step; torchrun adds RANK, LOCAL_RANK, WORLD_SIZE,
    GROUP_RANK (node rank, assigned by the rendezvous) and MASTER_ADDR/MASTER_PORT (chosen by torchrun:
    the port is not necessarily the rendezvous port).
    """
    step = srun_environments(nodes, 1, job_id=job_id)
    envs = []
    for group_rank, node_env in enumerate(step):
        for local in range(nproc_per_node):
            envs.append({**node_env, "RANK": str(group_rank * nproc_per_node + local), "LOCAL_RANK": str(local),
                         "WORLD_SIZE": str(nodes * nproc_per_node), "LOCAL_WORLD_SIZE": str(nproc_per_node),
                         "GROUP_RANK": str(group_rank), "ROLE_RANK": str(group_rank * nproc_per_node + local),
                         "MASTER_ADDR": head, "MASTER_PORT": str(master_port), "TORCHELASTIC_RUN_ID": str(job_id)})
    return envs


_LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_RANK",
                       "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@contextlib.contextmanager
def patched_environ(env: dict):
    """Run a block with ``os.environ`` as a task of the simulated job would see it; restore it after.

    Variables of other launchers (SLURM_*, LSB_*, torchrun's) are removed first, so this process's own
    environment cannot leak in; Lightning writes MASTER_ADDR/MASTER_PORT, which the restore undoes.
    """
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith(("SLURM_", "SLURMD_", "LSB_", "JSM_", "OMPI_", "PMI_")) or key in _LAUNCHER_VARIABLES:
            del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def lightning_view(env: dict) -> dict:
    """What Lightning derives in a process started with ``env``: its cluster environment and ranks.

    Uses Lightning's real cluster environments, tried in the order the Trainer tries them
    (``_AcceleratorConnector._choose_and_init_cluster_environment``: TorchElastic, SLURM, LSF, MPI,
    else the plain LightningEnvironment). An environment that refuses the variables is reported as
    ``{"error": ...}`` (for example ``--ntasks`` without ``--ntasks-per-node``).
    """
    from lightning_fabric.plugins.environments import (LightningEnvironment, LSFEnvironment, MPIEnvironment,
                                                       SLURMEnvironment, TorchElasticEnvironment)

    with patched_environ(env):
        slurm_detected = SLURMEnvironment.detect()
        chosen = next((kind for kind in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment)
                       if kind.detect()), LightningEnvironment)
        try:
            cluster = chosen()
        except Exception as error:  # Lightning's own validation, e.g. SLURM's --ntasks check
            return {"environment": chosen.__name__, "slurm_detected": slurm_detected,
                    "error": f"{type(error).__name__}: {error}"}
        return {"environment": chosen.__name__, "slurm_detected": slurm_detected,
                "global_rank": cluster.global_rank(), "local_rank": cluster.local_rank(),
                "node_rank": cluster.node_rank(), "world_size": cluster.world_size(),
                "main_address": cluster.main_address, "main_port": cluster.main_port}


def trainer_view(env: dict, devices: int, num_nodes: int, accelerator: str = "cpu") -> dict:
    """Construct a real ``pytorch_lightning.Trainer`` in ``env`` and report the ranks it derived.

    Nothing is launched: constructing only chooses the cluster environment and strategy. The check a
    launch would make first (``cluster_environment.validate_settings``: devices against
    SLURM_NTASKS_PER_NODE, num_nodes against SLURM_NNODES) is run too, and reported as ``"mismatch"``.
    In a notebook the Trainer refuses ``strategy="ddp"`` (it is for scripts): use
    :func:`trainer_views_in_a_script` there.
    """
    import pytorch_lightning as pl

    with patched_environ(env):
        trainer = pl.Trainer(accelerator=accelerator, devices=devices, num_nodes=num_nodes, strategy="ddp",
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        cluster = trainer.strategy.cluster_environment
        try:
            cluster.validate_settings(num_devices=devices, num_nodes=num_nodes)
            mismatch = None
        except ValueError as error:
            mismatch = str(error)
        return {"environment": type(cluster).__name__, "strategy": type(trainer.strategy).__name__,
                "global_rank": trainer.global_rank, "local_rank": trainer.local_rank,
                "node_rank": trainer.node_rank, "world_size": trainer.world_size, "mismatch": mismatch}


def trainer_views_in_a_script(jobs: list[tuple[dict, int, int]], timeout: float = 120) -> list[dict]:
    """:func:`trainer_view` for each ``(env, devices, num_nodes)``, in one fresh ``python`` process.

    That process is a script, as ``srun python train.py`` runs one; a notebook kernel is not.
    """
    code = ("import json, sys\nfrom gpucourse.beyond_one_machine import trainer_view\n"
            "print(json.dumps([trainer_view(*job) for job in json.load(sys.stdin)]))")
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# The PyTorch side of "MirroredStrategy vs DDP": one process per device, each with its own copy of the
# model and its own share of every batch; gradients are averaged by all-reduce during backward().
DDP_SCRIPT = """\
import json, os, sys
from pathlib import Path
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")  # "nccl" when every process has its own GPU
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
x = torch.randn({samples}, 30)
y = (x[:, :3].sum(1) > 0).long()
model = DistributedDataParallel(nn.Sequential(
    nn.Linear(30, 30), nn.ReLU(), nn.Dropout(0.5), nn.Linear(30, 60), nn.ReLU(), nn.Dropout(0.5), nn.Linear(60, 2)))
sampler = DistributedSampler(TensorDataset(x, y))  # each rank gets a different 1/world of the samples
loader = DataLoader(TensorDataset(x, y), batch_size={global_batch} // world, sampler=sampler)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
seen = 0
for epoch in range({epochs}):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()  # all-reduce: every rank ends with the same averaged gradient
        optimizer.step()
        seen += len(xb)
checksum = sum(float(p.sum()) for p in model.parameters())
report = {{"rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]), "world_size": world, "pid": os.getpid(),
          "samples_seen": seen, "last_loss": round(float(loss), 4), "weights_checksum": round(checksum, 6)}}
# each rank its own file, in the folder named on the command line: no rank's line can mix with another's
(Path(sys.argv[1]) / f"rank{{rank}}.json").write_text(json.dumps(report))
dist.destroy_process_group()
# Done: end without the interpreter's shutdown, where a finished rank can still abort on some torch versions
# (2.10: "terminate called without an active exception", SIGABRT) and fail the whole launch.
sys.stdout.flush()
os._exit(0)
"""


def ddp_side_by_side(processes: int = 2, samples: int = 512, global_batch: int = 64, epochs: int = 2,
                     timeout: float = 180) -> list[dict]:
    """Train the lesson's small MLP with DDP in ``processes`` CPU processes (gloo), started by torchrun.

    Returns one report per rank (``rank<N>.json``): its pid, how many samples it saw, and a checksum
    of its weights (the same on every rank: the replicas stay identical because their gradients are
    averaged). Launched by ``gpucourse.launch.torchrun``: out of time, no rank is left running.
    """
    import tempfile
    from pathlib import Path

    from gpucourse.launch import read_rank_reports, torchrun

    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "ddp_mlp.py"
        script.write_text(DDP_SCRIPT.format(samples=samples, global_batch=global_batch, epochs=epochs))
        launch = torchrun([str(script), folder], nproc=processes, timeout=timeout, cwd=folder)
        reports = list(read_rank_reports(folder).values())
    if launch.returncode != 0 or len(reports) != processes:
        outcome = "timed out" if launch.timed_out else f"exit {launch.returncode}"
        raise RuntimeError(f"torchrun failed ({outcome}):\n{launch.output[-2000:]}")
    return reports


# --- A real cluster: the local Slurm of gpucourse.local_slurm (two emulated nodes on this machine) ------

# What each process of the lesson's jobs runs: a gloo process group over every process the job started,
# one all-reduce, one line per process. The line says where the process ran (Slurm's node), the ranks
# it was given, and the all-reduced sum of every rank's number: only processes that met compute it.
RANK_REPORT_SCRIPT = """\
import datetime, os, socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank)])
dist.all_reduce(total)  # 0 + 1 + ... + (world - 1) on every rank, if they all joined one group
print(f"node {os.environ.get('SLURMD_NODENAME', socket.gethostname())}: RANK {rank} of WORLD_SIZE {world}, "
      f"LOCAL_RANK {os.environ['LOCAL_RANK']}, GROUP_RANK {os.environ.get('GROUP_RANK')}, "
      f"MASTER_ADDR {os.environ['MASTER_ADDR']}; all-reduced sum of ranks {total.item():.0f}", flush=True)
dist.destroy_process_group()
os._exit(0)  # done: skip the interpreter's shutdown, where a finished rank can abort on some torch versions
"""

# A job array: one script, several tasks, each with its own SLURM_ARRAY_TASK_ID (here: one seed each).
ARRAY_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=sweep
#SBATCH --array=0-3
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --output=sweep-%A_%a.out
sleep 2
echo "array task $SLURM_ARRAY_TASK_ID of job $SLURM_ARRAY_JOB_ID on $SLURMD_NODENAME: seed $((1000 + SLURM_ARRAY_TASK_ID))"
"""

# A static rendezvous (--master-addr, --node-rank) whose node rank the batch shell expands: it runs once, on
# the first node, where SLURM_NODEID is 0, so both nodes' torchrun claim node 0 and the second cannot start.
STATIC_NODE_RANK_ONCE = """\
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:2

export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# $SLURM_NODEID is expanded here, by the batch shell: 0, for every node's torchrun
srun torchrun --nnodes=2 --nproc-per-node=2 --node-rank=$SLURM_NODEID \\
    --master-addr=$MASTER_ADDR --master-port=29500 train.py
"""

RECORDING = Path(__file__).resolve().parent / "recorded" / "lesson10_slurm.json"


def submit_and_watch(script: str, files: dict | None = None, timeout: float = 240) -> dict:
    """Submit ``script`` to the local cluster (``files`` written next to it first), take ``squeue`` while it
    runs, and wait for it. Returns the script, the queue seen, the job's final state and exit code as Slurm
    reports them, its output files and ``sacct --completion``'s lines for it."""
    import tempfile
    import time

    from gpucourse import local_slurm

    runs = local_slurm.state_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="lesson10-", dir=runs))
    (folder / "job.sbatch").write_text(script)
    for name, text in (files or {}).items():
        (folder / name).write_text(text)
    environ = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    job = local_slurm.sbatch(folder / "job.sbatch", f"--chdir={folder}", workdir=folder, environ=environ)
    time.sleep(1.0)
    queue = local_slurm.squeue()
    info = local_slurm.wait(job, timeout=timeout)
    outputs = {p.name: p.read_text(errors="replace") for p in sorted(folder.glob("*.out"))}
    return {"job_id": job, "script": script, "squeue": queue, "state": info.get("JobState"),
            "exit_code": info.get("ExitCode"), "nodes": info.get("NodeList"), "outputs": outputs,
            "sacct": _since(local_slurm.sacct(), job)}


def _since(table: str, job: int) -> str:
    """sacct's header and its lines for jobs ``job`` and later (a job array's tasks get the ids after its own)."""
    lines = table.splitlines()
    kept = [line for line in lines[2:] if line.split() and line.split()[0].split("_")[0].isdigit()
            and int(line.split()[0].split("_")[0]) >= job]
    return "\n".join(lines[:2] + kept) + "\n"


def torchrun_job(sbatch_text: str, timeout: float = 240) -> dict:
    """Run an sbatch script whose command is ``python train.py`` on the local cluster, ``train.py`` being
    :data:`RANK_REPORT_SCRIPT`: each process prints its node, its ranks and the all-reduced sum."""
    return submit_and_watch(sbatch_text, {"train.py": RANK_REPORT_SCRIPT}, timeout=timeout)


def recorded_run() -> dict:
    """The run shipped with the course (:func:`record` wrote it on a machine with the local cluster up): shown
    where Slurm cannot run, such as Colab, labelled with its machine and date."""
    return json.loads(RECORDING.read_text())


def record(sbatch_texts: dict[str, str], path: Path = RECORDING) -> dict:
    """Run each named sbatch script (command ``python train.py``) and the job array, and write the
    recording that :func:`recorded_run` reads."""
    from gpucourse import local_slurm

    data = {**_recorded_where(), "sinfo": local_slurm.sinfo(),
            "jobs": {name: torchrun_job(text) for name, text in sbatch_texts.items()},
            "array": submit_and_watch(ARRAY_SCRIPT)}
    for job in data["jobs"].values():
        if job["script"] not in (STATIC_NODE_RANK_ONCE, ARRAY_SCRIPT):
            job.pop("script")  # an exercise's answer: its output is shown, never its text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def _recorded_where() -> dict:
    """The machine and date a recording is labelled with."""
    import datetime
    import platform

    from gpucourse import local_slurm

    return {"machine": f"{platform.node() or 'this machine'} ({platform.machine()}, {os.cpu_count()} CPU cores, "
                       f"{len(local_slurm.NODES)} Slurm nodes emulated by gpucourse.local_slurm)",
            "date": datetime.date.today().isoformat()}

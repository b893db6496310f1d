"""Hidden checks for lesson 10 (beyond one machine). Never released; see lesson01's file for the form.

The judges compare with what Lightning's SLURMEnvironment derives (restated below as
lightning_slurm_ranks, held equal to the real one by tests/test_cluster.py; it is the exercise's answer,
so it lives here, never in the released package) and read the scripts as sbatch does; the observers
only call the student's functions. Observers repeat the job lists below (their source travels alone);
a judge rebuilds the environments from the list and compares, so the two cannot drift apart unnoticed.
"""

import re

from gpucourse.checks import Case
from gpucourse.checks.lesson10 import build_jobs, judge_ranks, judge_sbatch_all



def lightning_slurm_ranks(env: dict) -> dict | None:
    """What Lightning 2.6's SLURMEnvironment derives from a task's ``env``; None when it stays out.

    Mirrors ``lightning_fabric.plugins.environments.slurm``: detected when SLURM_NTASKS is set and the
    job is not named "bash" or "interactive"; ranks and world size are read, not computed; the main
    address is MASTER_ADDR if set, else the first host of SLURM_NODELIST.
    """
    if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None
    if "MASTER_ADDR" in env:
        address = env["MASTER_ADDR"]
    else:
        nodes = env.get("SLURM_NODELIST", "127.0.0.1")
        nodes = re.sub(r"\[(.*?)[,-].*\]", "\\1", nodes)
        nodes = re.sub(r"\[(.*?)\]", "\\1", nodes)
        address = nodes.split(" ")[0].split(",")[0]
    return {"global_rank": int(env["SLURM_PROCID"]), "local_rank": int(env["SLURM_LOCALID"]),
            "node_rank": int(env["SLURM_NODEID"]), "world_size": int(env["SLURM_NTASKS"]), "main_address": address}


def judge_against_lightning(jobs, data, plain=()):
    envs = build_jobs(jobs) + [dict(e) for e in plain]
    return judge_ranks(envs, [lightning_slurm_ranks(env) for env in envs], data)


# --- slurm_ranks ---------------------------------------------------------------------------
# What the exercise states, and the case that tests it (the public case: 2 × 4, interactive, no SLURM):
#  1. None when the env has no SLURM_NTASKS, whatever other SLURM_* it has   -> "no SLURM_NTASKS"
#  2. None for a job named exactly "bash" or "interactive"; any other name,
#     or none at all, is a SLURM launch                                      -> "named bash or interactive"
#  3. global/local/node rank are SLURM_PROCID/LOCALID/NODEID, read (srun may
#     place tasks cyclically), as ints                                       -> "generated job shapes"
#  4. world_size is SLURM_NTASKS (not nodes × tasks per node), an int        -> "world size"
#  5. main_address is MASTER_ADDR when it is set                             -> "MASTER_ADDR"
#  6. else the first host of SLURM_NODELIST (the exercise hands out
#     gpucourse.cluster.hostnames for the expansion, so this clause checks the
#     choice of host, not parsing): gpu[017-018], node[003,007-009], gpu005,
#     cn-a1,cn-b7 (and hosts with dashes, unpadded ranges)                   -> "first host"
#  7. a dict with exactly those keys, ints and a str                         -> every case

# (nodes, tasks per node, srun_environments options, extra variables; None removes one): observers repeat these.
SHAPES = [(1, 1, {"job_name": "single"}, {}),
          (1, 8, {"prefix": "a100-", "numbers": [5]}, {}),
          (3, 2, {"prefix": "node", "numbers": [3, 7, 8], "distribution": "cyclic", "job_id": 99120}, {}),
          (2, 3, {"numbers": [40, 41], "job_id": 5550001}, {}),
          (1, 1, {"job_id": 61}, {"SLURM_NTASKS_PER_NODE": None})]  # srun -n 1: no SLURM_NTASKS_PER_NODE
ODD_PLACES = [(4, 4, {"numbers": [101, 102, 103, 110], "job_id": 8800123}, {"MASTER_ADDR": "10.0.0.5"}),
              (1, 2, {"job_id": 12}, {"MASTER_ADDR": "login-3.cluster.example"}),
              (2, 2, {"job_id": 31337}, {"SLURM_NODELIST": "cn-a1,cn-b7", "SLURM_JOB_NODELIST": "cn-a1,cn-b7"}),
              (1, 4, {"job_name": "bash"}, {}),
              (2, 2, {"job_name": "interactive", "distribution": "cyclic"}, {})]
NAMES = [(1, 2, {"job_name": "bash"}, {}), (1, 1, {"job_name": "interactive"}, {}),
         (2, 2, {"job_name": "interactive-eval", "distribution": "cyclic"}, {}), (1, 3, {"job_name": "bash_train"}, {}),
         (2, 1, {"job_name": "train"}, {"SLURM_JOB_NAME": None})]
NO_NTASKS = [(2, 2, {"job_id": 777}, {"SLURM_NTASKS": None, "SLURM_NPROCS": None})]
NO_NTASKS_PLAIN = [{"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NODELIST": "gpu001", "SLURM_PROCID": "0",
                    "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "1"},
                   {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}]
FIRST_HOSTS = [(2, 2, {"job_id": 11}, {"SLURM_NODELIST": "node[003,007-009]"}),
               (3, 1, {"job_id": 12}, {"SLURM_NODELIST": "gpu[8-10]"}),
               (2, 1, {"prefix": "a100-", "numbers": [5, 6]}, {}),
               (3, 1, {"job_id": 13}, {"SLURM_NODELIST": "login-2,gpu[100-101]"}),
               (1, 2, {"prefix": "gpu", "numbers": [5]}, {}),
               (2, 1, {"prefix": "hpc-g", "numbers": [98, 99]}, {})]
GENERATED_JOBS = 6


def observe_rank_shapes(ns):
    from gpucourse.checks.lesson10 import observe_ranks_for

    return observe_ranks_for(ns, [(1, 1, {"job_name": "single"}, {}),
                                  (1, 8, {"prefix": "a100-", "numbers": [5]}, {}),
                                  (3, 2, {"prefix": "node", "numbers": [3, 7, 8], "distribution": "cyclic", "job_id": 99120}, {}),
                                  (2, 3, {"numbers": [40, 41], "job_id": 5550001}, {}),
                                  (1, 1, {"job_id": 61}, {"SLURM_NTASKS_PER_NODE": None})])


def observe_rank_odd_places(ns):
    from gpucourse.checks.lesson10 import observe_ranks_for

    return observe_ranks_for(ns, [(4, 4, {"numbers": [101, 102, 103, 110], "job_id": 8800123}, {"MASTER_ADDR": "10.0.0.5"}),
                                  (1, 2, {"job_id": 12}, {"MASTER_ADDR": "login-3.cluster.example"}),
                                  (2, 2, {"job_id": 31337}, {"SLURM_NODELIST": "cn-a1,cn-b7", "SLURM_JOB_NODELIST": "cn-a1,cn-b7"}),
                                  (1, 4, {"job_name": "bash"}, {}),
                                  (2, 2, {"job_name": "interactive", "distribution": "cyclic"}, {})])


def observe_rank_names(ns):
    from gpucourse.checks.lesson10 import observe_ranks_for

    return observe_ranks_for(ns, [(1, 2, {"job_name": "bash"}, {}), (1, 1, {"job_name": "interactive"}, {}),
                                  (2, 2, {"job_name": "interactive-eval", "distribution": "cyclic"}, {}),
                                  (1, 3, {"job_name": "bash_train"}, {}),
                                  (2, 1, {"job_name": "train"}, {"SLURM_JOB_NAME": None})])


def observe_rank_no_ntasks(ns):
    from gpucourse.checks.lesson10 import observe_ranks_for

    plain = [{"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NODELIST": "gpu001", "SLURM_PROCID": "0",
              "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "1"},
             {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}]
    return observe_ranks_for(ns, [(2, 2, {"job_id": 777}, {"SLURM_NTASKS": None, "SLURM_NPROCS": None})], plain_extra=plain)


def observe_rank_first_hosts(ns):
    from gpucourse.checks.lesson10 import observe_ranks_for

    return observe_ranks_for(ns, [(2, 2, {"job_id": 11}, {"SLURM_NODELIST": "node[003,007-009]"}),
                                  (3, 1, {"job_id": 12}, {"SLURM_NODELIST": "gpu[8-10]"}),
                                  (2, 1, {"prefix": "a100-", "numbers": [5, 6]}, {}),
                                  (3, 1, {"job_id": 13}, {"SLURM_NODELIST": "login-2,gpu[100-101]"}),
                                  (1, 2, {"prefix": "gpu", "numbers": [5]}, {}),
                                  (2, 1, {"prefix": "hpc-g", "numbers": [98, 99]}, {})])


def observe_rank_generated(ns):
    import random

    from gpucourse.checks.lesson10 import observe_ranks_for

    rng = random.Random(20261017)
    jobs = []
    for _ in range(6):
        nodes = rng.randint(1, 5)
        options = {"prefix": rng.choice(["gpu", "node", "a100-", "cn", "hpc-g"]),
                   "numbers": sorted(rng.sample(range(1, 400), nodes)), "job_id": rng.randint(10 ** 5, 10 ** 8),
                   "job_name": rng.choice(["train", "fit", "pretrain-lm", "bashful"]),
                   "distribution": rng.choice(["block", "cyclic"])}
        jobs.append([nodes, rng.choice([1, 2, 3, 4, 6, 8]), options, {}])
    return {**observe_ranks_for(ns, jobs), "jobs": jobs}


def judge_rank_generated(data):
    if len(data["jobs"]) != GENERATED_JOBS:
        return "the generated jobs were changed while checking"
    return judge_against_lightning(data["jobs"], data)


# --- sbatch_for ----------------------------------------------------------------------------
# What the exercise states (the text, the stub, section 4 it builds on), and the case that tests it:
#  1. returns the script's text, a str                                        -> every case
#  2. its first line is an interpreter line (#!...)                           -> "interpreter line"
#  3. #SBATCH options count only before the first command; long, "--opt v"
#     and short forms (-N 2) all count                                        -> "--nodes"
#  4. --nodes = nodes (= Trainer(num_nodes))                                  -> "--nodes"
#  5. srun starts one task per GPU on each node (--ntasks-per-node = GPUs per
#     node = devices); with torchrun (section 5) one torchrun task per node,
#     --nnodes = nodes, --nproc-per-node = GPUs; srun's own options and
#     --ntasks agree; torchrun is torchrun whether srun starts it directly or
#     in bash -c '...' (--node-rank=$SLURM_NODEID): one task per node then      -> "tasks per node"
#  6. GPUs requested per node: --gres=gpu[:type]:N or --gpus-per-node=N, not
#     --gpus (the whole job)                                                  -> "GPUs per node"
#  7. the command (any command, with its arguments) is launched by srun, as
#     given, after the #SBATCH lines; other options are free                  -> "launched by srun"
# Inputs: 1 × 1, 2 × 3 and 3 × 2 (nodes and GPUs swapped), 16 × 4, and seeded random shapes and commands.

SBATCH_FIXED = [{"nodes": 4, "gpus": 8, "command": "python -u train.py --config big.yaml"},
                {"nodes": 1, "gpus": 1, "command": "python train.py"},
                {"nodes": 16, "gpus": 4, "command": "python pretrain.py"},
                {"nodes": 3, "gpus": 2, "command": "python train.py --max-epochs 5"},
                {"nodes": 2, "gpus": 3, "command": "python -m lab.fit --lr 3e-4"}]


def observe_sbatch_generated(ns):
    import random

    from gpucourse.checks.lesson10 import observe_sbatch_for

    requests = [{"nodes": 4, "gpus": 8, "command": "python -u train.py --config big.yaml"},
                {"nodes": 1, "gpus": 1, "command": "python train.py"},
                {"nodes": 16, "gpus": 4, "command": "python pretrain.py"},
                {"nodes": 3, "gpus": 2, "command": "python train.py --max-epochs 5"},
                {"nodes": 2, "gpus": 3, "command": "python -m lab.fit --lr 3e-4"}]
    rng = random.Random(4417)
    commands = ["python train.py", "python3 main.py fit --trainer.max_epochs=3", "python finetune.py --seed 7",
                "python -m experiments.run --epochs 20", "python cli.py fit -c configs/unet.yaml"]
    for _ in range(4):
        requests.append({"nodes": rng.randint(1, 32), "gpus": rng.choice([1, 2, 3, 4, 6, 8]), "command": rng.choice(commands)})
    return {"requests": requests, "texts": observe_sbatch_for(ns, requests)}


def sbatch_requests() -> list[dict]:
    """observe_sbatch_generated's requests, rebuilt here (the same seed): never read from an observation."""
    import random

    rng = random.Random(4417)
    commands = ["python train.py", "python3 main.py fit --trainer.max_epochs=3", "python finetune.py --seed 7",
                "python -m experiments.run --epochs 20", "python cli.py fit -c configs/unet.yaml"]
    requests = [dict(r) for r in SBATCH_FIXED]
    for _ in range(4):
        requests.append({"nodes": rng.randint(1, 32), "gpus": rng.choice([1, 2, 3, 4, 6, 8]), "command": rng.choice(commands)})
    return requests


def sbatch_judge(clauses):
    def judge(data):
        requests = sbatch_requests()
        if data["requests"] != requests:
            return "the requests were changed while checking"
        return judge_sbatch_all(requests, data["texts"], clauses)
    return judge


HIDDEN = {
    "slurm_ranks": [
        Case("no SLURM_NTASKS: None, whatever other SLURM_* variables are set", observe_rank_no_ntasks,
             lambda data: judge_against_lightning(NO_NTASKS, data, NO_NTASKS_PLAIN)),
        Case("a job named bash or interactive: None; any other name, or none, is a SLURM task", observe_rank_names,
             lambda data: judge_against_lightning(NAMES, data)),
        Case("generated job shapes (1-5 nodes, block and cyclic placement): ranks read from srun's variables",
             observe_rank_generated, judge_rank_generated),
        Case("world size and ranks: 1 task, 1 × 8, 3 × 2 cyclic, 2 × 3, a task without SLURM_NTASKS_PER_NODE",
             observe_rank_shapes, lambda data: judge_against_lightning(SHAPES, data)),
        Case("MASTER_ADDR, when set, is the main address; a comma host list; jobs named bash and interactive",
             observe_rank_odd_places, lambda data: judge_against_lightning(ODD_PLACES, data)),
        Case("main address: the first host of each form of SLURM_NODELIST", observe_rank_first_hosts,
             lambda data: judge_against_lightning(FIRST_HOSTS, data)),
    ],
    "sbatch_for": [
        Case("returns the script's text, its first line an interpreter line", observe_sbatch_generated,
             sbatch_judge({"interpreter"})),
        Case("--nodes is the number of nodes, in #SBATCH lines before the first command", observe_sbatch_generated,
             sbatch_judge({"nodes"})),
        Case("tasks per node: srun starts one task per GPU (one torchrun per node)", observe_sbatch_generated,
             sbatch_judge({"tasks"})),
        Case("GPUs requested per node, not for the whole job", observe_sbatch_generated, sbatch_judge({"gpus"})),
        Case("the command is launched by srun, as given, on other shapes and commands", observe_sbatch_generated,
             sbatch_judge({"launch"})),
    ],
}

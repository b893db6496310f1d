"""Hidden checks for lesson 10 (beyond one machine). Never released; see lesson01's file for the form.

The judges compare with what Lightning's SLURMEnvironment derives (restated below as
lightning_slurm_ranks, held equal to the real one by tests/test_cluster.py; it is the exercise's answer,
so it lives here, never in the released package) and read the scripts as sbatch does; the observers
only call the student's functions.
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


def judge_against_lightning(jobs, data):
    envs = build_jobs(jobs)
    return judge_ranks(envs, [lightning_slurm_ranks(env) for env in envs], data)



# (nodes, tasks per node, srun_environments options, extra variables): the observers repeat these.
SHAPES = [(1, 1, {"job_name": "single"}, {}),
          (1, 8, {"prefix": "a100-", "numbers": [5]}, {}),
          (3, 2, {"prefix": "node", "numbers": [3, 7, 8], "distribution": "cyclic", "job_id": 99120}, {}),
          (2, 3, {"numbers": [40, 41], "job_id": 5550001}, {})]
ODD_PLACES = [(4, 4, {"numbers": [101, 102, 103, 110], "job_id": 8800123}, {"MASTER_ADDR": "10.0.0.5"}),
              (2, 2, {"job_id": 31337}, {"SLURM_NODELIST": "cn-a1,cn-b7", "SLURM_JOB_NODELIST": "cn-a1,cn-b7"}),
              (1, 4, {"job_name": "bash"}, {}),
              (2, 2, {"job_name": "interactive", "distribution": "cyclic"}, {})]


def observe_rank_shapes(ns):
    from gpucourse.checks.lesson10 import observe_ranks_for

    return observe_ranks_for(ns, [(1, 1, {"job_name": "single"}, {}),
                                  (1, 8, {"prefix": "a100-", "numbers": [5]}, {}),
                                  (3, 2, {"prefix": "node", "numbers": [3, 7, 8], "distribution": "cyclic", "job_id": 99120}, {}),
                                  (2, 3, {"numbers": [40, 41], "job_id": 5550001}, {})])


def observe_rank_odd_places(ns):
    from gpucourse.checks.lesson10 import observe_ranks_for

    return observe_ranks_for(ns, [(4, 4, {"numbers": [101, 102, 103, 110], "job_id": 8800123}, {"MASTER_ADDR": "10.0.0.5"}),
                                  (2, 2, {"job_id": 31337}, {"SLURM_NODELIST": "cn-a1,cn-b7", "SLURM_JOB_NODELIST": "cn-a1,cn-b7"}),
                                  (1, 4, {"job_name": "bash"}, {}),
                                  (2, 2, {"job_name": "interactive", "distribution": "cyclic"}, {})])


SBATCH_REQUESTS = [{"nodes": 4, "gpus": 8, "command": "python -u train.py --config big.yaml"},
                   {"nodes": 1, "gpus": 1, "command": "python train.py"},
                   {"nodes": 16, "gpus": 4, "command": "python pretrain.py"},
                   {"nodes": 3, "gpus": 2, "command": "python train.py --max-epochs 5"}]


def observe_sbatch_more(ns):
    from gpucourse.checks.lesson10 import observe_sbatch_for

    return observe_sbatch_for(ns, [{"nodes": 4, "gpus": 8, "command": "python -u train.py --config big.yaml"},
                                   {"nodes": 1, "gpus": 1, "command": "python train.py"},
                                   {"nodes": 16, "gpus": 4, "command": "python pretrain.py"},
                                   {"nodes": 3, "gpus": 2, "command": "python train.py --max-epochs 5"}])


HIDDEN = {
    "slurm_ranks": [
        Case("one GPU; 8 GPUs on one node; 3 nodes with cyclic task placement; 2 × 3",
             observe_rank_shapes, lambda data: judge_against_lightning(SHAPES, data)),
        Case("MASTER_ADDR exported, a comma host list, jobs named bash and interactive",
             observe_rank_odd_places, lambda data: judge_against_lightning(ODD_PLACES, data)),
    ],
    "sbatch_for": [Case("4 × 8, 1 × 1, 16 × 4 and 3 × 2 GPUs", observe_sbatch_more,
                        lambda texts: judge_sbatch_all(SBATCH_REQUESTS, texts))],
}

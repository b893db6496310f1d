"""Hidden checks for lesson 10 (beyond one machine). Never released; see lesson01's file for the form.

The judges compare with what Lightning's SLURMEnvironment derives (restated in
gpucourse.checks.lesson10.lightning_slurm_ranks, held equal to the real one by tests/test_cluster.py)
and read the scripts as sbatch does; the observers only call the student's functions.
"""

from gpucourse.checks import Case
from gpucourse.checks.lesson10 import build_jobs, judge_ranks, judge_sbatch_all

EXERCISES = {"test_slurm_ranks": "slurm_ranks", "test_sbatch_for": "sbatch_for"}

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
             observe_rank_shapes, lambda data: judge_ranks(build_jobs(SHAPES), data)),
        Case("MASTER_ADDR exported, a comma host list, jobs named bash and interactive",
             observe_rank_odd_places, lambda data: judge_ranks(build_jobs(ODD_PLACES), data)),
    ],
    "sbatch_for": [Case("4 × 8, 1 × 1, 16 × 4 and 3 × 2 GPUs", observe_sbatch_more,
                        lambda texts: judge_sbatch_all(SBATCH_REQUESTS, texts))],
}

"""gpucourse.beyond_one_machine (lesson 10's helpers), against Lightning's real SLURM and torchrun environments."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from gpucourse import beyond_one_machine as C
from gpucourse.checks import lesson10_beyond_one_machine as L

ROOT = Path(__file__).resolve().parents[1]


def _hidden_checks():
    path = ROOT / "autograders" / "checks" / "lesson10_beyond_one_machine.py"
    spec = importlib.util.spec_from_file_location("hidden_lesson10", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hostlists_are_compressed_as_slurm_does():
    assert C.hostlist("gpu", [17, 18]) == "gpu[017-018]"
    assert C.hostlist("node", [3, 7, 8, 9]) == "node[003,007-009]"
    assert C.hostlist("gpu", [5]) == "gpu005"


def test_every_task_of_a_two_node_four_gpu_job():
    envs = C.srun_environments(2, 4, numbers=[17, 18], job_id=4242017)
    assert envs[0]["SLURM_NODELIST"] == "gpu[017-018]" and envs[0]["SLURM_NTASKS"] == "8"
    views = [C.lightning_view(env) for env in envs]
    assert {v["environment"] for v in views} == {"SLURMEnvironment"} and all(v["slurm_detected"] for v in views)
    assert sorted(v["global_rank"] for v in views) == list(range(8))
    assert [v["global_rank"] for v in views] == [int(e["SLURM_PROCID"]) for e in envs]
    assert [v["local_rank"] for v in views] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [v["node_rank"] for v in views] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {v["world_size"] for v in views} == {8}
    assert {v["main_address"] for v in views} == {"gpu017"}
    assert {v["main_port"] for v in views} == {15000 + 2017}  # last four digits of the job id + 15000


def test_cyclic_placement_is_read_not_computed():
    envs = C.srun_environments(3, 2, distribution="cyclic")
    views = [C.lightning_view(env) for env in envs]
    assert [v["node_rank"] for v in views] == [0, 1, 2, 0, 1, 2]
    assert [v["local_rank"] for v in views] == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("job_name", ["interactive", "bash"])
def test_interactive_sessions_are_not_slurm_jobs_for_lightning(job_name):
    view = C.lightning_view(C.interactive_environment(job_name))
    assert view["slurm_detected"] is False and view["environment"] == "LightningEnvironment"
    assert (view["global_rank"], view["world_size"]) == (0, 1)


def test_ntasks_without_ntasks_per_node_is_refused():
    env = dict(C.srun_environments(2, 4)[0])
    del env["SLURM_NTASKS_PER_NODE"]
    assert "--ntasks-per-node" in C.lightning_view(env)["error"]


def test_master_addr_wins_and_the_environment_is_restored():
    before = dict(os.environ)
    view = C.lightning_view({**C.srun_environments(2, 2)[3], "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "40000"})
    assert (view["main_address"], view["main_port"]) == ("10.0.0.5", 40000)
    assert dict(os.environ) == before


def test_torchrun_under_slurm_is_seen_as_torchelastic():
    envs = C.torchrun_environments(2, 4, head="gpu017")
    views = [C.lightning_view(env) for env in envs]
    assert {v["environment"] for v in views} == {"TorchElasticEnvironment"}
    assert all(v["slurm_detected"] for v in views)  # SLURM is there too, TorchElastic is tried first
    assert [v["global_rank"] for v in views] == list(range(8))
    assert [(v["node_rank"], v["local_rank"]) for v in views] == [(n, l) for n in range(2) for l in range(4)]
    assert {(v["world_size"], v["main_address"], v["main_port"]) for v in views} == {(8, "gpu017", 29500)}


@pytest.mark.parametrize("seed", range(3))
def test_the_reference_and_the_restatement_equal_lightning_on_every_drawn_task(seed):
    import random

    from gpucourse.checks.values import rebuild

    hidden = _hidden_checks()
    envs = L.build_jobs(L.PUBLIC_RANK_JOBS) + [L.INTERACTIVE_SHELL, {}]
    for case in hidden.HIDDEN["slurm_ranks"]:
        envs += [rebuild(spec["args"])[0] for spec in case.draw(random.Random(seed))]
    assert len(envs) > 100
    for env in envs:
        view = C.lightning_view(env)
        mine, reference = hidden.lightning_slurm_ranks(env), hidden.reference_slurm_ranks(env)
        assert "error" not in view, (env, view)
        if view["environment"] != "SLURMEnvironment":
            assert mine is None and reference is None, env
        else:
            assert mine == reference == {k: view[k] for k in L.RANK_KEYS}, env


def test_the_slurm_judge_accepts_the_reference_and_names_each_mistake():
    import random

    from gpucourse.checks import observe_calls

    hidden = _hidden_checks()
    right = {"slurm_ranks": hidden.reference_slurm_ranks}
    wrong_case = {"slurm_ranks": lambda env: None if env.get("SLURM_JOB_NAME", "").lower() in ("bash", "interactive")
                  or "SLURM_NTASKS" not in env else hidden.reference_slurm_ranks(env)}
    for case in hidden.HIDDEN["slurm_ranks"]:
        calls = case.draw(random.Random(5))
        assert hidden.judge_slurm_calls(observe_calls(right, "slurm_ranks", calls), calls) is None
    calls = hidden.HIDDEN["slurm_ranks"][1].draw(random.Random(5))
    assert "Bash" in hidden.judge_slurm_calls(observe_calls(wrong_case, "slurm_ranks", calls), calls)


@pytest.mark.parametrize("launch,problem", [
    ("srun torchrun --nnodes=2 --nproc-per-node=4 --node-rank=$SLURM_NODEID --master-addr=$MASTER_ADDR "
     "--master-port=29500 train.py", "--node-rank=0"),
    ('srun bash -c "torchrun --nnodes=2 --nproc-per-node=4 --node-rank=${SLURM_NODEID} --master-addr=$MASTER_ADDR '
     '--master-port=29500 train.py"', "--node-rank=0"),
    ("NODE=$SLURM_NODEID\nsrun bash -c 'torchrun --nnodes=2 --nproc-per-node=4 --node-rank=$NODE --master-addr=$MASTER_ADDR "
     "--master-port=29500 train.py'", "the batch shell expands"),
    ("srun torchrun --nnodes=2 --nproc-per-node=4 --node-rank=\\$SLURM_NODEID --master-addr=$MASTER_ADDR "
     "--master-port=29500 train.py", "no shell of the task expands it"),
    ("srun bash -c 'torchrun --nnodes=2 --nproc-per-node=4 --node-rank=$SLURM_NODEID --master-addr=$MASTER_ADDR "
     "--master-port=29500 train.py'", None),
    ('srun bash -c "torchrun --nnodes=2 --nproc-per-node=4 --node-rank=\\$SLURM_NODEID --master-addr=$MASTER_ADDR '
     '--master-port=29500 train.py"', None),
    ("srun torchrun --nnodes=2 --nproc-per-node=4 --node-rank=$SLURM_NODEID --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR "
     "train.py", None),  # a c10d rendezvous gives the node ranks itself: --node-rank is not used
    # each task's shell does arithmetic too; a value the same on every node is wrong wherever it was expanded
    ("srun bash -c 'torchrun --nnodes=2 --nproc-per-node=4 --node-rank=$((SLURM_NODEID)) --master-addr=$MASTER_ADDR "
     "--master-port=29500 train.py'", None),
    ("srun bash -c 'torchrun --nnodes=2 --nproc-per-node=4 --node-rank=$((SLURM_NODEID * 0)) --master-addr=$MASTER_ADDR "
     "--master-port=29500 train.py'", "the same on every node"),
    ("srun bash -c 'torchrun --nnodes=2 --nproc-per-node=4 --node-rank=$((1 - SLURM_NODEID)) --master-addr=$MASTER_ADDR "
     "--master-port=29500 train.py'", "--node-rank 1, 0"),
    ("srun bash -c 'torchrun --nnodes=2 --nproc-per-node=4 --node-rank=$SLURM_LOCALID --master-addr=$MASTER_ADDR "
     "--master-port=29500 train.py'", "the same on every node"),
    ("srun --export=ALL,RANK0=0 bash -c 'torchrun --nnodes=2 --nproc-per-node=4 --node-rank=$RANK0 --master-addr=$MASTER_ADDR "
     "--master-port=29500 train.py'", "--node-rank=0"),
    ("NODE=$SLURM_NODEID\nsrun bash -c 'torchrun --nnodes=2 --nproc-per-node=4 --node-rank=${NODE} --master-addr=$MASTER_ADDR "
     "--master-port=29500 train.py'", "an empty --node-rank"),
])
def test_the_node_rank_is_judged_where_the_shells_expand_it(launch, problem):
    text = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"
            'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n' + launch + "\n")
    verdict = L.judge_sbatch({"nodes": 2, "gpus": 4, "command": "python train.py"}, text)
    assert verdict is None if problem is None else problem in verdict, verdict


def test_the_public_checks_expectations_are_what_lightning_derives():
    envs = L.build_jobs(L.PUBLIC_RANK_JOBS) + [L.INTERACTIVE_SHELL, {}]
    assert len(envs) == len(L.PUBLIC_RANK_WANTS)
    for env, want in zip(envs, L.PUBLIC_RANK_WANTS):
        view = C.lightning_view(env)
        if view["environment"] != "SLURMEnvironment":
            assert want is None, env
        else:
            assert want == {k: view[k] for k in L.RANK_KEYS}, env


def test_a_real_trainer_derives_the_same_ranks_without_launching():
    envs = C.srun_environments(2, 4)
    for env in (envs[0], envs[5], envs[7]):
        view = C.trainer_view(env, devices=4, num_nodes=2)
        assert view["environment"] == "SLURMEnvironment" and view["strategy"] == "DDPStrategy"
        assert view["mismatch"] is None
        assert (view["global_rank"], view["local_rank"], view["node_rank"], view["world_size"]) == (
            int(env["SLURM_PROCID"]), int(env["SLURM_LOCALID"]), int(env["SLURM_NODEID"]), 8)
    assert "HINT: Set `devices=4`" in C.trainer_view(envs[5], devices=2, num_nodes=2)["mismatch"]
    assert "HINT: Set `num_nodes=2`" in C.trainer_view(envs[5], devices=4, num_nodes=1)["mismatch"]


@pytest.mark.parametrize("nodes,gpus", [(1, 1), (2, 4), (4, 8)])
def test_lightning_template_is_consistent(nodes, gpus):
    text = C.render_sbatch(nodes, gpus, "train.py --max-epochs 3", cpus_per_task=6, time="01:00:00", job_name="fit")
    script = L.parse_sbatch(text)
    options = script["options"]
    assert script["shebang"]
    assert (options["nodes"], options["ntasks-per-node"], options["gres"]) == (str(nodes), str(gpus), f"gpu:{gpus}")
    assert (options["cpus-per-task"], options["time"], options["job-name"]) == ("6", "01:00:00", "fit")
    assert options["signal"] == "SIGUSR1@90"
    assert f"Trainer(num_nodes={nodes})" in text and f"Trainer(devices={gpus})" in text
    assert script["body"][-1] == "srun python train.py --max-epochs 3"
    assert L.judge_sbatch({"nodes": nodes, "gpus": gpus, "command": "python train.py --max-epochs 3"}, text) is None


def test_torchrun_template_runs_one_torchrun_per_node():
    text = C.render_sbatch(2, 4, "train.py", cpus_per_task=6, launcher="torchrun")
    script = L.parse_sbatch(text)
    assert (script["options"]["nodes"], script["options"]["ntasks-per-node"], script["options"]["gres"]) == ("2", "1", "gpu:4")
    assert script["options"]["cpus-per-task"] == "24"
    assert 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in script["body"]
    launch = " ".join(text[text.index("srun torchrun"):].replace("\\\n", " ").split())
    assert launch == ('srun torchrun --nnodes=2 --nproc-per-node=4 --rdzv-id="$SLURM_JOB_ID" --rdzv-backend=c10d'
                      ' --rdzv-endpoint="$head:29500" train.py')
    with pytest.raises(ValueError):
        C.render_sbatch(2, 4, launcher="mpirun")


@pytest.mark.parametrize("text,problem", [
    ("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node 4\n#SBATCH --gpus-per-node=h100:4\n"
     "module load cuda\nsrun python train.py\n", None),
    ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=4 --gres=gpu:4  # all on one line\nexec srun -u python train.py\n", None),
    ("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gres=gpu:4\nsrun python train.py\n", "interpreter"),
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\nsrun python train.py\n", "one task per GPU"),
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gres=gpu:8\nsrun python train.py\n", "8 GPU(s)"),
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gpus=8\nsrun python train.py\n", "whole job"),
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gres=gpu:4\npython train.py\n", "srun"),
    ("#!/bin/bash\ncd $HOME\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gres=gpu:4\n"
     "srun python train.py\n", "--nodes is None"),
    # one model of the shells reads every line: commands split at ";", variables set for one command, defaults
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gres=gpu:4\n"
     "module load cuda; srun python train.py\n", None),
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gres=gpu:4\n"
     "module load cuda; python train.py\n", "runs once, on the first node only"),
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gres=gpu:4\n"
     "OMP_NUM_THREADS=4 srun python train.py\n", None),
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"
     'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
     'srun torchrun --nnodes=${SLURM_NNODES:-1} --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint="$head:29500" train.py\n',
     None),
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"
     'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
     'srun torchrun --nnodes=$NODES --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint="$head:29500" train.py\n',
     "--nnodes is ''"),
    # a rendezvous named but empty in the tasks' shell: the host is what is wrong, not a missing rendezvous
    ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"
     'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
     "srun bash -c 'torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=$head:29500 train.py'\n",
     "--rdzv-endpoint host is empty"),
])
def test_scripts_are_read_as_sbatch_reads_them(text, problem):
    verdict = L.judge_sbatch({"nodes": 2, "gpus": 4, "command": "python train.py"}, text)
    assert verdict is None if problem is None else problem in verdict


NODELISTS = ["gpu[017-018]", "node[003,007-009]", "gpu[8-10]", "login-2,gpu[100-101]", "a100-[005-006]",
             "cn-a1,cn-b7", "gpu005", "hpc-g[098-099]"]


def test_hostnames_expand_as_scontrol_and_the_first_is_lightnings_main_address():
    from lightning_fabric.plugins.environments import SLURMEnvironment

    assert C.hostnames("node[003,007-009]") == ["node003", "node007", "node008", "node009"]
    assert C.hostnames("gpu[8-10]") == ["gpu8", "gpu9", "gpu10"]
    assert C.hostnames("login-2,gpu[100-101]") == ["login-2", "gpu100", "gpu101"]
    assert C.hostnames("rack[1-2]-n[01-02]") == ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
    for nodelist in NODELISTS:
        assert C.hostnames(nodelist)[0] == SLURMEnvironment.resolve_root_node_address(nodelist), nodelist
    for numbers in ([17, 18], [3, 7, 8, 9], [5], [1, 2, 3, 10, 12]):  # the inverse of hostlist
        assert C.hostnames(C.hostlist("gpu", numbers)) == [f"gpu{n:03d}" for n in numbers]


@pytest.mark.parametrize("distribution", ["block", "cyclic"])
def test_rank_table_is_read_from_the_srun_environments(distribution):
    table = C.rank_table(2, 4, distribution)
    envs = C.srun_environments(2, 4, distribution=distribution)
    assert [t["rank"] for t in table] == list(range(8))
    for task, env in zip(table, envs):
        view = C.lightning_view(env)
        assert (task["rank"], task["local_rank"], task["node_rank"]) == (
            view["global_rank"], view["local_rank"], view["node_rank"])
    if distribution == "block":  # task 5 of 2 x 4: node 1, GPU 1
        assert table[5] == {"rank": 5, "local_rank": 1, "node_rank": 1, "host": "gpu018"}
    else:
        assert table[5] == {"rank": 5, "local_rank": 2, "node_rank": 1, "host": "gpu018"}


def test_rank_grid_figure_labels_every_gpu_with_its_ranks():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = C.draw_rank_grid(2, 4)
    ax = fig.axes[0]
    assert "2 nodes × 4 GPUs" in ax.get_title()
    assert "LOCAL_RANK" in ax.get_xlabel() and "NODE_RANK" in ax.get_ylabel()
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == 8
    assert "cuda:1\nRANK 5\nLOCAL_RANK 1\nNODE_RANK 1" in texts
    plt.close(fig)

"""Hidden checks for lesson 10 (beyond one machine). Never released; see lesson 1's for the form.

Every case draws its inputs at grading time (``Case.draw``). ``slurm_ranks``: task environments (srun's
variables, jobs of every shape, names, host lists, MASTER_ADDR), sent into the sandbox as plain data; the
judge compares the answer with ``reference_slurm_ranks``, the text's rule, which exists here only (tests/
test_beyond_one_machine.py holds it and the restatement of Lightning below equal to Lightning's real SLURMEnvironment on
every drawn environment). ``sbatch_for``: drawn shapes and commands; the scripts are read as sbatch and the
shells would run them (``gpucourse.checks.lesson10_beyond_one_machine.sbatch_problems``: where each variable is expanded, by the
batch shell once or by each task's shell).
"""

import re

from autograders.differential import call
from gpucourse.checks import Case, NotJudged
from gpucourse.checks.lesson10_beyond_one_machine import RANK_KEYS, judge_sbatch_all
from gpucourse.checks.values import rebuild, type_words
from gpucourse.beyond_one_machine import hostnames, srun_environments


def lightning_slurm_ranks(env: dict) -> dict | None:
    """What Lightning 2.6's SLURMEnvironment derives from a task's ``env``; None when it stays out.

    Mirrors ``lightning_fabric.plugins.environments.slurm``: detected when SLURM_NTASKS is set and the
    job is not named "bash" or "interactive"; ranks and world size are read, not computed; the main
    address is MASTER_ADDR if set, else the first host of SLURM_NODELIST. (tests/test_beyond_one_machine.py holds it
    equal to the real one, and to ``reference_slurm_ranks`` on every drawn environment.)
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


# What the exercise states, and the case that tests it (the public case: 2 x 4, interactive, no SLURM):
#  1. None when the env has no SLURM_NTASKS, whatever other SLURM_* it has   -> "no SLURM_NTASKS"
#  2. None for a job named exactly "bash" or "interactive"; any other name
#     (another case, spaces, a longer name), or none at all, is SLURM         -> "named bash or interactive"
#  3. global/local/node rank are SLURM_PROCID/LOCALID/NODEID, read (srun may
#     place tasks cyclically, or unevenly), as ints, of any size              -> "generated job shapes"
#  4. world_size is SLURM_NTASKS (not nodes x tasks per node), an int        -> "generated job shapes"
#  5. main_address is MASTER_ADDR when it is set (even empty)                -> "MASTER_ADDR"
#  6. else the first host hostnames() gives for SLURM_NODELIST (not
#     SLURM_JOB_NODELIST, not the host sorting first)                        -> "first host"
#  7. a dict with those keys, ints and a str                                 -> every case
# --- slurm_ranks: differential. Each case draws task environments at grading time (boundaries first, then
# random jobs); the sandbox calls the answer on each and the judge compares with the reference below.
# Not drawn (the text does not say what to do): SLURM_NTASKS set but SLURM_PROCID, SLURM_LOCALID or
# SLURM_NODEID missing, and a SLURM task with neither MASTER_ADDR nor SLURM_NODELIST.

def reference_slurm_ranks(env: dict) -> dict | None:
    """The text's rule: None without SLURM_NTASKS or for a job named exactly bash or interactive; else the ranks
    read as ints, and MASTER_ADDR if it is set, else the first host hostnames() gives for SLURM_NODELIST."""
    if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None
    address = env["MASTER_ADDR"] if "MASTER_ADDR" in env else hostnames(env["SLURM_NODELIST"])[0]
    return {"global_rank": int(env["SLURM_PROCID"]), "local_rank": int(env["SLURM_LOCALID"]),
            "node_rank": int(env["SLURM_NODEID"]), "world_size": int(env["SLURM_NTASKS"]), "main_address": address}


def _task(env) -> str:
    if not any(k.startswith("SLURM_") for k in env):
        return f"a process started without SLURM ({', '.join(sorted(env)) or 'no variables'})"
    name = f"named {env['SLURM_JOB_NAME']!r}" if "SLURM_JOB_NAME" in env else "without SLURM_JOB_NAME"
    nodes = f"SLURM_NODELIST={env['SLURM_NODELIST']!r}" if "SLURM_NODELIST" in env else "no SLURM_NODELIST"
    extra = "" if "SLURM_NTASKS" in env else ", no SLURM_NTASKS"
    extra += f", MASTER_ADDR={env['MASTER_ADDR']!r}" if "MASTER_ADDR" in env else ""
    return (f"task SLURM_PROCID={env.get('SLURM_PROCID')} of a {env.get('SLURM_NNODES', '?')}-node job {name} "
            f"({nodes}{extra})")


def judge_slurm_calls(observed, calls):
    if not isinstance(observed, list) or len(observed) != len(calls):
        return f"{len(observed) if isinstance(observed, list) else 'no'} outcomes for {len(calls)} calls"
    for spec, got in zip(calls, observed):
        env = rebuild(spec["args"])[0]
        want = reference_slurm_ranks(env)
        task = _task(env)
        if not isinstance(got, dict) or ("returned" in got) == ("raised" in got):
            return f"{task}: no outcome was reported"
        if "raised" in got:
            raised = got["raised"][0] if isinstance(got["raised"], list) and got["raised"] else "an exception"
            return f"{task}: raised {raised}"
        value = got["returned"]
        if want is None:
            if value is not None:
                return f"{task}: Lightning does not use SLURMEnvironment here, so return None (got {type_words(value)})"
            continue
        if not isinstance(value, dict) or "__dict__" not in value:
            return f"{task}: return a dict, got {type_words(value) if value is not None else 'None'}"
        pairs = {repr(k): v for k, v in value["__dict__"]}
        missing = [k for k in RANK_KEYS if repr(k) not in pairs]
        if missing:
            return f"{task}: missing keys {missing}"
        typed = [k for k in RANK_KEYS if k != "main_address" and type(pairs[repr(k)]) is not int]
        if typed:
            return f"{task}: {', '.join(f'{k} is {type_words(pairs[repr(k)])}' for k in typed)}: ranks and world size are ints"
        if type(pairs["'main_address'"]) is not str:
            return f"{task}: main_address is {type_words(pairs[repr('main_address')])}: it is a str"
        if pairs["'main_address'"] != want["main_address"]:
            return (f"{task}: main_address={pairs[repr('main_address')]!r} is not what Lightning derives"
                    " (MASTER_ADDR when it is set, else the first host of SLURM_NODELIST)")
        wrong = [k for k in RANK_KEYS if k != "main_address" and pairs[repr(k)] != want[k]]
        if wrong:
            return (f"{task}: {', '.join(f'{k}={pairs[repr(k)]!r}' for k in wrong)} is not what Lightning derives"
                    " (read what srun set rather than computing it)")
    return None


def observe_slurm_calls(ns, calls):
    from gpucourse.checks import observe_calls

    return observe_calls(ns, "slurm_ranks", calls)


def _job(rng, nodes, per_node, **options):
    options.setdefault("numbers", sorted(rng.sample(range(0, 1000), nodes)))
    options.setdefault("job_id", rng.randint(1, 10**8))
    return srun_environments(nodes, per_node, **options)


def _pick(rng, envs, count):
    """Some tasks of a job (its first and last always): the rest of the job is the same."""
    chosen = {0, len(envs) - 1} | set(rng.sample(range(len(envs)), min(count, len(envs))))
    return [envs[i] for i in sorted(chosen)]


def _changed(env, **changes):
    """``env`` with ``changes`` (None removes a variable)."""
    return {k: v for k, v in {**env, **changes}.items() if v is not None}


def draw_no_ntasks(rng):
    """No SLURM_NTASKS: None, whatever else is set (SLURM_PROCID, SLURM_NNODES, SLURM_NPROCS, MASTER_ADDR,
    torchrun's RANK...), and an empty environment."""
    calls = [call({}), call({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}),
             call({"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NODELIST": "gpu001", "SLURM_PROCID": "0",
                   "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "1"})]
    for _ in range(4):
        job = _job(rng, rng.randint(1, 4), rng.randint(1, 4), distribution=rng.choice(["block", "cyclic"]))
        keep_nprocs = rng.random() < 0.5
        calls += [call(_changed(env, SLURM_NTASKS=None, SLURM_NPROCS=env["SLURM_NPROCS"] if keep_nprocs else None,
                                MASTER_ADDR=rng.choice([None, "10.0.0.1"]))) for env in _pick(rng, job, 3)]
    return calls


def draw_names(rng):
    """Exactly "bash" or "interactive": None; any other name (Bash, INTERACTIVE, "bash ", bash_train,
    interactive-eval, an empty name) or none at all: a SLURM task."""
    names = ["bash", "interactive", "Bash", "INTERACTIVE", "bash ", " interactive", "bash_train", "interactive-eval",
             "mybash", "", "train", None, "sh", "bash.sh"]
    calls = []
    for name in names:
        job = _job(rng, rng.randint(1, 3), rng.randint(1, 4), job_name=name if name is not None else "x",
                   distribution=rng.choice(["block", "cyclic"]))
        calls += [call(_changed(env, SLURM_JOB_NAME=name)) for env in _pick(rng, job, 2)]
    return calls


def draw_shapes(rng):
    """Ranks read, not computed: 1 task (with and without SLURM_NTASKS_PER_NODE), 1 x 8, 3 x 2 and 5 x 1 cyclic,
    tasks spread unevenly over the nodes (--ntasks=5 --ntasks-per-node=3 on 2 nodes), integers above 2**53; then
    random jobs of 1 to 6 nodes."""
    calls = [call(env) for env in _job(rng, 1, 1, job_name="single")]
    calls += [call(env) for env in _job(rng, 1, 8, prefix="a100-")]
    calls += [call(env) for env in _job(rng, 3, 2, prefix="node", distribution="cyclic")]
    calls += [call(env) for env in _job(rng, 5, 1, distribution="cyclic")]
    uneven = _job(rng, 2, 3)[:5]  # srun --ntasks=5 --ntasks-per-node=3 on 2 nodes: 3 tasks and 2
    calls += [call(_changed(env, SLURM_NTASKS="5", SLURM_NPROCS="5", SLURM_TASKS_PER_NODE="3,2")) for env in uneven]
    calls += [call(_changed(env, SLURM_NTASKS_PER_NODE=None)) for env in _job(rng, 1, 1)]  # srun -n 1
    big = 2**53 + rng.randint(1, 10**6)
    calls.append(call(_changed(_job(rng, 2, 2)[3], SLURM_PROCID=str(big), SLURM_NTASKS=str(big + 1),
                               SLURM_LOCALID=str(2**53 + 1), SLURM_NODEID=str(2**60 + 3))))
    for _ in range(6):
        job = _job(rng, rng.randint(1, 6), rng.choice([1, 2, 3, 4, 6, 8]), prefix=rng.choice(["gpu", "node", "a100-", "cn", "hpc-g"]),
                   job_name=rng.choice(["train", "fit", "pretrain-lm", "bashful"]), distribution=rng.choice(["block", "cyclic"]))
        calls += [call(env) for env in _pick(rng, job, 4)]
    return calls


def draw_master_addr(rng):
    """MASTER_ADDR, when set, is the main address (an IP, a long name, an empty string, with or without
    SLURM_NODELIST), whatever SLURM_NODELIST says."""
    calls = []
    for address in ["10.0.0.5", "login-3.cluster.example", "", "gpu999", f"192.168.{rng.randint(0, 255)}.{rng.randint(1, 254)}"]:
        job = _job(rng, rng.randint(1, 4), rng.randint(1, 4), distribution=rng.choice(["block", "cyclic"]))
        drop = rng.random() < 0.4
        calls += [call(_changed(env, MASTER_ADDR=address, SLURM_NODELIST=None if drop else env["SLURM_NODELIST"],
                                SLURM_JOB_NODELIST=None if drop else env["SLURM_JOB_NODELIST"])) for env in _pick(rng, job, 2)]
    return calls


def _nodelist(rng):
    """A SLURM host list of every form: one host, ranges with and without zero padding, lists in brackets,
    several groups, hosts with dashes, a first host that does not sort first."""
    prefix = rng.choice(["gpu", "node", "cn-a", "hpc-g", "a100-", "x"])
    width = rng.choice([1, 2, 3, 4])
    start = rng.randint(0, 120)
    form = rng.randrange(5)
    if form == 0:
        return f"{prefix}{start:0{width}d}"
    if form == 1:
        return f"{prefix}[{start:0{width}d}-{start + rng.randint(1, 20):0{width}d}]"
    if form == 2:
        a, b = start, start + rng.randint(1, 5)
        return f"{prefix}[{a:0{width}d},{b:0{width}d}-{b + rng.randint(1, 4):0{width}d}]"
    if form == 3:
        return f"{prefix}[{start:0{width}d}-{start + 1:0{width}d}],login-{rng.randint(1, 9)},gpu[{rng.randint(1, 9)}-{rng.randint(10, 20)}]"
    return f"zz-{rng.randint(1, 99)},{prefix}{start:0{width}d}"


def draw_first_hosts(rng):
    """The first host of SLURM_NODELIST: gpu[017-018], node[003,007-009], cn-a1,cn-b7, gpu[8-10], one host,
    several groups, a first host that does not sort first; SLURM_JOB_NODELIST absent or different."""
    lists = ["gpu[017-018]", "node[003,007-009]", "cn-a1,cn-b7", "gpu[8-10]", "gpu005", "login-2,gpu[100-101]",
             "a100-[05-06],b[1-2]", "zeta9,alpha1", "hpc-g[098-099]", "n[9-11],m[01-02]"]
    lists += [_nodelist(rng) for _ in range(8)]
    calls = []
    for nodelist in lists:
        job = _job(rng, rng.randint(1, 3), rng.randint(1, 3), distribution=rng.choice(["block", "cyclic"]))
        other = rng.choice([None, "other[001-004]", nodelist])
        calls += [call(_changed(env, SLURM_NODELIST=nodelist, SLURM_JOB_NODELIST=other)) for env in _pick(rng, job, 1)]
    return calls


HIDDEN = {"slurm_ranks": [
    Case("no SLURM_NTASKS: None, whatever other SLURM_* variables are set", observe_slurm_calls, judge_slurm_calls,
         draw=draw_no_ntasks),
    Case("a job named bash or interactive: None; any other name, or none, is a SLURM task", observe_slurm_calls,
         judge_slurm_calls, draw=draw_names),
    Case("generated job shapes (1-6 nodes, block and cyclic placement, uneven, integers above 2**53): ranks read "
         "from srun's variables", observe_slurm_calls, judge_slurm_calls, draw=draw_shapes),
    Case("MASTER_ADDR, when set, is the main address, even empty, even without SLURM_NODELIST", observe_slurm_calls,
         judge_slurm_calls, draw=draw_master_addr),
    Case("main address: the first host of each form of SLURM_NODELIST", observe_slurm_calls, judge_slurm_calls,
         draw=draw_first_hosts),
]}


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
#     --ntasks agree                                                          -> "tasks per node"
#  6. GPUs requested per node: --gres=gpu[:type]:N or --gpus-per-node=N, not
#     --gpus (the whole job), nor --gpus-per-task on top (G for each task)    -> "GPUs per node"
#  7. the command (any command, with its arguments) is launched by srun, as
#     given, after the #SBATCH lines; other options are free                  -> "launched by srun"
#  8. "one torchrun task per node that starts one worker per GPU" on several nodes: each node's torchrun
#     its own node rank under a static rendezvous. The script is read as the shells would run it: the batch
#     shell runs once, on the first node, and expands what is unquoted or in double quotes there (SLURM_NODEID
#     is 0 in it); only a shell each task runs (srun bash -c '...', in single quotes) sees each task's own
#     SLURM_NODEID                                                            -> "each node's torchrun its own node rank"
#  9. the rendezvous (section 5): every node's torchrun is given one host, the first node of the allocation,
#     as the shells expand it: not localhost (each node itself), not the compressed node list, not each
#     node's own name ($(hostname) in srun bash -c '...'), not a variable the tasks' shells see empty (set
#     without export, or never set)                                           -> "one rendezvous host"
#  (7 also: "srun ... &" with nothing waiting for it ends the job at once; 5 also: SLURM_GPUS_PER_NODE is
#   set only by --gpus-per-node, empty with --gres; a backslash followed by a blank does not continue a line)
# Inputs are drawn at grading time: 1 x 1, 2 x 3 and 3 x 2 (nodes and GPUs swapped), 2 x 1 and 1 x 2, 16 x 4,
# 4 x 8, then random shapes (1 to 64 nodes, 1 to 8 GPUs) and commands (python, python3, -u, -m, arguments).

COMMANDS = ["python train.py", "python3 main.py fit --trainer.max_epochs=3", "python finetune.py --seed 7",
            "python -m experiments.run --epochs 20", "python cli.py fit -c configs/unet.yaml", "python -u train.py --config big.yaml",
            "python -m lab.fit --lr 3e-4", "python3 -u scripts/pretrain.py --data /scratch/data --batch-size 64",
            "python train.py --max-epochs 5", "python pretrain.py"]


def draw_requests(rng):
    shapes = [(1, 1), (2, 3), (3, 2), (2, 1), (1, 2), (16, 4), (4, 8)]
    shapes += [(rng.randint(1, 64), rng.choice([1, 2, 3, 4, 6, 8])) for _ in range(5)]
    return [{"nodes": nodes, "gpus": gpus, "command": rng.choice(COMMANDS)} for nodes, gpus in shapes]


def observe_sbatch_requests(ns, requests):
    from gpucourse.checks.lesson10_beyond_one_machine import observe_sbatch_for

    return observe_sbatch_for(ns, requests)


def sbatch_judge(clauses):
    def judge(texts, requests):
        return judge_sbatch_all(requests, texts, clauses)
    return judge


# --- sbatch_for, run: the script submitted to a real Slurm cluster of 2 emulated nodes with 2 GPUs each
# (gpucourse.local_slurm, when one is up: `make cluster`), its command a probe that records what each process
# was started with (autograders/slurm_jobs.py). Judged from outside: sbatch's answer, the job's final state
# and exit code from Slurm, and the processes' reports read as Lightning reads them (TorchElastic first,
# then SLURM, with the checks Lightning makes at launch). Without a cluster the same scripts are judged on
# their text (tests/test_local_slurm.py holds both judgements equal on every fixture).

RUN_COMMANDS = ["python train.py", "python train.py --max-epochs 3", "python -u train.py --seed 7",
                "python3 train.py --lr 3e-4 --name run-a"]


def draw_run(rng):
    from gpucourse.local_slurm import GPUS_PER_NODE, NODES

    return [{"nodes": len(NODES), "gpus": GPUS_PER_NODE, "command": rng.choice(RUN_COMMANDS)}]


def lightning_launch_view(env: dict, devices: int, num_nodes: int) -> dict:
    """The ranks Lightning derives in a process started with ``env`` for ``Trainer(devices, num_nodes)``, or
    {"error": ...}: TorchElasticEnvironment when TORCHELASTIC_RUN_ID is set (torchrun), else SLURMEnvironment
    when srun launched it (with ``_validate_srun_variables`` and ``validate_settings``), else one process.
    (tests/test_local_slurm.py holds it equal to Lightning's own environments.)"""
    if "TORCHELASTIC_RUN_ID" in env:
        try:
            return {"kind": "torchrun", "global_rank": int(env["RANK"]), "local_rank": int(env["LOCAL_RANK"]),
                    "node_rank": int(env["GROUP_RANK"]), "world_size": int(env["WORLD_SIZE"])}
        except (KeyError, ValueError) as error:
            return {"error": f"torchrun's variables are incomplete ({error})"}
    ranks = lightning_slurm_ranks(env)
    if ranks is None:
        return {"kind": "none", "global_rank": 0, "local_rank": 0, "node_rank": 0, "world_size": 1}
    ntasks = int(env.get("SLURM_NTASKS", "1"))
    if ntasks > 1 and "SLURM_NTASKS_PER_NODE" not in env:
        return {"error": f"Lightning refuses --ntasks={ntasks} without --ntasks-per-node (srun set no SLURM_NTASKS_PER_NODE)"}
    per_node, nnodes = env.get("SLURM_NTASKS_PER_NODE"), env.get("SLURM_NNODES")
    if per_node is not None and int(per_node) != devices:
        return {"error": f"SLURM_NTASKS_PER_NODE={per_node} but Trainer(devices={devices}): Lightning stops at launch"}
    if nnodes is not None and int(nnodes) != num_nodes:
        return {"error": f"SLURM_NNODES={nnodes} but Trainer(num_nodes={num_nodes}): Lightning stops at launch"}
    return {"kind": "slurm", **{k: ranks[k] for k in ("global_rank", "local_rank", "node_rank", "world_size")}}


def _arguments(command: str) -> list[str] | None:
    """What the probe's sys.argv[1:] must be when ``command`` (python [flags] train.py ARGS) runs it."""
    import shlex

    words = shlex.split(command)[1:]
    while words and words[0].startswith("-"):
        words = words[1:]
    return words[1:]


def judge_run(request: dict, result: dict) -> str | None:
    """What is wrong with a job (``autograders.slurm_jobs.run_script``'s data) that should have run
    ``request["command"]`` as one process per GPU on every node, as one Lightning job; None if nothing."""
    nodes, gpus = request["nodes"], request["gpus"]
    want = nodes * gpus
    where = f"on the {nodes}-node cluster ({gpus} GPUs per node)"
    if result.get("infrastructure"):  # Slurm's own failure on every try: nothing here judges the script
        raise NotJudged(f"the local Slurm cluster failed, not the script: {result['infrastructure']}")
    if not result.get("submitted"):
        return f"sbatch refused the script {where}: {result.get('error')}"
    if result.get("state") != "COMPLETED" or result.get("exit_code") != "0:0":
        last = [line for line in result.get("output", "").splitlines() if line.strip()][-2:]
        return (f"the job ended {result.get('state')} (exit code {result.get('exit_code')}) {where}"
                + (f": {' | '.join(last)}" if last else ""))
    reports = result.get("reports", [])
    if len(reports) != want:
        return (f"{len(reports)} process(es) ran the command {where}: {nodes} nodes × {gpus} GPUs is {want},"
                " one per GPU")
    arguments = _arguments(request["command"])
    for report in reports:
        if report.get("argv") != arguments:
            return f"a process ran with the arguments {report.get('argv')}, not {arguments}: run the command as given"
    views, hosts = [], {}
    for report in reports:
        view = lightning_launch_view(report.get("env", {}), gpus, nodes)
        if "error" in view:
            return f"{where}: {view['error']}"
        views.append(view)
        hosts.setdefault(report.get("env", {}).get("SLURMD_NODENAME", "?"), []).append(view)
    if {v["world_size"] for v in views} != {want}:
        return f"Lightning's world sizes are {sorted({v['world_size'] for v in views})}, not {want}"
    if sorted(v["global_rank"] for v in views) != list(range(want)):
        return f"global ranks {sorted(v['global_rank'] for v in views)}: each of 0..{want - 1} once"
    if len(hosts) != nodes or any(len(on) != gpus for on in hosts.values()):
        return f"processes per node {dict(sorted((h, len(on)) for h, on in hosts.items()))}: {gpus} on each of {nodes}"
    for host, on in hosts.items():
        if sorted(v["local_rank"] for v in on) != list(range(gpus)) or len({v["node_rank"] for v in on}) != 1:
            return f"on {host}: local ranks {sorted(v['local_rank'] for v in on)} and node ranks" \
                   f" {sorted({v['node_rank'] for v in on})}: 0..{gpus - 1}, one node rank"
    if sorted(on[0]["node_rank"] for on in hosts.values()) != list(range(nodes)):
        return f"node ranks {sorted(on[0]['node_rank'] for on in hosts.values())}: each node its own"
    return None


def slurm_judging() -> bool:
    """Judge by running when the local cluster is up (GPUCOURSE_SLURM_JUDGE=0 turns it off)."""
    import os

    from gpucourse import local_slurm

    return os.environ.get("GPUCOURSE_SLURM_JUDGE", "1") != "0" and local_slurm.is_up()


def judge_by_running(texts, requests):
    """Run each script on the local cluster and judge the job; without one, judge its text."""
    if not slurm_judging():
        return judge_sbatch_all(requests, texts)
    from autograders.slurm_jobs import run_script

    if not isinstance(texts, list) or len(texts) != len(requests):
        return "one script per request"
    for request, text in zip(requests, texts):
        if text.startswith("<a "):
            return f"return the script's text (a str), got {text[1:-1]}"
        verdict = judge_run(request, run_script(text))
        if verdict:
            return verdict
    return None


HIDDEN["sbatch_for"] = [
    Case("returns the script's text, its first line an interpreter line", observe_sbatch_requests,
         sbatch_judge({"interpreter"}), draw=draw_requests),
    Case("--nodes is the number of nodes, in #SBATCH lines before the first command", observe_sbatch_requests,
         sbatch_judge({"nodes"}), draw=draw_requests),
    Case("tasks per node: srun starts one task per GPU (one torchrun per node)", observe_sbatch_requests,
         sbatch_judge({"tasks"}), draw=draw_requests),
    Case("GPUs requested per node, not for the whole job", observe_sbatch_requests, sbatch_judge({"gpus"}),
         draw=draw_requests),
    Case("the command is launched by srun, as given, on other shapes and commands", observe_sbatch_requests,
         sbatch_judge({"launch"}), draw=draw_requests),
    Case("each node's torchrun its own node rank, expanded by each task's shell, not once by the batch shell",
         observe_sbatch_requests, sbatch_judge({"ranks"}), draw=draw_requests),
    Case("submitted to a 2-node Slurm cluster: one process per GPU runs the command, one Lightning job "
         "(judged on the text where no cluster is up)", observe_sbatch_requests, judge_by_running, draw=draw_run),
    Case("one rendezvous host for the torchruns of all nodes, the first node of the allocation, as the shells "
         "expand it", observe_sbatch_requests, sbatch_judge({"rendezvous"}), draw=draw_requests),
]

PUBLIC_RANKS = "every task of a 2-node × 4-GPU job, an interactive shell, no SLURM at all"
PUBLIC_SBATCH = "2 nodes × 4 GPUs and 1 node × 2 GPUs, read as sbatch reads them"
_R, _S = [c.name for c in HIDDEN["slurm_ranks"]], [c.name for c in HIDDEN["sbatch_for"]]
CLAUSES = {
    "slurm_ranks": {
        "None when the env has no SLURM_NTASKS": [PUBLIC_RANKS, _R[0]],
        "None for a job named exactly bash or interactive; any other name, or none, is a SLURM launch": [PUBLIC_RANKS, _R[1]],
        "global_rank, local_rank, node_rank as Lightning reads them (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID), ints":
            [PUBLIC_RANKS, _R[2]],
        "world_size is SLURM_NTASKS, an int": [PUBLIC_RANKS, _R[2]],
        "main_address is MASTER_ADDR if it is set": [_R[3]],
        "else the first host of SLURM_NODELIST, as hostnames() expands it": [PUBLIC_RANKS, _R[4]],
        "a dict with the ints global_rank, local_rank, node_rank, world_size and the str main_address":
            [PUBLIC_RANKS, _R[2], _R[3]],
    },
    "sbatch_for": {
        "returns the text of the script, a str": [PUBLIC_SBATCH, _S[0]],
        "an interpreter line first": [PUBLIC_SBATCH, _S[0]],
        "#SBATCH options (long, --opt value, short forms) before the first command": [PUBLIC_SBATCH, _S[1]],
        "--nodes is nodes (Trainer(num_nodes=nodes))": [PUBLIC_SBATCH, _S[1]],
        "GPUs requested per node with --gres=gpu:N or --gpus-per-node=N": [PUBLIC_SBATCH, _S[3]],
        "the command launched by srun, exactly as given": [PUBLIC_SBATCH, _S[4], _S[6]],
        "one task per GPU that runs it (Trainer(devices=gpus_per_node))": [PUBLIC_SBATCH, _S[2]],
        "or one torchrun task per node that starts one worker per GPU": [_S[2], _S[4]],
        "several nodes under torchrun: each node's torchrun knows its own node (as the shells would expand it)":
            [PUBLIC_SBATCH, _S[5], _S[6]],
        "a rendezvous on the first node of the allocation (section 5), one host for every node's torchrun":
            [PUBLIC_SBATCH, _S[7], _S[6]],
    },
}

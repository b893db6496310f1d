"""Public checks for lesson 10 (beyond one machine). Observers are self-contained: see lesson01_processes_threads.py.

``slurm_ranks`` is judged against what Lightning's ``SLURMEnvironment`` derives. The public case states
those values from the job's shape (task t of a 2-node x 4-GPU job is global rank t, local rank t % 4,
node t // 4); the grader's own cases compare with Lightning's rules, which are not in this package.
``sbatch_for`` is judged by parsing the script as ``sbatch`` would (:func:`parse_sbatch`), and its launch
line as ``srun`` and ``torchrun`` would: how many tasks each node runs, and that they run the command given
(:func:`sbatch_problems`, one clause of the exercise per kind of problem).
"""

from __future__ import annotations

import os
import re
import shlex

from gpucourse.checks import Answer, Case, register
from gpucourse.checks.sbatch_shells import (ALIASES, SHORT, SRUN_FLAGS, TORCHRUN_FLAGS, UNKNOWN, _python_args, _split_options,
                                            launched_torchruns, program_of, rendezvous_hosts, rendezvous_problem,
                                            script_steps)

ASSIGNMENT = "lesson10_beyond_one_machine"  # the course folder this module's exercises belong to

RANK_KEYS = ("global_rank", "local_rank", "node_rank", "world_size", "main_address")


def build_jobs(jobs: list) -> list[dict]:
    """Task environments for ``[(nodes, tasks_per_node, srun_environments kwargs, extra variables)]``."""
    from gpucourse.beyond_one_machine import srun_environments

    return [{k: v for k, v in {**env, **extra}.items() if v is not None}  # None in extra: a variable srun left out
            for nodes, per_node, options, extra in jobs for env in srun_environments(nodes, per_node, **options)]


def observe_ranks_for(ns, jobs, plain_extra=()):
    """Call ``slurm_ranks`` on a copy of every task's env; return the envs and what came back, as data."""
    from gpucourse.checks import answer
    from gpucourse.checks.lesson10_beyond_one_machine import build_jobs

    envs = build_jobs(jobs) + [dict(e) for e in plain_extra]
    results = []
    for env in envs:
        got = answer(ns, "slurm_ranks")(dict(env))
        if got is None:
            results.append(None)
        elif isinstance(got, dict):
            results.append({str(k): v if type(v) in (int, str) else f"{type(v).__name__} {v!r}" for k, v in got.items()})
        else:
            results.append(f"a {type(got).__name__}")
    return {"envs": envs, "results": results}


def judge_ranks(expected_envs: list[dict], wants: list[dict | None], data) -> str | None:
    """Compare ``slurm_ranks``' results with Lightning's (``wants``, one per task); the first difference, or None."""
    if data["envs"] != expected_envs:
        return "the tasks' environments were changed while checking"
    for env, want, got in zip(expected_envs, wants, data["results"]):
        task = (f"task SLURM_PROCID={env.get('SLURM_PROCID')} of a {env.get('SLURM_NNODES')}-node job"
                f" named {env.get('SLURM_JOB_NAME')!r}" if env else "a process started without SLURM")
        if want is None:
            if got is not None:
                return f"{task}: Lightning does not use SLURMEnvironment here, so return None (got {got})"
            continue
        if not isinstance(got, dict):
            return f"{task}: return a dict, got {got if got is not None else 'None'}"
        missing = [k for k in RANK_KEYS if k not in got]
        if missing:
            return f"{task}: missing keys {missing}"
        wrong = [k for k in RANK_KEYS if got[k] != want[k]]
        typed = [k for k in wrong if k != "main_address" and not isinstance(got[k], int)]
        if typed:
            return f"{task}: {', '.join(f'{k}={got[k]!r}' for k in typed)}: ranks and world size are ints"
        if "main_address" in wrong:
            return (f"{task}: main_address={got['main_address']!r} is not what Lightning derives"
                    " (MASTER_ADDR when it is set, else the first host of SLURM_NODELIST)")
        if wrong:
            return (f"{task}: {', '.join(f'{k}={got[k]!r}' for k in wrong)} is not what Lightning derives"
                    " (read what srun set rather than computing it)")
    return None


PUBLIC_RANK_JOBS = [(2, 4, {}, {})]  # every task of a 2-node × 4-GPU job ("gpu[017-018]")
INTERACTIVE_SHELL = {"SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "interactive", "SLURM_NTASKS": "1", "SLURM_NNODES": "1",
                     "SLURM_NTASKS_PER_NODE": "1", "SLURM_NODELIST": "gpu017", "SLURM_PROCID": "0",
                     "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}  # srun --pty --job-name interactive bash


def observe_ranks_public(ns):
    from gpucourse.checks.lesson10_beyond_one_machine import INTERACTIVE_SHELL, PUBLIC_RANK_JOBS, observe_ranks_for

    return observe_ranks_for(ns, PUBLIC_RANK_JOBS, plain_extra=[INTERACTIVE_SHELL, {}])


# What Lightning derives for each public task: ranks from the job's shape, the first host as main address;
# an interactive shell and a process started without SLURM are left to other environments (None).
PUBLIC_RANK_WANTS = [{"global_rank": t, "local_rank": t % 4, "node_rank": t // 4, "world_size": 8,
                      "main_address": "gpu017"} for t in range(8)] + [None, None]


def _judge_ranks_public(data):
    return judge_ranks(build_jobs(PUBLIC_RANK_JOBS) + [INTERACTIVE_SHELL, {}], PUBLIC_RANK_WANTS, data)


register("slurm_ranks", Case("every task of a 2-node × 4-GPU job, an interactive shell, no SLURM at all",
                             observe_ranks_public, _judge_ranks_public),
         answers=[Answer("slurm_ranks", "function",
                         'a function slurm_ranks(env) returning None or a dict with the ints "global_rank", '
                         '"local_rank", "node_rank", "world_size" and the str "main_address"')], points=2)


# --- Exercise 2: sbatch_for ---------------------------------------------------------------


def _options(tokens: list[str]) -> dict[str, str]:
    """``--opt=v``, ``--opt v``, ``-N 2``, ``-N2`` and flags, as {long name: value ("" for a flag)}."""
    found, i = {}, 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("#"):  # a comment after the options
            break
        if token.startswith("--"):
            name, eq, value = token[2:].partition("=")
            if not eq and i + 1 < len(tokens) and not tokens[i + 1].startswith(("-", "#")):
                value, i = tokens[i + 1], i + 1
            found[ALIASES.get(name, name)] = value
        elif token.startswith("-") and len(token) >= 2:
            name, value = SHORT.get(token[1], token[1]), token[2:].lstrip("=")
            if not value and i + 1 < len(tokens) and not tokens[i + 1].startswith(("-", "#")):
                value, i = tokens[i + 1], i + 1
            found[name] = value
        i += 1
    return found


def parse_sbatch(text: str) -> dict:
    """An sbatch script as sbatch reads it: shebang, the ``#SBATCH`` options before the first command, the body.

    sbatch stops reading ``#SBATCH`` lines at the first line that is neither blank nor a comment. Lines of
    the body continued with a backslash are joined, as the shell reads them: only a backslash that ends the
    line continues it (after "\\ " the line ends, the backslash escaping the space: that line keeps its blank).
    """
    lines = text.splitlines()
    options, body, in_header, continued = {}, [], True, False
    for line in lines[1:] if lines and lines[0].startswith("#!") else lines:
        stripped = line.strip()
        if in_header and (not stripped or stripped.startswith("#")):
            if line.startswith("#SBATCH"):
                try:
                    options.update(_options(shlex.split(line[len("#SBATCH"):], comments=False)))
                except ValueError:
                    options["unparsable"] = line
            continue
        in_header = False
        ends_line = (len(line) - len(line.rstrip("\\"))) % 2 == 1  # an odd run of backslashes: the last escapes the newline
        if stripped.endswith("\\") and not ends_line:
            stripped = line.lstrip()  # "\\ " at the end: an escaped blank, a word of its own; the line ends there
        if continued and body:
            body[-1] = body[-1][:-1].rstrip() + " " + stripped
        elif stripped and not stripped.startswith("#"):
            body.append(stripped)
        else:
            ends_line = False  # a blank line or a comment continues nothing
        continued = ends_line
    return {"shebang": bool(lines) and lines[0].startswith("#!"), "options": options, "body": body}


def _per_node_gpus(options: dict) -> tuple[int | None, str | None]:
    """GPUs per node from --gres=gpu[:type]:N or --gpus-per-node=[type:]N; (count, problem)."""
    counts = []
    for gres in options.get("gres", "").split(","):
        parts = gres.split(":")
        if parts[0] == "gpu":
            counts.append(int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1)
    if "gpus-per-node" in options:
        value = options["gpus-per-node"].split(":")[-1]
        counts.append(int(value) if value.isdigit() else -1)
    if "gpus" in options:
        return None, "--gpus/-G asks for GPUs for the whole job, not per node: ask per node"
    if not counts:
        return None, "no GPUs requested per node (--gres=gpu:N or --gpus-per-node=N)"
    if "gpus-per-task" in options:  # G for each task: G × the tasks on a node, on top of the per-node request
        value, tasks = options["gpus-per-task"].split(":")[-1], options.get("ntasks-per-node", "1")
        if not (value.isdigit() and tasks.isdigit()) or int(value) * int(tasks) != counts[0]:
            return None, (f"--gpus-per-task={options['gpus-per-task']} asks GPUs for each of the {tasks} task(s) on a"
                          f" node, on top of {counts[0]} per node: ask per node only")
    if len(set(counts)) > 1:
        return None, f"GPU requests disagree: {counts}"
    return counts[0], None


def _split(line: str) -> list[str] | None:
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return None


def _contains(words: list[str], part: list[str]) -> bool:
    return any(words[i:i + len(part)] == part for i in range(len(words) - len(part) + 1))


def _readable(value) -> str:
    """An option's value as a message shows it: what the model cannot know (a command's output) as "?"."""
    return repr(value.replace(UNKNOWN, "?")) if isinstance(value, str) else repr(value)


def _launch(step: dict, command: list[str], nodes: int, gpus: int) -> dict:
    """How ``step`` (a command of the script, :func:`script_steps`) that runs ``command`` launches it:
    {"srun": srun's options, "kind", "problem"}. ``kind`` is "torchrun" when srun starts torchrun (directly, or
    inside ``bash -c '...'``), which then starts the workers, and "lightning" when srun starts the command itself
    (directly or in ``bash -c``)."""
    words = step["argv"]
    if os.path.basename(words[0]) != "srun":
        return {"kind": "once", "srun": {}, "problem": "runs once, on the first node only: launch it with srun"}
    srun, program = _split_options(words[1:], SRUN_FLAGS)
    program = program_of(program)
    if program[:len(command)] == command:
        return {"kind": "lightning", "srun": srun, "problem": None}
    torchruns = launched_torchruns(step, nodes)
    if step["tasks"] is not None:
        if torchruns:  # bash -c 'torchrun ... --node-rank=$SLURM_NODEID ...': torchrun launches, per node
            return _torchrun(torchruns, command, nodes, gpus, srun, in_task_shell=program[program.index("-c") + 1])
        runs = any(c[:len(command)] == command for c in step["tasks"][0])
        return {"kind": "lightning", "srun": srun,
                "problem": None if runs else "bash -c does not run the command as given"}
    if not torchruns:
        shown = " ".join(program[:len(command) + 1])
        return {"kind": "lightning", "srun": srun,
                "problem": f"srun must start the command itself, as given; this line starts {shown!r}"}
    return _torchrun(torchruns, command, nodes, gpus, srun, in_task_shell=None)


def _torchrun(per_node: list[list[str]], command: list[str], nodes: int, gpus: int, srun: dict,
              in_task_shell: str | None) -> dict:
    """A torchrun launch of ``command``: ``per_node``, the torchrun command line each node runs (it starts with
    torchrun or python -m torch.distributed.run); ``in_task_shell``: the text of the shell each task runs
    (srun bash -c '...'), which expands the task's own variables, None when srun starts torchrun itself."""
    program = per_node[0]
    options, script = _split_options(program[1 if program[0].endswith("torchrun") else 3:], TORCHRUN_FLAGS)
    after_python = _python_args(command)
    if "no-python" in options:
        wanted = command
    elif after_python is not None and ("module" in options or "m" in options):
        wanted = after_python[1:] if after_python[:1] == ["-m"] else None
    else:
        wanted = after_python if after_python is not None and after_python[:1] != ["-m"] else None
    problems = []
    if wanted is None or script[:len(wanted)] != wanted:
        problems.append("torchrun does not start the command as given (it runs python itself: give it the"
                        " script and its arguments, or --no-python and the whole command)")
    if options.get("nnodes") not in (str(nodes), f"{nodes}:{nodes}"):
        problems.append(f"torchrun --nnodes is {_readable(options.get('nnodes'))}; it must be the number of nodes")
    if options.get("nproc-per-node") not in (str(gpus), "gpu", "auto"):
        problems.append(f"torchrun --nproc-per-node is {_readable(options.get('nproc-per-node'))}: one worker per GPU")
    # a rendezvous named, even where its host is wrong or empty (judged with the clause "rendezvous")
    rendezvous = ("rdzv-endpoint" in options and options.get("rdzv-backend", "static") != "static") or (
        "master-addr" in options and "node-rank" in options)
    if nodes > 1 and ("standalone" in options or not rendezvous):
        problems.append("the torchruns of different nodes never meet: give them a rendezvous on one node"
                        " (--rdzv-backend=c10d --rdzv-endpoint=<first node>:<port>)")
    static = not ("rdzv-endpoint" in options and options.get("rdzv-backend", "static") != "static")
    rank_problem = None
    if nodes > 1 and static and "node-rank" in options and "standalone" not in options:
        rank_problem = _node_rank_problem(per_node, in_task_shell)
    return {"kind": "torchrun", "srun": srun, "problem": problems[0] if problems else None, "rank_problem": rank_problem}


def _node_rank_problem(per_node: list[list[str]], in_task_shell: str | None) -> str | None:
    """What is wrong with the --node-rank each node's torchrun receives (as the shells expanded it), or None.
    ``in_task_shell``: the text of the shell each task runs, as the batch shell passed it on (None: no such shell)."""
    values = [_split_options(argv[1 if argv[0].endswith("torchrun") else 3:], TORCHRUN_FLAGS)[0].get("node-rank", "")
              for argv in per_node]
    if any(UNKNOWN in value for value in values) or values == [str(k) for k in range(len(values))]:
        return None  # what the model cannot know is not judged
    if "$" in values[0] and in_task_shell is None:
        return (f"srun hands torchrun --node-rank={values[0]} as it is: no shell of the task expands it; "
                "start torchrun from a shell each task runs (srun bash -c '...')")
    if len(set(values)) == 1:
        if values[0] == "":
            return ("every node's torchrun gets an empty --node-rank: the batch shell expands variables once, on the "
                    "first node, and passes the tasks only what it exports; let each task's own shell expand "
                    "$SLURM_NODEID (srun bash -c '...', the variable in single quotes)")
        words = "".join(re.findall(r"node[-_]rank[= ]+(\S+)", in_task_shell or ""))
        if "$" in words and "SLURM_" in words:  # each task's shell expanded srun's variable: the same on every node
            return (f"every node's torchrun gets --node-rank={values[0]}: that value is the same on every node; node k's "
                    "must be k ($SLURM_NODEID, expanded by each task's shell)")
        return (f"every node's torchrun gets --node-rank={values[0]}: the batch shell expands variables once, on the "
                "first node, before srun starts the tasks (there SLURM_NODEID is 0); let each task's own shell expand "
                "$SLURM_NODEID (srun bash -c '...', the variable in single quotes)")
    return (f"the nodes' torchruns get --node-rank {', '.join(values[:3])}{', ...' if len(values) > 3 else ''}: "
            "node k's must be k ($SLURM_NODEID, expanded by each task's shell)")


def sbatch_problems(request: dict, text) -> list[tuple[str, str]]:
    """Everything wrong with ``text`` as an sbatch script for a Lightning job on ``request`` = {nodes, gpus,
    command}, as (clause, message): clauses "text", "interpreter", "nodes", "tasks", "gpus", "launch",
    "rendezvous" (the torchruns of all nodes given one host, the first node, as the shells expand it), "ranks"
    (each node's torchrun its own node rank, expanded where each task runs). The body is read by one model of
    the shells (:func:`gpucourse.checks.sbatch_shells.script_steps`)."""
    if text.startswith("<a "):
        return [("text", f"return the script's text (a str), got {text[1:-1]}")]
    nodes, gpus, command = request["nodes"], request["gpus"], request["command"]
    job = f"{nodes} node(s) × {gpus} GPU(s)"
    script = parse_sbatch(text)
    options = script["options"]
    problems = []
    if not script["shebang"]:
        problems.append(("interpreter", "sbatch refuses a script whose first line is not an interpreter line (#!/bin/bash)"))
    if "unparsable" in options:
        problems.append(("nodes", f"cannot read {options['unparsable']!r}"))
    if options.get("nodes") not in (str(nodes), f"{nodes}-{nodes}"):
        problems.append(("nodes", f"{job}: --nodes is {options.get('nodes')!r}; it must be {nodes} (and equal Trainer(num_nodes=...))"))
    count, problem = _per_node_gpus(options)
    if problem:
        problems.append(("gpus", f"{job}: {problem}"))
    elif count != gpus:
        problems.append(("gpus", f"{job}: {count} GPU(s) requested per node"))

    body = script["body"]
    problems += [("launch", f"cannot read {line!r}") for line in body if _split(line) is None]
    steps = script_steps(body, options, nodes, count)
    wanted = _split(command) or [command]
    after_python = _python_args(wanted)
    tail = after_python[1:] if after_python and after_python[0] == "-m" else after_python
    launches = []
    for index, step in enumerate(steps):
        words = step["argv"]
        if words[0] in ("echo", "printf", "cat"):
            continue
        # what a shell of each task runs counts too: srun bash -c 'torchrun ... train.py'
        flat = words + [w for c in (step["tasks"] or [[]])[0] for w in c]
        runs = _contains(flat, wanted) or any(command in w for w in words if " " in w) or (
            tail and _contains(flat, tail) and any(w.endswith(("torchrun", "torch.distributed.run")) for w in flat))
        if runs:
            launch = _launch(step, wanted, nodes, gpus)
            if step["operator"] == "&" and not any(s["argv"][0] == "wait" for s in steps[index + 1:]) and not launch["problem"]:
                launch["problem"] = ("runs in the background (&) and nothing waits for it: the batch script ends at "
                                     "once, and Slurm ends the job with it, killing its tasks (add wait)")
            launches.append((body[step["line"]], dict(launch, line=step["line"])))
    if not launches:
        problems.append(("launch", f"{job}: the command {command!r} is never run after the #SBATCH lines"))
    if nodes > 1 and launches and all(launch["kind"] == "torchrun" for _, launch in launches):
        for option, values in rendezvous_hosts(steps, nodes):
            problem = rendezvous_problem(option, values)
            if problem:
                problems.append(("rendezvous", f"{job}: {problem}"))
    for line, launch in launches:
        before = body[launch["line"] - 1] if launch["line"] else ""
        if launch["kind"] == "once" and before != before.rstrip() and before.rstrip().endswith("\\"):
            launch["problem"] += (" (the line before ends with a backslash and a blank: the backslash escapes the blank,"
                                  " not the end of the line, so the lines are not joined)")
        if launch.get("rank_problem"):
            problems.append(("ranks", f"{job}: {launch['rank_problem']}"))
        if launch["problem"]:
            problems.append(("launch", f"{job}: {line!r} {launch['problem']}" if launch["kind"] == "once"
                             else f"{job}: {launch['problem']}"))

    # how many tasks srun starts on each node: one per GPU (Lightning), one per node (torchrun starts the rest)
    torchrun = bool(launches) and all(launch["kind"] == "torchrun" for _, launch in launches)
    tasks = 1 if torchrun else gpus
    why = ("under torchrun, srun starts one torchrun per node and torchrun starts the GPU workers" if torchrun
           else "Lightning on SLURM needs one task per GPU, and devices= must equal it")
    if options.get("ntasks-per-node") != str(tasks):
        problems.append(("tasks", f"{job}: --ntasks-per-node is {options.get('ntasks-per-node')!r}: {why}"))
    if "ntasks" in options and options["ntasks"] != str(nodes * tasks):
        problems.append(("tasks", f"{job}: --ntasks={options['ntasks']} disagrees with nodes × tasks per node"))
    for line, launch in launches:
        srun = launch["srun"]
        if (srun.get("ntasks-per-node", str(tasks)) != str(tasks) or srun.get("nodes", str(nodes)) not in (str(nodes), f"{nodes}-{nodes}")
                or srun.get("ntasks", str(nodes * tasks)) != str(nodes * tasks)):
            problems.append(("tasks", f"{job}: srun's own options in {line!r} change the number of tasks"))
    return problems


def judge_sbatch(request: dict, text) -> str | None:
    """Is ``text`` an sbatch script for Lightning on ``request`` = {nodes, gpus, command}? Its first problem, or None."""
    order = ("text", "interpreter", "nodes", "tasks", "gpus", "launch", "rendezvous", "ranks")
    problems = sorted(sbatch_problems(request, text), key=lambda p: order.index(p[0]))
    return problems[0][1] if problems else None


PUBLIC_SBATCH = [{"nodes": 2, "gpus": 4, "command": "python train.py"},
                 {"nodes": 1, "gpus": 2, "command": "python fit.py --max-epochs 3"}]


def observe_sbatch_for(ns, requests):
    """The scripts ``sbatch_for`` writes for ``requests``; anything but a str is reported by its type."""
    from gpucourse.checks import answer
    texts = []
    for r in requests:
        text = answer(ns, "sbatch_for")(r["nodes"], r["gpus"], r["command"])
        texts.append(text if type(text) is str else f"<a {type(text).__name__}>")
    return texts


def judge_sbatch_all(requests, texts, clauses=None) -> str | None:
    """The first problem of ``texts`` (one per request), only of ``clauses`` when given."""
    if not isinstance(texts, list) or len(texts) != len(requests):
        return "one script per request"
    for request, text in zip(requests, texts):
        if clauses is None:
            verdict = judge_sbatch(request, text)
        else:
            verdict = next((m for c, m in sbatch_problems(request, text) if c in clauses or c == "text"), None)
        if verdict:
            return verdict
    return None


def observe_sbatch_public(ns):
    from gpucourse.checks.lesson10_beyond_one_machine import PUBLIC_SBATCH, observe_sbatch_for

    return observe_sbatch_for(ns, PUBLIC_SBATCH)


register("sbatch_for", Case("2 nodes × 4 GPUs and 1 node × 2 GPUs, read as sbatch reads them",
                            observe_sbatch_public, lambda texts: judge_sbatch_all(PUBLIC_SBATCH, texts)),
         answers=[Answer("sbatch_for", "function",
                         "a function sbatch_for(nodes, gpus_per_node, command) returning the script's text, a str")],
         points=2)

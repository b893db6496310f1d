"""Public checks for lesson 10 (beyond one machine). Observers are self-contained: see lesson01.py.

``slurm_ranks`` is judged against what Lightning's ``SLURMEnvironment`` derives. The public case states
those values from the job's shape (task t of a 2-node x 4-GPU job is global rank t, local rank t % 4,
node t // 4); the grader's own cases compare with Lightning's rules, which are not in this package.
``sbatch_for`` is judged by parsing the script as ``sbatch`` would: :func:`parse_sbatch`.
"""

from __future__ import annotations

import re
import shlex

from gpucourse.checks import Answer, Case, register

ASSIGNMENT = "lesson10_beyond_one_machine"  # the course folder this module's exercises belong to

RANK_KEYS = ("global_rank", "local_rank", "node_rank", "world_size", "main_address")


def build_jobs(jobs: list) -> list[dict]:
    """Task environments for ``[(nodes, tasks_per_node, srun_environments kwargs, extra variables)]``."""
    from gpucourse.cluster import srun_environments

    return [{**env, **extra} for nodes, per_node, options, extra in jobs
            for env in srun_environments(nodes, per_node, **options)]


def observe_ranks_for(ns, jobs, plain_extra=()):
    """Call ``slurm_ranks`` on a copy of every task's env; return the envs and what came back, as data."""
    from gpucourse.checks import answer
    from gpucourse.checks.lesson10 import build_jobs

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
        if wrong:
            return (f"{task}: {', '.join(f'{k}={got[k]!r}' for k in wrong)} is not what Lightning derives"
                    " (ranks are ints; read what srun set rather than computing it)")
    return None


PUBLIC_RANK_JOBS = [(2, 4, {}, {})]  # every task of a 2-node × 4-GPU job ("gpu[017-018]")
INTERACTIVE_SHELL = {"SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "interactive", "SLURM_NTASKS": "1", "SLURM_NNODES": "1",
                     "SLURM_NTASKS_PER_NODE": "1", "SLURM_NODELIST": "gpu017", "SLURM_PROCID": "0",
                     "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}  # srun --pty --job-name interactive bash


def observe_ranks_public(ns):
    from gpucourse.checks.lesson10 import INTERACTIVE_SHELL, PUBLIC_RANK_JOBS, observe_ranks_for

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

SHORT = {"N": "nodes", "n": "ntasks", "G": "gpus", "c": "cpus-per-task", "t": "time", "J": "job-name",
         "o": "output", "e": "error", "p": "partition", "A": "account", "q": "qos", "C": "constraint"}


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
            found[name] = value
        elif token.startswith("-") and len(token) >= 2:
            name, value = SHORT.get(token[1], token[1]), token[2:].lstrip("=")
            if not value and i + 1 < len(tokens) and not tokens[i + 1].startswith(("-", "#")):
                value, i = tokens[i + 1], i + 1
            found[name] = value
        i += 1
    return found


def parse_sbatch(text: str) -> dict:
    """An sbatch script as sbatch reads it: shebang, the ``#SBATCH`` options before the first command, the body.

    sbatch stops reading ``#SBATCH`` lines at the first line that is neither blank nor a comment.
    """
    lines = text.splitlines()
    options, body, in_header = {}, [], True
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
        if stripped and not stripped.startswith("#"):
            body.append(stripped)
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
    if len(set(counts)) > 1:
        return None, f"GPU requests disagree: {counts}"
    return counts[0], None


def judge_sbatch(request: dict, text) -> str | None:
    """Is ``text`` an sbatch script for Lightning on ``request`` = {nodes, gpus, command}?"""
    if text.startswith("<a "):
        return f"return the script's text (a str), got {text[1:-1]}"
    nodes, gpus, command = request["nodes"], request["gpus"], request["command"]
    job = f"{nodes} node(s) × {gpus} GPU(s)"
    script = parse_sbatch(text)
    options = script["options"]
    if not script["shebang"]:
        return "sbatch refuses a script whose first line is not an interpreter line (#!/bin/bash)"
    if "unparsable" in options:
        return f"cannot read {options['unparsable']!r}"
    if options.get("nodes") != str(nodes):
        return f"{job}: --nodes is {options.get('nodes')!r}; it must be {nodes} (and equal Trainer(num_nodes=...))"
    if options.get("ntasks-per-node") != str(gpus):
        return (f"{job}: --ntasks-per-node is {options.get('ntasks-per-node')!r}: Lightning on SLURM needs one task"
                " per GPU, and devices= must equal it")
    if "ntasks" in options and options["ntasks"] != str(nodes * gpus):
        return f"{job}: --ntasks={options['ntasks']} disagrees with nodes × tasks per node"
    count, problem = _per_node_gpus(options)
    if problem:
        return f"{job}: {problem}"
    if count != gpus:
        return f"{job}: {count} GPU(s) requested per node"
    launches = [line for line in script["body"] if command in line and line.split()[0] not in ("echo", "printf")]
    if not launches:
        return f"{job}: the command {command!r} is never run after the #SBATCH lines"
    for line in launches:
        words = line.split()
        words = words[1:] if words[0] == "exec" else words
        if words[0] != "srun":
            return f"{job}: {line!r} runs once, on the first node only: launch it with srun"
        srun = _options(shlex.split(line[line.index("srun") + 4:line.index(command)]))
        if srun.get("ntasks-per-node", str(gpus)) != str(gpus) or srun.get("nodes", str(nodes)) != str(nodes):
            return f"{job}: srun's own options in {line!r} change the number of tasks"
    return None


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


def judge_sbatch_all(requests, texts) -> str | None:
    if len(texts) != len(requests):
        return "one script per request"
    for request, text in zip(requests, texts):
        verdict = judge_sbatch(request, text)
        if verdict:
            return verdict
    return None


def observe_sbatch_public(ns):
    from gpucourse.checks.lesson10 import PUBLIC_SBATCH, observe_sbatch_for

    return observe_sbatch_for(ns, PUBLIC_SBATCH)


register("sbatch_for", Case("2 nodes × 4 GPUs and 1 node × 2 GPUs, read as sbatch reads them",
                            observe_sbatch_public, lambda texts: judge_sbatch_all(PUBLIC_SBATCH, texts)),
         answers=[Answer("sbatch_for", "function",
                         "a function sbatch_for(nodes, gpus_per_node, command) returning the script's text, a str")],
         points=2)

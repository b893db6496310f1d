"""How an sbatch script's body runs: srun's and torchrun's options, and the two shells a launch line passes
through (the batch shell, once, on the first node; a shell each task runs, on its own node). It is the one model
of the shells that lesson 10's ``sbatch_for`` checks read (:mod:`gpucourse.checks.lesson10_beyond_one_machine`):
which command each line runs and how, the node rank and the rendezvous host each node's torchrun receives."""

from __future__ import annotations

import os
import re

SHORT = {"N": "nodes", "n": "ntasks", "G": "gpus", "c": "cpus-per-task", "t": "time", "J": "job-name",
         "o": "output", "e": "error", "p": "partition", "A": "account", "q": "qos", "C": "constraint"}
ALIASES = {"tasks-per-node": "ntasks-per-node"}  # sbatch and srun accept both spellings
# srun options that take no value when written without "=" (the others take the next word as theirs)
SRUN_FLAGS = {"l", "u", "v", "Q", "O", "E", "H", "s", "X", "Z", "h", "label", "unbuffered", "verbose", "quiet",
              "overcommit", "preserve-env", "exclusive", "kill-on-bad-exit", "overlap", "pty", "oversubscribe",
              "disable-status", "no-kill", "multi-prog", "no-allocate", "spread-job", "test-only", "whole",
              "contiguous", "hold", "immediate", "exact", "help", "usage", "K", "k", "I"}
TORCHRUN_FLAGS = {"standalone", "no-python", "module", "m", "run-path", "virtual-local-rank"}
PYTHON_FLAGS = {"-u", "-O", "-OO", "-B", "-E", "-s", "-S", "-I", "-b", "-bb", "-q", "-P"}


def _split_options(words: list[str], flags: set) -> tuple[dict[str, str], list[str]]:
    """A launcher's own options (``--opt=v``, ``--opt v``, ``-N 2``, flags) and the program after them."""
    found, i = {}, 0
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        token = words[i]
        if token.startswith("--"):
            name, eq, value = token[2:].partition("=")
            name = ALIASES.get(name.replace("_", "-"), name.replace("_", "-"))  # torchrun takes both
        else:
            name, value, eq = SHORT.get(token[1], token[1]), token[2:].lstrip("="), token[2:]
        if not eq and name not in flags and i + 1 < len(words):
            value, i = words[i + 1], i + 1
        found[name] = value
        i += 1
    return found, words[i:]


def _python_args(command: list[str]) -> list[str] | None:
    """What follows ``python`` and its own flags in ``command`` (what torchrun is given), or None."""
    if not command or not re.fullmatch(r"(.*/)?python[\d.]*", command[0]):
        return None
    rest = command[1:]
    while rest and rest[0] in PYTHON_FLAGS:
        rest = rest[1:]
    return rest


def program_of(words: list[str]) -> list[str]:
    """``words`` without what only prefixes a command: ``exec``, ``time``, ``env``, ``NAME=value``."""
    while words and (words[0] in ("exec", "time", "command", "nohup", "env") or re.fullmatch(r"[A-Za-z_]\w*=.*", words[0])):
        words = words[1:]
    return words


def _is_torchrun(program: list[str]) -> bool:
    return bool(program) and (os.path.basename(program[0]) == "torchrun" or (
        _python_args(program[:1]) is not None and program[1:3] == ["-m", "torch.distributed.run"]))


# --- The shells ----------------------------------------------------------------------------------------
# A launch line passes through two shells: the batch shell (once, on the first node) expands what is unquoted
# or in double quotes; a shell each task runs (srun bash -c '...') expands the rest on its own node, seeing only
# what the batch shell exported (and srun's variables). A small model of both, on a made-up allocation
# (node101, node102, ...): what it cannot tell (a command it does not know, a variable a sourced file may set)
# is UNKNOWN, and a host or node rank with an UNKNOWN part is not judged.

UNKNOWN = "\x00"
ENVIRONMENT = {"HOME", "USER", "LOGNAME", "PATH", "PWD", "OLDPWD", "SHELL", "TMPDIR", "SCRATCH", "WORK", "LANG", "TERM"}
SETS_VARIABLES = {"source", ".", "eval", "read", "mapfile", "readarray", "getopts", "for", "select", "let"}
LOOPBACK = re.compile(r"localhost(\.localdomain)?|ip6-localhost|ip6-loopback|127(\.\d+){1,3}|0(\.0){0,3}|::1?|0:0:0:0:0:0:0:[01]",
                      re.IGNORECASE)


def _construct_end(text: str, i: int) -> int:
    """The index just past the quoted string, escape or substitution that starts at ``text[i]`` (else i + 1)."""
    char = text[i]
    if char == "\\":
        return min(i + 2, len(text))
    if char == "'":
        end = text.find("'", i + 1)
        return len(text) if end < 0 else end + 1
    if char in "\"`":
        j = i + 1
        while j < len(text) and text[j] != char:
            j = _construct_end(text, j) if text[j] == "\\" or (char == '"' and text[j] in "$`") else j + 1
        return min(j + 1, len(text))
    if text.startswith(("$(", "${"), i):
        opener, closer, depth, j = text[i + 1], ")" if text[i + 1] == "(" else "}", 1, i + 2
        while j < len(text):
            if text[j] in "\\'\"`" or text.startswith(("$(", "${"), j):
                j = _construct_end(text, j)
                continue
            depth += (text[j] == opener) - (text[j] == closer)
            if depth == 0:
                return j + 1
            j += 1
        return j
    return i + 1


def _scan(text: str) -> list[tuple[list[str], str]]:
    """The simple commands of shell ``text``: (their words' source text, the operator that ends them)."""
    commands, words, word, i = [], [], None, 0
    while i < len(text):
        char = text[i]
        if char in " \t":
            if word is not None:
                words.append(word)
            word, i = None, i + 1
        elif char == "#" and word is None:
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif char in ";|\n" or (char == "&" and text[i + 1:i + 2] != ">" and not (word or "").endswith((">", "<"))):
            operator = text[i:i + 2] if text[i:i + 2] in ("&&", "||", ";;", "|&") else char
            if word is not None:
                words.append(word)
            commands.append((words, operator))
            words, word, i = [], None, i + len(operator)
        else:
            end = _construct_end(text, i)
            word, i = (word or "") + text[i:end], end
    if word is not None:
        words.append(word)
    commands.append((words, ""))
    return [(words, operator) for words, operator in commands if words]


def _lookup(name: str, shell: dict) -> str:
    if name in shell["vars"]:
        return shell["vars"][name]
    if shell["opaque"] or name.startswith("SLURM") or name in ENVIRONMENT:
        return UNKNOWN
    return ""  # never set (or not exported to this shell): empty


def _dollar(text: str, i: int, shell: dict) -> tuple[str, int]:
    """The value of the expansion at ``text[i]`` ("$..."), and where it ends."""
    if text.startswith(("$(", "${"), i):
        end = _construct_end(text, i)
        inner = text[i + 2:end - 1]
        if text[i + 1] == "(":
            if inner.startswith("("):  # $(( ... )): arithmetic
                return (_arithmetic(inner[1:-1], shell) if inner.endswith(")") else UNKNOWN), end
            return _substitute(inner, shell), end
        match = re.fullmatch(r"([A-Za-z_]\w*)(?:(:?)([-=])(.*))?", inner, re.DOTALL)
        if not match:
            return UNKNOWN, end
        name, colon, operator, default = match.groups()
        value = _lookup(name, shell)
        if operator and value != UNKNOWN and (name not in shell["vars"] or (colon and value == "")):
            value = "".join(_expand_word(default, shell, split=False))  # ${NAME:-default}, ${NAME=default}
            if operator == "=":
                shell["vars"][name] = value
        return value, end
    match = re.match(r"\$([A-Za-z_]\w*)", text[i:])
    if match:
        return _lookup(match.group(1), shell), i + match.end()
    if i + 1 < len(text) and (text[i + 1].isdigit() or text[i + 1] in "@*#?$!-"):
        return UNKNOWN, i + 2
    return "$", i + 1


def _arithmetic(expression: str, shell: dict) -> str:
    """What ``$(( expression ))`` gives: integers, variables (by name or ``$NAME``; empty or unset is 0) and
    ``+ - * / %`` with parentheses, in integers as bash computes them; empty for a division by zero (bash refuses
    it, and the command does not run); UNKNOWN for anything else."""
    import ast

    def value(match):
        got = _lookup(match.group(0), shell)
        return "0" if got == "" else got if re.fullmatch(r"-?\d+", got) else UNKNOWN

    text = re.sub(r"[A-Za-z_]\w*", value, _double_quoted(expression, shell))
    if UNKNOWN in text or not re.fullmatch(r"[\d\s+\-*/%()]+", text):
        return UNKNOWN

    def evaluate(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            operand = evaluate(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Mod)):
            left, right = evaluate(node.left), evaluate(node.right)
            if isinstance(node.op, (ast.Div, ast.Mod)) and right == 0:
                raise ZeroDivisionError  # bash refuses the expansion, and the command does not run
            if isinstance(node.op, ast.Div):  # bash truncates toward zero; % takes the dividend's sign
                return abs(left) // abs(right) * (1 if (left < 0) == (right < 0) else -1)
            if isinstance(node.op, ast.Mod):
                return left - right * (abs(left) // abs(right) * (1 if (left < 0) == (right < 0) else -1))
            return {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}[type(node.op)]
        raise ValueError(node)

    try:
        return str(evaluate(ast.parse(text.strip(), mode="eval").body))
    except ZeroDivisionError:
        return ""
    except (SyntaxError, ValueError, RecursionError):
        return UNKNOWN


def _expand_word(raw: str, shell: dict, split: bool = True) -> list[str]:
    """The fields a word (its source text) becomes in ``shell``: variables and command substitutions replaced,
    quotes removed, unquoted expansions split at blanks (unless ``split`` is False: an assignment's value)."""
    fields, current, i = [], None, 0

    def literal(value):
        nonlocal current
        current = (current or "") + value

    def unquoted(value):
        nonlocal current
        pieces = re.split(r"[ \t\n]+", value) if split else [value]
        if pieces[0]:
            current = (current or "") + pieces[0]
        for piece in pieces[1:]:
            if current is not None:
                fields.append(current)
            current = piece or None

    while i < len(raw):
        char = raw[i]
        if char == "'":
            end = _construct_end(raw, i)
            literal(raw[i + 1:end - 1] if raw[end - 1:end] == "'" and end > i + 1 else raw[i + 1:end])
            i = end
        elif char == '"':
            end = _construct_end(raw, i)
            literal(_double_quoted(raw[i + 1:end - 1 if raw[end - 1:end] == '"' and end > i + 1 else end], shell))
            i = end
        elif char == "\\":
            literal(raw[i + 1:i + 2])
            i += 2
        elif char == "$":
            value, i = _dollar(raw, i, shell)
            unquoted(value)
        elif char == "`":
            end = _construct_end(raw, i)
            unquoted(_substitute(raw[i + 1:end - 1], shell))
            i = end
        else:
            literal(char)
            i += 1
    if current is not None:
        fields.append(current)
    return fields


def _double_quoted(text: str, shell: dict) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1:i + 2] in ("$", "`", '"', "\\", "\n"):
            out.append(text[i + 1])
            i += 2
        elif text[i] == "$":
            value, i = _dollar(text, i, shell)
            out.append(value)
        elif text[i] == "`":
            end = _construct_end(text, i)
            out.append(_substitute(text[i + 1:end - 1], shell))
            i = end
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _substitute(command: str, shell: dict) -> str:
    """What ``$(command)`` gives: the allocation's host names (scontrol show hostnames, head -n 1), the node's
    own name (hostname), echo; UNKNOWN for anything else."""
    from gpucourse.beyond_one_machine import hostnames

    output = None
    for words, operator in _scan(command):
        if operator not in ("|", ""):
            return UNKNOWN
        argv = [field for word in words for field in _expand_word(word, shell)]
        if not argv or any(UNKNOWN in word for word in argv):
            return UNKNOWN
        name = os.path.basename(argv[0])
        if output is None and name == "scontrol" and argv[1:3] in (["show", "hostnames"], ["show", "hostname"]) and len(argv) <= 4:
            output = "\n".join(hostnames(argv[3] if len(argv) == 4 else _lookup("SLURM_JOB_NODELIST", shell)))
        elif output is None and name == "hostname":
            host = shell["hosts"][shell["node"]]
            forms = {(): host, ("-s",): host, ("--short",): host, ("-f",): f"{host}.cluster", ("--fqdn",): f"{host}.cluster",
                     ("-A",): f"{host}.cluster", ("-i",): shell["ips"][shell["node"]], ("-I",): shell["ips"][shell["node"]]}
            output = forms.get(tuple(argv[1:]), UNKNOWN)
        elif output is None and name == "echo" and not argv[1:2] == ["-e"]:
            output = " ".join(argv[1:])
        elif output is not None and (name, *argv[1:]) in (("head", "-n", "1"), ("head", "-n1"), ("head", "-1"),
                                                           ("head", "--lines=1"), ("sed", "-n", "1p"), ("sed", "1q")):
            output = output.split("\n")[0]
        else:
            return UNKNOWN
    return UNKNOWN if output is None else output.rstrip("\n")


def _declare(words: list[str], shell: dict, export: bool) -> None:
    """``export``/``declare``/``readonly``/``local`` NAME[=value]...: set (and export) each NAME."""
    for raw in words[1:]:
        if raw.startswith("-"):
            export = export or "x" in raw.lstrip("-")
            continue
        name, eq, value = raw.partition("=")
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            shell["opaque"] = True
            continue
        if eq:
            shell["vars"][name] = "".join(_expand_word(value, shell, split=False))
        if export or shell["allexport"]:
            shell["exported"].add(name)


def _run_commands(text: str, shell: dict, on_command) -> None:
    """Walk the simple commands of ``text`` in ``shell``: assignments and exports change it; every other command
    is handed to ``on_command(argv, prefix, operator)``: the words it receives (after ``exec``, ``env`` and the
    like), the variables set for it alone, and the operator that ends it ("&" runs it in the background)."""
    for words, operator in _scan(text):
        while words and words[0] in ("if", "then", "else", "elif", "do", "while", "until", "{", "!", "fi", "done", "}"):
            words = words[1:]  # the command inside a compound command's reserved words
        prefix, k = {}, 0
        if not words:
            continue
        while k < len(words) and re.match(r"[A-Za-z_]\w*=", words[k]):
            name, _, value = words[k].partition("=")
            prefix[name] = "".join(_expand_word(value, shell, split=False))
            k += 1
        if k == len(words):
            shell["vars"].update(prefix)
            shell["exported"].update(prefix if shell["allexport"] else ())
            continue
        if words[k] in SETS_VARIABLES or (words[k] == "printf" and "-v" in words):
            shell["opaque"] = True
            continue
        if words[k] in ("export", "declare", "typeset", "readonly", "local"):
            _declare(words[k:], shell, words[k] == "export")
            continue
        argv = [field for word in words[k:] for field in _expand_word(word, shell)]
        if argv[:1] == ["unset"]:
            for name in argv[1:]:
                shell["vars"].pop(name, None)
            continue
        if argv[:1] == ["set"] and any(a in ("-a", "allexport") or (a.startswith("-") and "a" in a) for a in argv[1:]):
            shell["allexport"] = True
            continue
        while argv and (argv[0] in ("exec", "time", "command", "nohup", "env") or re.match(r"[A-Za-z_]\w*=", argv[0])):
            if "=" in argv[0] and argv[0][0] != "=":
                name, _, value = argv[0].partition("=")
                prefix[name] = value
            argv = argv[1:]
        if argv:
            on_command(argv, prefix, operator)


# --- One walk of the script: the batch shell, then each task's shell ----------------------------------
# The script runs on a made-up allocation (node101, node102, ...). Both judgements of lesson 10's sbatch_for
# read this one walk: how each line launches the command, and the rendezvous host and node rank every node's
# torchrun receives.

def allocation(nodes: int) -> dict:
    return {"hosts": [f"node{101 + k}" for k in range(nodes)], "ips": [f"10.1.{k // 250}.{k % 250 + 1}" for k in range(nodes)]}


def _job_variables(options: dict, nodes: int, gpus: int | None) -> dict:
    """What Slurm sets for the whole job (every task sees it; unset ones are empty): from the #SBATCH options."""
    from gpucourse.beyond_one_machine import hostlist

    per_node = options.get("ntasks-per-node") or ""
    ntasks = options.get("ntasks") or (str(nodes * int(per_node)) if per_node.isdigit() else "")
    nodelist = hostlist("node", list(range(101, 101 + nodes)))
    return {"SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist, "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242",
            "SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NTASKS_PER_NODE": per_node,
            "SLURM_NTASKS": ntasks, "SLURM_NPROCS": ntasks, "SLURM_GPUS_ON_NODE": str(gpus or ""),
            # Slurm sets SLURM_GPUS_PER_NODE only when the job asked for --gpus-per-node (not with --gres)
            "SLURM_GPUS_PER_NODE": str(gpus or "") if "gpus-per-node" in options else ""}


def _on_node(k: int, hosts: list[str], tasks_per_node: int) -> dict:
    """What srun sets differently in the first task of node ``k``."""
    return {"SLURM_NODEID": str(k), "SLURM_LOCALID": "0", "SLURM_PROCID": str(k * tasks_per_node),
            "SLURMD_NODENAME": hosts[k], "HOSTNAME": hosts[k], "SLURM_TOPOLOGY_ADDR": hosts[k]}


def script_steps(body: list[str], options: dict, nodes: int, gpus: int | None) -> list[dict]:
    """Every simple command of the script's ``body``, as the batch shell (once, on the first node) runs it:
    {"line": index in body, "argv", "operator", "tasks"}. For ``srun ... bash -c '...'``, "tasks" holds, for
    each node, the commands (argv lists) that the shell of the node's first task runs, as it expands them:
    it sees what the batch shell exported, srun's --export, and srun's per-task variables."""
    per_node = options.get("ntasks-per-node") or "1"
    place = allocation(nodes)
    tasks_per_node = int(per_node) if per_node.isdigit() else 1
    job = _job_variables(options, nodes, gpus)
    node0 = _on_node(0, place["hosts"], tasks_per_node)
    batch = {**place, "vars": {**job, **node0}, "exported": set(job) | set(node0), "allexport": False,
             "opaque": False, "node": 0}
    steps = []

    for index, line in enumerate(body):
        def on_command(argv, prefix, operator, index=index):
            step = {"line": index, "argv": argv, "operator": operator, "tasks": None}
            steps.append(step)
            if os.path.basename(argv[0]) != "srun":
                return
            srun, program = _split_options(argv[1:], SRUN_FLAGS)
            program = program_of(program)
            extra, unmodelled = dict(prefix), False
            for part in srun.get("export", "ALL").split(","):
                name, eq, value = part.partition("=")
                if eq:
                    extra[name] = value
                elif part != "ALL":
                    unmodelled = True  # --export=NONE or a list of names: what the tasks see is not modelled
            if len(program) >= 3 and os.path.basename(program[0]) in ("bash", "sh") and "-c" in program[1:-1]:
                exported = {name: batch["vars"][name] for name in batch["exported"] if name in batch["vars"]}
                step["tasks"] = []
                for k in range(nodes):
                    task = {**place, "vars": {**exported, **extra, **_on_node(k, place["hosts"], tasks_per_node)},
                            "exported": set(), "allexport": False, "opaque": batch["opaque"] or unmodelled, "node": k}
                    task["vars"].update(SLURM_STEP_NODELIST=job["SLURM_JOB_NODELIST"], SLURM_LAUNCH_NODE_IPADDR=place["ips"][0])
                    commands = []
                    _run_commands(program[program.index("-c") + 1], task, lambda a, p, o: commands.append(a))
                    step["tasks"].append(commands)

        _run_commands(line, batch, on_command)
    return steps


def launched_torchruns(step: dict, nodes: int) -> list[list[str]] | None:
    """The torchrun command line each of the ``nodes`` runs for an srun ``step``: the same words on every node
    when srun starts torchrun itself, each node's own when a shell of the task does (srun bash -c '...'); None
    if neither."""
    program = program_of(_split_options(step["argv"][1:], SRUN_FLAGS)[1])
    if _is_torchrun(program):
        return [program] * nodes
    if step["tasks"] is not None:
        found = [next((c for c in commands if _is_torchrun(c)), None) for commands in step["tasks"]]
        return found if all(found) else None
    return None


def _torchrun_host(argv: list[str]) -> tuple[str, str] | None:
    """The rendezvous host a torchrun command line names: (its option, the host), or None when it names none."""
    options, _ = _split_options(argv[1 if argv[0].endswith("torchrun") else 3:], TORCHRUN_FLAGS)
    if options.get("rdzv-endpoint") is not None and options.get("rdzv-backend", "static") != "static":
        endpoint = options["rdzv-endpoint"]
        if endpoint.startswith("["):
            return "--rdzv-endpoint", endpoint[1:].partition("]")[0]
        return "--rdzv-endpoint", endpoint.rpartition(":")[0] if endpoint.count(":") == 1 else endpoint
    if options.get("master-addr") is not None and "node-rank" in options:
        return "--master-addr", options["master-addr"]
    return None


def rendezvous_hosts(steps: list[dict], nodes: int) -> list[tuple[str, list[str]]]:
    """For each torchrun that srun starts: (its rendezvous option, the host each node's torchrun receives, node 0's
    first). A torchrun started without srun runs once, on the first node: judged as a launch problem."""
    found = []
    for step in steps:
        if os.path.basename(step["argv"][0]) != "srun":
            continue
        runs = launched_torchruns(step, nodes)
        named = [_torchrun_host(argv) for argv in runs] if runs else []
        if named and all(named) and len({n[0] for n in named}) == 1:
            found.append((named[0][0], [n[1] for n in named]))
    return found


def rendezvous_problem(option: str, values: list[str]) -> str | None:
    """What is wrong with the rendezvous host each node's torchrun receives (``values``, node 0's first), or None."""
    if len(values) < 2 or any(UNKNOWN in value for value in values):
        return None
    place = allocation(len(values))
    hosts, first = place["hosts"], {place["hosts"][0], f"{place['hosts'][0]}.cluster", place["ips"][0]}
    job = f"on a job whose nodes are {hosts[0]}, {hosts[1]}{', ...' if len(hosts) > 2 else ''}"
    if any(value == "" or value.startswith("-") for value in values):
        return (f"torchrun's {option} host is empty {job}, in the shell that starts torchrun: a variable the batch "
                "shell sets without export is not passed to the tasks, and one never set is empty")
    if any(LOOPBACK.fullmatch(value) for value in values):
        return (f"torchrun's {option} host is {values[0]!r}, each node itself: every node's torchrun looks for the "
                "rendezvous on its own node, and the nodes never meet; name the first node of the allocation")
    if len(set(values)) > 1:
        return (f"torchrun's {option} host is each node's own ({values[0]!r} on node 0, {values[1]!r} on node 1 {job}): "
                "expanded by each task's shell, it differs per node; every node's torchrun needs the same host, "
                "the first node of the allocation")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", values[0]):
        return (f"torchrun's {option} host is {values[0]!r} {job}: not a host name (a node list, compressed or "
                "expanded, is not one); take the first host of the expanded list")
    if values[0] not in first:
        return f"torchrun's {option} host is {values[0]!r} {job}: not the first node of the allocation"
    return None

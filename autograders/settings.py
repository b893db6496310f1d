"""Every limit, budget and switch of grading, in one place: traitlets settings that
``autograders/nbgrader_config.py`` sets (``c.Grading.cell_seconds = 300``) and ``make grade``'s
flags override (``--jobs``, ``--no-preload``). Each default is the value the grader has always used.

- ``Grading``: the engine's budgets and switches, and those the sandbox side reads from the job
  (``job_settings``; ``autograders.worker.job.Job`` declares each with its default, which the trait
  takes, and checks the job as the sandbox reads it);
- ``SandboxLimits``: the resource limits of one sandboxed run (``limits()`` builds ``sandbox.Limits``);
- ``SlurmGrading``: grading the class as one Slurm job array instead (``--slurm``; autograders/slurm_grade.py);
- ``SelfCheckKey``: `make release`'s self-check key of the answer exercises (autograders/self_check_key.py),
  read by release.py.

``settings(config)`` reads the grading ones from a loaded configuration (``course.load_config()``).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from traitlets import Bool, Float, Int, Unicode, default
from traitlets.config import Config, Configurable

from . import assemble, sandbox
from .worker.job import DEFAULTS as JOB, Job
from gpucourse import environment


class SandboxLimits(Configurable):
    """The resource limits of one submission's sandbox (``sandbox.Limits``, applied by ``sandbox.run``)."""

    wall_seconds = Float(600.0, help="wall-clock seconds for a whole submission (its cells and every check); "
                         "at this limit the sandbox's process group is killed").tag(config=True)
    cpu_seconds = Int(900, help="CPU seconds of the sandbox's processes (RLIMIT_CPU)").tag(config=True)
    memory_bytes = Int(6 << 30, help="address space of each process in bytes (RLIMIT_AS); torch's CUDA build "
                       "maps about 2 GB just importing").tag(config=True)
    processes = Int(256, help="processes and threads of the sandbox's user (RLIMIT_NPROC): bounds a fork bomb; "
                    "workers, ranks and their threads fit").tag(config=True)
    file_bytes = Int(256 << 20, help="largest file a sandboxed process may write, in bytes (RLIMIT_FSIZE)").tag(config=True)
    output_bytes = Int(1 << 20, help="bytes of the sandbox's stdout and stderr kept for the log; the rest is "
                       "counted and dropped").tag(config=True)
    # the sandbox as a whole, in a cgroup of its own where the grader is root (autograders/cgroups.py); 0: none
    memory_max_bytes = Int(6 << 30, help="memory of the whole sandbox in bytes, its /tmp and /dev/shm files "
                           "included, no swap (cgroup memory.max); 0: none").tag(config=True)
    tmpfs_bytes = Int(1 << 30, help="size of each of an isolated sandbox's own /tmp and /dev/shm (tmpfs size=), "
                      "in bytes, with or without cgroups; 0: the kernel's default, half the memory").tag(config=True)
    pids_max = Int(512, help="processes and threads of the whole sandbox (cgroup pids.max): bounds a fork bomb "
                   "whoever runs beside it; 0: none").tag(config=True)
    cpu_weight = Int(100, min=0, max=10_000, help="the sandbox's share of the CPU against the sandboxes beside it (cgroup v2 "
                     "cpu.weight, 1-10000; v1 cpu.shares = weight * 1024 / 100): many processes get no more "
                     "than one; 0: none").tag(config=True)
    cpu_quota = Float(0.0, min=0.0, help="the most CPUs the sandbox may keep busy at once (cgroup cpu.max); 0: no "
                      "cap").tag(config=True)

    def limits(self) -> sandbox.Limits:
        return sandbox.Limits(wall_seconds=self.wall_seconds, cpu_seconds=self.cpu_seconds,
                              memory_bytes=self.memory_bytes, processes=self.processes,
                              file_bytes=self.file_bytes, output_bytes=self.output_bytes,
                              memory_max_bytes=self.memory_max_bytes, tmpfs_bytes=self.tmpfs_bytes,
                              pids_max=self.pids_max, cpu_weight=self.cpu_weight, cpu_quota=self.cpu_quota)


class Grading(Configurable):
    """How `make grade` grades: budgets per cell and check, what crosses from the sandbox, how many
    submissions run at once."""

    # budgets of one cell and one check: a fraction of the sandbox's wall time, at most a cap, so one
    # stuck cell or check costs part of the run, not the whole of it
    cell_seconds = Float(300.0, help="the most seconds one cell may run before its alarm (CellTimeout)").tag(config=True)
    cell_share = Float(1 / 6, help="one cell's budget as a share of SandboxLimits.wall_seconds "
                       "(the budget is the smaller of this share and cell_seconds)").tag(config=True)
    observe_seconds = Float(240.0, help="the most seconds one check's observer may run").tag(config=True)
    observe_share = Float(0.5, help="one observer's budget as a share of SandboxLimits.wall_seconds "
                          "(the budget is the smaller of this share and observe_seconds)").tag(config=True)
    # the sandbox side (the runner and its supervisor), passed in the job
    output_limit = Int(JOB.output_limit, help="characters of each cell's and each check's output kept for the feedback "
                       "(the job's output_limit)").tag(config=True)
    grace_seconds = Float(JOB.grace, help="seconds a cell or check may overrun its own alarm before the supervisor "
                          "stops it from outside (the job's grace)").tag(config=True)
    restarts = Int(JOB.restarts, min=0, help="fresh workers a run may start after cells or checks that had to be "
                   "stopped from outside (the job's restarts)").tag(config=True)
    setup_seconds = Float(JOB.setup_seconds, help="seconds a fresh worker may take to snapshot the modules before "
                          "its first cell (the job's setup_seconds)").tag(config=True)
    max_ranks = Int(JOB.max_ranks, min=1, help="the most ranks a graded multi-process launch may ask for "
                    "(the job's max_ranks)").tag(config=True)
    script_seconds = Float(JOB.script_seconds, help="seconds for a whole multi-process launch of a script exercise "
                           "(the worker's gpucourse.checks.ddp.LaunchPolicy)").tag(config=True)
    collective_seconds = Float(JOB.collective_seconds, help="seconds a collective waits before it fails every rank of a graded "
                               "launch (GPUCOURSE_COLLECTIVE_SECONDS in the sandbox, read by "
                               "gpucourse.launch.collective_timeout)").tag(config=True)
    launch_tries = Int(JOB.launch_tries, min=1, help="launches of a script exercise when one fails for a reason of the machine's "
                       "(rendezvous, a thread or process that could not start), before the grader flags it "
                       "(the worker's gpucourse.checks.ddp.LaunchPolicy)").tag(config=True)
    message_bytes = Int(JOB.message_bytes, min=1 << 16, help="the longest message (one JSON line) the sandbox's "
                        "processes may send each other, in bytes (the job's message_bytes)").tag(config=True)
    alarm_retry_seconds = Float(JOB.alarm_retry_seconds, help="how often a cell's or check's alarm repeats until it "
                                "is taken, in seconds (one raised inside an at-fork hook is swallowed)").tag(config=True)
    # the grader's side
    notebook_bytes = Int(assemble.MAX_NOTEBOOK_BYTES, min=1, help="the largest submitted notebook the grader reads, in bytes; a larger "
                         "one is a reason for a person, not a crash").tag(config=True)
    seed = Int(None, allow_none=True, help="the seed of the inputs the hidden checks draw at grading time; None: a "
               "new one per submission, from the operating system (each autograded notebook records its own in "
               "metadata.gpucourse.seed: set it here to grade again with the same inputs)").tag(config=True)
    results_bytes = Int(8 << 20, help="bytes the grader accepts from a run's results pipe").tag(config=True)
    jobs = Int(0, help="submissions graded at once; 0: one per CPU core (make grade GRADE_ARGS=--jobs=N "
               "overrides)").tag(config=True)
    preload = Bool(True, help="fork each sandbox from a preloaded Python per worker instead of starting Python "
                   "and importing torch for every submission (GRADE_ARGS=--no-preload turns it off)").tag(config=True)
    require_isolation = Bool(False, help="refuse to grade where neither namespaces (root) nor bubblewrap can "
                             "isolate the sandbox, instead of running it with its resource limits only").tag(config=True)
    smoke = Bool(help="run the graded notebooks' code at smoke size (GPUCOURSE_SMOKE=1 in the sandbox): grading "
                 "needs the exercises' answers, not the lessons' measurements; default: the grader's own "
                 "GPUCOURSE_SMOKE when set, else true").tag(config=True)

    @default("smoke")
    def _smoke(self) -> bool:
        return environment.smoke(default=True)

    def cell_budget(self, wall_seconds: float) -> float:
        return min(self.cell_seconds, wall_seconds * self.cell_share)

    def observe_budget(self, wall_seconds: float) -> float:
        return min(self.observe_seconds, wall_seconds * self.observe_share)

    def job_settings(self, wall_seconds: float) -> dict:
        """What the sandbox side reads from the job (autograders.worker.runner documents each field)."""
        settings = {"cell_seconds": self.cell_budget(wall_seconds), "observe_seconds": self.observe_budget(wall_seconds),
                    "output_limit": self.output_limit, "grace": self.grace_seconds, "restarts": self.restarts,
                    "setup_seconds": self.setup_seconds, "max_ranks": self.max_ranks,
                    "script_seconds": self.script_seconds, "collective_seconds": self.collective_seconds,
                    "launch_tries": self.launch_tries, "message_bytes": self.message_bytes,
                    "alarm_retry_seconds": self.alarm_retry_seconds}
        return Job(cells=(), **settings).settings()  # checked as the sandbox will check it, every field given


class SlurmGrading(Configurable):
    """`make grade GRADE_ARGS=--slurm`: the class split into shards, graded as one Slurm job array (one
    task per shard, each in the same sandboxes as the local pool, on its node), merged into one gradebook."""

    enabled = Bool(False, help="grade on Slurm, as one job array, instead of with this machine's pool "
                   "(GRADE_ARGS=--slurm or --no-slurm overrides)").tag(config=True)
    shard_size = Int(8, min=1, help="submissions per array task; the array has one task per shard").tag(config=True)
    partition = Unicode("", help="the partition the array runs in (sbatch --partition); empty: the cluster's "
                        "default").tag(config=True)
    gres = Unicode("", help="generic resources of each array task (sbatch --gres, e.g. gpu:1 where the exercises "
                   "need a GPU); empty: none").tag(config=True)
    time_minutes = Int(0, min=0, help="Slurm's time limit of each array task (sbatch --time), after which Slurm "
                       "stops it (a timeout, retried); 0: from its shard, SandboxLimits.wall_seconds per "
                       "submission at the task's pace, plus 10 minutes").tag(config=True)
    cpus_per_task = Int(0, min=0, help="CPUs of each array task (sbatch --cpus-per-task) and the submissions it "
                        "grades at once; 0: ask for none and grade Grading.jobs at once (one per core of the "
                        "grading machine when 0)").tag(config=True)
    retries = Int(1, min=0, help="submissions of a failed array task (non-zero exit, node failure, timeout) "
                  "again, each resuming after the submissions it saved; then its ungraded submissions are "
                  "flagged, with the reason").tag(config=True)
    poll_seconds = Float(2.0, min=0.1, help="seconds between looks at the array's results and at squeue").tag(config=True)


class SelfCheckKey(Configurable):
    """`make release`'s self-check key of the answer exercises: every answer the grader accepts, as a salted
    hash (autograders/self_check_key.py)."""

    max_answers = Int(10_000, min=1, help="the most combinations of an exercise's parts' accepted values the release "
                      "judges whole for its key (each one the grader accepts is stored as a salted hash): more means "
                      "a part's candidates (the declaration's choices) are too loose, and the release stops, naming "
                      "the exercise").tag(config=True)


CLASSES = (Grading, SandboxLimits, SlurmGrading, SelfCheckKey)  # what nbgrader_config.py lists, each trait with its default
CONFIG_FILE = Path(__file__).with_name("nbgrader_config.py")
LISTING_START = "# --- every setting with its default: written by `make release` from autograders/settings.py ---"
LISTING_END = "# --- end of the settings ---"


def _literal(value) -> str:
    """A default as a reader would write it: ``6 << 30`` for a power-of-two size, ``1 / 6`` for a fraction."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return repr(value)
    if isinstance(value, int) and value >= 1 << 16:
        shift = max(k for k in (10, 20, 30, 40) if value % (1 << k) == 0) if value % 1024 == 0 else 0
        return f"{value >> shift} << {shift}" if shift else repr(value)
    if isinstance(value, float) and value != int(value):
        fraction = Fraction(value).limit_denominator(1000)
        if float(fraction) == value and len(repr(value)) > 8:  # 0.16666666666666666, not 0.5
            return f"{fraction.numerator} / {fraction.denominator}"
    return repr(value)


def listing(width: int = 118) -> str:
    """nbgrader_config.py's commented list of every setting: each class's first docstring line, then
    one line per trait, ``# c.Class.name = default  # help`` (the help wrapped under it)."""
    lines = [LISTING_START]
    for cls in CLASSES:
        summary = " ".join(cls.__doc__.split()).split(". ")[0].rstrip(".")
        lines.extend(textwrap.wrap(summary, width=width, initial_indent=f"# {cls.__name__}: ", subsequent_indent="#   "))
        traits = cls.class_traits(config=True)
        for name in sorted(traits, key=lambda n: list(cls.__dict__).index(n) if n in cls.__dict__ else len(cls.__dict__)):
            trait = traits[name]
            default = True if name == "smoke" else trait.default_value  # smoke: GPUCOURSE_SMOKE, else true
            head = f"# c.{cls.__name__}.{name} = {_literal(default)}  # "
            lines.extend(textwrap.wrap(" ".join(trait.help.split()), width=width, initial_indent=head,
                                       subsequent_indent="#     "))
    lines.append(LISTING_END)
    return "\n".join(lines)


def write_listing(path: Path = CONFIG_FILE) -> bool:
    """Put ``listing()`` between its markers in ``path`` (nbgrader_config.py); True if it changed."""
    text = path.read_text()
    start, end = text.index(LISTING_START), text.index(LISTING_END) + len(LISTING_END)
    new = text[:start] + listing() + text[end:]
    if new != text:
        path.write_text(new)
    return new != text


@dataclass(frozen=True)
class Settings:
    """The grader's settings, read once from the configuration."""

    grading: Grading
    limits: sandbox.Limits
    slurm: SlurmGrading


def settings(config: Config | None = None) -> Settings:
    config = config if config is not None else Config()
    return Settings(Grading(config=config), SandboxLimits(config=config).limits(), SlurmGrading(config=config))

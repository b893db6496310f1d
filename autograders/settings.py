"""Every limit, budget and switch of grading, in one place: traitlets settings that
``autograders/nbgrader_config.py`` sets (``c.Grading.cell_seconds = 300``) and ``make grade``'s
flags override (``--jobs``, ``--no-preload``). Each default is the value the grader has always used.

- ``Grading``: the engine's budgets and switches, and those the sandbox side reads from the job
  (``job_settings``: the runner, its supervisor, ``gpucourse.checks.ddp`` and ``gpucourse.launch``
  keep their module constants as the defaults for runs without a job, a student's own check included);
- ``SandboxLimits``: the resource limits of one sandboxed run (``limits()`` builds ``sandbox.Limits``).

``settings(config)`` reads both from a loaded configuration (``course.load_config()``).
"""

from __future__ import annotations

from dataclasses import dataclass

from traitlets import Bool, Float, Int, default
from traitlets.config import Config, Configurable

from . import sandbox
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
    output_limit = Int(20_000, help="characters of each cell's and each check's output kept for the feedback "
                       "(autograders.worker.runner.OUTPUT_LIMIT)").tag(config=True)
    grace_seconds = Float(10.0, help="seconds a cell or check may overrun its own alarm before the supervisor "
                          "stops it from outside (autograders.worker.supervisor.GRACE)").tag(config=True)
    restarts = Int(3, help="fresh workers a run may start after cells or checks that had to be stopped from "
                   "outside (autograders.worker.supervisor.RESTARTS)").tag(config=True)
    setup_seconds = Float(120.0, help="seconds a fresh worker may take to snapshot the modules before its first "
                          "cell (autograders.worker.supervisor.SETUP_SECONDS)").tag(config=True)
    max_ranks = Int(4, help="the most ranks a graded multi-process launch may ask for "
                    "(autograders.worker.supervisor.MAX_RANKS)").tag(config=True)
    script_seconds = Float(180.0, help="seconds for a whole multi-process launch of a script exercise "
                           "(gpucourse.checks.ddp.SCRIPT_TIMEOUT)").tag(config=True)
    collective_seconds = Float(45.0, help="seconds a collective waits before it fails every rank of a graded "
                               "launch (gpucourse.launch.COLLECTIVE_TIMEOUT)").tag(config=True)
    launch_tries = Int(3, min=1, help="launches of a script exercise when one fails for a reason of the machine's "
                       "(rendezvous, a thread or process that could not start), before the grader flags it "
                       "(gpucourse.checks.ddp.TRIES)").tag(config=True)
    # the grader's side
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
        return {"cell_seconds": self.cell_budget(wall_seconds), "observe_seconds": self.observe_budget(wall_seconds),
                "output_limit": self.output_limit, "grace": self.grace_seconds, "restarts": self.restarts,
                "setup_seconds": self.setup_seconds, "max_ranks": self.max_ranks,
                "script_seconds": self.script_seconds, "collective_seconds": self.collective_seconds,
                "launch_tries": self.launch_tries}


CLASSES = (Grading, SandboxLimits)  # what nbgrader_config.py lists, each trait with its default


@dataclass(frozen=True)
class Settings:
    """The grader's settings, read once from the configuration."""

    grading: Grading
    limits: sandbox.Limits


def settings(config: Config | None = None) -> Settings:
    config = config if config is not None else Config()
    return Settings(Grading(config=config), SandboxLimits(config=config).limits())

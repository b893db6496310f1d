# nbgrader configuration for the course. Found by `make lab`, `make release` and `make grade`
# through JUPYTER_CONFIG_PATH=autograders (set in the Makefile), or loaded by path.
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# traitlets runs this file by path, not as a module of the autograders package: the repository root on
# the path makes the package importable (not this folder, whose modules import each other relatively).
if os.path.dirname(HERE) not in sys.path:
    sys.path.insert(0, os.path.dirname(HERE))
from nbgrader.converters import Autograde  # noqa: E402
from nbgrader.preprocessors import Execute  # noqa: E402
from nbgrader.validator import Validator  # noqa: E402

from autograders.warnings_are_not_failures import ExecuteStderrIsNotFailure  # noqa: E402

c = get_config()  # noqa: F821 - provided by traitlets when it runs this file

c.CourseDirectory.course_id = "gpu-data-parallel"
c.CourseDirectory.root = os.path.dirname(HERE)
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(HERE, "gradebook.db")
# The course's exchange (gitignored): `make formgrader` releases course/ there, so Formgrader shows
# each assignment as released. On a shared JupyterHub, point it at the exchange students fetch from.
c.Exchange.root = os.path.join(os.path.dirname(HERE), "exchange")

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Late submissions (`make grade`): a submission whose timestamp.txt (nbgrader's exchange writes it
# next to the notebook) is after its assignment's due date gets the penalty of nbgrader's
# LateSubmissionPlugin: "zero" scores it 0, "none" only records how late it was. A subclass named in
# c.AssignLatePenalties.plugin_class (e.g. a penalty per day) replaces it.
c.LateSubmissionPlugin.penalty_method = "zero"
# Due dates per assignment id, as nbgrader writes them ("2026-10-05 23:59:00 Europe/Berlin"; UTC
# when no zone is given). `make grade` sets them in the gradebook; an assignment left out keeps the
# one the gradebook has (`make nbgrader RESULTS=<dir> ARGS="db assignment add <id> --duedate=..."`).
c.DueDates.duedates = {}

# `make grade`'s limits, budgets and switches, and `make release`'s for the self-check key
# (autograders/settings.py, where each one's help says more). The values below are the defaults:
# uncomment a line to change it for every run, e.g. c.Grading.cell_seconds = 120.
# `make grade GRADE_ARGS="--jobs 4 --no-preload"` overrides jobs and preload for one run.
#
# --- every setting with its default: written by `make release` from autograders/settings.py ---
# Grading: How `make grade` grades: budgets per cell and check, what crosses from the sandbox, how many submissions
#   run at once
# c.Grading.cell_seconds = 300.0  # the most seconds one cell may run before its alarm (CellTimeout)
# c.Grading.cell_share = 1 / 6  # one cell's budget as a share of SandboxLimits.wall_seconds (the budget is the
#     smaller of this share and cell_seconds)
# c.Grading.observe_seconds = 240.0  # the most seconds one check's observer may run
# c.Grading.observe_share = 0.5  # one observer's budget as a share of SandboxLimits.wall_seconds (the budget is the
#     smaller of this share and observe_seconds)
# c.Grading.output_limit = 20000  # characters of each cell's and each check's output kept for the feedback (the job's
#     output_limit)
# c.Grading.grace_seconds = 10.0  # seconds a cell or check may overrun its own alarm before the supervisor stops it
#     from outside (the job's grace)
# c.Grading.restarts = 3  # fresh workers a run may start after cells or checks that had to be stopped from outside
#     (the job's restarts)
# c.Grading.setup_seconds = 120.0  # seconds a fresh worker may take to snapshot the modules before its first cell
#     (the job's setup_seconds)
# c.Grading.max_ranks = 4  # the most ranks a graded multi-process launch may ask for (the job's max_ranks)
# c.Grading.script_seconds = 180.0  # seconds for a whole multi-process launch of a script exercise (the worker's
#     gpucourse.checks.ddp.LaunchPolicy)
# c.Grading.collective_seconds = 45.0  # seconds a collective waits before it fails every rank of a graded launch
#     (GPUCOURSE_COLLECTIVE_SECONDS in the sandbox, read by gpucourse.launch.collective_timeout)
# c.Grading.launch_tries = 3  # launches of a script exercise when one fails for a reason of the machine's
#     (rendezvous, a thread or process that could not start), before the grader flags it (the worker's
#     gpucourse.checks.ddp.LaunchPolicy)
# c.Grading.message_bytes = 32 << 20  # the longest message (one JSON line) the sandbox's processes may send each
#     other, in bytes (the job's message_bytes)
# c.Grading.alarm_retry_seconds = 0.5  # how often a cell's or check's alarm repeats until it is taken, in seconds
#     (one raised inside an at-fork hook is swallowed)
# c.Grading.notebook_bytes = 20 << 20  # the largest submitted notebook the grader reads, in bytes; a larger one is a
#     reason for a person, not a crash
# c.Grading.seed = None  # the seed of the inputs the hidden checks draw at grading time; None: a new one per
#     submission, from the operating system (each autograded notebook records its own in metadata.gpucourse.seed: set
#     it here to grade again with the same inputs)
# c.Grading.results_bytes = 8 << 20  # bytes the grader accepts from a run's results pipe
# c.Grading.jobs = 0  # submissions graded at once; 0: one per CPU core (make grade GRADE_ARGS=--jobs=N overrides)
# c.Grading.preload = True  # fork each sandbox from a preloaded Python per worker instead of starting Python and
#     importing torch for every submission (GRADE_ARGS=--no-preload turns it off)
# c.Grading.require_isolation = False  # refuse to grade where neither namespaces (root) nor bubblewrap can isolate
#     the sandbox, instead of running it with its resource limits only
# c.Grading.smoke = True  # run the graded notebooks' code at smoke size (GPUCOURSE_SMOKE=1 in the sandbox): grading
#     needs the exercises' answers, not the lessons' measurements; default: the grader's own GPUCOURSE_SMOKE when set,
#     else true
# SandboxLimits: The resource limits of one submission's sandbox (``sandbox.Limits``, applied by ``sandbox.run``)
# c.SandboxLimits.wall_seconds = 600.0  # wall-clock seconds for a whole submission (its cells and every check); at
#     this limit the sandbox's process group is killed
# c.SandboxLimits.cpu_seconds = 900  # CPU seconds of the sandbox's processes (RLIMIT_CPU)
# c.SandboxLimits.memory_bytes = 6 << 30  # address space of each process in bytes (RLIMIT_AS); torch's CUDA build
#     maps about 2 GB just importing
# c.SandboxLimits.processes = 256  # processes and threads of the sandbox's user (RLIMIT_NPROC): bounds a fork bomb;
#     workers, ranks and their threads fit
# c.SandboxLimits.file_bytes = 256 << 20  # largest file a sandboxed process may write, in bytes (RLIMIT_FSIZE)
# c.SandboxLimits.output_bytes = 1 << 20  # bytes of the sandbox's stdout and stderr kept for the log; the rest is
#     counted and dropped
# c.SandboxLimits.memory_max_bytes = 6 << 30  # memory of the whole sandbox in bytes, its /tmp and /dev/shm files
#     included, no swap (cgroup memory.max); 0: none
# c.SandboxLimits.tmpfs_bytes = 1 << 30  # size of each of an isolated sandbox's own /tmp and /dev/shm (tmpfs size=),
#     in bytes, with or without cgroups; 0: the kernel's default, half the memory
# c.SandboxLimits.pids_max = 512  # processes and threads of the whole sandbox (cgroup pids.max): bounds a fork bomb
#     whoever runs beside it; 0: none
# c.SandboxLimits.cpu_weight = 100  # the sandbox's share of the CPU against the sandboxes beside it (cgroup v2
#     cpu.weight, 1-10000; v1 cpu.shares = weight * 1024 / 100): many processes get no more than one; 0: none
# c.SandboxLimits.cpu_quota = 0.0  # the most CPUs the sandbox may keep busy at once (cgroup cpu.max); 0: no cap
# SlurmGrading: `make grade GRADE_ARGS=--slurm`: the class split into shards, graded as one Slurm job array (one task
#   per shard, each in the same sandboxes as the local pool, on its node), merged into one gradebook
# c.SlurmGrading.enabled = False  # grade on Slurm, as one job array, instead of with this machine's pool
#     (GRADE_ARGS=--slurm or --no-slurm overrides)
# c.SlurmGrading.shard_size = 8  # submissions per array task; the array has one task per shard
# c.SlurmGrading.partition = ''  # the partition the array runs in (sbatch --partition); empty: the cluster's default
# c.SlurmGrading.gres = ''  # generic resources of each array task (sbatch --gres, e.g. gpu:1 where the exercises need
#     a GPU); empty: none
# c.SlurmGrading.time_minutes = 0  # Slurm's time limit of each array task (sbatch --time), after which Slurm stops it
#     (a timeout, retried); 0: from its shard, SandboxLimits.wall_seconds per submission at the task's pace, plus 10
#     minutes
# c.SlurmGrading.cpus_per_task = 0  # CPUs of each array task (sbatch --cpus-per-task) and the submissions it grades
#     at once; 0: ask for none and grade Grading.jobs at once (one per core of the grading machine when 0)
# c.SlurmGrading.retries = 1  # submissions of a failed array task (non-zero exit, node failure, timeout) again, each
#     resuming after the submissions it saved; then its ungraded submissions are flagged, with the reason
# c.SlurmGrading.poll_seconds = 2.0  # seconds between looks at the array's results and at squeue
# SelfCheckKey: `make release`'s self-check key of the answer exercises: every answer the grader accepts, as a salted
#   hash (autograders/self_check_key.py)
# c.SelfCheckKey.max_answers = 10000  # the most combinations of an exercise's parts' accepted values the release
#     judges whole for its key (each one the grader accepts is stored as a salted hash): more means a part's
#     candidates (the declaration's choices) are too loose, and the release stops, naming the exercise
# --- end of the settings ---

# The test suite grades with a fixed seed (tests/conftest.py sets GPUCOURSE_GRADING_SEED), so that a CI run
# is reproducible, as Hypothesis derandomizes in CI; a class is graded without it: a new seed per submission.
if os.environ.get("GPUCOURSE_GRADING_SEED"):
    c.Grading.seed = int(os.environ["GPUCOURSE_GRADING_SEED"])

# Grading and Validate execute each notebook with a real kernel; warnings on stderr cost nothing.
c.Execute.timeout = 600


def _swap_execute(preprocessors):
    return [ExecuteStderrIsNotFailure if p is Execute else p for p in preprocessors]


c.Autograde.autograde_preprocessors = _swap_execute(Autograde.class_traits()["autograde_preprocessors"].make_dynamic_default())
# Validate's preprocessor list is not configurable in nbgrader 0.9; replace its default instead.
_validate = Validator.class_traits()["preprocessors"]
_validate.default_args = (_swap_execute(_validate.make_dynamic_default()),)

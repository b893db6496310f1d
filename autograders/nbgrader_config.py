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

# `make grade`'s limits, budgets and switches (autograders/settings.py, where each one's help says
# more). The values below are the defaults: uncomment a line to change it for every run, e.g.
# c.Grading.cell_seconds = 120. `make grade GRADE_ARGS="--jobs 4 --no-preload"` overrides jobs and
# preload for one run.
#
# Grading: one cell's and one check's budgets, each the smaller of a cap and a share of the wall time
# c.Grading.cell_seconds = 300.0  # the most seconds one cell may run before its alarm (CellTimeout)
# c.Grading.cell_share = 1 / 6  # one cell's budget as a share of c.SandboxLimits.wall_seconds
# c.Grading.observe_seconds = 240.0  # the most seconds one check's observer may run
# c.Grading.observe_share = 0.5  # one observer's budget as a share of c.SandboxLimits.wall_seconds
# Grading: the sandbox side (the runner and its supervisor read these from the job)
# c.Grading.output_limit = 20000  # characters of each cell's and each check's output kept for the feedback
# c.Grading.grace_seconds = 10.0  # a cell or check overrunning its alarm by this long is stopped from outside
# c.Grading.restarts = 3  # fresh workers a run may start after cells or checks stopped from outside
# c.Grading.setup_seconds = 120.0  # a fresh worker's snapshot of the modules, before its first cell
# c.Grading.max_ranks = 4  # the most ranks a graded multi-process launch may ask for
# c.Grading.script_seconds = 180.0  # a whole multi-process launch of a script exercise
# c.Grading.collective_seconds = 45.0  # a collective waits this long, then fails every rank of a graded launch
# c.Grading.launch_tries = 3  # launches of a script exercise that fails for a reason of the machine's, then a flag
# Grading: the grader's side
# c.Grading.seed = None  # the hidden checks' inputs are drawn at grading time from this seed; None: a new one per submission
# c.Grading.results_bytes = 8 << 20  # bytes accepted from a run's results pipe
# c.Grading.jobs = 0  # submissions graded at once; 0: one per CPU core (--jobs N)
# c.Grading.preload = True  # fork each sandbox from a preloaded Python instead of starting one (--no-preload)
# c.Grading.require_isolation = False  # refuse to grade where neither namespaces nor bubblewrap isolate the sandbox
# c.Grading.smoke = True  # GPUCOURSE_SMOKE in the sandbox; default: the grader's own GPUCOURSE_SMOKE, else true
# SandboxLimits: one submission's sandbox (sandbox.Limits)
# c.SandboxLimits.wall_seconds = 600.0  # the whole submission, cells and checks; then its processes are killed
# c.SandboxLimits.cpu_seconds = 900  # CPU seconds of its processes (RLIMIT_CPU)
# c.SandboxLimits.memory_bytes = 6 << 30  # address space per process (RLIMIT_AS); importing torch maps ~2 GB
# c.SandboxLimits.processes = 256  # processes and threads of its user (RLIMIT_NPROC): bounds a fork bomb
# c.SandboxLimits.file_bytes = 256 << 20  # largest file it may write (RLIMIT_FSIZE)
# c.SandboxLimits.output_bytes = 1 << 20  # bytes of its stdout and stderr kept for the log
# SandboxLimits: the whole sandbox, in a cgroup of its own where the grader is root; 0: none
# c.SandboxLimits.memory_max_bytes = 6 << 30  # memory of all its processes, its /tmp and /dev/shm files included
# c.SandboxLimits.tmpfs_bytes = 1 << 30  # size of its own /tmp and of its /dev/shm (isolated, cgroup or not)
# c.SandboxLimits.pids_max = 512  # processes and threads of the whole sandbox (pids.max): bounds a fork bomb
# c.SandboxLimits.cpu_weight = 100  # its CPU share beside other sandboxes (cpu.weight; v1 cpu.shares 1024)
# c.SandboxLimits.cpu_quota = 0.0  # the most CPUs it may keep busy at once (cpu.max); 0: no cap

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

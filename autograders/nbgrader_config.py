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

# Grading and Validate execute each notebook with a real kernel; warnings on stderr cost nothing.
c.Execute.timeout = 600


def _swap_execute(preprocessors):
    return [ExecuteStderrIsNotFailure if p is Execute else p for p in preprocessors]


c.Autograde.autograde_preprocessors = _swap_execute(Autograde.class_traits()["autograde_preprocessors"].make_dynamic_default())
# Validate's preprocessor list is not configurable in nbgrader 0.9; replace its default instead.
_validate = Validator.class_traits()["preprocessors"]
_validate.default_args = (_swap_execute(_validate.make_dynamic_default()),)

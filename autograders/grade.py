"""`make grade`: grade a class of submissions in sandboxes, in parallel, into nbgrader's gradebook.

SUBMISSIONS is nbgrader's submitted layout, ``<student>/<assignment>/<notebook>.ipynb``.
RESULTS receives:

- ``grades.csv``: nbgrader's CSV export (assignment, student_id, score, max_score, ...);
- ``feedback/<student>/<assignment>/<notebook>.html``: what each student gets back (check names
  and what failed; never the hidden checks' code);
- ``logs/<student>__<assignment>.log``: scores, flags, every check's result, the sandbox output;
- ``flagged.txt``: submissions a person should look at, and why; ``problems.txt``: what could not
  be graded at all (``--student`` replaces that student's lines in both and keeps everyone else's);
- ``nbgrader/``: a complete nbgrader course folder (gradebook included) for Formgrader's manual
  grading: ``cd RESULTS/nbgrader && jupyter lab``, then ``nbgrader export`` there.

Each submission goes through the engine's steps (autograders/engine.py: take the answers, flag,
observe in its own sandbox, judge), then record.py's (save the grades, nbgrader's late penalty);
with ``--slurm`` the engine's steps run in the tasks of one Slurm job array (slurm_grade.py), and
record.py's here, as they land;
see autograders/THREAT_MODEL.md. Every limit, budget and switch is a setting in
autograders/nbgrader_config.py (settings.py: ``c.Grading...``, ``c.SandboxLimits...``); the flags
below override the configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from . import engine, record, sandbox
from .pool import longest_first, sandboxed  # noqa: F401 - the local pool (slurm_grade.py is the other)
from .course import COURSE, HERE, ROOT, SOLUTIONS, DueDates, api, assignments, load_config, stamp_new_gradebook
from .settings import Grading, settings

IGNORED = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")


@dataclass
class Batch:
    """What one grading run found and did."""

    pairs: list[tuple[str, str]] = field(default_factory=list)  # (student, assignment) to grade
    problems: list[str] = field(default_factory=list)
    flagged: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each phase of ``grade``

    @contextlib.contextmanager
    def timed(self, phase: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started

    def problem(self, student: str, assignment: str, why: str) -> None:
        self.problems.append(f"{student}/{assignment}: {why}")


def discover(submissions: Path, known: list[str], only_student: str | None = None) -> Batch:
    """Step 1: list gradeable (student, assignment) pairs; note everything else as a problem."""
    if not submissions.is_dir():
        raise SystemExit(f"SUBMISSIONS={submissions} is not a folder")
    batch = Batch()
    for student_dir in sorted(p for p in submissions.iterdir() if not p.name.startswith(".")):
        student = student_dir.name
        if only_student is not None and student != only_student:
            continue
        if not student_dir.is_dir() or student_dir.is_symlink():
            batch.problem(student, "-", "not a folder; expected <student>/<assignment>/<notebook>.ipynb")
            continue
        for assignment_dir in sorted(p for p in student_dir.iterdir() if not p.name.startswith(".")):
            aid = assignment_dir.name
            if aid not in known:
                batch.problem(student, aid, f"unknown assignment (known: {', '.join(known)})")
            elif not assignment_dir.is_dir() or not any(assignment_dir.glob("*.ipynb")):
                batch.problem(student, aid, "no notebook found")
            else:
                batch.pairs.append((student, aid))
    if only_student is not None and not batch.pairs and not batch.problems:
        raise SystemExit(f"no submission from student {only_student!r} in {submissions}")
    return batch


def prepare(work: Path, submissions: Path, batch: Batch, solutions: Path) -> None:
    """Step 2: an nbgrader course folder: the sources, and a copy of each submission to grade."""
    if (work / "source").exists():
        shutil.rmtree(work / "source")
    shutil.copytree(solutions, work / "source", ignore=IGNORED)
    for student, aid in batch.pairs:
        target = work / "submitted" / student / aid
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(submissions / student / aid, target, ignore=IGNORED, symlinks=True)
    # Formgrader and `nbgrader export` run from this folder read this file.
    (work / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"load_subconfig({str(HERE / 'nbgrader_config.py')!r})\n"
        f"c.CourseDirectory.root = {str(work)!r}\n"
        "c.CourseDirectory.source_directory = 'source'\n"
        "c.CourseDirectory.release_directory = 'release'\n"
        f"c.CourseDirectory.db_url = {'sqlite:///' + str(work / 'gradebook.db')!r}\n"
    )


def register(nbgrader, batch: Batch) -> None:
    """Step 3: generate each assignment once: its cells enter the gradebook, its release is the
    template; its due date, when the course config sets one (course.DueDates), enters the gradebook."""
    ids = sorted({aid for _, aid in batch.pairs})
    due = due_dates(nbgrader.config, ids)
    for aid in ids:
        result = nbgrader.generate_assignment(aid, force=True, create=True)
        if not result["success"]:
            raise SystemExit(f"cannot generate {aid} from the sources:\n{result['error']}")
    set_due_dates(nbgrader.coursedir.db_url, due)


def due_dates(config, ids: list[str]) -> dict:
    """The configured due dates (``c.DueDates.duedates``) of assignments ``ids``, parsed as nbgrader
    parses them (to UTC); a date nbgrader cannot read stops grading before anything runs."""
    from nbgrader.utils import parse_utc

    found = {}
    for aid, when in DueDates(config=config).duedates.items():
        if aid in ids:
            try:
                found[aid] = parse_utc(when)
            except (ValueError, OverflowError) as error:
                raise SystemExit(f"c.DueDates.duedates[{aid!r}] = {when!r} is not a date nbgrader reads: {error}")
    return found


def set_due_dates(db_url: str, due: dict) -> None:
    """Each assignment's due date into the gradebook, where nbgrader's late penalty reads it."""
    if due:
        from nbgrader.api import Gradebook

        with Gradebook(db_url) as gradebook:
            for aid, when in due.items():
                gradebook.update_or_create_assignment(aid, duedate=when)


def _released(work: Path, aid: str) -> Path:
    return _notebook(work / "release" / aid, aid)


def _notebook(folder: Path, aid: str) -> Path:
    notebooks = sorted(folder.glob("*.ipynb"))
    if len(notebooks) != 1:
        raise SystemExit(f"{aid}: the engine grades one notebook per assignment, found {len(notebooks)}")
    return notebooks[0]


def autograde(work: Path, batch: Batch, results: Path, submissions: Path, jobs: int, limits: sandbox.Limits,
              config, preload: bool = True, preloads: engine.Preloads | None = None,
              grading: Grading | None = None, array=None, then=None) -> list[tuple[str, str]]:
    """Step 4: every pair through the engine's steps, ``jobs`` at a time (or in the tasks of ``array``, a
    submitted Slurm job array: slurm_grade.py); as each one ends, this thread (the gradebook's one writer)
    runs record.py's steps on it: grades, then late penalty; then ``then(student, assignment)`` (step 5's
    feedback, while the others are still graded)."""
    hide = [work, results, submissions, ROOT / "solutions", ROOT / "autograders", ROOT / "tests", ROOT / ".git"]
    from nbgrader.api import Gradebook

    graded = []
    released = functools.partial(_released, work)
    if array is not None:
        from . import slurm_grade

        ended = slurm_grade.graded(array, batch.pairs, released, hide, batch)
    else:
        ended = sandboxed(work, batch.pairs, released, hide, jobs, limits, preload, preloads, grading)
    with tqdm(total=len(batch.pairs), desc="grading", unit="submission", dynamic_ncols=True) as progress, \
            Gradebook(record.db_url(work)) as gradebook:
        for student, aid, result in ended:
            progress.update()
            try:
                if isinstance(result, Exception):
                    raise result
                with batch.timed("save grades, late penalty"):
                    sub = result.submission
                    sub.work, sub.logs, sub.config, sub.gradebook = work, results / "logs", config, gradebook
                    _, sub = engine.run(result.nb, sub, record.STEPS)
            except Exception as error:  # a grader fault on one submission never stops the batch
                batch.problem(student, aid, f"could not be graded: {type(error).__name__}: {error}")
                if array is None or error is not result:  # a Slurm task's fault comes back as a message: no traceback
                    _log_fault(results, student, aid, error)
                continue
            graded.append((student, aid))
            batch.seconds["sandboxed runs, summed"] = batch.seconds.get("sandboxed runs, summed", 0.0) + sub.seconds
            flags, notes = sub.flags, sub.notes
            if flags or notes:
                batch.flagged.append(f"{student}/{aid}: " + "; ".join(flags + notes))
            score = f"{sum(sub.scores.values()):g}/{sum(sub.max_scores.values()):g}"
            late = f" late, -{sub.late_penalty:g}" if sub.seconds_late else ""
            progress.write(f"{student}/{aid} {score}{late}{' FLAGGED' if flags else ''}")
            if then is not None:
                then(student, aid)
    return graded


def _log_fault(results: Path, student: str, aid: str, error: BaseException | str,
               heading: str = "the grader failed on this submission") -> None:
    """What failed, at the end of the submission's log (the grader's traceback, or ``error`` as written):
    problems.txt says what failed, this where."""
    import traceback

    text = error if isinstance(error, str) else "".join(traceback.format_exception(error))
    log = results / "logs" / f"{student}__{aid}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"--- {heading} ---\n{text}\n")


def engine_only(submissions: Path, jobs: int | None = None, limits: sandbox.Limits | None = None,
                preload: bool | None = None, config=None) -> tuple[Batch, dict[tuple[str, str], engine.Graded]]:
    """The engine alone on a class: each submission sandboxed and judged exactly as ``grade`` does,
    against course/'s released notebooks, without nbgrader (no gradebook, feedback or CSV export).
    For checking many answers quickly (the test suite's fixtures); ``grade`` is the instructors' tool.
    ``config``: the configuration to read the settings from (default: nbgrader_config.py); ``jobs``,
    ``limits`` and ``preload`` override it."""
    found = settings(config if config is not None else load_config())
    grading, limits = found.grading, limits or found.limits
    jobs, preload = jobs or grading.jobs or os.cpu_count() or 1, grading.preload if preload is None else preload
    submissions = submissions.resolve()
    batch = discover(submissions, assignments(SOLUTIONS))
    graded: dict[tuple[str, str], engine.Graded] = {}
    with tempfile.TemporaryDirectory(prefix="gpucourse-engine-") as folder:
        work = Path(folder)
        for student, aid in batch.pairs:
            shutil.copytree(submissions / student / aid, work / "submitted" / student / aid, ignore=IGNORED, symlinks=True)
        hide = [work, submissions, ROOT / "solutions", ROOT / "autograders", ROOT / "tests", ROOT / ".git"]
        released = {aid: _notebook(COURSE / aid, aid) for _, aid in batch.pairs}
        for student, aid, result in sandboxed(work, batch.pairs, released.__getitem__, hide, jobs, limits, preload,
                                              grading=grading):
            if isinstance(result, Exception):
                batch.problem(student, aid, f"could not be graded: {type(result).__name__}: {result}")
            else:
                graded[(student, aid)] = result
    return batch, graded


class Feedback:
    """Step 5: nbgrader's HTML feedback for each graded submission, copied to RESULTS/feedback/.

    ``one(student, assignment)`` as soon as its grades are saved (``autograde``'s ``then``), while the
    sandboxes grade the others and this thread would wait for them: a page costs nbgrader as much alone
    as in a batch of its assignment (0.15 s each on an idle machine, measured on lesson 1), and made after
    the last grade, 16 lesson-1 pages added 2.5 s to the engine's time. ``rest(graded)`` at the end: what
    ``one`` could not make is tried again; what still fails is a problem of the batch, with nbgrader's
    error at the end of the submission's log."""

    def __init__(self, nbgrader, work: Path, results: Path, batch: Batch):
        self.nbgrader, self.work, self.results, self.batch = nbgrader, work, results, batch
        self.made: set[tuple[str, str]] = set()  # the pages out, this run
        self.errors: dict[tuple[str, str], str] = {}  # why the last try of a page failed

    def one(self, student: str, aid: str) -> bool:
        """This submission's page, made afresh and copied out; whether it was made. Never raises: a
        page nbgrader could not make is left for ``rest``."""
        folder = self.work / "feedback" / student / aid  # where nbgrader writes the page
        with self.batch.timed("feedback"):
            try:
                shutil.rmtree(folder, ignore_errors=True)  # what exists afterwards is new
                result = self.nbgrader.generate_feedback(aid, student, force=True)
                if not any(folder.glob("*.html")):
                    self.errors[(student, aid)] = str(result.get("error") or result.get("log") or "no page was written")
                    return False
                target = self.results / "feedback" / student / aid
                if target.exists():
                    shutil.rmtree(target)
                shutil.copytree(folder, target)
                self.made.add((student, aid))
                return True
            except Exception as error:  # rest() tries again, and says why if it fails again
                self.errors[(student, aid)] = f"{type(error).__name__}: {error}"
                return False

    def rest(self, graded: list[tuple[str, str]]) -> None:
        """Every graded submission whose page is not out yet: made again, else reported as a problem."""
        for student, aid in graded:
            if (student, aid) in self.made or self.one(student, aid):
                continue
            self.batch.problem(student, aid, "feedback could not be generated (see its log)")
            _log_fault(self.results, student, aid, self.errors.get((student, aid), ""),
                       heading="nbgrader could not make the feedback page")


def export(config, destination: Path) -> None:
    """Step 5: nbgrader's own CSV export of the whole gradebook."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    plugin = CsvExportPlugin(config=config)
    plugin.to = str(destination)
    with Gradebook(config.CourseDirectory.db_url) as gradebook:
        plugin.export(gradebook)


def merge_lines(path: Path, lines: list[str], student: str | None, sort: bool = False) -> None:
    """Write ``lines`` (``<student>/...``) to ``path``; with ``student`` (a regrade), only that
    student's lines are replaced: everyone else's stay as they were."""
    kept = []
    if student is not None and path.exists():
        kept = [line for line in path.read_text().splitlines() if line and line.split("/", 1)[0] != student]
    merged = sorted(kept + lines) if sort else kept + lines
    path.write_text("".join(f"{line}\n" for line in merged))


def grade(submissions: Path, results: Path, solutions: Path = SOLUTIONS, only_student: str | None = None,
          jobs: int | None = None, limits: sandbox.Limits | None = None, preload: bool | None = None,
          slurm: bool | None = None, config_overrides=None) -> Batch:
    """Run the steps; returns what was graded, flagged and could not be graded. The settings come from
    nbgrader_config.py (settings.py); ``jobs``, ``limits``, ``preload`` and ``slurm`` (one Slurm job array
    instead of this machine's pool: slurm_grade.py), when given, override it, and so do the traitlets
    ``config_overrides`` (a ``Config``, merged last)."""
    submissions, results = submissions.resolve(), results.resolve()
    work = results / "nbgrader"
    work.mkdir(parents=True, exist_ok=True)
    batch = discover(submissions, assignments(solutions), only_student)
    prepare(work, submissions, batch, solutions)
    stamp_new_gradebook(work / "gradebook.db")  # nbgrader would start a subprocess to learn what to stamp
    config = load_config(root=work, db=work / "gradebook.db", source="source", release="release")
    if config_overrides is not None:
        config.merge(config_overrides)
    found = settings(config)
    grading, limits = found.grading, limits or found.limits
    jobs, preload = jobs or grading.jobs or os.cpu_count() or 1, grading.preload if preload is None else preload
    array = None
    if (found.slurm.enabled if slurm is None else slurm) and batch.pairs:
        from . import slurm_grade  # submitted now: its tasks start and preload while the assignments register

        array = slurm_grade.submitted(work, len(batch.pairs), jobs, limits, preload, grading, found.slurm)
    with (engine.Preloads(grading) if preload and array is None else contextlib.nullcontext()) as preloads, \
            (contextlib.closing(array) if array is not None else contextlib.nullcontext()):
        if preloads is not None and engine.forks():  # their imports overlap registering the assignments
            preloads.start(min(jobs, len(batch.pairs)))
        with batch.timed("register"):
            nbgrader = api(config)
            register(nbgrader, batch)
        pages = Feedback(nbgrader, work, results, batch)
        with batch.timed("autograde"):
            graded = autograde(work, batch, results, submissions, jobs, limits, config, preload, preloads, grading,
                               array, then=pages.one)
    pages.rest(graded)
    with batch.timed("export"):
        export(config, results / "grades.csv")
    merge_lines(results / "problems.txt", batch.problems, only_student)
    merge_lines(results / "flagged.txt", batch.flagged, only_student, sort=True)
    return batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submissions", type=Path, required=True)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--student", help="regrade only this student")
    parser.add_argument("--jobs", type=int, help="submissions graded at once (default: c.Grading.jobs, else one per core)")
    parser.add_argument("--no-preload", action="store_true",
                        help="start Python for every submission instead of forking it from a preloaded one "
                             "(default: c.Grading.preload)")
    parser.add_argument("--slurm", action=argparse.BooleanOptionalAction, default=None,
                        help="grade as one Slurm job array, one task per shard of the class, on the cluster's "
                             "nodes (default: c.SlurmGrading.enabled; the other c.SlurmGrading settings apply)")
    args = parser.parse_args(argv)
    batch = grade(args.submissions, args.results, only_student=args.student, jobs=args.jobs,
                  preload=False if args.no_preload else None, slurm=args.slurm)
    print(f"graded {len(batch.pairs)} submission(s); grades in {args.results / 'grades.csv'}")
    for line in sorted(batch.flagged):
        print(f"  flagged: {line}")
    for problem in batch.problems:
        print(f"  could not grade: {problem}")
    return 0

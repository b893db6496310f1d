"""Turn a submitted notebook into what the sandbox runs, trusting nothing in it but the answers.

The run plan starts from the *released* notebook (scaffolding, locked cells, no solutions), and
takes only the student's answer cells from the submission, matched by their nbgrader grade id.
Test cells are never run from either notebook: checks live in ``autograders/checks``. Anything odd
about the submission (a changed locked cell, a duplicated answer, a metadata rewrite, code that
reaches for the grader's machinery) becomes a flag for manual review, never a crash.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

MAX_NOTEBOOK_BYTES = 20 << 20
SKIP_TAG = "skip-when-grading"  # lesson measurements the checks do not need

# Code that has no business in an answer: each match flags the submission for a person to look at.
SUSPICIOUS = {
    "IPython hooks or input transformers": r"input_transformers|register_transform|events\.register|pre_run_cell|post_run_cell|get_ipython",
    "patches builtins or the import system": r"\bbuiltins\b|__builtins__|sys\.modules|importlib\.reload|__import__",
    "patches the course's or test libraries' functions": r"\b(gpucourse|torch\.testing|numpy\.testing|np\.testing|json|os|threading)\.\w+\s*=[^=]",
    "reads the grader's files, processes or environment": r"/proc|autograders|solutions/|gradebook|NBGRADER|GPUCOURSE_",
    "hard exits or exit hooks": r"os\._exit|sys\.exit|atexit|signal\.signal|os\.kill|killpg",
    "raw file descriptors or interpreter internals": r"os\.(dup2?|fdopen|write|read)\b|gc\.get_objects|sys\._getframe|ctypes|sys\.settrace|sys\.setprofile",
    "overrides equality or torch dispatch": r"def __eq__|def __ne__|__torch_function__|__torch_dispatch__|__array_ufunc__",
}


@dataclass
class Plan:
    cells: list[dict] = field(default_factory=list)  # {"source", "grade_id" (answers only), "template_index"}
    answers: dict[str, str | None] = field(default_factory=dict)  # grade id -> the student's source (None: missing)
    flags: list[str] = field(default_factory=list)
    readable: bool = True


def nbgrader_meta(cell: dict) -> dict:
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
    return nbgrader if isinstance(nbgrader, dict) else {}


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def read_submission(path: Path) -> tuple[dict | None, list[str]]:
    """The notebook as plain JSON, or None with the reason; never follows a symlink."""
    if path.is_symlink():
        return None, [f"{path.name} is a symlink; not followed"]
    if not path.is_file():
        return None, [f"{path.name} is missing"]
    if path.stat().st_size > MAX_NOTEBOOK_BYTES:
        return None, [f"{path.name} is larger than {MAX_NOTEBOOK_BYTES >> 20} MB"]
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        return None, [f"{path.name} is not UTF-8 text ({error.reason} at byte {error.start})"]
    try:
        nb = json.loads(text)
    except ValueError as error:
        return None, [f"{path.name} is not valid JSON ({error})"]
    if not isinstance(nb, dict) or nb.get("nbformat") != 4 or not isinstance(nb.get("cells"), list):
        return None, [f"{path.name} is not an nbformat 4 notebook"]
    return nb, []


def _answer(student_cells: list[dict], template_cell: dict, grade_id: str, flags: list[str]) -> str | None:
    matches = [c for c in student_cells if isinstance(c, dict) and nbgrader_meta(c).get("grade_id") == grade_id]
    if not matches and template_cell.get("id"):
        matches = [c for c in student_cells if isinstance(c, dict) and c.get("id") == template_cell["id"]]
        if matches:
            flags.append(f"answer {grade_id}: nbgrader metadata removed; matched by cell id")
    if not matches:
        flags.append(f"answer {grade_id}: cell deleted")
        return None
    if len(matches) > 1:
        flags.append(f"answer {grade_id}: {len(matches)} cells claim this id; the first was graded")
    cell = matches[0]
    if cell.get("cell_type") != template_cell["cell_type"]:
        flags.append(f"answer {grade_id}: changed from {template_cell['cell_type']} to {cell.get('cell_type')}")
        return None
    return _source(cell)


def _tampering(student_cells: list[dict], template_cells: list[dict], flags: list[str]) -> None:
    """Locked and test cells come from the release anyway; say when the submission changed them."""
    theirs = {}
    for cell in student_cells:
        if isinstance(cell, dict) and nbgrader_meta(cell).get("grade_id"):
            theirs.setdefault(nbgrader_meta(cell)["grade_id"], []).append(cell)
    order = [g for g in (nbgrader_meta(c).get("grade_id") for c in student_cells if isinstance(c, dict)) if g]
    for cell in template_cells:
        meta = nbgrader_meta(cell)
        grade_id = meta.get("grade_id")
        if not grade_id or meta.get("solution"):
            continue
        found = theirs.get(grade_id, [])
        if not found:
            flags.append(f"locked cell {grade_id}: deleted (the released one was used)")
        elif len(found) > 1:
            flags.append(f"locked cell {grade_id}: duplicated (the released one was used)")
        elif _source(found[0]) != _source(cell) or found[0].get("cell_type") != cell["cell_type"]:
            flags.append(f"locked cell {grade_id}: changed (the released one was used)")
        elif nbgrader_meta(found[0]).get("points") != meta.get("points") or nbgrader_meta(found[0]).get("schema_version") != meta.get("schema_version"):
            flags.append(f"locked cell {grade_id}: nbgrader metadata changed (the released one was used)")
    known = {nbgrader_meta(c).get("grade_id") for c in template_cells}
    for extra in sorted(set(theirs) - known):
        flags.append(f"cell {extra}: not in the released notebook (ignored)")
    released_order = [g for g in (nbgrader_meta(c).get("grade_id") for c in template_cells) if g and g in theirs]
    if [g for g in order if g in released_order] != released_order and all(len(v) == 1 for v in theirs.values()):
        flags.append("cells were reordered (the released order was used)")


def scan(answers: dict[str, str | None]) -> list[str]:
    flags = []
    for grade_id, source in answers.items():
        for reason, pattern in SUSPICIOUS.items():
            if source and re.search(pattern, source):
                flags.append(f"answer {grade_id}: {reason}")
    return flags


def plan(released: dict, submission: dict | None, read_flags: list[str] = ()) -> Plan:
    """What to run for ``submission`` (None: unreadable, so every answer is missing)."""
    result = Plan(flags=list(read_flags), readable=submission is not None)
    student_cells = submission["cells"] if submission else []
    if submission:
        _tampering(student_cells, released["cells"], result.flags)
    for index, cell in enumerate(released["cells"]):
        meta = nbgrader_meta(cell)
        grade_id = meta.get("grade_id")
        if meta.get("solution"):
            answer = _answer(student_cells, cell, grade_id, result.flags) if submission else None
            result.answers[grade_id] = answer
            if cell["cell_type"] == "code":
                result.cells.append({"source": answer if answer is not None else f"raise NotImplementedError('answer {grade_id} missing')",
                                     "grade_id": grade_id, "template_index": index})
        elif cell["cell_type"] == "code" and not (meta.get("grade") or SKIP_TAG in cell.get("metadata", {}).get("tags", [])):
            result.cells.append({"source": _source(cell), "grade_id": None, "template_index": index})
    result.flags += scan(result.answers)
    return result

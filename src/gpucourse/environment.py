"""The environment variables the course reads, each in one function here and nowhere else.

They exist because a notebook's kernel, a test's or CI's subprocess, or the grader's sandbox must
be told something across a process boundary; the grader's own settings live in its nbgrader
configuration instead. Every lesson reads ``smoke()`` through ``gpucourse.preamble``.

- ``GPUCOURSE_SMOKE`` (``smoke()``): ``1`` shrinks data and epochs so that CI and the grader can
  execute every notebook quickly; ``0`` or unset is the full run. Set by ``make test`` and by the
  grader in its sandbox.
- ``GPUCOURSE_OFFLINE`` (``offline()``): ``1`` never tries the network (datasets are generated
  instead of downloaded). Set by ``make test`` and by the grader.
- ``GPUCOURSE_REQUIRE`` (``required_kinds()``): comma-separated accelerator kinds (``cuda``...) whose
  absence makes a cell that needs one an error instead of a skip. Set by ``make test-gpu``.
- ``GPUCOURSE_SELF_CHECK`` (``self_check_off()``): ``0`` turns the notebooks' self-check off.
- ``GPUCOURSE_REFERENCE`` (``reference_name()``): the GPU reference the lessons read (a shipped short
  name, or a path to a JSON file), instead of the one for this machine's GPU (``gpucourse.reference``).
- ``GPUCOURSE_REFERENCE_STRICT`` (``reference_strict()``): ``1`` makes reading what a reference lacks an
  error instead of a sentence; the test suite runs the lessons against a fixture that way.
- ``GPUCOURSE_SLURM_DIR`` (``slurm_dir()``): where lesson 10's local Slurm cluster keeps its
  configuration, keys, logs and spool (``gpucourse.local_slurm``).
- ``GPUCOURSE_COLLECTIVE_SECONDS`` (``collective_seconds()``): how long a rank's collective waits for
  the others before it fails (``gpucourse.launch.init_process_group``); the grader's sandbox sets it
  from its settings (``c.Grading.collective_seconds``), so that every process it starts, ranks
  included, reads the same value. Unset: 45 seconds.
- ``GPUCOURSE_INSTALL_URL``: where the setup cell installs the course helpers from on Colab. The
  setup cell runs before this package exists, so it reads the variable itself.
"""

from __future__ import annotations

import os

SMOKE = "GPUCOURSE_SMOKE"
OFFLINE = "GPUCOURSE_OFFLINE"
REQUIRE = "GPUCOURSE_REQUIRE"
SELF_CHECK = "GPUCOURSE_SELF_CHECK"
INSTALL_URL = "GPUCOURSE_INSTALL_URL"
REFERENCE = "GPUCOURSE_REFERENCE"
REFERENCE_STRICT = "GPUCOURSE_REFERENCE_STRICT"
SLURM_DIR = "GPUCOURSE_SLURM_DIR"
COLLECTIVE_SECONDS = "GPUCOURSE_COLLECTIVE_SECONDS"

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def smoke(default: bool = False) -> bool:
    """Whether ``GPUCOURSE_SMOKE`` asks for the small, fast run (``1``) or the full one (``0``);
    ``default`` when it is unset. Anything else is an error that says what to write."""
    value = os.environ.get(SMOKE, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    if not value:
        return default
    raise ValueError(f"{SMOKE}={value!r} is not understood; use 1 (smoke run) or 0 (full run)")


def offline() -> bool:
    """Whether ``GPUCOURSE_OFFLINE=1`` forbids the network (datasets are generated, not downloaded)."""
    return os.environ.get(OFFLINE, "").strip() == "1"


def required_kinds() -> set[str]:
    """The accelerator kinds that ``GPUCOURSE_REQUIRE`` (comma-separated) says must be present."""
    return {k.strip().lower() for k in os.environ.get(REQUIRE, "").split(",") if k.strip()}


def self_check_off() -> str | None:
    """``GPUCOURSE_SELF_CHECK``'s value when it turns self-check off (``0``, ``false``, ``no``, ``off``), else None."""
    value = os.environ.get(SELF_CHECK, "")
    return value if value.strip().lower() in _FALSE else None


def reference_name() -> str | None:
    """The GPU reference ``GPUCOURSE_REFERENCE`` names (a short name or a JSON file's path), or None."""
    return os.environ.get(REFERENCE, "").strip() or None


def reference_strict() -> bool:
    """Whether ``GPUCOURSE_REFERENCE_STRICT=1`` makes a missing reference entry an error (the test suite)."""
    return os.environ.get(REFERENCE_STRICT, "").strip() == "1"


def slurm_dir(default: str = "/var/tmp/gpucourse-slurm") -> str:
    """Where lesson 10's local Slurm keeps its state: ``GPUCOURSE_SLURM_DIR``, else ``default``."""
    return os.environ.get(SLURM_DIR, "").strip() or default


def collective_seconds(default: float = 45.0) -> float:
    """Seconds a collective waits (``GPUCOURSE_COLLECTIVE_SECONDS``, a positive number), else ``default``."""
    value = os.environ.get(COLLECTIVE_SECONDS, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{COLLECTIVE_SECONDS}={value!r} is not understood; use a positive number of seconds")
    return seconds

"""The project's Python files pass ruff with the settings in pyproject.toml (`make lint` runs the same)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_python_files_pass_ruff():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", str(ROOT)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    hint = "ruff found problems (`make lint` shows them, `.venv/bin/ruff check --fix` mends some)"
    assert result.returncode == 0, f"{hint}:\n{result.stdout}{result.stderr}"

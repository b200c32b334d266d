"""The code's habits, checked: ``ruff check`` (the rules in pyproject.toml) and ``ruff format --check`` pass over
pipeprof/ and tests/. A failure prints what ruff found; ``ruff check --fix`` and ``ruff format`` fix most of it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    """This environment's ruff: the command beside the interpreter, else ``python -m ruff``; skipped without it."""
    beside = Path(sys.executable).with_name("ruff")
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    pytest.importorskip("ruff", reason="ruff comes with the dev extra: pip install -e '.[dev]'")
    return [sys.executable, "-m", "ruff"]


@pytest.mark.parametrize("command", [["check", "--no-fix"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_passes(command):
    # one line per finding: `ruff check` or `ruff format --diff` by hand shows each in full
    done = subprocess.run(
        [*_ruff(), *command, "--output-format", "concise", "pipeprof", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"ruff {' '.join(command)}: exit {done.returncode}\n{done.stdout}{done.stderr}"

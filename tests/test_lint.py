"""The tree passes ruff with the project's rules (pyproject.toml [tool.ruff]: unused imports, undefined names,
bugbear's likely bugs; `ruff check --fix` repairs most) and mypy on workbench/ ([tool.mypy]). What CI runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "workbench", "tests", "benchmarks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_format_changes_nothing():
    """`ruff format workbench tests benchmarks` is how code is laid out ([tool.ruff.format])."""
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "workbench", "tests", "benchmarks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_mypy_finds_nothing():
    """~70 s with a cold cache on 2 cores; the cache (.mypy_cache/, ignored) makes a re-run a few seconds."""
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "workbench"], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]

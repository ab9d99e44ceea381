"""The tree passes ruff with the project's rules (pyproject.toml [tool.ruff]): unused imports, undefined names,
bugbear's likely bugs. What CI runs; `ruff check --fix` repairs most."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "workbench", "tests", "benchmarks"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]

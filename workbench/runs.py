"""Run folders: ``runs/<timestamp>__<name>/`` with config.json, metrics.jsonl and whatever a stage writes.

run = RunDir.create("grpo")                 # runs/20261130-120501__grpo/
run.write_config({"train": {...}})          # + git commit, timestamp, host
run.log_metrics({"step": 1, "reward": 0.25})
RunDir.open("runs/20261130-120501__grpo").read_metrics()
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.paths import project_root, runs_dir

__all__ = ["RunDir", "git_commit", "atomic_json"]


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=project_root(), capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=project_root(),
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else None


@dataclass
class RunDir:
    path: Path

    @classmethod
    def create(cls, name: str, *, path: Path | None = None) -> "RunDir":
        """A new run folder (or `path`, created if missing: resuming reuses it)."""
        if path is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            path = runs_dir() / f"{stamp}__{name}"
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)  # held-out tests and traces: never readable by a sandbox's uid
        return cls(path)

    @classmethod
    def open(cls, path: Path | str) -> "RunDir":
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"no run folder at {path}")
        return cls(path)

    def write_json(self, name: str, data: Any) -> Path:
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str))
        os.replace(tmp, target)
        return target

    def write_config(self, config: dict[str, Any]) -> Path:
        return self.write_json(
            "config.json",
            {
                **config,
                "git_commit": git_commit(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "host": platform.node(),
                "cpus": os.cpu_count(),
            },
        )

    def log_metrics(self, record: dict[str, Any]) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"time": time.time(), **record}, default=str) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        f = self.path / "metrics.jsonl"
        if not f.exists():
            return []
        out = []
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{f}:{n}: corrupt metrics line ({exc.msg} at column {exc.colno})") from None
        return out


def atomic_json(path: Path, data: Any, *, mode: int = 0o644) -> None:
    """Write `data` as JSON to `path` whole or not at all (a reader never sees half a summary)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, mode)
        f.write(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)

"""What a sandbox is allowed: its isolation modes (and what plain mode needs), limits, error type, inside paths.

The vocabulary every sandbox module shares, and what callers configure a sandbox with (a rollout's
`RolloutConfig`, `workbench train`, `workbench eval`); `workbench.sandbox.session` is the session itself.

    mode = resolve_isolation("auto")                  # "bwrap" when bubblewrap is installed, else "none"
    check_plain_mode(root, python)                    # what "none" needs (SandboxError when it cannot hold)
    limits = SandboxLimits(wall_s=300, disk_mb=256)   # per process (setrlimit) and in all (quota)
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from workbench.paths import exposed_paths

__all__ = [
    "Isolation",
    "IsolationMode",
    "SandboxError",
    "SandboxLimits",
    "bwrap_available",
    "resolve_isolation",
    "check_isolation",
    "check_plain_mode",
    "blocking_folder",
    "MARKER_ENV",
    "APP",
    "AGENT_HOME",
    "AGENT_TMP",
]

Isolation = Literal["auto", "bwrap", "none"]  # what a caller asks for
IsolationMode = Literal["bwrap", "none"]  # what a sandbox runs in (`auto` resolved)

MARKER_ENV = "WORKBENCH_SANDBOX"  # the sandbox's host folder, in every sandboxed process; close() sweeps /proc for it
# Where a bwrap sandbox sees its workspace (Harbor's /app), HOME and TMPDIR: the same paths in every
# sandbox. opencode writes all three into its system prompt (the working directory three times), and
# one per-sandbox path there (TMPDIR was the host's /tmp/wb-sbx-<pid>-<start>-<random>/tmp) left a
# group's 8 prompts sharing 290 of 3,053 tokens, so vLLM's prefix cache saved nothing; with these the
# whole shared prompt is the same token for token across a GRPO group.
APP, AGENT_HOME, AGENT_TMP = "/app", "/home/agent", "/var/tmp/agent"


class SandboxError(RuntimeError):
    """A sandbox could not be created (nothing is left behind when this is raised)."""


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


def resolve_isolation(isolation: Isolation) -> IsolationMode:
    """The mode `auto` means here (bwrap when installed); refuses a mode that cannot run."""
    if isolation == "auto":
        return "bwrap" if bwrap_available() else "none"
    if isolation == "bwrap" and not bwrap_available():
        raise SandboxError(
            "isolation='bwrap' but bwrap is not installed (run scripts/setup.sh, or: apt-get install bubblewrap)"
        )
    if isolation == "bwrap" or isolation == "none":
        return isolation
    raise SandboxError(f"unknown isolation {isolation!r}: use auto, bwrap or none")  # an unchecked caller's str


def check_isolation(isolation: Isolation, unsafe_no_sandbox: bool) -> IsolationMode:
    """The sandbox mode training or evaluation will use; refuses plain mode unless asked explicitly."""
    mode = resolve_isolation(isolation)
    if mode == "none" and not unsafe_no_sandbox:
        raise ValueError(
            "isolation resolves to 'none' (no bubblewrap sandbox): the agent would share the host's "
            "files and network and could read the answers. Run scripts/setup.sh (it installs "
            "bubblewrap), or pass --unsafe-no-sandbox to train this way anyway"
        )
    return mode


def check_plain_mode(root: Path, python: str, ro_paths: Sequence[Path] = ()) -> None:
    """In plain mode the fresh uid must walk to its folders, the interpreter and `ro_paths` (the
    harness install) on its own rights, and must not be able to enter the folders that hold answers
    (`paths.private_paths`). The error names the first folder that blocks the way."""
    exposed = exposed_paths()
    if exposed:
        raise SandboxError(
            f"plain mode: {', '.join(map(str, exposed))} can be read by other users (and so by "
            "the agent); run scripts/setup.sh (it makes them 0700) or use bwrap"
        )
    for path in (root, Path(os.path.realpath(python)), *(Path(os.path.realpath(p)) for p in ro_paths)):
        if (p := blocking_folder(path)) is not None:
            raise SandboxError(
                f"plain mode: the sandbox uid cannot enter {p} (mode {stat.filemode(p.stat().st_mode)}) "
                f"on the way to {path}; use bwrap (it mounts what the sandbox needs wherever the "
                "project lives), or a folder others can enter"
            )


def blocking_folder(path: Path) -> Path | None:
    """The first folder, from / down, that a uid with no rights of its own cannot enter on the way
    to `path` (no search bit for others); None when it can walk all the way."""
    for p in [*reversed(path.parents), path]:
        if p.is_dir() and not p.stat().st_mode & stat.S_IXOTH:
            return p
    return None


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for every process in a sandbox (setrlimit, inherited by children), and in all.

    Attributes:
        cpu_s: CPU seconds per process (RLIMIT_CPU).
        memory_mb: address space per process (RLIMIT_AS). opencode is a Bun binary that reserves
            a lot of virtual memory up front: keep this >= 16 GiB or it fails to start.
        file_size_mb: largest file a process may write (RLIMIT_FSIZE).
        nproc: processes and threads of the sandbox's uid (RLIMIT_NPROC; exact with a fresh uid,
            i.e. when the workbench runs as root; otherwise added to the user's current count).
            opencode alone runs ~40 threads.
        open_files: RLIMIT_NOFILE.
        wall_s: wall-clock limit for a waited process.
        disk_mb: allocated size of ws/, home/ and tmp/ together (opencode's own state is ~5 MB).
        max_entries: files and folders in them together.
        max_connections: connections at once to the sandbox's endpoint (bwrap).
    """

    cpu_s: int = 900
    memory_mb: int = 32768
    file_size_mb: int = 64
    nproc: int = 1024
    open_files: int = 4096
    wall_s: float = 600.0
    disk_mb: int = 512
    max_entries: int = 20000
    max_connections: int = 16

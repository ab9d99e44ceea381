"""A sandbox's folders: the task's files checked and written, handed to the sandbox uid, and measured.

`workbench.sandbox.session.Sandbox` owns the layout (``ws/``, ``home/``, ``bin/``, ``tmp/``, ``logs/`` under its
root) and calls these with its own paths; they hold what must be true of those folders: task paths stay
inside the workspace, the four folders the agent may touch are 0700 and its uid's (links lchowned, never
followed), a HOME file written later is its uid's too, and the total written stays within the quota.

    check_task_files(files)                                   # SandboxError before anything is made
    materialise(root, files, workspace=..., home=..., bin_dir=..., tmp=..., logs=..., python=..., uid=...)
    write_home(home, ".config/x.json", text, uid)             # a harness config, owned by the sandbox uid
    over_quota([workspace, home, tmp], limits)                # why it wrote too much, or None
    exceeds([ws, tmp], max_bytes=256 << 20, max_entries=20000)  # "bytes", "entries" or None (the grading jail's)
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Literal

from workbench.sandbox.spec import SandboxError, SandboxLimits

__all__ = ["check_task_files", "materialise", "write_home", "over_quota", "exceeds"]


def check_task_files(files: dict[str, str]) -> None:
    """SandboxError unless every task file is text at a relative path that stays inside the workspace."""
    for rel, text in files.items():
        # Checked up front (NUL, non-str), so that bad task files are a SandboxError, not a TypeError
        # or ValueError from deep inside the copy.
        if not isinstance(rel, str) or not isinstance(text, str):
            raise SandboxError(f"task file {rel!r}: path and content must be text")
        p = Path(rel)
        if p.is_absolute() or ".." in p.parts or not rel.strip() or "\0" in rel:
            raise SandboxError(f"task file path {rel!r} must be relative and stay inside the workspace")


def materialise(
    root: Path,
    files: dict[str, str],
    *,
    workspace: Path,
    home: Path,
    bin_dir: Path,
    tmp: Path,
    logs: Path,
    python: str,
    uid: int | None,
    git_init: bool,
) -> None:
    """Make the sandbox's folders under `root`, write `files` into `workspace`, link ``python``, and
    hand the four agent folders to `uid` (when we are root)."""
    root.chmod(0o711)  # the sandbox uid passes through to its folders; cannot list or write here
    owned = [workspace, home, bin_dir, tmp]
    for d in owned + [home / ".config", home / ".cache", home / ".local" / "share", home / ".local" / "state"]:
        d.mkdir(parents=True, exist_ok=True)
    logs.mkdir(mode=0o700)
    for rel, text in files.items():
        target = workspace / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    (bin_dir / "python").symlink_to(python)
    if git_init:
        subprocess.run(
            ["git", "init", "-q", str(workspace)],
            check=True,
            capture_output=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
        )
    for d in owned:
        d.chmod(0o700)
        if uid is not None:
            for top, dirs, names in os.walk(d):  # does not follow links: lchown the links themselves
                os.lchown(top, uid, uid)
                for name in dirs + names:
                    os.lchown(os.path.join(top, name), uid, uid)


def write_home(home: Path, rel: str, text: str, uid: int | None) -> Path:
    """Write `text` at `rel` under `home` (a harness's config); it and the folders made for it are `uid`'s."""
    path = home / rel
    if Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise SandboxError(f"home file {rel!r} must stay inside the sandbox home")
    made = [p for p in reversed(path.relative_to(home).parents) if p != Path(".")]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if uid is not None:
        for p in [*(home / m for m in made), path]:
            os.lchown(p, uid, uid)
    return path


def over_quota(folders: list[Path], limits: SandboxLimits) -> str | None:
    """Why `folders` together are over `SandboxLimits.disk_mb` / ``max_entries``, or None (`exceeds`)."""
    over = exceeds(folders, max_bytes=limits.disk_mb << 20, max_entries=limits.max_entries)
    if over == "bytes":
        return f"the sandbox wrote more than {limits.disk_mb} MiB"
    if over == "entries":
        return f"the sandbox made more than {limits.max_entries} files and folders"
    return None


def exceeds(folders: list[Path], *, max_bytes: int, max_entries: int) -> Literal["bytes", "entries"] | None:
    """Which bound `folders` together pass: allocated bytes (a sparse file costs what it uses) or files
    and folders; None within both. The walk stops at the first bound passed, so it costs at most
    ``max_entries`` stats however much was written (the agent's sandbox and the grading jail poll it)."""
    entries, used = 0, 0
    stack = list(folders)
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    entries += 1
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    used += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(Path(entry.path))
                    if used > max_bytes:
                        return "bytes"
                    if entries > max_entries:
                        return "entries"
        except OSError:
            continue
    return None

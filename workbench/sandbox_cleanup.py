"""Ending a sandbox: its processes killed wherever they went, its folders removed whatever was done to them.

What `workbench.sandbox.Sandbox.close` (and a failed `Sandbox.create`) rely on, and the sweep of the
folders a runner left when it died without closing. Processes are found through `workbench.procs`
(the one /proc scanner): by process group, by the sandbox's fresh uid, and by `MARKER_ENV` in their
environment (what a process that left its group still carries).

    root = new_folder(base)                       # wb-sbx-<pid>-<starttime>-<random>: its creator is known
    remove_stale(base)                            # folders whose creator is gone
    kill_all(popens, root=root, uid=uid)          # groups, the uid, marked strays; True when all are gone
    force_remove(root)                            # even after the agent chmodded its tree to 000
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .procs import environ, group_alive, kill_group, kill_matching, proc_stat, processes
from .sandbox_spec import MARKER_ENV

__all__ = ["process_key", "new_folder", "remove_stale", "force_remove", "strays", "kill_all"]

_PREFIX = "wb-sbx-"


def process_key(pid: int) -> str | None:
    """``pid-starttime`` of a live process (start time in clock ticks after boot, /proc/PID/stat field
    22), None when it is gone: a reused pid has another start time."""
    fields = proc_stat(pid)
    return None if fields is None else f"{pid}-{fields[19]}"


def new_folder(base: Path | str) -> Path:
    """A fresh folder in `base` whose name carries its creator (this process's pid and start time), so
    that a later `remove_stale` can tell the folders of a runner that died without closing (SIGKILL,
    a kernel restart) and remove them; their processes died with that runner."""
    return Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{process_key(os.getpid())}-", dir=base))


def remove_stale(base: Path) -> None:
    """Remove the sandbox folders in `base` whose creator process is gone (see `new_folder`).
    Folders named before creators were recorded (``wb-sbx-XXXXXXXX``) are left alone."""
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        parts = entry.name.split("-")  # wb, sbx, pid, starttime, random
        if len(parts) == 5 and entry.name.startswith(_PREFIX) and parts[2].isdigit() and parts[3].isdigit():
            if process_key(int(parts[2])) != f"{parts[2]}-{parts[3]}":
                force_remove(Path(entry.path))


def force_remove(path: Path) -> None:
    """Remove a sandbox tree the agent may have chmodded to 000 (we own it as root, or as the same user).

    Only modes inside `path` are touched: a failure on `path` itself (already gone: a sweep and a close
    racing; or its parent refusing) once chmodded the parent, /tmp, to 0700, and every later sandbox's
    uid was refused its workspace ("bwrap: Can't find source path ...: Permission denied")."""
    top = os.path.abspath(path)

    def unlock(func, failed, exc_info):  # noqa: ANN001 - shutil's onerror signature
        if isinstance(exc_info[1], FileNotFoundError):
            return
        failed = os.path.abspath(failed)
        with contextlib.suppress(OSError):
            parent = os.path.dirname(failed)
            if parent == top or parent.startswith(top + os.sep):
                os.chmod(parent, 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
            func(failed)

    shutil.rmtree(path, onerror=unlock)


def strays(root: Path, uid: int | None) -> list[int]:
    """Pids of the sandbox at `root` found outside its process groups: carrying its marker, or (with a
    fresh `uid`) owned by its uid."""
    needle = f"{MARKER_ENV}={root}".encode()
    return [p.pid for p in processes() if (uid is not None and p.uid == uid) or needle in environ(p.pid).split(b"\0")]


def kill_all(popens: list[subprocess.Popen[bytes]], *, root: Path, uid: int | None, timeout_s: float = 10.0) -> bool:
    """Kill the process group each of `popens` leads, every process of `uid` and every stray marked
    with `root`, until none is left; True when all are gone within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        for popen in popens:
            kill_group(popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(0.01)  # reap the leader: no zombie of ours left, and poll() has its status
        if uid is not None:
            kill_matching(lambda p: p.uid == uid)
        left = strays(root, uid)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not left and not any(group_alive(p.pid) for p in popens):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)

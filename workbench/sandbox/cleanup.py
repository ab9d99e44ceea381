"""Ending a sandbox: its processes killed wherever they went, its folders removed whatever was done to them.

What `workbench.sandbox.session.Sandbox.close` (and a failed `Sandbox.create`) rely on, and the sweep of the
folders a runner left when it died without closing. Processes are found through `workbench.procs`
(the one /proc scanner): by process group, by the sandbox's fresh uid, and by `MARKER_ENV` in their
environment (what a process that left its group still carries).

    root = new_folder(base)                       # wb-sbx-<pid>-<starttime>-<random>: its creator is known
    remove_stale(base)                            # folders whose creator is gone
    kill_all(popens, root=root, uid=uid)          # groups, the uid, marked strays; True when all are gone
    force_remove(root)                            # even after the agent chmodded its tree to 000
    remove_owned(uid)                             # plain mode: what its uid left in /tmp, /var/tmp, /dev/shm
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from workbench.procs import environ, group_alive, kill_group, kill_matching, proc_stat, processes
from workbench.sandbox.spec import MARKER_ENV

__all__ = ["process_key", "new_folder", "remove_stale", "force_remove", "remove_owned", "strays", "kill_all"]

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
    Folders named before creators were recorded (``wb-sbx-XXXXXXXX``) are left alone, and so is any
    entry lstat does not show as a real folder of our euid: the temp dir is shared, and anyone may
    plant a ``wb-sbx-…`` there for root to remove (`force_remove` checks again on its descriptor)."""
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    me = os.geteuid()
    for entry in entries:
        parts = entry.name.split("-")  # wb, sbx, pid, starttime, random
        if len(parts) == 5 and entry.name.startswith(_PREFIX) and parts[2].isdigit() and parts[3].isdigit():
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
                continue
            if process_key(int(parts[2])) != f"{parts[2]}-{parts[3]}":
                force_remove(Path(entry.path), owner=me)


# Every folder inside the tree is opened relative to its parent's descriptor and never through a link,
# so no component of a path can be swapped for a link to send a chmod or an unlink elsewhere.
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_PASSES = 3  # listings of one folder: entries moved in while it is emptied (a racing process) still go


def force_remove(path: Path, *, owner: int | None = None) -> None:
    """Remove a sandbox tree the agent may have chmodded to 000 (we own it as root, or as the same user).
    With `owner`, only when `path` is a real folder of that uid (checked on its descriptor).

    Only modes inside `path` are touched: a failure on `path` itself (already gone: a sweep and a close
    racing; or its parent refusing) once chmodded the parent, /tmp, to 0700, and every later sandbox's
    uid was refused its workspace ("bwrap: Can't find source path ...: Permission denied"). And only
    through descriptors: the removal's error handler once chmodded and unlinked by path, so a folder
    swapped for a link mid-removal had root chmod (and empty) the link's target. Best effort: what
    cannot be removed is left, never raised."""
    parent, name = os.path.split(os.path.abspath(path))
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the caller's: followed
    except OSError:
        return
    try:
        top = _open_dir(parent_fd, name, inside=False)
        if top is None:  # gone, or not a folder (a link is never followed)
            return
        if owner is not None and os.fstat(top).st_uid != owner:
            os.close(top)
            return
        _empty_and_remove(parent_fd, name, top)
    finally:
        os.close(parent_fd)


# The folders every user may write to: a plain-mode sandbox shares them with the host (bwrap gives it its own /tmp)
SHARED_TMP = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))


def remove_owned(uid: int, folders: tuple[Path, ...] = SHARED_TMP) -> list[str]:
    """Remove what `uid` owns directly in each of `folders`: a plain-mode sandbox runs as its own fresh uid in the
    host's /tmp, and what it wrote there (``dd of=/tmp/fill`` in the attacks' tests: 4 MiB left per run) outlived
    it. Only entries of that uid, checked on the entry itself (a link is removed, never followed); folders through
    `force_remove` with the same owner check. Returns the names removed; what cannot be removed is left."""
    removed = []
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    force_remove(Path(entry.path), owner=uid)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue
            removed.append(entry.path)
    return removed


def _empty_and_remove(parent_fd: int, name: str, fd: int) -> None:
    """Empty the folder open as `fd` (`name` in `parent_fd`), then remove it; iterative (a deep tree
    is no RecursionError), one descriptor per level."""
    frames = [(fd, name, _names(fd), 1)]  # folder, its name in the one below it, names left, listings
    try:
        while frames:
            fd, name, left, passes = frames[-1]
            if left:
                child = left.pop()
                sub = _open_dir(fd, child, inside=True)
                if sub is None:
                    _unlink(fd, child)
                else:
                    frames.append((sub, child, _names(sub), 1))
                continue
            again = _names(fd) if passes < _PASSES else []
            if again:
                frames[-1] = (fd, name, again, passes + 1)
                continue
            frames.pop()
            os.close(fd)
            below = frames[-1][0] if frames else parent_fd
            _rmdir(below, name, unlock=bool(frames))  # the top's parent is not ours: never unlocked
    finally:
        for frame in frames:
            os.close(frame[0])


def _open_dir(dir_fd: int, name: str, *, inside: bool) -> int | None:
    """`name` in `dir_fd` open as a folder, unlocked (u+rwx) when the agent locked it; None when it is
    not a folder (a file, a link: never followed) or cannot be opened. `dir_fd` itself is unlocked
    only when it is `inside` the tree."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except PermissionError:
        if not inside:
            return None
        _unlock(dir_fd)
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    try:
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    except PermissionError:  # a folder chmodded 000 (not root): unlock it through an O_PATH descriptor
        try:
            fd = _reopen_unlocked(dir_fd, name)
        except OSError:
            return None
    except OSError:  # gone, or swapped for a link or a file since the stat
        return None
    if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
        _unlock(fd)
    return fd


def _reopen_unlocked(dir_fd: int, name: str) -> int:
    # An O_PATH descriptor needs no permission on the folder; chmod and reopen through its /proc link,
    # which names that very folder (what glibc's fchmodat(AT_SYMLINK_NOFOLLOW) does).
    path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
        return os.open(f"/proc/self/fd/{path_fd}", _DIR)
    finally:
        os.close(path_fd)


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o700)


def _names(fd: int) -> list[str]:
    try:
        return os.listdir(fd)
    except OSError:
        return []


def _unlink(dir_fd: int, name: str) -> None:
    _retry(lambda: os.unlink(name, dir_fd=dir_fd), dir_fd)


def _rmdir(dir_fd: int, name: str, *, unlock: bool) -> None:
    try:
        _retry(lambda: os.rmdir(name, dir_fd=dir_fd), dir_fd if unlock else None, quiet=False)
    except NotADirectoryError:  # swapped for a link or a file since it was emptied: the name goes
        if unlock:
            _unlink(dir_fd, name)
    except OSError:
        pass


def _retry(remove: Callable[[], None], unlock_fd: int | None, *, quiet: bool = True) -> None:
    """`remove`, again after unlocking `unlock_fd` (a folder inside the tree) when it was refused."""
    try:
        try:
            remove()
        except PermissionError:
            if unlock_fd is None:
                raise
            _unlock(unlock_fd)
            remove()
    except FileNotFoundError:
        pass
    except OSError:
        if not quiet:
            raise


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

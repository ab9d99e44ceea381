"""Copy a folder an agent wrote, within limits: the copy cannot be made to fill the disk or crash us.

A finished workspace is hostile input. `shutil.copytree` recurses (a 600-deep tree raises
RecursionError), expands sparse files (a 100 GB hole becomes 100 GB of zeros), follows nothing but
copies FIFOs and devices (reading a FIFO blocks forever) and has no size bound. `copy_tree` walks
iteratively, copies regular files, folders and symlinks (as links, never followed), skips special
files, and stops with `CopyLimitError` as soon as the apparent size, the number of entries or the
depth passes `CopyLimits` (apparent size: a sparse file counts at its full length, so it is refused
before anything is written).

    copy_tree(src, dest, CopyLimits(max_bytes=256 << 20))   # CopyLimitError past a limit

`read_bounded(root, "a/b.json", limit)` reads one file an agent wrote the same way (no link followed on the
way down, a regular file only, at most `limit` bytes): a harness's own report of its run.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["CopyLimits", "CopyLimitError", "copy_tree", "read_bounded"]


@dataclass(frozen=True)
class CopyLimits:
    """Bounds of one copy: total apparent bytes of regular files, entries (files, folders, links), depth."""

    max_bytes: int = 256 << 20
    max_entries: int = 20000
    max_depth: int = 64


class CopyLimitError(OSError):
    """The source passed a `CopyLimits` bound; what was copied so far stays in the destination."""


# The source is walked through descriptors: each folder opened relative to the one it was listed in and
# never through a link, each file opened without following a link or waiting on a FIFO, and copied only
# when fstat of that descriptor shows a regular file. An agent still running may swap any entry between
# the check and the open; as root, a path-based open once copied a host file (a link swapped in) into
# the graded copy, or blocked forever on a FIFO.
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SWAPPED = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)  # gone, or no longer what lstat saw


def copy_tree(src: Path, dest: Path, limits: CopyLimits = CopyLimits(), *, skip: tuple[str, ...] = ()) -> None:
    """Copy `src` into the new folder `dest` (which must not exist). Names in `skip` are left out at the
    top level (``.git``). Files that vanish mid-copy (the agent may still be running), or that are
    swapped for something else between their check and their open, are skipped."""
    dest.mkdir()
    try:
        top = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the caller's path: followed
    except FileNotFoundError:
        return
    total = entries = 0
    # Depth first, one descriptor per level (at most `max_depth`): folder, names left, its copy, depth.
    frames: list[tuple[int, list[str], Path, int]] = [(top, _names(top, skip), dest, 0)]
    try:
        while frames:
            here, names, there, depth = frames[-1]
            if not names:
                os.close(here)
                frames.pop()
                continue
            name = names.pop()
            entries += 1
            if entries > limits.max_entries:
                raise CopyLimitError(f"more than {limits.max_entries} files and folders")
            target = there / name
            try:
                st = os.lstat(name, dir_fd=here)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= limits.max_depth:
                    raise CopyLimitError(f"folders nested deeper than {limits.max_depth}")
                sub = _open(name, _DIR, here)
                if sub is not None:
                    frames.append((sub, _names(sub, ()), target, depth + 1))
                    target.mkdir()
            elif stat.S_ISLNK(st.st_mode):
                try:
                    os.symlink(os.readlink(name, dir_fd=here), target)
                except OSError as e:
                    if e.errno not in (*_SWAPPED, errno.EINVAL):  # EINVAL: no longer a link
                        raise
            elif stat.S_ISREG(st.st_mode):
                total += _copy_file(here, name, target, total, limits.max_bytes)
            # FIFOs, sockets, devices: skipped (reading a FIFO would block the copy forever)
    finally:
        for frame in frames:
            os.close(frame[0])


def read_bounded(root: Path, rel: str, limit: int) -> bytes | None:
    """The first `limit` bytes of the regular file `rel` below `root`, walked through descriptors (a link at
    any step, a FIFO or device, a path leaving `root`: None; also None when it is not there)."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        return None
    fd: int | None = os.open(root, _DIR)
    try:
        for part in parts[:-1]:
            assert fd is not None
            parent, fd = fd, None  # closed below, whatever the open of its child does
            try:
                fd = _open(part, _DIR, parent)
            finally:
                os.close(parent)
            if fd is None:
                return None
        assert fd is not None
        file_fd = _open(parts[-1], _FILE, fd)
    finally:
        if fd is not None:
            os.close(fd)
    if file_fd is None:
        return None
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):  # a folder, a FIFO, a device: never read
        os.close(file_fd)
        return None
    with os.fdopen(file_fd, "rb") as f:
        os.set_blocking(file_fd, True)
        return f.read(limit)


def _names(fd: int, skip: tuple[str, ...]) -> list[str]:
    """The folder's names, last first (popped in sorted order)."""
    return sorted((n for n in os.listdir(fd) if n not in skip), reverse=True)


def _open(name: str, flags: int, dir_fd: int) -> int | None:
    """`name` in `dir_fd` opened with `flags`, None when it is gone or was swapped for a link."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in _SWAPPED:
            return None
        raise


def _copy_file(dir_fd: int, name: str, target: Path, used: int, max_bytes: int) -> int:
    """Copy the regular file `name` in `dir_fd` to `target` when it is one (fstat of the open descriptor);
    its size as measured there is what counts against `max_bytes` (`used` so far); the bytes counted."""
    fd = _open(name, _FILE, dir_fd)
    if fd is None:
        return 0
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device swapped in since the lstat: never read
            return 0
        if used + st.st_size > max_bytes:
            raise CopyLimitError(f"more than {max_bytes >> 20} MiB of files")
        os.set_blocking(fd, True)  # O_NONBLOCK was for the open; reads of a regular file do not wait
        with open(target, "wb") as g:
            # Never more than the file's size when it was measured: a file still growing cannot push the
            # copy past the bound.
            shutil.copyfileobj(_Capped(f, st.st_size), g)
    os.chmod(target, stat.S_IMODE(st.st_mode) & 0o755)
    return st.st_size


class _Capped:
    """A binary reader that ends after `left` bytes."""

    def __init__(self, f: BinaryIO, left: int) -> None:
        self.f, self.left = f, left

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        data = self.f.read(self.left if n < 0 else min(n, self.left))
        self.left -= len(data)
        return data

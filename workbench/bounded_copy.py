"""Copy a folder an agent wrote, within limits: the copy cannot be made to fill the disk or crash us.

A finished workspace is hostile input. `shutil.copytree` recurses (a 600-deep tree raises
RecursionError), expands sparse files (a 100 GB hole becomes 100 GB of zeros), follows nothing but
copies FIFOs and devices (reading a FIFO blocks forever) and has no size bound. `copy_tree` walks
iteratively, copies regular files, folders and symlinks (as links, never followed), skips special
files, and stops with `CopyLimitError` as soon as the apparent size, the number of entries or the
depth passes `CopyLimits` (apparent size: a sparse file counts at its full length, so it is refused
before anything is written).

    copy_tree(src, dest, CopyLimits(max_bytes=256 << 20))   # CopyLimitError past a limit
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["CopyLimits", "CopyLimitError", "copy_tree"]


@dataclass(frozen=True)
class CopyLimits:
    """Bounds of one copy: total apparent bytes of regular files, entries (files, folders, links), depth."""

    max_bytes: int = 256 << 20
    max_entries: int = 20000
    max_depth: int = 64


class CopyLimitError(OSError):
    """The source passed a `CopyLimits` bound; what was copied so far stays in the destination."""


def copy_tree(src: Path, dest: Path, limits: CopyLimits = CopyLimits(), *, skip: tuple[str, ...] = ()) -> None:
    """Copy `src` into the new folder `dest` (which must not exist). Names in `skip` are left out at the
    top level (``.git``). Files that vanish mid-copy (the agent may still be running) are skipped."""
    dest.mkdir()
    total = entries = 0
    stack: list[tuple[Path, Path, int]] = [(src, dest, 0)]
    while stack:
        here, there, depth = stack.pop()
        try:
            names = sorted(os.listdir(here))
        except FileNotFoundError:
            continue
        for name in names:
            if depth == 0 and name in skip:
                continue
            entries += 1
            if entries > limits.max_entries:
                raise CopyLimitError(f"more than {limits.max_entries} files and folders")
            source, target = here / name, there / name
            try:
                st = os.lstat(source)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= limits.max_depth:
                    raise CopyLimitError(f"folders nested deeper than {limits.max_depth}")
                target.mkdir()
                stack.append((source, target, depth + 1))
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(source), target)
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > limits.max_bytes:
                    raise CopyLimitError(f"more than {limits.max_bytes >> 20} MiB of files")
                try:
                    with open(source, "rb") as f, open(target, "wb") as g:
                        # Never more than the file's size when it was measured: a file still growing
                        # cannot push the copy past the bound.
                        shutil.copyfileobj(_Capped(f, st.st_size), g)
                except FileNotFoundError:
                    continue
                os.chmod(target, stat.S_IMODE(st.st_mode) & 0o755)
            # FIFOs, sockets, devices: skipped (reading a FIFO would block the copy forever)


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

"""Shared-memory segments an engine leaves behind: vLLM's buffers in /dev/shm (Python's ``psm_*``, multiprocessing's
``sem.mp-*``) outlive a vLLM stopped mid-step, 160-250 MB each for qwen-coder, held in RAM until the machine
restarts. `workbench.engine.vllm.Engine` notes the segments before it starts and, once its process group is gone,
unlinks those made since that no live process maps or holds open (another engine's stay).

    before = shm_segments()
    ...                                   # the engine runs and stops
    sweep_shm(before)                     # -> how many segments went
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["shm_segments", "sweep_shm"]


def shm_segments() -> set[str]:
    """The shared-memory segments in /dev/shm that Python and multiprocessing name (``psm_*``, ``sem.mp-*``)."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(("psm_", "sem.mp-"))}
    except OSError:
        return set()


def _shm_in_use() -> set[str]:
    """Names in /dev/shm that a live process maps or holds open."""
    used: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                used.update(line.split("/dev/shm/", 1)[1].split()[0] for line in maps if "/dev/shm/" in line)
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("/dev/shm/"):
                        used.add(target[len("/dev/shm/") :].split()[0])
    return used


def sweep_shm(before: set[str]) -> int:
    """Unlink the segments made since `before` that no live process uses; how many went."""
    new = shm_segments() - before
    if not new:
        return 0
    gone = 0
    for name in new - _shm_in_use():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")
            gone += 1
    return gone

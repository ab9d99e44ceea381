"""What this machine lets the grading jail use: prlimit, setpriv, a working bwrap, ``unshare --net``.

Probed once per process (`host`, cached) and read by `workbench.verify.jail.Jail`, which starts every
test process through these tools; `resolve` turns a ``sandbox=`` argument ("auto", "bwrap", "none")
into the host and whether to use bwrap, and `guards` names what will then isolate the tests. Also the
two questions plain mode (no bwrap, so no remapped file system) asks of the host as root: which
Python the fresh test uid may run (`interpreter`), and whether it can walk down to a path (`reachable`).

    info, use_bwrap = resolve("auto")        # RuntimeError: sandbox="bwrap" asked but none works here
    guards(info, use_bwrap)                  # ["rlimits", "uid", "bwrap", "netns"] as root with bwrap
    interpreter(info, use_bwrap)             # the Python that runs graded code
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SANDBOXES", "Host", "host", "resolve", "guards", "interpreter", "python_dirs", "reachable"]

SANDBOXES = ("auto", "bwrap", "none")


@dataclass(frozen=True)
class Host:
    """What this machine allows, probed once per process."""

    root: bool
    prlimit: str
    setpriv: str
    bwrap: str | None  # a bwrap that can create the namespaces we use
    unshare: str | None  # `unshare --net` works (root without bwrap)


@functools.cache
def host() -> Host:
    prlimit, setpriv = shutil.which("prlimit"), shutil.which("setpriv")
    if prlimit is None or setpriv is None:
        raise RuntimeError("verify needs prlimit and setpriv (util-linux) to run tests under limits")
    bwrap = shutil.which("bwrap")
    if bwrap and not _works(
        [bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--die-with-parent", "true"]
    ):
        bwrap = None
    root = os.geteuid() == 0
    unshare = shutil.which("unshare") if root else None
    if unshare and not _works([unshare, "--net", "true"]):
        unshare = None
    return Host(root=root, prlimit=prlimit, setpriv=setpriv, bwrap=bwrap, unshare=unshare)


def resolve(sandbox: str) -> tuple[Host, bool]:
    """The host and whether to use bwrap, for a ``sandbox`` argument."""
    if sandbox not in SANDBOXES:
        raise ValueError(f"unknown sandbox {sandbox!r}: expected one of {SANDBOXES}")
    info = host()
    if sandbox == "bwrap" and info.bwrap is None:
        raise RuntimeError("sandbox='bwrap' but bwrap is not installed or cannot create namespaces here")
    return info, sandbox != "none" and info.bwrap is not None


def guards(host: Host, bwrap: bool) -> list[str]:
    return [
        "rlimits",
        *(["uid"] if host.root else []),
        *(["bwrap"] if bwrap else []),
        *(["netns"] if bwrap or host.unshare else []),
    ]


def interpreter(info: Host, bwrap: bool) -> str:
    """The Python that runs graded code: ours under bwrap (its folders are mounted); in plain mode as
    root, one the test uid reaches on its own rights (a pyenv under /root is not), else none."""
    if bwrap or not info.root or all(reachable(Path(p)) for p in python_dirs()):
        # its folder as mounted (`python_dirs` are real paths): a venv reached through a linked folder (a worktree's
        # .venv -> the main checkout's) is not at the linked path in the jail, and every test would "crash"
        here = os.path.dirname(sys.executable)
        return os.path.join(os.path.realpath(here), os.path.basename(sys.executable))
    for candidate in ("/usr/local/bin/python3", "/usr/bin/python3"):
        real = Path(os.path.realpath(candidate))
        if real.exists() and reachable(real.parent):
            return candidate
    raise RuntimeError("plain grading (sandbox='none'): no Python the test uid may run; use bwrap")


def _works(argv: list[str]) -> bool:
    try:
        return (
            subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def python_dirs() -> list[str]:
    """Directories the interpreter needs: the venv, its base installation, the real binary's."""
    dirs = {
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
    }
    return sorted(os.path.realpath(d) for d in dirs)


def reachable(path: Path) -> bool:
    """Whether a uid with no rights of its own can walk down to ``path``."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents])

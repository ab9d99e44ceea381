"""Process-group helpers: every process the workbench starts runs in its own group and dies with it.

    proc = subprocess.Popen(cmd, start_new_session=True)   # pgid == proc.pid
    stop_group(proc)                                       # TERM, then KILL, then wait until gone

"Gone" means no member left running. Zombies do not count: a killed group's orphans are re-parented
to pid 1, which here reaps them only every ~2 s, and until then `kill(-pgid, 0)` still finds them.

A group must also die when *we* die without cleaning up (SIGKILL, a notebook kernel restart):

    subprocess.Popen(die_with_us(cmd), start_new_session=True)   # group killed if this process dies
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "free_port",
    "unwind_on_signals",
    "Proc",
    "proc_stat",
    "processes",
    "environ",
    "kill_matching",
    "group_alive",
    "kill_group",
    "stop_group",
    "die_with_us",
    "exit_signal",
    "signal_name",
]


def unwind_on_signals() -> None:
    """Make SIGINT and SIGTERM unwind (KeyboardInterrupt), so `with` blocks stop what they started.

    SIGINT: Python installs its KeyboardInterrupt handler only when SIGINT is not ignored at start,
    and a command started in the background by a non-interactive shell (``make test &``, nohup, some
    CI runners and job launchers) inherits SIGINT ignored: Ctrl-C or a notebook's interrupt then did
    nothing, and a test waiting 90 s for the runner to exit failed (the "plain mode Ctrl-C hang"; a
    `nohup` learning demo ignored SIGINT the same way). SIGTERM: the default handler ends the process
    at once and the engine's process group would outlive us. Python runs handlers in the main thread,
    so this holds with the proxy's server thread running too. Every entry point calls it: the CLI and
    each benchmark script."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, stop)


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first, so `fields[2]` is the process
    group and `fields[19]` the start time), or None when the process is gone or is a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields


@dataclass(frozen=True)
class Proc:
    """A live (not zombie) process as /proc shows it."""

    pid: int
    pgid: int
    uid: int  # owner of /proc/PID: the effective uid (setpriv sets real and effective alike)
    threads: int  # what RLIMIT_NPROC counts for it
    start: int  # start time in clock ticks after boot: a reused pid has another


def processes() -> list[Proc]:
    """Every live, non-zombie process: the one /proc scanner the workbench uses."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = proc_stat(int(name))
        try:
            uid = os.stat(f"/proc/{name}").st_uid
        except OSError:
            continue
        if fields is not None:
            found.append(Proc(int(name), int(fields[2]), uid, int(fields[17]), int(fields[19])))
    return found


def environ(pid: int) -> bytes:
    """The process's environment block (``NAME=value\\0...``), empty when unreadable or gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def kill_matching(match: Callable[[Proc], bool], *, rounds: int = 100) -> bool:
    """SIGKILL every process (but us) `match` selects, until none is left; True when none is.

    Repeated: a process may fork between the scan and the kill; each round leaves fewer (and a
    fresh uid's RLIMIT_NPROC bounds how many it can make)."""
    me = os.getpid()
    for _ in range(rounds):
        victims = [p.pid for p in processes() if p.pid != me and match(p)]
        if not victims:
            return True
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)
    return False


def group_alive(pgid: int) -> bool:
    """True while a process of the group is running. Zombies do not count: a killed member that had
    been orphaned (an agent's `cmd &`) waits for init to reap it, which here takes up to ~2 s."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id was reused by someone else's group: not ours any more
        return False
    return any(p.pgid == pgid for p in processes())


def exit_signal(returncode: int, *, bwrap: bool) -> int:
    """The signal that ended a process, 0 when it exited: Popen reports -N, and bwrap, whose child
    it was, exits with 128 + N (the exec chain without bwrap passes the signal through)."""
    return -returncode if returncode < 0 else returncode - 128 if bwrap and returncode > 128 else 0


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen, *, grace_s: float = 10.0, gone_timeout_s: float = 10.0) -> bool:
    """SIGTERM the group, SIGKILL after `grace_s` (at once when 0), then wait until no member runs.

    Returns True when the group is gone within `gone_timeout_s`.
    """
    pgid = proc.pid
    if grace_s > 0:
        kill_group(pgid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    kill_group(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    deadline = time.monotonic() + gone_timeout_s
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        kill_group(pgid, signal.SIGKILL)
        time.sleep(0.05)
    return True


_WATCHDOG = Path(__file__).resolve().with_name("_watchdog.py")


def die_with_us(
    argv: list[str],
    *,
    marker: str | None = None,
    grace_s: float = 0.0,
    uid: int | None = None,
    remove: Path | None = None,
) -> list[str]:
    """`argv` behind a watchdog that SIGKILLs its own process group (start the command with
    ``start_new_session=True``), every process whose environment holds `marker` (``NAME=value``) and
    every process of `uid`, within 0.5 s of this process dying, however it dies; after SIGTERM and up to `grace_s` for the
    command to exit, when `grace_s` > 0. Then it deletes the folder `remove` (a private TMPDIR this process would
    have removed itself), if given.

    The command inherits stdin/stdout/stderr and the environment; the watchdog's exit status is the
    command's. It costs one small Python process (~10 MB) per command.
    """
    return [
        sys.executable,
        "-I",
        "-S",
        str(_WATCHDOG),
        str(os.getpid()),
        marker or "",
        str(grace_s),
        str(-1 if uid is None else uid),
        str(remove or ""),
        "--",
        *argv,
    ]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the engine's and the proxy's, when none is given)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]

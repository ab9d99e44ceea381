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
import subprocess
import sys
import time

__all__ = ["proc_stat", "group_alive", "kill_group", "stop_group", "die_with_us", "exit_signal", "signal_name"]


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first, so `fields[2]` is the process
    group and `fields[19]` the start time), or None when the process is gone or is a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields


def group_alive(pgid: int) -> bool:
    """True while a process of the group is running. Zombies do not count: a killed member that had
    been orphaned (an agent's `cmd &`) waits for init to reap it, which here takes up to ~2 s."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id was reused by someone else's group: not ours any more
        return False
    return any((fields := proc_stat(int(pid))) is not None and int(fields[2]) == pgid
               for pid in os.listdir("/proc") if pid.isdigit())


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


# The watchdog `die_with_us` puts in front of a command. It polls getppid() rather than relying on
# PR_SET_PDEATHSIG (`setpriv --pdeathsig`), because that fires when the *thread* that forked the
# child exits (a rollout pool's worker thread, a notebook's executor thread), not when the process
# does; and because it takes down the whole process group, plus every process carrying `marker` in
# its environment (opencode starts its tool commands in new sessions: an agent's `nohup x &` leaves
# the group), not just the command. With a grace period it first SIGTERMs the group and waits that
# long for the command to exit (vLLM unlinks ~400 MB of /dev/shm segments on SIGTERM; SIGKILLed,
# they stay until reboot). It ignores TERM/INT/HUP itself: a group signal reaches the command too,
# and the watchdog stays to pass on the command's exit status (a signal death is re-raised on
# itself, so the caller sees the same returncode as without it). It is self-contained (run with
# `python -I -S`: no site, no imports of ours, ~50 ms), hence its own copy of the
# group scan.
_WATCHDOG = """
import os, signal, subprocess, sys, time
parent, marker, grace = int(sys.argv[1]), sys.argv[2].encode(), float(sys.argv[3])
if os.getppid() != parent:  # gone before the command even started
    os.killpg(0, signal.SIGKILL)
child = subprocess.Popen(sys.argv[4:])
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # after the spawn: SIG_IGN survives exec
    signal.signal(s, signal.SIG_IGN)
def others():  # live members of our group but us (vLLM's engine core, its resource tracker...)
    me, group, n = os.getpid(), os.getpgid(0), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        n += int(pid) != me and int(fields[2]) == group and fields[0] not in "ZX"
    return n
def down():
    if grace > 0:  # the whole group, not just the command: the tracker unlinks shm after it exits
        os.killpg(0, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while (child.poll() is None or others()) and time.monotonic() < deadline:
            time.sleep(0.1)
    for _ in range(3 if marker else 0):  # a marked process may fork while we scan
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if int(pid) != os.getpid() and marker in f.read().split(b"\\0"):
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    os.killpg(0, signal.SIGKILL)
while True:
    try:
        code = child.wait(0.5)
        break
    except subprocess.TimeoutExpired:
        if os.getppid() != parent:
            down()
if code < 0:
    if code != -signal.SIGKILL:
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code if code >= 0 else 128 - code)
"""


def die_with_us(argv: list[str], *, marker: str | None = None, grace_s: float = 0.0) -> list[str]:
    """`argv` behind a watchdog that SIGKILLs its own process group (start the command with
    ``start_new_session=True``), and every process whose environment holds `marker` (``NAME=value``),
    within 0.5 s of this process dying, however it dies; after SIGTERM and up to `grace_s` for the
    command to exit, when `grace_s` > 0.

    The command inherits stdin/stdout/stderr and the environment; the watchdog's exit status is the
    command's. It costs one small Python process (~10 MB) per command.
    """
    return [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(os.getpid()), marker or "", str(grace_s), *argv]

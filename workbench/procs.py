"""Process-group helpers: every process the workbench starts runs in its own group and dies with it.

    proc = subprocess.Popen(cmd, start_new_session=True)   # pgid == proc.pid
    stop_group(proc)                                       # TERM, then KILL, then wait until gone

"Gone" means no member left, zombies included: a killed group's orphans are re-parented to pid 1,
which reaps them a moment later, and until then `kill(-pgid, 0)` still finds them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

__all__ = ["group_alive", "kill_group", "stop_group"]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id was reused by someone else's group: not ours any more
        return False
    return True


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen, *, grace_s: float = 10.0, gone_timeout_s: float = 10.0) -> bool:
    """SIGTERM the group, SIGKILL after `grace_s` (at once when 0), then wait for every member to be reaped.

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

"""The watchdog `procs.die_with_us` puts in front of a command: it takes the command's whole process
group down when the process that started it dies, however it dies.

Run as ``python -I -S _watchdog.py PARENT_PID MARKER GRACE_S UID REMOVE -- ARGV...`` (no site, nothing of
ours imported: ~50 ms to start). It starts ARGV, then polls getppid() every 0.5 s rather than relying
on PR_SET_PDEATHSIG (`setpriv --pdeathsig`), because that fires when the *thread* that forked the
child exits (a rollout pool's worker thread, a notebook's executor thread), not when the process
does. When the parent is gone it kills its own process group, every process carrying MARKER
(``NAME=value``) in its environment (opencode starts its tool commands in new sessions: an agent's
``nohup x &`` leaves the group) and every process of UID (a sandbox's fresh uid: also one that
cleared its environment). With GRACE_S > 0 it first SIGTERMs the group and waits that long for the
command to exit (vLLM unlinks ~400 MB of /dev/shm segments on SIGTERM; SIGKILLed, they stay until
reboot). It ignores TERM/INT/HUP itself: a group signal reaches the command too, and the watchdog
stays to pass on the command's exit status (a signal death is re-raised on itself, so the caller
sees the same returncode as without it). With REMOVE (a folder, "" for none), once the parent is gone and the
command's group killed, it deletes that folder too: the engine's private TMPDIR, which the parent would have
removed on a clean stop (a SIGKILLed runner left one empty ``wb-vllm-*`` per kill). Standard library only, hence
its own /proc scan.
"""

import os
import shutil
import signal
import subprocess
import sys
import time


def _others(me: int, group: int) -> int:
    """Live members of our process group but us (vLLM's engine core, its resource tracker...)."""
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        n += int(pid) != me and int(fields[2]) == group and fields[0] not in "ZX"
    return n


def _kill_marked(me: int, marker: bytes, uid: int) -> None:
    for _ in range(3):  # a marked process may fork while we scan
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) == me:
                continue
            try:
                mine = uid >= 0 and os.stat(f"/proc/{pid}").st_uid == uid
                if not mine and marker:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        mine = marker in f.read().split(b"\0")
                if mine:
                    os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def _kill_others(me: int, group: int) -> None:
    """SIGKILL every other member of our group and wait (up to 2 s) until none is left."""
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        left = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(pid) != me and int(fields[2]) == group and fields[0] not in "ZX":
                    os.kill(int(pid), signal.SIGKILL)
                    left += 1
            except OSError:
                pass
        if not left:
            return
        time.sleep(0.05)


def main() -> None:
    parent, marker, grace, uid = int(sys.argv[1]), sys.argv[2].encode(), float(sys.argv[3]), int(sys.argv[4])
    remove = sys.argv[5]
    argv = sys.argv[7:] if sys.argv[6] == "--" else sys.argv[6:]
    if os.getppid() != parent:  # gone before the command even started
        os.killpg(0, signal.SIGKILL)
    child = subprocess.Popen(argv)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # after the spawn: SIG_IGN survives exec
        signal.signal(s, signal.SIG_IGN)
    me, group = os.getpid(), os.getpgid(0)

    def down() -> None:
        if grace > 0:  # the whole group, not just the command: the tracker unlinks shm after it exits
            os.killpg(0, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while (child.poll() is None or _others(me, group)) and time.monotonic() < deadline:
                time.sleep(0.1)
        if marker or uid >= 0:
            _kill_marked(me, marker, uid)
        if remove:  # the group first (nothing may write there after), then the folder, then ourselves
            _kill_others(me, group)
            shutil.rmtree(remove, ignore_errors=True)
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


if __name__ == "__main__":
    main()

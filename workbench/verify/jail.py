"""The grading jail: one verification's private folder, and how its test processes start and stop.

Every test process is exec'd through util-linux ``prlimit`` (time, memory, file size, processes),
then, with bubblewrap, new pid/net/ipc/uts/cgroup namespaces showing only /usr (+ /bin, /lib...), the
interpreter, the workspace copy and the runner (HumanEval's data file masked); then ``setpriv`` to a
fresh uid with every capability dropped and no way to regain one (``--nnp``, empty bounding set).
So the graded code never runs as root and never holds a capability, in either mode. Not a
``preexec_fn``, which is unsafe in threaded processes (Jupyter). `workbench.verify` documents which
guard holds where.

    host_info, use_bwrap = resolve("auto")           # `jail_host`: what this machine allows
    with Jail(task.limits, host_info, bwrap=use_bwrap) as jail:
        jail.copy_in(workspace)                      # bounded copy (CopyLimitError)
        proc = jail.spawn([python, "solution.py"], stdin)
        jail.sweep()                                 # every process of the jail's uid
        jail.over_budget()                           # "the grading copy exceeded 256 MiB", or None

Harbor tasks and verifier hooks need more of the file system (bwrap only; plain mode cannot remap):

    Jail(limits, host_info, bwrap=True, workspace_at="/app", extra_ro={"/tests": "tests"},
         extra_rw={"/logs/verifier": "logs"}, extra_env={"PATH": "/run/workbench/bin:/usr/bin:/bin"})

A relative source is a folder inside the jail's own directory, made on entry (read-only ones 0755
and ours, to fill before the first spawn; writable ones the test uid's). Any of the answers' folders
(`paths.private_paths`) lying under a read-only source is masked with an empty tmpfs.

What the tests write is bounded in total: per file by RLIMIT_FSIZE, in all by `over_budget`, which
`child.Child` polls while a test process runs (every `BUDGET_POLL_S`) and `verify` once after each
test: the copy, its TMPDIR and the writable folders against ``Limits.disk_mb`` / ``disk_entries``
(the agent's sandbox's measure, `workbench.sandbox.exceeds`). Past it the tests are killed and the
verification scores 0; the answer stays, so every later test fails without running.

This module is the jail's folder and processes (make, fill, spawn, sweep, remove); `jail_host` probes
the machine (prlimit, setpriv, bwrap, unshare) and `jail_command` builds each test process's argv.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

from workbench.sandbox import CopyLimits, check_bind_source, copy_tree, force_remove, exceeds, passed_filter
from workbench.paths import exposed_paths
from workbench.procs import environ, kill_matching
from workbench.tasks import Limits
from workbench.verify.jail_command import check_mount_points, command
from workbench.verify.jail_host import Host, interpreter, reachable

__all__ = ["Jail", "MARKER_VAR", "RUNNER", "BUDGET_POLL_S"]

MARKER_VAR = "WORKBENCH_VERIFY_RUN"  # set in every test process: found again by the sweep when not root
RUNNER = Path(__file__).resolve().with_name("runner.py")
# How often a running test's writes are measured: a walk of a small copy costs ~10 us. A writer fills
# the page cache at ~1.2 GiB/s here (16 MiB files in a loop, 2-core host): it got 1-19 MiB past a 64 MiB
# budget before the kill (benchmarks/grading_budget.py, load 16 on 2 CPUs; the scheduler's delays, more
# than this period, decide it). A copy of 5000 entries takes ~20 ms to walk: the next walk then waits 5 times the last
# one's (<= 1/6 of a core).
BUDGET_POLL_S = 0.01
_WALKS_PER_POLL = 5


class Jail:
    """One verification's private directory, and how its test processes are started and stopped."""

    def __init__(
        self,
        limits: Limits,
        host: Host,
        *,
        bwrap: bool,
        workspace_at: str | None = None,
        extra_ro: dict[str, Path | str] | None = None,
        extra_rw: dict[str, Path | str] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.limits, self.host = limits, host
        self.bwrap = host.bwrap if bwrap else None
        self.extra_ro, self.extra_rw = dict(extra_ro or {}), dict(extra_rw or {})
        self.extra_env = dict(extra_env or {})
        self.workspace_at = workspace_at
        if not self.bwrap and (workspace_at or self.extra_ro or self.extra_rw):
            raise RuntimeError(
                "plain grading (sandbox='none') cannot show the workspace or other folders at "
                f"other paths ({workspace_at or ', '.join([*self.extra_ro, *self.extra_rw])}); use bwrap"
            )
        check_mount_points([*([workspace_at] if workspace_at else []), *self.extra_ro, *self.extra_rw])
        for source in self.extra_ro.values():  # bound by bwrap as root: none may be another user's to swap
            if Path(source).is_absolute():  # a relative one is a folder this jail makes in its own
                check_bind_source(source)
        # A fresh uid per verification (root only): RLIMIT_NPROC then counts just this test's processes,
        # and "every process of this uid" is exactly what to kill afterwards.
        self.uid = random.SystemRandom().randrange(1_000_000, 2_000_000_000) if host.root else None
        self.marker = os.urandom(8).hex()
        self.python = interpreter(host, bool(self.bwrap))
        self.exceeded: str | None = None  # why the copy passed its budget; once set, it stays
        self._next_measure = 0.0

    def __enter__(self) -> Jail:
        if not self.bwrap and self.uid is not None:
            if not reachable(Path(tempfile.gettempdir())):
                raise RuntimeError(
                    f"plain grading (sandbox='none'): the test uid cannot enter the temp dir "
                    f"{tempfile.gettempdir()}; use bwrap, or a TMPDIR other users can enter"
                )
            if exposed_paths():
                raise RuntimeError(
                    f"plain grading (sandbox='none'): {', '.join(map(str, exposed_paths()))} can be "
                    "read by other users (and so by the graded code); run scripts/setup.sh or use bwrap"
                )
        self.root = Path(tempfile.mkdtemp(prefix="wb-verify-"))
        try:
            os.chmod(self.root, 0o711)  # the sandbox uid may pass through to ws/ and runner.py, not list
            self.ws, self.tmp, self.runner = self.root / "ws", self.root / "tmp", self.root / "runner.py"
            shutil.copyfile(RUNNER, self.runner)
            self.runner.chmod(0o644)
            for mode, mounts in ((0o755, self.extra_ro), (0o700, self.extra_rw)):
                for inside, src in list(mounts.items()):
                    if not Path(src).is_absolute():  # a folder of ours to fill (ro) or the test uid's (rw)
                        mounts[inside] = folder = self.root / src
                        folder.mkdir(mode=mode, parents=True)
                        if mode == 0o700 and self.uid is not None:
                            os.chown(folder, self.uid, self.uid)
        except BaseException:
            force_remove(self.root)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.sweep()
        finally:
            force_remove(self.root)  # the sandbox's removal: only modes inside, only through descriptors
            if self.uid is not None and self.bwrap is None:
                for shared in ("/tmp", "/var/tmp", "/dev/shm"):
                    _remove_owned(Path(shared), self.uid)

    def copy_in(self, workspace: Path) -> None:
        """A bounded copy of `workspace` (`bounded_copy`: CopyLimitError past the task's limits; files
        that vanish mid-copy, the agent may still be running, are graded without)."""
        self.tmp.mkdir(mode=0o700)
        try:
            copy_tree(
                workspace,
                self.ws,
                CopyLimits(max_bytes=self.limits.workspace_mb << 20, max_entries=self.limits.workspace_entries),
            )
        finally:  # what was copied belongs to the sandbox uid (and is removed with the jail)
            self._chown_copy()

    def _chown_copy(self) -> None:
        if self.uid is not None and self.ws.exists():
            os.lchown(self.tmp, self.uid, self.uid)
            for top, dirs, files in os.walk(self.ws):  # does not follow links: lchown the links themselves
                os.lchown(top, self.uid, self.uid)
                for name in dirs + files:
                    os.lchown(os.path.join(top, name), self.uid, self.uid)

    def over_budget(self, *, now: bool = True) -> str | None:
        """Why what the tests wrote passed ``Limits.disk_mb`` / ``disk_entries``, or None. ``now=False``
        (the poll while a test runs) measures only when `BUDGET_POLL_S` has passed since the last walk."""
        if self.exceeded or (not now and time.monotonic() < self._next_measure):
            return self.exceeded
        start = time.monotonic()
        folders = [self.ws, self.tmp, *(Path(p) for p in self.extra_rw.values())]
        over = exceeds(folders, max_bytes=self.limits.disk_mb << 20, max_entries=self.limits.disk_entries)
        done = time.monotonic()
        self._next_measure = done + max(BUDGET_POLL_S - (done - start), _WALKS_PER_POLL * (done - start))
        if over == "bytes":
            self.exceeded = f"the grading copy exceeded {self.limits.disk_mb} MiB"
        elif over == "entries":
            self.exceeded = f"the grading copy exceeded {self.limits.disk_entries} files and folders"
        return self.exceeded

    @property
    def inside_ws(self) -> str:
        """The workspace copy's path as the test processes see it."""
        return self.workspace_at or str(self.ws)

    def spawn(self, cmd: list[str], stdin: IO[bytes] | int) -> subprocess.Popen[bytes]:
        # bwrap: the graded code runs under the sandboxes' syscall filter, read by bwrap from this fd at start
        with passed_filter(bool(self.bwrap)) as fd:
            return subprocess.Popen(
                self._argv(cmd, fd),
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.ws,
                env=self._env(),
                start_new_session=True,
                close_fds=True,
                pass_fds=(fd,) if fd is not None else (),
            )

    def sweep(self) -> None:
        """Kill every process this verification started, including those that left the process group."""
        if self.uid is not None:
            uid = self.uid
            kill_matching(lambda p: p.uid == uid)
        else:
            me, needle = os.getuid(), f"{MARKER_VAR}={self.marker}".encode()
            kill_matching(lambda p: p.uid == me and needle in environ(p.pid))

    def _argv(self, cmd: list[str], seccomp_fd: int | None = None) -> list[str]:
        return command(
            cmd,
            limits=self.limits,
            host=self.host,
            bwrap=self.bwrap,
            uid=self.uid,
            ws=self.ws,
            runner=self.runner,
            workspace_at=self.workspace_at,
            extra_ro=self.extra_ro,
            extra_rw=self.extra_rw,
            seccomp_fd=seccomp_fd,
        )

    def _env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.inside_ws,
            "TMPDIR": "/tmp" if self.bwrap else str(self.tmp),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            **self.extra_env,
            MARKER_VAR: self.marker,
        }


def _remove_owned(directory: Path, uid: int) -> None:
    try:
        entries = list(directory.iterdir())
    except OSError:
        return
    for entry in entries:
        try:
            if entry.lstat().st_uid != uid:
                continue
            if entry.is_dir() and not entry.is_symlink():
                force_remove(entry, owner=uid)  # checked again on its descriptor
            else:
                entry.unlink()
        except OSError:
            pass

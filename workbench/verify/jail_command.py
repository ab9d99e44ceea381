"""The grading jail's command line: prlimit, then bwrap's mounts (or ``unshare --net``), then setpriv.

`workbench.verify.jail.Jail` builds every test process's argv with `command`; this module decides
what the graded code sees and is allowed, and nothing else (the jail's folder, environment, spawn and
sweep stay in `jail`). With bwrap, only /usr (+ /bin, /lib...), a few ld.so files of /etc, the
interpreter's folders, the workspace copy, the runner and the caller's extra mounts are visible;
HumanEval's data file and any answers' folder (`paths.private_paths`) under a read-only mount are
masked with an empty tmpfs. `check_mount_points` refuses a mount point the jail itself owns.

    check_mount_points(["/app", "/tests"])                       # ValueError for "/", "/usr", "../x"...
    argv = command(cmd, limits=task.limits, host=info, bwrap=info.bwrap, uid=uid, ws=ws, runner=runner,
                   workspace_at=None, extra_ro={}, extra_rw={})
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from workbench.paths import private_paths
from workbench.procs import processes
from workbench.sandbox import mount, system_dirs, under
from workbench.tasks import Limits, humaneval_path
from workbench.verify.jail_host import Host, python_dirs

__all__ = ["RESERVED", "check_mount_points", "command"]

RESERVED = ("/", "/usr", "/proc", "/dev", "/tmp", "/etc", "/bin", "/lib")  # what the jail itself mounts


def check_mount_points(points: list[str]) -> None:
    """ValueError unless every point is absolute, without ``..``, and none of `RESERVED`."""
    for inside in points:
        if not inside.startswith("/") or ".." in Path(inside).parts or os.path.normpath(inside) in RESERVED:
            raise ValueError(f"jail mount point {inside!r} must be an absolute path outside {', '.join(RESERVED)}")


def command(
    cmd: list[str],
    *,
    limits: Limits,
    host: Host,
    bwrap: str | None,
    uid: int | None,
    ws: Path,
    runner: Path,
    workspace_at: str | None,
    extra_ro: dict[str, Path | str],
    extra_rw: dict[str, Path | str],
    seccomp_fd: int | None = None,
) -> list[str]:
    """`cmd` under the task's limits, in bwrap's namespaces when `bwrap` is given (else only a network
    namespace, where ``unshare`` works), as `uid` with no capability (when we are root). `seccomp_fd` (bwrap): an
    inherited fd holding the sandboxes' syscall filter (`workbench.sandbox.filter_fd`), which bwrap loads for the
    graded code."""
    nproc = (
        limits.max_processes
        if uid is not None
        else sum(p.threads for p in processes() if p.uid == os.getuid()) + limits.max_processes
    )
    argv = [
        host.prlimit,
        f"--as={limits.memory_mb << 20}",
        f"--fsize={limits.file_mb << 20}",
        f"--nproc={nproc}",
        f"--cpu={math.ceil(limits.time_s) + 1}",
        "--core=0",
        "--",
    ]
    if bwrap:
        argv += _bwrap_args(
            bwrap,
            file_mb=limits.file_mb,
            ws=ws,
            runner=runner,
            workspace_at=workspace_at,
            extra_ro=extra_ro,
            extra_rw=extra_rw,
        )
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
    elif host.unshare:
        argv += [host.unshare, "--net", "--"]
    argv += [host.setpriv, "--nnp"]
    if uid is not None:
        # No capability at all, none to regain: the graded code cannot read past file modes
        # (plain mode checks at start that the fresh uid can walk to the interpreter and the copy).
        argv += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    if not bwrap:
        argv += ["--pdeathsig=KILL"]  # the tests die with the grader (bwrap: --die-with-parent)
    return argv + ["--", *cmd]


def _bwrap_args(
    bwrap: str,
    *,
    file_mb: int,
    ws: Path,
    runner: Path,
    workspace_at: str | None,
    extra_ro: dict[str, Path | str],
    extra_rw: dict[str, Path | str],
) -> list[str]:
    """bwrap's namespaces and mounts, ending with ``--chdir`` to the workspace copy as seen inside."""
    args = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(4 * file_mb << 20),
        "--tmpfs",
        "/tmp",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    bound, made = ["/usr"], {"/tmp", "/proc", "/dev"}
    args += system_dirs(bound)
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives"):
        args += ["--ro-bind-try", etc, etc]
    for pydir in python_dirs():
        if not under(pydir, bound):
            args += mount("--ro-bind", pydir, bound, made)
    args += mount("--bind", str(ws), bound, made, workspace_at)
    args += mount("--ro-bind", str(runner), bound, made)
    for inside, src in extra_ro.items():
        args += mount("--ro-bind", str(src), bound, made, inside)
        real = os.path.realpath(src)
        for secret in map(str, private_paths()):  # a hook's package may hold task data (workbench/data)
            if under(secret, [real]) and os.path.exists(secret):
                args += ["--tmpfs", inside.rstrip("/") + secret[len(real) :]]
    for inside, src in extra_rw.items():
        args += mount("--bind", str(src), bound, made, inside)
    data = str(humaneval_path().parent)
    if under(data, bound):
        args += ["--tmpfs", data]  # the problems' check() sources: not the solution's to read
    return args + ["--chdir", workspace_at or str(ws)]

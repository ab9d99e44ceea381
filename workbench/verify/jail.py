"""The grading jail: one verification's private folder, and how its test processes start and stop.

Every test process is exec'd through util-linux ``prlimit`` (time, memory, file size, processes),
then, with bubblewrap, new pid/net/ipc/uts/cgroup namespaces showing only /usr (+ /bin, /lib...), the
interpreter, the workspace copy and the runner (HumanEval's data file masked); then ``setpriv`` to a
fresh uid with every capability dropped and no way to regain one (``--nnp``, empty bounding set).
So the graded code never runs as root and never holds a capability, in either mode. Not a
``preexec_fn``, which is unsafe in threaded processes (Jupyter). `workbench.verify` documents which
guard holds where.

    host_info, use_bwrap = resolve("auto")
    with Jail(task.limits, host_info, bwrap=use_bwrap) as jail:
        jail.copy_in(workspace)                      # bounded copy (CopyLimitError)
        proc = jail.spawn([python, "solution.py"], stdin)
        jail.sweep()                                 # every process of the jail's uid

Harbor tasks and verifier hooks need more of the file system (bwrap only; plain mode cannot remap):

    Jail(limits, host_info, bwrap=True, workspace_at="/app", extra_ro={"/tests": "tests"},
         extra_rw={"/logs/verifier": "logs"}, extra_env={"PATH": "/run/workbench/bin:/usr/bin:/bin"})

A relative source is a folder inside the jail's own directory, made on entry (read-only ones 0755
and ours, to fill before the first spawn; writable ones the test uid's). Any of the answers' folders
(`paths.private_paths`) lying under a read-only source is masked with an empty tmpfs.
"""

from __future__ import annotations

import functools
import math
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..bounded_copy import CopyLimits, copy_tree
from ..paths import exposed_paths, private_paths
from ..procs import environ, kill_matching, processes
from ..tasks import Limits, humaneval_path

__all__ = [
    "Host",
    "Jail",
    "host",
    "resolve",
    "guards",
    "python_dirs",
    "reachable",
    "remove_tree",
    "SANDBOXES",
    "MARKER_VAR",
    "RUNNER",
]

SANDBOXES = ("auto", "bwrap", "none")
MARKER_VAR = "WORKBENCH_VERIFY_RUN"  # set in every test process: found again by the sweep when not root
RUNNER = Path(__file__).resolve().with_name("runner.py")
_RESERVED = ("/", "/usr", "/proc", "/dev", "/tmp", "/etc", "/bin", "/lib")  # what the jail itself mounts


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
        return sys.executable
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
        for inside in [*([workspace_at] if workspace_at else []), *self.extra_ro, *self.extra_rw]:
            if not inside.startswith("/") or ".." in Path(inside).parts or os.path.normpath(inside) in _RESERVED:
                raise ValueError(f"jail mount point {inside!r} must be an absolute path outside {', '.join(_RESERVED)}")
        # A fresh uid per verification (root only): RLIMIT_NPROC then counts just this test's processes,
        # and "every process of this uid" is exactly what to kill afterwards.
        self.uid = random.SystemRandom().randrange(1_000_000, 2_000_000_000) if host.root else None
        self.marker = os.urandom(8).hex()
        self.python = interpreter(host, bool(self.bwrap))

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
            remove_tree(self.root)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.sweep()
        finally:
            remove_tree(self.root)
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

    @property
    def inside_ws(self) -> str:
        """The workspace copy's path as the test processes see it."""
        return self.workspace_at or str(self.ws)

    def spawn(self, cmd: list[str], stdin: IO[bytes] | int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self._argv(cmd),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.ws,
            env=self._env(),
            start_new_session=True,
            close_fds=True,
        )

    def sweep(self) -> None:
        """Kill every process this verification started, including those that left the process group."""
        if self.uid is not None:
            uid = self.uid
            kill_matching(lambda p: p.uid == uid)
        else:
            me, needle = os.getuid(), f"{MARKER_VAR}={self.marker}".encode()
            kill_matching(lambda p: p.uid == me and needle in environ(p.pid))

    def _argv(self, cmd: list[str]) -> list[str]:
        lim = self.limits
        nproc = (
            lim.max_processes
            if self.uid is not None
            else sum(p.threads for p in processes() if p.uid == os.getuid()) + lim.max_processes
        )
        argv = [
            self.host.prlimit,
            f"--as={lim.memory_mb << 20}",
            f"--fsize={lim.file_mb << 20}",
            f"--nproc={nproc}",
            f"--cpu={math.ceil(lim.time_s) + 1}",
            "--core=0",
            "--",
        ]
        if self.bwrap:
            argv += self._bwrap_args(self.bwrap)
        elif self.host.unshare:
            argv += [self.host.unshare, "--net", "--"]
        argv += [self.host.setpriv, "--nnp"]
        if self.uid is not None:
            # No capability at all, none to regain: the graded code cannot read past file modes
            # (plain mode checks at start that the fresh uid can walk to the interpreter and the copy).
            argv += [
                f"--reuid={self.uid}",
                f"--regid={self.uid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
            ]
        if not self.bwrap:
            argv += ["--pdeathsig=KILL"]  # the tests die with the grader (bwrap: --die-with-parent)
        return argv + ["--", *cmd]

    def _bwrap_args(self, bwrap: str) -> list[str]:
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
            str(4 * self.limits.file_mb << 20),
            "--tmpfs",
            "/tmp",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            path = Path("/", name)
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives"):
            args += ["--ro-bind-try", etc, etc]
        bound, made = ["/usr"], {"/tmp", "/proc", "/dev"}
        for pydir in python_dirs():
            if not _under(pydir, bound):
                args += _mount("--ro-bind", pydir, bound, made)
        args += _mount("--bind", str(self.ws), bound, made, self.workspace_at)
        args += _mount("--ro-bind", str(self.runner), bound, made)
        for inside, src in self.extra_ro.items():
            args += _mount("--ro-bind", str(src), bound, made, inside)
            real = os.path.realpath(src)
            for secret in map(str, private_paths()):  # a hook's package may hold task data (workbench/data)
                if _under(secret, [real]) and os.path.exists(secret):
                    args += ["--tmpfs", inside.rstrip("/") + secret[len(real) :]]
        for inside, src in self.extra_rw.items():
            args += _mount("--bind", str(src), bound, made, inside)
        data = str(humaneval_path().parent)
        if _under(data, bound):
            args += ["--tmpfs", data]  # the problems' check() sources: not the solution's to read
        return args + ["--chdir", self.inside_ws]

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


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _mount(how: str, path: str, bound: list[str], made: set[str], dest: str | None = None) -> list[str]:
    """bwrap arguments mounting ``path`` at ``dest`` (default: the same place). Missing parents are
    created 0755 (bwrap would make them 0700, locking the sandbox uid out); parents inside a bind
    mount exist already."""
    dest = dest or path
    args = []
    for parent in reversed(Path(dest).parents):
        p = str(parent)
        if p != "/" and p not in made and not _under(p, bound):
            args += ["--perms", "0755", "--dir", p]
            made.add(p)
    bound.append(dest)
    return args + [how, path, dest]


def remove_tree(path: Path) -> None:
    def unlock(func: Callable, failed: str, exc_info: object) -> None:
        # A solution may chmod its directories to 000 (only matters when not root).
        os.chmod(os.path.dirname(failed), 0o700)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, 0o700)
        func(failed)

    if path.exists():
        shutil.rmtree(path, onerror=unlock)


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
                remove_tree(entry)
            else:
                entry.unlink()
        except OSError:
            pass

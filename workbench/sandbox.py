"""Per-rollout sandbox sessions: an isolated workspace, home and process group for one agent run.

A sandbox is a temp folder with ``ws/`` (the task's starting files; the agent's working directory),
``home/`` (HOME and the XDG dirs, so no state leaks between rollouts) and ``bin/`` (``python``), plus
the processes started in it. Two isolation modes:

- ``bwrap`` (when bubblewrap is installed): the harness runs in new pid/ipc/uts namespaces with only
  the system dirs (read-only), the harness install (read-only) and the sandbox folder (writable)
  mounted. The project, the run folders and the held-out tests are not visible. When the
  namespace's first process dies the kernel kills the rest; bwrap dies with its parent.
- ``none``: plain processes with the same env and limits. Separation, not isolation: the agent
  could read anything this user can. Processes are still tracked by their process group and by an
  env marker, so `close()` leaves nothing behind even if one calls setsid(). A watchdog
  (`procs.die_with_us`) kills the group and the marked processes within 0.5 s if this process dies
  without closing (SIGKILL, a notebook kernel restart); only a process that left the group and
  cleared its environment survives that.

The network is shared in both modes: the harness must reach the capture proxy on loopback. Folders
left by a runner that died without `close()` are removed by the next `Sandbox.create` in that dir.

    sb = Sandbox.create({"README.md": "..."}, limits=SandboxLimits(wall_s=300))
    proc = sb.spawn(["opencode", "run"], stdin=b"prompt", env={"OPENCODE_CONFIG_CONTENT": "..."})
    code = proc.wait(timeout_s=300)     # TimeoutError at the wall-clock limit
    final = sb.snapshot(dest)           # copy of ws/ for the verifier
    sb.close()                          # kills the group + marked strays, removes the folder
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .procs import die_with_us, group_alive, kill_group, proc_stat, stop_group

__all__ = ["SandboxLimits", "Sandbox", "SandboxProcess", "SandboxError", "bwrap_available", "MARKER_ENV"]

MARKER_ENV = "WORKBENCH_SANDBOX"  # set in every sandboxed process; close() sweeps /proc for it
Isolation = Literal["auto", "bwrap", "none"]


class SandboxError(RuntimeError):
    """A sandbox could not be created (nothing is left behind when this is raised)."""


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for every process in a sandbox (setrlimit, inherited by children).

    Attributes:
        cpu_s: CPU seconds per process (RLIMIT_CPU).
        memory_mb: address space per process (RLIMIT_AS). opencode is a Bun binary that reserves
            a lot of virtual memory up front: keep this >= 16 GiB or it fails to start.
        file_size_mb: largest file a process may write (RLIMIT_FSIZE).
        nproc: processes for the sandbox user (RLIMIT_NPROC). Root ignores it; it holds when the
            workbench runs unprivileged. Under bwrap, the pid namespace bounds the tree's lifetime.
        open_files: RLIMIT_NOFILE.
        wall_s: wall-clock limit for a waited process.
    """

    cpu_s: int = 900
    memory_mb: int = 32768
    file_size_mb: int = 256
    nproc: int = 1024
    open_files: int = 4096
    wall_s: float = 600.0


def _process_key(pid: int) -> str | None:
    """``pid-starttime`` of a live process (start time in clock ticks after boot, /proc/PID/stat field
    22), None when it is gone: a reused pid has another start time."""
    fields = proc_stat(pid)
    return None if fields is None else f"{pid}-{fields[19]}"


def _remove_stale(base: Path) -> None:
    """Remove the sandbox folders in `base` whose creator process is gone (see `Sandbox.create`).
    Folders named before creators were recorded (``wb-sbx-XXXXXXXX``) are left alone."""
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        parts = entry.name.split("-")  # wb, sbx, pid, starttime, random
        if len(parts) == 5 and entry.name.startswith("wb-sbx-") and parts[2].isdigit() and parts[3].isdigit():
            if _process_key(int(parts[2])) != f"{parts[2]}-{parts[3]}":
                shutil.rmtree(entry.path, ignore_errors=True)


def _limit_args(limits: SandboxLimits) -> list[str]:
    """`prlimit` flags for `limits`. prlimit (util-linux) rather than preexec_fn: the proxy runs in
    threads of this process, and running Python between fork and exec is unsafe with threads."""
    mb = 1024 * 1024
    return ["prlimit", f"--cpu={limits.cpu_s}", f"--as={limits.memory_mb * mb}",
            f"--fsize={limits.file_size_mb * mb}", f"--nproc={limits.nproc}",
            f"--nofile={limits.open_files}", "--core=0", "--"]


@dataclass
class SandboxProcess:
    """A process started in a sandbox, leader of its own process group."""

    popen: subprocess.Popen
    started: float = field(default_factory=time.monotonic)

    @property
    def pgid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout_s: float | None = None) -> int:
        """The exit code; raises TimeoutError (the process keeps running) at `timeout_s`."""
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"process {self.pgid} still running after {timeout_s} s") from exc

    def kill(self) -> bool:
        """SIGKILL the whole group now and wait until no member is left (True when gone)."""
        return stop_group(self.popen, grace_s=0, gone_timeout_s=5)


class Sandbox:
    """One rollout's isolated folder and processes. Use `Sandbox.create`, always `close()`."""

    def __init__(self, root: Path, isolation: Literal["bwrap", "none"], limits: SandboxLimits,
                 ro_paths: list[Path]) -> None:
        self.root = root
        self.workspace = root / "ws"
        self.home = root / "home"
        self.bin = root / "bin"
        self.isolation = isolation
        self.limits = limits
        self.ro_paths = ro_paths
        self.id = root.name
        self.processes: list[SandboxProcess] = []
        self.closed = False

    @classmethod
    def create(cls, files: dict[str, str], *, isolation: Isolation = "auto",
               limits: SandboxLimits | None = None, base_dir: Path | None = None,
               ro_paths: list[Path] | None = None, python: str | None = None,
               git_init: bool = True) -> "Sandbox":
        """Materialise `files` into a fresh workspace. On any error, nothing is left behind.

        Args:
            files: relative path -> text. Absolute paths or paths escaping the workspace are rejected.
            isolation: ``auto`` picks ``bwrap`` when installed.
            ro_paths: extra paths made visible read-only under bwrap (e.g. the harness install).
            python: interpreter exposed as ``python`` in the sandbox (default: the system python3).
            git_init: make the workspace a git repo, as a user's checkout would be.
        """
        if isolation == "auto":
            isolation = "bwrap" if bwrap_available() else "none"
        if isolation == "bwrap" and not bwrap_available():
            raise SandboxError("isolation='bwrap' but bwrap is not installed (Debian: apt-get install bubblewrap)")
        if isolation not in ("bwrap", "none"):
            raise SandboxError(f"unknown isolation {isolation!r}: use auto, bwrap or none")
        for rel, text in files.items():
            # Checked up front (NUL, non-str), so that bad task files are a SandboxError, not a TypeError
            # or ValueError from deep inside the copy.
            if not isinstance(rel, str) or not isinstance(text, str):
                raise SandboxError(f"task file {rel!r}: path and content must be text")
            p = Path(rel)
            if p.is_absolute() or ".." in p.parts or not rel.strip() or "\0" in rel:
                raise SandboxError(f"task file path {rel!r} must be relative and stay inside the workspace")
        interpreter = python or shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        if interpreter is None:
            raise SandboxError("no python3 found for the sandbox")
        # The folder's name carries its creator (pid and start time), so that a later create() can
        # tell the folders of a runner that died without close() (SIGKILL, a kernel restart) and
        # remove them; their processes died with that runner.
        _remove_stale(Path(base_dir or tempfile.gettempdir()))
        try:
            root = Path(tempfile.mkdtemp(prefix=f"wb-sbx-{_process_key(os.getpid())}-", dir=base_dir))
        except OSError as exc:
            raise SandboxError(f"could not create a sandbox folder in {base_dir or tempfile.gettempdir()}: {exc}") from exc
        sb = cls(root, isolation, limits or SandboxLimits(), list(ro_paths or []))
        try:
            for d in (sb.workspace, sb.home, sb.bin, root / "tmp", sb.home / ".config", sb.home / ".cache",
                      sb.home / ".local" / "share", sb.home / ".local" / "state"):
                d.mkdir(parents=True, exist_ok=True)
            for rel, text in files.items():
                target = sb.workspace / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
            (sb.bin / "python").symlink_to(interpreter)
            if git_init:
                subprocess.run(["git", "init", "-q", str(sb.workspace)], check=True, capture_output=True,
                               timeout=30, env={"PATH": "/usr/bin:/bin", "HOME": str(sb.home)})
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            # ValueError: content that cannot be encoded (a lone surrogate); OSError: ENOSPC, a path
            # that is both a file and a folder ("a" and "a/b"), a name too long...
            shutil.rmtree(root, ignore_errors=True)
            raise SandboxError(f"could not materialise the sandbox: {exc}") from exc
        except BaseException:  # Ctrl-C mid-creation: still nothing left behind
            shutil.rmtree(root, ignore_errors=True)
            raise
        return sb

    # -- processes -------------------------------------------------------------------------------

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A minimal environment built from scratch: nothing of the caller's (no OPENAI_*, no URLs)."""
        h = self.home
        env = {
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(h), "XDG_CONFIG_HOME": str(h / ".config"), "XDG_CACHE_HOME": str(h / ".cache"),
            "XDG_DATA_HOME": str(h / ".local" / "share"), "XDG_STATE_HOME": str(h / ".local" / "state"),
            "TMPDIR": str(self.root / "tmp"), "LANG": "C.UTF-8", "TERM": "dumb",
            MARKER_ENV: self.id,
        }
        env.update(extra or {})
        return env

    def command(self, argv: list[str]) -> list[str]:
        """`argv` wrapped for this sandbox's isolation mode and limits."""
        argv = _limit_args(self.limits) + list(argv)
        if self.isolation == "none":
            # bwrap's --die-with-parent and pid namespace do this below
            return die_with_us(argv, marker=f"{MARKER_ENV}={self.id}")
        cmd = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
               "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for d in ("/usr", "/etc", "/opt"):
            cmd += ["--ro-bind-try", d, d]
        for link in ("bin", "sbin", "lib", "lib64"):  # merged-/usr Debian: these are symlinks
            target = Path("/") / link
            if target.is_symlink():
                cmd += ["--symlink", os.readlink(target), f"/{link}"]
            elif target.exists():
                cmd += ["--ro-bind", str(target), str(target)]
        for p in self.ro_paths:
            cmd += ["--ro-bind", str(p), str(p)]
        cmd += ["--bind", str(self.root), str(self.root), "--chdir", str(self.workspace), "--"]
        return cmd + list(argv)

    def spawn(self, argv: list[str], *, stdin: bytes | None = None, env: dict[str, str] | None = None,
              stdout: Path | None = None, stderr: Path | None = None) -> SandboxProcess:
        """Start `argv` in the workspace, in a new process group, under the sandbox limits."""
        if self.closed:
            raise SandboxError("sandbox is closed")
        out = open(stdout, "wb") if stdout else subprocess.DEVNULL
        err = out if stderr == stdout else open(stderr, "wb") if stderr else subprocess.DEVNULL
        try:
            popen = subprocess.Popen(
                self.command(argv), cwd=self.workspace, env=self.env(env),
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=out, stderr=err, start_new_session=True,
            )
        finally:
            for f in {id(out): out, id(err): err}.values():
                if f is not subprocess.DEVNULL:
                    f.close()
        if stdin is not None:
            assert popen.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                popen.stdin.write(stdin)
            popen.stdin.close()
        proc = SandboxProcess(popen)
        self.processes.append(proc)
        return proc

    def run(self, argv: list[str], *, stdin: bytes | None = None, env: dict[str, str] | None = None,
            timeout_s: float | None = None) -> tuple[int, str]:
        """Run to completion and return (exit code, combined output); kill at the wall-clock limit."""
        log = self.root / "tmp" / f"run-{uuid.uuid4().hex[:8]}.log"
        proc = self.spawn(argv, stdin=stdin, env=env, stdout=log, stderr=log)
        try:
            code = proc.wait(timeout_s if timeout_s is not None else self.limits.wall_s)
        except TimeoutError:
            proc.kill()
            raise
        text = log.read_text(errors="replace")
        log.unlink(missing_ok=True)
        return code, text

    def strays(self) -> list[int]:
        """Pids of processes carrying this sandbox's marker (e.g. ones that left the group)."""
        needle = f"{MARKER_ENV}={self.id}".encode()
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry.name))
        return found

    def kill_all(self, timeout_s: float = 10.0) -> bool:
        """Kill every process group started here and every marked stray; True when all are gone."""
        deadline = time.monotonic() + timeout_s
        while True:
            for proc in self.processes:
                kill_group(proc.pgid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(0.01)
            strays = self.strays()
            for pid in strays:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if not strays and not any(group_alive(p.pgid) for p in self.processes):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    # -- files -----------------------------------------------------------------------------------

    def snapshot(self, dest: Path) -> Path:
        """Copy the workspace (not .git, no symlinks followed) to `dest`, e.g. for the verifier."""
        shutil.copytree(self.workspace, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"),
                        dirs_exist_ok=False)
        return dest

    def close(self) -> None:
        """Kill everything started here and remove the folder. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        survived = not self.kill_all()
        shutil.rmtree(self.root, ignore_errors=True)
        if survived:
            raise SandboxError(f"processes of sandbox {self.id} survived SIGKILL: {self.strays()}")

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

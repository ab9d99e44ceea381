"""Per-rollout sandbox sessions: an isolated workspace, home and process group for one agent run.

A sandbox is a temp folder with ``ws/`` (the task's starting files; the agent's working directory),
``home/`` (HOME and the XDG dirs, so no state leaks between rollouts), ``tmp/`` and ``bin/``
(``python``), plus the processes started in it. The agent never runs as root and never holds a
capability: when the workbench runs as root, every sandbox gets a fresh unprivileged uid of its own
(random, like `workbench.verify`'s), which owns those four folders (mode 0700) and nothing else. So
other rollouts' sandboxes, run folders (0700) and held-out tests (0600) are unreadable to it, its
process count is exactly what RLIMIT_NPROC counts, and `close()` kills every process of that uid,
whatever it did to its process group or environment. Two isolation modes:

- ``bwrap`` (set-up installs bubblewrap): in new user, pid, net, ipc, uts and cgroup namespaces,
  every capability dropped and nested user namespaces refused. Visible: /usr (read-only), a few
  files of /etc, the harness install and the interpreter (read-only), and the sandbox's own four
  folders: the workspace at ``/app`` and HOME at ``/home/agent`` in every sandbox alike (so a
  group's prompts match and vLLM's prefix cache shares them), TMPDIR at ``/var/tmp/agent`` (on disk,
  counted by the quota); /tmp is a small tmpfs. The project, the run folders, the task data and /opt are not there.
  The network namespace has only its own loopback: the engine, the proxy's control traffic and
  every other port of the host are out of reach, and the one endpoint the sandbox may use (the
  capture proxy's agent routes, ``endpoint=``) is a Unix socket relayed to it by
  `workbench.sandbox.net` (at most `SandboxLimits.max_connections` at a time). The harness still
  calls ``http://127.0.0.1:PORT``: `_init` listens there inside and forwards.
- ``none``: plain processes with the same env, limits and uid, sharing the host's network and file
  system. **Unsafe for training**: the agent reads whatever other users may read and reaches every
  port on loopback (the engine needs its API key, the proxy's control routes the admin key).
  `workbench train` and `eval` refuse it unless asked with ``--unsafe-no-sandbox``.

Writes are bounded in total: RLIMIT_FSIZE per file, and the folders' allocated size and entry count
(`SandboxLimits.disk_mb`, ``max_entries``), which `over_quota` measures (the rollout polls it every
0.25 s and ends the agent over it). A watchdog (`procs.die_with_us`; bwrap: ``--die-with-parent``)
kills everything within 0.5 s if this process dies without closing; the next `Sandbox.create` in
that dir removes the folders it left.

This module is the session (create, endpoint, env, spawn/run, snapshot, close); `spec` holds the
modes, limits and error, `files` the folders (task files, ownership, quota), `process` a
running process, `command` the prlimit/setpriv/bwrap argv, `cleanup` the kill and removal.

    from workbench.sandbox import SandboxLimits
    sb = Sandbox.create({"README.md": "..."}, limits=SandboxLimits(wall_s=300), endpoint=proxy_url)
    proc = sb.spawn(["opencode", "run"], stdin=b"prompt", env={"OPENCODE_CONFIG_CONTENT": "..."})
    code = proc.wait(timeout_s=300)     # TimeoutError at the wall-clock limit
    final = sb.snapshot(dest)           # bounded copy of ws/ for the verifier
    sb.close()                          # kills the group, the uid, marked strays; removes the folder
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import urllib.parse
import uuid
from pathlib import Path

from workbench.sandbox.binds import check_bind_source
from workbench.sandbox.bounded_copy import CopyLimits, copy_tree, read_bounded
from workbench.sandbox.cleanup import force_remove, kill_all, new_folder, remove_owned, remove_stale, strays
from workbench.sandbox.command import wrap
from workbench.sandbox.files import check_task_files, materialise, over_quota, write_home
from workbench.sandbox.net import Relay, open_relay
from workbench.sandbox.process import SandboxProcess, start
from workbench.sandbox.seccomp import passed_filter
from workbench.sandbox.spec import (
    AGENT_HOME,
    AGENT_TMP,
    APP,
    MARKER_ENV,
    Isolation,
    IsolationMode,
    SandboxError,
    SandboxLimits,
    check_plain_mode,
    resolve_isolation,
)

__all__ = ["Sandbox"]


def _fresh_uid() -> int | None:
    """A random unused-looking uid when we are root (one per sandbox), else None (our own)."""
    return random.SystemRandom().randrange(1_000_000, 2_000_000_000) if os.geteuid() == 0 else None


class Sandbox:
    """One rollout's isolated folder and processes. Use `Sandbox.create`, always `close()`."""

    def __init__(
        self,
        root: Path,
        isolation: IsolationMode,
        limits: SandboxLimits,
        ro_paths: list[Path],
        uid: int | None,
        python: str,
    ) -> None:
        self.root = root
        self.workspace = root / "ws"
        self.home = root / "home"
        self.bin = root / "bin"
        self.tmp = root / "tmp"
        self.logs = root / "logs"  # ours only (0700): the harness writes its logs through inherited fds
        self.isolation = isolation
        self.limits = limits
        self.ro_paths = ro_paths
        self.uid = uid
        self.python = python
        self.id = root.name
        self.processes: list[SandboxProcess] = []
        self.closed = False
        self._relay: Relay | None = None
        self._endpoint: tuple[str, int] | None = None
        self._extra_dir: Path | None = None  # the relay's socket folder when the sandbox path is too long
        self._inside_port = 0

    @classmethod
    def create(
        cls,
        files: dict[str, str],
        *,
        isolation: Isolation = "auto",
        limits: SandboxLimits | None = None,
        base_dir: Path | None = None,
        ro_paths: list[Path] | None = None,
        python: str | None = None,
        git_init: bool = True,
        endpoint: str | None = None,
    ) -> "Sandbox":
        """Materialise `files` into a fresh workspace. On any error, nothing is left behind.

        Args:
            files: relative path -> text. Absolute paths or paths escaping the workspace are rejected.
            isolation: ``auto`` picks ``bwrap`` when installed.
            ro_paths: extra paths made visible read-only under bwrap (e.g. the harness install).
            python: interpreter exposed as ``python`` in the sandbox (default: the system python3).
            git_init: make the workspace a git repo, as a user's checkout would be.
            endpoint: the one URL (``http://host:port``) the sandbox may reach; under bwrap it is
                relayed in, and `reach` gives the URL to use inside.
        """
        mode = resolve_isolation(isolation)
        check_task_files(files)
        interpreter = python or shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        if interpreter is None:
            raise SandboxError("no python3 found for the sandbox")
        target = _parse_endpoint(endpoint) if endpoint else None
        if mode == "bwrap":  # bwrap binds them (as root: with root's rights): none may be another user's to swap
            for source in ro_paths or []:
                check_bind_source(source)
        # The folders of a runner that died without close() go first (`cleanup.new_folder`).
        base = Path(base_dir or tempfile.gettempdir())
        remove_stale(base)
        try:
            root = new_folder(base)
        except OSError as exc:
            raise SandboxError(f"could not create a sandbox folder in {base}: {exc}") from exc
        uid = _fresh_uid()
        sb = cls(root, mode, limits or SandboxLimits(), list(ro_paths or []), uid, interpreter)
        try:
            materialise(
                root,
                files,
                workspace=sb.workspace,
                home=sb.home,
                bin_dir=sb.bin,
                tmp=sb.tmp,
                logs=sb.logs,
                python=interpreter,
                uid=uid,
                git_init=git_init,
            )
            if mode == "none" and uid is not None:
                check_plain_mode(root, interpreter, sb.ro_paths)
            if target is not None:
                sb._open_endpoint(*target)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            # ValueError: content that cannot be encoded (a lone surrogate); OSError: ENOSPC, a path
            # that is both a file and a folder ("a" and "a/b"), a name too long...
            sb._discard()
            raise SandboxError(f"could not materialise the sandbox: {exc}") from exc
        except BaseException:  # Ctrl-C mid-creation, a SandboxError: still nothing left behind
            sb._discard()
            raise
        return sb

    def _open_endpoint(self, host: str, port: int) -> None:
        self._endpoint = (host, port)
        # Inside, the same port (URLs stay as the harness was given them), unless the sandbox uid may
        # not bind it (below 1024).
        self._inside_port = port if port >= 1024 else port + 20000
        if self.isolation != "bwrap":
            return
        sock_dir = self.root / "sock"
        if len(str(sock_dir / "p")) > 100:  # AF_UNIX paths are limited to 107 bytes
            sock_dir = self._extra_dir = new_folder("/tmp")
        else:
            sock_dir.mkdir()
        sock_dir.chmod(0o711)
        self._relay = open_relay(sock_dir / "p", host, port, max_connections=self.limits.max_connections)

    @property
    def refused_connections(self) -> int | None:
        """Connections to the endpoint refused as not from the process that first used it (the harness's;
        `_init`, `net`); None where nothing checks: plain mode, or no endpoint."""
        return self._relay.refused_model_connections if self._relay is not None else None

    def write_home(self, rel: str, text: str) -> Path:
        """Write a file under the sandbox's HOME (a harness's config), owned by the sandbox's uid."""
        return write_home(self.home, rel, text, self.uid)

    def read_home(self, rel: str, limit: int = 8 * 2**20) -> str:
        """A file the agent wrote under the sandbox's HOME, as text, at most `limit` bytes; "" when it is not a
        regular file reached without a link (`bounded_copy.read_bounded`: the agent's uid owns that tree)."""
        try:
            data = read_bounded(self.home, rel, limit)
        except OSError:
            data = None
        return data.decode(errors="replace") if data is not None else ""

    def reach(self, url: str) -> str:
        """`url` (on the endpoint given to `create`) as the sandbox must call it."""
        if self.isolation != "bwrap" or self._endpoint is None:
            return url
        parts = urllib.parse.urlsplit(url)
        if (parts.hostname, parts.port) != self._endpoint:
            raise SandboxError(f"{url} is not this sandbox's endpoint {self._endpoint[0]}:{self._endpoint[1]}")
        return urllib.parse.urlunsplit(parts._replace(netloc=f"127.0.0.1:{self._inside_port}"))

    # -- processes -------------------------------------------------------------------------------

    @property
    def inside_workspace(self) -> str:
        """The workspace's path as the sandbox's processes see it (bwrap: `APP`)."""
        return APP if self.isolation == "bwrap" else str(self.workspace)

    @property
    def inside_tmp(self) -> str:
        return AGENT_TMP if self.isolation == "bwrap" else str(self.tmp)

    @property
    def inside_home(self) -> str:
        return AGENT_HOME if self.isolation == "bwrap" else str(self.home)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A minimal environment built from scratch: nothing of the caller's (no OPENAI_*, no URLs)."""
        h = Path(self.inside_home)
        env = {
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(h),
            "XDG_CONFIG_HOME": str(h / ".config"),
            "XDG_CACHE_HOME": str(h / ".cache"),
            "XDG_DATA_HOME": str(h / ".local" / "share"),
            "XDG_STATE_HOME": str(h / ".local" / "state"),
            "TMPDIR": self.inside_tmp,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            MARKER_ENV: str(self.root),  # the full path: whoever made the folder can find its processes
        }
        env.update(extra or {})
        return env

    def command(self, argv: list[str], seccomp_fd: int | None = None) -> list[str]:
        """`argv` wrapped for this sandbox's isolation mode, uid and limits (`command.wrap`); `seccomp_fd`: the
        syscall filter bwrap loads (`workbench.sandbox.seccomp.filter_fd`)."""
        relay = self._relay.path if self._relay is not None and self._endpoint is not None else None
        return wrap(
            argv,
            mode=self.isolation,
            root=self.root,
            limits=self.limits,
            uid=self.uid,
            workspace=self.workspace,
            home=self.home,
            tmp=self.tmp,
            bin_dir=self.bin,
            ro_paths=self.ro_paths,
            python=self.python,
            relay_socket=relay,
            inside_port=self._inside_port,
            seccomp_fd=seccomp_fd,
        )

    def spawn(
        self,
        argv: list[str],
        *,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        stdout: Path | None = None,
        stderr: Path | None = None,
    ) -> SandboxProcess:
        """Start `argv` in the workspace, in a new process group, under the sandbox limits. `stdout` and
        `stderr` are opened here and inherited: the sandbox itself cannot open them by name."""
        if self.closed:
            raise SandboxError("sandbox is closed")
        # bwrap mode: every sandboxed process under the syscall filter (bwrap reads it from this fd at start)
        with passed_filter(self.isolation == "bwrap") as fd:
            proc = start(
                self.command(argv, fd),
                cwd=self.workspace,
                env=self.env(env),
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                pass_fds=(fd,) if fd is not None else (),
            )
        self.processes.append(proc)
        return proc

    def run(
        self,
        argv: list[str],
        *,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, str]:
        """Run to completion and return (exit code, combined output); kill at the wall-clock limit."""
        log = self.logs / f"run-{uuid.uuid4().hex[:8]}.log"
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
        """Pids of this sandbox's processes outside its process groups: carrying its marker, or (with a
        fresh uid) owned by its uid."""
        return strays(self.root, self.uid)

    def kill_all(self, timeout_s: float = 10.0) -> bool:
        """Kill every process group started here, every process of the sandbox's uid and every marked
        stray; True when all are gone."""
        return kill_all([p.popen for p in self.processes], root=self.root, uid=self.uid, timeout_s=timeout_s)

    # -- files -----------------------------------------------------------------------------------

    def over_quota(self) -> str | None:
        """Why the sandbox's folders are over `SandboxLimits.disk_mb` / ``max_entries``, or None
        (`files.over_quota`: allocated blocks, the walk stops at the limit)."""
        return over_quota([self.workspace, self.home, self.tmp], self.limits)

    def snapshot(self, dest: Path, limits: CopyLimits | None = None) -> Path:
        """Copy the workspace (not .git, no links followed, no special files) to `dest`, within
        `limits` (`bounded_copy.CopyLimitError` past them), e.g. for the verifier."""
        copy_tree(self.workspace, dest, limits or CopyLimits(), skip=(".git",))
        return dest

    def _discard(self) -> None:
        if self._relay is not None:
            self._relay.close()
        if self._extra_dir is not None:
            force_remove(self._extra_dir)
        force_remove(self.root)
        if self.isolation == "none" and self.uid is not None:  # its fresh uid wrote in the host's /tmp: nobody else's
            remove_owned(self.uid)

    def close(self) -> None:
        """Kill everything started here and remove the folder. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        survived = not self.kill_all()
        self._discard()
        if survived:
            raise SandboxError(f"processes of sandbox {self.id} survived SIGKILL: {self.strays()}")

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse_endpoint(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise SandboxError(f"endpoint {url!r} must be http://HOST:PORT")
    return parts.hostname, parts.port

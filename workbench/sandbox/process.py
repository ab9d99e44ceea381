"""A process running in a sandbox: how it is started (its own process group, fds opened by us) and waited on.

`workbench.sandbox.session.Sandbox.spawn` builds the argv (`command.wrap`) and the environment, then calls
`start`; callers get the `SandboxProcess` back and wait on it or kill its group. Killing everything a
sandbox ever started (strays, the uid) is `cleanup.kill_all`, not this.

    proc = start(argv, cwd=workspace, env=env, stdin=b"prompt", stdout=log, stderr=log)
    code = proc.wait(timeout_s=300)     # TimeoutError (the process keeps running) at the limit
    proc.kill()                         # SIGKILL the group, wait until no member is left
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from workbench.procs import stop_group

__all__ = ["SandboxProcess", "start"]


@dataclass
class SandboxProcess:
    """A process started in a sandbox, leader of its own process group."""

    popen: subprocess.Popen[bytes]
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


def start(
    command: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdin: bytes | None = None,
    stdout: Path | None = None,
    stderr: Path | None = None,
    pass_fds: tuple[int, ...] = (),
) -> SandboxProcess:
    """Start the already wrapped `command` in `cwd`, in a new process group. `stdout` and `stderr` are
    opened here and inherited: the sandbox itself cannot open them by name. `stdin` is written whole,
    then closed (a process that exits without reading it is no error)."""
    out: IO[bytes] | int = open(stdout, "wb") if stdout else subprocess.DEVNULL
    err: IO[bytes] | int = out if stderr == stdout else open(stderr, "wb") if stderr else subprocess.DEVNULL
    try:
        popen = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    finally:
        for f in {id(out): out, id(err): err}.values():
            if not isinstance(f, int):  # DEVNULL
                f.close()
    if stdin is not None and popen.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            popen.stdin.write(stdin)
        popen.stdin.close()
    return SandboxProcess(popen)

"""A test process under the grader's watch: its output drained and capped, its time bounded.

`Child` runs one command in the jail and pumps its pipes with a selector until it ends, passes the
output cap or the deadline, or writes past the jail's budget (`Failed` says which). `Runner` is the
function-call protocol on top: it starts `runner.py` (which loads solution.py from its text), then
sends one request line per call and reads one tagged-JSON answer line back (`runner.encode`/`decode`).

    child = Child(jail, [sys.executable, *PYTHON_FLAGS, "solution.py"], stdin=f)
    child.finish(deadline)                      # Failed("timeout" | "crash", reason)
    value = Runner(jail, "add", deadline).call([1, 2], {}, deadline)
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from typing import IO, Any, Literal, cast

from workbench.procs import exit_signal, signal_name
from workbench.verify.jail import BUDGET_POLL_S, Jail
from workbench.verify.runner import decode, encode

__all__ = ["Child", "Runner", "Failed", "PYTHON_FLAGS", "clip"]

PYTHON_FLAGS = ("-E", "-s", "-B")  # no PYTHON* variables, no user site, no .pyc files in the copy
EXIT_GRACE_S = 0.5  # how long output may still arrive after a test process exited


class Failed(BaseException):
    """The solution's side failed (timeout, crash); BaseException so that check() cannot swallow it."""

    def __init__(self, outcome: Literal["timeout", "crash"], reason: str) -> None:
        super().__init__(reason)
        self.outcome, self.reason = outcome, reason


def clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


class Child:
    """A running test process whose stdout and stderr are drained (and capped) while we wait on it."""

    def __init__(self, box: Jail, cmd: list[str], stdin: IO[bytes] | int) -> None:
        self.box, self.cap = box, box.limits.output_bytes
        self.proc = box.spawn(cmd, stdin)
        self.out, self.err, self.err_bytes = bytearray(), bytearray(), 0
        self.pending = b""  # bytes still to write to the process' stdin
        self.over: str | None = None  # which stream passed the output cap
        self.stopped = False
        self.sel = selectors.DefaultSelector()
        for f in (_pipe(self.proc.stdout), _pipe(self.proc.stderr)):
            os.set_blocking(f.fileno(), False)
            self.sel.register(f, selectors.EVENT_READ)

    def pump(self, deadline: float, until: Callable[[], bool] = lambda: False) -> str:
        """Move bytes until ``until()`` holds ("until"), both outputs close ("eof"; also shortly after the
        process exits, even if something it left behind holds them), one passes the cap ("output") or
        the deadline passes ("timeout"). What the tests wrote past the jail's budget (`Jail.over_budget`,
        measured every `BUDGET_POLL_S`) kills the process and raises `Failed` ("crash")."""
        while True:
            if until():
                return "until"
            if self.over:
                return "output"
            if not any(k.fileobj is not self.proc.stdin for k in self.sel.get_map().values()):
                return "eof"
            over = self.box.over_budget(now=False)
            if over:  # it wrote too much: killed now, before it writes more; the verification scores 0
                self.stop()
                raise Failed("crash", over)
            if not self.stopped and self.proc.poll() is not None:
                self.stop()  # it exited: what it left behind (holding the pipes) dies too
                deadline = min(deadline, time.monotonic() + EXIT_GRACE_S)
            left = deadline - time.monotonic()
            if left <= 0:
                return "eof" if self.stopped else "timeout"
            for key, _ in self.sel.select(min(left, BUDGET_POLL_S)):
                if key.fileobj is self.proc.stdin:
                    self._write()
                else:  # one of the output pipes registered in __init__ (selectors types it as a bare fileno holder)
                    self._read(cast(IO[bytes], key.fileobj))

    def finish(self, deadline: float) -> None:
        """Wait for the process to end, raising `Failed` for a timeout or too much output."""
        status = self.pump(deadline)
        if status == "eof":
            try:
                self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                return
            except subprocess.TimeoutExpired:
                status = "timeout"
        if status == "timeout":
            raise Failed("timeout", f"no result within {self.box.limits.time_s:g} s")
        raise Failed("crash", f"{self.over} passed the output limit of {self.cap} bytes")

    def send(self, data: bytes) -> None:
        self.pending += data
        if self.proc.stdin not in [k.fileobj for k in self.sel.get_map().values()]:
            self.sel.register(_pipe(self.proc.stdin), selectors.EVENT_WRITE)

    def stop(self) -> None:
        """Kill the process, its group and everything else the sandbox started; reap it."""
        if self.stopped:
            return
        self.stopped = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.box.sweep()
        self.proc.wait()

    def close(self) -> None:
        """`stop`, and release the pipes."""
        self.stop()
        self.sel.close()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()

    def crash_reason(self) -> str:
        rc = self.proc.returncode
        lines = [ln.strip() for ln in self.err.decode("utf-8", errors="replace").splitlines() if ln.strip()]
        last = lines[-1] if lines else ""
        sig = exit_signal(rc, bwrap=bool(self.box.bwrap))
        if sig:
            name = signal_name(sig)
            return clip(f"killed by {name}{SIGNAL_HINTS.get(name, '')}" + (f": {last}" if last else ""))
        return clip(last or f"exit code {rc}")

    def _write(self) -> None:
        try:
            n = os.write(_pipe(self.proc.stdin).fileno(), self.pending[:65536])
            self.pending = self.pending[n:]
        except BlockingIOError:
            return
        except OSError:
            self.pending = b""  # it died (broken pipe); the missing answer says so
        if not self.pending:
            self.sel.unregister(_pipe(self.proc.stdin))

    def _read(self, f: IO[bytes]) -> None:
        try:
            data = os.read(f.fileno(), 65536)
        except BlockingIOError:
            return
        if not data:
            self.sel.unregister(f)
            return
        if f is self.proc.stdout:
            self.out += data
            if len(self.out) > self.cap:
                self.over = "stdout"
        else:
            self.err_bytes += len(data)
            self.err = (self.err + data)[-4096:]
            if self.err_bytes > self.cap:
                self.over = "stderr"


def _pipe(f: IO[bytes] | None) -> IO[bytes]:
    """A pipe of the test process: `Jail.spawn` always opens stdout and stderr, `Runner` stdin too."""
    if f is None:
        raise RuntimeError("the test process has no such pipe")
    return f


SIGNAL_HINTS = {
    "SIGXFSZ": " (file size limit)",
    "SIGXCPU": " (CPU time limit)",
    "SIGSEGV": " (segfault)",
    "SIGKILL": "",
    "SIGABRT": " (abort)",
}


class Runner(Child):
    """The call runner: imports solution.py, then answers one JSON line per call on its stdout."""

    def __init__(self, box: Jail, entry: str, deadline: float) -> None:
        super().__init__(box, [box.python, *PYTHON_FLAGS, str(box.runner), entry], stdin=subprocess.PIPE)
        os.set_blocking(_pipe(self.proc.stdin).fileno(), False)
        self.used = 0  # bytes of stdout already taken as answers
        try:
            ready = self._answer(deadline)
            if not ready.get("ok"):
                raise Failed("crash", clip(str(ready.get("error"))))
        except BaseException:
            self.close()
            raise

    def call(self, args: list, kwargs: dict, deadline: float) -> Any:
        self.send((json.dumps({"args": encode(list(args)), "kwargs": encode(kwargs)}) + "\n").encode())
        answer = self._answer(deadline)
        if not answer.get("ok"):
            raise Failed("crash", clip(str(answer.get("error"))))
        try:
            return decode(answer["value"])
        except (KeyError, TypeError, ValueError, RecursionError) as exc:
            raise Failed("crash", f"unreadable answer from the solution's process: {exc}") from None

    def _answer(self, deadline: float) -> dict:
        status = self.pump(deadline, until=lambda: b"\n" in self.out[self.used :])
        if status == "until":
            end = self.out.index(b"\n", self.used)
            line, self.used = bytes(self.out[self.used : end]), end + 1
            try:
                answer = json.loads(line)
            except (ValueError, RecursionError):
                answer = None
            if not isinstance(answer, dict):
                raise Failed("crash", f"unreadable answer from the solution's process: {clip(repr(line), 80)}")
            return answer
        if status == "timeout":
            raise Failed("timeout", f"no result within {self.box.limits.time_s:g} s")
        if status == "output":
            raise Failed("crash", f"{self.over} passed the output limit of {self.cap} bytes")
        try:
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise Failed("timeout", f"no result within {self.box.limits.time_s:g} s") from None
        raise Failed("crash", "exited before answering: " + self.crash_reason())

"""Grade a finished workspace against a task's held-out tests: in a fresh copy, under limits, sandboxed.

    from pathlib import Path
    from workbench.tasks import load_task
    from workbench.verify import Shaping, sandbox_guards, shaped_reward, verify, verify_many

    result = verify(load_task("humaneval/0"), Path("runs/r1/workspace"))
    result.reward, result.passed, result.total     # 1.0 1 1  (reward = fraction of tests passed)
    print(result.table())                          # one line per test: outcome, seconds, reason
    results = verify_many([(task, ws), ...])       # a process pool sized to the machine, progress bar
    shaped_reward(result, tool_calls={"bash": 2}, timed_out=False, shaping=Shaping())   # opt-in shaping
    sandbox_guards()                               # what isolates tests here: ["rlimits", "uid", "bwrap", "netns"]

How a verification runs:

1. The workspace is copied (directories, regular files, links; no FIFOs or sockets) into a new private
   directory. The agent may still be writing to the original: grading never reads it again.
2. Every held-out test runs in new processes inside that copy (one copy for all the tests of a
   verification: what a test writes there, later tests see). stdin_stdout: ``python solution.py``
   with the input on stdin, its stdout compared after normalising line ends and trailing whitespace
   (or as whitespace-separated tokens), as TRL's opencode example does; a non-zero exit is a crash.
   function_call and humaneval: a runner kept outside the copy imports solution.py and calls the entry
   point with arguments it receives over a pipe, sending back the value as tagged JSON (tuples, sets,
   dict keys survive; objects do not, so no ``__eq__`` trick can pass). The grader compares: expected
   values and HumanEval's ``check()`` (run in the grader, calling the solution through the runner) never
   enter the solution's process or its file system, so it cannot read them. (check() and the prompt's
   helpers are the task's own code, trusted like the grader.)
3. At the end of each test everything it started is killed, and at the end the copy is deleted.

Outcomes per test: passed, wrong, timeout, crash (exception, killed, a limit hit) or missing_file (no
solution.py), each with a short reason. Reward = passed / total.

What holds (Linux; ``sandbox="auto"`` uses bubblewrap when ``bwrap`` can create namespaces here,
``"bwrap"`` insists on it, ``"none"`` never uses it). Commands are exec'd through util-linux ``prlimit``
(and ``setpriv``, ``unshare``), not a ``preexec_fn``, which is unsafe in threaded processes (Jupyter).

- time (``Limits.time_s``): always; wall clock, then the process tree is SIGKILLed (RLIMIT_CPU backs it).
- memory (``memory_mb``): always; RLIMIT_AS per process, so a 10 GB allocation fails with MemoryError.
- output (``output_bytes``): always; the grader stops reading stdout/stderr at the cap and kills.
- file size (``file_mb``): always, RLIMIT_FSIZE per file. bwrap: /tmp is a private tmpfs of 4x that;
  without bwrap, as root, files the sandbox uid left at the top of /tmp, /var/tmp and /dev/shm are
  deleted; not as root, files written outside the copy stay (disk quotas are never enforced).
- processes (``max_processes``): as root, tests run as a fresh random uid with RLIMIT_NPROC (exact:
  counts that uid's processes and threads only), with or without bwrap. Not root: RLIMIT_NPROC is
  per user, so it is set to the user's current count + max_processes (best effort).
- no stray processes: as root, every process of the fresh uid is killed after each test (also those
  that left the process group); bwrap adds a pid namespace that dies with it. Not root without bwrap:
  the process group plus processes carrying the run's environment marker; one that calls setsid and
  clears its environment escapes.
- network: bwrap ``--unshare-net`` (loopback only); without bwrap, ``unshare --net`` where permitted
  (root with CAP_SYS_ADMIN); otherwise there is none (``VerifyResult.guards``, `sandbox_guards` say).
- file system: bwrap shows only /usr (+ /bin, /lib...), the interpreter, the copy (writable) and the
  runner; HumanEval's data file is masked. Without bwrap the solution runs as the fresh uid (root) and
  cannot write anything root-owned, but reads what that uid may read; when the interpreter or the temp
  directory sits in a directory other users cannot enter (pyenv under /root, a private TMPDIR) it also
  gets CAP_DAC_READ_SEARCH: it can then read any file (keep held_out_tests.json out of reach: use bwrap).
  Not root: the user's own rights.
- deadline (``deadline_s``): tests not started before it are recorded as timeouts, not run.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import multiprocessing
import os
import random
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from .procs import exit_signal, signal_name
from .tasks import Limits, Task, humaneval_path

__all__ = ["OUTCOMES", "SANDBOXES", "TestOutcome", "VerifyResult", "Shaping", "verify", "verify_many",
           "shaped_reward", "sandbox_guards"]

OUTCOMES = ("passed", "wrong", "timeout", "crash", "missing_file")
SANDBOXES = ("auto", "bwrap", "none")
_MARKER_VAR = "WORKBENCH_VERIFY_RUN"  # set in every test process: found again by the sweep when not root
_PYTHON_FLAGS = ("-E", "-s", "-B")    # no PYTHON* variables, no user site, no .pyc files in the copy
_EXIT_GRACE_S = 0.5  # how long output may still arrive after a test process exited


@dataclass(frozen=True)
class TestOutcome:
    """What happened to one held-out test."""

    __test__ = False  # not a pytest test class

    index: int
    outcome: str      # one of OUTCOMES
    reason: str = ""  # empty when passed
    duration_s: float = 0.0


@dataclass(frozen=True)
class VerifyResult:
    """The grade of one workspace: ``reward`` is the fraction of held-out tests passed."""

    task_id: str
    reward: float
    passed: int
    total: int
    tests: list[TestOutcome]
    duration_s: float
    guards: list[str]  # what isolated the tests: rlimits always; uid, bwrap, netns where they held

    @property
    def counts(self) -> dict[str, int]:
        return {o: sum(t.outcome == o for t in self.tests) for o in OUTCOMES}

    def to_json(self) -> dict:
        return {**asdict(self), "counts": self.counts}

    @classmethod
    def from_json(cls, d: dict) -> VerifyResult:
        d = {k: v for k, v in d.items() if k != "counts"}
        return cls(**{**d, "tests": [TestOutcome(**t) for t in d["tests"]]})

    def table(self) -> str:
        """A header line and one line per test, for terminals and notebooks."""
        head = (f"{self.task_id}: reward {self.reward:.3f} ({self.passed}/{self.total} passed) in "
                f"{self.duration_s:.2f}s [{', '.join(self.guards)}]")
        rows = [f"{'#':>3}  {'outcome':<12} {'seconds':>7}  reason"]
        rows += [f"{t.index:>3}  {t.outcome:<12} {t.duration_s:>7.2f}  {t.reason}" for t in self.tests]
        return "\n".join([head, *rows])


@dataclass(frozen=True)
class Shaping:
    """Reward shaping of TRL's opencode example (``opencode_reward``), applied only by `shaped_reward`.

    Defaults are the August example: dense base, budget 30. ``binary=True, tool_budget=20`` is July's.
    """

    binary: bool = False              # base 1.0 only when every test passed, else the pass fraction
    shell_tool: str = "bash"          # the harness' shell tool; never calling it costs no_shell_penalty
    no_shell_penalty: float = 0.1
    tool_budget: int = 30             # tool calls beyond it cost over_budget_penalty each ...
    over_budget_penalty: float = 0.03
    max_over_budget_penalty: float = 0.5  # ... up to this much


def shaped_reward(result: VerifyResult, *, tool_calls: dict[str, int], timed_out: bool,
                  shaping: Shaping = Shaping()) -> float:
    """The shaped training reward of one rollout; ``result.reward`` stays the raw score.

    A timed-out rollout gets base 0; the penalties apply on top (the result may be negative).
    """
    if timed_out:
        base = 0.0
    elif shaping.binary:
        base = float(result.passed == result.total)
    else:
        base = result.reward
    penalty = shaping.no_shell_penalty if tool_calls.get(shaping.shell_tool, 0) == 0 else 0.0
    over = max(0, sum(tool_calls.values()) - shaping.tool_budget)
    return base - penalty - min(shaping.max_over_budget_penalty, over * shaping.over_budget_penalty)


def verify(task: Task, workspace: Path | str, *, sandbox: str = "auto") -> VerifyResult:
    """Grade ``workspace/solution.py`` (in a fresh copy of ``workspace``) on ``task``'s held-out tests."""
    start = time.monotonic()
    workspace = Path(workspace)
    host, bwrap = _resolve(sandbox)
    if not workspace.is_dir():
        raise FileNotFoundError(f"workspace {workspace} is not a directory")
    limits = task.limits
    deadline = start + limits.deadline_s
    outcomes = []
    with _Sandbox(limits, host, bwrap=bwrap) as box:
        box.copy_in(workspace)
        present = (box.ws / "solution.py").is_file()
        for i, test in enumerate(task.held_out_tests):
            t0 = time.monotonic()
            if not present:
                outcome, reason = "missing_file", "there is no solution.py in the workspace"
            elif t0 >= deadline:
                outcome, reason = "timeout", f"not run: the verification deadline ({limits.deadline_s:g} s) had passed"
            else:
                outcome, reason = _grade(box, task, test, min(t0 + limits.time_s, deadline))
            outcomes.append(TestOutcome(i, outcome, reason, round(time.monotonic() - t0, 4)))
    passed = sum(o.outcome == "passed" for o in outcomes)
    return VerifyResult(task_id=task.id, reward=passed / len(outcomes), passed=passed, total=len(outcomes),
                        tests=outcomes, duration_s=round(time.monotonic() - start, 4), guards=_guards(host, bwrap))


def sandbox_guards(sandbox: str = "auto") -> list[str]:
    """What isolates tests that ``verify(..., sandbox=sandbox)`` runs on this machine: always "rlimits";
    "uid" (a fresh uid per verification: as root), "bwrap", "netns" where they hold."""
    return _guards(*_resolve(sandbox))


def verify_many(items: Sequence[tuple[Task, Path]], workers: int | None = None, progress: bool = True, *,
                sandbox: str = "auto") -> list[VerifyResult]:
    """`verify` each (task, workspace) pair, in order; ``workers`` processes (default: the usable CPUs).

    Each verification runs its tests one after another, so the pool keeps about ``workers`` test
    processes busy. ``workers=1`` verifies in this process.
    """
    from tqdm.auto import tqdm

    workers = workers or len(os.sched_getaffinity(0))
    results: list[VerifyResult | None] = [None] * len(items)
    with tqdm(total=len(items), desc="verify", unit="workspace", disable=not progress) as bar:
        if workers == 1 or len(items) <= 1:
            for i, (task, ws) in enumerate(items):
                results[i] = verify(task, ws, sandbox=sandbox)
                bar.update()
            return results  # type: ignore[return-value]
        # spawn, not fork: forking a threaded process (a Jupyter kernel, tqdm's monitor) can deadlock.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(workers, len(items)), mp_context=ctx) as pool:
            futures = {pool.submit(verify, task, ws, sandbox=sandbox): i for i, (task, ws) in enumerate(items)}
            try:
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.update()
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
    return results  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------ grading

class _Failed(BaseException):
    """The solution's side failed (timeout, crash); BaseException so that check() cannot swallow it."""

    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome, self.reason = outcome, reason


def _grade(box: _Sandbox, task: Task, test: dict, deadline: float) -> tuple[str, str]:
    try:
        if task.test_kind == "stdin_stdout":
            return _grade_stdin(box, test, deadline)
        if task.test_kind == "function_call":
            return _grade_call(box, task.entry_point, test, deadline)
        return _grade_check(box, task.entry_point, test, deadline)
    except _Failed as failed:
        return failed.outcome, failed.reason


def _grade_stdin(box: _Sandbox, test: dict, deadline: float) -> tuple[str, str]:
    with tempfile.TemporaryFile(dir=box.root) as stdin:  # unlinked at once; the process keeps its fd
        stdin.write(test["input"].encode())
        stdin.seek(0)
        child = _Child(box, [sys.executable, *_PYTHON_FLAGS, "solution.py"], stdin=stdin)
    try:
        child.finish(deadline)
    finally:
        child.close()
    out = child.out.decode("utf-8", errors="replace")
    if child.proc.returncode != 0:
        raise _Failed("crash", child.crash_reason())
    if _normalise(out) == _normalise(test["output"]) or out.split() == test["output"].split():
        return "passed", ""
    got = _clip(repr(_normalise(out)), 60) if out.strip() else "no output"
    return "wrong", f"expected {_clip(repr(_normalise(test['output'])), 60)}, got {got}"


def _grade_call(box: _Sandbox, entry: str, test: dict, deadline: float) -> tuple[str, str]:
    runner = _Runner(box, entry, deadline)
    try:
        value = runner.call(test["input"], {}, deadline)
    finally:
        runner.close()
    expected = test["output"]
    if _same(value, expected):
        return "passed", ""
    shown = expected[0] if isinstance(expected, list) and len(expected) == 1 else expected
    return "wrong", f"returned {_clip(repr(value), 60)}, expected {_clip(repr(shown), 60)}"


def _grade_check(box: _Sandbox, entry: str, test: dict, deadline: float) -> tuple[str, str]:
    # check() and the prompt's helpers (poly, encode_cyclic...) are the task's own trusted code: they run
    # here, and only the candidate's calls cross into the sandbox.
    source = f"{test['prelude']}\n\n{test['check']}"
    namespace: dict[str, Any] = {"__name__": "__check__"}
    exec(compile(source, "<check>", "exec"), namespace)
    runner = _Runner(box, entry, deadline)
    last: list[str] = []  # the latest call and its value: what a failed assertion was most likely about

    def candidate(*args: Any, **kwargs: Any) -> Any:
        value = runner.call(list(args), kwargs, deadline)
        shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        last[:] = [f"{entry}({_clip(shown, 60)}) returned {_clip(repr(value), 60)}"]
        return value

    namespace[entry] = candidate  # some checks call the function by name (HumanEval/33 compares with it)
    try:
        namespace["check"](candidate)
    except AssertionError as exc:
        failure = _assertion_reason(exc, source)
    except Exception as exc:  # check() tripped over what the solution returned (None, a wrong type)
        failure = _clip(f"check() raised {type(exc).__name__}: {exc}", 160)
    else:
        return "passed", ""
    finally:
        runner.close()
    return "wrong", _clip(failure + "".join(f"; last call: {c}" for c in last), 300)


def _normalise(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _same(value: Any, expected: Any) -> bool:
    """TACO/PrimeIntellect's rule: equal, or equal to the only element of the list the dataset wraps it in."""
    value = _listed(value)
    return value == expected or (isinstance(expected, list) and len(expected) > 0 and value == expected[0])


def _listed(value: Any) -> Any:
    # JSON test data has lists where Python code returns tuples.
    if isinstance(value, (list, tuple)):
        return [_listed(v) for v in value]
    if isinstance(value, dict):
        return {k: _listed(v) for k, v in value.items()}
    return value


def _assertion_reason(exc: AssertionError, source: str) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<check>"]
    lines = source.splitlines()
    where = lines[frames[-1].lineno - 1].strip() if frames and frames[-1].lineno else "check()"
    return _clip(f"assertion failed: {where}" + (f" ({exc})" if str(exc) else ""), 160)


def _clip(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


# ----------------------------------------------------------------------------------------- the sandbox

@dataclass(frozen=True)
class _Host:
    """What this machine allows, probed once per process."""

    root: bool
    prlimit: str
    setpriv: str
    bwrap: str | None     # a bwrap that can create the namespaces we use
    unshare: str | None   # `unshare --net` works (root without bwrap)
    read_cap: bool        # root, and the interpreter is in a directory other uids cannot enter


@functools.cache
def _host() -> _Host:
    prlimit, setpriv = shutil.which("prlimit"), shutil.which("setpriv")
    if prlimit is None or setpriv is None:
        raise RuntimeError("verify needs prlimit and setpriv (util-linux) to run tests under limits")
    bwrap = shutil.which("bwrap")
    if bwrap and not _works([bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--die-with-parent",
                             "true"]):
        bwrap = None
    root = os.geteuid() == 0
    unshare = shutil.which("unshare") if root else None
    if unshare and not _works([unshare, "--net", "true"]):
        unshare = None
    reachable = all(_reachable(Path(p)) for p in _python_dirs())
    return _Host(root=root, prlimit=prlimit, setpriv=setpriv, bwrap=bwrap, unshare=unshare,
                 read_cap=root and not reachable)


def _resolve(sandbox: str) -> tuple[_Host, bool]:
    """The host and whether to use bwrap, for a ``sandbox`` argument."""
    if sandbox not in SANDBOXES:
        raise ValueError(f"unknown sandbox {sandbox!r}: expected one of {SANDBOXES}")
    host = _host()
    if sandbox == "bwrap" and host.bwrap is None:
        raise RuntimeError("sandbox='bwrap' but bwrap is not installed or cannot create namespaces here")
    return host, sandbox != "none" and host.bwrap is not None


def _guards(host: _Host, bwrap: bool) -> list[str]:
    return ["rlimits", *(["uid"] if host.root else []), *(["bwrap"] if bwrap else []),
            *(["netns"] if bwrap or host.unshare else [])]


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _python_dirs() -> list[str]:
    """Directories the interpreter needs: the venv, its base installation, the real binary's."""
    dirs = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
            os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(os.path.realpath(d) for d in dirs)


def _reachable(path: Path) -> bool:
    """Whether a uid with no rights of its own can walk down to ``path``."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents])


class _Sandbox:
    """One verification's private directory, and how its test processes are started and stopped."""

    def __init__(self, limits: Limits, host: _Host, *, bwrap: bool) -> None:
        self.limits, self.host = limits, host
        self.bwrap = host.bwrap if bwrap else None
        # A fresh uid per verification (root only): RLIMIT_NPROC then counts just this test's processes,
        # and "every process of this uid" is exactly what to kill afterwards.
        self.uid = random.SystemRandom().randrange(1_000_000, 2_000_000_000) if host.root else None
        self.marker = os.urandom(8).hex()

    def __enter__(self) -> _Sandbox:
        self.root = Path(tempfile.mkdtemp(prefix="wb-verify-"))
        try:
            os.chmod(self.root, 0o711)  # the sandbox uid may pass through to ws/ and runner.py, not list
            self.ws, self.tmp, self.runner = self.root / "ws", self.root / "tmp", self.root / "runner.py"
            self.runner.write_text(_RUNNER_SOURCE)
            self.runner.chmod(0o644)
        except BaseException:
            _remove_tree(self.root)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.sweep()
        finally:
            _remove_tree(self.root)
            if self.uid is not None and self.bwrap is None:
                for shared in ("/tmp", "/var/tmp", "/dev/shm"):
                    _remove_owned(Path(shared), self.uid)

    def copy_in(self, workspace: Path) -> None:
        try:
            shutil.copytree(workspace, self.ws, symlinks=True, ignore=_special_files)
        except shutil.Error:
            pass  # files that vanished mid-copy (the agent may still be running): graded without them
        self.tmp.mkdir(mode=0o700)
        if self.uid is not None:
            os.lchown(self.tmp, self.uid, self.uid)
            for top, dirs, files in os.walk(self.ws):  # does not follow links: lchown the links themselves
                os.lchown(top, self.uid, self.uid)
                for name in dirs + files:
                    os.lchown(os.path.join(top, name), self.uid, self.uid)

    def spawn(self, cmd: list[str], stdin: IO[bytes] | int) -> subprocess.Popen:
        return subprocess.Popen(self._argv(cmd), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=self.ws, env=self._env(), start_new_session=True, close_fds=True)

    def sweep(self) -> None:
        """Kill every process this verification started, including those that left the process group."""
        if self.uid is not None:
            _kill_matching(lambda pid, uid: uid == self.uid)
        else:
            me, needle = os.getuid(), f"{_MARKER_VAR}={self.marker}".encode()
            _kill_matching(lambda pid, uid: uid == me and needle in _environ(pid))

    def _argv(self, cmd: list[str]) -> list[str]:
        lim = self.limits
        nproc = lim.max_processes if self.uid is not None else _count_tasks(os.getuid()) + lim.max_processes
        argv = [self.host.prlimit, f"--as={lim.memory_mb << 20}", f"--fsize={lim.file_mb << 20}",
                f"--nproc={nproc}", f"--cpu={math.ceil(lim.time_s) + 1}", "--core=0", "--"]
        if self.bwrap:
            argv += self._bwrap_args()
        elif self.host.unshare:
            argv += [self.host.unshare, "--net", "--"]
        argv += [self.host.setpriv, "--nnp"]
        if self.uid is not None:
            # The fresh uid must be able to walk to the interpreter and to the copy; where it cannot (pyenv
            # under /root, a private TMPDIR) it keeps CAP_DAC_READ_SEARCH. bwrap makes its own parents.
            locked = not self.bwrap and (self.host.read_cap or not _reachable(self.root.parent))
            caps = "-all,+dac_read_search" if locked else "-all"
            argv += [f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", f"--inh-caps={caps}",
                     f"--bounding-set={caps}", *(["--ambient-caps=+dac_read_search"] if locked else [])]
        if not self.bwrap:
            argv += ["--pdeathsig=KILL"]  # the tests die with the grader (bwrap: --die-with-parent)
        return argv + ["--", *cmd]

    def _bwrap_args(self) -> list[str]:
        args = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net",
                "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--proc", "/proc", "--dev", "/dev",
                "--perms", "1777", "--size", str(4 * self.limits.file_mb << 20), "--tmpfs", "/tmp",
                "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            path = Path("/", name)
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives"):
            args += ["--ro-bind-try", etc, etc]
        bound, made = ["/usr"], {"/tmp", "/proc", "/dev"}
        for path in _python_dirs():
            if not _under(path, bound):
                args += _mount("--ro-bind", path, bound, made)
        args += _mount("--bind", str(self.ws), bound, made) + _mount("--ro-bind", str(self.runner), bound, made)
        data = str(humaneval_path().parent)
        if _under(data, bound):
            args += ["--tmpfs", data]  # the problems' check() sources: not the solution's to read
        return args + ["--chdir", str(self.ws)]

    def _env(self) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.ws),
                "TMPDIR": "/tmp" if self.bwrap else str(self.tmp), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                _MARKER_VAR: self.marker}


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _mount(how: str, path: str, bound: list[str], made: set[str]) -> list[str]:
    """bwrap arguments mounting ``path`` at the same place. Missing parents are created 0755 (bwrap
    would make them 0700, locking the sandbox uid out); parents inside a bind mount exist already."""
    args = []
    for parent in reversed(Path(path).parents):
        p = str(parent)
        if p != "/" and p not in made and not _under(p, bound):
            args += ["--perms", "0755", "--dir", p]
            made.add(p)
    bound.append(path)
    return args + [how, path, path]


def _special_files(directory: str, names: list[str]) -> list[str]:
    """copytree's ignore: FIFOs, sockets and devices (reading a FIFO would block the grader forever)."""
    skip = []
    for name in names:
        try:
            mode = os.lstat(os.path.join(directory, name)).st_mode
        except FileNotFoundError:
            skip.append(name)
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            skip.append(name)
    return skip


def _processes() -> list[tuple[int, int, int]]:
    """(pid, real uid, threads) of every live, non-zombie process."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        state, uid, threads = (_field(status, key) for key in ("\nState:", "\nUid:", "\nThreads:"))
        if state and state not in ("Z", "X"):
            found.append((int(entry), int(uid), int(threads)))
    return found


def _field(status: str, key: str) -> str:
    """The first word after ``key`` in a /proc status text ("" if absent); runs for every process, twice
    per test, so it avoids parsing the rest."""
    at = status.find(key)
    return status[at + len(key):status.find("\n", at + 1)].split(maxsplit=1)[0] if at >= 0 else ""


def _count_tasks(uid: int) -> int:
    """Processes and threads of ``uid``: what RLIMIT_NPROC counts."""
    return sum(threads for _, owner, threads in _processes() if owner == uid)


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _kill_matching(match: Callable[[int, int], bool]) -> None:
    # Repeat: a process may fork between the scan and the kill; each round leaves fewer (RLIMIT_NPROC).
    me = os.getpid()
    for _ in range(100):
        victims = [pid for pid, uid, _ in _processes() if pid != me and match(pid, uid)]
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.002)


def _remove_tree(path: Path) -> None:
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
                _remove_tree(entry)
            else:
                entry.unlink()
        except OSError:
            pass


# ------------------------------------------------------------------------------------- test processes

class _Child:
    """A running test process whose stdout and stderr are drained (and capped) while we wait on it."""

    def __init__(self, box: _Sandbox, cmd: list[str], stdin: IO[bytes] | int) -> None:
        self.box, self.cap = box, box.limits.output_bytes
        self.proc = box.spawn(cmd, stdin)
        self.out, self.err, self.err_bytes = bytearray(), bytearray(), 0
        self.pending = b""           # bytes still to write to the process' stdin
        self.over: str | None = None  # which stream passed the output cap
        self.stopped = False
        self.sel = selectors.DefaultSelector()
        for f in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(f.fileno(), False)
            self.sel.register(f, selectors.EVENT_READ)

    def pump(self, deadline: float, until: Callable[[], bool] = lambda: False) -> str:
        """Move bytes until ``until()`` holds ("until"), both outputs close ("eof"; also shortly after the
        process exits, even if something it left behind holds them), one passes the cap ("output") or
        the deadline passes ("timeout")."""
        while True:
            if until():
                return "until"
            if self.over:
                return "output"
            if not any(k.fileobj is not self.proc.stdin for k in self.sel.get_map().values()):
                return "eof"
            if not self.stopped and self.proc.poll() is not None:
                self.stop()  # it exited: what it left behind (holding the pipes) dies too
                deadline = min(deadline, time.monotonic() + _EXIT_GRACE_S)
            left = deadline - time.monotonic()
            if left <= 0:
                return "eof" if self.stopped else "timeout"
            for key, _ in self.sel.select(min(left, 0.1)):
                if key.fileobj is self.proc.stdin:
                    self._write()
                else:
                    self._read(key.fileobj)

    def finish(self, deadline: float) -> None:
        """Wait for the process to end, raising `_Failed` for a timeout or too much output."""
        status = self.pump(deadline)
        if status == "eof":
            try:
                self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                return
            except subprocess.TimeoutExpired:
                status = "timeout"
        if status == "timeout":
            raise _Failed("timeout", f"no result within {self.box.limits.time_s:g} s")
        raise _Failed("crash", f"{self.over} passed the output limit of {self.cap} bytes")

    def send(self, data: bytes) -> None:
        self.pending += data
        if self.proc.stdin not in [k.fileobj for k in self.sel.get_map().values()]:
            self.sel.register(self.proc.stdin, selectors.EVENT_WRITE)

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
        sig = exit_signal(rc, bwrap=self.box.bwrap)
        if sig:
            name = signal_name(sig)
            return _clip(f"killed by {name}{_SIGNAL_HINTS.get(name, '')}" + (f": {last}" if last else ""))
        return _clip(last or f"exit code {rc}")

    def _write(self) -> None:
        try:
            n = os.write(self.proc.stdin.fileno(), self.pending[:65536])
            self.pending = self.pending[n:]
        except BlockingIOError:
            return
        except OSError:
            self.pending = b""  # it died (broken pipe); the missing answer says so
        if not self.pending:
            self.sel.unregister(self.proc.stdin)

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


_SIGNAL_HINTS = {"SIGXFSZ": " (file size limit)", "SIGXCPU": " (CPU time limit)", "SIGSEGV": " (segfault)",
                 "SIGKILL": "", "SIGABRT": " (abort)"}


class _Runner(_Child):
    """The call runner: imports solution.py, then answers one JSON line per call on its stdout."""

    def __init__(self, box: _Sandbox, entry: str, deadline: float) -> None:
        super().__init__(box, [sys.executable, *_PYTHON_FLAGS, str(box.runner), entry], stdin=subprocess.PIPE)
        os.set_blocking(self.proc.stdin.fileno(), False)
        self.used = 0  # bytes of stdout already taken as answers
        try:
            ready = self._answer(deadline)
            if not ready.get("ok"):
                raise _Failed("crash", _clip(str(ready.get("error"))))
        except BaseException:
            self.close()
            raise

    def call(self, args: list, kwargs: dict, deadline: float) -> Any:
        self.send((json.dumps({"args": _encode(list(args)), "kwargs": _encode(kwargs)}) + "\n").encode())
        answer = self._answer(deadline)
        if not answer.get("ok"):
            raise _Failed("crash", _clip(str(answer.get("error"))))
        try:
            return _decode(answer["value"])
        except (KeyError, TypeError, ValueError) as exc:
            raise _Failed("crash", f"unreadable answer from the solution's process: {exc}") from None

    def _answer(self, deadline: float) -> dict:
        status = self.pump(deadline, until=lambda: b"\n" in self.out[self.used:])
        if status == "until":
            end = self.out.index(b"\n", self.used)
            line, self.used = bytes(self.out[self.used:end]), end + 1
            try:
                answer = json.loads(line)
            except ValueError:
                answer = None
            if not isinstance(answer, dict):
                raise _Failed("crash", f"unreadable answer from the solution's process: {_clip(repr(line), 80)}")
            return answer
        if status == "timeout":
            raise _Failed("timeout", f"no result within {self.box.limits.time_s:g} s")
        if status == "output":
            raise _Failed("crash", f"{self.over} passed the output limit of {self.cap} bytes")
        try:
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise _Failed("timeout", f"no result within {self.box.limits.time_s:g} s") from None
        raise _Failed("crash", "exited before answering: " + self.crash_reason())


# --------------------------------------------------------------------------------- values over the pipe
# Both functions also run inside the runner (their source is copied into it): standard library only.

def _encode(value: Any) -> Any:
    """A JSON form of a plain value that keeps its type (tuples, sets, dict keys, bytes, inf/nan are
    tagged); objects are refused, so a value with a custom __eq__ cannot cross."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"__set__": [_encode(v) for v in value]}
    if isinstance(value, dict):
        return {"__dict__": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    raise TypeError(f"cannot pass a {type(value).__name__} between processes")


def _decode(data: Any) -> Any:
    """Inverse of `_encode`; builds only plain values, so it is safe on what a solution sends."""
    if isinstance(data, list):
        return [_decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) != 1:
        raise ValueError("a tagged value has exactly one key")
    (tag, body), = data.items()
    if tag == "__tuple__":
        return tuple(_decode(v) for v in body)
    if tag == "__set__":
        return {_decode(v) for v in body}
    if tag == "__dict__":
        return {_decode(k): _decode(v) for k, v in body}
    if tag == "__bytes__":
        return bytes.fromhex(body)
    if tag == "__float__":
        return float(body)
    raise ValueError(f"unknown tag {tag!r}")


_RUNNER_MAIN = r'''
def _describe(exc):
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.basename(frame.filename) == "solution.py":
            where = f" (solution.py line {frame.lineno})"
    return f"{type(exc).__name__}: {exc}"[:300] + where


def _main():
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the solution reading stdin gets EOF, never our requests
    os.dup2(2, 1)     # its prints go to stderr: stdout carries answers only
    os.close(null)

    def answer(**message):
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    sys.set_int_max_str_digits(0)
    sys.path[0] = os.getcwd()  # import solution.py from the workspace copy, not from beside this file
    entry = sys.argv[1]
    try:
        module = importlib.import_module("solution")
    except BaseException as exc:
        answer(ok=False, error=_describe(exc))
        return
    fn = getattr(module, entry, None)
    if fn is None and isinstance(getattr(module, "Solution", None), type):
        fn = getattr(module.Solution(), entry, None)  # LeetCode style: a method of class Solution
    if not callable(fn):
        answer(ok=False, error=f"solution.py defines no function {entry!r}")
        return
    answer(ok=True)
    for line in requests:
        request = json.loads(line)
        try:
            value = fn(*_decode(request["args"]), **_decode(request["kwargs"]))
        except BaseException as exc:
            answer(ok=False, error=_describe(exc))
            continue
        try:
            answer(ok=True, value=_encode(value))
        except (TypeError, ValueError, RecursionError) as exc:
            answer(ok=False, error=f"{entry} returned a value that cannot be compared: {exc}")


_main()
'''

_RUNNER_SOURCE = ("import importlib, json, math, os, sys, traceback\nfrom typing import Any\n\n"
                  + inspect.getsource(_encode) + "\n" + inspect.getsource(_decode) + _RUNNER_MAIN)

"""Grade a finished workspace against a task's held-out tests: in a fresh copy, under limits, sandboxed.

    from pathlib import Path
    from workbench.tasks import load_task
    from workbench.verify import Shaping, sandbox_guards, shaped_reward, verify, verify_many

    result = verify(load_task("humaneval/0"), Path("runs/r1/workspace"))
    result.reward, result.passed, result.total     # 1.0 1 1  (reward = fraction of tests passed)
    print(result.table())                          # one line per test: outcome, seconds, reason
    results = verify_many([(task, ws), ...])       # a process pool sized to the machine, progress bar
    verify(task, ws, verifier="my_hooks:score")    # your own callable grades instead (`hook`)
    shaped_reward(result, tool_calls={"bash": 2}, timed_out=False, shaping=Shaping())   # opt-in shaping
    sandbox_guards()                               # what isolates tests here: ["rlimits", "uid", "bwrap", "netns"]

The package: `grading` (the rules per test kind), `jail` (the folder, namespaces, uid and limits of one
verification), `child` (a test process under watch; the call protocol), `runner` (the program that
loads solution.py inside the jail, and the tagged-JSON codec both sides share), `harbor` (a Harbor
task's test.sh and reward file; its oracle), `hook` and `hook_runner` (verifier hooks: a callable of
yours, run in the same jail), `examples` (solutions that show grading on any task: its answer key, a hostile
one that tries to read the held-out tests where they are; notebook 04).

How a verification runs:

1. The workspace is copied (directories, regular files, links; no FIFOs or sockets) into a new private
   directory, within `Limits.workspace_mb` / ``workspace_entries`` and 64 levels (`bounded_copy`: a
   sparse file counts at its full length). The agent may still be writing to the original: grading
   never reads it again. A workspace past those bounds fails every test ("cannot be graded"): reward
   0, never an exception, so a failing agent cannot make its rollout unscored.
2. Every held-out test runs in new processes inside that copy (one copy for all the tests of a
   verification: what a test writes there, later tests see). stdin_stdout: ``python solution.py``
   with the input on stdin, its stdout compared after normalising line ends and trailing whitespace
   (or as whitespace-separated tokens), as TRL's opencode example does; a non-zero exit is a crash.
   function_call and humaneval: a runner kept outside the copy compiles solution.py from its text (not a
   ``solution/`` package, not a stale ``__pycache__``) and calls the entry point with arguments it
   receives over a pipe, sending back the value as tagged JSON (tuples, sets, dict keys survive;
   objects and subclasses do not, so no ``__eq__`` or ``__iter__`` trick can pass; at most 10,000 set
   and dict members, so no hash-collision set holds the grader). The grader compares: expected
   values and HumanEval's ``check()`` (run in the grader, calling the solution through the runner) never
   enter the solution's process or its file system, so it cannot read them. (check() and the prompt's
   helpers are the task's own code, trusted like the grader.)
3. At the end of each test everything it started is killed and the copy measured against its budget
   (``Limits.disk_mb``; also while the test runs), and at the end the copy is deleted.

Outcomes per test: passed, wrong, timeout, crash (exception, killed, a limit hit, a value that cannot be
compared), missing_file (no solution.py) or error (a test that scores itself gave no usable reward),
each with a short reason. Reward = the mean of the tests' scores: 1 passed, else 0, except where a test
scores itself (Harbor's test.sh, a verifier hook: ``TestOutcome.score`` in [0, 1], ``metrics``).

What holds (Linux; ``sandbox="auto"`` uses bubblewrap when ``bwrap`` can create namespaces here,
``"bwrap"`` insists on it, ``"none"`` never uses it). Commands are exec'd through util-linux ``prlimit``
(and ``setpriv``, ``unshare``), not a ``preexec_fn``, which is unsafe in threaded processes (Jupyter).

- time (``Limits.time_s``): always; wall clock, then the process tree is SIGKILLed (RLIMIT_CPU backs it).
- memory (``memory_mb``): always; RLIMIT_AS per process, so a 10 GB allocation fails with MemoryError.
- output (``output_bytes``): always; the grader stops reading stdout/stderr at the cap and kills.
- file size (``file_mb``): always, RLIMIT_FSIZE per file. bwrap: /tmp is a private tmpfs of 4x that;
  without bwrap, as root, files the sandbox uid left at the top of /tmp, /var/tmp and /dev/shm are
  deleted; not as root, files written outside the copy stay (disk quotas are never enforced).
- total written (``disk_mb``, ``disk_entries``): always; the copy, its TMPDIR and the writable folders
  are measured (allocated blocks, entries) every 10 ms while a test runs and after each test; past the
  budget the tests are killed and every test fails ("the grading copy exceeded 256 MiB during test 2"):
  reward 0, scored, and the copy removed. Polling: a writer at ~1.2 GiB/s got 1-19 MiB past a 64 MiB
  budget before the kill (`benchmarks/grading_budget.py`). Not counted: a file deleted while a
  test still holds it open (gone when the test is killed), and without bwrap the shared /tmp, /var/tmp
  and /dev/shm (see file size).
- processes (``max_processes``): as root, tests run as a fresh random uid with RLIMIT_NPROC (exact:
  counts that uid's processes and threads only), with or without bwrap. Not root: RLIMIT_NPROC is
  per user, so it is set to the user's current count + max_processes (best effort).
- no stray processes: as root, every process of the fresh uid is killed after each test (also those
  that left the process group); bwrap adds a pid namespace that dies with it. Not root without bwrap:
  the process group plus processes carrying the run's environment marker; one that calls setsid and
  clears its environment escapes.
- network: bwrap ``--unshare-net`` (loopback only); without bwrap, ``unshare --net`` where permitted
  (root with CAP_SYS_ADMIN); otherwise there is none (``VerifyResult.guards``, `sandbox_guards` say).
- no root, no capability: as root, the graded code runs as a fresh uid with every capability dropped and
  none to regain (``setpriv --nnp``, empty bounding set), in both modes.
- file system: bwrap shows only /usr (+ /bin, /lib...), the interpreter, the copy (writable) and the
  runner; HumanEval's data file is masked. Without bwrap the fresh uid reads only what other users may:
  plain grading refuses to start while the answers' folders (`paths.private_paths`: task data,
  HumanEval's data, run folders, caches; set-up makes them 0700) are open to others, and runs a Python
  that uid can reach (the system one when ours sits under /root). Not root: the user's own rights.
- deadline (``deadline_s``): tests not started before it are recorded as timeouts, not run.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.sandbox import CopyLimitError
from workbench.tasks import Task
from workbench.verify.grading import OUTCOMES, Graded, Outcome, grade
from workbench.verify.harbor import jail_options as harbor_options
from workbench.verify.hook import jail_options as hook_options, parse_hook, run_hook
from workbench.verify.jail import Jail
from workbench.verify.jail_host import SANDBOXES, guards, resolve

__all__ = [
    "OUTCOMES",
    "SANDBOXES",
    "TestOutcome",
    "VerifyResult",
    "Shaping",
    "verify",
    "verify_many",
    "shaped_reward",
    "sandbox_guards",
]


@dataclass(frozen=True)
class TestOutcome:
    """What happened to one held-out test."""

    __test__ = False  # not a pytest test class

    index: int
    outcome: Outcome
    reason: str = ""  # empty when passed
    duration_s: float = 0.0
    score: float | None = None  # set by tests that score themselves (Harbor, hooks); else 1 if passed
    metrics: dict[str, float] | None = None  # the other numbers such a test reported


@dataclass(frozen=True)
class VerifyResult:
    """The grade of one workspace: ``reward`` is the mean of its tests' scores (the fraction passed)."""

    task_id: str
    reward: float
    passed: int
    total: int
    tests: list[TestOutcome]
    duration_s: float
    guards: list[str]  # what isolated the tests: rlimits always; uid, bwrap, netns where they held
    error: str | None = None  # the grader itself failed on this workspace (`verify_many` only)

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
        head = (
            f"{self.task_id}: reward {self.reward:.3f} ({self.passed}/{self.total} passed) in "
            f"{self.duration_s:.2f}s [{', '.join(self.guards)}]"
        )
        rows = [f"{'#':>3}  {'outcome':<12} {'seconds':>7}  reason"]
        rows += [f"{t.index:>3}  {t.outcome:<12} {t.duration_s:>7.2f}  {t.reason}" for t in self.tests]
        return "\n".join([head, *rows])


@dataclass(frozen=True)
class Shaping:
    """Reward shaping of TRL's opencode example (``opencode_reward``), applied only by `shaped_reward`.

    Defaults are the August example: dense base, budget 30. ``binary=True, tool_budget=20`` is July's.
    """

    binary: bool = False  # base 1.0 only when every test passed, else the pass fraction
    shell_tool: str = "bash"  # the harness' shell tool; never calling it costs no_shell_penalty
    no_shell_penalty: float = 0.1
    tool_budget: int = 30  # tool calls beyond it cost over_budget_penalty each ...
    over_budget_penalty: float = 0.03
    max_over_budget_penalty: float = 0.5  # ... up to this much


def shaped_reward(
    result: VerifyResult, *, tool_calls: dict[str, int], timed_out: bool, shaping: Shaping = Shaping()
) -> float:
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


def verify(task: Task, workspace: Path | str, *, sandbox: str = "auto", verifier: str | None = None) -> VerifyResult:
    """Grade ``workspace/solution.py`` (in a fresh copy of ``workspace``) on ``task``'s held-out tests; a
    Harbor task by its test.sh; with a verifier hook (``verifier``, else ``task.verifier``) by the hook alone."""
    start = time.monotonic()
    workspace = Path(workspace)
    host, bwrap = resolve(sandbox)
    if not workspace.is_dir():
        raise FileNotFoundError(f"workspace {workspace} is not a directory")
    limits = task.limits
    deadline = start + limits.deadline_s
    spec = verifier or task.verifier
    hook = parse_hook(spec) if spec else None
    options = hook_options(hook, bwrap) if hook else harbor_options(task, bwrap) if task.test_kind == "harbor" else {}
    tests = [{"verifier": spec}] if hook else task.held_out_tests
    outcomes = []
    with Jail(limits, host, bwrap=bwrap, **options) as box:
        unreadable = None
        try:
            box.copy_in(workspace)
        except (CopyLimitError, OSError, RecursionError) as exc:  # the agent's doing: every test fails
            unreadable = f"the workspace cannot be graded: {exc}"
        # The file itself, not a folder or a link named so (the runner reads it as a regular file).
        present = (box.ws / "solution.py").is_file() and not (box.ws / "solution.py").is_symlink()
        present = present or hook is not None or task.test_kind == "harbor"  # these grade the whole folder
        for i, test in enumerate(tests):
            t0 = time.monotonic()
            if unreadable:
                graded = Graded("crash", unreadable)
            elif not present:
                graded = Graded("missing_file", "there is no solution.py in the workspace")
            elif t0 >= deadline:
                graded = Graded("timeout", f"not run: the verification deadline ({limits.deadline_s:g} s) had passed")
            elif hook:
                graded = run_hook(box, task, hook, min(t0 + limits.time_s, deadline))
            else:
                graded = grade(box, task, test, min(t0 + limits.time_s, deadline))
            outcomes.append(
                TestOutcome(
                    i, graded.outcome, graded.reason, round(time.monotonic() - t0, 4), graded.score, graded.metrics
                )
            )
            if not unreadable and box.over_budget():  # its processes are gone: all it wrote is counted
                outcomes = _over_budget(outcomes, len(tests), f"{box.exceeded} during test {i}")
                break
    passed = sum(o.outcome == "passed" for o in outcomes)
    reward = sum(float(o.outcome == "passed") if o.score is None else o.score for o in outcomes) / len(outcomes)
    return VerifyResult(
        task_id=task.id,
        reward=reward,
        passed=passed,
        total=len(outcomes),
        tests=outcomes,
        duration_s=round(time.monotonic() - start, 4),
        guards=guards(host, bwrap),
    )


def _over_budget(ran: list[TestOutcome], total: int, why: str) -> list[TestOutcome]:
    """Every test failed: the grading copy passed its budget (what it wrote stops counting as output)."""
    return [
        TestOutcome(i, "crash", f"{why}: the verification fails", ran[i].duration_s if i < len(ran) else 0.0)
        for i in range(total)
    ]


def sandbox_guards(sandbox: str = "auto") -> list[str]:
    """What isolates tests that ``verify(..., sandbox=sandbox)`` runs on this machine: always "rlimits";
    "uid" (a fresh uid per verification: as root), "bwrap", "netns" where they hold."""
    return guards(*resolve(sandbox))


def verify_many(
    items: Sequence[tuple[Task, Path]],
    workers: int | None = None,
    progress: bool = True,
    *,
    sandbox: str = "auto",
    verifier: str | None = None,
) -> list[VerifyResult]:
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
                results[i] = _verify_one(task, ws, sandbox, verifier)
                bar.update()
            return results  # type: ignore[return-value]
        # spawn, not fork: forking a threaded process (a Jupyter kernel, tqdm's monitor) can deadlock.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(workers, len(items)), mp_context=ctx) as pool:
            futures = {pool.submit(_verify_one, task, ws, sandbox, verifier): i for i, (task, ws) in enumerate(items)}
            try:
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.update()
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
    return results  # type: ignore[return-value]


def _verify_one(task: Task, workspace: Path, sandbox: str, verifier: str | None = None) -> VerifyResult:
    """`verify`, with a failure of the grader itself recorded on this item (``error``, reward 0) instead
    of raised: one bad item must not lose the batch's other grades."""
    start = time.monotonic()
    try:
        return verify(task, workspace, sandbox=sandbox, verifier=verifier)
    except Exception as exc:  # noqa: BLE001 - recorded per item, the batch goes on
        reason = f"verification failed: {type(exc).__name__}: {exc}"[:300]
        tests = [TestOutcome(i, "crash", reason) for i in range(len(task.held_out_tests))]
        return VerifyResult(
            task_id=task.id,
            reward=0.0,
            passed=0,
            total=len(tests),
            tests=tests,
            duration_s=round(time.monotonic() - start, 4),
            guards=[],
            error=reason,
        )

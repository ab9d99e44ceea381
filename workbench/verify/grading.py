"""Grading rules per test kind: how one held-out test is run and judged.

- ``stdin_stdout``: ``python solution.py`` with the input on stdin; stdout compared after normalising
  line ends and trailing whitespace (or as whitespace-separated tokens), as TRL's opencode example
  does; a non-zero exit is a crash.
- ``function_call``: the runner calls the entry point with the test's arguments; the value equals
  the expected one, or the only element of the list the dataset wraps it in (TACO/PrimeIntellect).
- ``humaneval``: the problem's ``check()`` runs here, in the grader (trusted task code), calling the
  candidate through the runner: expected values never enter the solution's process.
- ``harbor``: the task's ``tests/test.sh`` in the jail, its reward file read back (`verify.harbor`).

    outcome, reason, score, metrics = grade(jail, task, task.held_out_tests[0], deadline)
"""

from __future__ import annotations

import tempfile
import traceback
from typing import Any

from workbench.tasks import Task
from workbench.verify.child import PYTHON_FLAGS, Child, Failed, Runner, clip
from workbench.verify.graded import OUTCOMES, Graded, Outcome
from workbench.verify.harbor import grade_harbor
from workbench.verify.jail import Jail

__all__ = ["grade", "Graded", "Outcome", "OUTCOMES"]


def grade(box: Jail, task: Task, test: dict, deadline: float) -> Graded:
    """One held-out test. Whatever the solution returns or leaves behind ends as an outcome of this
    test (a value too deep to compare, too many set members, one that breaks check()): never as an
    exception that would lose the other tests or the rollout's score."""
    if task.test_kind == "harbor":
        return grade_harbor(box, task, test, deadline)
    try:
        if task.test_kind == "stdin_stdout":
            return Graded(*_grade_stdin(box, test, deadline))
        entry = task.entry_point or ""
        if task.test_kind == "function_call":
            return Graded(*_grade_call(box, entry, test, deadline))
        return Graded(*_grade_check(box, entry, test, deadline))
    except Failed as failed:
        return Graded(failed.outcome, failed.reason)
    except (RecursionError, MemoryError, OverflowError) as exc:  # comparing or showing what it returned
        return Graded("crash", f"the solution's value could not be compared: {type(exc).__name__}")


def _grade_stdin(box: Jail, test: dict, deadline: float) -> tuple[Outcome, str]:
    with tempfile.TemporaryFile(dir=box.root) as stdin:  # unlinked at once; the process keeps its fd
        stdin.write(test["input"].encode())
        stdin.seek(0)
        child = Child(box, [box.python, *PYTHON_FLAGS, "solution.py"], stdin=stdin)
    try:
        child.finish(deadline)
    finally:
        child.close()
    out = child.out.decode("utf-8", errors="replace")
    if child.proc.returncode != 0:
        raise Failed("crash", child.crash_reason())
    if _normalise(out) == _normalise(test["output"]) or out.split() == test["output"].split():
        return "passed", ""
    got = clip(repr(_normalise(out)), 60) if out.strip() else "no output"
    return "wrong", f"expected {clip(repr(_normalise(test['output'])), 60)}, got {got}"


def _grade_call(box: Jail, entry: str, test: dict, deadline: float) -> tuple[Outcome, str]:
    runner = Runner(box, entry, deadline)
    try:
        value = runner.call(test["input"], {}, deadline)
    finally:
        runner.close()
    expected = test["output"]
    if _same(value, expected):
        return "passed", ""
    shown = expected[0] if isinstance(expected, list) and len(expected) == 1 else expected
    return "wrong", f"returned {clip(repr(value), 60)}, expected {clip(repr(shown), 60)}"


def _grade_check(box: Jail, entry: str, test: dict, deadline: float) -> tuple[Outcome, str]:
    # check() and the prompt's helpers (poly, encode_cyclic...) are the task's own trusted code: they run
    # here, and only the candidate's calls cross into the sandbox.
    source = f"{test['prelude']}\n\n{test['check']}"
    namespace: dict[str, Any] = {"__name__": "__check__"}
    exec(compile(source, "<check>", "exec"), namespace)
    runner = Runner(box, entry, deadline)
    last: list[str] = []  # the latest call and its value: what a failed assertion was most likely about

    def candidate(*args: Any, **kwargs: Any) -> Any:
        value = runner.call(list(args), kwargs, deadline)
        shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        last[:] = [f"{entry}({clip(shown, 60)}) returned {clip(repr(value), 60)}"]
        return value

    namespace[entry] = candidate  # some checks call the function by name (HumanEval/33 compares with it)
    try:
        namespace["check"](candidate)
    except AssertionError as exc:
        failure = _assertion_reason(exc, source)
    except Exception as exc:  # check() tripped over what the solution returned (None, a wrong type)
        failure = clip(f"check() raised {type(exc).__name__}: {exc}", 160)
    else:
        return "passed", ""
    finally:
        runner.close()
    return "wrong", clip(failure + "".join(f"; last call: {c}" for c in last), 300)


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
    return clip(f"assertion failed: {where}" + (f" ({exc})" if str(exc) else ""), 160)

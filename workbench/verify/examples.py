"""Example solutions that show what grading does with any task whose tests call a function or feed stdin
(notebook 04): the task's own answer key (every held-out test right, or only some: partial credit), and a
hostile solution that attacks the grader and then tries to read the held-out tests where they really are.

    from workbench.verify import answer_key, cannot_show, hostile, leaked, tests_file
    cannot_show(task)                          # None, or why these examples cannot be built for `task`
    answer_key(task)                           # solution.py returning every held-out test's expected value
    answer_key(task, right=lambda i: i % 2 == 0)   # ... the even-numbered tests' only: partial credit
    tests_file(task)                           # the file the held-out tests are loaded from on this machine
    hostile(task)                              # forks, spins, floods, then reads tests_file(task) for answers
    leaked(verify(task, ws_with_hostile))      # the tests it passed (only reading the answers passes them)
    r = grade_source(task, answer_key(task))   # any of these graded as solution.py, as a rollout's would be
    verify_rows(r, "answer key")               # its reward, then each test's outcome: rows for a table

Where the held-out tests are: `workbench.tasks.catalog` loads them from the task's data file (the easy set and the
DeepCoder fixture in workbench/data/, a user's JSONL) into the grader's memory, and `workbench.verify`
gives the solution each test's arguments (or stdin) only, never the expected value. So a solution that
wants the answers has to open that file. Under bubblewrap it is not mounted; without it, as root, the
solution runs as a fresh uid that the file's 0700 folder keeps out (`paths.private_paths`). Where either
holds, the hostile solution's read fails and the test says why; where the file is readable, its answers
pass the tests, which `leaked` reports.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.tasks import Task, EASY_PATH, FIXTURE_PATH
from workbench.verify.reward import VerifyResult, verify

__all__ = ["answer_key", "cannot_show", "hostile", "leaked", "tests_file", "grade_source", "verify_rows", "KINDS"]

KINDS = ("function_call", "stdin_stdout")  # tests whose expected values are plain data: an answer key exists


def tests_file(task: Task) -> Path | None:
    """The JSONL file on this machine the task's held-out tests are loaded from (None: not from one)."""
    if task.id.startswith("easy/"):
        return EASY_PATH
    if task.id.startswith("deepcoder-fixture/"):
        return FIXTURE_PATH
    if task.id.startswith("jsonl:") and "#" in task.id:
        return Path(task.id[len("jsonl:") :].rsplit("#", 1)[0])
    return None


def cannot_show(task: Task) -> str | None:
    """Why the examples cannot be built for `task` (None when they can): partial credit needs two tests or
    more with plain expected values, and the hostile solution's read needs the file they come from."""
    if task.test_kind not in KINDS:
        return f"{task.id} is graded by {task.test_kind} tests; these examples need {' or '.join(KINDS)} tests"
    if len(task.held_out_tests) < 2:
        return f"{task.id} has {len(task.held_out_tests)} held-out test: partial credit needs two or more"
    if tests_file(task) is None:
        return f"{task.id} is not loaded from a JSONL file here (easy/N, deepcoder-fixture/N, jsonl:PATH#N are)"
    return None


def _key(test_input: object) -> str:
    return json.dumps(test_input)


def answer_key(task: Task, right: Callable[[int], bool] = lambda i: True) -> str:
    """solution.py that returns the expected value of every held-out test `i` with ``right(i)`` (looked up by
    its arguments, or its stdin) and nothing for the others: reward = the fraction kept."""
    answers = {_key(t["input"]): t["output"] for i, t in enumerate(task.held_out_tests) if right(i)}
    table = f"import json\nimport sys\n\nANSWERS = json.loads({json.dumps(json.dumps(answers))})\n"
    if task.test_kind == "stdin_stdout":
        return table + "sys.stdout.write(str(ANSWERS.get(json.dumps(sys.stdin.read()), '')))\n"
    return table + f"\n\ndef {task.entry_point}(*args):\n    return ANSWERS.get(json.dumps(list(args)))\n"


def hostile(task: Task) -> str:
    """solution.py that attacks the grader, one attack per test (the tests of a verification share one
    copy of the workspace, so a file there counts them): a fork bomb, an endless loop, a gigabyte of
    output, then, from the fourth test on, it reads `tests_file` and answers from it."""
    path = tests_file(task)
    return f"""import json, os, sys
TESTS = {str(path)!r}   # where the held-out tests are loaded from on the grader's machine
FN, KIND = {task.entry_point!r}, {task.test_kind!r}


def turn():  # which test of this verification this is
    try:
        with open(".turns") as f:
            n = int(f.read())
    except (OSError, ValueError):
        n = 0
    try:
        with open(".turns", "w") as f:
            f.write(str(n + 1))
    except OSError:
        return 3  # cannot count: go straight for the tests
    return n


def answers():  # the held-out tests, keyed as the grader asks them
    table = {{}}
    with open(TESTS, encoding="utf-8") as f:   # raises where the grader keeps the file from us
        for line in f:
            tests = json.loads(line).get("tests") if line.strip() else []
            for t in json.loads(tests) if isinstance(tests, str) else tests or []:
                if KIND == "stdin_stdout" or t.get("fn_name") == FN:
                    table[json.dumps(t["input"])] = t["output"]
    return table


n = turn()
if n == 0:
    while True:
        os.fork()                  # fork bomb
if n == 1:
    while True:
        pass                       # endless loop
if n == 2:
    sys.stdout.write("x" * 10**9)  # a gigabyte of output
ANSWERS = answers()


def {task.entry_point or "main"}(*args):
    return ANSWERS[json.dumps(list(args))]


if KIND == "stdin_stdout":
    sys.stdout.write(str(ANSWERS[json.dumps(sys.stdin.read())]))
"""


def leaked(result: VerifyResult) -> list[int]:
    """The tests a `hostile` solution passed: it computes nothing, so it passes only with answers it read."""
    return [t.index for t in result.tests if t.outcome == "passed"]


def grade_source(task: Task, source: str) -> VerifyResult:
    """`source` graded as a workspace's solution.py on `task`'s held-out tests (the workspace is removed after)."""
    with tempfile.TemporaryDirectory(prefix="wb-example-") as ws:
        (Path(ws) / "solution.py").write_text(source)
        return verify(task, Path(ws))


def verify_rows(result: VerifyResult, label: str) -> list[dict[str, Any]]:
    """A verification as table rows: the solution's reward and counts, then each test's outcome and reason."""
    head = {"solution": label, "reward": round(result.reward, 3), "passed": result.passed, "total": result.total}
    return [head] + [{"solution": "", "test": t.index, "outcome": t.outcome, "reason": t.reason} for t in result.tests]

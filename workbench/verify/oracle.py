"""Harbor's oracle check: a task's own ``solution/solve.sh`` run on its starting files must score 1.0, and the
untouched start should score 0 (a task its start already passes teaches nothing).

Apart from `workbench.verify.harbor` (grading a Harbor task) because it grades through `workbench.verify.reward`,
which grades through harbor: kept in one module they made a circle.

    oracle_check(task)                    # {"oracle": 1.0, "start": 0.0, "solve": "ok", ...}
    reports, ok = check_tasks("repo-tasks", sandbox="bwrap")        # ``workbench harbor check``
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from workbench.sandbox import CopyLimits, copy_tree
from workbench.tasks import Limits, Task
from workbench.verify.child import Child, Failed
from workbench.verify.harbor import SOLUTION_AT, _SOLVE_TIMEOUT_S, _fill, jail_options
from workbench.verify.jail import Jail
from workbench.verify.jail_host import resolve
from workbench.verify.reward import verify

__all__ = ["oracle_check", "run_solution", "check_tasks"]


def run_solution(task: Task, dest: Path, *, sandbox: str = "auto") -> tuple[str, str]:
    """Harbor's oracle: the task's starting files at /app, ``bash /solution/solve.sh`` in the jail (the
    solution read-only at /solution, no tests), the result copied to the new folder ``dest``. Returns
    (``ok`` | ``timeout`` | ``crash`` | ``no_solution``, reason)."""
    held = task.held_out_tests[0]
    if "solve.sh" not in held.get("solution", {}):
        return "no_solution", f"task {task.id} has no solution/solve.sh"
    host, bwrap = resolve(sandbox)
    timeout = task.agent_timeout_s or _SOLVE_TIMEOUT_S
    limits = Limits(time_s=timeout, deadline_s=timeout + 60, memory_mb=task.limits.memory_mb)
    with tempfile.TemporaryDirectory(prefix="wb-harbor-start-") as tmp:
        start = Path(tmp) / "start"
        _write_files(start, task.files)
        with Jail(limits, host, bwrap=bwrap, **jail_options(task, bwrap, solution=True)) as box:
            box.copy_in(start)
            _fill(box, SOLUTION_AT, held["solution"], held.get("solution_executable", []))
            child = Child(box, ["bash", f"{SOLUTION_AT}/solve.sh"], stdin=subprocess.DEVNULL)
            try:
                child.finish(time.monotonic() + timeout)
                status, reason = ("ok", "") if child.proc.returncode == 0 else ("crash", child.crash_reason())
            except Failed as failed:
                status, reason = failed.outcome, failed.reason
            finally:
                child.close()
            copy_tree(
                box.ws,
                dest,
                CopyLimits(max_bytes=task.limits.workspace_mb << 20, max_entries=task.limits.workspace_entries),
            )
    return status, reason


def oracle_check(task: Task, *, sandbox: str = "auto") -> dict[str, Any]:
    """The oracle's reward (solve.sh, then grading; must be 1.0) and the untouched start's (should be 0)."""
    with tempfile.TemporaryDirectory(prefix="wb-harbor-oracle-") as tmp:
        start = Path(tmp) / "start"
        _write_files(start, task.files)
        begun = verify(task, start, sandbox=sandbox)
        solved = Path(tmp) / "solved"
        status, reason = run_solution(task, solved, sandbox=sandbox)
        graded = verify(task, solved, sandbox=sandbox) if solved.exists() else None
    return {
        "task_id": task.id,
        "oracle": graded.reward if graded else None,
        "start": begun.reward,
        "solve": status,
        "solve_reason": reason,
        "oracle_reason": graded.tests[0].reason if graded else reason,
        "start_reason": begun.tests[0].reason,
    }


def _write_files(root: Path, files: dict[str, str]) -> None:
    root.mkdir(parents=True)
    for rel, text in files.items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ValueError(f"task file {rel!r} escapes the workspace")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def check_tasks(spec: str, *, sandbox: str = "auto") -> tuple[list[dict[str, Any]], bool]:
    """`oracle_check` of every task of `spec` (a Harbor task folder, a folder of them, ``harbor:PATH`` or
    ``repo-tasks``); ok when every oracle scored 1.0 and every start 0."""
    from workbench.tasks import load_spec, load_specs

    spec = spec if spec.startswith(("repo-tasks", "harbor:")) else f"harbor:{spec}"
    reports = [
        oracle_check(task, sandbox=sandbox)
        for task in (load_specs(spec) if not spec.startswith("repo-tasks/") else [load_spec(spec)])
    ]
    return reports, all(r["oracle"] == 1.0 and r["start"] == 0.0 for r in reports)

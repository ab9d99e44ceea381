"""Grading a Harbor task: its ``tests/test.sh`` in the grading jail, the reward file it writes read back.

The jail is the one every verification uses (fresh uid, no capability, limits, no network, a fresh
bounded copy of the workspace), with Harbor's paths: the copy at ``/app`` (the working directory),
the task's ``tests/`` read-only at ``/tests``, a writable ``/logs/verifier``, and ``python``,
``python3`` (and ``pytest``) on PATH as the grading interpreter (under bwrap: the workbench's venv,
which has pytest). ``bash /tests/test.sh`` runs with the task's ``verifier.env``; its exit code is
ignored, as Harbor ignores it. Then, as Harbor reads them: ``reward.json`` if present (an object;
``reward`` a number, the other numeric keys kept as metrics, the rest dropped; no ``reward`` key falls
back to ``reward.txt``), else ``reward.txt`` (one number).

Outcomes: ``passed`` (reward 1), ``wrong`` (a reward below 1: the reward is kept as the score),
``timeout`` (test.sh past ``verifier.timeout_sec``), ``crash`` (past the output cap), ``error`` (no
reward file, an empty or unreadable one, a reward that is not a finite number in [0, 1]: refused, 0).
Every ``error`` and ``timeout`` scores 0 and counts as graded: the workspace is the agent's doing.

Plain mode (``sandbox="none"``) is refused (RuntimeError): without bubblewrap the copy cannot be shown
at /app nor the tests at /tests, and every Harbor test.sh needs both.

Limit of Harbor's contract, kept here: test.sh runs the agent's code as the same uid that may write
/logs/verifier, so a workspace that test.sh imports in-process could write its own reward. The tests
are still out of the agent's reach while it works (never in its sandbox), the copy is fresh, and
every process of that uid is killed before the reward is read.

    graded = grade_harbor(jail, task, task.held_out_tests[0], deadline)   # via grading.grade

The oracle check (solve.sh on the start must score 1.0) is `workbench.verify.oracle`.
"""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from workbench.tasks import Task
from workbench.verify.child import Child, Failed, clip
from workbench.verify.graded import Graded
from workbench.verify.jail import Jail

__all__ = ["BIN_AT", "LOGS_AT", "SOLUTION_AT", "TESTS_AT", "grade_harbor", "jail_options"]

TESTS_AT, LOGS_AT, SOLUTION_AT, BIN_AT, APP = "/tests", "/logs/verifier", "/solution", "/run/workbench/bin", "/app"
_REWARD_FILE_BYTES = 65536  # a reward file is a number or a small JSON object; more is refused, never read whole
_SOLVE_TIMEOUT_S = 600.0  # solve.sh's wall clock when the task gives no agent.timeout_sec (Harbor's default)


def jail_options(task: Task, bwrap: bool, *, solution: bool = False) -> dict[str, Any]:
    """`Jail` keyword arguments for grading ``task`` (or, ``solution=True``, running its solve.sh)."""
    if not bwrap:
        raise RuntimeError(
            f"task {task.id}: Harbor grading needs bubblewrap (the workspace at /app, the tests at "
            "/tests); plain mode (sandbox='none') cannot remap paths"
        )
    held = task.held_out_tests[0]
    extra_ro = {BIN_AT: "bin", **({SOLUTION_AT: "solution"} if solution else {TESTS_AT: "tests"})}
    env = held.get("solution_env" if solution else "env") or {}
    return {
        "workspace_at": APP,
        "extra_ro": extra_ro,
        "extra_rw": {} if solution else {LOGS_AT: "logs"},
        "extra_env": {**env, "PATH": f"{BIN_AT}:/usr/local/bin:/usr/bin:/bin"},
    }


def grade_harbor(box: Jail, task: Task, test: dict, deadline: float) -> Graded:
    """Run ``bash /tests/test.sh`` in ``box`` (made with `jail_options`) and read the reward it wrote."""
    _fill(box, TESTS_AT, test["tests"], test.get("executable", []))
    logs = box.extra_rw[LOGS_AT]
    child = Child(box, ["bash", f"{TESTS_AT}/test.sh"], stdin=subprocess.DEVNULL)
    try:
        child.finish(deadline)
    except Failed as failed:
        return Graded(failed.outcome, f"tests/test.sh: {failed.reason}")
    finally:
        child.close()  # every process of the test uid is gone before the reward is read
    tail = _tail(child.out + child.err)
    try:
        reward, metrics = _read_reward(Path(logs))
    except _NoReward as exc:
        return Graded("error", clip(f"{exc} (test.sh exit code {child.proc.returncode}; output: {tail})", 400), 0.0)
    if reward == 1.0:
        return Graded("passed", "", 1.0, metrics)
    return Graded("wrong", f"reward {reward:g}" + (f"; output: {tail}" if tail else ""), reward, metrics)


class _NoReward(Exception):
    """test.sh left no usable reward; the message says what was wrong."""


def _read_reward(logs: Path) -> tuple[float, dict[str, float]]:
    text_json, text_txt = _read_small(logs / "reward.json"), _read_small(logs / "reward.txt")
    metrics: dict[str, float] = {}
    reward: Any = None
    if text_json is not None:
        try:
            parsed = json.loads(text_json)
        except (ValueError, RecursionError):
            raise _NoReward("/logs/verifier/reward.json is not JSON") from None
        if not isinstance(parsed, dict):
            raise _NoReward("/logs/verifier/reward.json is not a JSON object")
        metrics = {
            k: float(v)
            for k, v in parsed.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and k != "reward"
        }
        reward = parsed.get("reward")
        if reward is None and text_txt is None:
            raise _NoReward("/logs/verifier/reward.json has no 'reward' (and there is no reward.txt)")
    if reward is None:
        if text_txt is None:
            raise _NoReward("tests/test.sh wrote neither /logs/verifier/reward.txt nor reward.json")
        if not text_txt.strip():
            raise _NoReward("/logs/verifier/reward.txt is empty")
        try:
            reward = float(text_txt.strip())
        except ValueError:
            raise _NoReward(f"/logs/verifier/reward.txt is not a number: {clip(text_txt.strip(), 40)!r}") from None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise _NoReward(f"reward {clip(repr(reward), 40)} is not a finite number: refused")
    if not 0.0 <= reward <= 1.0:
        raise _NoReward(f"reward {reward:g} is outside [0, 1]: refused")
    return float(reward), metrics


def _read_small(path: Path) -> str | None:
    """A reward file written by the test uid: not followed if a link, refused past 64 KiB."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _NoReward(f"/logs/verifier/{path.name} cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _REWARD_FILE_BYTES:
            raise _NoReward(f"/logs/verifier/{path.name} is not a small regular file")
        return f.read(_REWARD_FILE_BYTES).decode("utf-8", errors="replace")


def _tail(output: bytes | bytearray) -> str:
    lines = [ln.strip() for ln in output.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    return clip(" | ".join(lines[-3:]), 200)


def _fill(box: Jail, inside: str, files: dict[str, str], executable: list[str]) -> None:
    """Write a held-out folder (ours, read-only to the test uid) and the bin folder of `jail_options`."""
    root = Path(box.extra_ro[inside])
    for rel, text in files.items():
        path = root / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ValueError(f"held-out file {rel!r} escapes its folder")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        path.write_text(text, encoding="utf-8")
        path.chmod(0o755 if rel in executable else 0o644)
    bin_dir = Path(box.extra_ro[BIN_AT])
    tools = {"python": box.python, "python3": box.python}
    pytest = Path(sys.executable).with_name("pytest")  # the venv's, whose #! names the venv's python
    if box.python == sys.executable and pytest.exists():
        tools["pytest"] = str(pytest)
    for name, target in tools.items():
        if not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(target)

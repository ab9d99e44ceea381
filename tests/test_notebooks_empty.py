"""A notebook whose stage has nothing to show says why in plain words, in the rollouts' own words where
there are rollouts, and stops with `NotebookError` (so `workbench notebooks run` exits non-zero naming the
notebook, the cell and the reason): never an internal error (StopIteration, an unbound name).

Each notebook is executed headless (papermill, as the runner does) with parameters that leave its stage
empty. 03 and 04 need no engine; 01, 02 and 05 share the session's engine through one capture proxy."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from workbench.paths import project_root
from workbench.rollout import why_missing
from workbench.tasks import Limits, load_task
from workbench.verify import verify, answer_key, cannot_show, hostile, leaked

NB_DIR = project_root() / "notebooks"

# What a newcomer's rollouts recorded when the sandbox could not reach the harness: a rollout
# folder with its summary.json and nothing else.
CRASHED = {
    "rollout_id": "attempt-0",
    "task_id": "easy/0",
    "status": "crashed",
    "reason": "bwrap: Can't find source path /x/tools/node_modules: Permission denied",
    "reward": None,
    "calls": 0,
    "calls_by_status": {},
    "agent_turns": 0,
}


def _execute(
    name: str, params: dict[str, Any], tmp_path: Path, stack: dict[str, str] | None = None
) -> tuple[str | None, str, str]:
    """Run notebook `name` with `params` (and the runner's `stack` in its run folder, when given): (the error's name
    or None, its message, everything it printed)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    from workbench.cli.notebooks import write_stack

    if stack is not None:
        (tmp_path / "run").mkdir(parents=True, exist_ok=True)
        write_stack(tmp_path / "run", stack)
    out = tmp_path / f"{name}.ipynb"
    error = None, ""
    try:
        papermill.execute_notebook(
            str(NB_DIR / f"{name}.ipynb"),
            str(out),
            parameters={"run_dir": str(tmp_path / "run"), "interactive": False, **params},
            cwd=str(NB_DIR),
            kernel_name="python3",
            progress_bar=False,
        )
    except PapermillExecutionError as exc:
        error = exc.ename, exc.evalue
    cells = json.loads(out.read_text())["cells"]
    printed = "".join(
        "".join(o.get("text", ""))
        for c in cells
        if c["cell_type"] == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    )
    return error[0], error[1], printed


def _failed_rollout(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(CRASHED))
    return folder


def test_03_on_a_folder_without_a_trace_says_what_the_rollout_recorded(tmp_path):
    folder = _failed_rollout(tmp_path / "rollouts" / "attempt-0")
    ename, message, printed = _execute("03_turns", {"rollout_dir": str(folder)}, tmp_path)
    assert ename == "NotebookError"
    assert "holds no trace.json" in message and "no agent call was answered in 1 rollout" in message
    assert "attempt-0: crashed: bwrap: Can't find source path" in message
    assert message.splitlines()[0] in printed  # said in the cell's output too, not only in the traceback


def test_a_folder_without_a_trace_is_explained_by_what_it_holds(tmp_path):
    """`why_missing` without a kernel: nothing there, an empty folder, rollouts one level down."""
    assert why_missing(tmp_path / "nothing") == f"{tmp_path / 'nothing'} is not a folder"
    (tmp_path / "empty").mkdir()
    assert why_missing(tmp_path / "empty").endswith("holds no trace.json: there is no rollout folder (no summary.json)")
    answered = _failed_rollout(tmp_path / "rollouts" / "r1")
    (answered / "summary.json").write_text(json.dumps({**CRASHED, "status": "ok", "agent_turns": 2}))
    assert "the rollout folders below it do" in why_missing(tmp_path / "rollouts")


def test_04_refuses_a_rollout_without_workspace_before_grading_anything(tmp_path):
    folder = _failed_rollout(tmp_path / "r0")
    ename, message, printed = _execute("04_reward", {"rollout_dir": str(folder)}, tmp_path)
    assert ename == "NotebookError"
    assert "holds no workspace/" in message and "crashed: bwrap: Can't find source path" in message
    assert "grader alive" not in printed  # refused in the config cell, before three gradings


@pytest.fixture(scope="module")
def shared(engine):
    """What `workbench notebooks run` writes into the run folder (stack.json): one engine and one capture proxy for
    every notebook."""
    from workbench.engine import local_stack

    with local_stack(engine=engine) as (eng, proxy, _):
        yield {
            "model": "tiny",
            "engine_url": eng.url,
            "served_name": eng.served_name,
            "proxy_url": proxy.url,
            "admin_key": proxy.admin_key,
            "engine_key": eng.api_key or "",
        }


@pytest.mark.engine
@pytest.mark.opencode
def test_02_when_no_agent_call_is_answered_shows_each_attempts_reason(shared, tmp_path):
    """A rollout stopped before opencode can even start (10 ms) answers no call, on any machine: each attempt is
    `stalled` (the infrastructure's, unscored), never the agent's timeout."""
    params = {"task": "easy/0", "timeout_s": 0.01, "attempts": 2}
    ename, message, printed = _execute("02_capture", params, tmp_path, shared)
    assert ename == "NotebookError"
    assert message.startswith("no agent call was answered in 2 rollout(s):")
    assert "attempt-0: stalled: " in message and "attempt-1: stalled: " in message
    assert message.splitlines()[0] in printed


@pytest.mark.engine
@pytest.mark.opencode
@pytest.mark.slow
def test_05_when_no_rollout_is_answered_says_why_and_shows_no_trl_noise(shared, tmp_path):
    params = {"tasks": "easy-train[:1]", "steps": 1, "group_size": 2, "rollout_timeout_s": 0.01}
    ename, message, printed = _execute("05_grpo", params, tmp_path, shared)
    assert ename == "NotebookError"
    assert message.startswith("no agent call was answered in 2 rollout(s):")
    assert "step-0001/00-00_easy-0: stalled: " in message and "step-0001/00-01_easy-0: stalled: " in message
    # the step ran on padding rows only (rewards None on purpose): TRL says nothing about them, nor
    # transformers about the checkpointing name we pass
    assert "All reward functions returned None" not in printed and "FutureWarning" not in printed


@pytest.mark.engine
def test_01_without_latency_samples_says_so_and_leaves_no_sandbox(shared, tmp_path):
    ename, message, printed = _execute("01_sandbox", {"task": "easy/0", "latency_samples": 0}, tmp_path, shared)
    assert ename is None, message
    assert "sandbox start not measured: latency_samples=0" in printed
    assert "sandbox folder removed: True" in printed


def test_02_with_no_attempt_says_so(tmp_path):
    ename, message, _ = _execute("02_capture", {"attempts": 0}, tmp_path)
    assert ename == "ValueError" and "attempts=0: at least one rollout has to be tried" in message


# -- notebook 04's examples, without a notebook ------------------------------------------------------------


def test_answer_key_follows_the_task_and_gives_partial_credit(tmp_path):
    """04's `task` parameter is honoured: the answer key is built from whichever task it names."""
    for spec in ("easy/3", "easy/0", "deepcoder-fixture/0"):  # square(n), add(a, b), a stdin task
        task = load_task(spec)
        assert cannot_show(task) is None
        ws = tmp_path / spec.replace("/", "-")
        ws.mkdir()
        (ws / "solution.py").write_text(answer_key(task))
        assert verify(task, ws).reward == 1.0, spec
        (ws / "solution.py").write_text(answer_key(task, right=lambda i: i == 0))
        assert verify(task, ws).passed == 1, spec
    assert "humaneval" in (cannot_show(load_task("humaneval/0")) or "")


@pytest.mark.skipif(os.geteuid() != 0, reason="not root: plain grading runs as this user, who may read the file")
def test_hostile_solution_reads_the_tests_where_they_are_exposed_and_not_where_they_are_hidden():
    """The probe 04 runs can fail: a task file other users may read is read in plain mode (the fresh uid
    may read it), and its answers pass; the task's file under the project's 0700 data folder is not."""
    limits = Limits(time_s=1.0)  # the fork bomb and the loop end sooner; what is read is the same
    open_dir = Path(tempfile.mkdtemp(prefix="wb-open-tasks-"))  # /tmp: every user may enter it
    try:
        open_dir.chmod(0o755)
        exposed = open_dir / "tasks.jsonl"
        exposed.write_text((project_root() / "workbench" / "data" / "easy_tasks.jsonl").read_text().splitlines()[3])
        exposed.chmod(0o644)
        for task, leaks in (
            (load_task(f"jsonl:{exposed}#0", limits=limits), True),
            (load_task("easy/3", limits=limits), False),
        ):
            with tempfile.TemporaryDirectory() as ws:
                (Path(ws) / "solution.py").write_text(hostile(task))
                result = verify(task, Path(ws), sandbox="none")
            assert bool(leaked(result)) is leaks, [(t.outcome, t.reason) for t in result.tests]
            if not leaks:
                assert any("PermissionError" in t.reason for t in result.tests), [t.reason for t in result.tests]
    finally:
        for p in open_dir.iterdir():
            p.unlink()
        open_dir.rmdir()

"""Rollouts that never raise for their own failures: one (`run_rollout`), or a group in parallel (`run_rollouts`).

A rollout's failure (the sandbox could not be made, the agent crashed, the grader broke) is recorded
in its folder and its `RolloutResult`, never raised; only Ctrl-C is (after the agent is stopped and
the artefact written). The session itself is `workbench.rollout.session.HarnessSession`; the config,
statuses and result types are `workbench.rollout.types`. In a group the first rollout of each task
leads: the others wait until its first agent call is at the engine (`RolloutConfig.lead_s`), so
they find their shared prompt in the engine's prefix cache.

    from workbench.rollout import RolloutConfig
    client = proxy.client()                  # or workbench.engine.stack.local_stack(model) -> (engine, proxy, client)
    result = run_rollout(load_task("humaneval/0"), client, RolloutConfig(), out_dir=Path("runs/x/r0"))
    results = run_rollouts([(task, out) for ...], client, config, parallel=2)
    why = nothing_answered(read_summaries(Path("runs/x")))  # None, or why no agent call was answered
    why_missing(Path("runs/x/r0"), "trace.json")            # what a folder without one holds instead
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from workbench.capture import ProxyClient, ProxyError
from workbench.rollout.cluster import Cluster
from workbench.rollout.session import HarnessSession
from workbench.runs import atomic_json
from workbench.rollout.types import RolloutConfig, RolloutResult
from workbench.sandbox import SandboxError
from workbench.tasks import Task

__all__ = ["run_rollout", "run_rollouts", "read_summaries", "nothing_answered", "why_missing"]


def run_rollout(
    task: Task,
    client: ProxyClient,
    config: RolloutConfig,
    out_dir: Path,
    *,
    rollout_id: str | None = None,
    stop: threading.Event | None = None,
    primed: threading.Event | None = None,
) -> RolloutResult:
    """One rollout, start to artefact. Never raises for the rollout's own failures: they are recorded.

    KeyboardInterrupt (or `stop` set from another thread) ends it as ``interrupted``: the agent is
    killed, the artefact written with the trace so far, the sandbox removed, and it is re-raised.
    """
    if stop is not None and stop.is_set():  # interrupted before it started: no folder at all
        raise KeyboardInterrupt
    out_dir.mkdir(parents=True, exist_ok=True)
    out_dir.chmod(0o700)
    rid = rollout_id or out_dir.name
    try:
        session = HarnessSession(task, client, config, out_dir=out_dir, episode_id=rid)
    except (SandboxError, ProxyError, OSError) as exc:
        failed: dict[str, Any] = {
            "rollout_id": rid,
            "task_id": task.id,
            "status": "setup_failed",
            "reason": str(exc),
            "reward": None,
            "calls": 0,
        }
        atomic_json(out_dir / "summary.json", failed)
        return RolloutResult(rid, task.id, "setup_failed", str(exc), None, out_dir, failed)
    try:
        with contextlib.suppress(TimeoutError):
            session.wait_for_completion(stop=stop, primed=primed)
        session.calls()
        session.check_capture()
        try:
            session.grade()
        except Exception as exc:  # noqa: BLE001 - ours, not the agent's (verify grades any workspace):
            # unscored and said why; the trace and the rest of the artefact are still written
            session.status, session.reason = "verify_error", f"verification failed: {type(exc).__name__}: {exc}"[:500]
        summary = session.write_artefact(out_dir)
    except KeyboardInterrupt:
        if session.status == "running":
            session._end("interrupted", "interrupted by the user")
        elif session.status != "interrupted" and session.verify_result is None:  # grading was cut short
            session.status, session.reason = (
                "interrupted",
                f"interrupted before verification (the agent had ended {session.status}: {session.reason})",
            )
        session.write_artefact(out_dir)
        raise
    finally:
        session.close()
    return RolloutResult(rid, task.id, summary["status"], summary["reason"], summary["reward"], out_dir, summary)


def run_rollouts(
    jobs: list[tuple[Task, Path]],
    client: ProxyClient,
    config: RolloutConfig,
    *,
    parallel: int = 2,
    progress: bool = True,
    cluster: Cluster | None = None,
) -> list[RolloutResult]:
    """Run rollouts `parallel` at a time; every job gets a result (failures are recorded, not dropped).
    With `cluster` (`workbench.rollout.fan_out`) they run on its sandbox nodes instead, as many at once as they
    have slots, sampling the policy `client`'s proxy serves now, their folders brought back to the jobs' paths.

    On Ctrl-C (a notebook's interrupt), rollouts that finished keep their folders, the running ones
    are ended as ``interrupted`` (summary.json says so, the trace so far is kept), queued ones never
    start (no folder), no agent is left running, and KeyboardInterrupt is re-raised.
    """
    from tqdm.auto import tqdm

    if cluster is not None:
        return cluster.run(jobs, config, model=client.model)
    results: list[RolloutResult | None] = [None] * len(jobs)
    bar = tqdm(total=len(jobs), desc="rollouts", disable=not progress)
    lock = threading.Lock()
    stop = threading.Event()

    # The first job of each task leads (RolloutConfig.lead_s): the pool takes jobs in order, so a leader
    # always starts before its followers, which wait in their worker for its first answered call.
    leaders: dict[str, int] = {}
    for i, (task, _) in enumerate(jobs):
        leaders.setdefault(task.id, i)
    primed = {task_id: threading.Event() for task_id in leaders}

    def one(i: int) -> None:
        task, out = jobs[i]
        lead = leaders[task.id] == i
        if not lead and config.lead_s > 0:
            deadline = time.monotonic() + config.lead_s
            while not primed[task.id].wait(0.25) and time.monotonic() < deadline and not stop.is_set():
                pass
        try:
            result = results[i] = run_rollout(
                task, client, config, out, stop=stop, primed=primed[task.id] if lead and config.lead_s > 0 else None
            )
            if result.status == "replica_lost" and not stop.is_set():
                result = results[i] = _again(task, client, config, out, stop, result)
        except Exception as exc:  # recorded: a rollout failing must not sink the group
            result = results[i] = RolloutResult(
                out.name, task.id, "crashed", f"{type(exc).__name__}: {exc}", None, out, {}
            )
            atomic_json(
                out / "summary.json",
                {
                    "rollout_id": out.name,
                    "task_id": task.id,
                    "status": "crashed",
                    "reason": result.reason,
                    "reward": None,
                },
            )
            (out / "crash.txt").write_text(traceback.format_exc())  # ours, not the agent's: where it broke
        finally:
            if lead:
                primed[task.id].set()  # a leader that never got going must not hold its followers
        with lock:
            bar.update(1)
            bar.set_postfix_str(f"last={result.status}")

    pool = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="rollout")
    try:
        list(pool.map(one, range(len(jobs))))
    except BaseException:
        # Only this thread sees KeyboardInterrupt; the workers would run every queued job to the end
        # (the pool's exit waits for them). Tell them to stop, drop the queue, wait for the cleanup.
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
        bar.close()
    return [r for r in results if r is not None]


def _again(
    task: Task, client: ProxyClient, config: RolloutConfig, out: Path, stop: threading.Event, lost: RolloutResult
) -> RolloutResult:
    """Run a ``replica_lost`` rollout once more (its engine died under it; the proxy has moved on to another). The
    lost try's folder is kept inside the new one (``lost-try/``: not a rollout of its own to anything that reads
    rollout folders), and the new summary.json names it."""
    aside = out.with_name(f".{out.name}.lost-try")
    os.replace(out, aside)
    try:
        result = run_rollout(task, client, config, out, stop=stop)
    finally:  # interrupted too: the lost try goes inside, never left beside it as a hidden folder
        out.mkdir(parents=True, exist_ok=True)
        os.replace(aside, out / "lost-try")
    summary = json.loads((out / "summary.json").read_text())
    atomic_json(out / "summary.json", {**summary, "lost_tries": [f"lost-try: replica_lost: {lost.reason}"]})
    return result


def read_summaries(folder: Path) -> list[dict[str, Any]]:
    """Every rollout's summary.json at or below `folder`, in path order, its ``rollout_id`` the folder's path
    below `folder`. A rollout folder is not searched further (its workspace is the agent's: a summary.json
    there is not ours). A summary that cannot be read counts as a rollout that says so."""
    folder = Path(folder)
    out = []
    for top, dirs, files in os.walk(folder):
        dirs.sort()
        if "summary.json" not in files:
            continue
        dirs.clear()
        path = Path(top) / "summary.json"
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            summary = {"status": "unreadable", "reason": f"{path}: {exc}"}
        where = path.parent.relative_to(folder)  # step-0001/00-00_easy-0 in a training run: which step, too
        out.append({**summary, "rollout_id": str(where) if where.parts else folder.name})
    return out


def nothing_answered(summaries: Sequence[dict[str, Any]]) -> str | None:
    """None when at least one of the rollouts had an agent call answered; otherwise what a reader needs to see
    why: one line per rollout with how it ended and the reason it recorded (summary.json's own words)."""
    if any(s.get("agent_turns") for s in summaries):
        return None
    if not summaries:
        return "there is no rollout folder (no summary.json)"
    lines = []
    for s in summaries:
        by_status = s.get("calls_by_status") or {}
        calls = ", ".join(f"{n} {status}" for status, n in sorted(by_status.items())) or "none"
        reason = s.get("reason") or "; ".join(s.get("harness_errors") or []) or "no reason recorded"
        lines.append(f"  {s.get('rollout_id', '?')}: {s.get('status', 'no status')}: {reason} (model calls: {calls})")
    return f"no agent call was answered in {len(summaries)} rollout(s):\n" + "\n".join(lines)


def why_missing(folder: Path, what: str = "trace.json") -> str:
    """Why `folder` has no `what` (trace.json, workspace) to show: in its rollouts' own words where it holds any."""
    folder = Path(folder)
    if not folder.is_dir():
        return f"{folder} is not a folder"
    why = nothing_answered(read_summaries(folder))
    if why is None:
        return f"{folder} holds no {what} itself, the rollout folders below it do: name one of them"
    return f"{folder} holds no {what}: {why}"

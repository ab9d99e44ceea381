"""One task's rollouts tried until one writes solution.py (notebook 02: a small model's first try often does not).

tried = run_attempts(task, client, config, Path("runs/x/rollouts"), attempts=3)   # attempt-0, attempt-1, ...
tried.table()      # a row per attempt: its status, reward, calls, tool calls, whether solution.py was written
tried.why          # None, or why no agent call of any attempt was answered (each attempt's own reason)
tried.kept         # the writer, else the last attempt whose agent was answered (None when none was)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.capture import ProxyClient
from workbench.rollout.run import nothing_answered, run_rollout
from workbench.rollout.types import RolloutConfig, RolloutResult
from workbench.tasks import Task

__all__ = ["Attempts", "run_attempts"]


@dataclass(frozen=True)
class Attempts:
    """The attempts made, in order (the last one wrote solution.py, or none did)."""

    results: list[RolloutResult]

    def table(self) -> list[dict[str, Any]]:
        return [
            {
                "attempt": i,
                "status": r.status,
                "reward": r.reward,
                "calls": r.summary.get("calls_by_purpose", {}),
                "tool calls": r.summary.get("tool_calls", {}),
                "solution.py written": r.summary.get("solution_written"),
            }
            for i, r in enumerate(self.results)
        ]

    @property
    def why(self) -> str | None:
        return nothing_answered([r.summary for r in self.results])

    @property
    def kept(self) -> RolloutResult | None:
        answered = [r for r in self.results if r.summary.get("agent_turns")]
        return answered[-1] if answered else None


def run_attempts(task: Task, client: ProxyClient, config: RolloutConfig, out_dir: Path, *, attempts: int) -> Attempts:
    """Up to `attempts` rollouts of `task` into ``out_dir/attempt-N``, stopping at the first that writes solution.py.
    ValueError when `attempts` is below 1 (nothing would be tried)."""
    if attempts < 1:
        raise ValueError(f"attempts={attempts}: at least one rollout has to be tried")
    results: list[RolloutResult] = []
    for i in range(attempts):
        results.append(run_rollout(task, client, config, out_dir / f"attempt-{i}"))
        if results[-1].summary.get("solution_written"):
            break
    return Attempts(results)

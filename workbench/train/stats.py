"""One optimizer step's timings and counters, as the run's pieces report them.

`workbench.train.grpo.GRPORun` owns one `StepStats`; the rollout function, the policy sync objects
(`workbench.train.policy_sync`) and the trainer's metrics callback (`workbench.train.trl_trainer`) are each handed it
and write what they measured (``rollout_s``, ``sync_s``, ...). The callback turns a finished step into its
metrics.jsonl record. The policy the engine serves outlives the step (the next step's rollouts come from it).

    stats = StepStats()
    stats.begin()                          # TRL's on_step_begin: a new step, the served policy kept
    stats.update(rollout_s=61.2, sync_s=1.4)
    stats.record(step=3, logs={"loss": 0.1})   # {"step": 3, "loss": 0.1, "rollout_s": 61.2, ..., "step_s": ...}
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["StepStats"]


class StepStats:
    """The counters of the step in progress (a plain dict underneath), and the served policy's name."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._started: float | None = None
        self.policy: str | None = None  # the name the engine serves the trained policy under (set by a sync)

    def begin(self) -> None:
        """A new step: its counters start empty, its clock now."""
        self._values, self._started = {}, time.monotonic()

    def update(self, **values: Any) -> None:
        self._values.update(values)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def record(self, *, step: int, logs: dict[str, Any], **facts: Any) -> dict[str, Any]:
        """The finished step's metrics.jsonl record: TRL's `logs`, these counters, the run's `facts` (isolation,
        device), the step's wall time and its training part (what neither the rollouts nor the sync took)."""
        step_s = time.monotonic() - self._started if self._started is not None else 0.0
        train_s = step_s - self._values.get("rollout_s", 0.0) - self._values.get("sync_s", 0.0)
        trained = self._values.get("trained_tokens", 0)
        return {
            "step": step,
            **logs,
            **self._values,
            "policy": self.policy,
            **facts,
            "step_s": step_s,
            "train_s": train_s,
            "trained_tokens_per_s": trained / train_s if train_s > 0 else None,
        }

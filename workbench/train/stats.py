"""One optimizer step's timings and counters, as the run's pieces report them.

`workbench.train.grpo.GRPORun` owns one `StepStats`; the rollout function, the policy sync objects
(`workbench.train.policy_sync`) and the trainer's metrics callback (`workbench.train.trl_trainer`) are each handed it
and write what they measured (``rollout_s``, ``sync_s``, ...). The callback turns a finished step into its
metrics.jsonl record. The policy the engine serves outlives the step (the next step's rollouts come from it).

    stats = StepStats()
    stats.begin()                          # TRL's on_step_begin: a new step, the served policy kept
    stats.update(rollout_s=61.2, sync_s=1.4)
    stats.record(step=3, logs={"loss": 0.1})   # {"step": 3, "loss": 0.1, "rollout_s": 61.2, ..., "step_s": ...}

Trained as several processes (`workbench.train.trl_args.check_processes`), each holds its own groups' counters;
`merge_processes()` (every process calls it: a collective) makes them the step's: counts summed, rewards concatenated
in rank order, a phase's seconds the slowest process's. `phase_counters` reads what a live rollout phase cost
beyond sampling (the grading tail, the engine's prefix-cache hits).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.engine import Engine

__all__ = ["StepStats", "merge_values", "phase_counters"]

# counts over a process's rollouts and rows: the step's is their sum
ADDITIVE = frozenset(
    "rollouts rollouts_failed rollouts_no_trainable_turn rows forks rows_dropped_fork rows_dropped_budget"
    " rows_dropped_slots rows_trained trained_tokens stale_calls excluded_calls tool_calls solutions_written"
    " title_calls_clamped capture_ingest_failed rollouts_not_recorded rollouts_unused rollouts_requeued verify_s"
    " sampled_tokens row_tokens padded_tokens".split()
)
WALL_CLOCK = frozenset({"rollout_s", "fields_s", "sync_s"})  # each process's own clock: the step waits for the slowest


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

    def merge_processes(self, world: int) -> None:
        """Replace this process's counters by the step's over all `world` processes (torch.distributed's
        all_gather_object: every process must call it, at the same point of the step)."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, self._values)
        self._values = merge_values(gathered)

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


def merge_values(per_process: list[dict[str, Any]]) -> dict[str, Any]:
    """One step's counters from each process's (rank order): `ADDITIVE` counts summed, ``rewards`` and
    ``test_rewards`` concatenated, ``rollout_failures`` joined, `WALL_CLOCK` seconds the largest, the smallest
    ``effective_group_size``, the mean of ``effective_group_size_mean`` (every process holds as many groups),
    ``infra_failed_rate`` recomputed; anything else (the policy, off_policy, write_credit) is rank 0's."""
    first = per_process[0]
    out = dict(first)
    for key in first:
        got = [v[key] for v in per_process if key in v]
        if key in ADDITIVE:
            out[key] = sum(got)
        elif key in ("rewards", "test_rewards"):
            out[key] = [r for values in got for r in values]
        elif key == "rollout_failures":
            out[key] = {s: [x for d in got for x in d.get(s, [])] for s in dict.fromkeys(s for d in got for s in d)}
        elif key in WALL_CLOCK:
            out[key] = max(got)
        elif key == "effective_group_size":
            out[key] = min(got)
        elif key == "effective_group_size_mean":
            out[key] = sum(got) / len(got)
    if "infra_failed_rate" in first:
        out["infra_failed_rate"] = round(out["rollouts_failed"] / out["rollouts"], 4) if out.get("rollouts") else 0.0
    return out


def phase_counters(
    results: list[Any], cache_before: tuple[float, float] | None, engine: Engine | None
) -> dict[str, Any]:
    """What the rollout phase cost beyond sampling, for the step's metrics:

    - ``grade_tail_s``: seconds from the last agent's exit to the phase's end. Each rollout is graded in its own
      worker as soon as its agent stops, while the others still run; only this tail holds the step.
    - ``prefix_cache_hit_rate`` (with the token counts): the share of prompt tokens the engine found in its prefix
      cache. A group's rollouts share the harness's system prompt, tools and the task (~2.8k tokens for opencode
      with qwen-coder): near (G - 1) / G of the first calls' tokens when it is prefilled once."""
    out: dict[str, Any] = {}
    exits = [r.summary.get("agent_exited_at") for r in results if r.summary.get("agent_exited_at")]
    if exits:
        out["grade_tail_s"] = round(max(0.0, time.time() - max(exits)), 3)
    after = engine.prefix_cache_counters() if engine is not None and cache_before is not None else None
    if cache_before is not None and after is not None:
        queried, hit = after[0] - cache_before[0], after[1] - cache_before[1]
        out.update(
            prefix_cache_queried_tokens=int(queried),
            prefix_cache_hit_tokens=int(hit),
            prefix_cache_hit_rate=round(hit / queried, 4) if queried else None,
        )
    return out

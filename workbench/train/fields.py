"""One optimizer step's rollouts -> the rows GRPOTrainer trains and the step's counters.

Shared by the live path (rollouts run this step, `workbench.train.grpo.GRPORun.rollout_func`) and the replay path
(rollouts recorded earlier, `workbench.train.replay`): the same rewards (`FAILED_STATUSES` unscored), the same rows
(`workbench.train.rows` / `workbench.train.group_step.every_row_fields`), the same counters in metrics.jsonl.

    fields, stats = step_fields(cfg, tasks, results, reward_fn, train_turn_fn, tokenizer, policy="policy-x-step3")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from workbench.rollout import FAILED_STATUSES, RolloutOutcome, RolloutResult
from workbench.tasks import Task
from workbench.train.rows import longest_row_fields, rollout_rows
from workbench.turns import MaskPolicy, Tokenizer, token_id, Row, load_trace
from workbench.train.config import TrainConfig

__all__ = ["step_fields"]


def step_fields(
    cfg: TrainConfig,
    tasks: Sequence[Task],
    results: Sequence[RolloutResult],
    reward_fn: Callable[[RolloutOutcome], float | None],
    train_turn_fn: MaskPolicy,
    tokenizer: Tokenizer,
    *,
    policy: str | None,
) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """`results` holds `cfg.group_size` rollouts per task of `tasks`, in order. Returns TRL's fields (one row per
    slot) and the counters. `policy`: the adapter the rollouts should have sampled from (stale-call check)."""

    g = cfg.group_size
    if len(results) != g * len(tasks):
        raise ValueError(f"{len(results)} rollouts for {len(tasks)} tasks x group_size {g}")
    pad_id = token_id(tokenizer, "<|im_end|>")
    c = {
        "rollouts": len(results),
        "rollouts_failed": 0,
        "rollouts_no_trainable_turn": 0,
        "rows": 0,
        "forks": 0,
        "rows_dropped_fork": 0,
        "rows_dropped_budget": 0,
        "rows_dropped_slots": 0,
        "rows_trained": 0,
        "trained_tokens": 0,
        "stale_calls": 0,
        "excluded_calls": 0,
        "tool_calls": 0,
        "solutions_written": 0,
        "title_calls_clamped": 0,
        "capture_ingest_failed": 0,  # model calls answered but not recorded (their rollouts are capture_failed)
    }
    failures: dict[str, list[str]] = {}
    rewards: list[float | None] = []
    test_rewards: list[float | None] = []  # the plain hidden-test reward, whatever reward_fn trains on
    per_rollout: list[list[Row]] = []
    for i, result in enumerate(results):
        task = tasks[i // g]
        trace = result.out_dir / "trace.json" if result.out_dir is not None else None
        calls = load_trace(trace) if trace is not None and trace.exists() else []
        outcome = RolloutOutcome(task, result, calls)
        reward = reward_fn(outcome)
        test_rewards.append(outcome.verified_reward)
        if result.status in FAILED_STATUSES:
            c["rollouts_failed"] += 1
            failures.setdefault(result.status, []).append((result.reason or "")[:200])
        rows, counts = rollout_rows(calls, train_turn_fn, cfg.token_budget, tokenizer)
        for k, v in counts.items():
            c[k] += v
        # On-policy check: every agent call should have gone to the adapter synced this step.
        c["stale_calls"] += sum(
            1 for x in calls if x.get("purpose") == "agent" and x.get("model") and x.get("model") != policy
        )
        c["title_calls_clamped"] += sum(1 for x in calls if x.get("clamped_max_tokens") is not None)
        c["tool_calls"] += sum((result.summary.get("tool_calls") or {}).values())
        c["solutions_written"] += int(bool(result.summary.get("solution_written")))
        c["capture_ingest_failed"] += int(result.summary.get("capture_ingest_failed") or 0)
        if not any(r.n_trained for r in rows):
            c["rollouts_no_trainable_turn"] += 1
        per_rollout.append(rows)
        rewards.append(reward)
    fields_: dict[str, list[Any]]  # TRL's columns, one entry per row (ids, masks, logprobs, rewards)
    if cfg.every_row:
        fields_, dropped = _every_row_fields(per_rollout, rewards, g, cfg.slots, pad_id)
        c["rows_dropped_slots"] = dropped
    else:
        fields_, dropped = longest_row_fields(per_rollout, rewards, pad_id)
        c["rows_dropped_fork"] = dropped
    c["rows_trained"] = sum(1 for m in fields_["env_mask"] if any(m))
    c["trained_tokens"] = sum(sum(m) for m in fields_["env_mask"])
    lengths = [len(p) + len(q) for p, q in zip(fields_["prompt_ids"], fields_["completion_ids"])]
    c["row_tokens"] = sum(lengths)  # what the rows hold
    c["padded_tokens"] = len(lengths) * max(lengths)  # what TRL's own step forwards (one padded batch)
    groups = [rewards[i : i + g] for i in range(0, len(rewards), g)]
    scorable = [sum(r is not None for r in grp) for grp in groups]
    stats = dict(
        rollout_failures=failures,
        **c,
        infra_failed_rate=round(c["rollouts_failed"] / len(results), 4) if results else 0.0,  # unscored, never a 0
        effective_group_size=min(scorable) if scorable else 0,
        effective_group_size_mean=sum(scorable) / len(scorable) if scorable else 0.0,
        verify_s=sum(r.summary.get("timings", {}).get("verify_s", 0.0) for r in results),
        sampled_tokens=sum(r.summary.get("sampled_tokens", 0) for r in results),
        rewards=rewards,
        test_rewards=test_rewards,
    )
    return fields_, stats


def _every_row_fields(
    per_rollout: list[list[Row]], rewards: list[float | None], g: int, slots: int, pad_id: int
) -> tuple[dict[str, list[Any]], int]:
    """`workbench.train.group_step.every_row_fields` over the step's groups of `g` rollouts (it types its columns as
    ``list[object]``; they are the same TRL columns as `longest_row_fields`')."""
    from workbench.train._row_slots import every_row_fields

    return every_row_fields(
        [per_rollout[i : i + g] for i in range(0, len(per_rollout), g)],
        [rewards[i : i + g] for i in range(0, len(rewards), g)],
        slots,
        pad_id,
    )

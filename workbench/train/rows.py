"""From captured rollouts to the rows GRPOTrainer's `rollout_func` returns (TRL 1.16's contract).

A rollout's trace gives rows (`workbench.turns.derive.analyse`: turns chained wherever the next prompt extends
the previous prompt + output token for token; a fork starts a new row). TRL wants, per input prompt,
``prompt_ids``, ``completion_ids``, ``logprobs`` (the generator's, one per completion token) and
``env_mask`` (1 = a sampled token we train, 0 = context), plus our ``wb_reward``. Two ways to fill them:

- `longest_row_fields` (one row per rollout, the old path): a forked rollout gives only its row with the
  most trained tokens; the rest are counted as ``rows_dropped_fork``.
- `workbench.train.group_step.every_row_fields` (``TrainConfig.every_row``): every row of every rollout, in
  fixed per-group slots, each rollout's advantage on all its rows.

    rows, counts = rollout_rows(calls, has_tool_call, token_budget=16384, tokenizer=tok)
    fields = longest_row_fields([rows_a, rows_b], [1.0, 0.0], pad_id=eos)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workbench.turns import MaskPolicy, Tokenizer, analyse, Row

__all__ = ["rollout_rows", "trl_row", "longest_row_fields", "rows_for_trl"]


def rollout_rows(
    calls: list[dict[str, Any]], train_turn_fn: MaskPolicy, token_budget: int, tokenizer: Tokenizer | None = None
) -> tuple[list[Row], dict[str, int]]:
    """A rollout's rows that fit `token_budget`, and counters (rows, forks, dropped for the budget...)."""
    a = analyse(calls, tokenizer, train_turn_fn)
    fitting = [r for r in a.rows if len(r.input_ids) <= token_budget]
    return fitting, {
        "rows": len(a.rows),
        "forks": len(a.forks),
        "rows_dropped_budget": len(a.rows) - len(fitting),
        "excluded_calls": sum(a.excluded.values()),
    }


def trl_row(row: Row) -> dict[str, list[Any]]:
    """One row as TRL takes it: the first turn's prompt is TRL's "prompt", the rest its "completion"."""
    first_out = row.spans[0][1]
    return {
        "prompt_ids": row.input_ids[:first_out],
        "completion_ids": row.input_ids[first_out:],
        "logprobs": row.logprobs[first_out:],
        "env_mask": row.mask[first_out:],
    }


def longest_row_fields(
    rollouts: Sequence[Sequence[Row]], rewards: Sequence[float | None], pad_id: int
) -> tuple[dict[str, list[Any]], int]:
    """One row per rollout (its row with the most trained tokens); a rollout with no row gets a pad row
    with nothing trained (TRL needs one row per input). Returns (fields, rows dropped)."""
    fields: dict[str, list[Any]] = {
        "prompt_ids": [],
        "completion_ids": [],
        "logprobs": [],
        "env_mask": [],
        "wb_reward": [],
    }
    dropped = 0
    for rows, reward in zip(rollouts, rewards, strict=True):
        if rows:
            row = trl_row(max(rows, key=lambda r: (r.n_trained, len(r.input_ids))))
            dropped += len(rows) - 1
        else:
            row = {"prompt_ids": [pad_id], "completion_ids": [pad_id], "logprobs": [0.0], "env_mask": [0]}
        for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask"):
            fields[k].append(row[k])
        fields["wb_reward"].append(reward)
    return fields, dropped


def rows_for_trl(
    calls: list[dict[str, Any]], train_turn_fn: MaskPolicy, token_budget: int, tokenizer: Tokenizer | None = None
) -> tuple[dict[str, Any] | None, dict[str, int]]:
    """One TRL row for a rollout (its row with the most trained tokens, or None) and its counters."""
    rows, counts = rollout_rows(calls, train_turn_fn, token_budget, tokenizer)
    counts["rows_dropped_fork"] = max(0, len(rows) - 1)
    if not rows:
        counts["trained_tokens"] = 0
        return None, counts
    best = max(rows, key=lambda r: (r.n_trained, len(r.input_ids)))
    counts["trained_tokens"] = best.n_trained
    return trl_row(best), counts

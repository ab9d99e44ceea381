"""Lever 5 of `workbench.train.group_step`, its data side: every row of a forked rollout in fixed per-group slots.

    fields, dropped = every_row_fields(groups, rewards, slots=12, pad_id=tokenizer.pad_token_id)
    out[OWNER_FIELD]     # per row, the batch index of its rollout's lead row (-1: padding); install() reads it

Plain Python (no torch, no TRL): `workbench.train.fields` builds a step's fields with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workbench.turns import Row

__all__ = ["OWNER_FIELD", "every_row_fields"]

OWNER_FIELD = "wb_owner"  # rollout_func field: per row, the batch index of its rollout's lead row (-1: padding)


def every_row_fields(
    groups: Sequence[Sequence[Sequence[Row]]], rewards: Sequence[Sequence[float | None]], slots: int, pad_id: int
) -> tuple[dict[str, list[object]], int]:
    """rollout_func fields (lever 5) for groups of rollouts, each rollout given as all its rows.

    `groups[g][r]` holds rollout r's rows (workbench.turns.derive.analyse(...).rows, budget-filtered), `rewards[g][r]`
    its reward. Each group fills exactly `slots` rows (GRPOConfig.num_generations = slots): first every rollout's
    lead row (most trained tokens: it carries the reward), then the other rows by trained tokens, then padding
    rows (one pad token, nothing trained, reward None). A rollout with no row (no call answered before the
    timeout, a harness dead before calling, every row over the token budget) still gets a lead row: a pad row
    carrying its reward, so that it counts in TRL's group mean and std like any scored rollout (one
    solve among seven such rollouts otherwise had a baseline of 1, std NaN, advantage 0). Rows past `slots` are
    dropped; returns (fields, rows dropped). Every row of a group is split into prompt/completion at the same
    index (the shortest first-output start), so the group's rows get the same left padding in TRL and can
    share their prefix.
    """
    out: dict[str, list[object]] = {
        "prompt_ids": [],
        "completion_ids": [],
        "logprobs": [],
        "env_mask": [],
        "wb_reward": [],
        OWNER_FIELD: [],
    }
    pad: dict[str, list[Any]] = {"prompt_ids": [pad_id], "completion_ids": [pad_id], "logprobs": [0.0], "env_mask": [0]}
    dropped = 0
    for rollouts, group_rewards in zip(groups, rewards, strict=True):
        if len(rollouts) > slots:  # every rollout needs its lead slot, or it leaves the group's baseline
            raise ValueError(f"{len(rollouts)} rollouts in a group of {slots} slots: slots must be >= group size")
        base = len(out["prompt_ids"])
        ranked = [sorted(rows, key=lambda r: (r.n_trained, len(r.input_ids)), reverse=True) for rows in rollouts]
        leads: list[tuple[int, Row | None]] = [(i, rows[0] if rows else None) for i, rows in enumerate(ranked)]
        rest = sorted(((i, r) for i, rows in enumerate(ranked) for r in rows[1:]), key=lambda x: -x[1].n_trained)
        chosen = leads + rest[: slots - len(leads)]
        dropped += len(rest) - (len(chosen) - len(leads))
        lead_slot = {i: base + k for k, (i, _) in enumerate(leads)}
        split = min((r.spans[0][1] for _, r in chosen if r is not None), default=1)
        for k, (i, row) in enumerate(chosen):
            if row is None:  # a rollout with no row: a pad row, nothing trained, its reward in the baseline
                for key, value in pad.items():
                    out[key].append(list(value))
            else:
                out["prompt_ids"].append(row.input_ids[:split])
                out["completion_ids"].append(row.input_ids[split:])
                out["logprobs"].append(row.logprobs[split:])
                out["env_mask"].append(row.mask[split:])
            is_lead = k < len(leads)
            out["wb_reward"].append(group_rewards[i] if is_lead else None)
            out[OWNER_FIELD].append(base + k if is_lead else lead_slot[i])
        for _ in range(slots - len(chosen)):  # padding slots: reward None (NaN in TRL: outside the mean and std)
            for key, value in pad.items():
                out[key].append(list(value))
            out["wb_reward"].append(None)
            out[OWNER_FIELD].append(-1)
    return out, dropped

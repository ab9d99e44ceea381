"""Turns -> rows: a conversation's turns chained into training sequences, with their loss masks.

A **row** chains turns wherever the next prompt extends the previous prompt + output token for token;
a new row (a **fork**) starts where it does not. Sampled tokens are never overwritten with re-tokenised
text (TRL's REALIGN does that; we fork instead). In a row, each turn's sampled tokens carry its per-token
``output_mask`` (1 = trained: the whole output of a trained turn, or the part its producer kept); everything
else (the prompt, tool results) has mask 0.

    rows, forks = build_rows(turns)              # turns from workbench.turns.trace.derive_turns
    diagnose(forks, turns, calls, tokenizer)     # workbench.turns.drift: fills each fork's cause
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from workbench.turns.trace import Turn

__all__ = ["Row", "Fork", "build_rows"]


@dataclass
class Row:
    """One training sequence: chained turns. `mask` is 1 exactly on the sampled tokens the turns' masks train."""

    input_ids: list[int]
    mask: list[int]
    logprobs: list[float]  # the generator's logprob on every sampled token, 0.0 on context
    sampled: list[int]  # 1 on every sampled token (trained or not)
    turns: list[int]  # turn indices in this row
    spans: list[tuple[int, int, int]]  # per turn: (start of its new context, start of output, end)

    @property
    def n_trained(self) -> int:
        return sum(self.mask)


@dataclass
class Fork:
    """Where a turn's prompt stopped extending the row before it."""

    turn: int  # the turn that could not chain
    prev_turn: int  # the last turn of the row it diverged from
    index: int  # first diverging token position (in both sequences)
    prev_prompt_len: int
    cause: str = "other"
    detail: str = ""
    left: str = ""  # decoded text around the divergence, the row's side
    right: str = ""  # ... and the new prompt's side

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def build_rows(turns: list[Turn]) -> tuple[list[Row], list[Fork]]:
    """Chain turns into rows where the next prompt extends the row exactly; fork otherwise."""
    rows: list[Row] = []
    forks: list[Fork] = []
    row: Row | None = None
    prev: Turn | None = None
    for t in turns:
        if row is not None and t.prompt_ids[: len(row.input_ids)] == row.input_ids:
            start = len(row.input_ids)
            new_ctx = t.prompt_ids[start:]
        else:
            if row is not None and prev is not None:
                forks.append(
                    Fork(
                        turn=t.index,
                        prev_turn=prev.index,
                        index=_common_prefix(row.input_ids, t.prompt_ids),
                        prev_prompt_len=len(prev.prompt_ids),
                    )
                )
            row = Row([], [], [], [], [], [])
            rows.append(row)
            start, new_ctx = 0, t.prompt_ids
        out_start = start + len(new_ctx)
        row.input_ids += new_ctx + t.output_ids
        row.mask += [0] * len(new_ctx) + t.output_mask
        row.logprobs += [0.0] * len(new_ctx) + list(t.per_token_logps)
        row.sampled += [0] * len(new_ctx) + [1] * len(t.output_ids)
        row.turns.append(t.index)
        row.spans.append((start, out_start, len(row.input_ids)))
        prev = t
    return rows, forks

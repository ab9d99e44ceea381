"""Fork -> cause: why a turn's prompt stopped extending its row (drift diagnosis).

At every fork (`workbench.turns.rows.build_rows`) the first diverging token, both sides decoded, and
the cause, one of `CAUSES`: a compaction or rewritten history (the divergence is inside the earlier
context), or, inside the model's own reply as the harness replayed it, a BPE re-split, stripped
reasoning, a rewritten or re-serialised tool call, or a re-rendered template.

    rows, forks = build_rows(turns)
    diagnose(forks, turns, calls, tokenizer)     # fills each Fork's cause, detail, left and right
"""

from __future__ import annotations

import json
import re
from typing import Any

from workbench.turns.protocol import Tokenizer, decode_text, token_id
from workbench.turns.rows import Fork
from workbench.turns.trace import Turn

__all__ = ["CAUSES", "diagnose"]

# Every cause `diagnose` can name: reports count forks by these (`rollout_report`'s ``fork_causes``).
CAUSES = (
    "template_rerender",
    "arguments_reserialised",
    "harness_rewrote_call",
    "reasoning_stripped",
    "bpe_boundary",
    "compaction",
    "history_rewritten",
    "other",
)


_TOOL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def _tool_blocks(text: str) -> list[tuple[str, Any]]:
    out = []
    for raw in _TOOL_BLOCK.findall(text):
        try:
            out.append((raw, json.loads(raw)))
        except ValueError:
            out.append((raw, None))
    return out


def diagnose(
    forks: list[Fork], turns: list[Turn], calls: list[dict[str, Any]], tokenizer: Tokenizer, context_tokens: int = 12
) -> list[Fork]:
    """Classify each fork's cause (see `CAUSES`) from the token ids, their text and the trace."""
    by_index = {t.index: t for t in turns}
    end_id = token_id(tokenizer, "<|im_end|>")
    for f in forks:
        prev, cur = by_index[f.prev_turn], by_index[f.turn]
        left_ids = prev.prompt_ids + prev.output_ids
        i = f.index
        f.left = decode_text(tokenizer, left_ids[max(0, i - context_tokens) : i + context_tokens])
        f.right = decode_text(tokenizer, cur.prompt_ids[max(0, i - context_tokens) : i + context_tokens])
        between = [c.get("purpose") for c in calls[prev.call + 1 : cur.call]]
        if i < f.prev_prompt_len:
            if "compaction" in between:
                f.cause, f.detail = "compaction", "the harness summarised the history between these turns"
            else:
                f.cause, f.detail = "history_rewritten", f"diverged at {i}, inside the earlier context"
            continue
        # The divergence is inside the model's own reply as the harness replayed it.
        start = f.prev_prompt_len
        rest = cur.prompt_ids[start:]
        replay = rest[: rest.index(end_id) + 1] if end_id in rest else rest
        if prev.output_ids[-1:] != [end_id] and replay[-1:] == [end_id]:
            # a reply cut at the output limit ends without the end token; the harness replays it closed
            # (claude-code and hermes then ask it to resume): compare what was sampled
            replay = replay[:-1]
        sampled_text = decode_text(tokenizer, prev.output_ids, skip_special_tokens=False)
        replay_text = decode_text(tokenizer, replay, skip_special_tokens=False)
        call = calls[prev.call]
        message = ((call.get("response") or {}).get("choices") or [{}])[0].get("message") or {}
        s_blocks, r_blocks = _tool_blocks(sampled_text), _tool_blocks(replay_text)
        if sampled_text == replay_text:
            f.cause, f.detail = "bpe_boundary", "same text, different token split"
        elif (
            "<think>" in sampled_text or message.get("reasoning_content") or message.get("reasoning")
        ) and "<think>" not in replay_text:
            f.cause, f.detail = "reasoning_stripped", "the model's reasoning is missing from the replayed history"
        elif (
            s_blocks
            and r_blocks
            and [b[1].get("name") if isinstance(b[1], dict) else None for b in s_blocks]
            != [b[1].get("name") if isinstance(b[1], dict) else None for b in r_blocks]
        ):
            names = [b[1].get("name") if isinstance(b[1], dict) else "?" for b in r_blocks]
            f.cause, f.detail = "harness_rewrote_call", f"replayed as {names}"
        elif s_blocks and r_blocks and [b[0] for b in s_blocks] != [b[0] for b in r_blocks]:
            same = [b[1] for b in s_blocks] == [b[1] for b in r_blocks]
            f.cause = "arguments_reserialised"
            f.detail = "same JSON, re-serialised" if same else "tool-call JSON changed in the replay"
        elif "".join(sampled_text.split()) == "".join(replay_text.split()):
            f.cause, f.detail = "template_rerender", "the chat template re-rendered the reply's whitespace"
        elif s_blocks and not r_blocks or r_blocks and not s_blocks:
            f.cause, f.detail = "harness_rewrote_call", "a tool call appeared or vanished in the replay"
        else:
            f.cause, f.detail = "other", "the replayed reply differs from what was sampled"
    return forks

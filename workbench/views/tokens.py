"""Token views: the engine's ids as coloured HTML spans, for a turn, a chained row or a fork's two sides.

Each token shows its own text, its mask (context / trained sample / sampled but not trained) as a colour
and its sampled probability as the colour's intensity; special tokens, tool-call spans, turn boundaries
and the first diverging token are marked. Pure functions returning HTML strings, offline from saved folders.

    from IPython.display import HTML
    HTML(render_turn(tokenizer, turn))            # one turn: its prompt, then what was sampled
    HTML(render_row(tokenizer, row))              # a chained row with turn boundaries
    HTML(render_drift(tokenizer, fork, turns))    # both sides of a fork, aligned at the divergence
    HTML(render_tokens(tokenizer, ids, mask=mask, logprobs=lps))   # any ids
    token_texts(tokenizer, ids)                   # each token's own text (for other views' tables)

`STYLE` is the stylesheet every workbench HTML view starts with (tables included).
"""

from __future__ import annotations

import html
import math
from typing import Any, Sequence

from workbench.turns import Tokenizer, decode_text, Fork, Row, Turn

__all__ = ["STYLE", "token_texts", "render_tokens", "render_turn", "render_row", "render_drift"]

STYLE = """<style>
.wb-tokens{font-family:ui-monospace,Menlo,monospace;font-size:12px;line-height:1.9;white-space:pre-wrap;word-break:break-all}
.wb-tok{border-radius:3px;padding:0 1px;margin:0 0.5px}
.wb-ctx{background:#e8e8e8;color:#555}
.wb-train{background:rgba(22,163,74,var(--a));color:#000}
.wb-untrained{background:rgba(234,137,12,var(--a));color:#000}
.wb-special{outline:1px solid #6366f1;color:#4338ca;font-weight:600}
.wb-tool{text-decoration:underline 2px #2563eb}
.wb-turn{display:inline-block;border-left:3px solid #dc2626;margin:0 3px;height:1.2em;vertical-align:middle}
.wb-div{outline:2px solid #dc2626}
.wb-skip{color:#888;font-style:italic}
.wb-legend span{margin-right:10px}
.wb-table{border-collapse:collapse;font-size:12px}.wb-table td,.wb-table th{border:1px solid #ddd;padding:2px 6px;vertical-align:top}
</style>"""

_LEGEND = (
    '<div class="wb-legend"><span class="wb-tok wb-ctx">context (mask 0)</span>'
    '<span class="wb-tok wb-train" style="--a:0.6">trained sample (mask 1)</span>'
    '<span class="wb-tok wb-untrained" style="--a:0.6">sampled, not trained</span>'
    '<span class="wb-tok wb-special">special</span><span class="wb-tool">tool call</span>'
    "<span>intensity = probability of the sampled token</span></div>"
)


def token_texts(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token's own text (byte-level tokens that split a character show as U+FFFD)."""
    return [decode_text(tokenizer, [i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]


def _special_ids(tokenizer: Any) -> set[int]:
    return set(tokenizer.all_special_ids) | {
        i for t, i in tokenizer.get_added_vocab().items() if t.startswith("<|") and t.endswith("|>")
    }


def render_tokens(
    tokenizer: Any,
    ids: Sequence[int],
    *,
    mask: Sequence[int] | None = None,
    sampled: Sequence[int] | None = None,
    logprobs: Sequence[float] | None = None,
    boundaries: Sequence[int] = (),
    highlight: int | None = None,
    max_context: int | None = None,
    title: str = "",
) -> str:
    """Tokens as coloured spans: context / trained sample / untrained sample, logprob as intensity.

    `boundaries` are token positions where a new turn's context starts (drawn as a red bar);
    `highlight` outlines one position (e.g. the first diverging token). With `max_context`, runs of
    context longer than that are elided to their last `max_context` tokens (a note says how many).
    """
    ids = list(ids)
    mask = list(mask) if mask is not None else [0] * len(ids)
    sampled = list(sampled) if sampled is not None else list(mask)
    logprobs = list(logprobs) if logprobs is not None else [0.0] * len(ids)
    texts = token_texts(tokenizer, ids)
    special = _special_ids(tokenizer)
    tool_open, tool_close = (tokenizer.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>"))
    keep = [True] * len(ids)
    if max_context is not None:
        run_start = None
        for i in range(len(ids) + 1):
            ctx = i < len(ids) and not sampled[i] and i != highlight
            if ctx and run_start is None:
                run_start = i
            if not ctx and run_start is not None:
                for j in range(run_start, max(run_start, i - max_context)):
                    keep[j] = False
                run_start = None
    parts, in_tool, skipped = [], False, 0
    bset = set(boundaries)
    for i, (tid, text) in enumerate(zip(ids, texts)):
        if tid == tool_open:
            in_tool = True
        if not keep[i]:
            skipped += 1
            continue
        if skipped:
            parts.append(f'<span class="wb-skip">[… {skipped} context tokens …]</span>')
            skipped = 0
        if i in bset and i:
            parts.append('<span class="wb-turn" title="turn boundary"></span>')
        cls = ["wb-tok", "wb-train" if mask[i] else "wb-untrained" if sampled[i] else "wb-ctx"]
        if tid in special:
            cls.append("wb-special")
        if in_tool:
            cls.append("wb-tool")
        if i == highlight:
            cls.append("wb-div")
        alpha = 0.15 + 0.85 * math.exp(logprobs[i]) if sampled[i] else 1.0
        shown = html.escape(text).replace("\n", "↵\n") if text else "∅"
        tip = f"#{i} id {tid}" + (f" · logprob {logprobs[i]:.4f}" if sampled[i] else "") + f" · mask {mask[i]}"
        parts.append(
            f'<span class="{" ".join(cls)}" style="--a:{alpha:.3f}" title="{tip}" data-i="{i}" '
            f'data-id="{tid}">{shown}</span>'
        )
        if tid == tool_close:
            in_tool = False
    if skipped:
        parts.append(f'<span class="wb-skip">[… {skipped} context tokens …]</span>')
    head = f"<div><b>{html.escape(title)}</b></div>" if title else ""
    return f'{STYLE}{head}{_LEGEND}<div class="wb-tokens">{"".join(parts)}</div>'


def render_turn(tokenizer: Any, turn: Turn, *, max_context: int | None = None) -> str:
    n_p, n_o = len(turn.prompt_ids), len(turn.output_ids)
    trained = "trained" if turn.trained else "not trained (no tool call)"
    title = (
        f"turn {turn.index} (call {turn.call}): {n_p} prompt + {n_o} sampled tokens, {trained}, "
        f"finish {turn.finish_reason}, tools {turn.tool_calls or '-'}"
    )
    return render_tokens(
        tokenizer,
        turn.prompt_ids + turn.output_ids,
        mask=[0] * n_p + [int(turn.trained)] * n_o,
        sampled=[0] * n_p + [1] * n_o,
        logprobs=[0.0] * n_p + list(turn.per_token_logps),
        max_context=max_context,
        title=title,
    )


def render_row(tokenizer: Any, row: Row, *, max_context: int | None = None) -> str:
    title = f"row of turns {row.turns}: {len(row.input_ids)} tokens, {row.n_trained} trained"
    return render_tokens(
        tokenizer,
        row.input_ids,
        mask=row.mask,
        sampled=row.sampled,
        logprobs=row.logprobs,
        boundaries=[s[0] for s in row.spans],
        max_context=max_context,
        title=title,
    )


def render_drift(tokenizer: Any, fork: Fork, turns: Sequence[Turn], *, window: int = 24) -> str:
    """The row's side and the new prompt's side, aligned at the first diverging token."""
    by = {t.index: t for t in turns}
    prev, cur = by[fork.prev_turn], by[fork.turn]
    left_ids = prev.prompt_ids + prev.output_ids
    lo = max(0, fork.index - window)
    sides = []
    for name, ids, n_prompt in (
        ("row so far (prompt + sampled)", left_ids, len(prev.prompt_ids)),
        (f"turn {cur.index}'s prompt (engine ids)", cur.prompt_ids, len(cur.prompt_ids)),
    ):
        seg = ids[lo : fork.index + window]
        sampled = [int(lo + k >= n_prompt and ids is left_ids) for k in range(len(seg))]
        lps = [0.0] * len(seg)
        if ids is left_ids:
            for k in range(len(seg)):
                j = lo + k - n_prompt
                if 0 <= j < len(prev.per_token_logps):
                    lps[k] = prev.per_token_logps[j]
        sides.append(
            f"<tr><th>{html.escape(name)}</th><td>"
            + render_tokens(
                tokenizer, seg, mask=[0] * len(seg), sampled=sampled, logprobs=lps, highlight=fork.index - lo
            )
            .replace(STYLE, "")
            .replace(_LEGEND, "")
            + "</td></tr>"
        )
    head = (
        f"fork before turn {fork.turn}: first diverging token #{fork.index} "
        f"(previous prompt ends at {fork.prev_prompt_len}); cause <b>{fork.cause}</b>: {html.escape(fork.detail)}"
    )
    return f'{STYLE}{_LEGEND}<div>{head}</div><table class="wb-table">{"".join(sides)}</table>'

"""Token views: the engine's ids as coloured HTML spans, for a turn, a chained row or a fork's two sides.

Each token shows its own text, its mask (context / trained sample / sampled but not trained, per token: a
completion its producer trained in part shows both colours) as a colour and its sampled probability as the
colour's intensity; special tokens, tool-call spans, turn boundaries and the first diverging token are marked.
Above the tokens, a **logprob ribbon**: one thin bar per sampled token, taller the less likely the engine found
it, coloured by its mask, its hover title the exact logprob and token id. A row given its conversation's forks
says where the next turn's prompt stopped extending it ("first mismatch at token N") and outlines that token.
Pure functions returning HTML strings, offline from saved folders.

    from IPython.display import HTML
    HTML(render_turn(tokenizer, turn))            # one turn: its prompt, then what was sampled
    HTML(render_row(tokenizer, row, forks=forks)) # a chained row with turn boundaries and its first mismatch
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

__all__ = ["STYLE", "LEGEND", "token_texts", "render_tokens", "render_turn", "render_row", "row_fork", "render_drift"]

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
.wb-ribbon{display:flex;flex-wrap:wrap;align-items:flex-end;gap:1px;min-height:26px;margin:2px 0 4px}
.wb-lp{display:inline-block;width:4px;border-radius:1px 1px 0 0}
.wb-lp-train{background:#16a34a}.wb-lp-untrained{background:#ea890c}
.wb-lp-gap{display:inline-block;width:8px}
.wb-mismatch{color:#b91c1c;font-weight:600}.wb-nomismatch{color:#15803d}
.wb-table{border-collapse:collapse;font-size:12px}.wb-table td,.wb-table th{border:1px solid #ddd;padding:2px 6px;vertical-align:top}
</style>"""

# A bar's height: 2 px for a certain token up to 24 px at 8 nats of surprise (probability e^-8 = 0.03%), rarer
# tokens sharing the top so one -30 outlier does not flatten the rest. The square root spreads the common small
# values: half the sampled tokens of the shipped captures sit under 0.36 nats (linear: 3 px, square root: 7 px).
_RIBBON_CAP = 8.0
_RIBBON_PX = (2, 24)

_LEGEND = (
    '<div class="wb-legend"><span class="wb-tok wb-ctx">context (mask 0)</span>'
    '<span class="wb-tok wb-train" style="--a:0.6">trained sample (mask 1)</span>'
    '<span class="wb-tok wb-untrained" style="--a:0.6">sampled, not trained</span>'
    '<span class="wb-tok wb-special">special</span><span class="wb-tool">tool call</span>'
    "<span>intensity = probability of the sampled token</span>"
    f"<span>ribbon: one bar per sampled token, taller = less likely (√−logprob, capped at {_RIBBON_CAP:g} nats)</span></div>"
)
LEGEND = _LEGEND


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
    note: str = "",
    ribbon: bool = True,
) -> str:
    """Tokens as coloured spans: context / trained sample / untrained sample, logprob as intensity.

    `boundaries` are token positions where a new turn's context starts (drawn as a red bar);
    `highlight` outlines one position (e.g. the first diverging token). With `max_context`, runs of
    context longer than that are elided to their last `max_context` tokens (a note says how many).
    `note` is a line of HTML under the title; `ribbon` draws the logprob ribbon over the sampled tokens.
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
        tip = f"#{i} id {tid}" + (f" · logprob {logprobs[i]!r}" if sampled[i] else "") + f" · mask {mask[i]}"
        parts.append(
            f'<span class="{" ".join(cls)}" style="--a:{alpha:.3f}" title="{tip}" data-i="{i}" '
            f'data-id="{tid}">{shown}</span>'
        )
        if tid == tool_close:
            in_tool = False
    if skipped:
        parts.append(f'<span class="wb-skip">[… {skipped} context tokens …]</span>')
    head = (f"<div><b>{html.escape(title)}</b></div>" if title else "") + (f"<div>{note}</div>" if note else "")
    bars = _ribbon(ids, mask, sampled, logprobs) if ribbon else ""
    return f'{STYLE}{head}{_LEGEND}{bars}<div class="wb-tokens">{"".join(parts)}</div>'


def _ribbon(ids: Sequence[int], mask: Sequence[int], sampled: Sequence[int], logprobs: Sequence[float]) -> str:
    """One bar per sampled token, in order; a gap where context (a tool result, the next prompt) came between."""
    lo, hi = _RIBBON_PX
    bars, last = [], None
    for i, tid in enumerate(ids):
        if not sampled[i]:
            continue
        if last is not None and i != last + 1:
            bars.append('<span class="wb-lp-gap"></span>')
        last = i
        lp = float(logprobs[i])
        surprise = min(-lp, _RIBBON_CAP) if math.isfinite(lp) else _RIBBON_CAP
        px = lo + round((hi - lo) * math.sqrt(max(surprise, 0.0) / _RIBBON_CAP))
        kind = "train" if mask[i] else "untrained"
        prob = f"{math.exp(lp):.4f}" if math.isfinite(lp) else "0"
        bars.append(
            f'<span class="wb-lp wb-lp-{kind}" style="height:{px}px" data-i="{i}" data-lp="{lp!r}" '
            f'title="#{i} id {tid} · logprob {lp!r} · p {prob} · mask {mask[i]}"></span>'
        )
    return f'<div class="wb-ribbon" title="logprob ribbon">{"".join(bars)}</div>' if bars else ""


def render_turn(tokenizer: Any, turn: Turn, *, max_context: int | None = None) -> str:
    """One turn: its prompt (context), then its sampled tokens coloured by the turn's per-token mask."""
    n_p, n_o = len(turn.prompt_ids), len(turn.output_ids)
    k = sum(turn.output_mask)
    if turn.partial:
        trained = f"partly trained ({k} of {n_o} sampled tokens, as its producer masked them)"
    else:
        trained = "trained" if turn.trained else "not trained"
    title = (
        f"turn {turn.index} (call {turn.call}): {n_p} prompt + {n_o} sampled tokens, {trained}, "
        f"finish {turn.finish_reason}, tools {turn.tool_calls or '-'}"
    )
    return render_tokens(
        tokenizer,
        turn.prompt_ids + turn.output_ids,
        mask=turn.loss_mask,
        sampled=[0] * n_p + [1] * n_o,
        logprobs=[0.0] * n_p + list(turn.per_token_logps),
        max_context=max_context,
        title=title,
    )


def row_fork(row: Row, forks: Sequence[Fork]) -> Fork | None:
    """The fork that ended `row`: where the turn after its last one stopped extending it (None: nothing did)."""
    return next((f for f in forks if f.prev_turn == row.turns[-1]), None)


def render_row(tokenizer: Any, row: Row, *, forks: Sequence[Fork] | None = None, max_context: int | None = None) -> str:
    """A chained row, turn boundaries as red bars. Given the conversation's `forks` (`build_rows`' second
    result), it says where the next turn's prompt first differed from this row and outlines that token."""
    title = f"row of turns {row.turns}: {len(row.input_ids)} tokens, {row.n_trained} trained"
    fork = row_fork(row, forks) if forks is not None else None
    note = ""
    if fork is not None:
        note = (
            f'<span class="wb-mismatch" data-mismatch="{fork.index}">first mismatch at token {fork.index}</span>: '
            f"turn {fork.turn}'s prompt stops extending this row there (cause {html.escape(fork.cause)}), "
            "so it starts a new row"
        )
    elif forks is not None:
        note = '<span class="wb-nomismatch">no mismatch</span>: no later turn diverged from this row'
    return render_tokens(
        tokenizer,
        row.input_ids,
        mask=row.mask,
        sampled=row.sampled,
        logprobs=row.logprobs,
        boundaries=[s[0] for s in row.spans],
        highlight=fork.index if fork is not None else None,
        max_context=max_context,
        title=title,
        note=note,
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
                tokenizer,
                seg,
                mask=[0] * len(seg),
                sampled=sampled,
                logprobs=lps,
                highlight=fork.index - lo,
                ribbon=False,
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

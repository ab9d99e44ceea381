"""Views: pure `render_*` functions returning HTML strings or plotly figures; widgets wrap them.

Every view works offline from saved folders. In a live notebook `browser(..., interactive=True)`
gives an ipywidgets rollout -> turn -> tokens browser; headless (papermill), `interactive=False`
returns the same view as static HTML, so executed notebooks keep it.

    from IPython.display import HTML
    HTML(render_turn(tokenizer, turn))            # each token: text, mask colour, logprob intensity
    HTML(render_row(tokenizer, row))              # a chained row with turn boundaries
    HTML(render_drift(tokenizer, fork, turns))    # both sides of a fork, aligned at the divergence
    HTML(render_trace(calls))                     # every captured call, purpose, ids, logprobs
    summary_figure(reports)                       # plotly: turns, trained fraction, fork causes
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any, Sequence

from .tokenizer import Tokenizer, decode_text
from .turns import analyse
from .turns_rows import Fork, Row
from .turns_trace import Turn, load_trace

__all__ = [
    "token_texts",
    "render_tokens",
    "render_turn",
    "render_row",
    "render_drift",
    "render_trace",
    "render_table",
    "summary_figure",
    "browser",
    "learning_curve_figure",
    "render_eval",
    "step_interval",
    "STYLE",
]

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


def render_table(rows: list[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "<i>(empty)</i>"
    columns = list(columns or rows[0].keys())
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f'{STYLE}<table class="wb-table"><tr>{head}</tr>{body}</table>'


def render_trace(calls: list[dict[str, Any]], *, n_ids: int = 8) -> str:
    """Every captured call: purpose, status, its exact ids and logprobs next to the text."""
    rows = []
    for c in calls:
        message = ((c.get("response") or {}).get("choices") or [{}])[0].get("message") or {}
        out = c.get("completion_token_ids") or []
        lps = c.get("per_token_logps") or []
        tools = [(tc.get("function") or {}).get("name") for tc in message.get("tool_calls") or []]
        rows.append(
            {
                "call": c.get("turn"),
                "purpose": c.get("purpose", "?"),
                "status": c.get("status", "ok"),
                "prompt ids": f"{len(c.get('prompt_token_ids') or [])}: {(c.get('prompt_token_ids') or [])[:4]}…",
                "sampled ids": f"{len(out)}: {out[:n_ids]}{'…' if len(out) > n_ids else ''}",
                "logprobs": ", ".join(f"{x:.3f}" for x in lps[:n_ids]) + ("…" if len(lps) > n_ids else ""),
                "reply": (message.get("content") or "")[:160] + (f" [tool calls: {tools}]" if tools else ""),
                "error": c.get("error") or "",
            }
        )
    return render_table(rows)


def step_interval(
    rewards: Sequence[float | None], *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high): a step's group-mean reward and its 95% percentile-bootstrap interval over the
    group's scored rollouts (unscored ones, None, left out as in GRPO's baseline)."""
    import random

    xs = [x for x in rewards if x is not None]
    if not xs:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(xs) for _ in xs) / len(xs) for _ in range(resamples))
    return sum(xs) / len(xs), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def learning_curve_figure(metrics: list[dict[str, Any]], *, window: int = 5, title: str = "training reward"):
    """Per-step group-mean reward with its 95% interval (error bars) and a `window`-step moving average
    of the step means, from a run's metrics.jsonl (each step's ``rewards``)."""
    import plotly.graph_objects as go

    steps = [m["step"] for m in metrics]
    stats = [step_interval(m.get("rewards") or []) for m in metrics]
    mean = [s[0] for s in stats]
    moving = [
        sum(mean[max(0, i - window + 1) : i + 1]) / len(mean[max(0, i - window + 1) : i + 1]) for i in range(len(mean))
    ]
    fig = go.Figure()
    fig.add_scatter(
        x=steps,
        y=mean,
        mode="markers",
        name="step mean (95% CI)",
        error_y={
            "type": "data",
            "symmetric": False,
            "array": [s[2] - s[0] for s in stats],
            "arrayminus": [s[0] - s[1] for s in stats],
        },
    )
    fig.add_scatter(x=steps, y=moving, mode="lines", name=f"moving average ({window} steps)")
    fig.update_layout(
        title=title,
        xaxis_title="step",
        yaxis_title="reward (fraction of hidden tests passed)",
        yaxis_range=[-0.05, 1.05],
        height=380,
    )
    return fig


def render_eval(evidence: dict[str, Any]) -> str:
    """The before/after table of a learning run's eval.json (`workbench.evaluate.compare` + solve rates)."""

    def ci(d: dict[str, Any] | None) -> str:
        return "–" if not d else f"{d['mean']:.3f} [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}]"

    def rate(e: dict[str, Any], key: str) -> str:
        lo, hi = e.get(f"{key}_ci95") or (math.nan, math.nan)
        return f"{e.get(key, math.nan):.3f} [{lo:.3f}, {hi:.3f}]"

    rows = []
    for name in ("base", "trained"):
        e = evidence.get(f"{name}_eval", {})
        rows.append(
            {
                "policy": name,
                "rollouts": e.get("rollouts"),
                "mean reward (95% CI)": ci(evidence[name]),
                "solve rate": rate(e, "solve_rate"),
                "tool-call rate": rate(e, "tool_call_rate"),
                "solution.py written": rate(e, "solution_written_rate"),
            }
        )
    d, sd = evidence["delta"], evidence.get("delta", {}).get("solve_delta") or evidence.get("solve_delta")
    rows.append(
        {
            "policy": "trained − base (paired by task)",
            "rollouts": "",
            "mean reward (95% CI)": f"{ci(d)}, p = {d['p']:.4f}",
            "solve rate": f"{ci(sd)}, p = {sd['p']:.4f}" if sd else "–",
            "tool-call rate": "",
            "solution.py written": "",
        }
    )
    return render_table(rows)


def summary_figure(reports: dict[str, dict[str, Any]]):
    """Per rollout: agent turns (trained / not), excluded calls, rows and fork causes."""
    from plotly.subplots import make_subplots

    names = list(reports)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("turns per rollout", "fork causes (all rollouts)"))
    fig.add_bar(x=names, y=[r["turns_trained"] for r in reports.values()], name="trained turns", row=1, col=1)
    fig.add_bar(
        x=names, y=[r["turns"] - r["turns_trained"] for r in reports.values()], name="untrained turns", row=1, col=1
    )
    fig.add_bar(
        x=names, y=[sum(r["excluded_calls"].values()) for r in reports.values()], name="excluded calls", row=1, col=1
    )
    causes: dict[str, int] = {}
    for r in reports.values():
        for k, v in r["fork_causes"].items():
            causes[k] = causes.get(k, 0) + v
    fig.add_bar(x=list(causes) or ["(no forks)"], y=list(causes.values()) or [0], name="forks", row=1, col=2)
    fig.update_layout(barmode="stack", height=360, margin=dict(t=40, b=40))
    return fig


def _rollout_view(rollout_dir: Path, tokenizer: Any, turn_index: int, max_context: int | None) -> tuple[str, int]:
    derived = analyse(load_trace(rollout_dir / "trace.json"), tokenizer)
    turns, forks, report = derived.turns, derived.forks, derived.report
    summary = json.loads((rollout_dir / "summary.json").read_text()) if (rollout_dir / "summary.json").exists() else {}
    head = render_table(
        [
            {
                "rollout": rollout_dir.name,
                "status": summary.get("status"),
                "reward": summary.get("reward"),
                **{k: report[k] for k in ("turns", "turns_trained", "rows", "forks", "excluded_calls")},
            }
        ]
    )
    body = (
        render_turn(tokenizer, turns[min(turn_index, len(turns) - 1)], max_context=max_context)
        if turns
        else "<i>no agent turns</i>"
    )
    drift = "".join(render_drift(tokenizer, f, turns) for f in forks)
    return head + body + drift, len(turns)


def browser(run_dir: Path, tokenizer: Any, *, interactive: bool = True, max_context: int | None = 200) -> Any:
    """rollout -> turn -> tokens for every rollout folder under `run_dir` (one with a trace.json)."""
    run_dir = Path(run_dir)
    rollouts = sorted(p.parent for p in run_dir.rglob("trace.json"))
    if not rollouts:
        return f"<i>no rollouts under {html.escape(str(run_dir))}</i>"
    if not interactive:
        return "".join(_rollout_view(r, tokenizer, 0, max_context)[0] for r in rollouts[:3])
    import ipywidgets as w

    pick = w.Dropdown(options=[(str(r.relative_to(run_dir)), r) for r in rollouts], description="rollout")
    turn = w.IntSlider(min=0, max=0, description="turn")
    out = w.HTML()

    def refresh(*_: Any) -> None:
        content, n = _rollout_view(pick.value, tokenizer, turn.value, max_context)
        turn.max = max(0, n - 1)
        out.value = content

    def on_pick(*_: Any) -> None:
        turn.value = 0
        refresh()

    pick.observe(on_pick, "value")
    turn.observe(refresh, "value")
    refresh()
    return w.VBox([w.HBox([pick, turn]), out])

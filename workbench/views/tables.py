"""Views: HTML tables of traces and evaluations, and the rollout -> turn -> tokens browser.

Every view works offline from saved folders. In a live notebook `browser(..., interactive=True)`
gives an ipywidgets rollout -> turn -> tokens browser; headless (papermill), `interactive=False`
returns the same view as static HTML, so executed notebooks keep it.

    from IPython.display import HTML
    HTML(render_trace(calls))                     # every captured call, purpose, ids, logprobs
    HTML(render_table(rows))                      # any list of dicts
    HTML(render_eval(evidence))                   # a learning run's before/after table (eval.json)
    browser(run_dir, tokenizer)                   # every rollout folder under run_dir

The token views it builds on are `workbench.views.tokens` (`render_turn`, `render_row`,
`render_drift`); the plotly figures are `workbench.views.figures`.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any, Sequence

from workbench.turns import analyse, load_trace
from workbench.views.tokens import STYLE, render_drift, render_turn

__all__ = ["render_table", "render_trace", "render_eval", "browser"]


def render_table(rows: list[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "<i>(empty)</i>"
    # every key of every row, in order of first appearance: rows of two shapes in one table keep both
    columns = list(columns or dict.fromkeys(k for r in rows for k in r))
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


def render_eval(evidence: dict[str, Any]) -> str:
    """The before/after table of a learning run's eval.json (`workbench.evaluate.run.compare` + solve rates): the
    training pool's rows first when the run had one (`workbench.evaluate.learn`), then the held-out ones."""

    def ci(d: dict[str, Any] | None) -> str:
        return "–" if not d else f"{d['mean']:.3f} [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}]"

    def rate(e: dict[str, Any], key: str) -> str:
        # the clustered interval (rollouts of one task share its difficulty); an eval.json older than it has only
        # the Wilson one over rollouts, which is too narrow: say so
        if key not in e:
            return "–"
        clustered = e.get(f"{key}_ci95_clustered")
        lo, hi = clustered or e.get(f"{key}_ci95") or (math.nan, math.nan)
        return f"{e.get(key, math.nan):.3f} [{lo:.3f}, {hi:.3f}]" + ("" if clustered else " (Wilson, too narrow)")

    def paired(d: dict[str, Any] | None) -> str:
        return f"{ci(d)}, p = {d['p']:.4f}" if d else "–"

    # (label, its comparison, eval-key prefix, delta-key prefix): the training pool first when the run had one
    sets = [("held out", evidence, "", "")]
    if "train_pool" in evidence:
        pool = f"training pool ({len(evidence['train_pool']['task_ids'])} tasks)"
        sets.insert(0, (pool, evidence["train_pool"], "_pool", "train_pool_"))
    rows = []
    for label, both, side, prefix in sets:
        for name in ("base", "trained"):
            e = evidence.get(f"{name}{side}_eval", {})
            rows.append(
                {
                    "tasks": label,
                    "policy": name,
                    "rollouts": e.get("rollouts"),
                    "mean reward (95% CI)": ci(both[name]),
                    "solve rate": rate(e, "solve_rate"),
                    "tool-call rate": rate(e, "tool_call_rate"),
                    "solution.py written": rate(e, "solution_written_rate"),
                }
            )
        rows.append(
            {
                "tasks": label,
                "policy": "trained − base (paired by task)",
                "rollouts": "",
                "mean reward (95% CI)": paired(evidence.get(f"{prefix}delta")),
                "solve rate": paired(evidence.get(f"{prefix}solve_delta")),
                "tool-call rate": paired(evidence.get(f"{prefix}tool_call_delta")),
                "solution.py written": paired(evidence.get(f"{prefix}solution_written_delta")),
            }
        )
    return render_table(rows)


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

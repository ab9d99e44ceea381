"""A whole run as one static HTML page: every rollout's summary, turns, rows and forks with the token/mask views,
readable in any browser with no kernel, no network and no script (`workbench html PATH --out FILE.html`).

    pages, skipped = load_run(Path("runs/x"), work_dir=tmp)      # any traces: workbench.turns.load_sources
    HTML(render_run(pages, skipped=skipped, document=False))      # in a notebook: the same view, as a fragment
    save_run_html(Path("runs/x"), Path("runs/x/view.html"))       # the page, written; returns what it holds

`load_run` reads: each rollout's trace (ours in place, OpenEnv files imported into `work_dir`), its tokenizer (the
model its summary.json names, else `model`), turns, rows and diagnosed forks. A rollout that cannot be read (no
tokenizer for its model, a damaged trace) is listed as skipped with the reason and the others still render.
`render_run` is pure: the loaded rollouts in, one HTML string out (the stylesheet once, each rollout a
``<details>`` section, open).
"""

from __future__ import annotations

import html
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from workbench.turns import RolloutTurns, Source, TraceError, analyse, load_sources, load_trace, tokenizer_for_rollout
from workbench.views.tokens import LEGEND, STYLE, render_drift, render_row, render_turn

__all__ = ["RolloutPage", "load_run", "render_run", "save_run_html"]

# summary.json fields worth a column on the run's overview (the rest are in each rollout's own table)
_OVERVIEW = ("task_id", "harness", "model", "status", "reward")

_PAGE_STYLE = "<style>body{margin:16px 24px;color:#111}</style>"  # the whole page only: a notebook keeps its own
# scoped to the run's own block, so the same rules hold in a notebook's output
_RUN_STYLE = """<style>
.wb-run{font-family:system-ui,-apple-system,Segoe UI,sans-serif}
.wb-run h1{font-size:20px}.wb-run h2{font-size:16px;display:inline}.wb-run h3{font-size:14px;margin:14px 0 4px}
.wb-run details.wb-rollout{border-top:2px solid #ddd;padding:8px 0}
.wb-run .wb-view{margin:6px 0 14px}
.wb-run .wb-skipped{color:#b91c1c}
</style>"""


@dataclass
class RolloutPage:
    """One rollout as the page shows it: where it came from, its summary.json, what was derived, its tokenizer."""

    source: Source
    summary: dict[str, Any]
    derived: RolloutTurns
    tokenizer: Any


def load_run(
    path: Path, work_dir: Path, *, model: str | None = None
) -> tuple[list[RolloutPage], list[tuple[Path, str]]]:
    """Every rollout in or under `path` (any of the three formats), derived and ready to render, and the
    (path, reason) of each one that could not be read."""
    found = load_sources(Path(path), Path(work_dir), model=model)
    skipped = list(found.skipped)
    tokenizers: dict[str | None, Any] = {}
    pages = []
    for src in found.rollouts:
        summary_file = src.folder / "summary.json"
        try:
            summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
            name = summary.get("model") or model
            if name not in tokenizers:  # one tokenizer per model: SmolLM2's loads in ~0.3 s, a run may hold 100s
                tokenizers[name] = tokenizer_for_rollout(src.folder, model=name)
            tok = tokenizers[name]
            derived = analyse(load_trace(src.folder / "trace.json"), tok)
        except (TraceError, OSError, ValueError) as exc:  # one unreadable rollout must not hide the others
            skipped.append((src.origin, str(exc)))
            continue
        pages.append(RolloutPage(src, summary, derived, tok))
    return pages, skipped


def _table(rows: list[dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c, '')))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f'<table class="wb-table"><tr>{head}</tr>{body}</table>'


def _cell(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _bare(view: str) -> str:
    """A token view without the stylesheet and legend the page states once."""
    return view.replace(STYLE, "").replace(LEGEND, "")


def _overview(p: RolloutPage) -> dict[str, Any]:
    r = p.derived.report
    return {
        "rollout": p.source.name,
        "format": p.source.format,
        **{k: p.summary.get(k) for k in _OVERVIEW},
        "turns": r["turns"],
        "partly trained turns": sum(t.partial for t in p.derived.turns),
        "rows": r["rows"],
        "forks": r["forks"],
        "trained tokens": r["trained_tokens"],
    }


def _section(n: int, p: RolloutPage, max_context: int | None) -> str:
    d, tok = p.derived, p.tokenizer
    scalars = {k: v for k, v in p.summary.items() if not isinstance(v, (dict, list))}
    origin = "" if p.source.format == "rollout" else f" (imported from {p.source.origin})"
    parts = [
        f'<details class="wb-rollout" id="rollout-{n}" open><summary><h2>{html.escape(p.source.name)}</h2> '
        f"· {html.escape(p.source.format)}{html.escape(origin)}</summary>",
        "<h3>Summary</h3>",
        _table([{"field": k, "value": v} for k, v in scalars.items()]) if scalars else "<i>no summary.json</i>",
        _table([{**d.report, "excluded_calls": d.report["excluded_calls"] or "-"}]),
        f"<h3>Turns ({len(d.turns)})</h3>",
    ]
    parts += [f'<div class="wb-view">{_bare(render_turn(tok, t, max_context=max_context))}</div>' for t in d.turns]
    parts.append(f"<h3>Rows ({len(d.rows)})</h3>")
    parts += [
        f'<div class="wb-view">{_bare(render_row(tok, r, forks=d.forks, max_context=max_context))}</div>'
        for r in d.rows
    ]
    if d.forks:
        parts.append(f"<h3>Forks ({len(d.forks)})</h3>")
        parts += [f'<div class="wb-view">{_bare(render_drift(tok, f, d.turns))}</div>' for f in d.forks]
    if not d.turns:
        parts.append("<i>no answered agent call in this trace</i>")
    return "".join(parts) + "</details>"


def render_run(
    pages: Sequence[RolloutPage],
    *,
    title: str = "run",
    skipped: Sequence[tuple[Path, str]] = (),
    max_context: int | None = 200,
    document: bool = True,
) -> str:
    """The run as HTML: an overview table, what was skipped and why, then each rollout's summary, turns, rows (first
    mismatch marked) and forks. `document` gives a whole page (<!doctype html> ...), else a fragment for a notebook."""
    body = [STYLE, _RUN_STYLE, f'<div class="wb-run"><h1>{html.escape(title)}</h1>', LEGEND]
    body.append(_table([_overview(p) for p in pages]) if pages else "<p><i>no rollout could be read</i></p>")
    if skipped:
        items = "".join(f"<li><b>{html.escape(str(p))}</b>: {html.escape(why)}</li>" for p, why in skipped)
        body.append(f'<div class="wb-skipped">skipped {len(skipped)}:<ul>{items}</ul></div>')
    body += [_section(n, p, max_context) for n, p in enumerate(pages)]
    body.append("</div>")
    if not document:  # the charset keeps a fragment saved alone (a notebook's figures/*.html) readable: ↵, ∅
        return '<meta charset="utf-8">' + "".join(body)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>{_PAGE_STYLE}</head><body>{''.join(body)}</body></html>\n"
    )


def save_run_html(
    path: Path,
    out: Path,
    *,
    work_dir: Path | None = None,
    model: str | None = None,
    title: str | None = None,
    max_context: int | None = 200,
) -> tuple[list[RolloutPage], list[tuple[Path, str]]]:
    """Write `path`'s traces as one self-contained page to `out`; returns what `load_run` gave (rendered, skipped).
    OpenEnv files are imported into `work_dir`, by default a temporary folder removed afterwards (the page needs
    nothing beside it)."""
    path, out = Path(path), Path(out)
    with tempfile.TemporaryDirectory(prefix="wb-html-") as tmp:
        pages, skipped = load_run(path, Path(work_dir) if work_dir is not None else Path(tmp), model=model)
        page = render_run(pages, title=title or str(path), skipped=skipped, max_context=max_context)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return pages, skipped

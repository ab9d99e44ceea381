"""Views: what the notebooks show, as pure functions returning HTML or plotly figures (every notebook).

    from workbench.views import browser, render_eval
    browser(run_dir, tokenizer)                 # each turn's tokens, coloured by loss mask (a widget)
    save_run_html(Path("captures"), Path("run.html"))   # any folder of traces as one static page (no kernel)
    HTML(render_eval(evidence))                 # base and trained policies compared, with intervals

Private modules: ``tables`` (HTML tables and the ipywidgets that wrap them), ``tokens`` (token and mask
spans, logprob ribbons, a row's first mismatch), ``page`` (a whole run as one static HTML page), ``figures``
(plotly figures). Headless runs show the same output statically.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face

__all__ = [
    "group_signal_figure",
    "learning_curve_figure",
    "save_figure",
    "summary_figure",
    "browser",
    "render_eval",
    "render_table",
    "render_trace",
    "render_drift",
    "render_row",
    "render_turn",
    "STYLE",
    "token_texts",
    "render_tokens",
    "row_fork",
    "LEGEND",
    "RolloutPage",
    "load_run",
    "render_run",
    "save_run_html",
]

__getattr__, __dir__ = face(
    __name__,
    {
        "group_signal_figure": "figures",
        "learning_curve_figure": "figures",
        "save_figure": "figures",
        "summary_figure": "figures",
        "browser": "tables",
        "render_eval": "tables",
        "render_table": "tables",
        "render_trace": "tables",
        "render_drift": "tokens",
        "render_row": "tokens",
        "render_turn": "tokens",
        "STYLE": "tokens",
        "token_texts": "tokens",
        "render_tokens": "tokens",
        "row_fork": "tokens",
        "LEGEND": "tokens",
        "RolloutPage": "page",
        "load_run": "page",
        "render_run": "page",
        "save_run_html": "page",
    },
)

if TYPE_CHECKING:
    from workbench.views.figures import group_signal_figure, learning_curve_figure, save_figure, summary_figure
    from workbench.views.tables import browser, render_eval, render_table, render_trace
    from workbench.views.tokens import render_drift, render_row, render_turn, STYLE, token_texts
    from workbench.views.tokens import LEGEND, render_tokens, row_fork
    from workbench.views.page import RolloutPage, load_run, render_run, save_run_html

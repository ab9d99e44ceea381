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


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.views.figures import group_signal_figure, learning_curve_figure, save_figure, summary_figure
    from workbench.views.export import export_figures, screenshot
    from workbench.views.tables import browser, render_eval, render_table, render_trace
    from workbench.views.tokens import render_drift, render_row, render_turn, STYLE, token_texts
    from workbench.views.page import RolloutPage, load_run, render_run, save_run_html

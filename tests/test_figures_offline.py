"""Saved figures draw offline: a figure saved by `Notebook.show` opens in a real headless Chromium with
the network cut off and shows one rendered trace per trace of the figure (a CDN script tag leaves the
page blank without internet, which is what a workshop room without internet got)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from workbench.cli import open_notebook
from workbench.views import learning_curve_figure, summary_figure

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary on PATH (chromium / chromium-browser): scripts/setup.sh installs it"
)

METRICS = [  # two reward series (hidden tests, and the reshaped one trained on): 2 x (points + average)
    {"step": 1, "test_rewards": [0.0, 0.5, 1.0], "rewards": [0.1, 0.5, 1.0]},
    {"step": 2, "test_rewards": [0.5, 0.5, 1.0], "rewards": [0.6, 0.5, 1.0]},
    {"step": 3, "test_rewards": [1.0, 0.5, 1.0], "rewards": [1.0, 0.7, 1.0]},
]
REPORTS = {
    "r0": {"turns": 3, "turns_trained": 2, "excluded_calls": {"title": 1}, "fork_causes": {"reasoning": 1}},
    "r1": {"turns": 2, "turns_trained": 2, "excluded_calls": {}, "fork_causes": {}},
}


def _dom_offline(page: Path, profile: Path) -> str:
    """The DOM after load, in headless Chromium with every network fetch refused: all host names fail to
    resolve and any http(s) request goes to a closed local port (file:// is unaffected)."""
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # we may be root (CI, containers); the page is our own file
            "--disable-gpu",
            f"--user-data-dir={profile}",  # no shared profile lock with another Chromium
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--proxy-server=http://127.0.0.1:9",
            "--virtual-time-budget=10000",  # let plotly's promise chain finish before the dump
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only: a loaded machine takes seconds
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _saved(tmp_path: Path, fig, name: str) -> Path:
    """Save `fig` the way every notebook does: Notebook.show(fig, name) -> <run>/figures/<name>.html."""
    nb = open_notebook("figures", run_dir=str(tmp_path / "run"), interactive=False)
    nb.show(fig, name)
    return nb.path / "figures" / f"{name}.html"


@needs_chromium
@pytest.mark.parametrize(
    "make, kind, trace_class",
    [
        (lambda: learning_curve_figure(METRICS, window=2), "scatter", "trace scatter"),
        (lambda: summary_figure(REPORTS), "bar", "trace bars"),  # plotly.js draws a bar trace as <g class="trace bars">
    ],
    ids=["learning_curve", "summary"],
)
def test_saved_figure_draws_its_traces_in_chromium_offline(tmp_path, make, kind, trace_class):
    fig = make()
    traces = len(fig.data)
    assert traces >= 4 and {t.type for t in fig.data} == {kind}
    page = _saved(tmp_path, fig, "curve")
    html = page.read_text()
    assert '<script charset="utf-8" src="plotly.min.js"></script>' in html
    assert not re.search(r"<script[^>]*src=\"https?://", html), "a saved figure must not fetch plotly.js"
    assert (page.parent / "plotly.min.js").stat().st_size > 1_000_000  # the bundle, beside the page

    dom = _dom_offline(page, tmp_path / "profile")
    assert 'class="main-svg"' in dom, "plotly did not draw: blank page"
    drawn = re.findall(rf'class="{trace_class}(?: trace[0-9a-f]+)?"', dom)  # scatter adds its uid
    assert len(drawn) == traces, (traces, drawn)


@needs_chromium
def test_the_same_figure_with_a_cdn_script_stays_blank_here(tmp_path):
    """The control: the browser above really is offline, so a page that needs the CDN draws nothing."""
    fig = learning_curve_figure(METRICS)
    page = tmp_path / "cdn.html"
    page.write_text(fig.to_html(include_plotlyjs="cdn", full_html=True))
    dom = _dom_offline(page, tmp_path / "profile")
    assert "plotly-graph-div" in dom and 'class="main-svg"' not in dom


def test_a_stale_or_truncated_bundle_is_replaced(tmp_path):
    """plotly's write_html keeps any existing plotly.min.js: a half-written one would blank every later
    figure of the run, so saving checks it."""
    from plotly.offline import get_plotlyjs

    bundle = tmp_path / "run" / "figures" / "plotly.min.js"
    bundle.parent.mkdir(parents=True)
    bundle.write_text("/* truncated")
    _saved(tmp_path, learning_curve_figure(METRICS), "curve")
    assert bundle.read_text() == get_plotlyjs()
    assert [p.name for p in bundle.parent.iterdir() if p.name.startswith(".")] == []  # no temp file left


def _not_blank(png: Path) -> int:
    """How many distinct colours the PNG holds (a blank page has one)."""
    from PIL import Image

    with Image.open(png) as im:
        return len(im.convert("RGB").getcolors(maxcolors=1 << 20) or [])


@needs_chromium
def test_every_saved_figure_becomes_a_png_and_an_svg_for_slides_and_the_token_view_a_png(tmp_path, capsys):
    """`workbench figures`: plotly specs through kaleido (the system's Chromium), HTML views as screenshots;
    `workbench html --png`: the token/mask page. Each PNG opened and checked to hold a drawing, not a blank page."""
    from workbench.cli import build_parser
    from workbench.views import export_figures

    page = _saved(tmp_path, learning_curve_figure(METRICS, window=2), "curve")
    figures = page.parent
    assert (figures / "curve.json").is_file()  # the spec saved beside the page
    rollout = Path(__file__).resolve().parents[1] / "workbench" / "data" / "rollouts" / "smollm2-easy"
    args = build_parser().parse_args(["html", str(rollout), "--out", str(figures / "tokens.html"), "--png"])
    assert args.handler(args) == 0
    with pytest.raises(ValueError, match="png and svg only"):
        export_figures(figures, ["gif"])
    args = build_parser().parse_args(["figures", str(figures.parent)])
    assert args.handler(args) == 0
    written = capsys.readouterr().out
    for name in ("curve.png", "curve.svg", "tokens.png"):
        assert name in written and (figures / name).is_file()
    assert _not_blank(figures / "curve.png") > 20 and _not_blank(figures / "tokens.png") > 20
    assert (figures / "curve.svg").read_text().lstrip().startswith("<svg") and "trace scatter" in (
        figures / "curve.svg"
    ).read_text()

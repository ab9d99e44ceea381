"""Figures for slides: a run's saved figures as PNG and SVG, offline, drawn by the system's headless Chromium.

A notebook's ``nb.show(view, name)`` saves ``figures/<name>.html`` (`save_figure`), and for a plotly figure also
``figures/<name>.json`` (its spec). `export_figures` turns every spec into PNG and SVG through plotly's own image
export (kaleido, which drives Chromium; one browser for the whole folder), and every HTML view without a spec (the
token/mask view, the tables) into a PNG screenshot of the page, in the same offline Chromium (every network fetch
refused). HTML views have no SVG: a page is not a vector drawing.

    export_figures(Path("runs/<stamp>__notebooks/figures"))          # -> [figures/curves.png, curves.svg, ...]
    workbench figures runs/<stamp>__notebooks [--formats png,svg]    # the same, from the shell
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["export_figures", "screenshot", "chromium"]

_WIDTH, _HEIGHT = 1280, 800  # a slide's 16:10, at a size plotly and the tables lay out well


def chromium() -> str:
    """The system's Chromium (set-up installs it for the tests), or a clear error."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise FileNotFoundError("no chromium on PATH: scripts/setup.sh installs it (apt-get install chromium)")
    return found


def export_figures(folder: Path, formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """Every figure in `folder` (figures/*.json specs, figures/*.html views) in `formats`; returns what was
    written. ValueError for a format other than png or svg."""
    wrong = set(formats) - {"png", "svg"}
    if wrong:
        raise ValueError(f"formats: png and svg only, got {sorted(wrong)}")
    specs = sorted(folder.glob("*.json"))
    pages = sorted(p for p in folder.glob("*.html") if not p.with_suffix(".json").exists())
    written: list[Path] = []
    if specs:
        import plotly.io as pio

        figures, paths = [], []
        for spec in specs:
            for fmt in formats:
                figures.append(pio.read_json(spec))
                paths.append(spec.with_suffix(f".{fmt}"))
        os.environ.setdefault("BROWSER_PATH", chromium())  # kaleido's Chromium: the system's, never a download
        pio.write_images(figures, paths, width=_WIDTH, height=_HEIGHT)
        written += paths
    if "png" in formats:
        for page in pages:
            written.append(screenshot(page, page.with_suffix(".png")))
    return written


def screenshot(page: Path, out: Path) -> Path:
    """A PNG of `page` as offline headless Chromium draws it."""
    with tempfile.TemporaryDirectory(prefix="wb-shot-") as profile:
        proc = subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",  # we may be root (CI, containers); the page is our own file
                "--disable-gpu",
                f"--user-data-dir={profile}",
                "--host-resolver-rules=MAP * ~NOTFOUND",
                "--proxy-server=http://127.0.0.1:9",
                "--hide-scrollbars",
                f"--window-size={_WIDTH},{_HEIGHT}",
                "--virtual-time-budget=5000",
                f"--screenshot={out}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=300,  # a hang guard: seconds on a loaded machine
        )
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"chromium could not draw {page}: {proc.stderr.strip()[-500:]}")
    return out

"""JupyterLab as people use it: a real ``jupyter lab`` on the project's venv, opened in headless Chromium (the
system's, driven by Playwright: no browser download), notebook 03 run from the Run menu, and what a person sees
checked: every cell ran, no error or stderr output, the rollout browser's widgets drawn, and picking a rollout and
moving the turn slider changes the token view. A screenshot is kept in ``runs/browser-test/03_turns.png``.

The server binds 127.0.0.1 with a random token (a request without it is refused) and keeps its state in the test's
temporary folder; nothing needs the network (JupyterLab's news and update checks off, Chromium's background
fetches off). Notebook 03 reads shipped rollouts only: no engine starts.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, sync_playwright

from workbench.paths import project_root
from workbench.procs import free_port, stop_group

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTEFACTS = project_root() / "runs" / "browser-test"
NOTEBOOK = "03_turns.ipynb"
ROLLOUT = "smollm2-forced-repo-task"  # a shipped rollout with seven agent turns: the slider has somewhere to go

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: `make test` installs it (scripts/setup.sh)"),
]

# JavaScript run in the page, through the app JupyterLab exposes (`--LabApp.expose_app_in_browser`).
_KERNEL_IDLE = """() => {
  const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const kernel = nb && nb.sessionContext && nb.sessionContext.session && nb.sessionContext.session.kernel;
  return !!kernel && kernel.status === 'idle';
}"""
_RUN_STATE = """() => {
  const nb = window.jupyterapp.shell.currentWidget;
  const cells = nb.content.model.cells;
  const out = {code: 0, ran: 0, errors: [], stderr: [], busy: nb.sessionContext.session.kernel.status !== 'idle'};
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type !== 'code') continue;
    out.code += 1;
    if (cell.executionCount !== null) out.ran += 1;
    for (const o of cell.outputs.toJSON()) {
      if (o.output_type === 'error') out.errors.push(`cell ${i}: ${o.ename}: ${o.evalue}`);
      if (o.output_type === 'stream' && o.name === 'stderr') out.stderr.push(`cell ${i}: ${String(o.text).slice(0, 300)}`);
    }
  }
  return out;
}"""


def _notebook_copy(folder: Path, run_dir: Path) -> None:
    """Notebook 03 as a person would open it, its output folder set in the parameters cell (the only edit)."""
    nb = json.loads((project_root() / "notebooks" / NOTEBOOK).read_text())
    params = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    source, n = re.subn(
        r'^run_dir: str = ""', f"run_dir: str = {str(run_dir)!r}", "".join(params["source"]), flags=re.M
    )
    assert n == 1, "notebook 03's parameters cell has no run_dir line"
    params["source"] = source.splitlines(keepends=True)
    (folder / NOTEBOOK).write_text(json.dumps(nb))


@pytest.fixture
def lab(tmp_path):
    """A running ``jupyter lab`` on 127.0.0.1 over a folder holding notebook 03: (base URL, token)."""
    root = tmp_path / "lab"
    root.mkdir()
    _notebook_copy(root, tmp_path / "run")
    token, port = secrets.token_hex(24), free_port()
    state = {name: str(tmp_path / "jupyter" / name) for name in ("config", "data", "runtime", "ipython")}
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": state["config"],
        "JUPYTER_DATA_DIR": state["data"],  # kernels and lab extensions are still found in the venv's own share/
        "JUPYTER_RUNTIME_DIR": state["runtime"],
        "IPYTHONDIR": state["ipython"],
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.expose_app_in_browser=True", "--LabApp.extension_manager=readonly",
        *(["--allow-root"] if os.geteuid() == 0 else []),  # CI and containers run as root
    ]  # fmt: skip
    # JupyterLab's news prompt (a toast over the notebook) off: the announcements plugin, as a person can in Settings
    labconfig = Path(state["config"]) / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    log = open(tmp_path / "jupyter.log", "wb")
    server = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{url}/api/status", params={"token": token}, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, (tmp_path / "jupyter.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "jupyter lab did not answer in 180 s"
            time.sleep(0.5)
        yield url, token
    finally:
        stop_group(server)
        log.close()


_VIEW = (
    "() => { const v = document.querySelectorAll('.widget-html'); return v.length ? v[v.length - 1].innerHTML : ''; }"
)


def _view_changes(page: Page, before: str) -> None:
    """Wait until the browser's token view (the last HTML widget) shows something else than `before`."""
    page.wait_for_function(f"b => ({_VIEW})() !== b", arg=before, timeout=120_000)


def _run_all(page: Page) -> dict:
    """Run → Run All Cells, from the menu bar; the run's state once the kernel is idle with every cell run, or one
    raised an error (JupyterLab stops there)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    deadline = time.monotonic() + 900  # 03 loads four tokenizers and draws every view: ~1 min on 2 quiet cores
    while True:
        state = page.evaluate(_RUN_STATE)
        if state["errors"] or (not state["busy"] and state["ran"] == state["code"]):
            return state
        assert time.monotonic() < deadline, f"notebook 03 did not finish in 900 s: {state}"
        page.wait_for_timeout(1000)


def test_notebook_03_runs_in_jupyterlab_and_its_widgets_answer(lab):
    url, token = lab
    assert httpx.get(f"{url}/api/status", timeout=10).status_code == 403  # no token, no answer
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                  "--disable-background-networking", "--disable-component-update"],
        )  # fmt: skip
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(f"{url}/lab/tree/{NOTEBOOK}?token={token}")
            page.wait_for_function(_KERNEL_IDLE, timeout=180_000)

            state = _run_all(page)
            assert not state["errors"], state["errors"]
            assert not state["stderr"], state["stderr"]  # no warning a reader must skip
            assert state["ran"] == state["code"] > 5, state

            # The rollout browser (the last cell): a dropdown of rollouts, a turn slider, the token view.
            browse = page.locator(".jp-Cell").last
            pick = browse.locator(".widget-dropdown select")
            view = browse.locator(".widget-html").last
            assert pick.count() == 1 and browse.locator(".widget-slider").count() == 1
            assert view.inner_text().strip(), "the token view is empty"
            options = pick.locator("option").all_inner_texts()
            assert ROLLOUT in options, options
            before = view.inner_html()
            pick.select_option(label=ROLLOUT)  # a person picks another rollout ...
            _view_changes(page, before)
            first_turn = view.inner_html()
            assert first_turn != before
            handle = browse.locator(".widget-slider .noUi-handle")
            handle.focus()
            page.keyboard.press("ArrowRight")  # ... and moves the turn slider one step
            _view_changes(page, first_turn)
            assert browse.locator(".widget-readout").inner_text().strip() == "1"
            assert view.inner_html() != first_turn

            shot = ARTEFACTS / "03_turns.png"
            browse.scroll_into_view_if_needed()
            page.screenshot(path=str(shot), full_page=False)
            assert shot.stat().st_size > 20_000  # a blank page is a few KB
        finally:
            browser.close()

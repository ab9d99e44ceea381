"""The walk-through notebooks: committed clean, parameters checked, executed headless by the command users run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.notebooks import NOTEBOOKS, NotebookError, check_parameters, run_notebooks
from workbench.paths import project_root

NB_DIR = project_root() / "notebooks"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebooks_are_stripped_and_parameterised(name):
    nb = json.loads((NB_DIR / f"{name}.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), (
        "commit notebooks without outputs"
    )
    tagged = [i for i, c in enumerate(nb["cells"]) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    # the cell after the parameters builds the typed config (papermill injects in between)
    after = "".join(nb["cells"][tagged[0] + 1]["source"])
    assert "NotebookContext(" in after


def test_unknown_parameters_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(NotebookError, match="unknown parameter.*bogus"):
        check_parameters("03_turns", {"bogus": 1})
    with pytest.raises(NotebookError, match="03_turns: unknown parameter"):
        run_notebooks("small", only=["03_turns"], run_dir=tmp_path / "run", overrides={"03_turns": {"max_contxt": 5}})
    assert not (tmp_path / "run").exists()  # refused before the run folder or an engine existed
    with pytest.raises(NotebookError, match="unknown notebook"):
        run_notebooks("small", only=["99_nothing"])


def _outputs(nb_path: Path) -> tuple[list[dict], list[dict]]:
    nb = json.loads(nb_path.read_text())
    outs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    return [o for o in outs if o.get("output_type") == "error"], outs


@pytest.mark.engine
@pytest.mark.opencode
@pytest.mark.slow
def test_all_notebooks_execute_headless(tmp_path):
    """`workbench notebooks run --params small`: the same command users run, end to end."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "notebooks", "run", "--params", "small", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=2400,
        cwd=project_root(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in NOTEBOOKS:
        errors, outputs = _outputs(out / f"{name}.ipynb")
        assert not errors, (name, errors)
        assert outputs, name
    config = json.loads((out / "config.json").read_text())
    assert config["params"] == "small" and config["git_commit"] and set(config["notebooks"]) == set(NOTEBOOKS)
    assert "admin_key" not in json.dumps(config)
    # each stage's artefacts
    assert (out / "rollouts" / "r0" / "trace.json").exists() and (out / "rollouts" / "r0" / "turns.json").exists()
    assert (out / "grpo" / "metrics.jsonl").exists() and (out / "grpo" / "adapters" / "final").is_dir()
    figures = {p.stem for p in (out / "figures").glob("*.html")}
    assert {
        "sandbox_probes",
        "two_urls",
        "trace",
        "turn0",
        "row",
        "fork_causes",
        "verify_hostile",
        "steps",
        "curves",
    } <= figures
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {m["notebook"] for m in metrics} >= set(NOTEBOOKS)
    # widgets degrade headless: the executed notebook holds the static token view
    _, outputs = _outputs(out / "03_turns.ipynb")
    html = [o for o in outputs if "text/html" in o.get("data", {})]
    assert any("wb-tokens" in "".join(o["data"]["text/html"]) for o in html)


@pytest.mark.engine
def test_secrets_are_scrubbed_even_when_a_notebook_fails(tmp_path):
    """papermill writes the injected parameters (the proxy's admin key, the engine's API key) into the
    executed copy; a notebook failing in its config cell must not leave them there either."""
    out = tmp_path / "run"
    with pytest.raises(NotebookError, match="04_reward.ipynb failed"):
        run_notebooks("small", only=["04_reward"], run_dir=out, overrides={"04_reward": {"task": "no-such-task/0"}})
    text = (out / "04_reward.ipynb").read_text()
    assert "<secret>" in text
    injected = [line for line in text.splitlines() if "admin_key = " in line or "engine_key = " in line]
    assert injected and all("<secret>" in line for line in injected), injected

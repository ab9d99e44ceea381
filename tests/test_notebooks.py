"""The walk-through notebooks: committed clean, parameters checked, executed headless by the command users run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli.notebooks import NOTEBOOKS, NotebookError, check_parameters, run_notebooks
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
    # the cell after the parameters opens the notebook's session in one call (papermill injects in between), and no
    # parameter carries the stack's URLs or keys (the runner's stack.json does)
    after = "".join(nb["cells"][tagged[0] + 1]["source"])
    assert after.count(f'open_notebook("{name}", model=model, run_dir=run_dir, interactive=interactive)') == 1
    params = "".join(nb["cells"][tagged[0]]["source"])
    assert not re.search(r"^(engine_url|served_name|proxy_url|admin_key|engine_key)\b", params, re.M), params


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
    # progress as it happens, then where the copies are and how to open them
    for i, name in enumerate(NOTEBOOKS, 1):
        assert re.search(rf"^\[{i}/{len(NOTEBOOKS)}\] {name}: ok in \d+\.\d s$", proc.stdout, re.M), proc.stdout
    assert proc.stdout.splitlines()[-1].endswith(f"-m jupyter lab {out}"), proc.stdout
    for name in NOTEBOOKS:
        errors, outputs = _outputs(out / f"{name}.ipynb")
        assert not errors, (name, errors)
        assert outputs, name
    config = json.loads((out / "config.json").read_text())
    assert config["params"] == "small" and config["git_commit"] and set(config["notebooks"]) == set(NOTEBOOKS)
    assert "admin_key" not in json.dumps(config) and not (out / "stack.json").exists()
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
    # every figure draws offline: plotly.js beside them, no CDN (tests/test_figures_offline.py opens one)
    assert (out / "figures" / "plotly.min.js").stat().st_size > 1_000_000
    assert not any("cdn.plot.ly" in p.read_text() for p in (out / "figures").glob("*.html"))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {m["notebook"] for m in metrics} >= set(NOTEBOOKS)
    # widgets degrade headless: the executed notebook holds the static token view
    _, outputs = _outputs(out / "03_turns.ipynb")
    html = [o for o in outputs if "text/html" in o.get("data", {})]
    assert any("wb-tokens" in "".join(o["data"]["text/html"]) for o in html)


def test_the_stack_file_is_the_users_alone_and_gone_when_the_stack_stops(tmp_path):
    """The runner's stack.json holds the proxy's admin key and the engine's API key: created 0600 (never wider, a
    name that exists is refused rather than reused), read by `open_notebook`, which connects to that stack rather than
    starting one. Removed when the run ends: tests below check it is gone and no key is in an executed copy."""
    import os
    import stat

    from workbench.cli.notebooks import STACK_FILE, open_notebook, write_stack

    stack = {
        "model": "smollm2",
        "engine_url": "http://127.0.0.1:1/v1",
        "served_name": "served",
        "engine_key": "",
        "proxy_url": "http://127.0.0.1:2/v1",
        "admin_key": "admin-key-s3cret",
    }
    old = os.umask(0)  # the most permissive umask: the mode must not come from it
    try:
        path = write_stack(tmp_path, stack)
    finally:
        os.umask(old)
    assert path == tmp_path / STACK_FILE and stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        write_stack(tmp_path, stack)
    nb = open_notebook("03_turns", model="tiny", run_dir=str(tmp_path), interactive=False)
    assert nb.model == "smollm2" and nb.path == tmp_path  # the runner's model, not the parameter's default
    assert nb._stack == stack  # noqa: SLF001 - what it will connect to on first use (nothing started yet)
    alone = open_notebook("03_turns", model="tiny", run_dir=str(tmp_path / "alone"), interactive=False)
    assert alone.model == "tiny" and alone._stack is None  # noqa: SLF001 - no runner: it starts its own


# --- the command's progress and failure report, on tiny notebooks (papermill and a real kernel; the
# engine and proxy are stand-ins: what is checked here is what the command says, not what they serve)

_CONTEXT_PARAMS = 'model = "tiny"\nrun_dir = ""\ninteractive = True\n'


def _tiny_notebook(path: Path, *cells: str, params: str = "") -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(params + _CONTEXT_PARAMS)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# a tiny notebook"), params]
    nb.cells += [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


class _TTY:
    """A stderr that says it is a terminal (what a user at a shell has) and keeps what is written."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


@pytest.fixture
def tiny_notebooks(tmp_path, monkeypatch):
    """03_turns runs fine; 04_reward stops in a cell that raises NotebookError on purpose, the way a
    notebook says that a stage has nothing to show."""
    import contextlib
    from types import SimpleNamespace

    import workbench.cli.commands
    import workbench.cli.notebooks as notebooks

    src = tmp_path / "src"
    src.mkdir()
    _tiny_notebook(
        src / "03_turns.ipynb",
        "print('turns derived')",
        # what a notebook sees of the runner's stack while it runs: its file, the user's alone
        "import os, stat\nprint('stack mode', oct(stat.S_IMODE(os.stat(os.path.join(run_dir, 'stack.json')).st_mode)))",
    )
    _tiny_notebook(
        src / "04_reward.ipynb",
        "print('reward')",
        "# Grade the captured solution\nfrom workbench.cli import NotebookError\n"
        "raise NotebookError('no solution to grade:\\nall 3 rollouts crashed (bwrap: Permission denied)')",
        params='task = "easy/3"\n',  # what the "small" set passes to 04_reward
    )

    @contextlib.contextmanager
    def stack(model):
        engine = SimpleNamespace(url="http://127.0.0.1:1/v1", served_name=model, api_key="engine-key-s3cret")
        yield engine, SimpleNamespace(url="http://127.0.0.1:2/v1", admin_key="admin-key-s3cret"), None

    monkeypatch.setattr(notebooks, "local_stack", stack)
    monkeypatch.setattr(notebooks, "_notebook_path", lambda name: src / f"{name}.ipynb")
    monkeypatch.setattr(workbench.cli.commands, "unwind_on_signals", lambda: None)  # pytest keeps its own handlers
    return tmp_path / "run"


def _cli(*argv: str) -> int:
    from workbench.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    return exit_.value.code


def test_notebooks_run_reports_each_notebook_and_where_the_copies_are(tiny_notebooks, capsys, monkeypatch):
    tty = _TTY()
    monkeypatch.setattr(sys, "stderr", tty)
    code = _cli("notebooks", "run", "--params", "small", "--only", "03_turns", "--out", str(tiny_notebooks))
    out = capsys.readouterr().out
    assert code == 0, (out, tty.text)
    lines = out.splitlines()
    start = lines.index("[1/1] 03_turns: running ...")
    assert re.fullmatch(r"\[1/1\] 03_turns: ok in \d+\.\d s", lines[start + 1]), lines
    # the last line: where the executed copies are, and the command that opens them here
    assert str(tiny_notebooks) in lines[-1] and lines[-1].endswith(f"-m jupyter lab {tiny_notebooks}"), lines[-1]
    assert (tiny_notebooks / "03_turns.ipynb").exists()
    # on a terminal, papermill's per-cell bar, named after the notebook
    assert "03_turns:" in tty.text and "cell" in tty.text, tty.text
    text = (tiny_notebooks / "03_turns.ipynb").read_text()
    assert "stack mode 0o600" in text  # the stack file was there for the notebook, 0600
    assert "s3cret" not in text and not (tiny_notebooks / "stack.json").exists()  # no key stays behind


def test_a_failing_cell_fails_the_command_naming_notebook_cell_and_reason(tiny_notebooks, capfd):
    only = ["--only", "03_turns", "--only", "04_reward"]
    code = _cli("notebooks", "run", "--params", "small", *only, "--out", str(tiny_notebooks))
    out, err = capfd.readouterr()  # the kernels' stderr too (a subprocess writes to the fd)
    assert code == 1, (out, err)
    assert "[1/2] 03_turns: ok in" in out, err
    failed = [line for line in out.splitlines() if line.startswith("[2/2] 04_reward: FAILED")]
    assert len(failed) == 1, out
    # the cell: its index in the committed notebook, and "In [4]" as the executed copy shows it
    index = int(re.search(r" in cell (\d+) \(In \[4\]: ", failed[0]).group(1))
    source = json.loads((tiny_notebooks.parent / "src" / "04_reward.ipynb").read_text())
    assert "".join(source["cells"][index]["source"]).startswith("# Grade the captured solution")
    executed = json.loads((tiny_notebooks / "04_reward.ipynb").read_text())
    in4 = [c for c in executed["cells"] if c.get("execution_count") == 4]
    assert len(in4) == 1 and "".join(in4[0]["source"]).startswith("# Grade the captured solution")
    cell = f"cell {index} (In [4]: # Grade the captured solution)"
    assert failed[0].endswith(f"in {cell}: NotebookError: all 3 rollouts crashed (bwrap: Permission denied)"), failed
    # the error the command exits with: notebook, cell, the whole reason, the copy to read
    reason = "NotebookError: no solution to grade:\n"
    assert f"workbench notebooks: error: 04_reward.ipynb failed in {cell}: {reason}" in err
    assert "all 3 rollouts crashed (bwrap: Permission denied)" in err
    assert str(tiny_notebooks / "04_reward.ipynb") in err
    assert "jupyter lab" not in out  # no success line
    # not a terminal here (captured): no progress bar
    assert "03_turns:" not in err and "%|" not in err and "cell/s" not in err, err
    assert "[IPKernelApp] WARNING" not in err, err  # nor the kernel's warnings between the lines
    assert "s3cret" not in (tiny_notebooks / "04_reward.ipynb").read_text()
    assert not (tiny_notebooks / "stack.json").exists()  # removed though a notebook failed

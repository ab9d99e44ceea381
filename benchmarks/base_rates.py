"""Where a model can learn: its base solve rates through the real opencode on each task collection.

    .venv/bin/python benchmarks/base_rates.py --model qwen-coder \\
        --sets 'easy-eval[:8]:2,humaneval[:16]:2,deepcoder-fixture:2,repo-tasks:2'

Each set is ``SPEC:N`` (N rollouts per task), evaluated with `workbench.evaluate.run.run_eval` as a newcomer's
``workbench eval --model M --tasks SPEC --n N`` would (the model's own tool-call parser and prompting), one
engine and proxy for all sets. Per set: solve rate with its Wilson interval over rollouts (anti-conservative:
rollouts of one task share its difficulty) and the clustered one over tasks (the one to quote), tool-call and
solution-written rates, per-task pass counts (what a difficulty filter reads: strictly between 0 and N), wall
time. Eval folders stay under runs/; writes benchmarks/results/base_rates/<date>_<host>.json (run_file.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def parse_sets(text: str) -> list[tuple[str, int]]:
    sets = []
    for item in text.split(","):
        spec, _, n = item.strip().rpartition(":")
        if not spec or not n.isdigit() or int(n) < 1:
            raise ValueError(f"--sets item {item!r}: expected SPEC:N with N >= 1")
        sets.append((spec, int(n)))
    return sets


def main() -> None:
    from run_file import host, new_run_file

    from workbench.engine import EngineConfig, local_stack
    from workbench.evaluate import EvalConfig, run_eval

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen-coder")
    ap.add_argument("--sets", default="easy-eval[:8]:2,humaneval[:16]:2,deepcoder-fixture:2,repo-tasks:2")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    try:
        sets = parse_sets(args.sets)
    except ValueError as exc:
        ap.error(str(exc))
    out = new_run_file("base_rates", args.out)
    result: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": host(), "args": vars(args) | {"out": str(out)}}
    result["sets"] = []
    with local_stack(engine_config=EngineConfig(model=args.model, lora=False)) as (engine, _, client):
        for spec, n in sets:
            config = EvalConfig(
                model=args.model,
                tasks=spec,
                n=n,
                parallel=args.parallel,
                timeout_s=args.timeout_s,
                temperature=args.temperature,
                skip_title_call=True,
            )
            started = time.monotonic()
            ev = run_eval(config, engine=engine, client=client)
            per_task = {t["task_id"]: t for t in ev.get("per_task", [])}
            row = {
                "tasks": spec,
                "n": n,
                "rollouts": ev.get("rollouts"),
                "scored": ev.get("scored"),
                "solve_rate": ev.get("solve_rate"),
                "solve_rate_ci95_wilson": ev.get("solve_rate_ci95"),
                "solve_rate_ci95_clustered": ev.get("solve_rate_ci95_clustered"),
                "tool_call_rate": ev.get("tool_call_rate"),
                "solution_written_rate": ev.get("solution_written_rate"),
                "per_task": per_task,
                "failures": ev.get("failures"),
                "run_dir": ev.get("run_dir"),
                "wall_s": round(time.monotonic() - started, 1),
            }
            result["sets"].append(row)
            out.write_text(json.dumps(result, indent=1) + "\n")
            print(json.dumps({k: v for k, v in row.items() if k != "per_task"}), flush=True)


if __name__ == "__main__":
    main()

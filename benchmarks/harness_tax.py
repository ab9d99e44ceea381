"""The harness tax: a model asked each task directly vs the same model through harnesses, same tasks and settings.

    .venv/bin/python benchmarks/harness_tax.py --model qwen-coder --tasks humaneval-eval \\
        --harnesses opencode --temperatures 1.0 --n 1 --greedy-all humaneval

One engine and proxy for everything. For each temperature: ``workbench eval --harness direct`` and then each
harness on the same tasks (`EvalConfig`: the same temperature, output cap, call cap, prompting, tool parser,
timeout, isolation; at `NEAR_GREEDY` or below one rollout a task), then `workbench.evaluate.harness_tax` per harness: paired
by task, harness minus direct, with a paired bootstrap interval and a sign-flip p. ``--greedy-all SPEC`` also
asks every task of SPEC directly at `NEAR_GREEDY`: the weights' (near-)greedy pass@1, set beside the maker's figure
(Qwen2.5-Coder-0.5B-Instruct, HumanEval 61.6, report's instruct table), so the repack's cost is a number.

Writes benchmarks/results/harness_tax/<date>_<host>.json (`run_file`): args, host, load, every evaluation's
headline (its eval.json stays under runs/, path recorded) and every tax; prints the table as markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# Qwen2.5-Coder technical report (arXiv 2409.12186), instruct models' table: HumanEval pass@1, greedy.
MAKERS_HUMANEVAL = {"qwen-coder": 61.6}
# OpenEnv's sessions refuse temperature 0 ("training sampling requires a finite positive temperature"): near-greedy
NEAR_GREEDY = 0.01
HEADLINE = (
    "harness",
    "temperature",
    "tasks",
    "n",
    "rollouts",
    "scored",
    "infra_failed_rate",
    "solve_rate",
    "solve_rate_ci95_clustered",
    "tool_call_rate",
    "solution_written_rate",
    "mean",
    "ci95",
    "wall_s",
    "run_dir",
)


def _floats(text: str) -> list[float]:
    return [float(t) for t in text.split(",") if t.strip()]


def main() -> None:
    from run_file import host, new_run_file

    from workbench.engine import EngineConfig, local_stack
    from workbench.evaluate import EvalConfig, harness_tax, run_eval

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen-coder")
    ap.add_argument("--tasks", default="humaneval-eval")
    ap.add_argument("--harnesses", default="opencode", help="comma-separated harness names")
    ap.add_argument(
        "--temperatures",
        default="1.0",
        help=f"comma-separated, each > 0; {NEAR_GREEDY} is near-greedy (one rollout a task)",
    )
    ap.add_argument("--n", type=int, default=1, help="rollouts a task at a temperature above 0")
    ap.add_argument("--greedy-all", default=None, help="a task spec asked directly at NEAR_GREEDY as well")
    ap.add_argument("--max-output-tokens", type=int, default=512)
    ap.add_argument("--max-model-calls", type=int, default=8)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    harnesses = [h.strip() for h in args.harnesses.split(",") if h.strip()]
    if "direct" in harnesses or not harnesses:
        ap.error("--harnesses names the harnesses to set beside direct (not direct itself)")
    out = new_run_file("harness_tax", args.out)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "host": host(),
        "args": vars(args) | {"out": str(out)},
        "evaluations": [],
        "taxes": [],
    }

    def save() -> None:
        out.write_text(json.dumps(result, indent=1) + "\n")

    def evaluate(engine: Any, client: Any, harness: str, temperature: float, tasks: str) -> dict[str, Any]:
        config = EvalConfig(
            model=args.model,
            tasks=tasks,
            harness=harness,
            temperature=temperature,
            n=1 if temperature <= NEAR_GREEDY else args.n,
            max_output_tokens=args.max_output_tokens,
            max_model_calls=args.max_model_calls,
            timeout_s=args.timeout_s,
            parallel=args.parallel,
            skip_title_call=True,
        )
        load = os.getloadavg()[0]
        ev = run_eval(config, engine=engine, client=client)
        head = {k: ev.get(k) for k in HEADLINE} | {
            "load_before": round(load, 2),
            "load_after": round(os.getloadavg()[0], 2),
        }
        result["evaluations"].append(head)
        save()
        print(json.dumps(head), flush=True)
        return ev

    with local_stack(engine_config=EngineConfig(model=args.model, lora=False)) as (engine, _, client):
        for temperature in _floats(args.temperatures):
            direct = evaluate(engine, client, "direct", temperature, args.tasks)
            for harness in harnesses:
                through = evaluate(engine, client, harness, temperature, args.tasks)
                tax = harness_tax(direct, through)
                result["taxes"].append(
                    {
                        "harness": harness,
                        "temperature": temperature,
                        "tasks": args.tasks,
                        "direct_solve_rate": direct["solve_rate"],
                        "harness_solve_rate": through["solve_rate"],
                        "delta": tax["delta"],
                        "tasks_compared": len(tax["task_ids"]),
                    }
                )
                save()
        if args.greedy_all:
            ev = evaluate(engine, client, "direct", NEAR_GREEDY, args.greedy_all)
            result["greedy_direct"] = {
                "tasks": args.greedy_all,
                "solve_rate": ev["solve_rate"],
                "solve_rate_ci95_clustered": ev["solve_rate_ci95_clustered"],
                "makers_pass_at_1": MAKERS_HUMANEVAL.get(args.model) if args.greedy_all == "humaneval" else None,
            }
            save()
    print(table(result))


def table(result: dict[str, Any]) -> str:
    """The harness-tax table as markdown (what docs/evaluation.md shows)."""
    rows = [
        "| harness | T | tasks | direct solve | harness solve | tax (harness - direct) [95% CI] | p |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in result["taxes"]:
        d = t["delta"]
        rows.append(
            f"| {t['harness']} | {t['temperature']} | {t['tasks']} ({t['tasks_compared']}) | {t['direct_solve_rate']:.3f} "
            f"| {t['harness_solve_rate']:.3f} | {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] | {d['p']:.3g} |"
        )
    g = result.get("greedy_direct")
    if g:
        rows.append(
            f"\ngreedy direct on {g['tasks']}: {g['solve_rate']:.3f} {g['solve_rate_ci95_clustered']}"
            + (f" (maker's pass@1: {g['makers_pass_at_1']}%)" if g.get("makers_pass_at_1") else "")
        )
    return "\n".join(rows)


if __name__ == "__main__":
    main()

"""What the shipped qwen-coder learning run shows, recomputed from its own records: call format, not code.

    .venv/bin/python benchmarks/learning_demo_recheck.py            # reads workbench/data/learning_demo/

From eval.json's rollout records (both comparisons) and metrics.jsonl, with `workbench.evaluate.stats`
(paired bootstrap over tasks, exact sign-flip p):

- ``solve_given_written``: held out, the solve rate among rollouts that wrote solution.py, base vs trained,
  and the paired delta over tasks where both policies wrote it at least once: learning to code would move it;
  learning to call the write tool moves only how often solution.py is written.
- ``base_failures``: held out, how base's failed rollouts ended (no tool call, written but wrong).
- ``pool_without_timeouts``: the training-pool delta with wall-clock timeouts unscored on both sides (two
  base rollouts timed out with the base stage at twice the trained stage's time on a shared host).
- ``zero_variance_groups``: training steps whose 8 rewards were all equal (no advantage, no gradient).

Prints one JSON object; benchmarks/results/learning_demo/recheck.json keeps the committed answer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _by_task(rows: list[dict[str, Any]], value: Any) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in rows:
        v = value(r)
        if v is not None:
            out.setdefault(r["task_id"], []).append(float(v))
    return out


def paired(base: dict[str, list[float]], trained: dict[str, list[float]]) -> dict[str, Any]:
    """Paired by task (tasks with values on both sides): mean difference of per-task means, CI, p."""
    from workbench.evaluate.stats import paired_bootstrap_ci, sign_flip_p

    common = sorted(set(base) & set(trained))
    d = [sum(trained[t]) / len(trained[t]) - sum(base[t]) / len(base[t]) for t in common]
    return {
        "tasks": len(common),
        "delta": round(sum(d) / len(d), 4) if d else None,
        "ci95": [round(x, 4) for x in paired_bootstrap_ci(d)] if d else None,
        "p": sign_flip_p(d) if d else None,
    }


def recheck(folder: Path) -> dict[str, Any]:
    e = json.loads((folder / "eval.json").read_text())
    held = e["rollouts"]
    side = {p: [r for r in held if r["policy"] == p and r["reward"] is not None] for p in ("base", "trained")}
    written = {p: [r for r in side[p] if r["solution_written"]] for p in side}
    solve_given_written = {
        p: {"solved": sum(r["reward"] == 1.0 for r in written[p]), "written": len(written[p])} for p in written
    }
    solve_given_written["paired"] = paired(*(_by_task(written[p], lambda r: r["reward"] == 1.0) for p in written))
    failed = [r for r in side["base"] if r["reward"] != 1.0]
    base_failures = {
        "failed": len(failed),
        "no_tool_call": sum(r["tool_calls"] == 0 for r in failed),
        "written_but_wrong": sum(r["solution_written"] for r in failed),
    }
    pool = e["train_pool"]["rollouts"]

    def pool_rewards(policy: str, drop_timeouts: bool) -> dict[str, list[float]]:
        rows = [r for r in pool if r["policy"] == policy and not (drop_timeouts and r["status"] == "timeout")]
        return _by_task(rows, lambda r: r["reward"])

    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    flat = [m["step"] for m in metrics if m.get("test_rewards") and len(set(m["test_rewards"])) == 1]
    return {
        "source": str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder),
        "model_calls_per_rollout": e["train"].get("max_model_calls"),
        "solve_given_written": solve_given_written,
        "base_failures": base_failures,
        "pool_as_shipped": paired(pool_rewards("base", False), pool_rewards("trained", False)),
        "pool_without_timeouts": paired(pool_rewards("base", True), pool_rewards("trained", True)),
        "pool_timeouts": [[r["policy"], r["task_id"], r["reason"]] for r in pool if r["status"] == "timeout"],
        "zero_variance_groups": {"steps": len(flat), "of": len(metrics), "which": flat},
    }


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "workbench" / "data" / "learning_demo"
    print(json.dumps(recheck(folder), indent=1))

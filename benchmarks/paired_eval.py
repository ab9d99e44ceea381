"""An interleaved base-vs-adapter evaluation (`workbench eval --with-base`), read rate by rate, paired by task.

    .venv/bin/python benchmarks/paired_eval.py runs/he-eval16-n1 [--save]

Reads the run folder's ``base/eval.json`` and ``trained/eval.json`` (every rollout's record) and the rollouts'
summary.json files (agent calls), and reports for each policy and for trained - base, paired by task (one-stage
bootstrap 95% interval over tasks, exact sign-flip p: `workbench.evaluate.stats`): the solve rate (the goal), the
rate of rollouts that wrote solution.py, that made a tool call, agent calls per rollout, the infrastructure's
unscored rollouts, and the solve rate *given solution.py was written* (over the tasks where both policies wrote it at
least once): learning to code moves that one; learning to call the write tool moves only how often it is written.
With ``--save`` the answer goes to ``benchmarks/results/paired_eval/<stamp>_<host>.json`` with the two eval.json files
beside it, so every number recomputes from the committed records.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from learning_demo_recheck import _by_task, paired  # noqa: E402  (the same paired test as the shipped recheck)
from run_file import host, host_slug  # noqa: E402


def _agent_calls(folder: Path) -> dict[str, int]:
    """rollout id -> agent calls answered, from each rollout's summary.json under `folder`."""
    out = {}
    for s in folder.rglob("summary.json"):
        summary = json.loads(s.read_text())
        out[summary["rollout_id"]] = int((summary.get("calls_by_purpose") or {}).get("agent", 0))
    return out


def _side(run: Path, policy: str, blocks: list[str]) -> dict[str, Any]:
    """A policy's evaluation: its eval.json when the run finished, else the records of `blocks` (each interleaved
    block's own eval.json, written as it ends) merged."""
    whole = run / policy / "eval.json"
    if whole.is_file():
        return json.loads(whole.read_text())
    parts = [json.loads((run / policy / b / "eval.json").read_text()) for b in blocks]
    return {
        "tasks": ",".join(p["tasks"] for p in parts),
        "n": parts[0]["n"],
        "records": [r for p in parts for r in p["records"]],
    }


def read(run: Path) -> dict[str, Any]:
    """Both sides; a run still under way is read over the blocks both policies have finished (``complete`` False)."""
    complete = all((run / p / "eval.json").is_file() for p in ("base", "trained"))
    done = {p: {b.parent.name for b in (run / p).glob("block*/eval.json")} for p in ("base", "trained")}
    blocks = sorted(done["base"] & done["trained"])
    sides = {p: _side(run, p, blocks) for p in ("base", "trained")}
    report: dict[str, Any] = {
        "run": str(run),
        "complete": complete,
        "blocks_read": None if complete else blocks,
        "tasks": sides["base"]["tasks"],
        "n": sides["base"]["n"],
    }
    values = {}
    for policy, e in sides.items():
        calls = _agent_calls(run / policy)
        records = e["records"]
        # a record's reward is 0.0 even when the rollout was not scored (an infrastructure stall): `scored` decides
        scored = [r for r in records if r["scored"]]
        for r in scored:
            r["agent_calls"] = calls.get(r["rollout"])
        values[policy] = {
            "solved": _by_task(scored, lambda r: r["reward"] == 1.0),
            "solution_written": _by_task(scored, lambda r: r["solution_written"]),
            "tool_call": _by_task(scored, lambda r: r["tool_calls"] > 0),
            "agent_calls": _by_task(scored, lambda r: r["agent_calls"]),
            "solved_given_written": _by_task(
                [r for r in scored if r["solution_written"]], lambda r: r["reward"] == 1.0
            ),
        }
        report[policy] = {
            "rollouts": len(records),
            "scored": len(scored),
            "unscored": {
                r["status"]: sum(x["status"] == r["status"] for x in records if not x["scored"])
                for r in records
                if not r["scored"]
            },
            "solved": sum(r["reward"] == 1.0 for r in scored),
            "solution_written": sum(r["solution_written"] for r in scored),
            "tool_call": sum(r["tool_calls"] > 0 for r in scored),
            "agent_calls_mean": round(sum(r["agent_calls"] or 0 for r in scored) / len(scored), 3) if scored else None,
        }
    report["trained_minus_base"] = {k: paired(values["base"][k], values["trained"][k]) for k in values["base"]}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a `workbench eval --with-base` run folder")
    parser.add_argument("--save", action="store_true", help="write the answer and both eval.json under results/")
    args = parser.parse_args()
    report = {"host": host(), **read(args.run)}
    if args.save and not report["complete"]:
        parser.error(f"{args.run} is still under way: --save keeps only a finished evaluation (read it without --save)")
    print(json.dumps(report, indent=1))
    if args.save:
        out = ROOT / "benchmarks" / "results" / "paired_eval" / f"{time.strftime('%Y-%m-%dT%H%M%S')}_{host_slug()}"
        out.mkdir(parents=True)
        for policy in ("base", "trained"):
            shutil.copy(args.run / policy / "eval.json", out / f"{policy}.eval.json")
        (out / "paired.json").write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()

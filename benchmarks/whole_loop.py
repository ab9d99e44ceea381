"""The whole loop, rollout by rollout: what each multi-call rollout of a GRPO run did, and which turns carried its
advantage under each turn policy.

Reads a run folder's recorded rollouts (``grpo/rollouts/step-*/GG-RR_task/{summary,trace}.json``, and
``grpo/metrics.jsonl`` for the rewards each step trained on) and writes one results file per run
(``benchmarks/results/whole_loop/<date>_<host>.json``). Per rollout: agent calls, the tool calls the model asked for
and the ones the harness executed, runs of its own code (a bash call whose command runs python or pytest), whether
solution.py was written, the hidden-test reward, rows and forks (each fork's cause, diagnosed with the model's
tokenizer: `workbench.turns.drift`), the harness's wall time, and why a written solution.py did not pass
(`why_unsolved`, from the grader's verify.json). Per step: the fraction of groups whose rewards were all
equal (no gradient). And the turn-policy comparison (``TrainConfig.train_turns``): for the rollouts whose
advantage was negative (training reward below their group's mean), the sampled tokens that carry the loss under
``tool_calls`` and under ``all``, and how many such rollouts ``tool_calls`` leaves with nothing trained. It is
measured on the same recorded rollouts, so it says what each policy trains, not what each would have learned.

    .venv/bin/python benchmarks/whole_loop.py runs/he-loop --model qwen-coder
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file

from run_file import host, new_run_file
from workbench.turns import analyse, load_trace, mask_policy

# a bash command that runs the agent's own code (python, python3, pytest, python -m ...)
_RUNS_CODE = re.compile(r"\b(python3?|pytest)\b")


def own_code_runs(calls: list[dict[str, Any]]) -> int:
    """Bash tool calls the model asked for whose command runs python or pytest."""
    n = 0
    for c in calls:
        if c.get("purpose") != "agent" or c.get("status") != "ok":
            continue
        for call in (c["response"]["choices"][0].get("message") or {}).get("tool_calls") or []:
            fn = call.get("function") or {}
            if fn.get("name") != "bash":
                continue
            try:
                command = str(json.loads(fn.get("arguments") or "{}").get("command", ""))
            except (json.JSONDecodeError, AttributeError):
                continue
            n += bool(_RUNS_CODE.search(command))
    return n


# an exception's name in a grader's reason ("NameError: name 'List' is not defined" -> NameError)
_EXCEPTION = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Exit|Interrupt))\b")
_QUOTED = re.compile(r"'[^']*'")  # a task's own names in a reason: "defines no function 'f'" counts once over tasks


def why_unsolved(verify: dict[str, Any] | None) -> str | None:
    """Why a graded solution.py did not pass every hidden test, in a few words; None when it did or there is none.

    ``partial`` (some tests passed), ``timeout``, ``wrong`` (ran, answered wrongly: an assertion or a failed unittest),
    ``crash: <the exception>`` or ``crash: <the grader's reason>`` (it did not run: a syntax error, a missing import, no
    function of the expected name), from the grader's per-test outcomes (the commonest outcome of the failing tests)."""
    if not verify or not verify.get("total") or verify.get("passed") == verify.get("total"):
        return None
    tests = [t for t in verify.get("tests") or () if t.get("outcome") != "passed"]
    if not tests or any(t.get("outcome") == "missing_file" for t in tests):
        return None
    if verify.get("passed"):
        return "partial"
    outcome, _ = Counter(t.get("outcome") for t in tests).most_common(1)[0]
    if outcome != "crash":
        return str(outcome)
    reason = next(str(t.get("reason") or "") for t in tests if t.get("outcome") == "crash")
    name = _EXCEPTION.search(reason)
    return f"crash: {name.group(1) if name else _QUOTED.sub('<name>', reason)[:60]}"


def rollout_record(folder: Path, tokenizer: Any) -> dict[str, Any]:
    """One rollout's line of the report (see the module docstring)."""
    summary = json.loads((folder / "summary.json").read_text())
    trace = folder / "trace.json"
    calls = load_trace(trace) if trace.is_file() else []
    by_policy = {name: analyse(calls, tokenizer, mask_policy(name)) for name in ("tool_calls", "all")}
    every = by_policy["all"]
    verify = folder / "verify.json"
    return {
        "rollout": folder.name,
        "task_id": summary.get("task_id"),
        "status": summary.get("status"),
        "agent_calls": (summary.get("calls_by_purpose") or {}).get("agent", 0),
        "tool_calls_asked": sum((summary.get("tool_calls") or {}).values()),
        "tool_calls_executed": sum((summary.get("harness_tool_calls") or {}).values()),
        "tools": summary.get("harness_tool_calls") or {},
        "own_code_runs": own_code_runs(calls),
        "solution_written": bool(summary.get("solution_written")),
        "test_reward": summary.get("reward"),
        "why_unsolved": why_unsolved(json.loads(verify.read_text())) if verify.is_file() else None,
        "rows": len(every.rows),
        "forks": len(every.forks),
        "fork_causes": dict(Counter(f.cause for f in every.forks)),
        "sampled_tokens": summary.get("sampled_tokens", 0),
        "trained_tokens": {name: sum(r.n_trained for r in a.rows) for name, a in by_policy.items()},
        "harness_s": (summary.get("timings") or {}).get("harness_s"),
    }


def report(run: Path, tokenizer: Any) -> dict[str, Any]:
    """The report of run folder `run` (a learning run's or a ``workbench train`` run's)."""
    grpo = run / "grpo" if (run / "grpo").is_dir() else run
    metrics = {m["step"]: m for m in map(json.loads, (grpo / "metrics.jsonl").read_text().splitlines()) if "step" in m}
    steps, rollouts = [], []
    for step_dir in sorted((grpo / "rollouts").glob("step-*")):
        step = int(step_dir.name.split("-")[1])
        if step not in metrics:  # a step that did not finish: its rollouts trained nothing
            continue
        folders = sorted(p for p in step_dir.iterdir() if (p / "summary.json").is_file())
        rewards = metrics[step].get("rewards") or []
        if len(rewards) != len(folders):
            raise ValueError(f"{step_dir}: {len(folders)} rollouts but {len(rewards)} rewards in metrics.jsonl")
        groups: dict[str, list[int]] = {}
        for i, folder in enumerate(folders):
            groups.setdefault(folder.name.split("-")[0], []).append(i)
        for members in groups.values():
            scored = [rewards[i] for i in members if rewards[i] is not None]
            mean = statistics.fmean(scored) if scored else 0.0
            for i in members:
                rec = rollout_record(folders[i], tokenizer)
                r = rewards[i]
                rec.update(step=step, train_reward=r, advantage_sign=0 if r is None else (r > mean) - (r < mean))
                rollouts.append(rec)
        steps.append(
            {
                "step": step,
                "zero_variance_groups": sum(
                    len({rewards[i] for i in m if rewards[i] is not None}) <= 1 for m in groups.values()
                )
                / len(groups),
                "write_credit": metrics[step].get("write_credit", 0.0),
                "step_s": metrics[step].get("step_s"),
            }
        )
    negative = [r for r in rollouts if r["advantage_sign"] < 0]
    coverage = {
        name: {
            "negative_rollouts": len(negative),
            "their_sampled_tokens": sum(r["sampled_tokens"] for r in negative),
            "trained_tokens": sum(r["trained_tokens"][name] for r in negative),
            "rollouts_with_nothing_trained": sum(1 for r in negative if r["trained_tokens"][name] == 0),
        }
        for name in ("tool_calls", "all")
    }
    causes: Counter[str] = Counter()
    for r in rollouts:
        causes.update(r["fork_causes"])

    def dist(key: str) -> dict[str, float]:
        values = [r[key] for r in rollouts if r[key] is not None]
        return {"mean": round(statistics.fmean(values), 3), "max": max(values)} if values else {}

    return {
        "run": str(run),
        "steps": steps,
        "rollouts": rollouts,
        "totals": {
            "rollouts": len(rollouts),
            **{k: dist(k) for k in ("agent_calls", "tool_calls_executed", "own_code_runs", "rows", "harness_s")},
            "with_6_or_more_calls": sum(r["agent_calls"] >= 6 for r in rollouts),
            "forks": sum(r["forks"] for r in rollouts),
            "fork_causes": dict(causes),
            "solution_written": sum(r["solution_written"] for r in rollouts),
            "solved": sum((r["test_reward"] or 0) >= 1.0 for r in rollouts),
            "why_written_unsolved": dict(Counter(r["why_unsolved"] for r in rollouts if r["why_unsolved"])),
            "zero_variance_groups_mean": round(statistics.fmean(s["zero_variance_groups"] for s in steps), 3)
            if steps
            else None,
        },
        "turn_policy": coverage,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a run folder (a learning run's, or its grpo/)")
    ap.add_argument("--model", default="qwen-coder", help="the model asset whose tokenizer diagnoses the forks")
    ap.add_argument("--out", type=Path, default=None, help="results file (default: a new one per run)")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from workbench.engine import load_asset

    tokenizer = AutoTokenizer.from_pretrained(load_asset(args.model).path)
    result = {"host": host(), "model": args.model, **report(args.run, tokenizer)}
    path = new_run_file("whole_loop", args.out)
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps({"totals": result["totals"], "turn_policy": result["turn_policy"]}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

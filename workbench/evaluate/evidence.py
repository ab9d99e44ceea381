"""The learning experiment's evidence: paired rate deltas, what ships in the package, what notebook 05 loads.

    ship(evidence, Path("runs/x"))      # -> workbench/data/learning_demo/{metrics.jsonl, adapter/, eval.json, rollouts/}
    metrics, evidence, line = load_shipped()         # the shipped run, offline (notebook 05)
    rows, line = load_harness_tax()                  # the shipped harness-tax table (notebook 05)

`workbench.evaluate.learn` runs the experiment and re-exports these.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from workbench.evaluate.stats import paired_bootstrap_ci, sign_flip_p
from workbench.runs import RunDir
from workbench.paths import DATA

__all__ = [
    "SHIPPED",
    "HARNESS_TAX",
    "headline",
    "rate_delta",
    "example_pair",
    "ship",
    "load_shipped",
    "load_harness_tax",
]

SHIPPED = DATA / "learning_demo"
# benchmarks/harness_tax.py's measured table, as shipped (tests/test_evaluate.py checks it against its results file)
HARNESS_TAX = DATA / "harness_tax.json"


def headline(e: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "mean",
        "ci95",
        "solve_rate",
        "solve_rate_ci95",
        "tool_call_rate",
        "tool_call_rate_ci95",
        "solution_written_rate",
        "solution_written_rate_ci95",
        "n",
        "rollouts",
        "scored",
        "failures",
        "wall_s",
        "policy",
    )
    return {k: e.get(k) for k in keys}


def rate_delta(base: dict[str, Any], trained: dict[str, Any], seed: int, rate: str = "solve") -> dict[str, Any]:
    """The paired test of `compare` on each task's solve fraction (``rate="solve"``: the goal is about solving) or
    on another per-task rate of eval.json (``"solution_written_rate"``, ``"tool_call_rate"``)."""
    import numpy as np

    def per_task(e: dict[str, Any]) -> dict[str, float]:
        if rate == "solve":
            return {t["task_id"]: t["solved"] / t["scored"] for t in e["per_task"] if t["scored"]}
        return {t["task_id"]: t[rate] for t in e["per_task"] if t["scored"] and t.get(rate) is not None}

    a, b = per_task(base), per_task(trained)
    d = np.array([b[t] - a[t] for t in a if t in b])
    diffs: list[float] = d.tolist()
    return {
        "mean": float(d.mean()),
        "ci95": list(paired_bootstrap_ci(diffs, seed=seed)),
        "p": sign_flip_p(diffs, seed=seed),
    }


def example_pair(run_dir: Path) -> tuple[Path, Path] | None:
    """Two held-out evaluation rollouts of the same task, base and trained, for the diff and Δlogprob
    views: the task where the trained policy gained most (first such task, first rollouts of each)."""

    def by_task(folder: Path) -> dict[str, list[Path]]:
        out: dict[str, list[Path]] = {}
        for summary in sorted(folder.glob("block*/rollouts/*/summary.json")):  # `run_paired`'s blocks
            s = json.loads(summary.read_text())
            if s.get("status") == "ok" and (summary.parent / "trace.json").exists():
                out.setdefault(s["task_id"], []).append(summary.parent)
        return out

    base, trained = by_task(run_dir / "eval-held-out" / "base"), by_task(run_dir / "eval-held-out" / "trained")

    def reward(p: Path) -> float:
        return json.loads((p / "summary.json").read_text()).get("reward") or 0.0

    common = [t for t in base if t in trained]
    if not common:
        return None
    best = max(common, key=lambda t: max(map(reward, trained[t])) - min(map(reward, base[t])))
    return min(base[best], key=reward), max(trained[best], key=reward)


def ship(evidence: dict[str, Any], run_dir: Path, *, to: Path = SHIPPED) -> Path:
    """Copy the run's training metrics, final adapter and eval.json into the package (what notebook 05
    shows and `workbench eval --adapter` re-evaluates), with one base and one trained held-out rollout
    of the same task (trace, task, summary: no held-out tests) for the diff and Δlogprob views."""
    run_dir = Path(run_dir)
    for side in ("base_eval", "trained_eval", "base_pool_eval", "trained_pool_eval"):
        if side.endswith("pool_eval") and "pool" not in evidence:
            continue  # a run without a probe has no pool evaluations
        e = evidence.get(side) or {}
        if not e.get("scored") or e["scored"] < e.get("rollouts", 0) / 2:
            # A broken run (every rollout crashed) once replaced the shipped evidence with zeros.
            raise ValueError(
                f"not shipping {run_dir}: {side} scored {e.get('scored')} of {e.get('rollouts')} "
                f"rollouts (failures: {e.get('failures')})"
            )
    if to.exists():
        shutil.rmtree(to)
    to.mkdir(parents=True)
    shutil.copyfile(run_dir / "grpo" / "metrics.jsonl", to / "metrics.jsonl")
    shutil.copytree(run_dir / "grpo" / "adapters" / "final", to / "adapter")
    (to / "eval.json").write_text(json.dumps({k: v for k, v in evidence.items() if k != "run_dir"}, indent=1))
    pair = example_pair(run_dir)
    for name, folder in zip(("base", "trained"), pair or ()):
        (to / "rollouts" / name).mkdir(parents=True)
        for f in ("trace.json", "task.json", "summary.json"):
            shutil.copyfile(folder / f, to / "rollouts" / name / f)
    return to


def load_shipped(folder: Path = SHIPPED) -> tuple[list[dict[str, Any]], dict[str, Any] | None, str]:
    """What notebook 05 shows offline: the shipped run's training metrics, its held-out comparison (``None``
    when what ships is not one: the folder's README says what it is) and a line saying which."""
    metrics = RunDir.open(folder).read_metrics() if (folder / "metrics.jsonl").exists() else []
    evidence = json.loads((folder / "eval.json").read_text()) if (folder / "eval.json").exists() else {}
    if {"base", "trained", "delta"} <= set(evidence):
        d, s = evidence["delta"], evidence.get("solve_delta")
        line = f"held-out {evidence.get('tasks')}: mean reward delta {_fmt(d)}" + (
            f"; solve rate {_fmt(s)}" if s else ""
        )
        if "train_pool_solve_delta" in evidence:
            line = (
                f"training pool ({len(evidence['pool']['task_ids'])} tasks): solve rate "
                f"{_fmt(evidence['train_pool_solve_delta'])}; " + line
            )
        return metrics, evidence, f"{evidence.get('model')}: {line}"
    return (
        metrics,
        None,
        (
            "no held-out comparison ships yet: these are the metrics of an earlier 5-step run (4 tasks, "
            "group 4; its before/after evaluation of 8 rollouts each was noise). "
            "docs/training.md 'Does it learn?' says why, and what was measured instead."
        ),
    )


def _fmt(d: dict[str, Any]) -> str:
    return f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}], p={d['p']:.3g}"


def load_harness_tax(path: Path = HARNESS_TAX) -> tuple[list[dict[str, Any]], str]:
    """The shipped harness tax as table rows (direct, then each harness with its paired delta against direct) and a
    line saying what was measured, where and how to reproduce it."""
    shipped = json.loads(path.read_text())
    taxes = {(t["harness"], t["temperature"]): t for t in shipped["taxes"]}

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    rows = []
    for e in shipped["evaluations"]:
        ci = e.get("solve_rate_ci95_clustered") or [None, None]
        tax = taxes.get((e["harness"], e["temperature"]))
        rows.append(
            {
                "asked": "directly (one completion)" if e["harness"] == "direct" else f"through {e['harness']}",
                "T": e["temperature"],
                "solved": f"{pct(e['solve_rate'])} [{pct(ci[0])}, {pct(ci[1])}]",
                "tool call rate": pct(e["tool_call_rate"]),
                "solution.py written": pct(e["solution_written_rate"]),
                "vs direct, paired by task": (
                    f"{tax['delta']['mean']:+.3f} [{tax['delta']['ci95'][0]:+.3f}, {tax['delta']['ci95'][1]:+.3f}], "
                    f"p {tax['delta']['p']:.4f}"
                    if tax
                    else ""
                ),
                "rollouts": f"{e['scored']}/{e['rollouts']} scored",
            }
        )
    g = shipped["near_greedy_direct"]
    line = (
        f"{shipped['what']}; host {shipped['host']['host']} ({shipped['host']['cpu']}); near-greedy (T {g['temperature']}) "
        f"direct: {g['solve_rate']:.3f} [{g['solve_rate_ci95_clustered'][0]:.3f}, {g['solve_rate_ci95_clustered'][1]:.3f}]"
        f"; reproduce: {shipped['command']} "
        f"({shipped['source']})"
    )
    return rows, line

"""From an evaluation's rollout records to eval.json's numbers (`aggregate`), and two evaluations compared
by task (`compare`).

Pure functions of plain dicts, no engine or sandbox: `workbench.evaluate.run.run_eval` makes one record per rollout
and calls `aggregate`; `compare` takes two eval.json dicts (just returned, or read back from run folders) and
keeps every rollout record of both in its ``rollouts`` list (policy, task, sample index, status, reason, reward,
tool calls, solution written: ~180 bytes each as `workbench.evaluate.learn.ship` writes them, 23 KB for 64 + 64), so each
rate and interval it and `aggregate` report can be recomputed from the file alone (``intervals`` names the method
of each; tests/test_evaluate.py recomputes them).
Which number is which is in `workbench.evaluate.run`'s docstring; the interval arithmetic is `workbench.evaluate.stats`'s.
`harness_tax` is `compare` of the direct baseline with a harness (the one setting allowed to differ).
`workbench.evaluate.run` re-exports `compare`, so ``from workbench.evaluate import compare`` stays the usual import.

    from workbench.evaluate.report import aggregate, compare
    record = {"task_id": "easy/13", "status": "ok", "reward": 1.0, "tool_calls": 2, "solution_written": True}
    aggregate([record], seed=0, task_ids=["easy/13"])["solve_rate"]     # 1.0
    compare(json.loads(Path("base/eval.json").read_text()), json.loads(Path("tuned/eval.json").read_text()))["delta"]
"""

from __future__ import annotations

from typing import Any

from workbench.evaluate.stats import (
    RESAMPLES,
    bootstrap_ci,
    cluster_bootstrap_ci,
    paired_bootstrap_ci,
    sign_flip_p,
    wilson,
)

__all__ = ["aggregate", "compare", "harness_tax", "check_settings", "SETTINGS", "RATES", "ROLLOUT_FIELDS", "INTERVALS"]

# What an evaluation measured under (eval.json's ``settings``, as resolved for its model): two evaluations are
# compared only when all of these are equal; the policy (adapter) and how it is served (lora or merged) may
# differ, and for a harness's tax the harness does.
SETTINGS = (
    "harness",
    "temperature",
    "max_model_calls",
    "max_output_tokens",
    "few_shot",
    "agent_prompt",
    "tool_parser",
    "timeout_s",
    "isolation",
    "skip_title_call",
    "verifier",
)

# eval.json's rates: name -> the per-rollout flag it counts among scored rollouts
RATES = {"solve_rate": "solved", "tool_call_rate": "used_tools", "solution_written_rate": "solution_written"}
# what a comparison keeps of each rollout (with "policy": base or trained)
ROLLOUT_FIELDS = ("task_id", "sample", "status", "reason", "reward", "tool_calls", "solution_written")
# which interval each key holds (written into eval.json and the comparison as ``intervals``)
INTERVALS = {
    "ci95": "mean reward over tasks: two-stage percentile bootstrap (tasks, then each drawn task's rollouts)",
    "<rate>_ci95": "Wilson over the scored rollouts taken as independent: anti-conservative (a task's rollouts are "
    "clustered); kept for comparison",
    "<rate>_ci95_clustered": "one-stage cluster bootstrap of the pooled rate (tasks drawn with all their rollouts)",
    "base.ci95, trained.ci95": "each side's mean of per-task means: one-stage bootstrap over tasks (the delta's draws)",
    "delta.ci95": "mean of per-task differences: one-stage paired bootstrap over tasks",
    "delta.p": "two-sided paired sign-flip permutation test (exact for <= 16 tasks)",
}


def aggregate(records: list[dict[str, Any]], seed: int, task_ids: list[str]) -> dict[str, Any]:
    """eval.json's numbers from one record per rollout (task_id, status, reward, tool_calls, solution_written):
    counts by status, the rates with Wilson intervals, per-task means and the two-stage bootstrap of the mean
    over `task_ids`. Each record gains ``scored``, ``solved`` and ``used_tools`` (eval.json lists them)."""
    from workbench.rollout import (
        FAILED_STATUSES,
    )  # on first use: it brings workbench.tasks.catalog, which compare never needs

    def count(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
        return {v: sum(r[key] == v for r in rows) for v in sorted({r[key] for r in rows})}

    for r in records:
        r["scored"] = r["status"] not in FAILED_STATUSES and r["reward"] is not None
        r["solved"], r["used_tools"] = r["reward"] == 1.0, r["tool_calls"] > 0
    scored = [r for r in records if r["scored"]]
    out: dict[str, Any] = {
        "rollouts": len(records),
        "scored": len(scored),
        "statuses": count(records, "status"),
        "failures": {
            "unscored": len(records) - len(scored),
            "by_status": count([r for r in records if not r["scored"]], "status"),
        },
        # the infrastructure's failures (FAILED_STATUSES: a stall before any answer, an engine error, ...): unscored
        "infra_failed_rate": sum(r["status"] in FAILED_STATUSES for r in records) / len(records) if records else None,
    }
    for name, key in RATES.items():
        hits = sum(r[key] for r in scored)
        out[name], out[f"{name}_ci95"] = hits / len(scored) if scored else None, list(wilson(hits, len(scored)))
        flags = [[float(r[key]) for r in scored if r["task_id"] == tid] for tid in task_ids]
        out[f"{name}_ci95_clustered"] = list(cluster_bootstrap_ci(flags, seed=seed)) if scored else None
    per_task = []
    for tid in task_ids:
        ok = [r for r in scored if r["task_id"] == tid]
        rewards = [r["reward"] for r in ok]
        per_task.append(
            {
                "task_id": tid,
                "rollouts": sum(r["task_id"] == tid for r in records),
                "scored": len(ok),
                "mean": sum(rewards) / len(ok) if ok else None,
                "solved": sum(r["solved"] for r in ok),
                "tool_call_rate": sum(r["used_tools"] for r in ok) / len(ok) if ok else None,
                "solution_written_rate": sum(r["solution_written"] for r in ok) / len(ok) if ok else None,
                "rewards": rewards,
            }
        )
    groups = [t["rewards"] for t in per_task if t["rewards"]]
    out.update(
        mean=sum(sum(g) / len(g) for g in groups) / len(groups) if groups else None,
        ci95=list(bootstrap_ci(groups, seed=seed)) if groups else None,
        rollout_mean=sum(r["reward"] for r in scored) / len(scored) if scored else None,
        per_task=per_task,
        bootstrap={"method": "two-stage percentile (tasks, then rollouts)", "resamples": RESAMPLES, "seed": seed},
        intervals={k: v for k, v in INTERVALS.items() if not k.startswith(("base", "delta"))},
    )
    return out


def check_settings(a: dict[str, Any], b: dict[str, Any], may_differ: tuple[str, ...] = ()) -> None:
    """Refuse to pair two eval.json dicts measured under different `SETTINGS` (all but `may_differ`), naming
    every field that differs; an evaluation that recorded no settings cannot be paired with anything."""
    if a["model"] != b["model"]:
        raise ValueError(f"cannot compare evaluations of different models: {a['model']!r} vs {b['model']!r}")
    missing = [side for side, e in (("first", a), ("second", b)) if not isinstance(e.get("settings"), dict)]
    if missing:
        raise ValueError(
            f"cannot compare: the {' and '.join(missing)} evaluation records no settings (eval.json written before "
            "they were recorded); evaluate it again"
        )
    differ = [
        f"{k}: {a['settings'].get(k)!r} vs {b['settings'].get(k)!r}"
        for k in SETTINGS
        if k not in may_differ and a["settings"].get(k) != b["settings"].get(k)
    ]
    if differ:
        raise ValueError("cannot compare evaluations made under different settings: " + "; ".join(differ))


def harness_tax(direct: dict[str, Any], through: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A harness's tax on the same tasks: `compare` of the ``direct`` baseline (the model asked once) with the
    same model through a harness, every other setting equal; ``delta`` is through minus direct (a tax is
    negative). ``base``/``trained`` are the direct and the harness sides."""
    if (direct.get("settings") or {}).get("harness") != "direct":
        raise ValueError("the first evaluation of a harness tax must be the direct baseline (--harness direct)")
    out = compare(direct, through, _may_differ=("harness",), **kwargs)
    out["harnesses"] = {"base": "direct", "trained": through["settings"]["harness"]}
    return out


def compare(
    base: dict[str, Any],
    trained: dict[str, Any],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
    permutations: int = 100_000,
    _may_differ: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Paired by task: delta = mean over tasks of (trained task mean - base task mean), with a paired
    bootstrap interval over tasks and a sign-flip permutation p-value. Tasks scored in only one of the
    two evaluations are left out (and listed). Each side also carries its rates with their clustered intervals,
    and ``rollouts`` every rollout record of both (when both evaluations have their ``records``).

    Refused (`check_settings`) unless both were measured under the same `SETTINGS`: only the adapter and the
    serving may differ (`harness_tax` lets the harness differ too)."""
    check_settings(base, trained, _may_differ)
    a = {t["task_id"]: t["mean"] for t in base["per_task"] if t["mean"] is not None}
    b = {t["task_id"]: t["mean"] for t in trained["per_task"] if t["mean"] is not None}
    common = [t for t in a if t in b]
    if not common:
        raise ValueError("the two evaluations have no scored task in common")
    import numpy as np

    xa, xb = np.array([a[t] for t in common]), np.array([b[t] for t in common])
    d = xb - xa

    def ci(x: Any) -> dict[str, Any]:  # one seed, so the same task resamples on every side: paired
        return {"mean": float(x.mean()), "ci95": list(paired_bootstrap_ci(x, resamples=resamples, seed=seed))}

    def side(e: dict[str, Any], x: Any) -> dict[str, Any]:
        rates = {k: e[k] for r in RATES for k in (r, f"{r}_ci95_clustered") if k in e}
        return {**ci(x), **rates, "adapter": e.get("adapter"), "policy": e.get("policy")}

    out = {
        "model": base["model"],
        "tasks": base["tasks"] if base["tasks"] == trained["tasks"] else f"{base['tasks']} | {trained['tasks']}",
        "n": min(base["n"], trained["n"]),
        "n_base": base["n"],
        "n_trained": trained["n"],
        "task_ids": common,
        "tasks_left_out": sorted((set(a) | set(b)) - set(common)),
        "base": side(base, xa),
        "trained": side(trained, xb),
        "delta": {
            **ci(d),
            "p": sign_flip_p(d, permutations=permutations, seed=seed),
            "tasks_better": int((d > 0).sum()),
            "tasks_worse": int((d < 0).sum()),
        },
        "per_task": [{"task_id": t, "base": a[t], "trained": b[t], "delta": b[t] - a[t]} for t in common],
        "settings": base["settings"],
        "bootstrap": {"resamples": resamples, "seed": seed, "permutations": permutations},
        "intervals": INTERVALS,
    }
    if "records" in base and "records" in trained:
        out["rollouts"] = [
            {"policy": policy, **{k: r.get(k) for k in ROLLOUT_FIELDS}}
            for policy, e in (("base", base), ("trained", trained))
            for r in e["records"]
        ]
    return out

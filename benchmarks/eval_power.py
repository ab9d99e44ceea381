"""How often a held-out comparison reaches p < 0.01: power of the paired sign-flip test by rollouts per task.

The learning experiment compares base and trained on 64 held-out tasks, each with ``n`` rollouts per policy, by the
sign-flip test over tasks (`workbench.evaluate.stats.sign_flip_p`). Before choosing ``n`` for a run: simulate it.
Each task gets a solve probability per policy, drawn from a Beta distribution with the given mean and concentration
(small concentration: tasks are mostly all-or-nothing, as on HumanEval, where the base solves few tasks and those
often); each policy's rollouts are Bernoulli draws; a simulated evaluation "meets the goal" when the trained mean is
higher and the test's p < ``alpha``.

    .venv/bin/python benchmarks/eval_power.py                       # the defaults below, ~30 s
    .venv/bin/python benchmarks/eval_power.py --trained 0.1 --n 2,3,4 --sims 1000

Writes ``results/eval_power/<date>_<host>.json`` (`run_file`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from run_file import host, new_run_file  # noqa: E402

from workbench.evaluate.stats import sign_flip_p  # noqa: E402


def power(
    *, tasks: int, n: int, base: float, trained: float, concentration: float, sims: int, alpha: float, seed: int
) -> float:
    """The share of `sims` simulated evaluations whose trained policy is ahead with p < `alpha`."""
    rng = np.random.default_rng(seed)
    met = 0
    for i in range(sims):
        p_base = rng.beta(base * concentration, (1 - base) * concentration, tasks)
        p_trained = rng.beta(trained * concentration, (1 - trained) * concentration, tasks)
        diffs = (rng.binomial(n, p_trained) - rng.binomial(n, p_base)) / n
        moved = diffs[diffs != 0]  # tasks that did not move add nothing to either side of the test
        if len(moved) and moved.mean() > 0 and sign_flip_p(moved, permutations=10_000, seed=i) < alpha:
            met += 1
    return met / sims


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=64, help="held-out tasks (humaneval-eval: 64)")
    parser.add_argument("--n", default="2,3,4", help="rollouts per task and policy, comma-separated")
    parser.add_argument("--base", type=float, default=0.01, help="the base's mean solve rate (1/128 measured)")
    parser.add_argument("--trained", default="0.06,0.1,0.15", help="trained mean solve rates, comma-separated")
    parser.add_argument("--concentration", type=float, default=1.0, help="of the Beta over tasks (small: uneven)")
    parser.add_argument("--sims", type=int, default=300)
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.time()
    rows = [
        {
            "trained": trained,
            "n": int(n),
            "power": power(
                tasks=args.tasks,
                n=int(n),
                base=args.base,
                trained=trained,
                concentration=args.concentration,
                sims=args.sims,
                alpha=args.alpha,
                seed=args.seed,
            ),
        }
        for trained in _floats(args.trained)
        for n in _floats(args.n)
    ]
    for row in rows:
        print(f"trained mean {row['trained']:.2f}  n = {row['n']}  power {row['power']:.2f}")
    path = new_run_file("eval_power")
    path.write_text(
        json.dumps(
            {
                "benchmark": "eval_power",
                "machine": host(),
                "knobs": vars(args),
                "rows": rows,
                "wall_s": time.time() - started,
            },
            indent=1,
        )
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""benchmarks/eval_power.py: the simulated power of the held-out sign-flip test, on its two extremes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from eval_power import power  # noqa: E402


def test_no_difference_never_meets_the_goal_and_a_large_one_always_does():
    same = dict(tasks=64, n=2, concentration=1.0, sims=20, alpha=0.01, seed=0)
    assert power(base=0.01, trained=0.01, **same) <= 0.1  # alpha 0.01, one-sided on top: almost never
    assert power(base=0.01, trained=0.9, **same) == 1.0

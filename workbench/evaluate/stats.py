"""The statistics of an evaluation (pure, numpy only), each a 95% interval unless asked otherwise:

- `wilson`: the Wilson score interval of a proportion, its trials taken as independent. Over an evaluation's
  rollouts that is **anti-conservative**: the N rollouts of one task share its difficulty (clustered), so the
  interval is too narrow. eval.json keeps it (``*_rate_ci95``) beside the clustered one.
- `cluster_bootstrap_ci`: one-stage cluster bootstrap of a pooled rate: tasks drawn with replacement, each with
  all its rollouts (``*_rate_ci95_clustered``: the one to quote for a rate).
- `bootstrap_ci`: two-stage bootstrap of the mean over tasks of each task's mean: tasks, then each drawn task's
  rollouts, with replacement (eval.json's ``ci95`` of the mean reward).
- `paired_bootstrap_ci`: one-stage bootstrap of the mean of paired per-task differences, tasks drawn with
  replacement (a comparison's ``delta``; also each side's per-task means alone, on the same draws).
- `sign_flip_p`: two-sided paired sign-flip permutation p-value of mean difference 0 (exact up to 16 tasks).

`workbench.evaluate.run` reports with these (its docstring says which number is which); they take plain
lists, so they also serve any other table of rewards:

    from workbench.evaluate.stats import bootstrap_ci, cluster_bootstrap_ci, paired_bootstrap_ci, sign_flip_p, wilson
    wilson(16, 20)                                  # (lo, hi) of a proportion, 95%
    cluster_bootstrap_ci([[1, 0, 0, 0], [1, 1, 1, 0]])   # a rate over rollouts clustered by task
    bootstrap_ci([[1.0, 0.0], [0.5, 0.5, 1.0]])     # tasks, then each task's rollouts, with replacement
    paired_bootstrap_ci([0.25, -0.1, 0.5]), sign_flip_p([0.25, -0.1, 0.5])   # one difference per task
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["Z95", "RESAMPLES", "wilson", "cluster_bootstrap_ci", "bootstrap_ci", "paired_bootstrap_ci", "sign_flip_p"]

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
RESAMPLES = 10_000


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion; (0, 1) when there are no trials."""
    if n == 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..{n}, got {successes}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


def cluster_bootstrap_ci(
    groups: Sequence[Sequence[float]], *, resamples: int = RESAMPLES, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of a pooled mean (all values over all groups) by a one-stage cluster bootstrap: groups
    (tasks) drawn with replacement, each with all its values (0/1 per rollout for a rate). Empty groups are dropped.

    Why not `wilson`: rollouts of one task are correlated, and only the task draw carries that."""
    import numpy as np

    groups = [list(g) for g in groups if len(g)]
    if not groups:
        raise ValueError("no values to bootstrap")
    sums = np.array([sum(g) for g in groups], dtype=float)
    lens = np.array([len(g) for g in groups], dtype=float)
    pick = np.random.default_rng(seed).integers(0, len(groups), (resamples, len(groups)))
    stat = sums[pick].sum(-1) / lens[pick].sum(-1)
    lo, hi = np.quantile(stat, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def bootstrap_ci(
    groups: Sequence[Sequence[float]], *, resamples: int = RESAMPLES, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of the mean of group means, by a two-stage bootstrap: groups (tasks) with
    replacement, then each drawn group's values (rollouts) with replacement. Empty groups are dropped."""
    import numpy as np

    groups = [list(g) for g in groups if len(g)]
    if not groups:
        raise ValueError("no values to bootstrap")
    rng, k = np.random.default_rng(seed), len(groups)
    lens = np.array([len(g) for g in groups])
    table = np.zeros((k, lens.max()))  # groups padded to the longest; the padding is never drawn
    for i, g in enumerate(groups):
        table[i, : len(g)] = g
    pick = rng.integers(0, k, (resamples, k))  # stage 1: tasks
    n = lens[pick][..., None]
    pos = (rng.random((resamples, k, lens.max())) * n).astype(int)  # stage 2: rollouts of each drawn task
    used = np.arange(lens.max()) < n
    stat = ((table[pick[..., None], pos] * used).sum(-1) / n[..., 0]).mean(-1)
    lo, hi = np.quantile(stat, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def paired_bootstrap_ci(
    diffs: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of the mean of paired differences (one per task), tasks drawn with replacement."""
    import numpy as np

    d = np.asarray(diffs, dtype=float)
    if not len(d):
        raise ValueError("no differences to bootstrap")
    stat = d[np.random.default_rng(seed).integers(0, len(d), (resamples, len(d)))].mean(-1)
    lo, hi = np.quantile(stat, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def sign_flip_p(diffs: Sequence[float], *, permutations: int = 100_000, seed: int = 0) -> float:
    """Two-sided p-value of a paired sign-flip permutation test of mean difference 0.

    Under the null each task's difference is as likely negated: the p-value is the share of sign
    patterns whose |mean| is at least the observed one. All 2^k patterns when k <= 16 (exact, 65,536 at
    most); otherwise `permutations` random patterns (>= 10,000), p = (hits + 1) / (permutations + 1)."""
    import numpy as np

    if permutations < 10_000:
        raise ValueError(f"permutations must be at least 10,000, got {permutations}")
    d = np.asarray(diffs, dtype=float)
    k = len(d)
    if not k:
        raise ValueError("no differences to test")
    observed = abs(d.mean())
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))  # float sums of the same values in another order
    if k <= 16:
        signs = 1 - 2 * ((np.arange(2**k)[:, None] >> np.arange(k)) & 1)
        return float((np.abs(signs @ d / k) >= observed - tol).mean())
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(permutations, k))
    hits = int((np.abs(signs @ d / k) >= observed - tol).sum())
    return (hits + 1) / (permutations + 1)

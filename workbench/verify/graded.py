"""What grading one held-out test gives: an `Outcome` and a `Graded` record (every test kind's rules return one).

from workbench.verify.graded import Graded
Graded("wrong", "expected 3, got 4")            # score None: 1.0 when passed, else 0.0
Graded("passed", "reward 0.75", score=0.75)     # a test that scores itself (Harbor, a verifier hook)
"""

from __future__ import annotations

from typing import Literal, NamedTuple

__all__ = ["Outcome", "OUTCOMES", "Graded"]

# error: a test that scores itself (Harbor's test.sh, a verifier hook) gave no usable reward.
Outcome = Literal["passed", "wrong", "timeout", "crash", "missing_file", "error"]
OUTCOMES: tuple[Outcome, ...] = ("passed", "wrong", "timeout", "crash", "missing_file", "error")


class Graded(NamedTuple):
    """One test's grade. ``score`` is set by tests that score themselves (in [0, 1]); None means 1.0
    when passed, else 0.0. ``metrics``: the other numbers such a test reported."""

    outcome: Outcome
    reason: str
    score: float | None = None
    metrics: dict[str, float] | None = None

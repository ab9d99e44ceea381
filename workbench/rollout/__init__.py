"""Rollout: one unmodified agent run on one task, through the capture proxy, written as the artefact (notebook 02).

    from workbench.rollout import RolloutConfig, run_rollout
    result = run_rollout(load_task("easy/3"), client, RolloutConfig(harness="opencode"), Path("runs/r0"))
    result.reward, result.status               # graded by the hidden tests; trace.json holds every call

Private modules: ``run`` (`run_rollout`, `run_rollouts`: one or many, in parallel), ``types``
(`RolloutConfig`, `RolloutResult`, what a rollout's status can be), ``session`` (the sandbox, the
harness process and the proxy session of one run, stopped whatever happens), ``cluster`` (`fan_out`: the same
rollouts on the sandbox nodes of a Ray cluster, each node with its own proxy, a dead node's rollouts re-queued).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.rollout.attempts import Attempts, run_attempts
    from workbench.rollout.cluster import Cluster, fan_out, NodeProxy, rollouts_on
    from workbench.rollout.run import nothing_answered, read_summaries, run_rollout, run_rollouts, why_missing
    from workbench.rollout.session import HarnessSession
    from workbench.rollout.types import (
        agent_entries,
        agent_prompt,
        FAILED_STATUSES,
        RolloutConfig,
        RolloutOutcome,
        RolloutResult,
    )

"""The vocabulary of a rollout: its config, its statuses, its result and outcome, and readers of its calls.

What callers build a rollout with and get back, without the machinery that runs one (that is
`workbench.rollout.session` and `workbench.rollout.run`): the trainer, the evaluator and the reward
functions import this alone.

    config = RolloutConfig(timeout_s=120, **agent_prompt("short"))
    if result.status in FAILED_STATUSES: ...     # unscored: the infrastructure failed, not the agent
    entries = agent_entries(calls)               # OpenEnv TraceEntry dicts of the agent's answered calls
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from workbench.capture import REPLICA_DRAINED
from workbench.sandbox import Isolation, SandboxLimits
from workbench.tasks import Task

__all__ = [
    "SHORT_AGENT_PROMPT",
    "SHORT_AGENT_TOOLS",
    "agent_prompt",
    "FinalStatus",
    "Status",
    "STATUSES",
    "FAILED_STATUSES",
    "NOT_THE_AGENTS_4XX",
    "refused_for_the_agents_output",
    "RolloutConfig",
    "RolloutResult",
    "RolloutOutcome",
    "agent_entries",
    "trace_tool_calls",
    "after_capture",
]

# A short agent prompt (opencode's own is ~7.2k tokens; with this one a prompt is ~1.8k). The
# harness is otherwise unchanged: same loop, same tools, same replay.
SHORT_AGENT_PROMPT = "You are a coding agent. Use the tools to complete the task."
SHORT_AGENT_TOOLS = ("bash", "write", "read", "edit")


def agent_prompt(name: str) -> dict[str, Any]:
    """`RolloutConfig` fields for an agent prompt by name: ``default`` (the harness as shipped) or
    ``short`` (`SHORT_AGENT_PROMPT` with `SHORT_AGENT_TOOLS`)."""
    if name == "default":
        return {"system_prompt": None, "tools": None}
    if name == "short":
        return {"system_prompt": SHORT_AGENT_PROMPT, "tools": SHORT_AGENT_TOOLS}
    raise ValueError(f"agent_prompt must be 'default' or 'short', got {name!r}")


# How a rollout ended (summary.json's "status"); a live session is "running" until then.
FinalStatus = Literal[
    "ok",
    "timeout",
    "stalled",
    "limit_exceeded",
    "crashed",
    "harness_error",
    "agent_error",
    "upstream_error",
    "interrupted",
    "setup_failed",
    "verify_error",
    "capture_failed",
    "worker_lost",
    "replica_lost",
]
Status = Literal["running", FinalStatus]
STATUSES: tuple[FinalStatus, ...] = get_args(FinalStatus)
# The rollouts the infrastructure failed, not the agent: unscored (left out of a group's baseline and of an
# evaluation's mean). Everything the agent caused (crashed, timeout, limit_exceeded, agent_error) is scored, 0 where
# nothing passed. ``stalled`` is a wall-clock timeout before any model call was answered: the engine (a loaded
# host) never let the agent act, so it is not the agent's 0 (a timeout after an answer is). ``capture_failed``: a
# model call the proxy answered but could not record (OpenEnv's ``capture_ingest_failed``), so the trace lacks a turn
# the agent acted on and its other turns would take a reward they did not earn alone. ``worker_lost``: the cluster
# node (or its worker) running it died, every time it was re-queued (`workbench.rollout.cluster`). ``replica_lost``:
# a call failed because its engine, one of several behind the proxy, stopped answering and was drained
# (`workbench.capture.watch`); `run_rollouts` runs it again once.
FAILED_STATUSES: tuple[FinalStatus, ...] = (
    "setup_failed",
    "upstream_error",
    "interrupted",
    "verify_error",
    "stalled",
    "capture_failed",
    "worker_lost",
    "replica_lost",
)

# Engine refusals that say nothing about the agent's output: credentials (401, 403), a model or route the
# engine does not serve (404: e.g. a LoRA that never loaded), load (408, 429) and the request size limit
# (413). Any other 4xx on an agent call refuses what the agent wrote (a tool call the chat template cannot
# re-render, arguments that are not JSON): `agent_error`, scored like a crash. 5xx and failures without
# a status (connection, cut stream, a reply that is not JSON) stay `upstream_error`.
NOT_THE_AGENTS_4XX = frozenset({401, 403, 404, 408, 413, 429})


def refused_for_the_agents_output(call: dict[str, Any]) -> bool:
    """Whether a failed call of trace.json is the engine refusing the agent's own output: an agent call
    the engine answered with a 4xx other than `NOT_THE_AGENTS_4XX` (its ``upstream_status``)."""
    status = call.get("upstream_status")
    return (
        call.get("purpose") == "agent"
        and isinstance(status, int)
        and 400 <= status < 500
        and status not in NOT_THE_AGENTS_4XX
    )


@dataclass
class RolloutConfig:
    """Knobs of one rollout (shared by every rollout of a run).

    Attributes:
        harness: which agent to run (``opencode``).
        temperature: pinned by the proxy for every call (also what the trainer scores at).
        max_output_tokens: per-call output cap (harness budget and proxy clamp).
        max_model_calls: the proxy ends the agent's loop after this many calls (0 = unlimited).
        timeout_s: wall-clock limit for the harness process.
        isolation: ``auto`` (bwrap when installed), ``bwrap`` or ``none`` (unsafe: see `workbench.sandbox.session`).
        system_prompt / tools: harness options (None keeps the harness as shipped).
        few_shot: prefix the instruction with two worked tool-call turns in ChatML, in the harness's
            own tool schema (`Harness.few_shot_prompt`): what makes SmolLM2-135M call tools at all.
        context_tokens: the context window the harness is told (drives its compaction).
        stop_on_upstream_error: end the rollout at the first failed engine call instead of letting
            the harness retry for minutes.
        lead_s: in `run_rollouts`, the first rollout of each task starts alone and the task's others
            wait until its first agent call has reached the engine (at most this many seconds; 0: all
            start at once). The engine then holds that prompt in its prefix cache and the followers' identical
            ~3k-token prompts (same harness, same task) are not prefilled again: 8 simultaneous
            SmolLM2 rollouts each prefilled 3,053 + 746 tokens (~116 s of the 2 cores, 12.3 s each
            alone), which put every first call at 210-250 s (benchmarks/group_start.py).
        skip_title_call: give the harness the task id as its session title (opencode's shipped
            ``run --title``), so it makes no title call: one prompt less to prefill and decode per rollout,
            beside its first agent call, never trained. The title call counted against
            `max_model_calls`; without it every call is the agent's.
        tool_parser: the parser the engine reads this rollout's tool calls with (`workbench.engine.Engine.tool_parser`),
            recorded in summary.json so rollouts read by different parsers are never mixed; None: not known (an engine
            started elsewhere).
    """

    harness: str = "opencode"
    temperature: float = 1.0
    max_output_tokens: int = 512
    max_model_calls: int = 12
    timeout_s: float = 300.0
    isolation: Isolation = "auto"
    system_prompt: str | None = None
    tools: tuple[str, ...] | None = None
    few_shot: bool = False
    context_tokens: int = 16384
    stop_on_upstream_error: bool = True
    lead_s: float = 60.0
    skip_title_call: bool = False
    tool_parser: str | None = None
    limits: SandboxLimits = field(default_factory=SandboxLimits)


@dataclass
class RolloutResult:
    """One rollout's record as `run_rollout` returns it (the summary is summary.json's content)."""

    rollout_id: str
    task_id: str
    # A `FinalStatus` when made here; str because `workbench.train.replay` also builds these from recorded
    # summary.json files and marks slots a recording lacks with its own "not_recorded".
    status: str
    reason: str | None
    reward: float | None
    out_dir: Path | None
    summary: dict[str, Any]


@dataclass
class RolloutOutcome:
    """What a reward function sees: the verified result and the rollout's own record."""

    task: Task
    result: RolloutResult
    calls: list[dict[str, Any]]

    @property
    def verified_reward(self) -> float | None:
        return None if self.result.status in FAILED_STATUSES else self.result.reward


def agent_entries(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenEnv `TraceEntry` dicts for the agent calls of a trace (what `fetch_proxy_trace` returns)."""
    entries = []
    for c in calls:
        if c["purpose"] != "agent" or c["status"] != "ok" or c.get("per_token_logps") is None:
            continue
        prompt, out = c["prompt_token_ids"], c["completion_token_ids"]
        entries.append(
            {
                "request": c["request"],
                "response": c["response"],
                "prompt_token_ids": prompt,
                "completion_token_ids": out,
                "per_token_logps": c["per_token_logps"],
                "loss_mask": [0] * len(prompt) + [1] * len(out),
                "metadata": {"node_id": c["node_id"], "turn": c["turn"], "sampling_params": c["sampling_params"]},
            }
        )
    return entries


def workspace_files(task: Task) -> dict[str, str]:
    """The task's starting files, plus visible_tests.txt when the instruction points the agent at it
    (HumanEval and DeepCoder do: it was only ever written to the run folder, not where the agent looks)."""
    files = dict(task.files)
    if task.visible_tests and "visible_tests.txt" in task.instruction and "visible_tests.txt" not in files:
        files["visible_tests.txt"] = task.visible_tests
    return files


def engine_failure(failed: list[dict[str, Any]]) -> tuple[FinalStatus, str]:
    """The status and reason of a rollout whose engine calls `failed` (every one on record; empty when not all
    could be read): ``agent_error`` (scored) when each is the engine refusing the agent's own output
    (`refused_for_the_agents_output`), ``upstream_error`` (unscored) otherwise."""
    if failed and all(refused_for_the_agents_output(c) for c in failed):
        codes = ", ".join(str(s) for s in sorted({c["upstream_status"] for c in failed}))
        return "agent_error", (
            f"the engine refused the agent's own output (HTTP {codes}; see trace.json): {failed[0]['error']}"[:400]
        )
    return "upstream_error", "the engine failed a call (see trace.json)"


def call_counts(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's counts of a rollout's captured calls: all, by purpose and status, the agent turns answered,
    those with a tool call, and the tokens sampled in them."""
    agent = [c for c in calls if c["purpose"] == "agent" and c["status"] == "ok"]
    return {
        "calls": len(calls),
        "calls_by_purpose": {
            p: sum(c["purpose"] == p for c in calls) for p in dict.fromkeys(c["purpose"] for c in calls)
        },
        "calls_by_status": {s: sum(1 for c in calls if c["status"] == s) for s in {c["status"] for c in calls}},
        "agent_turns": len(agent),
        "agent_turns_with_tool_calls": sum(
            1 for c in agent if (c["response"]["choices"][0]["message"] or {}).get("tool_calls")
        ),
        "sampled_tokens": sum(len(c["completion_token_ids"]) for c in agent),
    }


def trace_tool_calls(calls: list[dict[str, Any]]) -> dict[str, int]:
    """Tool calls by name in the agent turns the engine answered (what the model asked for)."""
    counts: dict[str, int] = {}
    for c in calls:
        if c.get("purpose") != "agent" or c.get("status") != "ok":
            continue
        for call in (c["response"]["choices"][0].get("message") or {}).get("tool_calls") or []:
            name = str((call.get("function") or {}).get("name") or "")
            counts[name] = counts.get(name, 0) + 1
    return counts


def after_capture(status: Status, reason: str | None, findings: list[str]) -> tuple[Status, str | None, int]:
    """A finished rollout's status and reason once the capture's findings for its session are read, and how many
    of its calls were answered but not recorded. Such a call (``[FATAL] capture_ingest_failed``) leaves the trace
    without a turn the agent acted on: ``capture_failed``, unscored (a failure already recorded, or an interrupt,
    stays what it is). An engine failure in a session whose engine was drained (`REPLICA_DRAINED`) is
    ``replica_lost``: unscored, and `workbench.rollout.run_rollouts` runs it again."""
    failed = sum("capture_ingest_failed" in f for f in findings)
    if status == "upstream_error" and any(REPLICA_DRAINED in f for f in findings):
        return "replica_lost", f"its engine stopped answering and was drained: {reason}", failed
    if failed and status not in ("setup_failed", "upstream_error", "interrupted"):
        why = f"{failed} model call(s) answered but not recorded (capture_ingest_failed): unscored"
        return "capture_failed", f"{why} (the agent had ended {status}: {reason})", failed
    return status, reason, failed

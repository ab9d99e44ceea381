"""OpenEnv's harness protocols over our rollouts: what TRL's AsyncGRPO loop-owning worker drives.

TRL's `HarnessRolloutWorker(harness_session_factory=..., harness_adapter=None)` calls the factory as
``factory(sampling=...)`` and then, per rollout, ``create(prompt, seed, episode_id)``,
``wait_for_completion()``, ``fetch_training_trace()``, ``verify(...)`` and ``close()``. These classes
put OpenEnv's `ResourceSession`/`ResourceSessionFactory` (and its `TrainingTrace`, `VerifyResult`)
on `workbench.rollout.session.HarnessSession`, with the CPU route's training rules (`workbench.train.grpo`):

- **turn policy**: a turn ``train_turn_fn`` rejects (default `has_tool_call`, TrainConfig.train_turns) keeps
  its tokens as context, loss mask 0 (TRL's chaining then trains only the others);
- **token budget**: a row (turns chained as `workbench.turns.rows.build_rows` chains them, which forks exactly
  where TRL's lossless capture forks) longer than ``token_budget`` gets mask 0 everywhere, so TRL drops it;
- **unscored failures**: `workbench.rollout.types.FAILED_STATUSES` verify to ``env_reward=None`` (left out of the
  group's baseline), never 0;
- **artefacts**: each rollout writes the seed-format folder under ``out_root`` (`HarnessSession.write_artefact`,
  with the rows' counters in summary.json's ``train``), also for a failed set-up (summary.json only).

They live apart because importing OpenEnv's harness package imports its whole env server (gradio, pandas,
fastmcp: ~3,400 modules, 7-10 s here). TRL spawns the worker and pickles its factory, so a factory is built
from a `ProxyAddress` (picklable), not a live `ProxyClient`:

    factory = functools.partial(HarnessSessionFactory, ProxyAddress.of(client), rollout_config,
                                out_root=run / "rollouts", train_turns="tool_calls", token_budget=16384)
    worker = HarnessRolloutWorker(harness_session_factory=factory, harness_adapter=None, ...)
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from openenv.core.harness import ResourceSession, ResourceSessionFactory, TrainingTrace
from openenv.core.harness import VerifyResult as OpenEnvVerifyResult

from workbench.capture import ProxyClient, ProxyError
from workbench.rollout import HarnessSession, FAILED_STATUSES, RolloutConfig, agent_entries
from workbench.sandbox import SandboxError
from workbench.tasks import Task, load_task
from workbench.train.types import TurnPolicy
from workbench.turns import MaskPolicy, all_turns, analyse, has_tool_call, mask_policy

__all__ = ["OpenEnvSession", "HarnessSessionFactory", "ProxyAddress", "all_turns", "turn_policy"]


def turn_policy(train_turns: TurnPolicy) -> MaskPolicy:
    """TrainConfig.train_turns -> the train_turn_fn (`workbench.turns.mask_policy`)."""
    return mask_policy(train_turns)


@dataclass(frozen=True)
class ProxyAddress:
    """A capture proxy's control URL and admin key: what a spawned rollout process needs to reach it (a
    `ProxyClient` holds an open HTTP client, which does not pickle). Never given to a sandbox."""

    url: str
    admin_key: str

    @classmethod
    def of(cls, client: ProxyClient) -> "ProxyAddress":
        # ProxyClient keeps its key only in its HTTP client's headers (workbench.capture.client has no accessor for it).
        return cls(client.url, client._http.headers["Authorization"].removeprefix("Bearer "))

    def client(self) -> ProxyClient:
        return ProxyClient(self.url, self.admin_key)


class OpenEnvSession(HarnessSession, ResourceSession):
    """A `HarnessSession` speaking OpenEnv's `ResourceSession`, `LoopOwningSession` and
    `TrainableSession` protocols, with the training rules above."""

    def __init__(
        self,
        task: Task,
        client: ProxyClient,
        config: RolloutConfig,
        *,
        out_dir: Path | None = None,
        episode_id: str | None = None,
        train_turn_fn: MaskPolicy = has_tool_call,
        token_budget: int | None = None,
    ) -> None:
        self.train_turn_fn, self.token_budget = train_turn_fn, token_budget
        self.train_counts: dict[str, int] = {}
        self._written = self._ready = False
        super().__init__(task, client, config, out_dir=out_dir, episode_id=episode_id)
        self._ready = True

    def fetch_training_trace(self) -> TrainingTrace:
        """The agent turns with OpenEnv's full loss masks: each turn's per-token mask (its producer's: the policy's,
        or a ``loss_mask`` the call carries) in rows that fit the budget; 0 everywhere else."""
        calls = self.calls()
        a = analyse(calls, None, self.train_turn_fn)
        kept = [r for r in a.rows if self.token_budget is None or len(r.input_ids) <= self.token_budget]
        trained = {t for r in kept for t in r.turns if a.turns[t].trained}
        self.train_counts = {
            "turns": len(a.turns),
            "turns_trained": len(trained),
            "rows": len(a.rows),
            "forks": len(a.forks),
            "rows_dropped_budget": len(a.rows) - len(kept),
            "excluded_calls": sum(a.excluded.values()),
        }
        entries = []
        for turn in a.turns:
            for entry in agent_entries([calls[turn.call]]):
                out = turn.output_mask if turn.index in trained else [0] * len(turn.output_ids)  # per token
                entries.append({**entry, "loss_mask": [0] * len(entry["prompt_token_ids"]) + out})
        return TrainingTrace.from_entries(entries)

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.task.instruction}]

    def list_tools(self) -> list:
        return []  # loop-owning: the agent brings and runs its own tools

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        raise NotImplementedError("loop-owning session: the harness runs its own tools")

    def verify(self, transcript: list[dict[str, Any]] | None = None, final_state: Any = None) -> OpenEnvVerifyResult:
        """The hidden-test reward on a copy of the final workspace (the agent is stopped first); None for a
        failure that is not the agent's (FAILED_STATUSES). Writes the artefact folder."""
        r = None
        try:
            r = self.grade()
        except Exception as exc:  # noqa: BLE001 - ours, not the agent's: unscored, and said why (as run_rollout)
            self.status, self.reason = "verify_error", f"verification failed: {type(exc).__name__}: {exc}"[:500]
        reward = None if self.status in FAILED_STATUSES else self.reward
        self._write()
        return OpenEnvVerifyResult(
            env_reward=reward,
            done=True,
            metrics={
                "passed": r.passed if r else 0,
                "total": r.total if r else 0,
                "status": self.status,
                **self.train_counts,
            },
            artifacts={"tests": r.to_json()["tests"] if r else []},
        )

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "train": self.train_counts}

    def _write(self) -> None:
        if self.out_dir is not None and self._ready and not self._written:
            self._written = True
            self.write_artefact(self.out_dir)

    def close(self) -> None:
        """Stop and remove the sandbox; a rollout TRL closes before verifying (its stop) is recorded as
        ``interrupted`` with the trace so far."""
        if self._ready and not self._written and not self._closed:
            if self.status == "running":
                self._end("interrupted", "closed by the trainer before it was verified")
            with contextlib.suppress(OSError, ProxyError):
                self._write()
        super().close()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:60]


class HarnessSessionFactory(ResourceSessionFactory[OpenEnvSession]):
    """OpenEnv session factory over our sandbox + proxy. A prompt is a `Task` or a task spec such as
    ``"humaneval/3"``. Artefacts go to ``out_root/g<seed>-<task>-<episode>/``."""

    def __init__(
        self,
        client: ProxyClient | ProxyAddress,
        config: RolloutConfig,
        *,
        out_root: Path | None = None,
        sampling: dict[str, Any] | None = None,
        train_turns: TurnPolicy = "tool_calls",
        token_budget: int | None = None,
    ) -> None:
        self.client = client.client() if isinstance(client, ProxyAddress) else client
        self.out_root, self.token_budget = out_root, token_budget
        self.train_turn_fn = turn_policy(train_turns)
        # TRL passes its training policy; the proxy pins exactly this temperature for every call.
        self.config = replace(config, temperature=float(sampling["temperature"])) if sampling else replace(config)

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> OpenEnvSession:
        task = task if isinstance(task, Task) else load_task(str(task))
        episode = episode_id or uuid.uuid4().hex[:12]
        out = self.out_root / f"g{seed or 0:05d}-{_slug(task.id)}-{episode[:12]}" if self.out_root else None
        try:
            return OpenEnvSession(
                task,
                self.client,
                self.config,
                out_dir=out,
                episode_id=episode,
                train_turn_fn=self.train_turn_fn,
                token_budget=self.token_budget,
            )
        except (SandboxError, ProxyError, OSError) as exc:  # TRL scores it unscorable; the folder says why
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                out.chmod(0o700)
                (out / "summary.json").write_text(
                    json.dumps(
                        {
                            "rollout_id": episode,
                            "task_id": task.id,
                            "status": "setup_failed",
                            "reason": str(exc),
                            "reward": None,
                            "calls": 0,
                        },
                        indent=1,
                    )
                )
            raise

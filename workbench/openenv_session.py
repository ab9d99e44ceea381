"""OpenEnv's harness protocols over our rollouts: what TRL's AsyncGRPO loop-owning worker drives.

TRL's `HarnessRolloutWorker(harness_session_factory=..., harness_adapter=None)` calls the factory as
``factory(sampling=...)`` and then, per rollout, ``create(prompt, seed, episode_id)``,
``wait_for_completion()``, ``fetch_training_trace()``, ``verify(...)`` and ``close()``. These classes
put OpenEnv's `ResourceSession`/`ResourceSessionFactory` (and its `TrainingTrace`, `VerifyResult`)
on `workbench.rollout.HarnessSession`; they live apart because importing OpenEnv's harness package
imports its whole env server (gradio, pandas, fastmcp: ~3,400 modules, 7-10 s here).

    factory = functools.partial(HarnessSessionFactory, client, rollout_config, out_root=run / "rollouts")
    worker = HarnessRolloutWorker(harness_session_factory=factory, harness_adapter=None, ...)
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from openenv.core.harness import ResourceSession, ResourceSessionFactory, TrainingTrace
from openenv.core.harness import VerifyResult as OpenEnvVerifyResult

from .capture_client import ProxyClient
from .rollout import HarnessSession, RolloutConfig
from .tasks import Task, load_task

__all__ = ["OpenEnvSession", "HarnessSessionFactory"]


class OpenEnvSession(HarnessSession, ResourceSession):
    """A `HarnessSession` speaking OpenEnv's `ResourceSession`, `LoopOwningSession` and
    `TrainableSession` protocols."""

    def fetch_training_trace(self) -> TrainingTrace:
        return TrainingTrace.from_entries(self.fetch_proxy_trace())

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.task.instruction}]

    def list_tools(self) -> list:
        return []  # loop-owning: the agent brings and runs its own tools

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        raise NotImplementedError("loop-owning session: the harness runs its own tools")

    def verify(self, transcript: list[dict[str, Any]] | None = None, final_state: Any = None) -> OpenEnvVerifyResult:
        """The hidden-test reward on a copy of the final workspace (the agent is stopped first)."""
        r = self.grade()
        return OpenEnvVerifyResult(env_reward=self.reward, done=True,
                                   metrics={"passed": r.passed, "total": r.total, "status": self.status},
                                   artifacts={"tests": r.to_json()["tests"]})


class HarnessSessionFactory(ResourceSessionFactory[OpenEnvSession]):
    """OpenEnv session factory over our sandbox + proxy. A prompt is a `Task` or a task spec such as
    ``"humaneval/3"``."""

    def __init__(self, client: ProxyClient, config: RolloutConfig, *, out_root: Path | None = None,
                 sampling: dict[str, Any] | None = None) -> None:
        self.client, self.out_root = client, out_root
        # TRL passes its training policy; the proxy pins exactly this temperature for every call.
        self.config = replace(config, temperature=float(sampling["temperature"])) if sampling else replace(config)

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> OpenEnvSession:
        task = task if isinstance(task, Task) else load_task(str(task))
        episode = episode_id or uuid.uuid4().hex[:12]
        out = self.out_root / episode if self.out_root else None
        return OpenEnvSession(task, self.client, self.config, out_dir=out, episode_id=episode)

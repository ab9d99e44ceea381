"""What the trainer modules read from a run, as Protocols: they are typed against these, never against
`workbench.train.grpo`.

`workbench.train.config` owns `TrainConfig`, `workbench.train.grpo` owns `GRPORun` and dispatches to the trainers
(`workbench.train.async_grpo`);
those, and the step helpers (`workbench.train.fields`), take a `StepConfig` / `AsyncTrainConfig` / `AsyncRun`,
which TrainConfig and GRPORun satisfy structurally (mypy checks it at the dispatch). The imports go one way:
grpo -> async_grpo -> types, grpo -> fields -> types, grpo -> trl_trainer -> types (all in workbench/train/).

    def train_async(run: AsyncRun, *, resume: bool = False) -> dict[str, Any]: ...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import Field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

if TYPE_CHECKING:
    from workbench.capture import ProxyClient
    from workbench.engine import Engine
    from workbench.train.policy_sync import SharedFolder
    from workbench.rollout import RolloutConfig
    from workbench.runs import RunDir
    from workbench.tasks import Task
    from workbench.train.config import TrainConfig

__all__ = ["TurnPolicy", "WeightSync", "Device", "StepConfig", "AsyncTrainConfig", "AsyncRun", "TrainerRun"]

TurnPolicy = Literal["tool_calls", "all"]  # TrainConfig.train_turns: which agent turns are trained
WeightSync = Literal["auto", "lora", "merged", "nccl"]  # TrainConfig.weight_sync: how the policy reaches the engine
Device = Literal["cpu", "cuda"]  # a run's resolved trainer device (`workbench.train.grpo.resolve_device`)


class StepConfig(Protocol):
    """What `workbench.train.fields.step_fields` reads of a TrainConfig."""

    @property
    def group_size(self) -> int: ...
    @property
    def token_budget(self) -> int: ...
    @property
    def every_row(self) -> bool: ...
    @property
    def slots(self) -> int: ...


class AsyncTrainConfig(Protocol):
    """What `workbench.train.async_grpo` reads of a TrainConfig (a dataclass: its config.json is ``asdict`` of it)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def model(self) -> str: ...
    @property
    def group_size(self) -> int: ...
    @property
    def token_budget(self) -> int: ...
    @property
    def weight_sync(self) -> WeightSync: ...
    @property
    def tasks_per_step(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def lora_rank(self) -> int: ...
    @property
    def lora_alpha(self) -> int: ...
    @property
    def temperature(self) -> float: ...
    @property
    def epsilon(self) -> float: ...
    @property
    def max_output_tokens(self) -> int: ...
    @property
    def parallel_rollouts(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def report_to(self) -> str: ...
    @property
    def activation_checkpointing(self) -> bool: ...
    @property
    def train_turns(self) -> TurnPolicy: ...

    def rollout_config(self) -> RolloutConfig: ...


class AsyncRun(Protocol):
    """What `workbench.train.async_grpo.train_async` reads of a GRPORun, and the one thing it sets (``trainer``)."""

    trainer: object  # set to the trainer it builds (the run's callers read it back)

    @property
    def config(self) -> AsyncTrainConfig: ...
    @property
    def device(self) -> Device: ...
    @property
    def engine(self) -> Engine | None: ...
    @property
    def client(self) -> ProxyClient | None: ...
    @property
    def dir(self) -> RunDir: ...
    @property
    def isolation(self) -> str: ...
    @property
    def tasks(self) -> Sequence[Task]: ...
    @property
    def shared(self) -> SharedFolder | None: ...


class TrainerRun(Protocol):
    """What `workbench.train.trl_trainer.build_trainer` reads of a GRPORun, and what it sets (``tokenizer``, ``trainer``,
    ``step_stats``): the trainer is built against this, so it never imports `workbench.train.grpo` (no circle, not even
    for the type checker)."""

    trainer: Any
    tokenizer: Any
    step_stats: dict[str, Any]
    recording: Any  # a `workbench.train.replay.Recording` when the run replays recorded rollouts, else None
    engine: Engine | None
    client: ProxyClient | None
    dir: RunDir  # settable, as `workbench.train.policy_sync.SyncHost` asks

    @property
    def config(self) -> TrainConfig: ...
    @property
    def device(self) -> Device: ...
    @property
    def weight_sync(self) -> Literal["lora", "merged", "nccl"]: ...
    @property
    def importance_sampling(self) -> str: ...
    @property
    def isolation(self) -> str: ...
    @property
    def tasks(self) -> Sequence[Task]: ...
    @property
    def shared(self) -> SharedFolder | None: ...

    def rollout_func(self, prompts: list[str], trainer: Any) -> dict[str, list[Any]]: ...

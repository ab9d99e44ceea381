"""The train stage's named kinds, as Literals: what a `workbench.train.config.TrainConfig` field may hold.

from workbench.train.types import TurnPolicy, WeightSync, Device
"""

from __future__ import annotations

from typing import Literal

__all__ = ["TurnPolicy", "WeightSync", "Device"]

TurnPolicy = Literal["tool_calls", "all"]  # TrainConfig.train_turns: which agent turns are trained
WeightSync = Literal["auto", "lora", "merged", "nccl"]  # TrainConfig.weight_sync: how the policy reaches the engine
Device = Literal["cpu", "cuda"]  # a run's resolved trainer device (`workbench.train.grpo.resolve_device`)

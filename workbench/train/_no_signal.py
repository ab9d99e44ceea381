"""The loss pass of a batch with nothing to learn, skipped exactly (lever 6 of `workbench.train.group_step`).

    if nothing_to_learn(trainer, inputs):      # inside GroupStep.compute_loss, before TRL's loss pass
        return zero_loss(model)                # backward gives every trainable tensor a gradient of exactly 0

When every reward of a group is the same, GRPO's advantages are all 0 and TRL 1.16's loss is a sum of terms each
multiplied by an advantage (every ``loss_type``; the IS ratio, clipping and entropy mask multiply it again): the
loss is 0 and every gradient exactly 0, so the model's forward and backward compute nothing the update uses. On
saturated tasks that is most steps: 16 of the shipped qwen-coder run's 20 had one reward for the whole group, and
each spent 68-95 s (of a 147-195 s step) on that pass (workbench/data/learning_demo/metrics.jsonl).

Exact, not approximate: the optimizer still steps with zero gradients (not with none: AdamW skips a tensor whose
``.grad`` is None, while TRL's step would decay its moments and apply weight decay), the scheduler and logging run as
before. Only when the loss has no term without an advantage: ``beta`` 0 (no KL), no entropy bonus, no MoE aux loss.
What the step no longer has is what only the pass computes: its entropy and clip metrics, and the trainer/engine
logprob gap of that step (steps with a signal still measure it). One process only: under DDP each backward is
expected to follow a forward through the wrapped model, which syncs the gradients; several processes run the pass.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from trl import GRPOTrainer

from workbench._compat import GRPO_ENTROPY_BONUS

__all__ = ["nothing_to_learn", "zero_loss"]


def nothing_to_learn(trainer: GRPOTrainer, inputs: dict[str, Any]) -> bool:
    """True when TRL's loss pass over `inputs` would give a loss of 0 and every gradient exactly 0."""
    if trainer.accelerator.num_processes > 1:
        return False
    if trainer.beta != 0.0 or trainer.aux_loss_enabled or getattr(trainer, GRPO_ENTROPY_BONUS):
        return False
    advantages: Tensor = inputs["advantages"]
    return not bool(advantages.any())


def zero_loss(model: torch.nn.Module) -> Tensor:
    """A loss of 0 whose backward gives every trainable tensor a gradient of exactly 0."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.stack([p.sum() for p in trainable]).sum() * 0.0

"""Activation-checkpointing modes for a Hugging Face decoder stack, including selective checkpointing.

At long rows attention dominates the step (at 16k tokens it is ~60% of a Qwen3-0.6B step's FLOPs), so full
checkpointing's replay of every layer's forward re-runs the most expensive kernel for the cheapest memory: one
layer's attention output is 2·T·heads·head_dim bytes. The "attention" mode checkpoints every decoder layer
but keeps the attention kernel's outputs (torch's selective activation checkpointing), so the backward replays
only the projections, norms and MLP.

    policy = enable_checkpointing(model, "attention")   # or "full", "alternate", "none"
    ... train ...
    policy.saved                                         # Counter of the attention ops whose outputs were kept

"full" is Hugging Face's own `gradient_checkpointing_enable()` with its defaults (the naive baseline).
`selective_checkpointing_kwargs()` is the "attention" mode as TRL takes it: ``GRPOConfig(gradient_checkpointing_kwargs=...)``
(TRL turns checkpointing off around its no-grad pass and back on with exactly these kwargs, so a mode set on the
model alone would be lost after the first step; benchmarks/gpu_trl_step.py measures it that way). The
gradient_checkpointing_* names are used because the GPU machine's transformers (5.17) has only those; 5.24,
pinned here, keeps them as deprecated aliases of activation_checkpointing_*.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any, Literal

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from transformers import PreTrainedModel

__all__ = ["ATTENTION_OPS", "CheckpointMode", "SaveAttention", "enable_checkpointing", "selective_checkpointing_kwargs"]

CheckpointMode = Literal["none", "full", "alternate", "attention"]

# Whichever backend SDPA dispatches to (flash, memory-efficient or cuDNN on CUDA; flash on CPU), its outputs are
# what the backward needs besides q, k, v, which are cheap to recompute.
ATTENTION_OPS = (
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
)


class SaveAttention:
    """Selective-checkpoint policy: keep attention kernels' outputs, recompute everything else."""

    def __init__(self) -> None:
        self.saved: Counter[str] = Counter()

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if op in ATTENTION_OPS:
            if not ctx.is_recompute:
                self.saved[str(op)] += 1
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE


def enable_checkpointing(model: PreTrainedModel, mode: CheckpointMode) -> SaveAttention | None:
    """Set `model`'s activation checkpointing to `mode`; returns the policy for "attention", else None.

    none: keep every activation. full: Hugging Face's default checkpointing of every decoder layer.
    alternate: checkpoint every other decoder layer (non-reentrant), keep the rest.
    attention: checkpoint every decoder layer but keep the attention outputs (see the module docstring).
    """
    model.gradient_checkpointing_disable()
    if mode == "none":
        return None
    if mode == "full":
        model.gradient_checkpointing_enable()
        return None
    if mode == "alternate":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for i, layer in enumerate(model.model.layers):
            layer.gradient_checkpointing = i % 2 == 0
        return None
    if mode == "attention":
        policy = SaveAttention()
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={
                "use_reentrant": False,
                "context_fn": partial(create_selective_checkpoint_contexts, policy),
            }
        )
        return policy
    raise ValueError(f"unknown checkpointing mode {mode!r}")


def selective_checkpointing_kwargs() -> tuple[dict[str, Any], SaveAttention]:
    """``gradient_checkpointing_kwargs`` for TRL/Hugging Face's TrainingArguments giving the "attention" mode, and
    its policy (which counts the attention outputs kept)."""
    policy = SaveAttention()
    return {"use_reentrant": False, "context_fn": partial(create_selective_checkpoint_contexts, policy)}, policy

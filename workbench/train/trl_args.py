"""What TRL is given, the same for both trainers: its GRPO keywords and PEFT's LoRA, from a `TrainConfig`; and what
a launch as several processes (torchrun) may do.

    GRPOConfig(**grpo_args(cfg, out, num_generations=cfg.slots)); GRPOTrainer(..., peft_config=lora_config(cfg))
    check_processes(cfg, out)         # under torchrun: what several processes can do, or ValueError
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from workbench.train.config import TrainConfig

__all__ = ["lora_config", "grpo_args", "check_processes", "processes", "LORA_TARGETS"]

# the LoRA's modules: every linear layer of a Qwen2/Llama block (attention and MLP)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def processes() -> tuple[int, int]:
    """(how many processes train, this one's rank): torchrun's ``WORLD_SIZE`` and ``RANK``, (1, 0) alone."""
    return int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))


def check_processes(cfg: TrainConfig, run_dir: Path | None) -> int:
    """The number of processes, or ValueError when `cfg` cannot train as that many. Several processes (torchrun,
    accelerate launch: DDP, gradients all-reduced) replay recorded rollouts (``from_rollouts``) with GRPOTrainer, each
    process a whole number of the step's groups (``tasks_per_step`` a multiple of the processes: TRL computes a
    group's advantages from its `num_generations` consecutive rows), into one run folder named by ``--out``. Before
    this check, 2 processes each took half of one group, the dataloader gave no batch, and both 'finished' with 0
    steps and exit status 0. Live sampling runs as one process (every process would sample and sync)."""
    world, _ = processes()
    if world == 1:
        return 1
    why = []
    if not cfg.from_rollouts:
        why.append("live sampling runs as one process: several processes replay recorded rollouts (--from-rollouts)")
    if cfg.trainer != "grpo":
        why.append(f"the {cfg.trainer!r} trainer runs as one process")
    if cfg.tasks_per_step % world:
        why.append(
            f"tasks_per_step {cfg.tasks_per_step} is not a multiple of the {world} processes (whole groups each)"
        )
    if run_dir is None:
        why.append("name the run folder (--out): every process writes into the same one")
    if why:
        raise ValueError(f"this run was launched as {world} processes (WORLD_SIZE={world}): " + "; ".join(why))
    return world


def lora_config(cfg: TrainConfig) -> Any:
    """PEFT's LoraConfig (`TrainConfig.lora_rank`, ``lora_alpha``; every linear layer, no dropout): the one both
    trainers use."""
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
        target_modules=list(LORA_TARGETS),
    )


def grpo_args(cfg: TrainConfig, output_dir: Path, *, num_generations: int) -> dict[str, Any]:
    """The keywords TRL's GRPOConfig and AsyncGRPOConfig both take, as `cfg` sets them: a step is `tasks_per_step`
    groups of `num_generations`, a constant learning rate, a log line and a checkpoint (the last two kept) every step,
    the sampling temperature the engine used (TRL rescales its logprobs by it), no top-p, PPO's clip."""
    return dict(
        output_dir=str(output_dir),
        # each process its share of the step's groups (check_processes: whole groups), TRL's global batch the step
        per_device_train_batch_size=cfg.tasks_per_step // processes()[0] * num_generations,
        num_generations=num_generations,
        max_steps=cfg.steps,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="steps",
        save_steps=1,
        save_total_limit=2,
        report_to=cfg.report_to,
        seed=cfg.seed,
        temperature=cfg.temperature,
        top_p=1.0,
        epsilon=cfg.epsilon,
        # the old name: the GPU host's transformers 5.17 has no `activation_checkpointing` argument (5.24 maps it)
        gradient_checkpointing=cfg.activation_checkpointing,
    )

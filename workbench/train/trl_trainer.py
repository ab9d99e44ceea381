"""GRPOTrainer as a `workbench.train.grpo.TrainConfig` wants it (TRL 1.16.0).

TRL's GRPOConfig per device (CPU: fp32 and `use_cpu`, with `score_only_labelled_positions_on_cpu` and
`return_large_frees_to_the_os`; CUDA: TRL's GPU settings, bf16 mixed precision), a PEFT LoRA or full fine-tuning,
our `rollout_func`, the seam that feeds the engine's logprobs to TRL's IS correction and syncs the policy
(`trainer.use_vllm = True`, `trainer.vllm_generation = <a workbench.train.policy_sync object>`), the `workbench.train.group_step`
levers, and the callback that writes metrics.jsonl. It is handed values (what `workbench.train.grpo.GRPORun` resolved)
and returns the trainer and its tokenizer; nothing is written back into the run.

    trainer, tokenizer = build_trainer(
        config, asset.path, device="cpu", weight_sync="merged", importance_sampling="sequence_truncate",
        tasks=tasks, rollout_func=rollout_func, sync=sync, stats=stats, run_dir=run_dir, isolation="bwrap",
    )
    trainer.train()
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from workbench._compat import GRPO_LAST_LOADED_STEP, quiet_known_noise
from workbench.train.config import TrainConfig, resolve_precision
from workbench.train.trl_args import grpo_args, lora_config, processes
from workbench.train.stats import StepStats
from workbench.train.types import Device, WeightSync

if TYPE_CHECKING:
    from trl import GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    from workbench.runs import RunDir
    from workbench.tasks import Task
    from workbench.train.policy_sync import LoraSync, MergedSync, NcclSync, SaveOnlySync

__all__ = ["build_trainer", "return_large_frees_to_the_os", "score_only_labelled_positions_on_cpu"]


def score_only_labelled_positions_on_cpu() -> None:
    """TRL 1.16's fused LM head scores every position when the device has no Triton (to keep tile
    shapes static for compilers such as Neuron's), and drops the unlabelled ones afterwards. On CPU
    that is the whole ~7k-token opencode prompt x 152k vocabulary to score a few dozen sampled tokens:
    135 s of a 140 s step (profiled). Eager CPU has nothing to recompile, so take TRL's own compact
    path (score labelled positions only) there too. Same kernel, same numbers (tests/test_train.py)."""
    global _CPU_COMPACT_PATCHED
    from workbench._compat import patch_trl_use_triton

    if _CPU_COMPACT_PATCHED:
        return
    patch_trl_use_triton(lambda device, original: device.type == "cpu" or original(device))
    _CPU_COMPACT_PATCHED = True


_CPU_COMPACT_PATCHED = False

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def return_large_frees_to_the_os(threshold: int = 2**20) -> bool:
    """glibc: serve every allocation of `threshold` bytes or more with its own mmap, unmapped when freed (this
    process, from now on). By default glibc raises that threshold up to 32 MiB as such blocks are freed, so the
    step's freed activations (11.7 MB per [3,257, 896] fp32 tensor of a qwen-coder pack) land in its heap and stay
    resident, fragmented: a qwen-coder step peaked at 11.2 GiB without this setting and 8.3 GiB with it, for
    1.14-1.23x its step time (page faults on freshly mapped blocks; benchmarks/README.md, section 12). The same as starting the process with
    ``MALLOC_MMAP_THRESHOLD_``, which is left to rule when set. False where there is no glibc (nothing changed)."""
    if platform.libc_ver()[0] != "glibc" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, threshold))


def _reward(prompts: list[Any], completions: list[Any], wb_reward: list[float | None], **_: Any) -> list[float | None]:
    return list(wb_reward)


def build_trainer(
    cfg: TrainConfig,
    asset_path: Path,
    *,
    device: Device,
    weight_sync: WeightSync,
    importance_sampling: str,
    tasks: Sequence["Task"],
    rollout_func: Callable[[list[str], Any], dict[str, list[Any]]],
    sync: "LoraSync | MergedSync | NcclSync | SaveOnlySync",
    stats: StepStats,
    run_dir: "RunDir",
    isolation: str,
    model: Any = None,
    checkpointing_kwargs: dict[str, Any] | None = None,
) -> tuple["GRPOTrainer", Any]:
    """The trainer for `cfg` on `device` and its tokenizer (the asset's). `weight_sync` and `importance_sampling` as
    the run resolved them (`nccl`: full fine-tuning, else LoRA); `sync` is bound to the trainer and becomes TRL's
    ``vllm_generation``; `stats` is the step's counters, which the metrics callback writes to `run_dir` with
    `isolation` and `device`. `model`: a model object to train instead of the asset's. `checkpointing_kwargs`:
    TRL's ``gradient_checkpointing_kwargs`` (e.g. `workbench.train.experimental.checkpointing.selective_checkpointing_kwargs`)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    quiet_known_noise()  # TRL's line per None-reward row (ours are None on purpose), the old checkpointing name
    cpu, lora = device == "cpu", weight_sync != "nccl"
    if cpu:
        score_only_labelled_positions_on_cpu()
        return_large_frees_to_the_os()
        torch.set_num_threads(cfg.train_threads or os.cpu_count() or 1)
    tokenizer = AutoTokenizer.from_pretrained(asset_path)
    # CUDA: frozen LoRA base weights in bf16 (half the memory; autocast computes in bf16 anyway), full
    # fine-tuning keeps fp32 master weights under bf16 autocast.
    dtype = torch.float32 if cpu or not lora else torch.bfloat16
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(asset_path, dtype=dtype)
    args = GRPOConfig(
        **grpo_args(cfg, run_dir.path / "checkpoints", num_generations=cfg.slots),
        use_cpu=cpu,
        bf16=not cpu,
        beta=0.0,
        data_seed=cfg.seed,
        max_completion_length=cfg.token_budget,
        # The generator's logprobs (from the capture) enter TRL's importance-sampling correction.
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=importance_sampling,  # 'auto' resolved by both dtypes
        disable_tqdm=False,
        # Without sharing the prefix, SmolLM2 on 4 rows of ~3k tokens kept 17 GB of activations with
        # checkpointing off and was OOM-killed on this 24 GB machine: keep it on there.
        gradient_checkpointing_kwargs=checkpointing_kwargs,
    )
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental: trl is pinned
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[_reward],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [t.id for t in tasks]}),
        processing_class=tokenizer,
        peft_config=lora_config(cfg) if lora else None,
        rollout_func=rollout_func,
    )
    # The seam (trl==1.16.0): with use_vllm, TRL feeds our logprobs to its IS correction and calls
    # vllm_generation.sync_weights() before each step's generation.
    trainer.use_vllm = True
    sync.bind(trainer)
    # TRL types the seam as its own VLLMGeneration; with a rollout_func TRL only calls sync_weights() on it,
    # which each policy_sync object implements (duck typing TRL's annotation cannot express).
    trainer.vllm_generation = cast("VLLMGeneration", sync)
    setattr(trainer, GRPO_LAST_LOADED_STEP, -1)  # what TRL's vLLM init would set
    from workbench.train.group_pack import flex_attention_on

    # TrainConfig.shared_prefix says why: CPU blockwise SDPA 14.2x; CUDA FlexAttention 4.2x at G = 8 (benchmarks §8b)
    shared = cfg.shared_prefix == "on" or (cfg.shared_prefix == "auto" and (cpu or flex_attention_on(device)))
    cpu_bf16 = cpu and resolve_precision(cfg, device) == "bf16"  # `auto`: bf16 where the cores have it
    if shared or cfg.reuse_logps or cpu_bf16 or cfg.every_row or cfg.skip_zero_advantage:
        from workbench.train.group_step import install

        install(  # on CUDA, TRL's own bf16 autocast
            trainer,
            shared_prefix=shared,
            reuse_logps=cfg.reuse_logps,
            bf16=cpu_bf16,
            skip_zero_advantage=cfg.skip_zero_advantage,
        )

    world = processes()[0]  # several (torchrun): each process's counters merged, rank 0 writes the record
    facts = {"isolation": isolation, "device": device} | ({"processes": world} if world > 1 else {})

    class _Metrics(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            stats.begin()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if logs and "loss" in logs:  # every process logs the step (TRL's loss is already gathered)
                if world > 1:
                    stats.merge_processes(world)
                if state.is_world_process_zero:
                    run_dir.log_metrics(stats.record(step=state.global_step, logs=logs, **facts))

    trainer.add_callback(_Metrics())
    return trainer, tokenizer

"""A faster, exact GRPO optimizer step for TRL 1.16's `GRPOTrainer` on CPU (levers 1-3, 5, 6 of `TrainConfig`).

The rows of a GRPO group share a long common prefix (system prompt, tools, few-shot turns, task message:
~3.05k of ~3.1k tokens per SmolLM2 row). TRL forwards every row in full, twice (a no-grad pass for the
importance-sampling ratio, then the loss pass), and replays the forward again for activation checkpointing.
`install(trainer)` changes only how the per-token logprobs are computed; TRL still does everything else
(advantages, clipping, IS correction, loss normalisation, logging):

1. **Shared prefix once** (`shared_prefix`): the batch's rows are clustered by common prefix (same left padding,
   longest common prefix of prompt+completion, which may run into sampled tokens) and each cluster becomes ONE
   packed sequence: the shared tokens once, then every row's own segment, with TRL's position ids. Each
   segment starts with the cluster's last shared token (one duplicated token per row) so every hidden state
   predicts exactly one next token: the first completion token of every row is predicted from its own copy
   of the last prefix position. A segment attends to the shared tokens and causally to itself (a "tree"
   mask), computed blockwise on the CPU: causal SDPA over the shared block, masked SDPA of the segments against
   all keys (long segments: one per group of segments, `Pack.groups`); on CUDA as one compiled FlexAttention
   call with a BlockMask (`attention="auto"`: 4.19x TRL's step at 0.23x its memory on 8 opencode-shaped rows,
   benchmarks/README.md section 8b). The gradient is exact: a shared position's logprob is one tensor element
   gathered into every row that scores it, so autograd sums every row's advantage-weighted gradient into the
   shared activations.
   Works with TRL's fused LM head (`shift_labels`) and with activation checkpointing (the layout travels as
   a forward kwarg, so the checkpoint replay sees it). The layout and the attention: `workbench.train.group_pack`.
   Without checkpointing, each gated MLP of the packed forward keeps only gate(x) and up(x) for the backward,
   which recomputes act(gate) and the product bit for bit (`recompute_mlp`, `workbench.train._mlp_recompute`): on
   qwen-coder the saved activations went 8,442 → 5,536 MiB (benchmarks/README.md, section 12).
2. **bf16 autocast** (`bf16`): the step under `torch.autocast("cpu", bfloat16)`; fp32 is the exact mode. Only for
   hosts with AVX512-BF16/AMX: on an AVX2-only CPU (the 2-core AMD EPYC here) torch takes its reference bf16
   GEMM, 29x slower than fp32 (benchmarks/README.md, section 7).
3. **No redundant forward** (`reuse_logps`): with num_iterations=1 and no gradient accumulation across
   generations the weights do not change between TRL's no-grad pass and the loss pass, so the vLLM IS
   ratio is computed from the loss pass's detached logprobs (TRL's own formulas, same metrics). Activation
   checkpointing is the other redundant forward: turn it off (`GRPOConfig(gradient_checkpointing=False)`)
   when the packed group fits in memory (benchmarks/README.md, section 7 has the peak RSS).
5. **Every row trained**: `every_row_fields` gives a forked rollout all its rows, in fixed per-group slots.
   How TRL 1.16 then normalises: with `loss_type="dapo"` (the default, and train.py's) the loss is
   sum(per-token loss * mask) / num_items_in_batch over the whole generation batch, so a rollout given as
   several rows with the same advantage and disjoint trained tokens (every turn's output is trained in
   exactly one row) contributes exactly what one row holding all its trained turns would. The advantage
   must be the rollout's, not the row's: TRL computes advantages over `num_generations` consecutive rows, so
   only a rollout's lead row carries its reward (a rollout with no row gets a pad row as its lead: scored, it
   still counts in its group's mean and std); its other rows and the padding slots carry None (NaN: left
   out of the group mean and std, advantage 0), and `install` copies the lead row's advantage onto its
   other rows (`OWNER_FIELD`) before the loss. Not with "grpo"/"sapo"/"luspo"/"dr_grpo": they average per
   row, so a rollout's weight would grow with its row count and the padding slots would dilute the mean.
   The sequence-level IS modes then weigh each row separately, not each rollout.
6. **No pass without a signal** (`skip_zero_advantage`): advantages all 0 (one reward for the group): zero loss,
   exact zero gradients, no forward or backward (`workbench.train._no_signal`).

    from workbench.train.group_step import install
    trainer = GRPOTrainer(...)                # as workbench/train/grpo.py builds it
    step = install(trainer)                   # after setting trainer.rollout_func; step.remove() undoes it
    trainer.train()                           # step.last: rows, packs, row vs forwarded tokens of the last pass

Exactness (tests/test_group_step.py): on the tiny model in fp32, per-row logprobs and entropies equal TRL's own
path to <= 1e-5 absolute, the loss to <= 1e-5 relative (|Δ| / max(1, |loss|)), and each LoRA gradient tensor to
<= 1e-5 of its own largest entry (max |Δ| / max |g|); on SmolLM2 and the shipped real rows, float64 to <= 5e-6, and in
float32 the loss to <= 1e-5 and the gradients no further from the float64 step than 2x TRL's own fp32 error.
Requires sdpa attention and TRL's compact fused LM head on CPU (workbench.train.grpo applies it; `install` checks).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor
from transformers import PreTrainedModel
from trl import GRPOConfig, GRPOTrainer

# TRL 1.16.0's private names (pinned and checked in _compat): the methods replaced or wrapped, the metrics dict
from workbench._compat import (
    GRPO_COMPUTE_LOSS as _COMPUTE_LOSS,
    GRPO_GENERATE as _GENERATE,
    GRPO_GET_LOGPS as _GET_LOGPS,
    GRPO_METRICS as _METRICS,
    trl_use_triton,
)
from workbench.train._mlp_recompute import recompute_mlp_products, recomputing
from workbench.train._no_signal import nothing_to_learn, zero_loss
from workbench.train._row_slots import OWNER_FIELD, every_row_fields
from workbench.train.group_pack import ATTENTION, attention_for, plan  # importing it registers ATTENTION

__all__ = ["OWNER_FIELD", "GroupStep", "install", "every_row_fields"]


_IS_FLAG = "vllm_importance_sampling_correction"  # public attribute, read by both methods above; siblings read only
_IS_MODE, _IS_MIN, _IS_MAX = (f"vllm_importance_sampling_{k}" for k in ("mode", "clip_min", "clip_max"))
# Also: `model(..., shift_labels=, fused_lm_head=True)` (trl.trainer.utils.add_fused_lm_head's patched forward,
# returning .log_probs/.entropy).

# GRPOTrainer.rollout_func as TRL 1.16 types it: (prompts, trainer) -> extra fields by name.
RolloutFunc = Callable[[list[str], GRPOTrainer], dict[str, Any]]


def _model(trainer: GRPOTrainer) -> torch.nn.Module:
    # Trainer types .model optional (None until built); a GRPOTrainer always has one.
    if trainer.model is None:
        raise RuntimeError("the trainer has no model")
    return trainer.model


def _base_model(trainer: GRPOTrainer) -> PreTrainedModel:
    """The transformers model under the trainer's (PEFT-wrapped or plain) one: whose config picks the attention."""
    model = _model(trainer)
    get_base = getattr(model, "get_base_model", None)  # PeftModel's; nn.Module's __getattr__ would type it a Tensor
    return cast(PreTrainedModel, get_base() if get_base is not None else model)


@dataclass
class GroupStep:
    """The levers installed on one trainer; `remove()` puts TRL's own methods back."""

    trainer: GRPOTrainer
    shared_prefix: bool = True
    reuse_logps: bool = True
    bf16: bool = False
    attention: str = "blockwise"  # "dense": SDPA with the 4D tree mask (2x the FLOPs); "flex": Pack.block_mask()
    recompute_mlp: bool = True
    skip_zero_advantage: bool = True
    last: dict[str, int] = field(default_factory=dict)
    _undo_mlp: Callable[[], None] | None = None
    _loss_inputs: dict[str, Any] | None = None
    _owners: list[int] | None = None
    _rollout_func: RolloutFunc | None = None

    def _original(self, name: str) -> Callable[..., Any]:
        # TRL's own method, looked up by its (private, version-checked) name: its signature is TRL's
        return cast(Callable[..., Any], getattr(type(self.trainer), name).__get__(self.trainer))

    def _reusing(self) -> bool:
        t = self.trainer
        args = cast(GRPOConfig, t.args)  # Trainer types it TrainingArguments; GRPOTrainer's is a GRPOConfig
        steps = args.steps_per_generation
        assert steps is not None  # GRPOConfig.__post_init__ always resolves it
        weights_fixed = args.gradient_accumulation_steps % (steps * t.num_iterations) == 0
        return self.reuse_logps and t.use_vllm and getattr(t, _IS_FLAG) and weights_fixed

    @contextlib.contextmanager
    def _precision(self) -> Iterator[None]:
        with torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext():
            yield

    def get_logps(
        self,
        model: PreTrainedModel,
        input_ids: Tensor,
        attention_mask: Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: object,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        inputs, self._loss_inputs = self._loss_inputs, None  # set only for the loss pass's call
        ours = (
            self.shared_prefix
            and not compute_aux_loss
            and all(v is None for v in multimodal.values())
            and getattr(model, "config", None) is not None
            and model.config._attn_implementation == ATTENTION
        )
        logps: Tensor
        entropies: Tensor | None
        aux: Tensor | None
        with self._precision():
            if not ours:
                logps, entropies, aux = self._original(_GET_LOGPS)(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size=batch_size,
                    compute_entropy=compute_entropy,
                    compute_aux_loss=compute_aux_loss,
                    **multimodal,
                )
                self.last = {
                    "rows": len(input_ids),
                    "row_tokens": int(attention_mask.sum()),
                    "forwarded_tokens": input_ids.numel(),
                    "packs": 0,
                }
            else:
                logps, entropies = self._packed(model, input_ids, attention_mask, logits_to_keep)
                aux = None
        if inputs is not None and "importance_sampling_ratio" not in inputs:
            self._importance_ratio(inputs, logps.detach())
        return logps, entropies if compute_entropy else None, aux

    def _packed(
        self, model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int
    ) -> tuple[Tensor, Tensor]:
        p = plan(input_ids, attention_mask, logits_to_keep)
        logps, entropies = [], []
        dev = input_ids.device
        mlp = recomputing(model) if self._undo_mlp is not None else contextlib.nullcontext()
        with self.trainer.accelerator.autocast(), mlp:
            for pack in p.packs:
                extra = pack.blockwise_kwargs() if self.attention == "blockwise" else {}
                mask = pack.block_mask(dev) if self.attention == "flex" else pack.mask().to(dev)
                out = model(
                    input_ids=pack.ids[None].to(dev),
                    attention_mask=mask,
                    position_ids=pack.positions[None].to(dev),
                    shift_labels=pack.labels[None].to(dev),
                    fused_lm_head=True,
                    **extra,
                )
                logps.append(out.log_probs[0])
                entropies.append(out.entropy[0])
        zero = logps[0].new_zeros(1)
        self.last = {
            "rows": len(input_ids),
            "row_tokens": p.row_tokens,
            "forwarded_tokens": p.forwarded_tokens,
            "packs": len(p.packs),
            "trl_padded_tokens": p.padded_tokens,
            "shared_tokens": sum(pk.n_shared for pk in p.packs),
            "split_packs": sum(len(pk.groups) > 1 for pk in p.packs) if self.attention == "blockwise" else 0,
        }
        return torch.cat([*logps, zero])[p.index], torch.cat([*entropies, zero.detach()])[p.index]

    def _importance_ratio(self, inputs: dict[str, Any], old: Tensor) -> None:
        """TRL 1.16's vLLM IS ratio and its metrics (grpo_trainer.py ~2660-2895), from the loss pass's logprobs."""
        t = self.trainer
        sampling: Tensor = inputs["sampling_per_token_logps"]
        mask: Tensor = (
            inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
        )
        diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
        mode = getattr(t, _IS_MODE)
        sequence = mode in ("sequence_mask", "sequence_truncate")
        ratio = torch.exp(diff.sum(-1, keepdim=True) if sequence else diff)
        lo, hi = getattr(t, _IS_MIN), getattr(t, _IS_MAX)
        if mode.endswith("_truncate"):
            ratio = torch.clamp(ratio, min=lo, max=hi)
        else:
            lo, hi = -math.inf if lo is None else lo, math.inf if hi is None else hi
            ratio = ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)
        inputs["importance_sampling_ratio"] = ratio
        metrics = getattr(t, _METRICS)["train" if _model(t).training else "eval"]
        delta = torch.abs(old - sampling)
        delta = delta[mask.bool() & ~torch.isnan(delta)]
        flat = ratio.flatten() if sequence else ratio[mask.bool()]
        zero = old.new_zeros(())
        gather = t.accelerator.gather
        metrics["sampling/sampling_logp_difference/mean"].append(
            gather(delta.mean() if delta.numel() else zero).mean().item()
        )
        metrics["sampling/sampling_logp_difference/max"].append(
            gather(delta.max() if delta.numel() else zero).max().item()
        )
        for stat, reduce in (("min", torch.min), ("mean", torch.mean), ("max", torch.max)):
            value = gather(reduce(flat) if flat.numel() else zero)
            metrics[f"sampling/importance_sampling_ratio/{stat}"].append(
                (value.nanmean() if stat == "mean" else reduce(value[~value.isnan()])).item()
            )

    def generate_and_score(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        reusing = self._reusing()
        if reusing:  # TRL then skips its no-grad forward and the IS ratio; the loss pass supplies both
            setattr(self.trainer, _IS_FLAG, False)
        try:
            out: dict[str, Any] = self._original(_GENERATE)(inputs)
        finally:
            if reusing:
                setattr(self.trainer, _IS_FLAG, True)
        owners, self._owners = self._owners, None
        if owners is not None:  # lever 5: a rollout's other rows take its lead row's advantage
            adv = out["advantages"]
            lead = torch.tensor([o if o >= 0 else i for i, o in enumerate(owners)], device=adv.device)
            out["advantages"] = adv[lead]
        return out

    def compute_loss(self, model: PreTrainedModel, inputs: dict[str, Any]) -> Tensor:
        metrics = getattr(self.trainer, _METRICS)["train" if _model(self.trainer).training else "eval"]
        skip = self.skip_zero_advantage and nothing_to_learn(self.trainer, inputs)  # lever 6: gradients all 0
        metrics["group/loss_pass_skipped"].append(float(skip))
        if skip:
            self.last = {"rows": len(inputs["advantages"]), "forwarded_tokens": 0, "packs": 0}
            return zero_loss(model)
        self._loss_inputs = inputs if self._reusing() and "importance_sampling_ratio" not in inputs else None
        try:
            loss: Tensor = self._original(_COMPUTE_LOSS)(model, inputs)
        finally:
            self._loss_inputs = None
        for k in ("row_tokens", "forwarded_tokens"):  # of the loss pass: what lever 1 saves
            metrics[f"group/{k}"].append(float(self.last.get(k, 0)))
        return loss

    def remove(self) -> None:
        t = self.trainer
        for name in (_GET_LOGPS, _GENERATE, _COMPUTE_LOSS):
            t.__dict__.pop(name, None)
        if self._rollout_func is not None:
            t.rollout_func = self._rollout_func
        base = _base_model(t)
        if base.config._attn_implementation == ATTENTION:
            base.config._attn_implementation = "sdpa"
        if self._undo_mlp is not None:
            self._undo_mlp()
        t.__dict__.pop("group_step", None)


def install(
    trainer: GRPOTrainer,
    *,
    shared_prefix: bool = True,
    reuse_logps: bool = True,
    bf16: bool = False,
    attention: str = "auto",
    recompute_mlp: bool = True,
    skip_zero_advantage: bool = True,
) -> GroupStep:
    """Install the levers on `trainer` (a built GRPOTrainer with a fused LM head, sdpa attention).
    `recompute_mlp`: with `shared_prefix`, the packed forward keeps less of each MLP (module docstring, 1)."""
    device = trainer.accelerator.device  # CUDA with Triton: TRL's compact path already; CPU: after the patch
    if not trl_use_triton(device):
        raise RuntimeError(
            f"TRL's fused LM head scores every position on {device.type}: on CPU apply "
            "workbench.train.trl_trainer.score_only_labelled_positions_on_cpu() first"
        )
    attention = attention_for(attention, device)  # "auto": "flex" on CUDA with Triton, else "blockwise"
    if getattr(trainer, "group_step", None) is not None:
        raise RuntimeError("group_step is already installed on this trainer (workbench.train.grpo installs it)")
    step = GroupStep(trainer, shared_prefix, reuse_logps, bf16, attention, recompute_mlp, skip_zero_advantage)
    base = _base_model(trainer)
    if shared_prefix:
        if base.config._attn_implementation not in ("sdpa", ATTENTION):
            raise ValueError(f"shared_prefix needs sdpa attention, not {base.config._attn_implementation!r}")
        base.config._attn_implementation = ATTENTION
        step._undo_mlp = recompute_mlp_products(base) if recompute_mlp else None
    setattr(trainer, _GET_LOGPS, step.get_logps)
    setattr(trainer, _GENERATE, step.generate_and_score)
    setattr(trainer, _COMPUTE_LOSS, step.compute_loss)
    if trainer.rollout_func is not None:
        step._rollout_func = rollout = trainer.rollout_func

        def rollout_func(prompts: list[str], trainer_: GRPOTrainer) -> dict[str, Any]:
            out = rollout(prompts, trainer_)
            step._owners = out.get(OWNER_FIELD)
            return out

        trainer.rollout_func = rollout_func
    vars(trainer)["group_step"] = step  # ours on TRL's object (GRPOTrainer declares no such field); remove() pops it
    return step

"""Token logprobs and the GRPO loss without materialising the [T, V] float32 logits.

The naive trainer step runs the LM head over every position, casts the [T, V] logits to float32, takes a
log_softmax and gathers the sampled token: at T = 16k and Qwen3's V = 151936 that is 10 GB per float32 copy,
and several copies are alive at once. Here the head runs only on the positions whose token was sampled (mask 1;
context tokens need no logprob), in chunks of rows, with a bf16 matmul and a float32 logsumexp; the backward
recomputes each chunk's logits from the saved hidden states, so no chunk outlives its own iteration.

    hidden = model.model(input_ids=ids[None]).last_hidden_state[0]          # [T, H], no logits
    logp, pos = sampled_logprobs(hidden, model.lm_head.weight, ids, mask)   # [N] float32 at mask-1 positions
    loss = grpo_loss(logp, logp_old[pos], advantages[pos])                  # token-mean over the N tokens

`naive_logprobs` is the reference (full logits → float32 → log_softmax → gather); tests/test_fused_logprobs.py
checks that both paths give the same loss and gradients. Imports only torch, so it runs wherever the model does.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["chunked_logprobs", "grpo_loss", "naive_logprobs", "sampled_logprobs", "sampled_positions"]


class _ChunkedLogprobs(torch.autograd.Function):
    """logp[i] = (h[i] @ W.T)[y[i]] - logsumexp(h[i] @ W.T), chunked over i; saves h, W, y and the logsumexp."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int) -> Tensor:
        logp = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        for start in range(0, hidden.shape[0], chunk_size):
            stop = min(start + chunk_size, hidden.shape[0])
            logits = (hidden[start:stop] @ weight.T).float()
            lse[start:stop] = torch.logsumexp(logits, dim=-1)
            logp[start:stop] = logits.gather(1, targets[start:stop, None])[:, 0] - lse[start:stop]
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk_size = chunk_size
        return logp

    @staticmethod
    def backward(ctx, grad_logp: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        hidden, weight, targets, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        # Accumulated in float32 across chunks: a bf16 running sum would round away small chunk contributions.
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            stop = min(start + ctx.chunk_size, hidden.shape[0])
            g = grad_logp[start:stop, None].float()
            # d logp / d logits = onehot(y) - softmax; built in place on the one float32 buffer of the chunk.
            dlogits = (hidden[start:stop] @ weight.T).float()
            dlogits.sub_(lse[start:stop, None]).exp_().mul_(-g)
            dlogits.scatter_add_(1, targets[start:stop, None], g)
            dlogits = dlogits.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[start:stop] = dlogits @ weight
            if grad_weight is not None:
                grad_weight += (dlogits.T @ hidden[start:stop]).float()
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None


def chunked_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int = 2048) -> Tensor:
    """Float32 logprob of `targets[i]` under the LM head `weight` [V, H] applied to `hidden[i]` [N, H].

    Differentiable in `hidden` and `weight`; peak extra memory is one [chunk_size, V] float32 buffer
    (plus its bf16 copy) instead of the whole [N, V] logits and their float32 copies.
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"want hidden [N, H] and targets [N], got {tuple(hidden.shape)} and {tuple(targets.shape)}")
    return _ChunkedLogprobs.apply(hidden, weight, targets, chunk_size)


def sampled_positions(mask: Tensor) -> Tensor:
    """Indices t ≥ 1 with mask[t] = 1: the tokens that carry a logprob (token 0 has no context to score it)."""
    return torch.nonzero(mask[1:], as_tuple=True)[0] + 1


def sampled_logprobs(
    hidden: Tensor, weight: Tensor, input_ids: Tensor, mask: Tensor, chunk_size: int = 2048
) -> tuple[Tensor, Tensor]:
    """Logprobs of the sampled tokens of one row, and their positions.

    `hidden` [T, H] is the decoder's final (normed) hidden state; token t is scored from hidden[t - 1].
    Returns (logp [N] float32, positions [N]) for the N positions that `sampled_positions(mask)` gives.
    """
    positions = sampled_positions(mask)
    return chunked_logprobs(hidden[positions - 1], weight, input_ids[positions], chunk_size), positions


def naive_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """The reference: logits [T, V] → float32 → log_softmax → gather; logp [T - 1] of tokens 1..T-1."""
    return logits[:-1].float().log_softmax(-1).gather(-1, input_ids[1:, None])[:, 0]


def grpo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    epsilon: float = 0.2,
    num_tokens: int | None = None,
) -> Tensor:
    """GRPO's clipped surrogate without KL (TRL's objective), as a masked token-mean.

    Per token: ratio = exp(logp - logp_old), loss = -min(ratio * A, clip(ratio, 1 - ε, 1 + ε) * A).
    The sum over mask-1 tokens is divided by `num_tokens` (default: their count); pass the total over all rows
    when one batch's rows are backpropagated one at a time, so the rows' losses add up to the batch's token-mean.
    """
    ratio = torch.exp(logp - logp_old)
    per_token = -torch.minimum(ratio * advantages, ratio.clamp(1 - epsilon, 1 + epsilon) * advantages)
    total = per_token.sum() if mask is None else (per_token * mask).sum()
    if num_tokens is not None:
        return total / num_tokens
    return total / (per_token.numel() if mask is None else mask.sum())

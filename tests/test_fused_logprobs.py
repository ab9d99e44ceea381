"""The GPU trainer step's optimised pieces compute the naive step's function (CPU, float32, a tiny Qwen3).

benchmarks/gpu_trainer_step.py times them on an H200; these tests are what makes that comparison fair: the
chunked, sampled-positions-only logprobs give the naive loss and gradients, every checkpointing mode gives the
same gradients, and a conversation trained as one chained row gives the loss of its one-row-per-turn split.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen3Config

from workbench.train.experimental.checkpointing import ATTENTION_OPS, enable_checkpointing
from workbench.train.experimental.fused_logprobs import (
    chunked_logprobs,
    grpo_loss,
    naive_logprobs,
    sampled_logprobs,
    sampled_positions,
)

# The Hugging Face checkpointing names are the ones the GPU machine's transformers 5.17 has; 5.24 deprecates them.
pytestmark = pytest.mark.filterwarnings("ignore:`gradient_checkpointing:FutureWarning")

VOCAB = 300
T = 96


def tiny_qwen3(seed: int = 0) -> PreTrainedModel:
    torch.manual_seed(seed)
    # initializer_range well above the default 0.02 so logits are far from uniform and ratios get clipped.
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        initializer_range=0.2,
        use_cache=False,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    return model.train()


def make_row(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (T,), generator=g)
    mask = torch.zeros(T)
    mask[20:35] = 1
    mask[60:80] = 1
    mask[T - 5 :] = 1
    logp_old = -torch.rand(T, generator=g) * 8  # wide enough that some ratios leave [0.8, 1.2]
    advantages = torch.full((T,), 0.7)
    advantages[60:] = -1.3
    return {"ids": ids, "mask": mask, "logp_old": logp_old, "advantages": advantages}


def naive_loss(model: PreTrainedModel, row: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(input_ids=row["ids"][None]).logits[0]
    logp = naive_logprobs(logits, row["ids"])
    return grpo_loss(logp, row["logp_old"][1:], row["advantages"][1:], row["mask"][1:])


def fused_loss(
    model: PreTrainedModel, row: dict[str, torch.Tensor], chunk_size: int = 7, num_tokens: int | None = None
) -> torch.Tensor:
    hidden = model.model(input_ids=row["ids"][None]).last_hidden_state[0]
    logp, pos = sampled_logprobs(hidden, model.lm_head.weight, row["ids"], row["mask"], chunk_size)
    return grpo_loss(logp, row["logp_old"][pos], row["advantages"][pos], num_tokens=num_tokens)


def grads(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def assert_grads_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float = 1e-5) -> None:
    assert a.keys() == b.keys() and len(a) > 0
    for name, got in a.items():
        scale = b[name].abs().max().item()
        assert scale > 0, name
        err = (got - b[name]).abs().max().item() / scale
        assert err < tol, f"{name}: relative error {err:.2e}"


def test_chunked_logprobs_match_log_softmax_values_and_grads() -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 32, generator=g, requires_grad=True)
    weight = torch.randn(VOCAB, 32, generator=g, requires_grad=True)
    targets = torch.randint(0, VOCAB, (50,), generator=g)
    upstream = torch.randn(50, generator=g)

    ref = (hidden @ weight.T).log_softmax(-1).gather(1, targets[:, None])[:, 0]
    (ref * upstream).sum().backward()
    ref_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    got = chunked_logprobs(hidden, weight, targets, chunk_size=16)  # 16 does not divide 50: a ragged last chunk
    (got * upstream).sum().backward()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden.grad, ref_grads[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad, ref_grads[1], rtol=1e-5, atol=1e-5)


def test_sampled_positions_skip_token_zero_and_context() -> None:
    mask = torch.tensor([1, 0, 1, 1, 0, 1])
    assert sampled_positions(mask).tolist() == [2, 3, 5]


def test_grpo_loss_clips_like_trl() -> None:
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 1.0])).requires_grad_()
    adv = torch.tensor([1.0, -1.0, -1.0, 2.0])
    loss = grpo_loss(logp, torch.zeros(4), adv)
    # ratio 1.5, A>0: clipped to 1.2; ratio 1.5, A<0: unclipped 1.5 wins the min; ratio 0.5, A<0: clipped to 0.8.
    assert loss.item() == pytest.approx((-1.2 + 1.5 + 0.8 - 2.0) / 4, abs=1e-6)
    loss.backward()
    # Clipped tokens carry no gradient; unclipped ones carry -ratio * A / N.
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 1.5 / 4, 0.0, -2.0 / 4]))


def test_fused_loss_and_gradients_equal_naive() -> None:
    model, row = tiny_qwen3(), make_row()
    ref = naive_loss(model, row)
    ref.backward()
    ref_grads = grads(model)
    got = fused_loss(model, row)
    got.backward()
    assert got.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)
    assert_grads_close(grads(model), ref_grads)
    # The tied embedding/head gets gradient from both uses; the row's clipping must actually bite somewhere.
    ratio = torch.exp(naive_logprobs(model(input_ids=row["ids"][None]).logits[0], row["ids"]) - row["logp_old"][1:])
    clipped = ((ratio < 0.8) | (ratio > 1.2))[row["mask"][1:].bool()]
    assert clipped.any() and not clipped.all()


class _CountAttention(TorchDispatchMode):
    """Counts attention-kernel calls, e.g. the forward replays that a checkpointed backward makes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func in ATTENTION_OPS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("mode", "replays"), [("full", 2), ("alternate", 1), ("attention", 0)])
def test_checkpointing_modes_give_the_same_gradients(mode: str, replays: int) -> None:
    model, row = tiny_qwen3(), make_row()
    enable_checkpointing(model, "none")
    fused_loss(model, row).backward()
    ref_grads = grads(model)
    policy = enable_checkpointing(model, mode)
    loss = fused_loss(model, row)
    with _CountAttention() as counter:
        loss.backward()
    assert_grads_close(grads(model), ref_grads)
    # Full checkpointing replays both layers' attention, alternate one; the selective mode keeps the outputs.
    assert counter.calls == replays
    if mode == "attention":
        assert sum(policy.saved.values()) == model.config.num_hidden_layers


def test_chained_row_loss_equals_one_row_per_turn() -> None:
    # A 3-turn conversation: turn k's row is a prefix of the chained row, with mask 1 on its own output only.
    model, row = tiny_qwen3(), make_row()
    turns = [(20, 35), (60, 80), (T - 5, T)]
    chained = fused_loss(model, row)
    total = int(row["mask"].sum())
    per_turn = torch.zeros(())
    for start, stop in turns:
        mask = torch.zeros(stop)
        mask[start:stop] = 1
        sub = {
            "ids": row["ids"][:stop],
            "mask": mask,
            "logp_old": row["logp_old"][:stop],
            "advantages": row["advantages"][:stop],
        }
        per_turn = per_turn + fused_loss(model, sub, num_tokens=total)
    assert per_turn.item() == pytest.approx(chained.item(), rel=1e-5)

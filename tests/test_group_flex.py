"""The FlexAttention path of the shared-prefix group step (workbench.train.group_pack).

On the CPU (eager FlexAttention, forward only: torch has no CPU FlexAttention backward): `Pack.block_mask()` marks
the same blocks as torch's own `create_block_mask` and applies exactly `Pack.mask()`, on random layouts and on the
shipped SmolLM2 rows; through TRL's trainer, the packed logprobs and entropies equal TRL's per-row ones. On CUDA
(the lent H200; skipped here): the compiled FlexAttention forward and backward give the per-row loss and every
LoRA gradient, in fp32 to 1e-4 of the largest entry, and in bf16 no further from the fp32 reference than 2x
the per-row bf16 path's own error (the bf16 floor, measured in the same test), without recompiling per layout.
"""

from __future__ import annotations

import copy
import itertools
import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from transformers import AutoModelForCausalLM, Qwen2Config

from test_group_step import BATCH, TOL, padded, tiny  # noqa: F401  (tiny: the module-scoped trainer fixture)
from workbench.train import group_pack, group_step
from workbench.train.group_pack import Pack, attention_for, plan

CUDA = torch.cuda.is_available()


def layout(n: int, lengths: list[int]) -> Pack:
    seg = torch.cat([torch.full((n,), -1)] + [torch.full((m,), k) for k, m in enumerate(lengths)])
    L = len(seg)
    return Pack(
        list(range(len(lengths))),
        torch.zeros(L, dtype=torch.long),
        torch.arange(L),
        torch.zeros(L),
        seg,
        n,
        tuple(lengths),
    )


def assert_block_mask_is_the_tree_mask(pack: Pack, block: int) -> None:
    L = len(pack.ids)
    seg = torch.cat([pack.segment, torch.full(((-L) % block,), -2)])
    ref = create_block_mask(
        lambda b, h, q, kv: (q >= kv) & ((seg[kv] == -1) | (seg[kv] == seg[q])), None, None, L, L, "cpu", block
    )
    got = pack.block_mask(block=block)
    assert torch.equal(got.to_dense(), ref.to_dense())  # the same blocks computed, the rest skipped
    if L % block == 0:  # a block holding padding past L is never 'full' in ours (the mask_mod runs there)
        assert torch.equal(got.full_kv_num_blocks, ref.full_kv_num_blocks)
    g = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(1, h, L, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    out = flex_attention(q, k, v, block_mask=got, enable_gqa=True)
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=pack.mask(), enable_gqa=True)
    torch.testing.assert_close(out, dense, atol=1e-12, rtol=0)


@pytest.mark.parametrize("block", [16, 128])
def test_block_mask_applies_exactly_the_tree_mask_on_random_layouts(block):
    g = torch.Generator().manual_seed(block)
    for _ in range(12):
        n = int(torch.randint(0, 3 * block, (), generator=g))
        lengths = torch.randint(1, 2 * block, (int(torch.randint(1, 6, (), generator=g)),), generator=g).tolist()
        assert_block_mask_is_the_tree_mask(layout(n, lengths), block)


class _Attention(torch.nn.Module):  # what transformers' sdpa reads from an attention module (Qwen2's GQA)
    num_key_value_groups = 2
    is_causal = True


def test_grouped_attention_is_the_tree_mask_forward_and_backward_on_random_layouts():
    """`wb_groups` (each group of segments against the shared keys and its own) equals one SDPA with the dense tree
    mask, outputs and the gradients of q, k, v, in float64: every segment alone, and the segments in two groups; a
    layout with no shared token (n = 0) included."""
    g = torch.Generator().manual_seed(7)
    for n in (0, 1, 37, 200):
        lengths = torch.randint(1, 90, (int(torch.randint(1, 6, (), generator=g)),), generator=g).tolist()
        pack = layout(n, lengths)
        L = len(pack.ids)
        q, k, v = (torch.randn(1, h, L, 8, generator=g, dtype=torch.float64, requires_grad=True) for h in (4, 2, 2))
        w = torch.randn(1, L, 4, 8, generator=g, dtype=torch.float64)  # a loss that weighs every output
        mask = pack.mask()
        dense = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)
        ref = torch.autograd.grad((dense * w).sum(), (q, k, v))
        half = len(lengths) // 2
        two = (sum(lengths[:half]), sum(lengths[half:])) if half else (sum(lengths),)
        for groups in (pack.lengths, two):
            got, _ = group_pack._group_attention(_Attention(), q, k, v, mask, wb_shared=n, wb_groups=groups)
            grads = torch.autograd.grad((got * w).sum(), (q, k, v))
            torch.testing.assert_close(got, dense, atol=1e-12, rtol=0)
            for a, b in zip(grads, ref):
                torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_groups_cut_long_segments_apart_and_keep_short_ones_whole(monkeypatch):
    multi = layout(2931, [62, 513, 513, 513, 151, 119, 243, 145, 217, 726, 333, 1038])  # the third run's step 8
    assert len(multi.groups) > 1 and sum(multi.groups) == sum(multi.lengths)
    # each group is whole segments, in order
    ends = set(itertools.accumulate(multi.lengths))
    assert set(itertools.accumulate(multi.groups)) <= ends
    one_call = layout(2900, [40] * 8)  # a one-call group: a call per segment would cost more than the pairs saved
    assert one_call.groups == (320,)
    ids, am, K = padded(BATCH)  # the shipped rows: short suffixes
    assert all(len(p.groups) == 1 for p in plan(ids, am, K).packs)
    monkeypatch.setattr(group_pack, "ATTENTION_COST", (1.0, 0.0, 0.0))  # pairs alone: every segment its own call
    assert layout(2900, [40] * 8).groups == (40,) * 8
    monkeypatch.setattr(group_pack, "ATTENTION_COST", (1.0, 1e9, 0.0))  # keys alone: one call
    assert layout(2931, multi.lengths).groups == (sum(multi.lengths),)


def test_block_mask_of_the_shipped_rows():
    ids, am, K = padded(BATCH)
    packs = plan(ids, am, K).packs
    assert {3076, 3106} <= {p.n_shared for p in packs}  # the two forked pairs; the lone row is one segment
    for pack in packs:
        assert_block_mask_is_the_tree_mask(pack, 128)


def test_auto_picks_flex_only_where_it_has_a_backward():
    assert attention_for("auto", "cpu") == "blockwise"
    assert attention_for("auto", "cuda") == ("flex" if CUDA else "blockwise")
    assert attention_for("dense", "cuda") == "dense"
    with pytest.raises(ValueError, match="attention must be"):
        attention_for("flash", "cpu")


def test_flex_logprobs_and_entropies_equal_trls_per_row(tiny):  # noqa: F811
    ids, am, K = padded(BATCH)
    with torch.no_grad():
        ref = type(tiny)._get_per_token_logps_and_entropies(tiny, tiny.model, ids, am, K, compute_entropy=True)
        step = group_step.install(tiny, attention="flex")
        try:
            got = tiny._get_per_token_logps_and_entropies(tiny.model, ids, am, K, compute_entropy=True)
        finally:
            step.remove()
    assert step.attention == "flex" and step.last["packs"] == 3
    torch.testing.assert_close(got[0], ref[0], atol=TOL, rtol=0)
    torch.testing.assert_close(got[1], ref[1], atol=TOL, rtol=0)


# -- CUDA: the compiled forward and backward against the per-row path --------------------------------------------


SMALL = {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2}


def lora_model(device: str, dtype: torch.dtype, **shape: int) -> torch.nn.Module:
    """A random Qwen2 (SMALL unless `shape`; GQA, qkv bias, tied head), LoRA on every linear layer, seed 0.
    benchmarks/gpu_group_step.py measures the bf16 floor with these helpers at the Qwen2.5-0.5B shape."""
    torch.manual_seed(0)
    config = Qwen2Config(
        **({"num_attention_heads": 4, "num_key_value_heads": 2} | SMALL | shape),
        tie_word_embeddings=True,
        use_cache=False,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation=group_pack.ATTENTION, dtype=dtype)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=targets)
    model = get_peft_model(model, lora).to(device)
    for name, p in model.named_parameters():  # LoRA B is 0 at init: A would get no gradient
        if "lora_B" in name:
            p.data.normal_(0.0, 0.05)
    return model


def group_batch(
    G: int, prefix: int, device: str, tail: tuple[int, int] = (40, 300), vocab: int = 512
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """G rows of one shared prompt and private tails of different lengths: TRL's right-padded (B, P + K)."""
    g = torch.Generator().manual_seed(G)
    shared = torch.randint(0, vocab, (prefix,), generator=g)
    tails = [torch.randint(0, vocab, (int(m),), generator=g) for m in torch.randint(*tail, (G,), generator=g)]
    K = max(len(t) for t in tails)
    ids = torch.zeros(G, prefix + K, dtype=torch.long)
    am = torch.zeros_like(ids)
    for b, t in enumerate(tails):
        ids[b, : prefix + len(t)] = torch.cat([shared, t])
        am[b, : prefix + len(t)] = 1
    adv = torch.linspace(-1, 1, G)
    return ids.to(device), am.to(device), K, adv.to(device)


def per_row_loss(model, ids, am, K, adv, dtype) -> torch.Tensor:
    """TRL's per-row logprobs (each row alone, causal sdpa), advantage-weighted over its completion tokens."""
    total = ids.new_zeros((), dtype=torch.float32)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        for b in range(len(ids)):
            n = int(am[b].sum())
            logits = model(input_ids=ids[b : b + 1, :n]).logits[0].float()
            lp = logits[:-1].log_softmax(-1).gather(-1, ids[b, 1:n, None])[:, 0]
            total = total + adv[b] * lp[-(n - (ids.shape[1] - K)) :].sum()
    return total / am[:, -K:].sum()


def packed_loss(model, ids, am, K, adv, dtype) -> torch.Tensor:
    p = plan(ids, am, K)
    logps = []
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        for pack in p.packs:
            out = model(
                input_ids=pack.ids[None].to(ids.device),
                attention_mask=pack.block_mask(ids.device),
                position_ids=pack.positions[None].to(ids.device),
            )
            labels = pack.labels.to(ids.device).clamp(min=0)
            logps.append(out.logits[0].float().log_softmax(-1).gather(-1, labels[:, None])[:, 0])
    lp = torch.cat([*logps, logps[0].new_zeros(1)])[p.index]
    return (adv[:, None] * lp * am[:, -K:]).sum() / am[:, -K:].sum()


def loss_and_grads(model, fn, *args) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = fn(model, *args)
    loss.backward()
    return loss.item(), {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}


def grad_error(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> float:
    assert ref.keys() == got.keys() and any("lora_A" in k for k in ref)
    return max(((got[k] - g).abs().max() / g.abs().max()).item() for k, g in ref.items())


@pytest.mark.skipif(not CUDA, reason="compiled FlexAttention forward + backward: CUDA only (none on this host)")
def test_cuda_flex_loss_and_lora_gradients_equal_the_per_row_path():
    import torch._dynamo.utils

    torch.backends.cuda.matmul.allow_tf32 = False
    fp32 = lora_model("cuda", torch.float32)
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)  # the same weights, rounded
    errors = []
    for G, prefix in ((8, 700), (5, 1100), (16, 400)):  # three pack lengths: dynamic shapes, one compiled graph
        args = group_batch(G, prefix, "cuda")
        ref_loss, ref = loss_and_grads(fp32, per_row_loss, *args, torch.float32)
        loss, got = loss_and_grads(fp32, packed_loss, *args, torch.float32)
        assert abs(loss - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss)) and grad_error(ref, got) <= 1e-4
        floor_loss, floor = loss_and_grads(bf16, per_row_loss, *args, torch.bfloat16)
        b_loss, b = loss_and_grads(bf16, packed_loss, *args, torch.bfloat16)
        errors.append((grad_error(ref, floor), grad_error(ref, b), abs(floor_loss - ref_loss), abs(b_loss - ref_loss)))
        if len(errors) == 1:
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    print("bf16 floor vs flex (grad, grad, loss, loss):", errors)
    for floor_grad, flex_grad, floor_loss_d, flex_loss_d in errors:
        assert flex_grad <= 2 * floor_grad and flex_loss_d <= 2 * floor_loss_d + 1e-4
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs, "a new pack length recompiled"

"""The shared-prefix layout of a GRPO batch (lever 1 of `workbench.train.group_step`): packs, their tree mask and
position ids, the index that gathers each row's logprobs back, and the attention that runs a pack blockwise.

`plan` clusters a TRL batch's rows by common prefix and lays each cluster out as ONE sequence: the shared
tokens once, then every row's own segment (opened by a copy of the last shared token, so each hidden
state predicts exactly one next token), with TRL's position ids (padded indices) and labels (-100 where
nothing is scored). A segment attends to the shared tokens and causally to itself (`Pack.mask`).
Importing this module registers `ATTENTION` with transformers: plain sdpa for every other forward, and,
when the forward carries ``wb_shared=n``, causal SDPA over the n shared positions plus masked SDPA of
the segments against all keys (half the cost of one SDPA with the dense 4D mask here); with ``wb_groups`` too
(`Pack.groups`, long segments: a multi-call rollout's calls), one masked SDPA per group of segments against the
shared keys and the group's own, skipping most of the pairs the mask would drop. Given `Pack.block_mask()`
as its attention mask instead, the whole pack is one FlexAttention call that skips the masked-out 128 x 128
blocks: compiled (dynamic shapes, once per process) on CUDA, where the dense boolean mask sent SDPA to its math
kernel (0.22x TRL's step, benchmarks/README.md section 8); eager on the CPU (forward only: torch has no CPU
FlexAttention backward, so the CPU trainer keeps the blockwise SDPA).

    from workbench.train.group_pack import ATTENTION, plan
    p = plan(input_ids, attention_mask, logits_to_keep)      # TRL's (B, P+K) batch
    for pack in p.packs:                                      # model.config._attn_implementation = ATTENTION
        out = model(input_ids=pack.ids[None], attention_mask=pack.mask(), position_ids=pack.positions[None],
                    shift_labels=pack.labels[None], fused_lm_head=True, **pack.blockwise_kwargs())
    # torch.cat([*per-pack log_probs, zero])[p.index] is TRL's (B, K) per-token logprobs
    # CUDA: attention_mask=pack.block_mask(device) (and no wb_shared) takes the FlexAttention path
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

__all__ = ["ATTENTION", "ATTENTION_COST", "FLEX_BLOCK", "Pack", "Plan", "attention_for", "flex_attention_on", "plan"]

ATTENTION = "wb_group_sdpa"  # sdpa, plus the blockwise tree attention when the forward carries `wb_shared`
FLEX_BLOCK = 128  # FlexAttention's default sparse block: a 128 x 128 tile is skipped, computed whole, or masked
# `Pack.groups`' cost model of one masked SDPA forward + backward at qwen-coder's attention shape, bf16, 2 threads:
# seconds per query-key pair, per key, per call. Fitted on the AMD EPYC Zen 4 host (AVX512-BF16) to 11 shapes
# (benchmarks/segment_attention.py's fit: results/segment_attention/2026-12-07T031029_*.fit.json): every key costs a
# call ~90 pairs' worth, so a short segment does not pay for its own call; the per-call term fitted slightly negative
# (-3.3 ms), taken as 0. On another host the cut may be less than the best one; the attention is exact whatever the cut.
ATTENTION_COST = (7.0e-8, 6.4e-6, 0.0)


@functools.cache
def _compiled_flex() -> Callable[..., Tensor]:
    # dynamic=True: one graph for every pack length (a pack's length changes every step); the BlockMask's
    # tensors and its mask_mod's captured segment ids are graph inputs, so a new layout does not recompile.
    return cast(Callable[..., Tensor], torch.compile(flex_attention, dynamic=True))


def flex_attention_on(device: torch.device | str) -> bool:
    """Whether the packed step takes the FlexAttention path on `device`: CUDA with Triton (compiled forward and
    backward). Not the CPU, where torch 2.13's FlexAttention has no backward."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401  (torch.compile's CUDA backend)
    except ImportError:
        return False
    return True


def attention_for(attention: str, device: torch.device | str) -> str:
    """The packed attention `group_step.install(attention=...)` runs: "auto" is "flex" where `flex_attention_on`
    (CUDA), else "blockwise" (causal + masked SDPA); "dense" is one SDPA with the 4D tree mask."""
    if attention not in ("auto", "blockwise", "dense", "flex"):
        raise ValueError(f"attention must be 'auto', 'blockwise', 'dense' or 'flex', got {attention!r}")
    return attention if attention != "auto" else "flex" if flex_attention_on(device) else "blockwise"


def _flex(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, mask: BlockMask, **kwargs: Any) -> Tensor:
    if kwargs.get("dropout", 0.0) or kwargs.get("sliding_window") is not None:
        raise ValueError("the FlexAttention tree mask supports neither attention dropout nor a sliding window")
    attend = _compiled_flex() if query.is_cuda else cast(Callable[..., Tensor], flex_attention)
    out = attend(
        query, key, value, block_mask=mask, scale=kwargs.get("scaling"), enable_gqa=key.shape[1] != query.shape[1]
    )
    return cast(Tensor, out).transpose(1, 2).contiguous()  # (1, L, heads, head_dim), as sdpa_attention_forward's


def _grouped(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor,
    n: int,
    lengths: tuple[int, ...],
    **kwargs: Any,
) -> Tensor:
    """The segments group by group (`Pack.groups`), each against the shared keys and its own: the pairs the tree
    mask allows and few others. `torch.split`, not slicing: the backward of 3 x 12 slices wrote a zero tensor of
    the whole pack per slice (in a profile of step 8's pack, fill_, copy_, cat and add_ took 37% of the time)."""
    qs, ks, vs = (torch.split(t, [n, *lengths], dim=2) for t in (query, key, value))
    out = [sdpa_attention_forward(module, qs[0], ks[0], vs[0], None, **kwargs)[0]] if n else []
    at = n
    for i, length in enumerate(lengths, 1):
        seen = torch.cat([mask[:, :, at : at + length, :n], mask[:, :, at : at + length, at : at + length]], -1)
        k, v = (torch.cat([t[0], t[i]], dim=2) if n else t[i] for t in (ks, vs))
        out.append(sdpa_attention_forward(module, qs[i], k, v, seen, **kwargs)[0])
        at += length
    return torch.cat(out, dim=1)


def _group_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    wb_shared: int | None = None,
    wb_groups: tuple[int, ...] | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:  # kwargs: transformers' own (dropout, scaling, ...)
    if isinstance(attention_mask, BlockMask):  # Pack.block_mask(): the whole pack in one FlexAttention call
        return _flex(module, query, key, value, attention_mask, **kwargs), None
    if wb_shared is None:  # every other forward (TRL's own, generation): plain sdpa, same mask function
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    n = wb_shared
    assert attention_mask is not None and query.shape[0] == 1
    if wb_groups is not None:  # Pack.groups: long segments
        return _grouped(module, query, key, value, attention_mask, n, wb_groups, **kwargs), None
    tail, _ = sdpa_attention_forward(module, query[:, :, n:], key, value, attention_mask[:, :, n:], **kwargs)
    if n == 0:
        return tail, None
    head, _ = sdpa_attention_forward(module, query[:, :, :n], key[:, :, :n], value[:, :, :n], None, **kwargs)
    return torch.cat([head, tail], dim=1), None


ALL_ATTENTION_FUNCTIONS.register(ATTENTION, _group_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


@dataclass
class Pack:
    """One cluster as one sequence: `n_shared` shared tokens, then each row's segment (its tokens from n_shared)."""

    rows: list[int]
    ids: Tensor  # (L,)
    positions: Tensor  # (L,) TRL's: the padded index (prompts are left-padded)
    labels: Tensor  # (L,) the token each position's hidden state predicts, -100 where nothing is scored
    segment: Tensor  # (L,) -1 on the shared tokens, else the segment's number
    n_shared: int
    lengths: tuple[int, ...]  # each segment's length, in order

    @functools.cached_property
    def groups(self) -> tuple[int, ...]:
        """The segments cut into contiguous groups, in tokens: each group is one masked SDPA of its queries against
        the shared keys and its own (`wb_groups`). One group is the whole tail (every key); one group a segment
        computes only the pairs the tree mask allows, but each call pays for its keys again. The cut minimises
        `ATTENTION_COST` by a small dynamic program: a one-call group (8 x 40 tokens past 2,931) stays whole, a
        multi-call one (62-1,038 tokens past 2,931: 0.43 of the pairs apart) is cut (benchmarks/README.md, 16)."""
        pair_s, key_s, call_s = ATTENTION_COST
        n, ends = self.n_shared, [0, *itertools.accumulate(self.lengths)]
        best, cut = [0.0] + [math.inf] * len(self.lengths), [0] * (len(self.lengths) + 1)
        for j in range(1, len(ends)):
            for i in range(j):
                q = ends[j] - ends[i]
                cost = best[i] + pair_s * q * (n + q) + key_s * (n + q) + call_s
                if cost < best[j]:
                    best[j], cut[j] = cost, i
        groups, j = [], len(self.lengths)
        while j:
            groups.append(ends[j] - ends[cut[j]])
            j = cut[j]
        return tuple(reversed(groups))

    def blockwise_kwargs(self) -> dict[str, Any]:
        """The forward's kwargs for the blockwise attention of this pack: ``wb_shared``, and ``wb_groups`` if cut."""
        return {"wb_shared": self.n_shared, **({"wb_groups": self.groups} if len(self.groups) > 1 else {})}

    def mask(self) -> Tensor:
        """(1, 1, L, L) bool tree mask: causal, and a segment sees only the shared tokens and itself."""
        i = torch.arange(len(self.ids))
        s = self.segment
        return ((i[None, :] <= i[:, None]) & ((s[None, :] == -1) | (s[None, :] == s[:, None])))[None, None]

    def block_mask(self, device: torch.device | str = "cpu", block: int = FLEX_BLOCK) -> BlockMask:
        """`mask()` as FlexAttention's BlockMask, built from the layout without the L x L matrix.

        Row i sees keys [0, min(n, i + 1)) and [max(start of its run, n), i + 1), so the allowed keys of every
        row in a key block are two interval overlaps: an (L, L / block) count, summed per query block. A block
        pair is skipped when its count is 0, computed without the mask when it is block^2 (every pair allowed,
        never a block holding padding past L), else masked by `mask_mod`. For torch's create_block_mask the
        mask_mod's gathers would be (L, L) int64: 7.7 GB at a 31k-token pack (G = 16 opencode rows)."""
        dev, L, n = torch.device(device), len(self.ids), self.n_shared
        nb = -(-L // block)
        seg = torch.full((nb * block,), -2, dtype=torch.int32)  # -2 past L: in-bounds reads, and never allowed
        seg[:L] = self.segment
        i = torch.arange(L)
        run_start = torch.where(torch.cat([torch.tensor([True]), seg[1:L] != seg[: L - 1]]), i, 0).cummax(0).values
        lo1, hi0, hi1 = run_start.clamp(min=n)[:, None], (i + 1).clamp(max=n)[:, None], (i + 1)[:, None]
        c = torch.arange(nb) * block
        d = (c + block).clamp(max=L)
        count = (hi0.minimum(d) - c).clamp(min=0) + (hi1.minimum(d) - lo1.maximum(c)).clamp(min=0)
        count = torch.cat([count, count.new_zeros(nb * block - L, nb)]).view(nb, block, nb).sum(1)
        full, partial = count == block * block, (count > 0) & (count < block * block)

        def ordered(blocks: Tensor) -> tuple[Tensor, Tensor]:  # (num, indices), the chosen blocks first, in order
            idx = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True)
            return blocks.sum(-1).to(torch.int32)[None, None].to(dev), idx.to(torch.int32)[None, None].to(dev)

        seg_dev = seg.to(dev)

        def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            return (q >= kv) & ((seg_dev[kv] == -1) | (seg_dev[kv] == seg_dev[q]))

        num, idx = ordered(partial)
        full_num, full_idx = ordered(full)
        return BlockMask.from_kv_blocks(
            num, idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(L, L)
        )


@dataclass
class Plan:
    """How a TRL batch (B, P+K) is computed as packs, and where each row's K logprobs come from."""

    packs: list[Pack]
    index: Tensor  # (B, K) into the packs' concatenated positions; the extra last slot is a 0
    row_tokens: int  # real tokens of the rows (what TRL forwards, without its padding)
    padded_tokens: int  # B x (P+K): what TRL's own path forwards per pass

    @property
    def forwarded_tokens(self) -> int:
        return sum(len(p.ids) for p in self.packs)


def _lcp(a: Tensor, b: Tensor) -> int:
    m = min(len(a), len(b))
    diff = (a[:m] != b[:m]).nonzero()
    return int(diff[0]) if len(diff) else m


def plan(input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int) -> Plan:
    """Cluster the rows by shared prefix and lay them out as packs.

    Rows can share a position only with the same left padding (TRL's position ids are padded indices).
    Sorted lexicographically, rows with long common prefixes are adjacent; the clusters are the contiguous
    runs of that order maximising the tokens saved, (rows - 1) x (shared length), by a small dynamic program.
    """
    B, T = input_ids.shape
    P = T - logits_to_keep
    am = attention_mask.bool().cpu()
    ids_cpu = input_ids.cpu()
    start = am.int().argmax(1).tolist()
    length = am.sum(1).tolist()
    rows = [ids_cpu[b, start[b] : start[b] + length[b]] for b in range(B)]
    for b in range(B):
        if not am[b, start[b] : start[b] + length[b]].all():
            raise ValueError(f"row {b}: its attention mask is not one contiguous run")
    order = sorted(range(B), key=lambda b: (start[b], rows[b].tolist()))
    adj = [_lcp(rows[a], rows[b]) if start[a] == start[b] else 0 for a, b in zip(order, order[1:])]
    # best[j]: most tokens saved by the first j rows of `order`; cut[j]: where the last run begins
    best, cut = [0] + [-1] * B, [0] * (B + 1)
    for j in range(1, B + 1):
        shared = T  # no run yet: every lcp is at most T, so the first min() below sets it
        for i in range(j - 1, -1, -1):  # run order[i:j]
            if i < j - 1:
                shared = min(shared, adj[i])
            gain = best[i] + ((j - i - 1) * (shared - 1) if i < j - 1 else 0)
            if i < j - 1 and shared < 2:
                break
            if gain > best[j]:
                best[j], cut[j] = gain, i
    runs, j = [], B
    while j > 0:
        runs.append(order[cut[j] : j])
        j = cut[j]
    packs, index, offset = [], torch.empty(B, logits_to_keep, dtype=torch.long), 0
    total = sum(length) + B  # upper bound on the packed length, so the zero slot is known up front
    for run in reversed(runs):
        s = start[run[0]]
        c = min((_lcp(rows[run[0]], rows[b]) for b in run[1:]), default=length[run[0]])
        n = c - 1  # the last common token opens every segment
        ids, pos, lab, seg, seg_start = [rows[run[0]][:n]], [s + torch.arange(n)], [], [torch.full((n,), -1)], {}
        nxt = rows[run[0]][1 : n + 1].clone()
        nxt[s + torch.arange(n) + 1 < P] = -100  # only completion tokens (padded index >= P) are scored
        lab.append(nxt)
        at = n
        for k, b in enumerate(run):
            x, m = rows[b], length[b] - n
            seg_start[b] = at
            ids.append(x[n:])
            pos.append(s + n + torch.arange(m))
            target = torch.cat([x[n + 1 :], torch.tensor([-100])])
            target[s + n + torch.arange(m) + 1 < P] = -100
            lab.append(target)
            seg.append(torch.full((m,), k))
            at += m
        lengths = tuple(length[b] - n for b in run)
        packs.append(Pack(list(run), torch.cat(ids), torch.cat(pos), torch.cat(lab), torch.cat(seg), n, lengths))
        for b in run:
            real = P - s + torch.arange(logits_to_keep)  # real index of each completion slot's token
            src = real - 1  # ... predicted from the previous position
            local = torch.where(src < n, src, seg_start[b] + src - n)
            index[b] = torch.where(real < length[b], offset + local, total)
        offset += at
    index[index == total] = offset  # the zero slot sits right after the last pack
    return Plan(packs, index.to(input_ids.device), sum(length), B * T)

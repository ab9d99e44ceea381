"""The shared-prefix GRPO step (workbench.train.group_step) computes TRL 1.16's own step, on real captured rows.

Rows come from the shipped SmolLM2 traces (workbench/data/rollouts/smollm2-*): a 2-turn chained row with interior
<|im_end|> tokens, and two forked rollouts whose rows share a prefix that runs ~40 tokens into the sampled reply.
The model is the tiny random Qwen3 (its vocabulary holds SmolLM2's ids) with SmolLM2's tokenizer, so <|im_end|>
(id 2) is the trainer's EOS; one test runs SmolLM2 itself on shortened rows. The reference is always TRL's own
`_get_per_token_logps_and_entropies` and `_generate_and_score_completions` on the same trainer.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.queues
import platform
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from workbench import _compat
from workbench.train import group_pack, group_step
from workbench.engine import build_asset, load_asset
from workbench.rollout import RolloutResult
from workbench.tasks import load_tasks
from workbench.train.grpo import GRPORun, TrainConfig, hidden_test_reward
from workbench.train.fields import step_fields
from workbench.turns import analyse, Row, load_trace

FIXTURES = Path(__file__).parent.parent / "workbench" / "data" / "rollouts"
T = 0.7
TOL = 1e-5
IM_END = 2  # SmolLM2's <|im_end|>, its tokenizer's eos and pad


def rows_of(name: str) -> list[Row]:
    """The trace's rows with every agent turn trained (so later turns, after an <|im_end|>, are trained too)."""
    return analyse(load_trace(FIXTURES / name / "trace.json"), None, lambda call: True).rows


EASY = rows_of("smollm2-easy")  # one row: 2 turns chained (3159 tokens, 9 <|im_end|>)
BPE = rows_of("smollm2-fork-bpe")  # two rows sharing 3107 tokens; the first output starts at 3066
INVALID = rows_of("smollm2-fork-invalid")  # two rows sharing 3077 tokens; the first output starts at 3067


def trl_row(row: Row, split: int) -> tuple[list[int], list[int], list[int]]:
    return row.input_ids[:split], row.input_ids[split:], row.mask[split:]


# Each group of rows is split at one index (its first output), as every_row_fields does: equal left padding.
BATCH = [trl_row(EASY[0], 3065)] + [trl_row(r, 3066) for r in BPE] + [trl_row(r, 3067) for r in INVALID]


def make_trainer(tmp: Path, model_dir: Path, group_size: int, tokenizer_dir: Path | None = None) -> object:
    asset = tmp / "asset"  # the model with SmolLM2's tokenizer, built exactly as workbench.train.grpo builds it
    asset.mkdir()
    for f in ("config.json", "model.safetensors"):
        (asset / f).symlink_to(model_dir / f)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy((tokenizer_dir or FIXTURES / "smollm2-tokenizer") / f, asset / f)
    # TRL's own step (every lever off), as workbench.train.grpo builds it; the tests install the levers themselves
    config = TrainConfig.baseline(
        model="tiny",
        tasks="easy[:1]",
        group_size=group_size,
        steps=1,
        temperature=T,
        train_threads=1,
        learning_rate=1e-3,
    )
    trainer = GRPORun(config, run_dir=tmp / "run")._build_trainer(asset)

    class NoSync:
        def sync_weights(self) -> None:
            pass

    trainer.vllm_generation = NoSync()
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    g = torch.Generator().manual_seed(0)
    for name, p in trainer.model.named_parameters():  # LoRA B is 0 at init: A would get no gradient
        if "lora_B" in name:
            p.data.normal_(0.0, 0.05, generator=g)
    return trainer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_trainer(tmp_path_factory.mktemp("tiny"), build_asset("tiny").path, group_size=5)


def own_logprobs(trainer, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The trainer's own fp32 logprobs of one row (TRL's method, no padding): the 'engine' logprobs."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        lp, _, _ = type(trainer)._get_per_token_logps_and_entropies(
            trainer, trainer.model, ids, torch.ones_like(ids), len(completion)
        )
    return lp[0]


# Engine-vs-trainer offsets (nats) put on the trained tokens so that IS clipping and masking really happen; far
# from the thresholds (log 3 = 1.10, log 0.5 = -0.69) so that 1e-7 differences cannot flip a mask.
PATTERN = (0.0, 0.3, 0.0, -0.3, 1.6, 0.0, -1.6, 0.05, 0.0)
ROW_OFFSET = (0.0, 2.5, -2.0, 0.4, -0.4, 0.0)


def scripted(batch: list[tuple[list[int], list[int], list[int]]], rewards: list[float]) -> Callable:
    cache: list[list[float]] = []

    def rollout_func(prompts, trainer):
        if not cache:
            for i, (p, c, m) in enumerate(batch):
                lp = own_logprobs(trainer, p, c).tolist()
                trained = [k for k, x in enumerate(m) if x]
                for j, k in enumerate(trained):
                    lp[k] -= PATTERN[(i + j) % len(PATTERN)] + (ROW_OFFSET[i % len(ROW_OFFSET)] if j == 0 else 0.0)
                cache.append(lp)
        return {
            "prompt_ids": [b[0] for b in batch],
            "completion_ids": [b[1] for b in batch],
            "logprobs": cache,
            "env_mask": [b[2] for b in batch],
            "wb_reward": rewards,
        }

    return rollout_func


def one_step(trainer, rows: int = len(BATCH)) -> tuple[dict, torch.Tensor, dict[str, torch.Tensor]]:
    """TRL's step on one generation batch, without the optimizer: (inputs of the loss, loss, LoRA gradients)."""
    trainer.model.zero_grad(set_to_none=True)
    out = trainer._generate_and_score_completions([{"prompt": "easy/0"} for _ in range(rows)])  # one dict per row
    loss = trainer.compute_loss(trainer.model, out)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return out, loss.detach(), grads


def step_error(ref: tuple, got: tuple) -> tuple[float, float]:
    """(|loss difference| / max(1, |loss|), the largest per-tensor max |gradient difference| / max |gradient|)."""
    (_, l1, g1), (_, l2, g2) = ref, got
    assert g1.keys() == g2.keys() and any("lora_A" in k for k in g1), "every LoRA tensor gets a gradient"
    assert abs(l1.item()) > 1e-3 and all(g.abs().max() > 0 for g in g1.values())
    grad = max(((g2[k].double() - g).abs().max() / g.abs().max()).item() for k, g in g1.items())
    return abs(l1.item() - l2.item()) / max(1.0, abs(l1.item())), grad


def assert_same_step(ref: tuple, got: tuple, tol: float = TOL) -> None:
    loss, grad = step_error(ref, got)
    assert loss <= tol and grad <= tol, (loss, grad)
    torch.testing.assert_close(got[0]["advantages"], ref[0]["advantages"])


# -- the layout --------------------------------------------------------------------------------------------------


def padded(batch):
    """TRL's tensors for rollout_func rows: prompts left-padded, completions right-padded."""
    P, K = max(len(p) for p, _, _ in batch), max(len(c) for _, c, _ in batch)
    ids = torch.full((len(batch), P + K), IM_END)
    am = torch.zeros_like(ids)
    for b, (p, c, _) in enumerate(batch):
        ids[b, P - len(p) : P + len(c)] = torch.tensor(p + c)
        am[b, P - len(p) : P + len(c)] = 1
    return ids, am, K


def test_plan_packs_each_group_once_and_every_row_reads_its_own_tokens():
    ids, am, K = padded(BATCH)
    plan = group_pack.plan(ids, am, K)
    assert sorted(sorted(p.rows) for p in plan.packs) == [[0], [1, 2], [3, 4]]
    shared = {tuple(sorted(p.rows)): p.n_shared for p in plan.packs}
    assert shared[(1, 2)] == 3106 and shared[(3, 4)] == 3076  # beyond the 3066/3067-token prompts: sampled tokens
    assert plan.forwarded_tokens == plan.row_tokens - 3106 - 3076  # each pair's shared tokens once
    flat_ids = torch.cat([p.ids for p in plan.packs] + [torch.tensor([-1])])
    flat_labels = torch.cat([p.labels for p in plan.packs] + [torch.tensor([-100])])
    flat_pos = torch.cat([p.positions for p in plan.packs] + [torch.tensor([-1])])
    P = ids.shape[1] - K
    for b in range(len(BATCH)):
        for t in range(K):
            src = plan.index[b, t]
            if am[b, P + t]:  # the slot's hidden is the row's previous position, and it predicts the row's token
                assert flat_labels[src] == ids[b, P + t] and flat_ids[src] == ids[b, P + t - 1]
                assert flat_pos[src] == P + t - 1
            else:
                assert src == len(flat_ids) - 1
    for pack in plan.packs:  # every row is the shared tokens + its own segment, at TRL's positions
        mask = pack.mask()[0, 0]
        for k, b in enumerate(pack.rows):
            path = (pack.segment == -1) | (pack.segment == k)
            start = int(am[b].int().argmax())
            assert torch.equal(pack.ids[path], ids[b][am[b].bool()])
            assert torch.equal(pack.positions[path], start + torch.arange(int(am[b].sum())))
            last = int(path.nonzero()[-1])
            assert torch.equal(mask[last], path & (torch.arange(len(path)) <= last))  # sees exactly its own row


# -- exactness against TRL ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["blockwise", "every-segment", "dense"])
def test_logprobs_and_entropies_equal_trls_per_row(tiny, attention, monkeypatch):
    ids, am, K = padded(BATCH)
    if attention == "every-segment":  # a cost of pairs alone: `Pack.groups` gives every segment its own SDPA
        monkeypatch.setattr(group_pack, "ATTENTION_COST", (1.0, 0.0, 0.0))
    with torch.no_grad():
        ref = type(tiny)._get_per_token_logps_and_entropies(tiny, tiny.model, ids, am, K, compute_entropy=True)
        step = group_step.install(tiny, attention=attention.replace("every-segment", "blockwise"))
        try:
            got = tiny._get_per_token_logps_and_entropies(tiny.model, ids, am, K, compute_entropy=True)
        finally:
            step.remove()
    assert step.last["packs"] == 3 and step.last["forwarded_tokens"] < step.last["row_tokens"] * 0.65
    # the two packs of two rows split; the pack of one row has one segment (short segments: none split by default)
    assert step.last["split_packs"] == (2 if attention == "every-segment" else 0)
    scored = am[:, -K:].bool()
    assert (ref[0][scored] != 0).all() and (ref[0][~scored] == 0).all()
    torch.testing.assert_close(got[0], ref[0], atol=TOL, rtol=0)
    torch.testing.assert_close(got[1], ref[1], atol=TOL, rtol=0)


@pytest.mark.parametrize(
    "mode,checkpointing,every_segment",
    [("sequence_mask", True, False), ("token_truncate", False, False), ("token_truncate", True, True)],
)
def test_loss_and_lora_gradients_equal_trls_step(tiny, mode, checkpointing, every_segment, monkeypatch):
    """Shared prefix + IS ratio from the loss pass vs TRL's stock step (no-grad IS forward, per-row forward);
    `every_segment`: every pack's segments attended one at a time (`Pack.groups`), through the checkpoint replay too."""
    if every_segment:
        monkeypatch.setattr(group_pack, "ATTENTION_COST", (1.0, 0.0, 0.0))
    tiny.vllm_importance_sampling_mode = mode
    tiny.vllm_importance_sampling_clip_min = 0.5
    if checkpointing:
        tiny.model.gradient_checkpointing_enable()
    else:
        tiny.model.gradient_checkpointing_disable()
    tiny.rollout_func = scripted(BATCH, [1.0, 0.0, 0.0, 1.0, 0.5])
    ref = one_step(tiny)
    ratio = ref[0]["importance_sampling_ratio"]
    clipped = (ratio == 0) if mode.endswith("_mask") else (ratio == 3.0) | (ratio == 0.5)
    assert clipped.any() and (ratio[~clipped] != 1).any(), "the offsets should clip and reweight some tokens"
    step = group_step.install(tiny)
    calls = []
    get_logps = tiny._get_per_token_logps_and_entropies
    tiny._get_per_token_logps_and_entropies = lambda *a, **k: (
        calls.append(torch.is_grad_enabled()) or get_logps(*a, **k)
    )
    try:
        got = one_step(tiny)
    finally:
        step.remove()
        tiny.model.gradient_checkpointing_enable()
    assert calls == [True] and step.last["packs"] == 3, "one forward (the loss pass, packed), no no-grad IS pass"
    assert step.last["split_packs"] == (2 if every_segment else 0)
    assert "old_per_token_logps" not in got[0] and "importance_sampling_ratio" in got[0]  # filled by the loss pass
    torch.testing.assert_close(got[0]["importance_sampling_ratio"], ratio, atol=TOL, rtol=0)
    assert_same_step(ref, got)
    metrics = getattr(tiny, _compat.GRPO_METRICS)["train"]
    assert metrics["sampling/importance_sampling_ratio/mean"][-1] == pytest.approx(
        metrics["sampling/importance_sampling_ratio/mean"][-2], abs=TOL
    )


def count_forwards(trainer, calls: list[int]) -> None:
    """Append 1 to `calls` at every logprob pass of `trainer` (wraps the method `install` put on it)."""
    get_logps = trainer._get_per_token_logps_and_entropies
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: calls.append(1) or get_logps(*a, **k)


def test_a_group_with_one_reward_skips_the_pass_and_gets_trls_exact_zero_gradients(tiny):
    """Lever 6: one reward for the whole group gives advantages of 0, and TRL's own pass a loss of 0 and gradients
    of exactly 0. Installed, that batch runs no forward and every trainable tensor still gets its (zero) gradient:
    None would make AdamW skip the tensor (no moment decay, no weight decay), unlike TRL's step. A batch with a
    signal right after still runs the pass."""
    tiny.vllm_importance_sampling_mode = "token_truncate"
    tiny.rollout_func = scripted(BATCH, [1.0] * len(BATCH))
    ref = one_step(tiny)
    assert not ref[0]["advantages"].any() and ref[1].item() == 0.0
    assert any("lora_A" in k for k in ref[2]) and not any(g.any() for g in ref[2].values())
    calls: list[int] = []
    step = group_step.install(tiny)
    count_forwards(tiny, calls)
    try:
        got = one_step(tiny)
        assert calls == [] and step.last["forwarded_tokens"] == 0, "no forward for a batch without a signal"
        tiny.rollout_func = scripted(BATCH, [1.0, 0.0, 0.0, 1.0, 0.5])
        signal = one_step(tiny)
    finally:
        step.remove()
    assert got[1].item() == 0.0 and got[2].keys() == ref[2].keys() and not any(g.any() for g in got[2].values())
    assert calls == [1] and all(g.abs().max() > 0 for g in signal[2].values()), "a batch with a signal is trained"
    assert getattr(tiny, _compat.GRPO_METRICS)["train"]["group/loss_pass_skipped"][-2:] == [1.0, 0.0]
    tiny.rollout_func = scripted(BATCH, [1.0] * len(BATCH))
    step = group_step.install(tiny, skip_zero_advantage=False)  # the lever off (TrainConfig.baseline): TRL's pass
    count_forwards(tiny, calls)  # remove() took the first counter away with the step's own method
    try:
        again = one_step(tiny)
    finally:
        step.remove()
    assert calls == [1, 1] and again[1].item() == 0.0 and not any(g.any() for g in again[2].values())
    assert TrainConfig().skip_zero_advantage and not TrainConfig.baseline().skip_zero_advantage


def test_smollm2_loss_and_gradients_equal_trls_step(tmp_path):
    """SmolLM2-135M on the real rows without their first ~2,900 tokens: the last 142 few-shot tokens are common to
    all three, then the task messages differ (two rows of one forked rollout, one of another task).

    In float64 both paths compute the same function (<= 5e-6: TRL's LM-head kernel accumulates in float32 even
    for a float64 model; measured 6.5e-7). In float32 a 30-layer model cannot be held to
    1e-5 against any reference: TRL's own fp32 step is ~4.5e-5 (max per-tensor gradient error) from its float64
    value, and one more token of left padding moves TRL's logprobs by up to 1.9e-5. So float32 is checked
    against that floor: the packed step is no further from the exact (float64) step than TRL's own fp32 step.
    """
    asset = load_asset("smollm2")
    trainer = make_trainer(tmp_path, asset.path, group_size=3, tokenizer_dir=asset.path)
    trainer.vllm_importance_sampling_mode = "token_truncate"  # sequence sums would add ~60 tokens' rounding
    trainer.model.gradient_checkpointing_disable()  # checkpointing is checked on the tiny model; here it costs 1/3
    # The sandbox path in the system prompt tokenises 3 tokens longer in the BPE trace: cut there 3 tokens later.
    cut = {id(EASY[0]): 2900, id(BPE[0]): 2903, id(BPE[1]): 2903}
    split = 163  # the shortest prompt left (the BPE trace's task message); one split: one left padding
    batch = [
        trl_row(Row(r.input_ids[cut[id(r)] :], r.mask[cut[id(r)] :], [], [], [], []), split) for r in (EASY[0], *BPE)
    ]
    assert (
        EASY[0].input_ids[2900:3042] == BPE[0].input_ids[2903:3045]
        and EASY[0].input_ids[3042] != BPE[0].input_ids[3045]
    )
    trainer.rollout_func = scripted(batch, [1.0, 0.0, 0.5])
    steps = {}
    for dtype in (torch.float32, torch.float64):
        trainer.model.to(dtype)
        steps["trl", dtype] = one_step(trainer, len(batch))
        step = group_step.install(trainer)
        try:
            steps["ours", dtype] = one_step(trainer, len(batch))
        finally:
            step.remove()
        assert step.last["packs"] == 1 and step.last["shared_tokens"] == 141
    exact = steps["trl", torch.float64]
    assert_same_step(exact, steps["ours", torch.float64], tol=5e-6)
    trl_loss, trl_grad = step_error(exact, steps["trl", torch.float32])
    ours_loss, ours_grad = step_error(exact, steps["ours", torch.float32])
    assert ours_loss <= TOL and ours_grad <= 2 * trl_grad and ours_grad < 1e-4, (ours_grad, trl_grad)


def loss_pass_memory(trainer, **levers) -> tuple[torch.Tensor, dict[str, torch.Tensor], int, int]:
    """One step with `levers` installed: (loss, LoRA gradients, bytes the loss forward allocated and did not free
    (torch's profiler), tokens it forwarded)."""
    from torch.profiler import ProfilerActivity, profile

    step = group_step.install(trainer, **levers)
    try:
        trainer.model.zero_grad(set_to_none=True)
        out = trainer._generate_and_score_completions([{"prompt": "easy/0"} for _ in BATCH])
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            loss = trainer.compute_loss(trainer.model, out)
        kept = sum(e.self_cpu_memory_usage for e in prof.events())
        loss.backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        return loss.detach(), grads, kept, step.last["forwarded_tokens"]
    finally:
        step.remove()


def test_packed_mlps_keep_only_gate_and_up_and_the_step_is_the_same_to_the_bit(tiny):
    """Without checkpointing, `recompute_mlp` (the default) drops act(gate) and the product from what the loss
    forward keeps: 2 tensors of [forwarded tokens, intermediate] per layer, and the loss and every LoRA gradient
    stay bit-identical."""
    tiny.model.gradient_checkpointing_disable()
    tiny.vllm_importance_sampling_mode = "sequence_mask"
    tiny.rollout_func = scripted(BATCH, [1.0, 0.0, 0.0, 1.0, 0.5])
    try:
        loss1, grads1, kept1, tokens = loss_pass_memory(tiny)
        loss0, grads0, kept0, _ = loss_pass_memory(tiny, recompute_mlp=False)
    finally:
        tiny.model.gradient_checkpointing_enable()
    config = tiny.model.config
    saved = 2 * config.num_hidden_layers * tokens * config.intermediate_size * 4  # act(gate) and the product, fp32
    assert kept0 - kept1 == pytest.approx(saved, rel=0.02), (kept0, kept1, saved)
    assert torch.equal(loss0, loss1) and grads0.keys() == grads1.keys() and len(grads0) > 0
    assert all(torch.equal(grads0[k], grads1[k]) for k in grads0)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def _mapped_bytes_of_a_2mib_block(set_threshold: bool, out: multiprocessing.queues.Queue) -> None:
    """In a fresh process (glibc serves a block from its heap whenever a free chunk there fits, so only a process
    with a known heap shows the threshold): the bytes glibc mmapped for a 2 MiB block after a 16 MiB one was freed."""
    from workbench.train.trl_trainer import return_large_frees_to_the_os

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _Mallinfo2
    applied = return_large_frees_to_the_os() if set_threshold else False
    big = torch.empty(16 * 2**20, dtype=torch.uint8)
    del big  # glibc's default now raises its threshold to 16 MiB
    mapped = libc.mallinfo2().hblkhd
    block = torch.empty(2 * 2**20, dtype=torch.uint8)
    out.put((applied, libc.mallinfo2().hblkhd - mapped))
    del block


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
def test_large_blocks_get_their_own_mapping_so_that_their_frees_go_back_to_the_os():
    """What the CPU trainer sets (workbench.train.trl_trainer.build_trainer): without it, a 2 MiB block comes from the heap,
    where a freed block stays resident; with it, from its own mapping, unmapped when freed."""
    ctx = multiprocessing.get_context("spawn")
    got = {}
    for set_threshold in (False, True):
        out = ctx.Queue()
        proc = ctx.Process(target=_mapped_bytes_of_a_2mib_block, args=(set_threshold, out))
        proc.start()
        got[set_threshold] = out.get(timeout=120)
        proc.join(timeout=60)
    assert got[False] == (False, 0), "the default serves it from the heap"
    applied, mapped = got[True]
    assert applied and mapped >= 2 * 2**20


# -- what reaches TRL's loss in a real step ----------------------------------------------------------------------


def test_every_row_reaches_the_loss_with_its_mask_and_its_rollouts_advantage(tmp_path):
    """A real `trainer.train()` step: the chained row (interior <|im_end|>, both turns trained) and every row of
    two forked rollouts; the loss sees full completion masks, env_mask unchanged, rollout-level advantages."""
    rollouts = [EASY, BPE, INVALID]
    rewards = [1.0, 0.0, 0.5]
    fields, dropped = group_step.every_row_fields([rollouts], [rewards], slots=6, pad_id=IM_END)
    assert dropped == 0 and fields[group_step.OWNER_FIELD] == [0, 1, 2, 1, 2, -1]
    trainer = make_trainer(tmp_path, build_asset("tiny").path, group_size=6)
    assert IM_END in trainer.eos_token_ids and not trainer.mask_truncated_completions
    batch = list(zip(fields["prompt_ids"], fields["completion_ids"], fields["env_mask"]))
    rollout = scripted(batch, fields["wb_reward"])

    def rollout_func(prompts, trainer_):
        return {**rollout(prompts, trainer_), group_step.OWNER_FIELD: fields[group_step.OWNER_FIELD]}

    trainer.rollout_func = rollout_func
    step = group_step.install(trainer)
    seen = []
    compute_loss = trainer._compute_loss
    trainer._compute_loss = lambda model, inputs: seen.append(inputs) or compute_loss(model, inputs)
    trainer.train()
    (inputs,) = seen
    r = torch.tensor(rewards)
    lead = (r - r.mean()) / (r.std() + 1e-4)  # TRL: group mean and unbiased std over the 3 rollouts only
    expected_adv = torch.tensor([lead[0], lead[1], lead[2], lead[1], lead[2], 0.0])
    completions = inputs["completion_ids"].tolist()
    n_trained = 0
    for p, c, m in batch:
        b = next(
            i for i, x in enumerate(completions) if x[: len(c)] == c and inputs["completion_mask"][i].sum() == len(c)
        )
        assert inputs["completion_mask"][b, : len(c)].all()  # not cut at the first <|im_end|>
        assert inputs["tool_mask"][b, : len(c)].tolist() == list(m)  # env_mask reaches the loss as it was
        n_trained += sum(m)
        slot = batch.index((p, c, m))
        assert inputs["advantages"][b].item() == pytest.approx(expected_adv[slot].item(), abs=1e-5)
    easy_c, easy_m = fields["completion_ids"][0], fields["env_mask"][0]
    first_eos = easy_c.index(IM_END)
    assert sum(easy_m[first_eos + 1 :]) > 0, "the chained row trains tokens after its first <|im_end|>"
    assert inputs["num_items_in_batch"].item() == n_trained == sum(r.n_trained for rows in rollouts for r in rows)
    assert step.last["packs"] == 4  # the easy row, each forked pair once, the padding slot
    log = next(h for h in trainer.state.log_history if "loss" in h)
    assert log["group/forwarded_tokens"] < 0.7 * log["group/row_tokens"]


# -- scored rollouts without a row ------------------------------------------------------------------------------

BUDGET = 3200  # keeps every fixture row (3097-3197 tokens) but the forced-repo-task's one (5622)
SCORED_ZERO_CALL_LESS = ("timeout", "crashed", "harness_error", "limit_exceeded", "timeout", "ok")


def call_less_group(tmp: Path) -> list[RolloutResult]:
    """One task's group of 10 rollouts, 8 of them scored: 1 solve (the forked rollout: 2 rows), 6 scored 0 with no
    trace at all (the first call still pending at the timeout, a harness dead before calling...), 1 scored 0 whose
    only row is over the token budget, and 2 unscored (FAILED_STATUSES): one with rows, one without."""
    empty = tmp / "no-trace"  # a rollout folder without trace.json: no call was ever answered
    empty.mkdir()

    def result(i: int, status: str, reward: float | None, folder: Path | None) -> RolloutResult:
        return RolloutResult(f"r{i}", "easy/0", status, None, reward, folder, {})

    return [
        result(0, "ok", 1.0, FIXTURES / "smollm2-fork-bpe"),
        *(result(1 + k, s, 0.0, empty if k % 2 else None) for k, s in enumerate(SCORED_ZERO_CALL_LESS)),
        result(7, "ok", 0.0, FIXTURES / "smollm2-forced-repo-task"),
        result(8, "upstream_error", None, FIXTURES / "smollm2-fork-invalid"),
        result(9, "setup_failed", None, None),
    ]


@pytest.mark.parametrize(
    ("every_row", "packed"),
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["longest", "longest-packed", "every_row", "every_row-packed"],
)
def test_a_scored_rollout_without_rows_counts_in_its_groups_baseline(tmp_path, every_row, packed):
    """1 solve among 7 scored rollouts that left no row. TRL's group mean must be 1/8 and its std finite,
    so the solve's rows get a positive advantage (not NaN -> 0) and move the weights; the row-less rollouts are
    pad rows that carry their reward and no trained token; the unscored rollouts stay out of the baseline."""
    results = call_less_group(tmp_path)
    cfg = TrainConfig.baseline(
        model="tiny", tasks="easy[:1]", group_size=len(results), token_budget=BUDGET, every_row=every_row
    )
    trainer = make_trainer(tmp_path, build_asset("tiny").path, group_size=cfg.slots)
    fields, stats = step_fields(
        cfg,
        load_tasks("easy[:1]"),
        results,
        hidden_test_reward,
        lambda call: True,
        trainer.processing_class,
        policy=None,
    )
    assert stats["effective_group_size"] == 8 and stats["rows_dropped_budget"] == 1
    assert len(fields["prompt_ids"]) == cfg.slots
    trained = [any(m) for m in fields["env_mask"]]
    # The engine's logprobs are the trainer's own: IS ratios of 1, so only the advantages decide the gradient
    logprobs = [
        own_logprobs(trainer, p, c).tolist() if t else lp
        for p, c, lp, t in zip(fields["prompt_ids"], fields["completion_ids"], fields["logprobs"], trained)
    ]
    trainer.rollout_func = lambda prompts, trainer_: {**fields, "logprobs": logprobs}
    if every_row or packed:  # as workbench.train.grpo installs it (every_row always goes through group_step)
        group_step.install(trainer, shared_prefix=packed)
    out, loss, grads = one_step(trainer, rows=cfg.slots)

    scored = torch.tensor([1.0] + [0.0] * 7)
    std = scored.std().item()  # TRL's nanstd: Bessel-corrected, 0.354 over these 8
    metrics = trainer._metrics["train"]
    assert metrics["reward"][-1] == pytest.approx(1 / 8)  # the group's baseline: every scored rollout, no other
    assert metrics["reward_std"][-1] == pytest.approx(std) and metrics["frac_reward_zero_std"][-1] == 0.0
    adv = out["advantages"].tolist()
    loss_mask = (out["completion_mask"] * out["tool_mask"]).sum(1).tolist()
    rewards = fields["wb_reward"]
    solve = [i for i, r in enumerate(rewards) if r == 1.0]
    zeros = [i for i, r in enumerate(rewards) if r == 0.0]
    assert len(solve) == 1 and adv[solve[0]] == pytest.approx((1 - 1 / 8) / (std + 1e-4), abs=1e-4)
    assert adv[solve[0]] > 0 and loss_mask[solve[0]] > 0
    assert len(zeros) == 7, "one row per scored-0 rollout, with its reward"
    for i in zeros:
        assert adv[i] == pytest.approx(-1 / 8 / (std + 1e-4), abs=1e-4)
        assert loss_mask[i] == 0 and not trained[i], "a row-less rollout's pad row trains nothing"
    solve_rows = [i for i, a in enumerate(adv) if a == pytest.approx(adv[solve[0]]) and loss_mask[i] > 0]
    assert len(solve_rows) == (2 if every_row else 1)  # every_row: the fork's other row takes the solve's advantage
    for i, n in enumerate(loss_mask):
        if n > 0 and i not in solve_rows:
            assert adv[i] == 0.0, "only the unscored rollout's rows are trained besides the solve's, at advantage 0"
    assert torch.isfinite(loss) and max(g.abs().max().item() for g in grads.values()) > 0


def test_bf16_switch_runs_the_step_under_autocast(tiny):
    ids, am, K = padded(BATCH)
    step = group_step.install(tiny, bf16=True)
    try:
        with torch.no_grad():
            lp16, _, _ = tiny._get_per_token_logps_and_entropies(tiny.model, ids, am, K)
        step.bf16 = False
        with torch.no_grad():
            lp32, _, _ = tiny._get_per_token_logps_and_entropies(tiny.model, ids, am, K)
    finally:
        step.remove()
    scored = am[:, -K:].bool()
    gap = (lp16 - lp32)[scored].abs()
    assert 1e-4 < gap.mean().item() < 0.1

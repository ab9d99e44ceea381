"""benchmarks/limits.py's floor arithmetic, by hand on a tiny shape (no timing here: the floors are pure functions).

The tiny shape: hidden 4, MLP 8, 1 layer, 2 query heads and 1 KV head of 2, vocabulary 10, untied, q/k/v biases.
Its block's linear layers (in x out): q 4x4, k 4x2, v 4x2, o 4x4, gate 4x8, up 4x8, down 8x4 = 144 weights; + 8 biases
+ 8 norm weights = 160 per block; embedding and LM head 40 each; final norm 4: 244 parameters. LoRA r 2: 2 x (8 + 6
+ 6 + 8 + 12 + 12 + 12) = 128. KV cache: 1 layer x (K, V) x 1 head x 2 dims x 4 B = 16 B per token.
Rates of 1e-9 GB/s and GFLOP/s make the seconds equal the bytes and FLOPs (trainer 2 FLOP/s, copy 2 B/s).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from limits import ModelShape, Rates, StepTokens, causal_pairs, phase_floors, read_metrics  # noqa: E402

TINY = ModelShape(hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, head_dim=2, vocab=10, tied=False)
RATES = Rates(bandwidth_gbs=1e-9, copy_gbs=2e-9, engine_gflops=1e-9, trainer_gflops=2e-9)
# 2 rollouts, one shared 10-token prompt, 2 tokens sampled each; the trainer forwards the prompt once + 2 x 2
STEP = StepTokens(rollouts=2, prompt=10, private_prompt=0, sampled=4, forwarded=14, shared=10, rows=2)


def test_tiny_shape_counts():
    assert TINY.block_matmul_params == 144
    assert TINY.block_params == 160
    assert TINY.params == 244
    assert TINY.decode_read_params == 204  # all but the embedding table
    assert TINY.lora_params(2) == 128
    assert TINY.kv_bytes_per_token(4) == 16
    assert TINY._replace(tied=True).params == 204 and TINY._replace(tied=True).decode_read_params == 204


def test_qwen2_5_0_5b_parameter_count_from_its_config():
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    shape = ModelShape.from_config(cfg)
    assert shape.head_dim == 64 and shape.qkv_bias
    assert shape.params == 494_032_768  # Hugging Face's count for Qwen2.5-0.5B (tied)
    assert ModelShape.from_config({**cfg, "tie_word_embeddings": False}).params == 494_032_768 + 896 * 151936


def test_causal_pairs():
    assert causal_pairs(10) == 55
    assert causal_pairs(10, [2, 2]) == 55 + 2 * (2 * 10 + 3)  # each segment: the prefix + itself causally


def test_phase_floors_by_hand():
    f = phase_floors(TINY, STEP, RATES, engine_bytes=4, lora_rank=2)
    # prefill: 10 tokens x 2 x 144 = 2880; attention 4 x 2 heads x 2 dims x 55 pairs = 880; head 2 x 40 x 2 requests
    assert f["prefill"]["flops"] == pytest.approx(2880 + 880 + 160)
    assert f["prefill"]["s"] == pytest.approx(3920)
    # decode, 2 steps at a mean context of 10 + 2/2 = 11; batch 2 per step: bytes 204 x 4 + 2 x 11 x 16 = 1168,
    # FLOPs 2 x (288 + 80) + 4 x 2 x 2 x 22 pairs = 1088: memory-bound at 1 B/s vs 1 FLOP/s
    d = f["decode_batch"]
    assert (d["bytes"], d["flops"], d["bound"], d["steps"]) == (pytest.approx(1168), pytest.approx(1088), "memory", 2)
    assert d["s"] == pytest.approx(2 * 1168)
    s = f["decode_serial"]  # batch 1, 4 steps: 816 + 11 x 16 = 992 bytes each
    assert (s["bytes"], s["steps"], s["s"]) == (pytest.approx(992), 4, pytest.approx(4 * 992))
    assert f["rollout"]["s"] == pytest.approx(3920 + 2336)
    # trainer: base 4 x 144 x 14 = 8064; LoRA 6 x 128 x 14 = 10752; attention 3 x 16 x (55 + 2 x 23) = 4848;
    # LM head 2 x (2 x 40 x 4 scored) = 640: 24304 FLOPs at 2 FLOP/s
    assert f["trainer"]["scored"] == 4
    assert f["trainer"]["flops"] == pytest.approx(24304)
    assert f["trainer"]["s"] == pytest.approx(12152)
    # sync: written + read, 4 B each, at 2 B/s
    assert f["sync"]["bytes"] == 2 * 244 * 4 and f["sync"]["s"] == pytest.approx(976)
    assert f["sync_lora_tensors"]["s"] == pytest.approx(2 * 144 * 4 / 2)
    assert f["sync_adapter"]["s"] == pytest.approx(2 * 128 * 4 / 2)
    assert f["step"]["s"] == pytest.approx(6256 + 12152 + 976)


def test_compute_bound_decode_and_bf16_engine():
    fast_memory = RATES._replace(bandwidth_gbs=1.0)  # 1e9 B/s: the FLOPs bound each step
    f = phase_floors(TINY, STEP, fast_memory, engine_bytes=2, lora_rank=2)
    assert f["decode_batch"]["bound"] == "compute" and f["decode_batch"]["s"] == pytest.approx(2 * 1088)
    assert f["decode_batch"]["bytes"] == 204 * 2 + 2 * 11 * 8  # bf16 weights and KV cache
    assert f["sync"]["bytes"] == 2 * 244 * 2


def test_steps_without_a_trainer_pass_are_counted_and_left_out_and_none_left_is_refused(tmp_path):
    passed = {"step": 1, "train_s": 80.0, "group/forwarded_tokens": 3000, "sampled_tokens": 280}
    skipped = {"step": 2, "train_s": 0.1, "sampled_tokens": 290, "group/loss_pass_skipped": 1.0}
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(f"{json.dumps(passed)}\n{json.dumps(skipped)}\n\n")
    assert read_metrics(metrics) == ([passed], 1)
    metrics.write_text(json.dumps(skipped) + "\n")
    with pytest.raises(ValueError, match="no step with a trainer pass"):
        read_metrics(metrics)


def test_step_tokens_from_metrics():
    one_call = {"rollouts": 4, "rows": 4, "group/row_tokens": 440, "group/forwarded_tokens": 140, "sampled_tokens": 40}
    t = StepTokens.from_metrics(one_call)
    assert (t.shared, t.prompt, t.private_prompt, t.scored, t.decode_steps) == (100, 100, 0, 40, 10)
    # two calls per rollout: 100 prompt + 10 sampled + 20 tool result + 10 sampled per row
    two_calls = {**one_call, "group/row_tokens": 560, "group/forwarded_tokens": 260, "sampled_tokens": 80}
    t = StepTokens.from_metrics(two_calls)
    assert (t.shared, t.prompt, t.private_prompt, t.scored, t.decode_steps) == (100, 100, 80, 160, 20)
    assert StepTokens.from_metrics({k: v for k, v in one_call.items() if k != "rollouts"}, group=4).rollouts == 4


def test_decode_window_counts_only_steps_where_every_sequence_decodes():
    from decode_floor import window

    # a's tokens come at 0, 1, ..., 10; b's (its prefill queued behind a's) at 2, 3, ..., 12: both decode in (2, 10],
    # where each got the tokens stamped 3..10 (8 steps in 8 s)
    a = [(float(t), 1) for t in range(0, 11)]
    b = [(float(t), 1) for t in range(2, 13)]
    w = window([a, b])
    assert w["window_s"] == 8.0
    assert w["tokens_in_window"] == [8, 8]
    assert w["s_per_step"] == 1.0


def test_decode_window_counts_the_tokens_of_chunks_that_carry_several():
    from decode_floor import window

    # --stream-interval 4: the first token at once, then a chunk of 4 every 4 steps (1 s a step). a: 0, 4, 8, 12;
    # b, two steps behind: 2, 6, 10, 14. The window (2, 12] holds a's chunks at 4, 8, 12 and b's at 6, 10: 12 and 8
    # tokens, median 10 steps in 10 s (b's chunk at 14 is past the window; a's at 4 straddles its start, up to 3 steps)
    a = [(0.0, 1), (4.0, 4), (8.0, 4), (12.0, 4)]
    b = [(2.0, 1), (6.0, 4), (10.0, 4), (14.0, 4)]
    w = window([a, b])
    assert w["window_s"] == 10.0
    assert w["tokens_in_window"] == [12, 8]
    assert w["s_per_step"] == 1.0


def test_decode_window_refuses_streams_that_barely_overlap():
    from decode_floor import window

    with pytest.raises(RuntimeError, match="barely overlapped"):
        window([[(0.0, 1), (1.0, 1), (2.0, 1)], [(1.5, 1), (2.5, 1), (3.5, 1)]])

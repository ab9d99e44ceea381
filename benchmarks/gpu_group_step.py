"""The shared-prefix group step with FlexAttention vs TRL's own GRPO step, on CUDA.

Runs on the lent H200 (the device tool) in one command, TRL and its `datasets` carried as wheels
(benchmarks/gpu_group_step_device.sh does all of it):

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_group_step.py --asset-dir <tiny asset> --out $OUT/gpu_group_step.json

and the JSON that comes back is committed as benchmarks/results/gpu_group_step.json. On the CPU it runs only as a
smoke test of the recording and the TRL variants (no FlexAttention backward there; its timings mean nothing):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gpu_group_step.py --device cpu --shapes opencode-g8 \\
        --prefix 300 --suffix 20,60 --model-shape tiny --variants trl,trl+reuse --out /tmp/g.json

Each variant is benchmarks/gpu_trl_step.py's `run_variant` (GRPORun with ``from_rollouts`` on CUDA: TRL 1.16's
GRPOTrainer, bf16, its fused Triton LM head, LoRA r=16 on every linear layer, `token_truncate`, TRL's
checkpointing of every layer unless the name says nockpt), on a recording written here:

  opencode-g8 / -g16  a random-init Qwen2.5-0.5B shape (its config.json; no hub), one group of G = 8 / 16 rollouts:
                      a shared 7,000-token prefix (opencode's system prompt + tools + the task, as in the shipped
                      tiny-humaneval capture: 6,907 prompt tokens) then a private suffix per rollout (outputs
                      and tool results), its length drawn log-uniformly from [200, 1,500] (seed 0). The shipped
                      captures hold only 7 rows, whose private suffixes (tokens from the first output on) are 14, 18,
                      30, 50, 94, 512 and 2,625: spread evenly over two decades on a log scale, but too few and
                      mostly too short for opencode, so the issue's range is drawn with that log-uniform shape.
  s8                  section 8's shape: the Qwen3-0.6B shape, 4 rows of 16,384 tokens sharing 4,096
                      (gpu_trl_step.write_recording, unchanged)

  trl                    TrainConfig.baseline(): TRL's own step (no-grad IS forward, checkpointing)
  trl+reuse              + the IS ratio from the loss pass (reuse_logps)
  trl+reuse+flex         + the shared prefix: one packed sequence per group, FlexAttention BlockMask (compiled,
                         dynamic shapes), TRL's checkpointing kept
  trl+reuse+flex+nockpt  the same without activation checkpointing (one forward less, more memory)

Per variant: row tokens/s (the rows' real tokens over the median timed step), x TRL speed and memory (peak
torch.cuda.max_memory_allocated over the timed steps), the step-1 loss against TRL's, tokens forwarded, compile
time (step 1 minus the median step: the flex variants compile at step 1), Dynamo graphs compiled during the timed
steps (0: no recompile per step), and MFU: the FLOPs computed (each variant's own forwards, LoRA's frozen base
counted as input gradients only, attention as causal pairs) over 989 TFLOP/s (H200 dense bf16, datasheet).
Also the bf16 floor (`--floor`): loss and LoRA gradients of the packed FlexAttention forward + backward against a
float32 per-row reference at the Qwen2.5-0.5B shape, next to the per-row bf16 path's own error.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import math
import os
import platform
import shutil
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests")]  # the device runs a bare checkout
import gpu_trl_step as trl_step  # noqa: E402  (section 8's runner, reused)

QWEN25_05B = {  # Qwen/Qwen2.5-0.5B's config.json
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
}
SHAPES = {"opencode-g8": 8, "opencode-g16": 16, "s8": 4}
VARIANTS = {
    "trl": {},
    "trl+reuse": {"reuse_logps": True},
    "trl+reuse+flex": {"shared_prefix": "on", "reuse_logps": True},
    "trl+reuse+flex+nockpt": {"shared_prefix": "on", "reuse_logps": True, "activation_checkpointing": False},
}
PEAK_FLOPS = 989e12  # H200 SXM dense bf16 (datasheet); KINDS.md measured 769-798 TFLOP/s on an 8k GEMM here
TURN = 250  # private tokens per turn: one output (40%) then a tool result


def build_qwen25(shape: str, device: torch.device) -> Any:
    """gpu_trl_step.build_model's Qwen3 for 0.6b/tiny; the Qwen2.5-0.5B shape (qkv bias, GQA 7:1) otherwise."""
    if shape != "qwen2.5-0.5b":
        return BUILD_QWEN3(shape, device)
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        **QWEN25_05B,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        use_sliding_window=False,
        use_cache=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    )
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(
            config, attn_implementation="sdpa", dtype=torch.bfloat16 if device.type == "cuda" else torch.float32
        )


BUILD_QWEN3 = trl_step.build_model
trl_step.build_model = build_qwen25  # run_variant looks it up at call time
trl_step.VARIANTS.update(VARIANTS)


def suffix_lengths(group: int, lo: int, hi: int) -> list[int]:
    g = torch.Generator().manual_seed(0)
    return [
        round(math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * float(u))) for u in torch.rand(group, generator=g)
    ]


def write_opencode_recording(
    root: Path, model: Any, prefix_len: int, suffixes: list[int], device: torch.device
) -> dict[str, Any]:
    """G rollouts of one task: the shared prefix, then turns of one output and one tool result each."""
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, trl_step.TOKEN_LIMIT, (prefix_len,), generator=g).tolist()
    sampled = 0
    for r, m in enumerate(suffixes):
        ids = prefix + torch.randint(0, trl_step.TOKEN_LIMIT, (m,), generator=g).tolist()
        lps = trl_step.own_logprobs(model, ids, device)
        turns, calls, pos = max(1, round(m / TURN)), [], prefix_len
        bounds = [prefix_len + round(m * k / turns) for k in range(turns + 1)]
        for k in range(turns):
            start, stop = bounds[k], bounds[k] + max(1, round((bounds[k + 1] - bounds[k]) * 0.4))
            stop = bounds[k + 1] if k == turns - 1 else stop  # the last output runs to the end of the row
            calls.append(trl_step.bench_call(r, k, k < turns - 1, ids, lps, start, stop))
            sampled += stop - start
            pos = stop
        assert pos == len(ids)
        folder = root / f"{r:02d}-easy-0"
        folder.mkdir(parents=True)
        (folder / "trace.json").write_text(json.dumps(calls))
        summary = {"rollout_id": folder.name, "task_id": "easy/0", "status": "ok", "reason": None}
        summary |= {"reward": float(r % 2 == 0), "temperature": trl_step.TEMPERATURE, "model": "random-qwen2.5"}
        (folder / "summary.json").write_text(json.dumps(summary | {"isolation": "synthetic", "sampled_tokens": m}))
    return {
        "rows": len(suffixes),
        "row_tokens": len(suffixes) * prefix_len + sum(suffixes),
        "shared_prefix_tokens": prefix_len,
        "suffix_tokens": suffixes,
        "sampled_tokens": sampled,
    }


def model_flops(cfg: dict[str, int], tokens: int, pairs: int, scored: int, forwards: int) -> float:
    """FLOPs computed by `forwards` forward passes and one backward (input gradients only: the base is frozen;
    LoRA r=16 adds < 4% and is left out), attention as 4 x head_dim per causal pair and head, backward 2.5x."""
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", h // heads)
    linear = 2 * cfg["num_hidden_layers"] * (h * hd * (heads * 2 + kv * 2) + 3 * h * cfg["intermediate_size"])
    attention = 4 * cfg["num_hidden_layers"] * heads * hd * pairs
    head = 2 * h * cfg["vocab_size"] * scored
    forward = linear * tokens + attention + head
    return forward * forwards + (linear * tokens + 2.5 * attention + head)


def measure(shape: str, args: argparse.Namespace, device: torch.device, asset: Path) -> list[dict[str, Any]]:
    import torch._dynamo.utils as dynamo_utils

    work = Path(args.work) / shape
    shutil.rmtree(work, ignore_errors=True)
    model_shape = args.model_shape or ("0.6b" if shape == "s8" else "qwen2.5-0.5b")
    model = build_qwen25(model_shape, device)
    if shape == "s8":
        rec = trl_step.write_recording(work / "recording", model, 16384, 4, device)
        rows = [16384] * 4
        shared = rec["shared_prefix_tokens"]
    else:
        suffixes = suffix_lengths(SHAPES[shape], *args.suffix)
        rec = write_opencode_recording(work / "recording", model, args.prefix, suffixes, device)
        rows, shared = [args.prefix + m for m in suffixes], args.prefix
    cfg = {k: getattr(model.config, k) for k in (*QWEN25_05B, "head_dim") if hasattr(model.config, k)}
    del model
    ns = Namespace(
        shape=model_shape,
        seq_len=max(rows),  # token_budget: the longest row fits
        group=len(rows),
        warmup=args.warmup,
        timed=args.timed,
        sampled=rec["sampled_tokens"],
    )
    out = []
    for name in args.variants.split(","):
        graphs0 = dynamo_utils.counters["stats"]["unique_graphs"]
        v = trl_step.run_variant(name, work / "recording", asset, ns, device, work)
        v |= {"name": name, "shape": shape, "model": model_shape, "recording": rec if not out else None}
        v["graphs_compiled"] = dynamo_utils.counters["stats"]["unique_graphs"] - graphs0
        if v.get("status") == "ok":
            med = v["median_step_s"]
            v["row_tokens_per_s"] = round(sum(rows) / med, 1)
            v["compile_s"] = round(v["step_s"][0] - med, 2)
            flex = "flex" in name
            tokens = (shared + sum(r - shared for r in rows)) if flex else len(rows) * max(rows)
            pairs = (
                shared * (shared + 1) // 2
                + sum(shared * (r - shared) + (r - shared) * (r - shared + 1) // 2 for r in rows)
                if flex
                else len(rows) * max(rows) * (max(rows) + 1) // 2
            )
            forwards = 1 + ("nockpt" not in name) + ("reuse" not in name)
            scored = len(rows) * (max(rows) - shared) if not flex else sum(r - shared for r in rows)
            v["tokens_forwarded_per_pass"] = tokens
            v["forwards_per_step"] = forwards
            v["mfu"] = round(model_flops(cfg, tokens, pairs, scored, forwards) / med / PEAK_FLOPS, 4)
        out.append(v)
    base = next((v for v in out if v["name"] == "trl" and v.get("status") == "ok"), None)
    for v in out:
        if base is not None and v.get("status") == "ok":
            v["x_trl"] = round(v["row_tokens_per_s"] / base["row_tokens_per_s"], 3)
            v["x_trl_memory"] = round(v["peak_timed_gib"] / base["peak_timed_gib"], 3) if v["peak_timed_gib"] else None
            v["loss_diff"] = abs(v["losses"][0] - base["losses"][0])
    return out


def bf16_floor(device: torch.device) -> dict[str, Any]:
    """Packed FlexAttention vs per-row, loss and LoRA gradients against a float32 per-row reference (0.5B shape)."""
    import test_group_flex as t

    torch.backends.cuda.matmul.allow_tf32 = False
    shape = QWEN25_05B | {"num_hidden_layers": 4}  # 4 of its 24 layers: the floor is per layer, the time is not
    fp32 = t.lora_model(device.type, torch.float32, **shape)
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)  # the same weights, rounded
    args = t.group_batch(8, 1500, device.type, tail=(200, 600), vocab=trl_step.TOKEN_LIMIT)
    ref_loss, ref = t.loss_and_grads(fp32, t.per_row_loss, *args, torch.float32)
    res = {"shape": "qwen2.5-0.5b x 4 layers, LoRA r=8, G=8, 1,500 shared + 200-600 private tokens"}
    for name, model, fn, dtype in (
        ("flex_fp32", fp32, t.packed_loss, torch.float32),
        ("per_row_bf16", bf16, t.per_row_loss, torch.bfloat16),
        ("flex_bf16", bf16, t.packed_loss, torch.bfloat16),
    ):
        loss, grads = t.loss_and_grads(model, fn, *args, dtype)
        res[name] = {"loss_diff": abs(loss - ref_loss), "grad_rel_err": t.grad_error(ref, grads)}
    print(json.dumps(res), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--prefix", type=int, default=7000)
    ap.add_argument("--suffix", type=lambda s: tuple(int(x) for x in s.split(",")), default=(200, 1500))
    ap.add_argument("--model-shape", default=None, help="override the model shape (tiny: a smoke test)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timed", type=int, default=3)
    ap.add_argument("--floor", action="store_true", help="also measure the bf16 floor (CUDA)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--asset-dir", default=None)
    ap.add_argument("--work", default="/tmp/gpu_group_step")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device = torch.device(args.device)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from workbench.engine import load_asset

    asset = Path(args.asset_dir) if args.asset_dir else load_asset("tiny").path
    import transformers
    import trl

    started = time.perf_counter()
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "peak_flops": PEAK_FLOPS,
        "variants": [],
    }
    for shape in args.shapes.split(","):
        results["variants"] += measure(shape, args, device, asset)
        Path(args.out).write_text(json.dumps(results, indent=1))
    if args.floor:  # last: the first flex variant's step 1 then holds the compile
        results["bf16_floor"] = bf16_floor(device)
    results["wall_s"] = round(time.perf_counter() - started, 1)
    Path(args.out).write_text(json.dumps(results, indent=1))
    keys = ("name", "shape", "status", "median_step_s", "row_tokens_per_s", "x_trl", "x_trl_memory", "loss_diff")
    for v in results["variants"]:
        print(json.dumps({k: v.get(k) for k in (*keys, "peak_timed_gib", "mfu", "compile_s", "graphs_compiled")}))
    print(json.dumps({"wall_s": results["wall_s"]}))


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()
    main()

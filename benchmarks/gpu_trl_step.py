"""TRL's own GRPO step vs TRL + our techniques, on CUDA, trained from recorded rollouts.

Runs on the lent H200 (the device tool) from a bare checkout with TRL and its `datasets` carried as wheels:

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_trl_step.py --asset-dir .devcarry/assets/tiny --out $OUT/gpu_trl_step.json

and the JSON that comes back is committed as benchmarks/results/gpu_trl_step.json. The same code on the CPU, as a
smoke test (a tiny shape and short rows; its timings mean nothing):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gpu_trl_step.py --shape tiny --seq-len 1024 --device cpu \\
        --variants trl,trl+reuse --out /tmp/g.json

1. **A recording.** `group` rollouts of one task (easy/0), each an opencode-shaped 10-turn conversation of
   --seq-len tokens written as rollout folders (trace.json + summary.json, as `workbench.rollout.run` writes them): a
   shared ~T/4-token prompt (system prompt, tools, task: the same in every rollout of the group), then 10 sampled
   outputs of 100-300 tokens (scaled with T) separated by 9 tool results; the prompt of turn k is the whole
   conversation before output k, so each rollout chains into one row. Rewards 1, 0, 1, 0. The recorded logprobs
   are the model's own at the sampling temperature (computed once, bf16, before any variant), so the IS ratios
   start near 1.
2. **The model.** A random-init Qwen3 of the real 0.6B shape (Qwen/Qwen3-0.6B's config.json), built from its
   config on the device in bf16 (no hub), seed 0 for every variant; the tokenizer is the tiny asset's (Qwen2.5's,
   151,665 tokens). PEFT LoRA r=16 on every linear layer, as `workbench.train.grpo` trains.
3. **Each variant** is `workbench.train.grpo.GRPORun` with ``from_rollouts`` (the replay path: no engine) on
   ``device`` cuda: TRL 1.16's GRPOTrainer, bf16 mixed precision, its fused Triton LM head (labelled positions
   only, in chunks), `importance_sampling="token_truncate"` everywhere (bf16 noise over ~2k tokens would mask
   whole rows under sequence_mask; the work is the same), ``every_row=False`` (the rows do not fork). Timed:
   `trainer.train()` for warm-up + timed steps, each from on_step_begin to on_step_end with CUDA synchronised
   (replaying the group, TRL's scoring, the loss forward/backward, AdamW). Peak = torch.cuda.max_memory_allocated
   over the timed steps (weights, LoRA, optimizer state, activations).

  trl              TrainConfig.baseline(): TRL's own step (HF checkpointing of every layer, TRL's extra no-grad
                   forward for the vLLM IS ratio)
  trl+reuse        + the IS ratio from the loss pass (workbench.train.group_step, reuse_logps)
  trl+sac          + selective checkpointing: every layer checkpointed, attention outputs kept
                   (workbench.train.experimental.checkpointing, through TRL's gradient_checkpointing_kwargs)
  trl+reuse+sac    both
  trl+reuse+nockpt reuse_logps, checkpointing off
  trl+shared+reuse group_step's shared prefix (packed tree attention: blockwise SDPA with a dense bool mask for
                   the segments) + reuse_logps: TrainConfig()'s levers
The chunked logprobs of workbench.train.experimental.fused_logprobs are not a variant: on CUDA TRL 1.16's own fused
head already scores only labelled positions in chunks without materialising [T, V] logits (what the chunked
module was written to avoid); what it would add, scoring only the sampled (mask-1) positions instead of every
completion position, needs the tool mask inside group_step's pack labels (not wired).

Also recorded: the loss and IS ratio of every step (variants on the same weights and rows should agree at step 1
to bf16 noise), tokens/s (row tokens and trained tokens per second), the step seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the device runs it from a bare checkout
warnings.filterwarnings("ignore", category=FutureWarning)

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        "vocab_size": 151936,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
    },
    "0.6b": {
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
}
TURNS = 10
TEMPERATURE = 1.0
REWARDS = [1.0, 0.0, 1.0, 0.0]
VARIANTS: dict[str, dict[str, Any]] = {
    "trl": {},
    "trl+reuse": {"reuse_logps": True},
    "trl+sac": {"sac": True},
    "trl+reuse+sac": {"reuse_logps": True, "sac": True},
    "trl+reuse+nockpt": {"reuse_logps": True, "activation_checkpointing": False},
    "trl+shared+reuse": {"shared_prefix": "on", "reuse_logps": True},
}
TOKEN_LIMIT = 151643  # ids below the tokenizer's first special token (151,665 tokens in all)


def build_model(shape: str, device: torch.device) -> Any:
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        **SHAPES[shape],
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        use_cache=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    )
    torch.manual_seed(0)
    with torch.device(device):  # initialise where it trains: a 0.6B random init on the host takes a while
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation="sdpa", dtype=torch.bfloat16 if device.type == "cuda" else torch.float32
        )
    return model


def conversation(seq_len: int, prefix: list[int], g: torch.Generator) -> tuple[list[int], list[tuple[int, int]]]:
    """A row of seq_len tokens starting with `prefix`, and the [start, stop) of each sampled output."""
    scale = seq_len / 16384
    lo, hi = max(1, round(100 * scale)), max(2, round(300 * scale))
    outputs = torch.randint(lo, hi + 1, (TURNS,), generator=g).tolist()
    tool_total = seq_len - len(prefix) - sum(outputs)
    weights = torch.rand(TURNS - 1, generator=g) + 0.5
    tools = (weights / weights.sum() * tool_total).floor().long().tolist()
    tools[-1] += tool_total - sum(tools)
    spans, pos = [], len(prefix)
    for k, out in enumerate(outputs):
        spans.append((pos, pos + out))
        pos += out + (tools[k] if k < TURNS - 1 else 0)
    ids = prefix + torch.randint(0, TOKEN_LIMIT, (seq_len - len(prefix),), generator=g).tolist()
    return ids, spans


@torch.no_grad()
def own_logprobs(model: Any, ids: list[int], device: torch.device) -> list[float]:
    """logprob of token t given tokens < t at TEMPERATURE, for every t >= 1 (index t-1), in float32 chunks."""
    x = torch.tensor([ids], device=device)
    hidden = model.model(input_ids=x).last_hidden_state[0]
    out = []
    for start in range(0, len(ids) - 1, 2048):
        logits = model.lm_head(hidden[start : start + 2048]).float() / TEMPERATURE
        target = x[0, start + 1 : start + 2049]
        logits = logits[: len(target)]
        out.append((logits.log_softmax(-1).gather(-1, target[:, None])[:, 0]).cpu())
    return torch.cat(out).tolist()


def bench_call(r: int, k: int, tool: bool, ids: list[int], lps: list[float], start: int, stop: int) -> dict[str, Any]:
    """Call k of rollout r as the proxy records it: the prompt ids[:start], the output ids[start:stop] with their
    logprobs (`own_logprobs`' index t-1), a bash tool call unless it is the last (`tool`)."""
    message = {
        "role": "assistant",
        "content": None if tool else "done",
        "tool_calls": [{"id": f"call_{k}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]
        if tool
        else [],
    }
    return {
        "purpose": "agent",
        "status": "ok",
        "model": "bench",
        "turn": k,
        "node_id": f"r{r}-{k}",
        "prompt_token_ids": ids[:start],
        "completion_token_ids": ids[start:stop],
        "per_token_logps": lps[start - 1 : stop - 1],
        "finish_reason": "tool_calls" if tool else "stop",
        "request": {"messages": []},
        "response": {"choices": [{"message": message}]},
        "sampling_params": {"temperature": TEMPERATURE},
    }


def write_recording(root: Path, model: Any, seq_len: int, group: int, device: torch.device) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, TOKEN_LIMIT, (seq_len // 4,), generator=g).tolist()
    sampled = 0
    for r in range(group):
        ids, spans = conversation(seq_len, prefix, g)
        lps = own_logprobs(model, ids, device)
        calls = []
        for k, (start, stop) in enumerate(spans):
            calls.append(bench_call(r, k, k < TURNS - 1, ids, lps, start, stop))
            sampled += stop - start
        folder = root / f"{r:02d}-easy-0"
        folder.mkdir(parents=True)
        (folder / "trace.json").write_text(json.dumps(calls))
        (folder / "summary.json").write_text(
            json.dumps(
                {
                    "rollout_id": folder.name,
                    "task_id": "easy/0",
                    "status": "ok",
                    "reason": None,
                    "reward": REWARDS[r % len(REWARDS)],
                    "temperature": TEMPERATURE,
                    "model": "random-qwen3",
                    "isolation": "synthetic",
                    "sampled_tokens": sum(b - a for a, b in spans),
                }
            )
        )
    return {
        "rows": group,
        "row_tokens": group * seq_len,
        "shared_prefix_tokens": len(prefix),
        "sampled_tokens": sampled,
    }


def run_variant(
    name: str, rec: Path, asset: Path, args: argparse.Namespace, device: torch.device, work: Path
) -> dict[str, Any]:
    from transformers import TrainerCallback

    from workbench.train.experimental.checkpointing import selective_checkpointing_kwargs
    from workbench.train import GRPORun, TrainConfig

    spec = dict(VARIANTS[name])
    sac = spec.pop("sac", False)
    warmup, timed = (1, 2) if "shared" in name else (args.warmup, args.timed)
    cfg = TrainConfig.baseline(
        model="tiny",
        from_rollouts=str(rec),
        temperature=TEMPERATURE,
        group_size=args.group,
        steps=warmup + timed,
        device=device.type,
        every_row=False,
        importance_sampling="token_truncate",
        lora_rank=16,
        lora_alpha=32,
        learning_rate=1e-5,
        token_budget=args.seq_len,
        train_turns="all",
        **spec,
    )
    kwargs, policy = selective_checkpointing_kwargs() if sac else (None, None)
    result: dict[str, Any] = {
        "variant": name,
        "config": {
            k: getattr(cfg, k)
            for k in ("shared_prefix", "reuse_logps", "activation_checkpointing", "importance_sampling", "every_row")
        },
        "selective_checkpointing": sac,
        "warmup_steps": warmup,
        "timed_steps": timed,
    }
    times: list[float] = []
    peaks: list[float] = []
    model = trainer = None
    try:
        run = GRPORun(cfg, run_dir=work / name.replace("+", "_"))
        model = build_model(args.shape, device)
        trainer = run._build_trainer(asset, model=model, checkpointing_kwargs=kwargs)
        run.recording.check_vocabulary(len(run.tokenizer))

        class _Timer(TrainerCallback):
            start = 0.0

            def on_step_begin(self, *a: Any, **k: Any) -> None:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                self.start = time.perf_counter()

            def on_step_end(self, *a: Any, **k: Any) -> None:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    peaks.append(torch.cuda.max_memory_allocated() / 2**30)
                times.append(time.perf_counter() - self.start)

        trainer.add_callback(_Timer())
        trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h]
        result |= {
            "status": "ok",
            "losses": [h["loss"] for h in logs],
            "is_ratio_mean": [h.get("sampling/importance_sampling_ratio/mean") for h in logs],
            "logp_diff_mean": [h.get("sampling/sampling_logp_difference/mean") for h in logs],
            "forwarded_tokens": [h.get("group/forwarded_tokens") for h in logs],
        }
        if policy is not None:
            result["saved_attention_ops"] = dict(policy.saved)
    except torch.OutOfMemoryError:
        result["status"] = "OOM"
    except Exception as exc:  # noqa: BLE001 - one failing variant must not cost the rest of the lease
        traceback.print_exc()
        result["status"] = f"error: {type(exc).__name__}: {exc}"[:400]
    finally:
        del model, trainer
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result["step_s"] = [round(t, 4) for t in times]
    result["peak_gib"] = [round(p, 2) for p in peaks]
    timed_s = times[warmup:]
    if result.get("status") == "ok" and timed_s:
        median = statistics.median(timed_s)
        result |= {
            "median_step_s": round(median, 4),
            "row_tokens_per_s": round(args.group * args.seq_len / median, 1),
            "trained_tokens_per_s": round(args.sampled / median, 1),
            "peak_timed_gib": round(max(peaks[warmup:]), 2) if peaks[warmup:] else None,
        }
    print(
        json.dumps(
            {
                k: result.get(k)
                for k in ("variant", "status", "median_step_s", "row_tokens_per_s", "peak_timed_gib", "losses")
            }
        ),
        flush=True,
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="0.6b", choices=sorted(SHAPES))
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timed", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--asset-dir", default=None, help="the tiny asset's folder (default: the built asset)")
    ap.add_argument("--work", default="/tmp/gpu_trl_step", help="recording and run folders")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device = torch.device(args.device)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from workbench.engine import load_asset

    asset = Path(args.asset_dir) if args.asset_dir else load_asset("tiny").path
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)  # a warm device keeps /tmp between commands
    rec = work / "recording"
    started = time.perf_counter()
    model = build_model(args.shape, device)
    recording = write_recording(rec, model, args.seq_len, args.group, device)
    del model
    args.sampled = recording["sampled_tokens"]
    import transformers
    import trl

    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "shape": args.shape,
        "seq_len": args.seq_len,
        "group": args.group,
        "recording": recording,
        "temperature": TEMPERATURE,
        "variants": [],
    }
    for name in args.variants.split(","):
        results["variants"].append(run_variant(name, rec, asset, args, device, work))
        Path(args.out).write_text(json.dumps(results, indent=1))
    base = next((v for v in results["variants"] if v["variant"] == "trl" and v["status"] == "ok"), None)
    for v in results["variants"]:
        if base is not None and v.get("status") == "ok":
            v["speed_vs_trl"] = round(v["row_tokens_per_s"] / base["row_tokens_per_s"], 3)
            v["memory_vs_trl"] = (
                round(v["peak_timed_gib"] / base["peak_timed_gib"], 3) if v.get("peak_timed_gib") else None
            )
            v["step1_loss_diff_vs_trl"] = abs(v["losses"][0] - base["losses"][0])
    results["wall_s"] = round(time.perf_counter() - started, 1)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps({"wall_s": results["wall_s"]}))


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()

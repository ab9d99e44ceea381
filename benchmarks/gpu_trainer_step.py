"""GPU trainer step: one GRPO forward+backward+optimizer step on a 16k-token row, naive vs optimised.

Part 5 of the benchmarks issue. Runs on the lent H200 (the device tool), on random-init bf16 Qwen3 models of
the real 0.6B / 1.7B / 4B shapes built there (nothing is downloaded), with SDPA attention:

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_trainer_step.py --shapes 0.6b,1.7b,4b --out $OUT/gpu_trainer_step.json

and the JSON that comes back is copied to benchmarks/results/gpu_trainer_step.json. The same code paths on the
CPU, as a smoke test (a tiny model and a short row; its timings mean nothing):

    OMP_NUM_THREADS=1 python benchmarks/gpu_trainer_step.py --shapes tiny --seq-len 1024 --device cpu --out /tmp/g.json

The row is a synthetic 10-turn agent conversation chained into one row of --seq-len tokens: a ~T/4 prompt,
then 10 sampled outputs of ~100-300 tokens (scaled with T) separated by 9 tool results; mask 1 on the outputs
only, one advantage for the whole row, logp_old = the model's own logprobs at the start plus noise.

(a) Per-technique variants of the step on that row, each timed (median of the timed steps after warm-up) with
its peak memory (torch.cuda.max_memory_allocated, weights and optimizer state included):
  naive       HF forward → full [T, V] logits → float32 → log_softmax → gather; HF gradient checkpointing;
              AdamW(foreach)
  chunked     hidden states only, LM head + float32 logsumexp on the mask-1 positions, in chunks, with a
              recomputing backward (workbench.train.experimental.fused_logprobs)
  sac         selective checkpointing: every layer checkpointed but the attention outputs kept
              (workbench.train.experimental.checkpointing); "alternate" = every other layer; "no-ckpt" = none
  fused-adam  AdamW(fused=True)
  compiled-layers  torch.compile of each decoder layer (one graph shared by all layers), which fuses the
              elementwise work of the forward, backward and checkpoint replay; its first step compiles
  dense-mask  every position of the row carries a logprob (the head runs on all T tokens): the worst case
The (a) verdict takes the fastest optimised variant (dense-mask excluded) whose peak is ≤ ½ naive's. SDPA picks
its attention kernel itself (torch 2.11 on the H200: cuDNN's); saved_attention_ops names the op that the
selective checkpoint kept.

(b) Useful throughput on the same conversation with chunked+sac+fused-adam (eager; fixed so that (b) runs
right after it, before the breakdown): sampled (mask-1) tokens trained per second as the one chained row vs
as one row per turn (10 rows, prompt_k + output_k, mask 1 on output_k; one optimizer step after all 10
backward passes, losses normalised by the conversation's total sampled tokens so both give the same
token-mean). Also the no-grad loss of both layouts on the same weights, in bf16.

FLOPs. Model FLOPs of a step (MFU counts only these): 6·N·ΣT (N = non-embedding parameters) + 6·L·H·d·ΣT²
(causal attention, fwd+bwd: half of full attention's 12·L·H·d·T²) + 6·hidden·V·n_head (n_head = positions
where the LM head runs: T for naive, the mask-1 positions for chunked). Hardware FLOPs (HFU) add the
recomputation: a checkpointed layer replays its forward (2·N/L·T + 2·H·d·T² per layer; the selective mode
replays only the 2·N/L·T), the chunked head replays its matmul (2·hidden·V·n_head). Peak: 989 TFLOP/s (H200
dense bf16 datasheet).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import importlib.util
import json
import platform
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import transformers
from torch import Tensor
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen3Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the device runs it from a bare checkout
from workbench.train.experimental.checkpointing import CheckpointMode, enable_checkpointing
from workbench.train.experimental.fused_logprobs import chunked_logprobs, grpo_loss, naive_logprobs

# Hugging Face renamed gradient_checkpointing_* after the device's version; the old names work in both.
warnings.filterwarnings("ignore", category=FutureWarning)

PEAK_TFLOPS = 989.0  # H200 SXM dense bf16, datasheet
TURNS = 10
EPSILON = 0.2
ADVANTAGE = 0.8
LR = 1e-6  # tiny, so the repeated steps on one row keep the ratios near 1 (clipping stays realistic)

# Real Qwen3 shapes (config.json of Qwen/Qwen3-{0.6B,1.7B,4B}); "tiny" is for the CPU smoke test only.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        "vocab_size": 2048,
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "timed_steps": 2,
    },
    "0.6b": {
        "vocab_size": 151936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "timed_steps": 5,
    },
    "1.7b": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "timed_steps": 4,
    },
    "4b": {
        "vocab_size": 151936,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "timed_steps": 3,
    },
}
WARMUP_STEPS = 2  # the first builds the optimizer state and autotunes kernels; the second settles the allocator


@dataclass(frozen=True)
class Variant:
    name: str
    head: Literal["naive", "chunked"]
    checkpoint: CheckpointMode
    fused_adam: bool
    compiled: bool = False
    dense_mask: bool = False


NAIVE = Variant("naive", "naive", "full", fused_adam=False)
BEST = Variant("chunked+sac+fused-adam", "chunked", "attention", fused_adam=True)
COMPILED = Variant("chunked+sac+fused-adam+compiled-layers", "chunked", "attention", fused_adam=True, compiled=True)
# One technique at a time on top of naive, the checkpointing alternatives with the chunked head, and the worst
# case for the head (every position sampled).
EXTRAS = [
    Variant("naive+fused-adam", "naive", "full", fused_adam=True),
    Variant("chunked", "chunked", "full", fused_adam=False),
    Variant("naive-head+sac", "naive", "attention", fused_adam=False),
    Variant("chunked+sac", "chunked", "attention", fused_adam=False),
    Variant("chunked+alternate-ckpt+fused-adam", "chunked", "alternate", fused_adam=True),
    Variant("chunked+no-ckpt+fused-adam", "chunked", "none", fused_adam=True),
    Variant("chunked+sac+fused-adam, dense-mask", "chunked", "attention", fused_adam=True, dense_mask=True),
]


@dataclass
class Row:
    ids: Tensor  # [T]
    mask: Tensor  # [T] float, 1 on sampled tokens
    advantages: Tensor  # [T]
    logp_old: Tensor  # [T] float32, meaningful where mask is 1
    positions: Tensor = field(init=False)  # the mask-1 positions t ≥ 1, found once, outside the timed steps

    def __post_init__(self) -> None:
        self.positions = torch.nonzero(self.mask[1:], as_tuple=True)[0] + 1

    @property
    def sampled(self) -> int:
        return int(self.positions.numel())

    def prefix(self, stop: int, start: int) -> Row:
        """Turn k's own row: the conversation up to the end of output k, mask 1 on output k only."""
        mask = torch.zeros_like(self.mask[:stop])
        mask[start:stop] = 1
        return Row(self.ids[:stop], mask, self.advantages[:stop], self.logp_old[:stop])


def conversation(seq_len: int, vocab: int, seed: int = 0) -> tuple[Tensor, list[tuple[int, int]]]:
    """Token ids of a TURNS-turn conversation of exactly seq_len tokens and the [start, stop) of each output."""
    g = torch.Generator().manual_seed(seed)
    scale = seq_len / 16384
    lo, hi = max(1, round(100 * scale)), max(2, round(300 * scale))
    outputs = torch.randint(lo, hi + 1, (TURNS,), generator=g).tolist()
    prompt = seq_len // 4
    tool_total = seq_len - prompt - sum(outputs)
    weights = torch.rand(TURNS - 1, generator=g) + 0.5
    tools = (weights / weights.sum() * tool_total).floor().long().tolist()
    tools[-1] += tool_total - sum(tools)
    spans, pos = [], prompt
    for k, out in enumerate(outputs):
        spans.append((pos, pos + out))
        pos += out + (tools[k] if k < TURNS - 1 else 0)
    assert pos == seq_len, (pos, seq_len)
    return torch.randint(0, vocab, (seq_len,), generator=g), spans


def build_model(shape: str, device: torch.device) -> PreTrainedModel:
    dims = {k: v for k, v in SHAPES[shape].items() if k != "timed_steps"}
    config = Qwen3Config(
        **dims,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        use_cache=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the GPU: a 4B random init on the host takes minutes
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
    return model.train()


@contextlib.contextmanager
def compiled_layers(model: PreTrainedModel, enabled: bool) -> Iterator[None]:
    """torch.compile each decoder layer (one graph, reused by all layers), undone on exit.

    Inductor fuses the layer's elementwise work (RMSNorms in float32, q/k norms, RoPE, SiLU·up) that eager runs
    as many memory-bound kernels, in the forward, the backward and the checkpoint replay alike.
    """
    if not enabled:
        yield
        return
    for layer in model.model.layers:
        layer.compile()
    try:
        yield
    finally:
        for layer in model.model.layers:
            layer._compiled_call_impl = None  # what nn.Module.compile() set; no public way to un-compile
        torch._dynamo.reset()


def row_loss(model: PreTrainedModel, row: Row, variant: Variant, num_tokens: int, chunk_size: int) -> Tensor:
    if variant.head == "naive":
        logits = model(input_ids=row.ids[None]).logits[0]
        logp = naive_logprobs(logits, row.ids)
        return grpo_loss(logp, row.logp_old[1:], row.advantages[1:], row.mask[1:], EPSILON, num_tokens)
    hidden = model.model(input_ids=row.ids[None]).last_hidden_state[0]
    pos = row.positions
    logp = chunked_logprobs(hidden[pos - 1], model.lm_head.weight, row.ids[pos], chunk_size)
    return grpo_loss(logp, row.logp_old[pos], row.advantages[pos], None, EPSILON, num_tokens)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def flops(model: PreTrainedModel, variant: Variant, rows: list[Row]) -> dict[str, float]:
    """Model and hardware FLOPs of one step over `rows` (the formulas are in the module docstring)."""
    c = model.config
    n_nonembed = sum(p.numel() for p in model.parameters()) - c.vocab_size * c.hidden_size  # tied head
    lens = [r.ids.numel() for r in rows]
    head_tokens = sum(lens) if variant.head == "naive" else sum(r.sampled for r in rows)
    attn_unit = c.num_hidden_layers * c.num_attention_heads * c.head_dim * sum(t * t for t in lens)
    linear, attention, head = 6 * n_nonembed * sum(lens), 6 * attn_unit, 6 * c.hidden_size * c.vocab_size * head_tokens
    replay_layers = {"none": 0.0, "full": 1.0, "alternate": 0.5, "attention": 1.0}[variant.checkpoint]
    recompute = replay_layers * 2 * n_nonembed * sum(lens)
    if variant.checkpoint in ("full", "alternate"):
        recompute += replay_layers * 2 * attn_unit
    if variant.head == "chunked":
        recompute += 2 * c.hidden_size * c.vocab_size * head_tokens
    model_flops = linear + attention + head
    return {
        "model": model_flops,
        "hardware": model_flops + recompute,
        "linear": linear,
        "attention": attention,
        "head": head,
        "non_embedding_params": n_nonembed,
    }


def measure(
    model: PreTrainedModel,
    variant: Variant,
    rows: list[Row],
    timed_steps: int,
    chunk_size: int,
    device: torch.device,
    warmup_steps: int = WARMUP_STEPS,
) -> dict[str, Any]:
    """Median step time and peak memory of `variant` over `rows` (one optimizer step after all rows)."""
    free(device)
    policy = enable_checkpointing(model, variant.checkpoint)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=variant.fused_adam, foreach=not variant.fused_adam)
    num_tokens = sum(r.sampled for r in rows)
    times, losses = [], []
    try:
        with compiled_layers(model, variant.compiled):
            for _ in range(warmup_steps + timed_steps):
                sync(device)
                start = time.perf_counter()
                total = torch.zeros((), device=device)
                for row in rows:
                    loss = row_loss(model, row, variant, num_tokens, chunk_size)
                    loss.backward()
                    total += loss.detach()
                opt.step()
                opt.zero_grad(set_to_none=True)
                sync(device)
                times.append(time.perf_counter() - start)
                losses.append(float(total))
        warmup, times = times[:warmup_steps], times[warmup_steps:]
        result: dict[str, Any] = {"status": "ok", "warmup_step_s": [round(t, 2) for t in warmup]}
    except torch.OutOfMemoryError:
        result = {"status": "OOM"}
    except Exception as exc:  # noqa: BLE001 — one failing variant must not cost the rest of the lease
        result = {"status": f"error: {type(exc).__name__}: {exc}"[:400]}
        traceback.print_exc()
    tokens = sum(r.ids.numel() for r in rows)
    result |= {
        "variant": asdict(variant),
        "rows": len(rows),
        "row_tokens": tokens,
        "sampled_tokens": num_tokens,
        "step_s": [round(t, 4) for t in times],
        "losses": [round(x, 6) for x in losses],
    }
    if device.type == "cuda":
        result["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        result["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved(device) / 2**30, 2)
    if policy is not None:
        result["saved_attention_ops"] = dict(policy.saved)
    if result["status"] == "ok":
        median = statistics.median(times)
        f = flops(model, variant, rows)
        result |= {
            "median_step_s": round(median, 4),
            "tokens_per_s": round(tokens / median, 1),
            "sampled_tokens_per_s": round(num_tokens / median, 1),
            "model_tflops": round(f["model"] / median / 1e12, 1),
            "hardware_tflops": round(f["hardware"] / median / 1e12, 1),
            "mfu": round(f["model"] / median / 1e12 / PEAK_TFLOPS, 4),
            "hfu": round(f["hardware"] / median / 1e12 / PEAK_TFLOPS, 4),
            "flops": {k: float(v) for k, v in f.items()},
        }
    del opt
    model.zero_grad(set_to_none=True)
    free(device)
    return result


@torch.no_grad()
def initial_logprobs(model: PreTrainedModel, ids: Tensor, chunk_size: int) -> Tensor:
    """The model's own float32 logprob of every token 1..T-1 (0 at token 0): the "generator's" logprobs."""
    hidden = model.model(input_ids=ids[None]).last_hidden_state[0]
    out = torch.zeros(ids.numel(), dtype=torch.float32, device=ids.device)
    out[1:] = chunked_logprobs(hidden[:-1], model.lm_head.weight, ids[1:], chunk_size)
    return out


@torch.no_grad()
def layout_agreement(
    model: PreTrainedModel, chained: Row, turns: list[Row], variant: Variant, chunk_size: int
) -> dict[str, float]:
    """No-grad loss of the chained row vs the sum over one-row-per-turn rows, same weights, same tokens."""
    n = chained.sampled
    whole = float(row_loss(model, chained, variant, n, chunk_size))
    split = sum(float(row_loss(model, r, variant, n, chunk_size)) for r in turns)
    hidden = model.model(input_ids=chained.ids[None]).last_hidden_state[0]
    lp_chained = chunked_logprobs(
        hidden[chained.positions - 1], model.lm_head.weight, chained.ids[chained.positions], chunk_size
    )
    lp_turns = []
    for r in turns:
        h = model.model(input_ids=r.ids[None]).last_hidden_state[0]
        lp_turns.append(chunked_logprobs(h[r.positions - 1], model.lm_head.weight, r.ids[r.positions], chunk_size))
    diff = (lp_chained - torch.cat(lp_turns)).abs()
    return {
        "loss_chained": whole,
        "loss_per_turn": split,
        "loss_abs_diff": abs(whole - split),
        "loss_rel_diff": abs(whole - split) / max(abs(whole), 1e-12),
        "logprob_max_abs_diff": float(diff.max()),
        "logprob_mean_abs_diff": float(diff.mean()),
    }


def verdict_a(results: list[dict[str, Any]]) -> dict[str, Any]:
    naive = next(r for r in results if r["variant"]["name"] == NAIVE.name)
    if naive["status"] != "ok":
        return {"naive_status": naive["status"]}
    ok = [
        r
        for r in results
        if r["status"] == "ok" and r["variant"]["head"] == "chunked" and not r["variant"]["dense_mask"]
    ]
    within = [r for r in ok if r.get("peak_gib", 0.0) <= naive.get("peak_gib", 0.0) / 2]
    if not within:
        return {"met": False, "reason": "no optimised variant within half of naive's peak memory"}
    best = max(within, key=lambda r: r["tokens_per_s"])
    speedup = best["tokens_per_s"] / naive["tokens_per_s"]
    memory = best["peak_gib"] / naive["peak_gib"] if "peak_gib" in best else None
    return {
        "variant": best["variant"]["name"],
        "speedup": round(speedup, 3),
        "memory_ratio": None if memory is None else round(memory, 3),
        "met": speedup >= 1.25 and (memory is None or memory <= 0.5),
        "target": "≥1.25× tokens/s at ≤0.5× peak",
    }


def write(report: dict[str, Any], out: Path) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(out)


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "flash_attn_importable": importlib.util.find_spec("flash_attn") is not None,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "sms": props.multi_processor_count,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    return info


def fmt(r: dict[str, Any], naive: dict[str, Any] | None) -> str:
    name = r["variant"]["name"]
    if r["status"] != "ok":
        return f"  {name:<38} {r['status']}"
    peak = r.get("peak_gib")
    speed = mem = "-"
    if naive is not None and naive["status"] == "ok":
        speed = f"{r['tokens_per_s'] / naive['tokens_per_s']:.2f}x"
        if peak is not None:
            mem = f"{peak / naive['peak_gib']:.2f}x"
    peak_s = "-" if peak is None else f"{peak:.1f}"
    return (
        f"  {name:<38} {r['tokens_per_s'] / 1000:>7.1f}k {peak_s:>7} {speed:>6} {mem:>6} "
        f"{r['model_tflops']:>7.1f} {100 * r['mfu']:>5.1f}% {100 * r['hfu']:>5.1f}%"
    )


HEADER = f"  {'variant':<38} {'tok/s':>8} {'peakGiB':>7} {'speed':>6} {'mem':>6} {'TFLOP/s':>7} {'MFU':>6} {'HFU':>6}"


def run_useful(
    model: PreTrainedModel,
    chained: Row,
    turns: list[Row],
    args: argparse.Namespace,
    device: torch.device,
    report: dict[str, Any],
    shape: str,
    t0: float,
) -> None:
    """(b): BEST on the one chained row (already measured) vs on one row per turn, and the two layouts' losses."""
    entry = report["shapes"][shape]
    chained_run = next(r for r in entry["variants"] if r["variant"]["name"] == BEST.name)
    # One warm-up step: it already meets every row length once; per-turn steps are 5-10x the chained one.
    per_turn = measure(
        model, BEST, turns, max(2, SHAPES[shape]["timed_steps"] - 2), args.chunk_size, device, warmup_steps=1
    )
    useful: dict[str, Any] = {"variant": BEST.name, "per_turn": per_turn}
    if per_turn["status"] == "ok" and chained_run["status"] == "ok":
        ratio = chained_run["sampled_tokens_per_s"] / per_turn["sampled_tokens_per_s"]
        useful |= {
            "chained_sampled_tokens_per_s": chained_run["sampled_tokens_per_s"],
            "per_turn_sampled_tokens_per_s": per_turn["sampled_tokens_per_s"],
            "ratio": round(ratio, 2),
            "target": "≥3×",
            "met": ratio >= 3,
        }
    try:
        useful["agreement_bf16"] = layout_agreement(model, chained, turns, BEST, args.chunk_size)
    except torch.OutOfMemoryError:
        useful["agreement_bf16"] = {"status": "OOM"}
    free(device)
    entry["useful"] = useful
    write(report, args.out)
    print(f"[{shape}] {time.perf_counter() - t0:6.1f}s (b) per-turn rows: " + fmt(per_turn, None), flush=True)
    print(f"[{shape}] (b) {json.dumps({k: v for k, v in useful.items() if k != 'per_turn'})}", flush=True)


def run_shape(shape: str, args: argparse.Namespace, device: torch.device, report: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    model = build_model(shape, device)
    entry: dict[str, Any] = {
        "config": {k: v for k, v in SHAPES[shape].items() if k != "timed_steps"},
        "params": sum(p.numel() for p in model.parameters()),
        "timed_steps": SHAPES[shape]["timed_steps"],
        "warmup_steps": WARMUP_STEPS,
        "variants": [],
    }
    report["shapes"][shape] = entry
    ids, spans = conversation(args.seq_len, model.config.vocab_size)
    ids = ids.to(device)
    mask = torch.zeros(args.seq_len, device=device)
    for start, stop in spans:
        mask[start:stop] = 1
    noise = torch.randn(args.seq_len, generator=torch.Generator().manual_seed(1)).to(device) * 0.1
    logp_old = initial_logprobs(model, ids, args.chunk_size) + noise
    advantages = torch.full((args.seq_len,), ADVANTAGE, device=device)
    chained = Row(ids, mask, advantages, logp_old)
    dense = Row(ids, torch.ones_like(mask), advantages, logp_old)
    turns = [chained.prefix(stop, start) for start, stop in spans]
    entry["row"] = {
        "tokens": args.seq_len,
        "sampled_tokens": chained.sampled,
        "turn_spans": spans,
        "per_turn_row_tokens": [r.ids.numel() for r in turns],
        "per_turn_total_tokens": sum(r.ids.numel() for r in turns),
    }
    print(
        f"[{shape}] built in {time.perf_counter() - t0:.1f}s: {entry['params'] / 1e9:.3f}B params, row "
        f"{args.seq_len} tokens, {chained.sampled} sampled, per-turn rows total "
        f"{entry['row']['per_turn_total_tokens']}",
        flush=True,
    )

    naive: dict[str, Any] | None = None

    def run(variant: Variant) -> None:
        nonlocal naive
        rows = [dense] if variant.dense_mask else [chained]
        r = measure(model, variant, rows, SHAPES[shape]["timed_steps"], args.chunk_size, device)
        entry["variants"].append(r)
        naive = r if variant is NAIVE else naive
        entry["target_a"] = verdict_a(entry["variants"])
        print(f"[{shape}] {time.perf_counter() - t0:6.1f}s" + fmt(r, naive), flush=True)
        write(report, args.out)

    # Naive and the planned best first, then (b) with that best, then the breakdown: a run cut short by the
    # command's time limit still has the headline numbers of every shape it reached.
    run(NAIVE)
    run(BEST)
    run(COMPILED)
    run_useful(model, chained, turns, args, device, report, shape, t0)
    for variant in EXTRAS:
        run(variant)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="0.6b,1.7b,4b", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--chunk-size", type=int, default=2048, help="LM-head rows per chunk")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True, help="JSON report, rewritten after every measurement")
    args = parser.parse_args()
    device = torch.device(args.device)
    report: dict[str, Any] = {
        "benchmark": "gpu_trainer_step",
        "date": dt.date.today().isoformat(),
        "machine": machine(device),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "seq_len": args.seq_len,
        "chunk_size": args.chunk_size,
        "lr": LR,
        "epsilon": EPSILON,
        "peak_tflops": PEAK_TFLOPS,
        "flops_formula": "model = 6*N_nonembed*sum(T) + 6*L*H*d*sum(T^2) [causal attn fwd+bwd] + "
        "6*hidden*V*head_tokens; MFU = model FLOPs / step time / 989 TFLOP/s; "
        "HFU adds checkpoint replays and the chunked head's recomputed matmul",
        "shapes": {},
    }
    print(json.dumps(report["machine"]), flush=True)
    for shape in args.shapes.split(","):
        run_shape(shape, args, device, report)
        free(device)  # the shape's model went with run_shape's frame

    print("\n(a) one GRPO step on the chained conversation row (speed/mem relative to naive)")
    for shape, entry in report["shapes"].items():
        print(f"[{shape}]\n{HEADER}")
        naive = entry["variants"][0]
        for r in entry["variants"]:
            print(fmt(r, naive))
        print(f"  target (a): {json.dumps(entry.get('target_a'), ensure_ascii=False)}")
    print("\n(b) sampled tokens trained per second, chained row vs one row per turn")
    for shape, entry in report["shapes"].items():
        u = entry.get("useful", {})
        print(
            f"  [{shape}] chained {u.get('chained_sampled_tokens_per_s')} / per-turn "
            f"{u.get('per_turn_sampled_tokens_per_s')} = {u.get('ratio')}x; agreement {u.get('agreement_bf16')}"
        )


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()

"""How far each phase of a GRPO step is from what this machine can do: measured time vs floor, per phase.

    .venv/bin/python benchmarks/limits.py                  # ~5 min on 2 cores: rates ~1 min, qwen-coder fwd+bwd ~4 min
    .venv/bin/python benchmarks/limits.py --skip-model     # the rates and the floors only (~1 min)
    .venv/bin/python benchmarks/limits.py --metrics runs/x/metrics.jsonl --metrics-host fc-v669-intel-xeon

Leave ``OMP_NUM_THREADS`` unset: the script sets torch's threads itself, ``--threads`` (default ``os.cpu_count()``,
what the CPU trainer uses: `workbench.train.trl_trainer.build_trainer`) and 1 (the engine's one core under
``engine_cores="half"``). Writes ``benchmarks/results/limits/<date>_<host>.json`` (`run_file.new_run_file`).

1. **The machine.** Memory bandwidth, STREAM's way (bytes read + bytes written, best of several reps, arrays of
   ``--array-mib`` each, 8x this host's 32 MiB L3): copy and triad in numpy (one thread; the triad in L2-sized
   blocks through a scratch buffer, so memory sees STREAM's 2 reads + 1 write per element and no temporary array),
   and copy, triad and a read-only sum in torch at 1 and at ``--threads`` threads. Matmul GFLOP/s in fp32 and bf16
   (plain bf16 tensors, oneDNN's path) at the same two thread counts: a square 2048 matmul and qwen-coder's linear
   layers on a [3000, 896] activation (``F.linear``, weights stored [out, in] as ``nn.Linear`` keeps them). Plus
   ``lscpu``'s model and flags, torch's version and ``get_cpu_capability()``. A floor takes the best rate measured at
   up to its phase's threads (a 2-thread job can always run as a 1-thread one); decode's bandwidth is the best of
   copy, triad and read (decode only reads), sync's the best copy; the matmul rate the fastest of the shapes.
2. **The floors** (`phase_floors`, pure arithmetic, tested in tests/test_limits.py) of one step for a model shape
   (qwen-coder's config.json from its built asset, else the Qwen2.5-0.5B numbers below) and the step's token
   counts, read per step from a metrics.jsonl (`StepTokens.from_metrics`):
   - prefill: matmul FLOPs (2 per weight per token, + attention's QK^T and PV on the causal pairs, + the LM head on
     each request's last position) / the matmul rate; the shared prompt once (the engine's prefix cache, leader
     first), each rollout's private prompt tokens once;
   - decode: per step, max(bytes / bandwidth, FLOPs / matmul rate) (a roofline): the weights at the engine dtype
     read once per step + each sequence's KV cache read; at batch = the group (all rollouts in lockstep) and at
     batch 1 (one after another). Steps per rollout = the step's sampled tokens / rollouts (the mean reply: the
     group's longest reply is longer, so this is a lower bound);
   - trainer: forward + backward of the forwarded tokens (the shared prefix once) / the matmul rate. LoRA freezes
     the base weights, so the backward computes activation gradients only (1x the forward's matmuls, no weight
     gradients): 4 FLOPs per base weight per token, 6 per LoRA weight (its weight gradients too), attention 3x its
     forward, the LM head only on the scored (completion) positions (TRL's compact head), forward + input grad;
   - sync: bytes that change / copy bandwidth: merged serving writes the full weights at the engine dtype and the
     engine reads them (the figure measured); the alternatives: only the tensors LoRA touches (every linear layer
     of the blocks), or the adapter alone (what LoRA serving ships).
   Not floored: the harness and sandbox (opencode's own CPU: README section 11), the verifier, the sync probe.
3. **Measured**: each phase's median over the metrics' steps, and floor / measured ("% of the limit") per step,
   median over steps. The metrics' host is not this one unless it says so: the default metrics
   (workbench/data/learning_demo/metrics.jsonl) ran on `fc-v1045`, an AVX2-only AMD EPYC, with the engine on both
   cores (``LearnConfig.engine_cores="all"``), fp32 engine and trainer, merged serving. Floors are given twice:
   the engine on 1 core (``engine_cores="half"``, `TrainConfig`'s default) and on ``--threads`` (``"all"``, as the
   learning demo ran); the trainer and the sync at ``--threads`` in both.
4. **Achieved**: a forward + backward of the real qwen-coder + PEFT LoRA (r 16, alpha 32, every linear layer of the
   blocks, as trl_trainer.py builds it) on one packed sequence of ``--model-tokens`` random ids, the LM head on the
   last ``--model-scored`` positions (`logits_to_keep`, like the compact head), fp32 and, where the cores compute
   bf16 natively (`workbench.cpu.bf16_native`), bf16 autocast (the trainer's ``precision="bf16"``; on an AVX2-only
   host torch's reference bf16 GEMM is ~20-200x slower than fp32, and `auto` never trains in it there: its warm-up
   alone took the whole budget and left fp32 no rep), one warm-up (``--model-warmup-tokens``) and 2 timed reps each,
   alternating, within ~5 minutes (`Knobs.model_budget_s`); achieved GFLOP/s = the trainer floor's FLOP count /
   time, against this host's measured matmul rate in that dtype (the goal: the trainer at >= 50% of it). Each rep
   records its CPU seconds: CPU / wall well under the thread count means another job had the cores.

qwen-coder's shape (Qwen2.5-Coder-0.5B-Instruct): hidden 896, MLP 4864, 24 layers, 14 query heads and 2 KV heads of
64, vocabulary 151,936, q/k/v biases, an untied LM head: 630.2 M parameters (the built asset's config says the same).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from run_file import host, new_run_file  # noqa: E402

DEFAULT_METRICS = ROOT / "workbench" / "data" / "learning_demo" / "metrics.jsonl"
# workbench/data/learning_demo/README.md: recorded on fc-v1045 (lscpu: AMD EPYC, 2 vCPUs, AVX2 only)
DEFAULT_METRICS_HOST = "fc-v1045-amd-epyc (AVX2 only; LearnConfig: engine on both cores, fp32, merged serving)"


@dataclass
class Knobs:
    """Everything the run can be told (the command line sets all but the two time budgets)."""

    threads: int = os.cpu_count() or 1  # the trainer's threads (build_trainer: os.cpu_count())
    metrics: Path = DEFAULT_METRICS
    metrics_host: str = ""  # which host recorded the metrics ("" = the default file's, else "unknown")
    model: str = "qwen-coder"  # the asset whose config.json gives the shape
    engine_bytes: int = 4  # engine dtype: 4 = float32 (the assets' dtype), 2 = bfloat16
    trainer_dtype: str = "fp32"  # which matmul rate the trainer floor uses: fp32 (the CPU default) or bf16
    lora_rank: int = 16  # TrainConfig / LearnConfig default
    group: int = 8  # rollouts per step when a metrics record does not say
    array_mib: int = 256  # per STREAM array: 8x the 32 MiB L3, so no rep runs from cache
    reps: int = 5  # timed reps per bandwidth / matmul measurement (best kept), fewer when one is slow
    budget_s: float = 4.0  # seconds of timed reps per measurement at most (the 2 cores are shared)
    matmul_tokens: int = 3000  # activation rows of the LLM-shaped matmuls: a group's forwarded tokens (~2,900)
    skip_model: bool = False
    model_tokens: int = 3000
    model_scored: int = 400  # README section 12: a group's segments score ~400 positions
    model_warmup_tokens: int = 512
    model_budget_s: float = 290.0  # the model part's warm-ups and reps (the 2 cores are shared: < 5 minutes)
    out: Path | None = None


# --- the floor arithmetic (pure: tests/test_limits.py) ---------------------------------------------------------------


class ModelShape(NamedTuple):
    """A decoder-only transformer, Qwen2/Llama layout: q/k/v/o attention, gated MLP (gate, up, down), RMS norms."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False  # LM head = the embedding matrix
    qkv_bias: bool = True  # Qwen2 has biases on q, k, v

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelShape:
        heads = cfg["num_attention_heads"]
        return cls(
            hidden=cfg["hidden_size"],
            intermediate=cfg["intermediate_size"],
            layers=cfg["num_hidden_layers"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            vocab=cfg["vocab_size"],
            tied=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        )

    def _linears(self) -> list[tuple[int, int]]:
        """(in, out) of each linear layer of one block: q, k, v, o, gate, up, down."""
        d, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return [(d, q), (d, kv), (d, kv), (q, d), (d, i), (d, i), (i, d)]

    @property
    def block_matmul_params(self) -> int:
        """Weights of one block's linear layers: every one is used once per token in a matmul."""
        return sum(a * b for a, b in self._linears())

    @property
    def block_params(self) -> int:
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return self.block_matmul_params + bias + 2 * self.hidden  # + two RMS norms

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        embed_and_head = self.head_params * (1 if self.tied else 2)
        return self.layers * self.block_params + embed_and_head + self.hidden  # + the final norm

    @property
    def decode_read_params(self) -> int:
        """Weights one decode step reads: all but the embedding table (b rows of it are looked up)."""
        return self.params - (0 if self.tied else self.head_params)

    def lora_params(self, rank: int) -> int:
        """LoRA on every linear layer of the blocks (trl_trainer.py's target_modules): A [r, in] + B [out, r]."""
        return self.layers * rank * sum(a + b for a, b in self._linears())

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes


# What `--skip-model`'s fallback and the docstring use when the asset is not built: Qwen2.5-Coder-0.5B-Instruct.
QWEN_CODER = ModelShape(
    hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, head_dim=64, vocab=151936, tied=False
)


def linear_flops(shape: ModelShape, tokens: float) -> float:
    """Forward matmul FLOPs of the blocks' linear layers: 2 per weight per token."""
    return 2.0 * shape.layers * shape.block_matmul_params * tokens


def attention_flops(shape: ModelShape, pairs: float) -> float:
    """Forward attention FLOPs for `pairs` (query, key) pairs: QK^T and PV, each 2 x head_dim per head per pair."""
    return 4.0 * shape.layers * shape.heads * shape.head_dim * pairs


def head_flops(shape: ModelShape, positions: float) -> float:
    return 2.0 * shape.head_params * positions


def causal_pairs(shared: float, private: list[float] | None = None) -> float:
    """(query, key) pairs of a causal prefix of `shared` tokens once, then each private segment attending to the
    prefix and causally to itself (`workbench.train.group_pack`'s packed layout; the engine's prefix cache)."""
    pairs = shared * (shared + 1) / 2
    for p in private or []:
        pairs += p * shared + p * (p + 1) / 2
    return pairs


def trainer_flops(shape: ModelShape, tokens: float, scored: float, pairs: float, lora_rank: int) -> float:
    """One LoRA fwd + bwd: base weights 2 (fwd) + 2 (input grads; frozen, no weight grads); LoRA 2 + 2 + 2 (its
    weight grads); attention fwd + 2x for its backward (dQ, dK, dV, dP: 4 matmuls vs 2); LM head on `scored`
    positions, fwd + input grad (frozen)."""
    return (
        2 * linear_flops(shape, tokens)
        + 6.0 * shape.lora_params(lora_rank) * tokens
        + 3 * attention_flops(shape, pairs)
        + 2 * head_flops(shape, scored)
    )


class StepTokens(NamedTuple):
    """One GRPO step's token counts, as the floors need them."""

    rollouts: int  # the group
    prompt: float  # the first call's prompt, the same for every rollout of the task: prefilled once
    private_prompt: float  # prompt tokens beyond it, all rollouts (later calls' tool results, ...): each prefilled once
    sampled: float  # tokens the engine sampled, all rollouts
    forwarded: float  # tokens the trainer forwards (the shared prefix once, then each row's own tokens)
    shared: float  # the trainer's shared prefix (may reach into identical first sampled tokens)
    rows: int

    @property
    def scored(self) -> float:
        """Positions the trainer's LM head scores: each row's own segment (completion slots; tool results too)."""
        return max(0.0, self.forwarded - self.shared)

    @property
    def decode_steps(self) -> float:
        """Decode steps of one rollout: the mean reply (the longest reply would set the lockstep batch's count)."""
        return self.sampled / self.rollouts

    @classmethod
    def from_metrics(cls, record: dict[str, Any], group: int = 8) -> StepTokens:
        """From a `workbench train` metrics line: group/row_tokens (every row's tokens), group/forwarded_tokens
        (the packed pass), sampled_tokens, rows, rollouts. Approximations, said here once:
        the trainer's shared prefix = (row tokens - forwarded) / (rows - 1) (one pack of all rows);
        the engine's prompt = a row's tokens less a rollout's mean sampled tokens, at most the shared prefix;
        the private prompt = what the rows hold beyond that prompt and the sampled tokens (0 for one call)."""
        rollouts = int(record.get("rollouts") or group)
        rows = int(record.get("rows") or rollouts)
        row_tokens = float(record["group/row_tokens"])
        forwarded = float(record["group/forwarded_tokens"])
        sampled = float(record["sampled_tokens"])
        shared = (row_tokens - forwarded) / (rows - 1) if rows > 1 else 0.0
        prompt = max(0.0, min(shared, (row_tokens - sampled) / rows)) if rows > 1 else row_tokens - sampled
        private_prompt = max(0.0, row_tokens - rows * prompt - sampled)
        return cls(rollouts, prompt, private_prompt, sampled, forwarded, shared, rows)


class Rates(NamedTuple):
    """What the machine does at one thread count (GB/s count bytes read + written; GFLOP/s per dtype)."""

    bandwidth_gbs: float  # for decode (read-dominated): the best STREAM-style kernel measured
    copy_gbs: float  # for sync: a copy, read + write
    engine_gflops: float  # matmul at the engine's dtype
    trainer_gflops: float  # matmul at the trainer's dtype


def _decode_step(shape: ModelShape, batch: int, context: float, rates: Rates, engine_bytes: int) -> dict[str, Any]:
    """One decode step of `batch` sequences of `context` tokens each: a roofline max of bytes and FLOPs."""
    nbytes = shape.decode_read_params * engine_bytes + batch * context * shape.kv_bytes_per_token(engine_bytes)
    flops = batch * (linear_flops(shape, 1) + head_flops(shape, 1)) + attention_flops(shape, batch * context)
    mem_s, flop_s = nbytes / (rates.bandwidth_gbs * 1e9), flops / (rates.engine_gflops * 1e9)
    return {
        "bytes": nbytes,
        "flops": flops,
        "s": max(mem_s, flop_s),
        "bound": "memory" if mem_s >= flop_s else "compute",
    }


def phase_floors(
    shape: ModelShape, tokens: StepTokens, rates: Rates, *, engine_bytes: int = 4, lora_rank: int = 16
) -> dict[str, Any]:
    """The least time each phase of one step can take at `rates`: seconds (``s``) and what they count.

    Keys: prefill, decode_batch (the group in lockstep), decode_serial (batch 1), rollout (= prefill +
    decode_batch), trainer, sync (merged: full weights), sync_lora_tensors, sync_adapter, step (rollout + trainer +
    sync). See the module docstring for each formula; every byte and FLOP count is in the dict."""
    g = tokens.rollouts
    per_private_prompt = tokens.private_prompt / g
    prefill_pairs = causal_pairs(tokens.prompt, [per_private_prompt] * g)
    prefill_tokens = tokens.prompt + tokens.private_prompt
    prefill_flops = linear_flops(shape, prefill_tokens) + attention_flops(shape, prefill_pairs) + head_flops(shape, g)
    prefill = {"tokens": prefill_tokens, "flops": prefill_flops, "s": prefill_flops / (rates.engine_gflops * 1e9)}

    steps = tokens.decode_steps
    context = tokens.prompt + per_private_prompt + steps / 2  # mean KV length over a reply
    one = _decode_step(shape, g, context, rates, engine_bytes)
    decode_batch = {**one, "batch": g, "steps": steps, "context": context, "s_per_step": one["s"]}
    decode_batch["s"] = one["s"] * steps
    one = _decode_step(shape, 1, context, rates, engine_bytes)
    decode_serial = {**one, "batch": 1, "steps": steps * g, "context": context, "s_per_step": one["s"]}
    decode_serial["s"] = one["s"] * steps * g

    per_row = tokens.scored / tokens.rows
    pairs = causal_pairs(tokens.shared, [per_row] * tokens.rows)
    flops = trainer_flops(shape, tokens.forwarded, tokens.scored, pairs, lora_rank)
    trainer = {
        "tokens": tokens.forwarded,
        "scored": tokens.scored,
        "flops": flops,
        "s": flops / (rates.trainer_gflops * 1e9),
    }

    def sync(params: int, nbytes: int) -> dict[str, Any]:
        moved = 2 * params * nbytes  # written by the trainer, read by the engine (STREAM copy counts both)
        return {"bytes": moved, "s": moved / (rates.copy_gbs * 1e9)}

    rollout_s = prefill["s"] + decode_batch["s"]
    full = sync(shape.params, engine_bytes)
    return {
        "prefill": prefill,
        "decode_batch": decode_batch,
        "decode_serial": decode_serial,
        "rollout": {"s": rollout_s},
        "trainer": trainer,
        "sync": full,
        "sync_lora_tensors": sync(shape.layers * shape.block_matmul_params, engine_bytes),
        "sync_adapter": sync(shape.lora_params(lora_rank), 4),  # the adapter is saved in fp32
        "step": {"s": rollout_s + trainer["s"] + full["s"]},
    }


# --- measuring the machine -------------------------------------------------------------------------------------------


def _best_s(fn: Callable[[], object], knobs: Knobs) -> tuple[float, int]:
    """Best seconds of `fn` over up to knobs.reps timed reps after one warm-up (first-touch page faults, thread pool
    start, oneDNN's kernel creation); fewer reps when one takes long, so a measurement costs <= ~budget_s."""
    t0 = time.perf_counter()
    fn()
    warm = time.perf_counter() - t0
    reps = max(1, min(knobs.reps, int(knobs.budget_s / max(warm, 1e-6))))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best, reps


def cpu_description() -> dict[str, Any]:
    import torch

    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    return {
        "lscpu_model_name": fields.get("Model name", "unknown").strip(),
        "lscpu_flags": {f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")},
        "l3": fields.get("L3 cache", "").strip(),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_bf16_supported": bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: None)()),
    }


def _numpy_stream(knobs: Knobs) -> dict[str, Any]:
    """STREAM copy and triad in numpy (one thread), float64 arrays of knobs.array_mib each."""
    import numpy as np

    n = knobs.array_mib * 2**20 // 8
    a, b, c = np.full(n, 1.0), np.full(n, 2.0), np.full(n, 0.5)  # np.full touches every page
    # 512 KiB of float64: the triad's scratch stays in the 1 MiB L2; 512 chunks of a 256 MiB array keep numpy's
    # per-call overhead (~2 x 1.5 us a chunk) near 4% of a ~40 ms pass
    chunk = 2**16
    tmp = np.empty(chunk)

    def triad() -> None:  # a = b + s*c, one pass over memory
        for i in range(0, n, chunk):
            j = min(i + chunk, n)
            np.multiply(c[i:j], 3.0, out=tmp[: j - i])
            np.add(b[i:j], tmp[: j - i], out=a[i:j])

    out = {}
    for name, fn, words in (("copy", lambda: np.copyto(a, b), 2), ("triad", triad, 3)):
        s, reps = _best_s(fn, knobs)
        out[f"numpy_{name}_1"] = {"gbs": words * n * 8 / s / 1e9, "s": s, "reps": reps}
    return out


def measure_bandwidth(knobs: Knobs) -> dict[str, Any]:
    """GB/s (1e9 bytes/s, read + write counted as STREAM does) of copy / triad / read, numpy 1 thread and torch at
    1 and knobs.threads."""
    import torch

    out: dict[str, Any] = {"array_mib": knobs.array_mib, **_numpy_stream(knobs)}
    n32 = knobs.array_mib * 2**20 // 4
    ta, tb, tc = torch.full((n32,), 1.0), torch.full((n32,), 2.0), torch.full((n32,), 0.5)
    kernels = (
        ("copy", lambda: ta.copy_(tb), 2),
        ("triad", lambda: torch.add(tb, tc, alpha=3.0, out=ta), 3),  # one TensorIterator pass: 2 reads, 1 write
        ("read", lambda: ta.sum(), 1),  # what decode does to the weights
    )
    for threads in sorted({1, knobs.threads}):
        torch.set_num_threads(threads)
        for name, fn, words in kernels:
            s, reps = _best_s(fn, knobs)
            out[f"torch_{name}_{threads}"] = {"gbs": words * n32 * 4 / s / 1e9, "s": s, "reps": reps}
    torch.set_num_threads(knobs.threads)
    return out


def matmul_shapes(shape: ModelShape, tokens: int) -> dict[str, tuple[int, int, int]]:
    """(M, K, N) per name: a square matmul and the model's linear layers on a [tokens, hidden] activation."""
    d, q, kv, i = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    return {
        "square_2048": (2048, 2048, 2048),
        f"q_o_{tokens}x{d}x{q}": (tokens, d, q),
        f"k_v_{tokens}x{d}x{kv}": (tokens, d, kv),
        f"gate_up_{tokens}x{d}x{i}": (tokens, d, i),
        f"down_{tokens}x{i}x{d}": (tokens, i, d),
    }


def measure_matmul(knobs: Knobs, shape: ModelShape) -> dict[str, Any]:
    """GFLOP/s (2MNK / s) per dtype, thread count and shape; `best` per dtype and threads: the fastest shape."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    out: dict[str, Any] = {}
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for threads in sorted({1, knobs.threads}):
            torch.set_num_threads(threads)
            per: dict[str, Any] = {}
            for name, (m, k, n) in matmul_shapes(shape, knobs.matmul_tokens).items():
                x = torch.randn(m, k, dtype=dtype)
                if name.startswith("square"):
                    y = torch.randn(k, n, dtype=dtype)
                    s, reps = _best_s(lambda x=x, y=y: torch.matmul(x, y), knobs)
                else:
                    w = torch.randn(n, k, dtype=dtype)  # nn.Linear's [out, in]
                    s, reps = _best_s(lambda x=x, w=w: F.linear(x, w), knobs)
                per[name] = {"gflops": 2 * m * k * n / s / 1e9, "s": s, "reps": reps}
            out[f"{dtype_name}_{threads}"] = {"shapes": per, "best": max(v["gflops"] for v in per.values())}
    torch.set_num_threads(knobs.threads)
    return out


def _best_up_to(rates: dict[str, Any], field: str, name: str, threads: int) -> float:
    """The best `field` of the measurements named `name` at up to `threads` threads: a job given 2 cores can always
    run as on 1, so its floor never uses a lower rate than 1 thread measured (the 2 cores are shared and noisy)."""
    return max(
        v[field] for k, v in rates.items() if isinstance(v, dict) and name in k and int(k.rsplit("_", 1)[1]) <= threads
    )


def rates_for(bandwidth: dict[str, Any], matmul: dict[str, Any], engine_threads: int, knobs: Knobs) -> Rates:
    """The engine's bandwidth and matmul rate at `engine_threads`; the trainer's and the sync's at knobs.threads."""
    engine = "bf16" if knobs.engine_bytes == 2 else "fp32"
    return Rates(
        bandwidth_gbs=_best_up_to(bandwidth, "gbs", "", engine_threads),  # copy, triad or read: decode only reads
        copy_gbs=_best_up_to(bandwidth, "gbs", "copy", knobs.threads),
        engine_gflops=_best_up_to(matmul, "best", engine, engine_threads),
        trainer_gflops=_best_up_to(matmul, "best", knobs.trainer_dtype, knobs.threads),
    )


# --- the model's achieved rate ---------------------------------------------------------------------------------------


def measure_model(knobs: Knobs, asset_path: Path, shape: ModelShape) -> dict[str, Any]:
    """qwen-coder + LoRA fwd + bwd on one sequence, fp32 and bf16 autocast: seconds and achieved GFLOP/s."""
    import resource

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(knobs.threads)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(asset_path, dtype=torch.float32)
    lora = LoraConfig(
        r=knobs.lora_rank,
        lora_alpha=2 * knobs.lora_rank,  # LearnConfig's r 16, alpha 32 (the rate does not depend on it)
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    model = get_peft_model(model, lora)
    model.train()
    load_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    T, K = knobs.model_tokens, knobs.model_scored
    ids = torch.randint(0, shape.vocab, (1, T), generator=g)
    targets = torch.randint(0, shape.vocab, (K,), generator=g)
    flops = trainer_flops(shape, T, K, causal_pairs(T), knobs.lora_rank)

    def step(bf16: bool, tokens: int) -> dict[str, float]:
        """One fwd + bwd of the first `tokens` ids; wall and this process's CPU seconds (CPU / wall ~ threads
        when the cores were ours: another job's load shows as less)."""
        k = min(K, tokens)
        r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids[:, :tokens], logits_to_keep=k).logits[0]
        loss = torch.nn.functional.cross_entropy(logits.float(), targets[:k])
        loss.backward()
        model.zero_grad(set_to_none=True)
        wall, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
        return {"s": wall, "cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime}

    out: dict[str, Any] = {
        "asset": str(asset_path),
        "tokens": T,
        "scored": K,
        "warmup_tokens": min(T, knobs.model_warmup_tokens),
        "lora_rank": knobs.lora_rank,
        "threads": knobs.threads,
        "load_s": load_s,
        "flops": flops,
        "attention": model.config._attn_implementation,
    }
    # The warm-up pages the lazily mapped weights in (the first fwd+bwd of a fresh process took 32 s against 5 s
    # after, at 256 tokens) and builds the kernels; a short one keeps the part within ~5 minutes. fp32 and bf16
    # alternate, so a change in the shared machine's load falls on both; a rep that would end past
    # knobs.model_budget_s (predicted from the last one) is not run.
    from workbench.cpu import bf16_native

    start, warm = time.perf_counter(), {}
    reps: dict[str, list[dict[str, float]]] = {"fp32": [], "bf16": []} if bf16_native() else {"fp32": []}
    warm_tokens = min(T, knobs.model_warmup_tokens)
    warm_flops = trainer_flops(shape, warm_tokens, min(K, warm_tokens), causal_pairs(warm_tokens), knobs.lora_rank)
    for name in reps:
        warm[name] = step(name == "bf16", warm_tokens)
    for _ in range(2):
        for name, done in reps.items():
            guess = done[-1]["s"] if done else warm[name]["s"] * flops / warm_flops
            if time.perf_counter() - start + guess > knobs.model_budget_s:
                continue
            done.append(step(name == "bf16", T))
    for name, done in reps.items():
        best = min((r["s"] for r in done), default=None)
        out[name] = {
            "warmup": warm[name],
            "reps": done,
            "best_s": best,
            "gflops": flops / best / 1e9 if best else None,
            "tokens_per_s": T / best if best else None,
        }
    out["wall_s"] = time.perf_counter() - start
    out["loadavg_after"] = os.getloadavg()
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


# --- the step's measured phases --------------------------------------------------------------------------------------

# (label, how it is measured from a record, which floor key)
PHASES: list[tuple[str, Callable[[dict[str, Any]], float], str | None]] = [
    ("rollout (engine: prefill + decode, batch = group)", lambda r: r["rollout_s"], "rollout"),
    ("trainer (fwd + bwd + optimizer)", lambda r: r["train_s"], "trainer"),
    ("sync write + reload (merged: full weights)", lambda r: r["sync_write_s"] + r["sync_reload_s"], "sync"),
    ("  ... vs only LoRA-touched tensors", lambda r: r["sync_write_s"] + r["sync_reload_s"], "sync_lora_tensors"),
    ("  ... vs the adapter alone", lambda r: r["sync_write_s"] + r["sync_reload_s"], "sync_adapter"),
    ("sync incl. probe (sync_s)", lambda r: r["sync_s"], "sync"),
    ("verify (not floored)", lambda r: r["verify_s"], None),
    ("step", lambda r: r["step_s"], "step"),
]


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], int]:
    """(the steps with a trainer pass to floor, how many steps skipped it). A step whose group had one reward skips
    the pass (its gradient is 0: `TrainConfig.skip_zero_advantage`), has no forwarded tokens and no floor to be held
    to, and is left out. ValueError when no step is left: a comparison over nothing would say nothing."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kept = [r for r in records if "train_s" in r and "group/forwarded_tokens" in r and "sampled_tokens" in r]
    if not kept:
        raise ValueError(f"{path}: no step with a trainer pass (train_s, group/forwarded_tokens, sampled_tokens)")
    return kept, sum(bool(r.get("group/loss_pass_skipped")) for r in records)


def compare(records: list[dict[str, Any]], shape: ModelShape, rates: dict[str, Rates], knobs: Knobs) -> dict:
    """Per phase: median measured, and per set of rates the median floor and median per-step floor / measured."""
    per_step = []
    for r in records:
        tokens = StepTokens.from_metrics(r, knobs.group)
        floors = {
            t: phase_floors(shape, tokens, rt, engine_bytes=knobs.engine_bytes, lora_rank=knobs.lora_rank)
            for t, rt in rates.items()
        }
        per_step.append({"step": r.get("step"), "tokens": tokens._asdict(), "floors": floors, "record": r})
    table = []
    for label, measured, key in PHASES:
        rows = [(measured(s["record"]), s["floors"]) for s in per_step]
        entry: dict[str, Any] = {"phase": label, "measured_median_s": statistics.median(m for m, _ in rows)}
        for t in rates:
            if key is not None:
                entry[f"floor_{t}_s"] = statistics.median(f[t][key]["s"] for _, f in rows)
                entry[f"pct_of_limit_{t}"] = 100 * statistics.median(f[t][key]["s"] / m for m, f in rows if m > 0)
        table.append(entry)
    for label, key in (
        ("  prefill (shared prompt once)", "prefill"),
        ("  decode, batch = group", "decode_batch"),
        ("  decode, batch 1 (serial)", "decode_serial"),
    ):
        entry = {"phase": label, "measured_median_s": None}
        for t in rates:
            entry[f"floor_{t}_s"] = statistics.median(s["floors"][t][key]["s"] for s in per_step)
        table.insert(1 if key == "prefill" else 2 if key == "decode_batch" else 3, entry)
    for s in per_step:
        del s["record"]
    return {"table": table, "per_step": per_step}


def load_shape(name: str) -> tuple[ModelShape, str, Path | None]:
    """The asset's config.json when built, else the qwen-coder numbers of the docstring."""
    try:
        from workbench.engine import load_asset

        path = load_asset(name).path
        cfg = json.loads((path / "config.json").read_text())
        return ModelShape.from_config(cfg), str(path / "config.json"), path
    except Exception as e:  # not built here (or not an asset name): the fallback says why
        if name != "qwen-coder":
            raise
        return QWEN_CODER, f"built-in Qwen2.5-Coder-0.5B numbers ({type(e).__name__}: {e})", None


def _fmt(x: float | None, unit: str = "s") -> str:
    if x is None:
        return "-"
    return f"{x:,.1f} {unit}" if x >= 10 else f"{x:.2f} {unit}" if x >= 0.1 else f"{x:.3f} {unit}"


def main(argv: list[str] | None = None) -> int:
    d = Knobs()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=d.threads, help="the trainer's torch threads")
    ap.add_argument("--metrics", type=Path, default=d.metrics)
    ap.add_argument("--metrics-host", default=d.metrics_host, help="which host recorded --metrics")
    ap.add_argument("--model", default=d.model)
    ap.add_argument("--engine-dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--trainer-dtype", choices=["fp32", "bf16"], default=d.trainer_dtype)
    ap.add_argument("--lora-rank", type=int, default=d.lora_rank)
    ap.add_argument("--group", type=int, default=d.group)
    ap.add_argument("--array-mib", type=int, default=d.array_mib)
    ap.add_argument("--reps", type=int, default=d.reps)
    ap.add_argument("--matmul-tokens", type=int, default=d.matmul_tokens)
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--model-tokens", type=int, default=d.model_tokens)
    ap.add_argument("--model-scored", type=int, default=d.model_scored)
    ap.add_argument("--model-warmup-tokens", type=int, default=d.model_warmup_tokens)
    ap.add_argument("--out", type=Path, default=None, help="an explicit results file (refused if it exists)")
    a = ap.parse_args(argv)
    knobs = Knobs(
        threads=a.threads,
        metrics=a.metrics,
        metrics_host=a.metrics_host
        or (DEFAULT_METRICS_HOST if a.metrics.resolve() == DEFAULT_METRICS else "unknown (pass --metrics-host)"),
        model=a.model,
        engine_bytes=2 if a.engine_dtype == "bfloat16" else 4,
        trainer_dtype=a.trainer_dtype,
        lora_rank=a.lora_rank,
        group=a.group,
        array_mib=a.array_mib,
        reps=a.reps,
        matmul_tokens=a.matmul_tokens,
        skip_model=a.skip_model,
        model_tokens=a.model_tokens,
        model_scored=a.model_scored,
        model_warmup_tokens=a.model_warmup_tokens,
        out=a.out,
    )
    if os.environ.get("OMP_NUM_THREADS"):
        print(f"note: OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} is set; torch's threads are set here anyway")
    import torch

    try:  # before the ~8 minutes of rates: a metrics file with nothing to compare is refused at once
        records, skipped = read_metrics(knobs.metrics)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    torch.set_num_threads(knobs.threads)
    path = new_run_file("limits", knobs.out)
    this_host = host()
    shape, shape_source, asset_path = load_shape(knobs.model)
    result: dict[str, Any] = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "host": this_host["host"],
        "machine": {**this_host, **cpu_description(), "loadavg_start": os.getloadavg()},
        "knobs": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(knobs).items()},
        "model_shape": {**shape._asdict(), "params": shape.params, "lora_params": shape.lora_params(knobs.lora_rank)},
        "model_shape_source": shape_source,
    }

    def save() -> None:
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")

    save()
    m = result["machine"]
    print(f"host {m['host']} | {m['lscpu_model_name']} | flags {m['lscpu_flags']} | torch {m['torch']} "
          f"({m['torch_cpu_capability']}) | load {m['loadavg_start']}")  # fmt: skip
    print(f"model {knobs.model}: {shape.params / 1e6:.1f} M params ({shape_source})")

    t0, r0 = time.perf_counter(), os.times()
    result["bandwidth"] = bw = measure_bandwidth(knobs)
    save()
    result["matmul"] = mm = measure_matmul(knobs, shape)
    result["rates_wall_s"] = time.perf_counter() - t0
    r1 = os.times()  # this process's CPU seconds: ~1x wall at 1 thread, ~2x at 2, when no other job took the cores
    result["rates_cpu_s"] = r1.user + r1.system - r0.user - r0.system
    result["loadavg_after_rates"] = os.getloadavg()
    threads = sorted({1, knobs.threads})
    # engine_cores="half" (TrainConfig's default) puts the engine on 1 core; "all" (LearnConfig, the learning_demo
    # metrics) on every core; the trainer uses knobs.threads either way
    rates = {f"engine_{t}": rates_for(bw, mm, t, knobs) for t in threads}
    result["rates"] = {k: r._asdict() for k, r in rates.items()}
    save()
    print(f"\nmachine rates ({result['rates_wall_s']:.0f} s; GB/s count read + write; {knobs.array_mib} MiB arrays)")
    print(
        "| threads | numpy copy | numpy triad | torch copy | torch triad | torch read | fp32 GFLOP/s | bf16 GFLOP/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for t in threads:
        np_copy = _fmt(bw["numpy_copy_1"]["gbs"], "") if t == 1 else "-"
        np_triad = _fmt(bw["numpy_triad_1"]["gbs"], "") if t == 1 else "-"
        tc, tt, tr = (_fmt(bw[f"torch_{k}_{t}"]["gbs"], "") for k in ("copy", "triad", "read"))
        print(f"| {t} | {np_copy} | {np_triad} | {tc} | {tt} | {tr} | "
              f"{mm[f'fp32_{t}']['best']:.1f} | {mm[f'bf16_{t}']['best']:.1f} |")  # fmt: skip
    for key, v in mm.items():
        print(f"  {key}: " + ", ".join(f"{n} {s['gflops']:.1f}" for n, s in v["shapes"].items()))

    cmp = compare(records, shape, rates, knobs)
    result["metrics"] = {"path": str(knobs.metrics), "host": knobs.metrics_host, "steps": len(records)}
    result["comparison"] = cmp
    save()
    result["metrics"]["steps_without_a_pass"] = skipped
    print(f"\nfloors on THIS host ({this_host['host']}) vs measured on {knobs.metrics_host}")
    print(f"({len(records)} steps of {knobs.metrics}, {skipped} more without a pass (one reward); engine {8 * knobs.engine_bytes}-bit weights, trainer "
          f"{knobs.trainer_dtype} at {knobs.threads} threads; medians over steps; % of the limit = median of per-step "
          f"floor / measured; engine on 1 thread = engine_cores='half', on {knobs.threads} = 'all')")  # fmt: skip
    head = " | ".join(f"floor, engine {t} thr | % of limit" for t in threads)
    print(f"| phase | measured (median) | {head} |")
    print("|---" * (2 + 2 * len(threads)) + "|")
    for e in cmp["table"]:
        cells = []
        for k in rates:
            pct = e.get(f"pct_of_limit_{k}")
            cells += [_fmt(e.get(f"floor_{k}_s")), f"{pct:.1f}%" if pct is not None else "-"]
        print(f"| {e['phase']} | {_fmt(e['measured_median_s'])} | " + " | ".join(cells) + " |")
    tok = cmp["per_step"][len(cmp["per_step"]) // 2]
    print(f"  e.g. step {tok['step']}: " + ", ".join(f"{k} {v:,.0f}" for k, v in tok["tokens"].items()))

    if knobs.skip_model:
        print("\nmodel fwd+bwd: skipped (--skip-model)")
    elif asset_path is None:
        result["model"] = {"skipped": f"asset {knobs.model} not built: {shape_source}"}
        print(f"\nmodel fwd+bwd: skipped, {result['model']['skipped']}")
    else:
        result["model"] = md = measure_model(knobs, asset_path, shape)
        save()
        print(f"\n{knobs.model} + LoRA r{knobs.lora_rank}, fwd+bwd of {md['tokens']} tokens ({md['scored']} scored), "
              f"{knobs.threads} threads, {md['flops'] / 1e12:.2f} TFLOP counted; peak RSS {md['peak_rss_mib']:,.0f} MiB")  # fmt: skip
        if "bf16" not in md:
            print("  bf16: not measured (the cores have no native bf16: AVX512-BF16 / AMX-BF16 absent)")
        for name in [d for d in ("fp32", "bf16") if d in md]:
            v = md[name]
            ref = _best_up_to(mm, "best", name, knobs.threads)
            if v["gflops"] is None:
                print(f"  {name}: no rep within the budget ({knobs.model_budget_s:.0f} s)")
                continue
            v["pct_of_matmul"] = 100 * v["gflops"] / ref
            walls = ", ".join(f"{r['s']:.1f}" for r in v["reps"])
            busy = ", ".join(f"{r['cpu_s'] / r['s']:.2f}" for r in v["reps"])
            print(f"  {name}: {v['best_s']:.1f} s (reps {walls}, CPU/wall {busy}; warm-up {md['warmup_tokens']} "
                  f"tokens {v['warmup']['s']:.1f} s), {v['gflops']:.1f} GFLOP/s = {v['pct_of_matmul']:.0f}% of the "
                  f"measured {name} matmul rate {ref:.1f} (goal >= 50%), {v['tokens_per_s']:.0f} tokens/s")  # fmt: skip
    result["loadavg_end"] = os.getloadavg()
    save()
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

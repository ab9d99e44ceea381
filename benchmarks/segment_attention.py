"""The packed step's segments attended in groups vs one masked SDPA over every key (CPU, qwen-coder, bf16).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/segment_attention.py          # ~25 min on 2 cores, nothing else running
    .venv/bin/python benchmarks/segment_attention.py --layouts-from RUN/grpo/rollouts --layouts-out F.json  # layouts

A GRPO group packs as one sequence: the rows' shared prefix once, then each row's own segment
(`workbench.train.group_pack`). The blockwise CPU attention ran the segments as ONE masked SDPA over every key of
the pack; the tree mask lets a segment see only the shared tokens and itself, so with long segments (a multi-call
rollout's calls) most of that SDPA's pairs are masked out and still computed. `Pack.groups` cuts such packs into
groups of segments, each group one SDPA against the shared keys and its own. Measured side by side, same layouts:

0. **The cost model** of `Pack.groups`: one masked SDPA forward + backward at 11 shapes (queries x keys), fitted as
   seconds per pair, per key and per call (`group_pack.ATTENTION_COST` holds a fit of this part).
1. **The attention alone**, one layer of qwen-coder's shape (14 query heads, 2 key-value heads, head dim 64), bf16,
   forward + backward of `group_pack._group_attention` three ways: one masked SDPA over every key (the path before),
   the cut `Pack.groups` chooses, and every segment alone (the best of `--rounds` interleaved rounds); on the packs
   of the third HumanEval run's first nine steps (real layouts: `--layouts`), on a one-call group's shape (8
   segments of 40 tokens past 2,900) and on a sweep of segment lengths past the same prefix.
2. **The model**, qwen-coder (dequantised from a GGUF) with LoRA r 16 on every linear layer, bf16 autocast,
   activation checkpointing (the run's settings): the backbone's forward and backward on the largest and a typical
   recorded pack, random token ids at the recorded layout (the attention's cost does not depend on the ids), one
   SDPA vs the cut, after one untimed round. The LM head is left out (the same for both; TRL's fused head scores
   only the trained positions).

The layouts come from a run's recorded rollouts through the training path's own `step_fields` and `plan`
(`--layouts-from`); the committed file is `results/segment_attention/layouts_he_direct_pool.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file
from run_file import RESULTS, host, new_run_file
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from workbench.train import group_pack

LAYOUTS = RESULTS / "segment_attention" / "layouts_he_direct_pool.json"
ONE_CALL = {"name": "one-call shape", "n": 2900, "lengths": [40] * 8}
SWEEP = [100, 200, 300, 500, 800]  # 8 segments of each length past 2,900 shared tokens


class _Attention(torch.nn.Module):  # what transformers' sdpa reads from Qwen2's attention module
    num_key_value_groups = 7
    is_causal = True


def pack_of(n: int, lengths: list[int]) -> group_pack.Pack:
    seg = torch.cat([torch.full((n,), -1)] + [torch.full((m,), k) for k, m in enumerate(lengths)])
    L = len(seg)
    ids = torch.randint(0, 151_000, (L,), generator=torch.Generator().manual_seed(L))
    return group_pack.Pack(list(range(len(lengths))), ids, torch.arange(L), torch.zeros(L), seg, n, tuple(lengths))


def extract_layouts(rollouts: Path, out: Path) -> None:
    """Each recorded step's packs, through the training path: the run's config, its rows, TRL's padding, `plan`.
    `out` must be a new file: the committed layouts are what the results files were measured on."""
    if out.exists():
        raise FileExistsError(f"{out} exists: give --layouts-out a new file")
    from transformers import AutoTokenizer

    from workbench.engine import load_asset
    from workbench.tasks import load_task
    from workbench.train.config import TrainConfig
    from workbench.train.fields import step_fields
    from workbench.train.replay import load_recording
    from workbench.turns.trace import mask_policy

    saved = json.loads((rollouts.parent / "config.json").read_text())["train"]
    cfg = TrainConfig(**{f.name: saved[f.name] for f in fields(TrainConfig) if f.name in saved})
    tokenizer = AutoTokenizer.from_pretrained(load_asset(cfg.model).path)
    steps = []
    for step in sorted(p for p in rollouts.iterdir() if p.name.startswith("step-")):
        if sum((d / "summary.json").exists() for d in step.iterdir()) < cfg.group_size:
            continue  # the step in flight
        recording = load_recording(step, temperature=cfg.temperature)
        task = recording.task_ids[0]
        results, _ = recording.results(task, cfg.group_size)
        f, _ = step_fields(
            cfg, [load_task(task)], results, lambda _: 0.0, mask_policy(cfg.train_turns), tokenizer, policy=None
        )
        P, K = max(map(len, f["prompt_ids"])), max(map(len, f["completion_ids"]))
        ids = torch.zeros(len(f["prompt_ids"]), P + K, dtype=torch.long)
        am = torch.zeros_like(ids)
        for b, (p, c) in enumerate(zip(f["prompt_ids"], f["completion_ids"])):
            ids[b, P - len(p) : P + len(c)] = torch.tensor(p + c)
            am[b, P - len(p) : P + len(c)] = 1
        plan = group_pack.plan(ids, am, K)
        rows = sorted(p + c for p, c in zip(f["prompt_ids"], f["completion_ids"]))
        # a tree of every row's tokens (each distinct prefix once): what a pack could forward at the least
        tree = sum(len(b) - _lcp(a, b) for a, b in zip([[], *rows], rows))
        for i, pk in enumerate(plan.packs):
            if sum(pk.lengths) > 16:  # not a pack of pad rows (one token each)
                steps.append(
                    {
                        "name": f"{step.name} pack {i}",
                        "n": pk.n_shared,
                        "lengths": list(pk.lengths),
                        "step_forwarded_tokens": plan.forwarded_tokens,
                        "step_tree_tokens": tree,
                    }
                )
    out.write_text(
        json.dumps(
            {"rollouts": "/".join(rollouts.resolve().parts[-4:]), "task_model": cfg.model, "packs": steps}, indent=1
        )
    )
    print(f"{len(steps)} packs -> {out}")


FIT_SHAPES = [(q, k) for q in (32, 128, 512, 2048) for k in (1024, 3072, 6144) if q <= k]


def fit_cost(reps: int) -> dict[str, object]:
    """`group_pack.ATTENTION_COST` from one masked SDPA forward + backward per shape (queries, keys), the mask as a
    segment's (every shared key, causal on its own): seconds = a * q * k + b * k + c * q + d, least squares
    relative to each time (the c * q term is the same for every cut of a pack and is left out of the model)."""
    m, times = _Attention(), []
    for qn, kn in FIT_SHAPES:
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, 14, qn, 64, generator=g).to(torch.bfloat16).requires_grad_()
        k, v = (torch.randn(1, 2, kn, 64, generator=g).to(torch.bfloat16).requires_grad_() for _ in range(2))
        mask = torch.ones(1, 1, qn, kn, dtype=torch.bool).tril(kn - qn)
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            out, _ = sdpa_attention_forward(m, q, k, v, mask)
            out.float().sum().backward()
            best = min(best, time.perf_counter() - t)
        times.append(best)
    a = torch.tensor([[q * k, k, q, 1.0] for q, k in FIT_SHAPES], dtype=torch.float64)
    y = torch.tensor(times, dtype=torch.float64)
    coef = torch.linalg.lstsq(a / y[:, None], torch.ones_like(y)).solution
    err = ((a @ coef - y) / y).abs()
    fit = {
        "shapes_s": [[q, k, round(t, 4)] for (q, k), t in zip(FIT_SHAPES, times)],
        "per_pair_s": float(coef[0]),
        "per_key_s": float(coef[1]),
        "per_query_s": float(coef[2]),
        "per_call_s": float(coef[3]),
        "relative_error_max": round(float(err.max()), 3),
        "relative_error_mean": round(float(err.mean()), 3),
    }
    print(json.dumps(fit), flush=True)
    return fit


def _lcp(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def attention_time(pack: group_pack.Pack, groups: tuple[int, ...] | None) -> float:
    L, mask, m = len(pack.ids), pack.mask(), _Attention()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, L, 64, generator=g).to(torch.bfloat16).requires_grad_() for h in (14, 2, 2))
    t = time.perf_counter()
    out, _ = group_pack._group_attention(m, q, k, v, mask, wb_shared=pack.n_shared, wb_groups=groups)
    out.float().sum().backward()
    return time.perf_counter() - t


def attention_part(layouts: list[dict], rounds: int) -> list[dict]:
    rows = []
    for lay in layouts:
        pack = pack_of(lay["n"], lay["lengths"])
        cut = pack.blockwise_kwargs().get("wb_groups")  # None where the cut is one group: the path before
        ways: dict[str, tuple[int, ...] | None] = {"one_sdpa": None, "cut": cut, "every_segment": pack.lengths}
        t = {name: float("inf") for name in ways}
        for _ in range(rounds):  # interleaved: host noise falls on every way alike
            for name, groups in ways.items():
                t[name] = min(t[name], attention_time(pack, groups))
        n, tail = pack.n_shared, len(pack.ids) - pack.n_shared
        apart = sum(m * n + m * (m + 1) // 2 for m in pack.lengths)
        row = {
            "name": lay["name"],
            "tokens": len(pack.ids),
            "n_shared": n,
            "segments": len(pack.lengths),
            "groups": list(pack.groups),
            "pairs_apart_fraction": round(apart / (tail * len(pack.ids)), 3),
            **{f"{name}_s": round(x, 3) for name, x in t.items()},
            "cut_speedup": round(t["one_sdpa"] / t["cut"], 2),
            "every_segment_speedup": round(t["one_sdpa"] / t["every_segment"], 2),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def model_part(layouts: list[dict], reps: int) -> list[dict]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from workbench.engine import load_asset

    model = AutoModelForCausalLM.from_pretrained(load_asset("qwen-coder").path, dtype=torch.float32)
    model.config._attn_implementation = group_pack.ATTENTION
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model.train()
    backbone = model.get_base_model().model
    rows = []
    for lay in layouts:
        pack = pack_of(lay["n"], lay["lengths"])
        w = torch.randn(len(pack.ids), model.config.hidden_size, generator=torch.Generator().manual_seed(1))
        t: dict[bool, list[float]] = {False: [], True: []}
        for warm in [True] + [False] * reps:
            for wise in (False, True):
                extra = pack.blockwise_kwargs() if wise else {"wb_shared": pack.n_shared}
                start = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    hidden = backbone(
                        input_ids=pack.ids[None], attention_mask=pack.mask(), position_ids=pack.positions[None], **extra
                    ).last_hidden_state
                (hidden[0].float() * w).sum().backward()
                if not warm:  # the first round pays for first-touch allocations and is not timed
                    t[wise].append(time.perf_counter() - start)
                model.zero_grad(set_to_none=True)
        row = {
            "name": lay["name"],
            "tokens": len(pack.ids),
            "groups": list(pack.groups),
            "one_sdpa_s": [round(x, 1) for x in t[False]],
            "cut_s": [round(x, 1) for x in t[True]],
            "tokens_per_s": [round(len(pack.ids) / min(t[False]), 1), round(len(pack.ids) / min(t[True]), 1)],
            "speedup": round(min(t[False]) / min(t[True]), 2),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layouts", type=Path, default=LAYOUTS, help="recorded pack layouts (JSON)")
    parser.add_argument("--layouts-from", type=Path, help="a run's rollouts/ folder: write its layouts and stop")
    parser.add_argument("--layouts-out", type=Path, help="with --layouts-from: the new file to write")
    parser.add_argument("--rounds", type=int, default=3, help="attention: the best of this many interleaved rounds")
    parser.add_argument("--model-packs", default="step-0006 pack 0,step-0008 pack 0", help="'' to skip the model")
    parser.add_argument("--model-reps", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.layouts_from:
        if args.layouts_out is None:
            parser.error("--layouts-from needs --layouts-out (a new file)")
        extract_layouts(args.layouts_from, args.layouts_out)
        return
    torch.set_num_threads(2)
    recorded = json.loads(args.layouts.read_text())["packs"]
    sweep = [{"name": f"8 x {m} past 2900", "n": 2900, "lengths": [m] * 8} for m in SWEEP]
    out = new_run_file("segment_attention", args.out)
    result: dict[str, object] = {
        "machine": host(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "layouts": str(args.layouts.relative_to(ROOT) if args.layouts.is_relative_to(ROOT) else args.layouts),
        "attention_cost": group_pack.ATTENTION_COST,
    }
    result["fit"] = fit_cost(args.rounds)
    out.write_text(json.dumps(result, indent=1))
    result["attention"] = attention_part([*recorded, ONE_CALL, *sweep], args.rounds)
    out.write_text(json.dumps(result, indent=1))
    wanted = [n for n in args.model_packs.split(",") if n]
    result["model"] = model_part([p for p in recorded if p["name"] in wanted], args.model_reps)
    out.write_text(json.dumps(result, indent=1))
    print(out)


if __name__ == "__main__":
    main()

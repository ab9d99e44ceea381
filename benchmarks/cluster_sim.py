"""A step's rollouts on a large cluster, simulated: placement (pack vs spread), node failures, and what a failed
rollout becomes (a fake 0 vs re-queued and, past a limit, unscored). **A model on paper**, not a measurement of
a cluster: only the rollout times are measured (the whole-loop run's own, resampled).

    python3 benchmarks/cluster_sim.py [--whole-loop benchmarks/results/whole_loop/<file>.json] [--save]

The model (every knob a flag, defaults in `Sim`):
- `nodes` x `slots` sandboxes (64 x 32 by default); one step = `groups` x `group_size` rollouts (256 x 8 = 2,048:
  one wave), each taking a time drawn with replacement from the measured `harness_s` of the whole-loop run's
  rollouts (opencode, qwen-coder on 2 cores: the tail is the 600 s wall clock). A slot runs one rollout; the
  queue is served in group order.
- placement: `pack` gives a rollout to the busiest node with a free slot (Ray's PACK; a group lands on one node),
  `spread` to the least busy (Ray's SPREAD; a group of 8 lands on 8 nodes).
- failures: each node dies after an exponential time with mean `mtbf_h` and comes back `repair_s` later; every
  rollout running on it is lost. `zero` scores a lost rollout 0 (what a home-made fan-out does: the group's
  advantages then train on noise); `requeue` puts it back at the head of the queue up to `retries` times, then
  leaves it unscored (`infra_failed`), never a 0.

Per scenario, over `steps` simulated steps: the step's wall time (p50, p90), rollouts lost, fake zeros, unscored,
groups whose advantages hold a fake 0 ("corrupted"), groups short of rollouts, groups lost whole.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from run_file import host, host_slug  # noqa: E402

Placement = Literal["pack", "spread"]
OnFailure = Literal["zero", "requeue"]
DEFAULT_WHOLE_LOOP = ROOT / "benchmarks" / "results" / "whole_loop" / "2026-12-05T122623_fc-v1272-amd-epyc.json"


@dataclass(frozen=True)
class Sim:
    nodes: int = 64
    slots: int = 32
    groups: int = 256
    group_size: int = 8
    mtbf_h: float = 24.0  # a node's mean time between failures; 2 h is a preemptible fleet
    repair_s: float = 600.0
    retries: int = 2
    steps: int = 200
    seed: int = 0


def one_step(sim: Sim, times: list[float], placement: Placement, on_failure: OnFailure, rng: random.Random) -> dict:
    """One step, event by event: returns its wall time and what failures did to it."""
    n_roll = sim.groups * sim.group_size
    queue = [(i, 0) for i in range(n_roll)]  # (rollout, attempt), served from the front
    queue.reverse()  # pop() from the end = the front
    busy = [0] * sim.nodes
    up = [True] * sim.nodes
    running: dict[int, list[tuple[int, int, float]]] = {
        n: [] for n in range(sim.nodes)
    }  # node -> (rollout, attempt, end)
    events: list[tuple[float, int, str, int]] = []  # (time, seq, kind, node)
    seq = 0
    for n in range(sim.nodes):
        heapq.heappush(events, (rng.expovariate(1 / (sim.mtbf_h * 3600)), seq, "fail", n))
        seq += 1
    outcome: dict[int, str] = {}  # rollout -> "done" | "zero" | "unscored"
    lost = 0
    now = 0.0

    def dispatch() -> None:
        nonlocal seq
        while queue:
            free = [n for n in range(sim.nodes) if up[n] and busy[n] < sim.slots]
            if not free:
                return
            node = (
                max(free, key=lambda n: (busy[n], -n)) if placement == "pack" else min(free, key=lambda n: (busy[n], n))
            )
            rollout, attempt = queue.pop()
            end = now + rng.choice(times)
            busy[node] += 1
            running[node].append((rollout, attempt, end))
            heapq.heappush(events, (end, seq, "end", node))
            seq += 1

    dispatch()
    while len(outcome) < n_roll:
        now, _, kind, node = heapq.heappop(events)
        if kind == "end":
            done = [r for r in running[node] if r[2] == now]
            if not done:  # the node died while it ran: the rollout was already handled
                continue
            running[node].remove(done[0])
            busy[node] -= 1
            outcome[done[0][0]] = "done"
        elif kind == "fail":
            up[node] = False
            for rollout, attempt, _end in running[node]:
                lost += 1
                if on_failure == "zero":
                    outcome[rollout] = "zero"
                elif attempt < sim.retries:
                    queue.append((rollout, attempt + 1))  # the head of the queue
                else:
                    outcome[rollout] = "unscored"
            running[node], busy[node] = [], 0
            heapq.heappush(events, (now + sim.repair_s, seq, "repair", node))
            seq += 1
        else:  # repair
            up[node] = True
            heapq.heappush(events, (now + rng.expovariate(1 / (sim.mtbf_h * 3600)), seq, "fail", node))
            seq += 1
        dispatch()
    groups = [[outcome[g * sim.group_size + k] for k in range(sim.group_size)] for g in range(sim.groups)]
    return {
        "wall_s": now,
        "lost": lost,
        "fake_zeros": sum(o == "zero" for o in outcome.values()),
        "unscored": sum(o == "unscored" for o in outcome.values()),
        "groups_corrupted": sum("zero" in g for g in groups),
        "groups_short": sum("unscored" in g for g in groups),
        "groups_lost_whole": sum(all(o != "done" for o in g) for g in groups),
    }


def scenario(sim: Sim, times: list[float], placement: Placement, on_failure: OnFailure) -> dict:
    rng = random.Random(f"{sim.seed}-{placement}-{on_failure}")
    steps = [one_step(sim, times, placement, on_failure, rng) for _ in range(sim.steps)]
    walls = sorted(s["wall_s"] for s in steps)
    n_roll = sim.groups * sim.group_size
    return {
        "placement": placement,
        "on_failure": on_failure,
        "wall_s_p50": round(statistics.median(walls), 1),
        "wall_s_p90": round(walls[int(0.9 * (len(walls) - 1))], 1),
        "lost_per_step": round(statistics.mean(s["lost"] for s in steps), 2),
        "fake_zero_rate": round(sum(s["fake_zeros"] for s in steps) / (n_roll * sim.steps), 5),
        "infra_failed_rate": round(sum(s["unscored"] for s in steps) / (n_roll * sim.steps), 5),
        "groups_corrupted_per_step": round(statistics.mean(s["groups_corrupted"] for s in steps), 2),
        "groups_short_per_step": round(statistics.mean(s["groups_short"] for s in steps), 2),
        "groups_lost_whole_per_step": round(statistics.mean(s["groups_lost_whole"] for s in steps), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--whole-loop", type=Path, default=DEFAULT_WHOLE_LOOP, help="rollout times from this file")
    for name, value in asdict(Sim()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--mtbf-list", default="24,2", help="comma-separated mtbf_h values to run (overrides --mtbf-h)")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/cluster_sim/<stamp>_<host>.json")
    args = parser.parse_args()
    loop = json.loads(args.whole_loop.read_text())
    times = [r["harness_s"] for r in loop["rollouts"] if r.get("harness_s")]
    if not times:
        parser.error(f"{args.whole_loop} holds no rollout with a harness_s")
    base = Sim(**{k: getattr(args, k) for k in asdict(Sim())})
    rows = []
    for mtbf in (float(x) for x in args.mtbf_list.split(",")):
        sim = Sim(**{**asdict(base), "mtbf_h": mtbf})
        for placement in ("pack", "spread"):
            for on_failure in ("zero", "requeue"):
                rows.append({"mtbf_h": mtbf, **scenario(sim, times, placement, on_failure)})
                print(json.dumps(rows[-1]))
    report = {
        "what": "a model on paper: only the rollout times are measured",
        "host": host(),
        "sim": {k: v for k, v in asdict(base).items() if k != "mtbf_h"},
        "rollout_times": {
            "from": str(args.whole_loop.relative_to(ROOT)),
            "n": len(times),
            "median_s": round(statistics.median(times), 1),
            "max_s": round(max(times), 1),
        },
        "scenarios": rows,
    }
    if args.save:
        out = ROOT / "benchmarks" / "results" / "cluster_sim" / f"{time.strftime('%Y-%m-%dT%H%M%S')}_{host_slug()}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""Write the OpenEnv training-trace fixtures in workbench/data/traces/ with OpenEnv's own classes.

Two shipped SmolLM2 rollouts (workbench/data/rollouts/smollm2-fork-bpe, -fork-invalid: opencode rewrote the tail
of its first reply before sending it back, so the next prompt forks there) are turned into OpenEnv 0.10.0
`TraceEntry` dicts and then into `TrainingTrace.from_entries(...).model_dump_json()`, exactly as an OpenEnv
producer writes them, with a **partial** mask from a producer that trains only what the harness kept: the
first turn's sampled tokens up to the divergence are 1, the rewritten tail 0 (41 of 50 and 10 of 30 tokens);
turns without a tool call are context. Rewards and task ids are not part of OpenEnv's schema:
`workbench import --reward ... --task-id ...` supplies them.

    .venv/bin/python scripts/make_openenv_traces.py        # rewrites the two files byte for byte
"""

from __future__ import annotations

from pathlib import Path

from openenv.core.harness.training import TrainingTrace

from workbench.rollout import agent_entries
from workbench.turns import analyse, load_trace

ROOT = Path(__file__).resolve().parents[1]


def kept_by_harness(rollout: Path) -> str:
    calls = load_trace(rollout / "trace.json")
    a = analyse(calls)
    entries = agent_entries(calls)
    rewritten = {f.prev_turn: f.index - len(a.turns[f.prev_turn].prompt_ids) for f in a.forks}
    for turn, entry in zip(a.turns, entries, strict=True):
        n = len(turn.output_ids)
        keep = min(n, rewritten.get(turn.index, n)) if turn.trained else 0
        entry["loss_mask"] = [0] * len(turn.prompt_ids) + [1] * keep + [0] * (n - keep)
        entry["metadata"] = {**entry["metadata"], "producer": "kept-by-harness", "model": "smollm2"}
    return TrainingTrace.from_entries(entries).model_dump_json()


if __name__ == "__main__":
    for name in ("smollm2-fork-bpe", "smollm2-fork-invalid"):
        out = ROOT / "workbench" / "data" / "traces" / f"openenv-{name.removeprefix('smollm2-')}.json"
        out.write_text(kept_by_harness(ROOT / "workbench" / "data" / "rollouts" / name))
        print(out.relative_to(ROOT), out.stat().st_size, "bytes")

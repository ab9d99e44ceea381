"""Train: TRL's GRPO on the exact tokens the engine produced, the policy synced back to the engine (notebook 05).

    from workbench.train import GRPORun, TrainConfig
    run = GRPORun(TrainConfig(model="tiny", tasks="easy-train[:2]", steps=1, group_size=4), run_dir=Path("runs/t0"))
    metrics = run.train()                       # rollouts through the harness, rewards, one GRPO step each

Private modules: ``grpo`` (`GRPORun`), ``config`` (`TrainConfig`, every knob documented), ``trl_trainer`` (the
TRL GRPOTrainer it builds), ``fields``, ``rows`` and ``types`` (what a step reads), ``group_step`` and
``group_pack`` (the shared-prefix step), ``policy_sync``, ``merged_file`` and ``sync_probe`` (weights to the engine, checked),
``replay`` (training from recorded rollouts), ``async_grpo`` and ``openenv_session`` (TRL's async trainer over
OpenEnv), ``resume``, ``_mlp_recompute``, ``experimental/``. docs/training.md: the levers and their costs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.train.config import resolve_importance_sampling, TrainConfig
    from workbench.train.grpo import GRPORun, resolve_weight_sync
    from workbench.train.openenv_session import HarnessSessionFactory
    from workbench.train.policy_sync import merge_adapter_folder, write_merged
    from workbench.train.sync_probe import engine_prompt_logprobs, model_logprobs, SyncProbe, WeightSyncError
    from workbench.train.sync_probe import PROBE_TEXT, probe_threads, served_dtype, tolerance

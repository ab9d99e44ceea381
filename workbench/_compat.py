"""Every private name of TRL, OpenEnv and uvicorn that workbench relies on, in one place, for the pinned versions.

TRL's GRPOTrainer and OpenEnv's capture server have no public seam for what we do (score a group's shared
prefix once, take the IS ratio from the loss pass, stream the capture proxy's relay), so we use a few of
their private methods and helpers. They live here and nowhere else: importing this module checks that the
installed versions are the pinned ones (pyproject.toml), and `tests/test_compat.py` checks that each name
still exists with the shape we use, so an upgrade fails in one test with the name that moved, not deep in
a training step.

    from workbench import _compat
    setattr(trainer, _compat.GRPO_GET_LOGPS, ours)          # a GRPOTrainer method name
    _compat.trl_use_triton(device)                         # trl.trainer.utils._use_triton
    _compat.budget_stop_response(...)                      # OpenEnv's, imported on first use
    _compat.quiet_known_noise()                            # what the pinned versions repeat at every step

Nothing heavy is imported here: TRL on first use of a TRL helper, OpenEnv's capture server (gradio,
pandas: ~7 s) only when one of its names is first read (module ``__getattr__``), so the trainer's
import stays light (tests/test_imports.py).
"""

from __future__ import annotations

import importlib.metadata
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TRL_VERSION",
    "OPENENV_VERSION",
    "check_versions",
    "GRPO_GET_LOGPS",
    "GRPO_GENERATE",
    "GRPO_COMPUTE_LOSS",
    "GRPO_METRICS",
    "GRPO_ENTROPY_BONUS",
    "GRPO_LAST_LOADED_STEP",
    "ASYNC_RUN_SESSION",
    "trl_lossless_rows",
    "trl_use_triton",
    "patch_trl_use_triton",
    "quiet_known_noise",
    "OPENENV_PRIVATE",
    "OPENENV_CLIENT_POST",
    "OPENENV_POOL_ENGINES",
    "ClientPolicy",
    "client_policy",
    "UVICORN_VERSION",
    "UVICORN_PROTOCOL_HOOKS",
    "check_uvicorn",
]

TRL_VERSION = "1.16.0"
OPENENV_VERSION = "0.10.0"

# GRPOTrainer (trl 1.16.0) methods workbench.train.group_step replaces or wraps, and attributes it reads:
GRPO_GET_LOGPS = "_get_per_token_logps_and_entropies"  # (model, input_ids, attention_mask, logits_to_keep,
#     batch_size, compute_entropy, compute_aux_loss, **multimodal) -> (logps, entropies, aux_loss)
GRPO_GENERATE = "_generate_and_score_completions"  # (inputs) -> the batch dict; reads the IS flag
GRPO_COMPUTE_LOSS = "_compute_loss"  # (model, inputs) -> loss; reads inputs["importance_sampling_ratio"]
GRPO_METRICS = "_metrics"  # {"train"|"eval": {name: [values]}}, averaged by GRPOTrainer.log
GRPO_ENTROPY_BONUS = "_entropy_bonus_enabled"  # bool: the loss has an entropy term (entropy_coef != 0 or adaptive)
GRPO_LAST_LOADED_STEP = (
    "_last_loaded_step"  # set by GRPOTrainer's vLLM init, which we skip (workbench.train.trl_trainer)
)
# trl.experimental.async_grpo.openenv_harness._HarnessRolloutLoop: what its spawned worker runs per rollout
ASYNC_RUN_SESSION = "_run_session"  # (prompt, group_id=) -> (result, metrics)


def trl_lossless_rows(trace: Any, fork_threshold: int = 0) -> list[Any]:
    """TRL's training rows for an OpenEnv `TrainingTrace`, made as its AsyncGRPO loop-owning worker makes them with
    ``lossless_capture`` (trl 1.16.0 private helpers: ``openenv_harness._turns_from_training_trace``, then
    ``async_rollout_worker._chain_to_sequences``). Each row: ``input_ids``, ``completion_mask``, ``old_log_probs``.
    `fork_threshold` 0: fork wherever a prompt stops extending the row, as `workbench.turns.rows` does."""
    with warnings.catch_warnings():  # TRLExperimentalWarning: trl.experimental is what these names are
        warnings.simplefilter("ignore")
        from trl.experimental.async_grpo.async_rollout_worker import _chain_to_sequences
        from trl.experimental.async_grpo.openenv_harness import _turns_from_training_trace

    rows, _ = _chain_to_sequences(_turns_from_training_trace(trace), "workbench", fork_threshold)
    return list(rows)


# OpenEnv 0.10.0's capture helpers the streaming relay reuses (workbench.capture.stream), by module:
OPENENV_PRIVATE: dict[str, tuple[str, str]] = {
    "budget_stop_response": ("openenv.core.harness.capture.server", "_budget_stop_response"),
    "system_digest": ("openenv.core.harness.capture.server", "_system_digest"),
    "retry_after_seconds": ("openenv.core.harness.capture.upstream", "_retry_after_seconds"),
}

# openenv.core.harness.capture.upstream.InferenceClient (0.10.0): the method every engine POST goes through
# (workbench.capture.openenv overrides it to count a non-JSON reply as an upstream error), and its retry policy,
# kept as private class attributes, which the streamed relay (workbench.capture.upstream) follows too.
# openenv.core.harness.capture.server.UpstreamPool (0.10.0): its per-engine cache, {Upstream.cache_key: (client,
# level)}, where workbench.capture.openenv enters each replica's checked client (no probe, our client).
OPENENV_POOL_ENGINES = "_by_engine"
OPENENV_CLIENT_POST = "_post_with_retries"  # async (self, path, body, *, headers=None) -> the reply's JSON
_CLIENT_POLICY = {
    "max_attempts": "_MAX_ATTEMPTS",
    "retry_statuses": "_RETRY_STATUSES",
    "backoff_s": "_BACKOFF_S",
    "max_retry_after_s": "_MAX_RETRY_AFTER_S",
    "connect_timeout_s": "_CONNECT_TIMEOUT_S",
    "liveness_timeout_s": "_LIVENESS_TIMEOUT_S",
}


# uvicorn 0.54.0 (requirements/main.lock) has no deadline for a request still arriving: workbench.capture.guard
# subclasses uvicorn.protocols.http.httptools_impl.HttpToolsProtocol and extends these methods, each calling
# uvicorn's first: asyncio's connection callbacks, httptools' parser callbacks, and uvicorn's own
# `on_response_complete` (what each request's RequestResponseCycle calls once its answer is sent).
UVICORN_VERSION = "0.54.0"
UVICORN_PROTOCOL_HOOKS: dict[str, tuple[str, ...]] = {  # method -> its parameters
    "connection_made": ("self", "transport"),
    "connection_lost": ("self", "exc"),
    "on_message_begin": ("self",),
    "on_headers_complete": ("self",),
    "on_message_complete": ("self",),
    "on_response_complete": ("self",),
}


def check_uvicorn(installed: Callable[[str], str] = importlib.metadata.version) -> None:
    """RuntimeError unless the installed uvicorn is the pinned one (workbench.capture.guard extends its protocol)."""
    have = installed("uvicorn")
    if have != UVICORN_VERSION:
        raise RuntimeError(
            f"workbench.capture.guard extends uvicorn {UVICORN_VERSION}'s HttpToolsProtocol (workbench/_compat.py); "
            f"{have} is installed: pip install uvicorn=={UVICORN_VERSION}"
        )


@dataclass(frozen=True)
class ClientPolicy:
    """OpenEnv's engine-client policy: attempts, which statuses are retried, the backoff and its cap, timeouts."""

    max_attempts: int
    retry_statuses: frozenset[int]
    backoff_s: float
    max_retry_after_s: float
    connect_timeout_s: float
    liveness_timeout_s: float


def client_policy(client_cls: type) -> ClientPolicy:
    """`ClientPolicy` read from OpenEnv's InferenceClient class (passed in: this module imports no OpenEnv)."""
    values = {ours: getattr(client_cls, theirs) for ours, theirs in _CLIENT_POLICY.items()}
    values["retry_statuses"] = frozenset(values["retry_statuses"])
    return ClientPolicy(**values)


def check_versions(installed: Callable[[str], str] = importlib.metadata.version) -> None:
    """RuntimeError naming the package when the installed TRL or OpenEnv is not the pinned version."""
    for dist, pinned in (("trl", TRL_VERSION), ("openenv", OPENENV_VERSION)):
        have = installed(dist)
        if have != pinned:
            raise RuntimeError(
                f"workbench uses private names of {dist} {pinned} (workbench/_compat.py); "
                f"{have} is installed: pip install {dist}=={pinned}"
            )


check_versions()


def trl_use_triton(device: Any) -> bool:
    """trl.trainer.utils._use_triton: whether TRL's fused LM head takes its compact path (labelled
    positions only) on `device`."""
    import trl.trainer.utils as trl_utils

    return bool(trl_utils._use_triton(device))


def patch_trl_use_triton(decide: Callable[[Any, Callable[[Any], bool]], bool]) -> None:
    """Replace trl.trainer.utils._use_triton by ``decide(device, original)``."""
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: decide(device, original)


# What GRPOTrainer logs for every row whose rewards are all None (a decoded completion included), and
# transformers 5.24's FutureWarnings for the `gradient_checkpointing` names: `quiet_known_noise` says why.
GRPO_LOGGER = "trl.trainer.grpo_trainer"
REWARD_NONE = ("All reward functions returned None", "Please ensure that at least one reward function returns")
CHECKPOINTING_DEPRECATED = r"`(is_)?gradient_checkpointing(_kwargs)?` is deprecated and will be removed in v6"


class _DropRewardNone(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not all(part in message for part in REWARD_NONE)


def quiet_known_noise() -> None:
    """Silence exactly two things the pinned versions repeat at every training step about what workbench does
    on purpose; everything else TRL logs and transformers warns still shows. Idempotent.

    - TRL's "All reward functions returned None for the following kwargs: ... Please ensure ..." (with the
      row's decoded completion): GRPOTrainer logs it for each row whose reward is None, and ours are None on
      purpose (padding rows, and rollouts unscored through no fault of the agent's: `workbench.train.grpo`).
    - transformers' FutureWarnings that `gradient_checkpointing` (and ``_kwargs``, and the model's
      `is_gradient_checkpointing`, which PEFT reads) are deprecated: `workbench.train.trl_trainer` passes the old
      name on purpose (the GPU host's transformers 5.17 has no new one).
    """
    warnings.filterwarnings("ignore", message=CHECKPOINTING_DEPRECATED, category=FutureWarning)
    logger = logging.getLogger(GRPO_LOGGER)
    if not any(isinstance(f, _DropRewardNone) for f in logger.filters):
        logger.addFilter(_DropRewardNone())


def __getattr__(name: str) -> Any:
    """OpenEnv's private helpers by our name (`OPENENV_PRIVATE`), imported on first use."""
    if name not in OPENENV_PRIVATE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, attr = OPENENV_PRIVATE[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value

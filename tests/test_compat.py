"""workbench._compat: every private TRL/OpenEnv name we use exists, with the shape we use, in the pinned versions.

An upgrade of TRL or OpenEnv fails here, naming what moved, instead of deep inside a training step or a relay."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from workbench import _compat


def test_the_installed_versions_are_the_pinned_ones_and_others_are_refused():
    _compat.check_versions()
    with pytest.raises(RuntimeError, match=r"trl 1\.16\.0 .* 1\.17\.0 is installed: pip install trl==1\.16\.0"):
        _compat.check_versions(lambda dist: "1.17.0" if dist == "trl" else _compat.OPENENV_VERSION)


def test_grpo_trainer_has_the_methods_group_step_replaces_with_their_signatures():
    from trl import GRPOTrainer

    params = {
        name: list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
        for name in (_compat.GRPO_GET_LOGPS, _compat.GRPO_GENERATE, _compat.GRPO_COMPUTE_LOSS)
    }
    assert params[_compat.GRPO_GET_LOGPS][:7] == [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
    ]
    assert params[_compat.GRPO_GENERATE] == ["self", "inputs"]
    assert params[_compat.GRPO_COMPUTE_LOSS][:3] == ["self", "model", "inputs"]
    init = inspect.getsource(GRPOTrainer.__init__)
    assert f"self.{_compat.GRPO_METRICS} = " in init and f"self.{_compat.GRPO_LAST_LOADED_STEP} = " in init
    assert f"self.{_compat.GRPO_ENTROPY_BONUS} = self.entropy_coef != 0.0 or " in init


def test_trl_use_triton_and_its_patch():
    import torch
    import trl.trainer.utils as trl_utils

    before = trl_utils._use_triton
    try:
        _compat.patch_trl_use_triton(lambda device, original: device.type == "meta" or original(device))
        assert _compat.trl_use_triton(torch.device("meta")) is True
        assert _compat.trl_use_triton(torch.device("cpu")) == bool(before(torch.device("cpu")))
    finally:
        trl_utils._use_triton = before


def test_async_rollout_loop_runs_sessions_by_the_name_we_call():
    from trl.experimental.async_grpo.openenv_harness import _HarnessRolloutLoop

    params = list(inspect.signature(getattr(_HarnessRolloutLoop, _compat.ASYNC_RUN_SESSION)).parameters)
    assert params[:2] == ["self", "prompt"] and "group_id" in params


def test_openenv_private_helpers_resolve_lazily_and_unknown_names_fail():
    for name in _compat.OPENENV_PRIVATE:
        assert callable(getattr(_compat, name)), name
    assert _compat.system_digest([{"role": "system", "content": "x"}]) == _compat.system_digest(
        [{"role": "system", "content": "x"}]
    )
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _compat.nothing  # noqa: B018


def test_openenv_inference_client_policy_and_post_seam():
    import inspect

    from openenv.core.harness.capture.upstream import InferenceClient

    from workbench.capture.openenv import _CheckedClient

    policy = _compat.client_policy(InferenceClient)
    assert policy.max_attempts >= 1 and 503 in policy.retry_statuses and policy.backoff_s > 0
    assert policy.connect_timeout_s > 0 and policy.liveness_timeout_s > 0 and policy.max_retry_after_s > 0
    theirs = getattr(InferenceClient, _compat.OPENENV_CLIENT_POST)
    assert list(inspect.signature(theirs).parameters) == ["self", "path", "body", "headers"]
    assert getattr(_CheckedClient, _compat.OPENENV_CLIENT_POST) is _CheckedClient.checked_post


def test_openenvs_pool_keeps_engines_where_a_replicas_checked_client_is_entered():
    import asyncio

    from openenv.core.harness.capture.server import UpstreamPool
    from openenv.core.harness.capture.sessions import Upstream as SessionEngine

    from workbench.capture.openenv import Upstream, _CheckedClient, _Replicas

    default = _CheckedClient(base_url="http://127.0.0.1:9", served_model="m", capture_level="tokens")
    pool = UpstreamPool(default_client=default, default_level="tokens")
    assert getattr(pool, _compat.OPENENV_POOL_ENGINES) == {}
    replicas = _Replicas(pool, [Upstream("http://127.0.0.1:9"), Upstream("http://127.0.0.1:10")], "m")
    session = SimpleNamespace(session_id="s1", upstream=None, capture_level=None, findings=[], metadata={})  # OpenEnv's
    replicas.pin(session)  # type: ignore[arg-type]
    pinned = session.upstream
    assert isinstance(pinned, SessionEngine) and session.capture_level == "tokens" and session.metadata["engine"] == 0
    # the pool answers a pinned session from the entry, without probing (nothing listens on those ports)
    client, level = asyncio.run(pool.resolve(pinned))
    assert client is replicas.client_of("s1") and level == "tokens" and isinstance(client, _CheckedClient)


def test_quiet_known_noise_drops_exactly_trls_none_reward_line_and_the_checkpointing_warnings(caplog, tmp_path):
    import logging
    import warnings

    from transformers import TrainingArguments
    from trl.trainer import grpo_trainer

    assert grpo_trainer.logger.logger is logging.getLogger(_compat.GRPO_LOGGER)  # the logger TRL really uses
    logger = logging.getLogger(_compat.GRPO_LOGGER)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _compat.quiet_known_noise()
        before = len(logger.filters)
        _compat.quiet_known_noise()
        assert len(logger.filters) == before  # idempotent: one filter, however often a notebook builds a trainer
        TrainingArguments(output_dir=str(tmp_path), gradient_checkpointing=True, report_to="none")
        warnings.warn(
            "`gradient_checkpointing` is deprecated and will be removed in v6.", DeprecationWarning, stacklevel=1
        )
        warnings.warn("`use_cache` is deprecated and will be removed in v6.", FutureWarning, stacklevel=1)
    assert [(w.category, str(w.message)) for w in seen] == [
        (DeprecationWarning, "`gradient_checkpointing` is deprecated and will be removed in v6."),
        (FutureWarning, "`use_cache` is deprecated and will be removed in v6."),
    ]
    with caplog.at_level(logging.WARNING, logger=_compat.GRPO_LOGGER):
        logger.warning(
            "[RANK 0] All reward functions returned None for the following kwargs:\n{'completion': 'x'}\n"
            "Please ensure that at least one reward function returns a valid reward."
        )
        logger.warning("All reward functions returned None, and something else")
    assert [r.getMessage() for r in caplog.records] == ["All reward functions returned None, and something else"]


def test_uvicorns_protocol_has_the_hooks_the_capture_guard_extends():
    """workbench.capture.guard subclasses uvicorn's httptools protocol: each method it extends exists with the
    parameters it overrides, the answer's end reaches `on_response_complete` through `self` (so the override is
    the one called), and another uvicorn is refused by name."""
    from uvicorn.protocols.http import httptools_impl

    protocol = httptools_impl.HttpToolsProtocol
    for name, params in _compat.UVICORN_PROTOCOL_HOOKS.items():
        assert tuple(inspect.signature(getattr(protocol, name)).parameters) == params, name
    assert "on_response=self.on_response_complete," in inspect.getsource(protocol.on_headers_complete)
    assert "self.on_response()" in inspect.getsource(httptools_impl.RequestResponseCycle.send)
    _compat.check_uvicorn()
    with pytest.raises(RuntimeError, match=r"uvicorn 0\.54\.0's HttpToolsProtocol .* 0\.55\.0 is installed"):
        _compat.check_uvicorn(lambda dist: "0.55.0")

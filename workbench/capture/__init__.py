"""Capture: the proxy between the harness and the engine that records every model call's exact tokens (notebook 02).

    from workbench.capture import CaptureProxy
    with CaptureProxy(engine.url, engine.served_name, upstream_api_key=engine.api_key) as proxy:
        client = proxy.client()                 # the trainer's side: sessions, keys, the calls recorded

Each call is relayed as the harness sent it and recorded with the token ids and logprobs the engine produced
(OpenEnv's capture app underneath). Private modules: ``proxy`` (`CaptureProxy`), ``client`` (`ProxyClient`,
light: no OpenEnv), ``gate`` (what a request may carry), ``record``, ``openenv``, ``stream``, ``upstream``,
``relay``, ``ingest``, ``sse``, ``guard`` (slow clients), ``watch`` (replicas drained). docs/sandboxes.md says
what the proxy refuses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.capture.client import REPLICA_DRAINED, ProxyClient, ProxyError
    from workbench.capture.guard import ConnectionLimits
    from workbench.capture.proxy import CaptureProxy

"""The streamed relay's connection to the engine: one pooled aiohttp session, with OpenEnv's client policy.

OpenEnv's `InferenceClient` (httpx) asks the engine for whole answers; the relay (`workbench.capture.stream`)
needs the engine's stream as it arrives. `StreamingUpstream.open` posts a prepared chat completion and
returns the engine's 2xx streaming response after the same policy OpenEnv's client applies: its auth header,
connect and liveness timeouts, transient statuses retried with backoff (``Retry-After`` honoured), a 400
naming a parameter fixed, remembered on the client (``param_fixes``) and retried. Failures come out as
OpenEnv's `UpstreamError`s with OpenEnv's wording, so the relay answers and counts them as OpenEnv would.

    upstream = StreamingUpstream()
    response = await upstream.open(client, body)        # client: the app's InferenceClient
    ...                                                  # read response.content; on [DONE]:
    upstream.release_later(response)                     # the rest read behind the reply, connection kept
    upstream.close()                                     # from another thread, at shutdown

aiohttp rather than OpenEnv's httpx client: its C parser costs about half as much CPU per relayed chunk,
and it reads what has arrived in one go, so a busy proxy sends a few chunks per write instead of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
import urllib.request
from collections.abc import Awaitable
from typing import Any, Protocol

import aiohttp
from openenv.core.harness.capture.compat import MAX_FIXES, diagnose
from openenv.core.harness.capture.upstream import (
    InferenceClient,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamTimeoutError,
    UpstreamTransportError,
    auth_headers,
)

from workbench._compat import client_policy, retry_after_seconds  # OpenEnv 0.10.0's private policy and helper
from workbench.capture import fastjson

__all__ = ["StreamingUpstream", "UPSTREAM_ERRORS", "transport_error"]

logger = logging.getLogger("workbench.capture.proxy")
POLICY = client_policy(InferenceClient)

# What a read of the engine's connection raises; `transport_error` turns them into OpenEnv's errors.
UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def transport_error(exc: BaseException) -> UpstreamError:
    """OpenEnv's wording for a failed connection (`InferenceClient._transport_error`, whose httpx says
    "peer closed connection without sending complete message body" for a body cut short)."""
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamTimeoutError(f"engine timed out: {exc!r}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return UpstreamTransportError(
            f"could not reach engine: peer closed connection without sending complete message body ({exc})"
        )
    return UpstreamTransportError(f"could not reach engine: {exc}")


class _Bypass(Protocol):
    def __call__(self, host: str, proxies: dict[str, str] | None = None) -> bool: ...


# NO_PROXY as the environment says it (urllib.request's `proxy_bypass` also asks macOS's settings);
# undocumented, so typeshed does not list it.
_proxy_bypass_environment: _Bypass = vars(urllib.request)["proxy_bypass_environment"]


def _env_proxy(url: str) -> str | None:
    """The proxy that HTTP(S)_PROXY/ALL_PROXY/NO_PROXY name for `url`, read once, as OpenEnv's httpx client
    reads them (aiohttp's own ``trust_env`` re-reads them, and ~/.netrc, on every request: +0.5 ms)."""
    parts = urllib.parse.urlsplit(url)
    if _proxy_bypass_environment(parts.hostname or ""):
        return None
    proxies = urllib.request.getproxies_environment()
    return proxies.get(parts.scheme) or proxies.get("all")


async def _finish_body(response: aiohttp.ClientResponse) -> None:
    """Read what is left of a body (the end after [DONE]) and give its connection back to the pool."""

    async def drain() -> None:
        async for _ in response.content.iter_any():
            pass

    with contextlib.suppress(*UPSTREAM_ERRORS):
        await asyncio.wait_for(drain(), 5)
    response.release()


async def _http_error(response: aiohttp.ClientResponse) -> UpstreamHTTPError:
    """The engine's refusal as OpenEnv's client reports it (its body parsed when JSON); releases `response`."""
    try:
        content = await response.read()
    except UPSTREAM_ERRORS as exc:
        raise transport_error(exc) from exc
    finally:
        response.release()
    text = content.decode("utf-8", errors="replace").strip()
    body: dict[str, Any] | str | None = None
    if text:
        try:
            body = json.loads(text)
        except ValueError:
            body = text
    return UpstreamHTTPError(response.status, body)


class StreamingUpstream:
    """Pooled streaming requests to the engine, made on the serving loop (see module doc)."""

    def __init__(self) -> None:
        self._http: aiohttp.ClientSession | None = None
        self._proxy: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def _session(self, client: InferenceClient) -> aiohttp.ClientSession:
        """The pooled connection, made on first use with OpenEnv's client settings (auth header, connect
        and liveness timeouts); the engine URL's proxy is read from the environment then, once."""
        if self._http is None or self._http.closed:
            self._loop = asyncio.get_running_loop()
            self._proxy = _env_proxy(client.base_url)
            self._http = aiohttp.ClientSession(
                headers=auth_headers(client.api_key, client.auth_header),
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=POLICY.connect_timeout_s, sock_read=POLICY.liveness_timeout_s
                ),
            )
        return self._http

    async def open(
        self, client: InferenceClient, body: dict[str, Any], *, fast: bool = False
    ) -> aiohttp.ClientResponse:
        """The engine's streaming response (2xx), after OpenEnv's client policy: transient statuses
        retried with backoff, a 400 naming a parameter fixed (and remembered) and retried. `fast`: the body
        may be written with orjson (`workbench.capture.fastjson`); not once a fix from the engine's own
        error reply has edited it (a value json read, which orjson could write differently)."""
        http = self._session(client)
        url = f"{client.base_url}/chat/completions"
        while True:
            for attempt in range(1, POLICY.max_attempts + 1):
                try:
                    response = await http.post(
                        url,
                        data=fastjson.dumps(body, fast and not client.param_fixes),
                        proxy=self._proxy,
                        headers={"content-type": "application/json"},
                    )
                except UPSTREAM_ERRORS as exc:
                    raise transport_error(exc) from exc
                if response.status < 300:
                    return response
                if response.status not in POLICY.retry_statuses or attempt == POLICY.max_attempts:
                    error = await _http_error(response)
                    break
                delay = retry_after_seconds(response)
                delay = POLICY.backoff_s * 2 ** (attempt - 1) if delay is None else delay
                response.release()
                await asyncio.sleep(min(delay, POLICY.max_retry_after_s))
            logprobs_refused = (
                error.status_code == 403
                and "You are not allowed to request logprobs from this model" in str(error.body)
            )
            if (error.status_code != 400 and not logprobs_refused) or len(client.param_fixes) >= MAX_FIXES:
                raise error
            fix = diagnose(error.body)
            if fix is None or fix in client.param_fixes or not fix.apply(body):
                raise error
            client.param_fixes.append(fix)
            logger.info("upstream rejected a parameter; %s and retrying", fix)

    def release_later(self, response: aiohttp.ClientResponse) -> None:
        """Read the end of `response` in the background, then give its connection back to the pool: the
        engine ends its body right after [DONE], and a half-read response would be closed instead."""
        self._background(_finish_body(response))

    def _background(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the engine connections; from another thread, while the serving loop still runs."""
        if self._http is not None and self._loop is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._http.close(), self._loop).result(timeout_s)
        self._http = None

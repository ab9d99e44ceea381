"""The capture proxy's streaming fast path: a streamed chat completion is forwarded streamed.

OpenEnv 0.10.0's `CaptureServer` calls the engine **non-streaming** and replays the whole answer to the
harness as one SSE chunk, so the harness's time to first chunk is the whole generation (and the proxy
parses, deep-copies and re-serialises everything in one burst when the engine finishes). This module
serves the common case instead: ``POST /v1/chat/completions`` with ``stream: true`` (opencode's every
call, pi's) from a session on the proxy's default engine. It forwards the call upstream with
``stream: true`` and relays each engine chunk to the harness as it arrives, while accumulating the
prompt ids, sampled ids, logprobs and the assembled message (content, reasoning, tool-call fragments
by index) into the response OpenEnv would have received, which is ingested as one `TurnNode` exactly
as OpenEnv's ``_ingest`` does. Measured with ``benchmarks/proxy_overhead.py`` (scripted vLLM-dialect
engine, a real 30 KB opencode request; see ``benchmarks/README.md``): time to first chunk goes from
the whole generation (+626 ms for a 32-token answer) to the engine's own first chunk plus 2-3 ms, and
the added end-to-end latency from ~5 to ~2 ms. Relaying chunk by chunk costs more proxy CPU per call
at low concurrency (one write per chunk instead of one burst), about the same at 64 streams.

Equivalence with OpenEnv's path, piece by piece:

- **request**: the same dialect transformer (ours: ``seed`` dropped), the served model name, OpenEnv's
  ``normalise_for_capture`` (empty tools and their companions dropped), the session's pinned sampling
  policy, the output-token clamp, and `prepare_request`'s capture parameters (``logprobs``,
  ``top_logprobs=0``, ``return_token_ids``, truncating knobs neutralised, ``reasoning`` renamed for
  vLLM), the engine client's cached parameter fixes; only ``stream``/``stream_options`` stay as the
  harness sent them. Retries of transient statuses and parameter fixes on a 400 follow OpenEnv's client.
- **reply**: each chunk as OpenEnv's replay would have written it: the harness's own model name, the
  reasoning delta as ``reasoning_content``, the capture-only fields (``prompt_token_ids``,
  ``token_ids``, ``logprobs``) removed, usage normalised; chunks left empty by that are not sent. A
  failure before the first chunk is a JSON error with OpenEnv's status (400/413/422 kept, else 502);
  after it, an SSE error event (as OpenEnv's keep-alive path sends it). A context-length 400 ends the
  loop with OpenEnv's budget-stop answer. Idle streams get OpenEnv's keep-alive comment every 10 s.
- **capture**: the accumulated response goes through `normalize_response` (the id/logprob pairing
  check), `check_turn`, and `RolloutGraph.add_turn` with the same node fields, findings, counters and
  ``last_turn_at``. That happens right after ``[DONE]`` is handed to the harness, with no await in
  between: what the harness receives never depends on the ingest, and no other request (a trace read,
  the harness's next call) is served before the turn is recorded. A harness that goes away mid-stream
  cancels the engine request; nothing is ingested for it.

Everything else (other dialects, unstreamed calls, a session over its call budget, a per-session
engine, eval sessions, constrained decoding, anything OpenEnv would refuse) takes OpenEnv's path:
`CaptureProxy` asks `StreamingPath.prepare` first and falls back when it returns None.

    path = StreamingPath(app.state)                     # CaptureProxy(..., stream_upstream=True) does this
    prepared = path.prepare(scope, session, body)        # the body as the front door parsed it
    if prepared is not None:
        await path.serve(prepared, session, receive, send)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from openenv.core.harness.capture import sse
from openenv.core.harness.capture.compat import MAX_FIXES, diagnose
from openenv.core.harness.capture.detection import APIType
from openenv.core.harness.capture.graph import TurnNode
from openenv.core.harness.capture.server import (
    SAMPLING_KEYS,
    clamp_output_tokens,
    normalise_for_capture,
    normalise_response,
)
from openenv.core.harness.capture.sessions import Session, extract_harness_session
from openenv.core.harness.capture.upstream import (
    NON_POLICY_SAMPLING,
    InferenceClient,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamTimeoutError,
    UpstreamTransportError,
    auth_headers,
    normalize_response,
    prepare_request,
    truncating_params,
)
from openenv.core.harness.capture.validate import check_turn

from ._compat import budget_stop_response, retry_after_seconds, system_digest  # OpenEnv 0.10.0's private helpers
from .capture_sse import SSEDecoder

__all__ = ["Prepared", "StreamingPath"]

logger = logging.getLogger("workbench.capture")

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]

_PATH = "/v1/chat/completions"
# Request keys whose handling (refusal under a pinned policy, constrained logits) is OpenEnv's: a call
# carrying any of them takes OpenEnv's path, which answers it exactly as before.
_OPENENV_ONLY = ("logit_bias", "allowed_token_ids", "structured_outputs", "guided_json", "guided_regex",
                 "guided_choice", "guided_grammar", "min_tokens", "response_format")
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
                *((k.lower().encode(), v.encode()) for k, v in sse.SSE_HEADERS.items())]
_KEEPALIVE = sse.KEEPALIVE.encode()
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


@dataclass
class Prepared:
    """One call ready to forward. `chat_request` is what the node records; `body` goes upstream."""

    chat_request: dict[str, Any]
    body: dict[str, Any]
    requested_sampling: dict[str, Any]
    original: dict[str, Any]          # the harness's request (its model name is echoed in every chunk)
    client: InferenceClient


@dataclass
class _Turn:
    """What the engine streamed so far, folded into the non-streaming response OpenEnv would ingest."""

    prompt_ids: list[int] | None = None
    sampled: list[int] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tools: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    head: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any], model: str | None) -> bool:
        """Record `chunk` and rewrite it in place into what the harness gets; False when nothing is left
        to send (a token the tool parser is still buffering carries only capture fields)."""
        if "error" in chunk and not chunk.get("choices"):
            error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            code = error.get("code")
            raise UpstreamHTTPError(code if isinstance(code, int) and code >= 400 else 502, chunk)
        prompt = chunk.pop("prompt_token_ids", None)
        relay = prompt is not None
        if prompt is not None:
            self.prompt_ids = prompt
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model")}
        if model is not None:
            chunk["model"] = model
        for choice in chunk.get("choices") or ():
            ids = choice.pop("token_ids", None)
            if ids:
                self.sampled.extend(ids)
            logprobs = choice.pop("logprobs", None)
            if logprobs:
                self.entries.extend(logprobs.get("content") or ())
            delta = choice.get("delta") or {}
            if "reasoning" in delta and "reasoning_content" not in delta:
                delta["reasoning_content"] = delta.pop("reasoning")
            if delta.get("content"):
                self.content.append(delta["content"])
            if delta.get("reasoning_content"):
                self.reasoning.append(delta["reasoning_content"])
            for fragment in delta.get("tool_calls") or ():
                call = self.tools.setdefault(fragment.get("index", 0),
                                             {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = call["id"] or fragment.get("id")
                call["type"] = fragment.get("type") or call["type"]
                function = fragment.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
            relay = relay or bool(delta) or choice.get("finish_reason") is not None
        if chunk.get("usage") is not None:
            normalise_response(chunk)  # the usage detail objects OpenEnv fills in for strict harnesses
            self.usage = chunk["usage"]
            relay = True
        return relay

    def response(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) if self.content else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tools:
            message["tool_calls"] = [self.tools[i] for i in sorted(self.tools)]
        return {**self.head, "object": "chat.completion", "prompt_token_ids": self.prompt_ids,
                "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason,
                             "token_ids": self.sampled,
                             "logprobs": {"content": self.entries} if self.entries else None}],
                "usage": self.usage}


class _Reply:
    """The harness's side: SSE headers go out with the first chunk, so a failure before it can still
    be an HTTP status (as OpenEnv's path answers fast failures)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = self.finished = self.gone = False
        self.last = time.monotonic()

    async def body(self, data: bytes, *, more: bool = True) -> None:
        if not self.started:
            self.started = True
            await self.send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        self.finished = not more
        self.last = time.monotonic()
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def error(self, exc: UpstreamError) -> None:
        """OpenEnv's answer to a failed upstream call: a JSON error, or an SSE error event once started."""
        status = exc.status_code if isinstance(exc, UpstreamHTTPError) and exc.status_code in (400, 413, 422) else 502
        if self.started:
            event = json.dumps({"error": {"message": str(exc), "code": status}})
            return await self.body(f"data: {event}\n\n".encode(), more=False)
        raw = json.dumps({"error": {"message": str(exc)}}, ensure_ascii=False, separators=(",", ":")).encode()
        self.started = self.finished = True
        await self.send({"type": "http.response.start", "status": status,
                         "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
        await self.send({"type": "http.response.body", "body": raw})


async def _finish_body(response: aiohttp.ClientResponse) -> None:
    """Read what is left of a body (the end after [DONE]) and give its connection back to the pool."""
    async def drain() -> None:
        async for _ in response.content.iter_any():
            pass

    with contextlib.suppress(*_UPSTREAM_ERRORS):
        await asyncio.wait_for(drain(), 5)
    response.release()


def _env_proxy(url: str) -> str | None:
    """The proxy that HTTP(S)_PROXY/ALL_PROXY/NO_PROXY name for `url`, read once, as OpenEnv's httpx client
    reads them (aiohttp's own ``trust_env`` re-reads them, and ~/.netrc, on every request: +0.5 ms)."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass_environment(parts.hostname or ""):
        return None
    proxies = urllib.request.getproxies_environment()
    return proxies.get(parts.scheme) or proxies.get("all")


def _transport_error(exc: BaseException) -> UpstreamError:
    """OpenEnv's wording for a failed connection (`InferenceClient._transport_error`, whose httpx says
    "peer closed connection without sending complete message body" for a body cut short)."""
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamTimeoutError(f"engine timed out: {exc!r}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return UpstreamTransportError(f"could not reach engine: peer closed connection without sending complete "
                                      f"message body ({exc})")
    return UpstreamTransportError(f"could not reach engine: {exc}")


def _context_exhausted(exc: UpstreamError) -> bool:
    """OpenEnv's test for a prompt that no longer fits: the rollout's compute budget is spent."""
    if not isinstance(exc, UpstreamHTTPError) or exc.status_code != 400:
        return False
    error = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else {}
    code = error.get("code") if isinstance(error, dict) else None
    message = str(exc).lower()
    return code == "context_length_exceeded" or ("maximum context length" in message and "tokens" in message)


class StreamingPath:
    """Serves streamed chat completions of sessions on the proxy's default engine (see module doc).

    `app_state` is the OpenEnv app's state: its transforms, default engine client, served model name
    and output cap are read per call, so ``PUT /model`` applies here as on OpenEnv's path.
    """

    def __init__(self, app_state: Any) -> None:
        self.state = app_state
        self._http: aiohttp.ClientSession | None = None
        self._proxy: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()

    def _background(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    def _session(self, client: InferenceClient) -> aiohttp.ClientSession:
        """The pooled connection to the engine, made on the serving loop: OpenEnv's client settings
        (auth header, connect and liveness timeouts). aiohttp rather than OpenEnv's httpx client: its
        C parser costs about half as much CPU per relayed chunk, and it reads what has arrived in one
        go, so a busy proxy sends a few chunks per write instead of one."""
        if self._http is None or self._http.closed:
            self._loop = asyncio.get_running_loop()
            self._proxy = _env_proxy(client.base_url)
            self._http = aiohttp.ClientSession(
                headers=auth_headers(client.api_key, client.auth_header), connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, connect=InferenceClient._CONNECT_TIMEOUT_S,
                                              sock_read=InferenceClient._LIVENESS_TIMEOUT_S))
        return self._http

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the engine connections; from another thread, while the serving loop still runs."""
        if self._http is not None and self._loop is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._http.close(), self._loop).result(timeout_s)
        self._http = None

    # -- deciding ----------------------------------------------------------------------------------

    def prepare(self, scope: dict[str, Any], session: Session, original: dict[str, Any]) -> Prepared | None:
        """The call as it will be forwarded, or None when OpenEnv's path should serve it. `original`
        is the parsed body the front door checked ({} when the client left during it).

        Pure: nothing is counted or recorded here, so falling back leaves OpenEnv's path exactly as
        it would have been."""
        if scope["path"] != _PATH or session.upstream is not None or session.eval_sampling or session.over_budget:
            return None
        if original.get("stream") is not True:
            return None
        client, level = self.state.upstreams.default
        if client is None or level != "tokens" or client.provider not in ("openai", "vllm"):
            return None
        if any(original.get(key) for key in _OPENENV_ONLY) or original.get("tool_choice") not in (None, "auto", "none"):
            return None
        n = original.get("n", 1)
        if n != 1 or isinstance(n, bool):
            return None
        cap = session.metadata.get("max_output_tokens")
        if cap is not None and (type(cap) is not int or cap < 1):
            return None
        # OpenEnv's route, step by step (server.py `proxy`): served name before the transformer, the
        # transformer, the capture normalisation, the session policy, the output clamp.
        served = self.state.model or ""
        incoming = dict(original)
        if served:
            incoming["_served_model"] = served
        try:
            chat_request = self.state.transforms.get(APIType.OPENAI_CHAT).transform_request(incoming)
        except UpstreamError:
            return None
        if served:
            chat_request["model"] = served
        stream_options = chat_request.get("stream_options")
        normalise_for_capture(chat_request)
        requested_sampling = {key: chat_request[key] for key in SAMPLING_KEYS if key in chat_request}
        if session.sampling:
            chat_request.update(session.sampling)
        if self.state.max_output_tokens:
            cap = min(cap, self.state.max_output_tokens) if cap else self.state.max_output_tokens
        clamp_output_tokens(chat_request, cap)
        body = prepare_request(dict(chat_request), served_model=client.served_model, capture_level="tokens")
        body["stream"] = True
        if stream_options is not None:
            body["stream_options"] = stream_options
        for fix in client.param_fixes:
            fix.apply(body)
        return Prepared(chat_request, body, requested_sampling, original, client)

    # -- serving -----------------------------------------------------------------------------------

    async def serve(self, prepared: Prepared, session: Session, receive: Receive, send: Send) -> None:
        """Forward, relay, ingest. Returns when the reply is complete or the harness has gone away."""
        session.model_calls += 1  # reserved before the first await, as OpenEnv does after its checks
        while (await receive()).get("more_body", False):  # the body, already read: recorded by the caller
            pass
        reply = _Reply(send)
        # The relay runs in this task, so that the caller records the call's outcome as soon as the
        # reply is complete; the watcher cancels it when the harness goes away (closing the engine
        # request), and only that cancellation is absorbed here.
        this = asyncio.current_task()
        watch = asyncio.ensure_future(self._watch(receive, reply, this))
        try:
            await self._relay(prepared, session, reply)
        except asyncio.CancelledError:
            if not reply.gone:
                raise
            this.uncancel()
        finally:
            watch.cancel()

    async def _watch(self, receive: Receive, reply: _Reply, relay: asyncio.Task) -> None:
        """Cancels `relay` when the harness disconnects before the reply is complete; meanwhile keeps
        an idle reply alive (OpenEnv's comment every 10 s, which also commits the SSE headers of a call
        the engine is slow to answer)."""
        pending = asyncio.ensure_future(receive())
        try:
            while True:
                idle = time.monotonic() - reply.last
                done, _ = await asyncio.wait({pending}, timeout=max(0.0, sse.KEEPALIVE_INTERVAL_S - idle))
                if done:
                    if pending.result()["type"] == "http.disconnect":
                        if not reply.finished:
                            reply.gone = True
                            relay.cancel()
                        return
                    pending = asyncio.ensure_future(receive())
                elif not reply.finished and time.monotonic() - reply.last >= sse.KEEPALIVE_INTERVAL_S:
                    await reply.body(_KEEPALIVE)
        finally:
            pending.cancel()

    async def _relay(self, prepared: Prepared, session: Session, reply: _Reply) -> None:
        try:
            response = await self._open(prepared.client, prepared.body)
        except UpstreamError as exc:
            return await self._failed(exc, prepared, session, reply)
        handed_off = False
        try:
            effective = {key: prepared.body[key] for key in ("temperature", *NON_POLICY_SAMPLING) if key in prepared.body}
            if session.sampling and any(effective.get(k) != v for k, v in session.sampling.items()):
                session.findings.append(
                    "[FATAL] sampling_policy_changed: upstream did not preserve the session training policy")
                session.upstream_errors += 1
                return await reply.error(UpstreamTransportError(
                    "upstream did not preserve the session training sampling policy"))
            for key in SAMPLING_KEYS:
                prepared.chat_request.pop(key, None)
            prepared.chat_request.update(effective)
            if response.content_type == "text/event-stream":
                handed_off = await self._stream(response, prepared, session, reply)
            else:
                await self._whole(response, prepared, session, reply)
        except UpstreamError as exc:
            await self._failed(exc, prepared, session, reply)
        finally:
            # Back to the pool when the body was read to its end; closed otherwise, which is also
            # how a harness that left stops the engine generating for it.
            if not handed_off:
                response.release()

    async def _open(self, client: InferenceClient, body: dict[str, Any]) -> aiohttp.ClientResponse:
        """The engine's streaming response (2xx), after OpenEnv's client policy: transient statuses
        retried with backoff, a 400 naming a parameter fixed (and remembered) and retried."""
        http = self._session(client)
        url = f"{client.base_url}/chat/completions"
        while True:
            for attempt in range(1, InferenceClient._MAX_ATTEMPTS + 1):
                try:
                    response = await http.post(url, data=json.dumps(body).encode(), proxy=self._proxy,
                                               headers={"content-type": "application/json"})
                except _UPSTREAM_ERRORS as exc:
                    raise _transport_error(exc) from exc
                if response.status < 300:
                    return response
                if response.status not in InferenceClient._RETRY_STATUSES or attempt == InferenceClient._MAX_ATTEMPTS:
                    error = await self._http_error(response)
                    break
                delay = retry_after_seconds(response)
                delay = InferenceClient._BACKOFF_S * 2 ** (attempt - 1) if delay is None else delay
                response.release()
                await asyncio.sleep(min(delay, InferenceClient._MAX_RETRY_AFTER_S))
            logprobs_refused = error.status_code == 403 and \
                "You are not allowed to request logprobs from this model" in str(error.body)
            if (error.status_code != 400 and not logprobs_refused) or len(client.param_fixes) >= MAX_FIXES:
                raise error
            fix = diagnose(error.body)
            if fix is None or fix in client.param_fixes or not fix.apply(body):
                raise error
            client.param_fixes.append(fix)
            logger.info("upstream rejected a parameter; %s and retrying", fix)

    @staticmethod
    async def _http_error(response: aiohttp.ClientResponse) -> UpstreamHTTPError:
        try:
            content = await response.read()
        except _UPSTREAM_ERRORS as exc:
            raise _transport_error(exc) from exc
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

    async def _stream(self, response: aiohttp.ClientResponse, prepared: Prepared, session: Session,
                      reply: _Reply) -> bool:
        """Relay the engine's SSE events as they arrive (a network read's worth per send), accumulating.
        True when the response was handed to a background task (which releases it)."""
        turn = _Turn()
        model = prepared.original.get("model") if "model" in prepared.original else None
        decoder = SSEDecoder()
        received = response.content.iter_any()
        try:
            async for data in received:
                out: list[bytes] = []
                for event in decoder.feed(data):  # comments (keep-alives) are not events
                    payload = event.data.strip()
                    if not payload:  # an empty event
                        continue
                    if payload == b"[DONE]":
                        if out:
                            await reply.body(b"".join(out))
                        await self._done(turn, prepared, session, reply)
                        # The engine ends its body right after [DONE]. Reading that end keeps the
                        # connection for the next call (a half-read response is closed instead); it
                        # is read behind the reply, so the call is recorded the moment [DONE] is out.
                        if not response.content.at_eof():
                            self._background(_finish_body(response))
                            return True
                        return False
                    try:
                        chunk = json.loads(payload)
                    except ValueError as exc:
                        raise UpstreamTransportError(f"the engine's reply is not JSON ({exc})") from exc
                    if not isinstance(chunk, dict):
                        raise UpstreamTransportError(f"the engine's reply is JSON but not an object ({type(chunk).__name__})")
                    if turn.feed(chunk, model):
                        out.append(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
                if out:
                    await reply.body(b"".join(out))
        except _UPSTREAM_ERRORS as exc:
            raise _transport_error(exc) from exc
        raise UpstreamTransportError("could not reach engine: the engine's stream ended before [DONE]")

    async def _whole(self, response: aiohttp.ClientResponse, prepared: Prepared, session: Session,
                     reply: _Reply) -> None:
        """An engine that answered the streamed request with one JSON body: replayed as OpenEnv does."""
        try:
            payload = json.loads(await response.read())
        except _UPSTREAM_ERRORS as exc:
            raise _transport_error(exc) from exc
        except ValueError as exc:
            raise UpstreamTransportError(f"the engine's reply is not JSON ({exc})") from exc
        if not isinstance(payload, dict):
            raise UpstreamTransportError(f"the engine's reply is JSON but not an object ({type(payload).__name__})")
        response = normalize_response(payload)
        normalise_response(response)
        _ingest(session, prepared.chat_request, response, prepared.requested_sampling)
        transformer = self.state.transforms.get(APIType.OPENAI_CHAT)
        async for piece in sse.replay(APIType.OPENAI_CHAT, transformer, response, prepared.original):
            await reply.body(piece.encode())
        await reply.body(b"", more=False)

    @staticmethod
    async def _done(turn: _Turn, prepared: Prepared, session: Session, reply: _Reply) -> None:
        """The stream is complete: [DONE] to the harness, then the turn is ingested. Nothing the harness
        receives depends on the ingest (OpenEnv replays whatever it ingested), and nothing else runs on
        the proxy's loop in between (no await), so every reader of the proxy finds the turn recorded as
        soon as the call is; the harness just gets its last byte ~1 ms sooner."""
        await reply.body(b"data: [DONE]\n\n", more=False)
        response = normalize_response(turn.response())  # the id/logprob pairing check, as OpenEnv's client
        normalise_response(response)
        _ingest(session, prepared.chat_request, response, prepared.requested_sampling)

    async def _failed(self, exc: UpstreamError, prepared: Prepared, session: Session, reply: _Reply) -> None:
        """OpenEnv's handling of a failed call: a context-length 400 ends the agent's loop with the budget
        stop (never ingested); anything else is counted and answered as an error."""
        if _context_exhausted(exc):
            session.findings.append("[WARN] context_budget_exhausted: " + str(exc))
            session.budget_stop_count += 1
            stop = budget_stop_response(self.state.model)
            transformer = self.state.transforms.get(APIType.OPENAI_CHAT)
            async for piece in sse.replay(APIType.OPENAI_CHAT, transformer, stop, prepared.original):
                await reply.body(piece.encode())
            return await reply.body(b"", more=False)
        session.upstream_errors += 1
        logger.warning("upstream error [%s]: %s", session.session_id, exc)
        await reply.error(exc)


def _ingest(session: Session, chat_request: dict[str, Any], response: dict[str, Any],
            requested_sampling: dict[str, Any]) -> None:
    """OpenEnv's ``_ingest`` (server.py, the ``tokens`` level) for one accumulated response: a copy,
    since OpenEnv's is a closure inside `create_app` that nothing outside can call. Never raises: a
    capture problem degrades one turn, not the rollout or the server."""
    try:
        choices = response.get("choices") or []
        if not choices:  # a 200 with no choices is not a turn
            logger.warning("[%s] upstream returned 200 with no choices; not recording a turn", session.session_id)
            session.upstream_errors += 1
            return
        choice = choices[0] or {}
        logprob_entries = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [e.get("logprob") for e in logprob_entries] or None
        if logprobs is not None and any(lp is None for lp in logprobs):
            logger.warning("[%s] %d of %d logprobs are null; treating the turn as untrainable",
                           session.session_id, sum(1 for lp in logprobs if lp is None), len(logprobs))
            logprobs = None
        sampled_ids = choice.get("token_ids") or []
        prompt_ids = response.get("prompt_token_ids") or []
        index = session.graph.stats()["n_turns"]
        report = check_turn(prompt_ids, sampled_ids, logprobs, finish_reason=choice.get("finish_reason"), index=index)
        session.findings.extend(str(f) for f in report.findings)
        if not report.ok:
            logger.warning("[%s] turn %d rejected: %s", session.session_id, index,
                           "; ".join(str(f) for f in report.fatal))
            logprobs = None
        overridden = truncating_params(requested_sampling or chat_request)
        if overridden and not session.metadata.get("sampling_overridden"):
            session.metadata["sampling_overridden"] = overridden
            session.findings.append(
                "WARN sampling_neutralised: the harness asked for "
                + ", ".join(f"{k}={v}" for k, v in sorted(overridden.items()))
                + "; these were sent upstream at their no-op values because a processed "
                "logprob is taken after they are applied, which would bias a full-vocab "
                "recompute. requested_sampling_params preserves the harness request; "
                "sampling_params records the submitted policy.")
        session.graph.add_turn(TurnNode(
            node_id=uuid.uuid4().hex[:12],
            prompt_ids=list(prompt_ids),
            sampled_ids=list(sampled_ids),
            sampled_logprobs=list(logprobs) if logprobs else None,
            model=chat_request.get("model"),
            finish_reason=choice.get("finish_reason"),
            harness_session_id=extract_harness_session({}, chat_request),
            system_digest=system_digest(chat_request.get("messages") or []),
            n_tools=len(chat_request.get("tools") or []),
            request_messages=chat_request.get("messages") or [],
            request_tools=chat_request.get("tools"),
            sampling_params={key: chat_request[key] for key in SAMPLING_KEYS if chat_request.get(key) is not None},
            requested_sampling_params=requested_sampling or {},
            response_message=choice.get("message") or {},
        ))
        session.last_turn_at = time.time()
        session.metadata.setdefault("api_type", APIType.OPENAI_CHAT.value)
    except Exception:  # as OpenEnv: one turn lost, never the server
        session.findings.append("[FATAL] capture_ingest_failed: an upstream response could not be recorded")
        logger.exception("[%s] ingest failed; turn dropped", session.session_id)

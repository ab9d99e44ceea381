"""The capture proxy's call log: every model call of a session, in order, with its purpose and outcome.

OpenEnv's ``/trace_entries`` lists agent turns only, and a call that failed leaves no node at all; the
proxy (`workbench.capture.proxy.CaptureProxy`) keeps its own record of every call here:

- `CallRecord`: one call as the proxy saw it (OpenEnv's `TurnNode` attached when it produced a turn);
  `CallRecord.to_json` is its trace.json record.
- `CallLog`: the records by session, and their purpose tags (the proxy's classifier, asked with the
  request's system prompt, tools and last user message, and the session's calls tagged so far).
- `CallRecorder`: one call served, recorded from the ASGI messages that pass through it (status,
  error body, a client that left), its outcome settled when the reply is complete.

    log = CallLog(classify, lambda sid: registry.get(sid))
    log.open(session_id)
    call = log.new_call(session_id, harness_session=None)
    recorder = CallRecorder(log, call, session, receive, send)
    with recorder.serving():                             # current_call is `call` meanwhile
        await app(scope, recorder.receive, recorder.send)
    log.trace(session_id)                                # [call.to_json(), ...]
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from openenv.core.harness.capture.detection import APIType
from openenv.core.harness.capture.dialects import TransformManager
from openenv.core.harness.capture.graph import TurnNode
from openenv.core.harness.capture.sessions import Session
from openenv.core.harness.capture.upstream import UpstreamRequestError
from starlette.types import Message, Receive, Send

from workbench.capture import fastjson
from workbench.capture.fidelity import fidelity
from workbench.harnesses import CallInfo, Classifier, Dialect, Purpose

__all__ = ["CallRecord", "CallLog", "CallRecorder", "current_call", "ENGINE_KEY"]

# Where a session pinned to one of several engines keeps that engine's index (`Session.metadata`; the order the
# engines were named in); each call's record copies it (trace.json's ``engine``), moved sessions included.
ENGINE_KEY = "engine"


@dataclass
class CallRecord:
    """One model call as the proxy saw it. `node` is OpenEnv's record when the call produced a turn."""

    index: int
    session_id: str
    t_start: float
    harness_session: str | None
    dialect: Dialect = "chat"  # the wire dialect the harness spoke (the engine is always called in chat)
    purpose: Purpose = "other"
    system_digest: str | None = None
    classified: bool = False
    node: TurnNode | None = None
    http_status: int | None = None
    error: str | None = None
    status: str = "pending"  # ok | upstream_error | rejected | budget_stop | client_disconnected
    # The engine's HTTP status when it refused the call (None: it answered, or failed with none: a lost
    # connection, a cut stream, a reply that is not JSON). A 4xx about the request is the agent's doing
    # (`workbench.rollout.types.refused_for_the_agents_output`): the rollout is scored, not left out.
    upstream_status: int | None = None
    t_end: float | None = None
    clamped_max_tokens: int | None = None  # the output cap its purpose set (capture.BOOKKEEPING_MAX_TOKENS)
    request_body: bytearray = field(default_factory=bytearray, repr=False)  # kept only until classified
    # every block of the raw request found in what was forwarded (`workbench.capture.fidelity`), for answered calls
    fidelity: dict[str, Any] | None = None
    engine: int | None = None  # which of several engines the call went to (None: the proxy has one)

    def to_json(self) -> dict[str, Any]:
        """The trace.json record: the seed's per-call fields plus purpose/status."""
        n = self.node
        record: dict[str, Any] = {
            "turn": self.index,
            "dialect": self.dialect,
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
        if self.upstream_status is not None:
            record["upstream_status"] = self.upstream_status
        if self.engine is not None:
            record["engine"] = self.engine
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
        if self.fidelity is not None:
            record["fidelity"] = self.fidelity
        return record


def request_fidelity(call: CallRecord, forwarded: list[dict[str, Any]]) -> dict[str, Any] | None:
    """`workbench.capture.fidelity.fidelity` of the call's raw request against the messages `forwarded` to the
    engine; None when the raw body cannot be read. The streamed relay calls it while the engine samples (the
    request is all it needs), so that it is not among the work the harness's next call waits behind; `finish`
    computes it for an answered call that has none yet, and drops it from a call that was not answered."""
    try:
        body, _ = fastjson.loads(bytes(call.request_body) or b"{}")  # json's value at orjson's speed
        return fidelity(body, call.dialect, list(forwarded)) if isinstance(body, dict) else None
    except (ValueError, RecursionError, TypeError, AttributeError, KeyError):
        return None


def _render(call: CallRecord) -> dict[str, Any]:
    """`call.to_json()`, never failing: whatever one call holds, the rest of the trace stays readable."""
    try:
        return call.to_json()
    except Exception as exc:  # noqa: BLE001 - a record we cannot render is reported, not raised
        return {
            "turn": call.index,
            "purpose": call.purpose,
            "status": "rejected",
            "http_status": call.http_status,
            "error": f"unrenderable record: {type(exc).__name__}: {exc}"[:300],
            "timestamp": call.t_start,
        }


# The call being served in this task: OpenEnv's graph adds a node without saying for which request, so
# the node is matched to its call through the context (`workbench.capture.openenv`).
current_call: contextvars.ContextVar[CallRecord | None] = contextvars.ContextVar("wb_call", default=None)


def _system_text(messages: Any) -> str:
    """The first system (or developer) message's text: what a classifier recognises a harness call by."""
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict) and m.get("role") in ("system", "developer"):
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content if isinstance(content, str) else ""
    return ""


def _last_user_text(messages: Any) -> str:
    """The last user message's text (a subagent's task, a title call's conversation)."""
    for m in reversed(messages if isinstance(messages, list) else []):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(p.get("text") or "" for p in content if isinstance(p, dict))
            return content if isinstance(content, str) else ""
    return ""


_API_TYPES: dict[Dialect, APIType] = {
    "chat": APIType.OPENAI_CHAT,
    "responses": APIType.OPENAI_RESPONSES,
    "anthropic": APIType.ANTHROPIC,
    "google": APIType.GOOGLE,
}
_TRANSFORMS = TransformManager()


def _chat_shaped(body: dict[str, Any], dialect: Dialect) -> dict[str, Any]:
    """A raw request as OpenEnv forwards it: a Responses body (codex) carries ``input`` items and
    ``instructions``, an Anthropic one a top-level ``system``, a Google one ``contents`` and a
    ``systemInstruction``, not chat messages, so a call that never produced a node would be classified
    from nothing. OpenEnv's own transformer for the dialect makes it chat-shaped, as before forwarding."""
    if dialect == "chat" or not body:
        return body
    try:
        return _TRANSFORMS.get(_API_TYPES[dialect]).transform_request(json.loads(json.dumps(body)))
    except (UpstreamRequestError, ValueError, TypeError, KeyError, AttributeError):
        return {}  # a body the transformer cannot read: OpenEnv's path answers it 400


class CallLog:
    """Every session's calls, in arrival order, and their purpose tags.

    `classify` is the proxy's classifier; `session` looks a session up by id (OpenEnv's registry), for
    the harness it was opened with. The log is shared by the serving loop and the readers (a notebook,
    the trainer), so the lists are touched under `lock`.
    """

    def __init__(self, classify: Classifier, session: Callable[[str], Session | None]) -> None:
        self.classify = classify
        self._session = session
        self.by_session: dict[str, list[CallRecord]] = {}
        self.lock = threading.Lock()

    def open(self, session_id: str) -> None:
        with self.lock:
            self.by_session.setdefault(session_id, [])

    def close(self, session_id: str) -> None:
        # The call log goes with the session (DELETE /sessions/{id}): it holds every request's messages
        # and ids, and a long training run closes thousands of sessions. Read the trace before closing.
        with self.lock:
            self.by_session.pop(session_id, None)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self.by_session

    def new_call(self, session_id: str, harness_session: str | None, **fields: Any) -> CallRecord | None:
        """A new record at the end of the session's log; None when the log is gone (the session was
        closed while this request was arriving)."""
        with self.lock:
            calls = self.by_session.get(session_id)
            if calls is None:
                return None
            call = CallRecord(
                index=len(calls), session_id=session_id, t_start=time.time(), harness_session=harness_session, **fields
            )
            calls.append(call)
        return call

    def tag(self, call: CallRecord, system: str, has_tools: bool, last_user: str = "") -> None:
        """Set `call.purpose` from the classifier (once per call is the rule, the last answer stands)."""
        session = self._session(call.session_id)
        harness = (session.metadata if session else {}).get("harness")
        # Calls are tagged when their reply lands, so "prior" means tagged already (arrival order
        # among those): the first tool-enabled call of a session anchors its main agent.
        with self.lock:
            prior = [
                CallInfo(c.purpose, c.harness_session, c.system_digest)
                for c in self.by_session.get(call.session_id, [])
                if c.classified and c is not call
            ]
        call.system_digest = hashlib.sha256(system.encode()).hexdigest()[:16]
        info = CallInfo(
            purpose="", harness_session=call.harness_session, system_digest=call.system_digest, last_user=last_user
        )
        call.purpose = self.classify(
            str(harness) if harness else None, system=system, has_tools=has_tools, call=info, prior=prior
        )
        call.classified = True

    def tag_node(self, call: CallRecord, node: TurnNode) -> None:
        """Tag `call` from the turn it produced (the request as OpenEnv forwarded it)."""
        self.tag(
            call, _system_text(node.request_messages), bool(node.request_tools), _last_user_text(node.request_messages)
        )

    def tag_body(self, call: CallRecord, body: dict[str, Any]) -> None:
        """Tag `call` from a request body as the harness sent it (any dialect OpenEnv forwards)."""
        chat = _chat_shaped(body, call.dialect)
        self.tag(
            call, _system_text(chat.get("messages")), bool(chat.get("tools")), _last_user_text(chat.get("messages"))
        )

    def tag_raw(self, call: CallRecord) -> None:
        """Tag `call` from the request bytes it kept (a call that produced no turn)."""
        try:
            body, _ = fastjson.loads(
                bytes(call.request_body) or b"{}"
            )  # json's value, orjson's speed (the next call waits)
        except (ValueError, RecursionError):
            body = {}
        self.tag_body(call, body if isinstance(body, dict) else {})

    def trace(self, session_id: str) -> list[dict[str, Any]]:
        """The session's calls as trace.json records (empty for an unknown session)."""
        with self.lock:
            calls = list(self.by_session.get(session_id, []))
        for c in calls:
            if not c.classified and c.request_body:  # still in flight: tag it from its request
                self.tag_raw(c)
        return [_render(c) for c in calls]


class CallRecorder:
    """One model call served (by OpenEnv's app or the streamed relay), recorded from the ASGI messages
    passed through `receive` and `send`; `finish` settles the call's status.

    With `finish_on_last_byte` (OpenEnv's path) the outcome is settled as the reply's last body message
    goes out: OpenEnv has ingested (or refused) before it replies, and Starlette awaits after its last
    send, so a harness (or test) reading the trace at once could otherwise find the call pending. The
    streamed relay records its turn right after its last byte with no await in between, so there the
    outcome is settled when serving returns.
    """

    def __init__(self, log: CallLog, call: CallRecord, session: Session, receive: Receive, send: Send) -> None:
        self.log, self.call, self.session = log, call, session
        self._receive, self._send = receive, send
        # The session's counters before this call: a rise means this call hit the budget or the engine.
        self.errors_before, self.stops_before = session.upstream_errors, session.budget_stop_count
        self.finish_on_last_byte = True
        self.error_body = bytearray()  # an error reply's body (its first 4000 bytes per chunk)
        self.disconnected = False  # the client went away before the reply was delivered
        self.body_done = False  # the reply's last body message went out
        self.finished = False  # the outcome is settled

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.call.request_body += message.get("body", b"")
        elif message["type"] == "http.disconnect":
            self.disconnected = self.disconnected or not self.body_done  # gone before the reply was delivered
        return message

    async def send(self, message: Message) -> None:
        call = self.call
        if message["type"] == "http.response.start":
            call.http_status = message["status"]
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            # Errors arrive as a JSON body (fast failures) or as one SSE error event after the
            # keep-alive started (slow ones). Only those bodies are kept.
            if call.http_status and call.http_status >= 400 or chunk.startswith(b'data: {"error"'):
                self.error_body.extend(chunk[:4000])
            self.body_done = not message.get("more_body", False)
            if self.body_done and self.finish_on_last_byte:
                self.finish()  # before the last byte leaves (class doc)
        await self._send(message)

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """While the call is served: it is `current_call`, an exception out of serving (the client gone,
        the task cancelled) counts as a disconnect, and the outcome is settled at the end."""
        token = current_call.set(self.call)
        try:
            yield
        except BaseException:
            self.disconnected = True
            raise
        finally:
            current_call.reset(token)
            self.finish()

    def finish(self) -> None:
        """Settle the call's status from what was seen (once; later calls do nothing)."""
        if self.finished:
            return
        call, session = self.call, self.session
        call.t_end = time.time()
        if self.disconnected:
            # A node may still exist: the engine sampled it, but the harness never received it,
            # so it is not part of the conversation the agent continued.
            call.status, call.error = "client_disconnected", "the client went away before the reply was delivered"
        elif call.node is not None:
            call.status = "ok"
        elif session.budget_stop_count > self.stops_before:
            call.status = "budget_stop"
        elif self.error_body or session.upstream_errors > self.errors_before:
            text = bytes(self.error_body).decode("utf-8", "replace").removeprefix("data: ").strip()
            try:
                err = json.loads(text).get("error", text)
                text = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            except (ValueError, AttributeError):
                pass
            call.error = text[:500] or "upstream error"
            call.status = "upstream_error" if session.upstream_errors > self.errors_before else "rejected"
        else:
            call.status, call.error = "rejected", f"no turn recorded (HTTP {call.http_status})"
        if call.node is None:  # classify from the raw request, since no node carries it
            self.log.tag_raw(call)
            call.fidelity = None  # nothing reached the engine as a turn: nothing to compare with
        elif call.fidelity is None:  # the raw request's blocks against what reached the engine, before the bytes go
            call.fidelity = request_fidelity(call, call.node.request_messages or [])
        call.request_body = bytearray()
        self.finished = True

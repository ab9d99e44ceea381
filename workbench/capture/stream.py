"""The capture proxy's streaming fast path: a streamed chat completion is forwarded streamed.

OpenEnv 0.10.0's `CaptureServer` calls the engine **non-streaming** and replays the whole answer to the
harness as one SSE chunk, so the harness's time to first chunk is the whole generation (and the proxy
parses, deep-copies and re-serialises everything in one burst when the engine finishes). This module
serves the common case instead: ``POST /v1/chat/completions`` with ``stream: true`` (opencode's every
call, pi's) from a session on the proxy's default engine. It forwards the call upstream with
``stream: true`` and relays each engine chunk to the harness as it arrives, while accumulating the
prompt ids, sampled ids, logprobs and the assembled message (content, reasoning, tool-call fragments
by index) into the response OpenEnv would have received, which is ingested as one `TurnNode` exactly
as OpenEnv's ``_ingest`` does. Time to first chunk: the engine's own plus 2-3 ms instead of the whole generation
(+626 ms for 32 tokens; ``benchmarks/proxy_overhead.py``, numbers and CPU cost in ``benchmarks/README.md``).

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

This module decides and drives; the pieces live beside it: `workbench.capture.upstream` (the pooled
engine connection and OpenEnv's retry policy), `workbench.capture.relay` (the harness's reply and the
turn folded from the chunks), `workbench.capture.ingest` (the copy of OpenEnv's ``_ingest``),
`workbench.capture.waiting` (what is done while the engine samples, not after ``[DONE]``).

    path = StreamingPath(app.state)                     # CaptureProxy(..., stream_upstream=True) does this
    prepared = path.prepare(scope, session, body)        # the body as the front door parsed it
    if prepared is not None:
        await path.serve(prepared, session, receive, send)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from openenv.core.harness.capture import sse
from openenv.core.harness.capture.detection import APIType
from openenv.core.harness.capture.server import (
    SAMPLING_KEYS,
    clamp_output_tokens,
    normalise_for_capture,
    normalise_response,
)
from openenv.core.harness.capture.sessions import Session
from openenv.core.harness.capture.upstream import (
    NON_POLICY_SAMPLING,
    InferenceClient,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamTransportError,
    normalize_response,
    prepare_request,
)
from starlette.types import Receive, Scope, Send

from workbench._compat import budget_stop_response  # OpenEnv 0.10.0's private helper
from workbench.capture import fastjson
from workbench.capture.ingest import ingest
from workbench.capture.record import current_call
from workbench.capture.relay import Reply, StreamedTurn
from workbench.capture.sse import SSEDecoder
from workbench.capture.upstream import UPSTREAM_ERRORS, StreamingUpstream, transport_error
from workbench.capture.waiting import while_sampling

__all__ = ["Prepared", "StreamingPath"]

logger = logging.getLogger("workbench.capture.proxy")

_PATH = "/v1/chat/completions"
# Request keys whose handling (refusal under a pinned policy, constrained logits) is OpenEnv's: a call
# carrying any of them takes OpenEnv's path, which answers it exactly as before.
_OPENENV_ONLY = (
    "logit_bias",
    "allowed_token_ids",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "min_tokens",
    "response_format",
)
_KEEPALIVE = sse.KEEPALIVE.encode()


@dataclass
class Prepared:
    """One call ready to forward. `chat_request` is what the node records; `body` goes upstream."""

    chat_request: dict[str, Any]
    body: dict[str, Any]
    requested_sampling: dict[str, Any]
    original: dict[str, Any]  # the harness's request (its model name is echoed in every chunk)
    client: InferenceClient
    fast: bool = False  # orjson read the harness's request: `body` may be written with orjson (fastjson)


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
        self._upstream = StreamingUpstream()

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the engine connections; from another thread, while the serving loop still runs."""
        self._upstream.close(timeout_s)

    # -- deciding ----------------------------------------------------------------------------------

    def prepare(
        self, scope: Scope, session: Session, original: dict[str, Any], *, fast: bool = False
    ) -> Prepared | None:
        """The call as it will be forwarded, or None when OpenEnv's path should serve it. `original`
        is the parsed body the front door checked ({} when the client left during it); `fast` when
        orjson read it (`workbench.capture.fastjson`).

        Pure: nothing is counted or recorded here, so falling back leaves OpenEnv's path exactly as
        it would have been."""
        if scope["path"] != _PATH or session.eval_sampling or session.over_budget:
            return None
        if original.get("stream") is not True:
            return None
        client, level = self.state.upstreams.default
        if session.upstream is not None:  # pinned to one of several engines, or an engine OpenEnv probed
            replicas = self.state.registry.replicas
            pinned = replicas.client_of(session.session_id) if replicas is not None else None
            if pinned is None:
                return None
            client = pinned
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
        # What the session's policy and the clamps added are finite numbers (OpenEnv validates the policy), so
        # a body orjson read may be written with it.
        return Prepared(chat_request, body, requested_sampling, original, client, fast)

    # -- serving -----------------------------------------------------------------------------------

    async def serve(self, prepared: Prepared, session: Session, receive: Receive, send: Send) -> None:
        """Forward, relay, ingest. Returns when the reply is complete or the harness has gone away."""
        session.model_calls += 1  # reserved before the first await, as OpenEnv does after its checks
        while (await receive()).get("more_body", False):  # the body, already read: recorded by the caller
            pass
        reply = Reply(send)
        # The relay runs in this task, so that the caller records the call's outcome as soon as the
        # reply is complete; the watcher cancels it when the harness goes away (closing the engine
        # request), and only that cancellation is absorbed here.
        this = asyncio.current_task()
        if this is None:  # an ASGI app is always called in a task
            raise RuntimeError("StreamingPath.serve must run in an asyncio task")
        watch = asyncio.ensure_future(self._watch(receive, reply, this))
        try:
            await self._relay(prepared, session, reply)
        except asyncio.CancelledError:
            if not reply.gone:
                raise
            this.uncancel()
        finally:
            watch.cancel()

    async def _watch(self, receive: Receive, reply: Reply, relay: asyncio.Task) -> None:
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

    async def _relay(self, prepared: Prepared, session: Session, reply: Reply) -> None:
        try:
            response = await self._upstream.open(prepared.client, prepared.body, fast=prepared.fast)
        except UpstreamError as exc:
            return await self._failed(exc, prepared, session, reply)
        handed_off = False
        try:
            effective = {
                key: prepared.body[key] for key in ("temperature", *NON_POLICY_SAMPLING) if key in prepared.body
            }
            if session.sampling and any(effective.get(k) != v for k, v in session.sampling.items()):
                session.findings.append(
                    "[FATAL] sampling_policy_changed: upstream did not preserve the session training policy"
                )
                session.upstream_errors += 1
                return await reply.error(
                    UpstreamTransportError("upstream did not preserve the session training sampling policy")
                )
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

    async def _stream(
        self, response: aiohttp.ClientResponse, prepared: Prepared, session: Session, reply: Reply
    ) -> bool:
        """Relay the engine's SSE events as they arrive (a network read's worth per send), accumulating.
        True when the response was handed to a background task (which releases it)."""
        turn = StreamedTurn()
        model = prepared.original.get("model") if "model" in prepared.original else None
        decoder = SSEDecoder()
        received = response.content.iter_any()
        waiting = False  # the first chunk was relayed: the engine is sampling the next token
        checked: tuple[list[int] | None, bool | None] = (None, None)  # the prompt ids checked while it samples
        try:
            async for data in received:
                out: list[bytes] = []
                for event in decoder.feed(data):  # comments (keep-alives) are not events
                    payload = event.data.strip()
                    if not payload:  # an empty event
                        continue
                    if payload == b"[DONE]":
                        ids, valid = checked
                        valid = valid if ids is not None and ids is turn.prompt_ids else None
                        await self._done(turn, prepared, session, reply, b"".join(out), valid)
                        # The engine ends its body right after [DONE]. Reading that end keeps the
                        # connection for the next call (a half-read response is closed instead); it
                        # is read behind the reply, so the call is recorded the moment [DONE] is out.
                        if not response.content.at_eof():
                            self._upstream.release_later(response)
                            return True
                        return False
                    try:
                        chunk, fast = fastjson.loads(payload)
                    except ValueError as exc:
                        raise UpstreamTransportError(f"the engine's reply is not JSON ({exc})") from exc
                    if not isinstance(chunk, dict):
                        raise UpstreamTransportError(
                            f"the engine's reply is JSON but not an object ({type(chunk).__name__})"
                        )
                    if turn.feed(chunk, model):  # the harness's model name goes in: orjson only if it read both
                        out.append(b"data: " + fastjson.dumps(chunk, fast and prepared.fast) + b"\n\n")
                if out:
                    await reply.body(b"".join(out))
                    if not waiting:
                        waiting = True
                        checked = while_sampling(turn.prompt_ids, prepared.chat_request.get("messages") or [])
        except UPSTREAM_ERRORS as exc:
            raise transport_error(exc) from exc
        raise UpstreamTransportError("could not reach engine: the engine's stream ended before [DONE]")

    async def _whole(
        self, response: aiohttp.ClientResponse, prepared: Prepared, session: Session, reply: Reply
    ) -> None:
        """An engine that answered the streamed request with one JSON body: replayed as OpenEnv does."""
        try:
            payload = json.loads(await response.read())
        except UPSTREAM_ERRORS as exc:
            raise transport_error(exc) from exc
        except ValueError as exc:
            raise UpstreamTransportError(f"the engine's reply is not JSON ({exc})") from exc
        if not isinstance(payload, dict):
            raise UpstreamTransportError(f"the engine's reply is JSON but not an object ({type(payload).__name__})")
        completion = normalize_response(payload)
        normalise_response(completion)
        ingest(session, prepared.chat_request, completion, prepared.requested_sampling)
        transformer = self.state.transforms.get(APIType.OPENAI_CHAT)
        async for piece in sse.replay(APIType.OPENAI_CHAT, transformer, completion, prepared.original):
            await reply.body(piece.encode())
        await reply.body(b"", more=False)

    @staticmethod
    async def _done(
        turn: StreamedTurn, prepared: Prepared, session: Session, reply: Reply, tail: bytes, prompt_valid: bool | None
    ) -> None:
        """The stream is complete: the chunks read with [DONE] (`tail`: the last token's, the usage chunk)
        and [DONE] to the harness, then the turn is ingested. Nothing the harness receives depends on the
        ingest (OpenEnv replays whatever it ingested), and nothing else runs on the proxy's loop in between
        (no await), so every reader of the proxy finds the turn recorded as soon as the call is; the harness
        just gets its last byte ~1 ms sooner. One write, not two: each write to the harness's socket wakes
        it, and on 2 cores the woken harness took the proxy's core for 0.2-0.4 ms before [DONE] could
        follow (benchmarks/README.md, proxy overhead). `prompt_valid`: the prompt ids' check made while the
        engine sampled (`workbench.capture.waiting`), dropped if the ids are not that list any more."""
        await reply.body(tail + b"data: [DONE]\n\n", more=False)
        response = normalize_response(turn.response())  # the id/logprob pairing check, as OpenEnv's client
        normalise_response(response)
        if response.get("prompt_token_ids") is not turn.prompt_ids:  # checked ids only (normalising keeps the list)
            prompt_valid = None
        ingest(session, prepared.chat_request, response, prepared.requested_sampling, prompt_valid=prompt_valid)

    async def _failed(self, exc: UpstreamError, prepared: Prepared, session: Session, reply: Reply) -> None:
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
        call = current_call.get()
        if call is not None and isinstance(exc, UpstreamHTTPError):
            # Before the count below: whoever sees the count rise finds the status on the call already.
            call.upstream_status = exc.status_code
        session.upstream_errors += 1
        logger.warning("upstream error [%s]: %s", session.session_id, exc)
        await reply.error(exc)

"""One relayed stream's two sides: what the harness receives (`Reply`) and what is kept (`StreamedTurn`).

The streamed relay (`workbench.capture.stream`) hands every engine chunk to `StreamedTurn.feed`, which
folds it into the non-streaming response OpenEnv's path would have received (prompt ids, sampled ids,
logprobs, the assembled message: content, reasoning, tool-call fragments by index) and rewrites the
chunk in place into what OpenEnv's replay would have written for the harness. `Reply` sends it: SSE
headers go out with the first chunk, so a failure before that is still an HTTP status.

    turn, reply = StreamedTurn(), Reply(send)
    if turn.feed(chunk, harness_model):                  # False: nothing left to send for this chunk
        await reply.body(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await reply.body(b"data: [DONE]\n\n", more=False)
    response = turn.response()                           # what OpenEnv would ingest
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from openenv.core.harness.capture import sse
from openenv.core.harness.capture.server import normalise_response
from openenv.core.harness.capture.upstream import UpstreamError, UpstreamHTTPError
from starlette.types import Send

__all__ = ["Reply", "StreamedTurn"]

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    *((k.lower().encode(), v.encode()) for k, v in sse.SSE_HEADERS.items()),
]


@dataclass
class StreamedTurn:
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
                call = self.tools.setdefault(
                    fragment.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
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
        return {
            **self.head,
            "object": "chat.completion",
            "prompt_token_ids": self.prompt_ids,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": self.finish_reason,
                    "token_ids": self.sampled,
                    "logprobs": {"content": self.entries} if self.entries else None,
                }
            ],
            "usage": self.usage,
        }


class Reply:
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
        await self.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
            }
        )
        await self.send({"type": "http.response.body", "body": raw})

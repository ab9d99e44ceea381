"""A scripted upstream speaking vLLM's chat-completions dialect (a test double, for unit tests only).

It answers with random prompt ids, sampled ids and logprobs (shapes exactly as vLLM 0.32 with
``--return-tokens-as-token-ids``), records every request it received, and can be told to fail:

    up = ScriptedUpstream().start()
    up.script = ["text", "tool", "500", "hang:3", "reasoning"]   # one behaviour per request, then "text"
    up.untooled = "text"    # requests without tools (opencode's title call) answer this, script untouched
    ... up.requests, up.answers ...
    up.stop()

`ToolLoop(tool, arguments, usage)` answers "tool" with a call of a harness's own tool instead of opencode's write.

Faults beyond HTTP statuses: "close" (the connection drops halfway through the body), "notjson" (a 200
whose body is an SSE line, not JSON), "bash:CMD" (a bash tool call running CMD). "say:TEXT" answers TEXT.

Holding a request: "hang:S" holds it S seconds, then answers "text". "wait" holds it until the test sets
``up.release`` (a ``threading.Event``, unset at start; `stop` sets it), then answers "text": a request
in flight for as long as the test needs, whatever the machine's load. "wait:S" gives up waiting after S
seconds (plain "wait": 120 s), so a test that never releases does not hang forever.

A request with ``stream: true`` is answered as vLLM streams (`_events`): a role chunk carrying
``prompt_token_ids``, then one chunk per sampled token with its ``token_ids``, its logprob entry and its
piece of the message (content, ``reasoning``, tool-call fragments by index), a usage chunk when
``stream_options.include_usage`` asks, ``[DONE]``; ``up.answers`` holds the same answer as unstreamed.
``up.hold = threading.Event()`` pauses every stream after its first sampled token until it is set. Faults
stream as they answer unstreamed, plus "cut" (the stream stops half-way, no ``[DONE]``) and "garbled" (a
line that is not JSON half-way through the stream).
"""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedUpstream:
    def __init__(self, seed: int = 0, n_out: int = 7) -> None:
        self.rng = random.Random(seed)
        self.n_out = n_out
        self.script: list[str] = []
        self.untooled: str | None = None
        self.hold: threading.Event | None = None
        self.release = threading.Event()  # ends every "wait" request's hold
        self.requests: list[dict[str, Any]] = []
        self.answers: list[dict[str, Any]] = []
        self.adapters: list[tuple[str, str | None, str | None]] = []  # (route, lora_name, lora_path) as received
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "ScriptedUpstream":
        self.thread.start()
        return self

    def release_after_an_untooled_request(self, timeout_s: float = 60.0) -> None:
        """Set `release` (in a thread) once a request without tools (opencode's title call) has come, or after
        `timeout_s`. opencode sends its title call beside the agent's; on a loaded machine the agent can finish,
        and opencode exit, before it leaves (seen in full test runs): a "wait" answer holds the agent for it."""

        def wait() -> None:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and not any(not r.get("tools") for r in list(self.requests)):
                time.sleep(0.05)
            self.release.set()

        threading.Thread(target=wait, daemon=True).start()

    def stop(self) -> None:
        self.release.set()  # no "wait" request left holding a handler thread
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, body: dict[str, Any], mode: str) -> dict[str, Any]:
        rng = self.rng
        prompt = [rng.randrange(151000) for _ in range(rng.randrange(20, 60))]
        out = [rng.randrange(151000) for _ in range(self.n_out)]
        lps = [-rng.random() * 5 for _ in out]
        message: dict[str, Any] = {"role": "assistant", "content": "hello from upstream", "tool_calls": []}
        finish = "stop"
        if mode == "tool":
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"chatcmpl-tool-{rng.randrange(10**9)}",
                        "type": "function",
                        "function": {
                            "name": "write",
                            "arguments": json.dumps({"filePath": "solution.py", "content": "x = 1\n"}),
                        },
                    }
                ],
            }
            finish = "tool_calls"
        elif mode.startswith("bash:"):
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"chatcmpl-tool-{rng.randrange(10**9)}",
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": json.dumps({"command": mode[5:], "description": "run it"}),
                        },
                    }
                ],
            }
            finish = "tool_calls"
        elif mode == "reasoning":
            message["reasoning_content"] = "thinking about it"
        elif mode.startswith("say:"):
            message["content"] = mode[4:]
        return {
            "id": f"chatcmpl-{rng.randrange(10**9)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish,
                    "token_ids": out,
                    "logprobs": {
                        "content": [
                            {"token": f"token_id:{t}", "logprob": lp, "bytes": [65], "top_logprobs": []}
                            for t, lp in zip(out, lps)
                        ]
                    },
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(out),
                "total_tokens": len(prompt) + len(out),
            },
        }

    def _events(self, answer: dict[str, Any], body: dict[str, Any]) -> list[bytes]:
        """`answer` as vLLM 0.32 streams it (``--return-tokens-as-token-ids``, logprobs on)."""
        choice = answer["choices"][0]
        message, ids, entries = choice["message"], choice["token_ids"], choice["logprobs"]["content"]
        n = len(ids)
        deltas: list[dict[str, Any]] = [{} for _ in ids]

        def spread(slots: range, key: str, text: str) -> None:
            for j, slot in enumerate(slots):
                piece = text[len(text) * j // len(slots) : len(text) * (j + 1) // len(slots)]
                if piece:
                    deltas[slot][key] = piece

        reasoning = message.get("reasoning_content")
        text_slots = range(n // 2, n) if reasoning else range(n)
        if reasoning:
            spread(range(n // 2), "reasoning", reasoning)  # vLLM 0.32's streamed name for it
        if message.get("content"):
            spread(text_slots, "content", message["content"])
        calls = message.get("tool_calls") or []
        for i, tc in enumerate(calls):  # each call: a header with its name, then its arguments in pieces
            slots = range(n * i // len(calls), n * (i + 1) // len(calls))
            deltas[slots[0]]["tool_calls"] = [
                {
                    "index": i,
                    "id": tc["id"],
                    "type": "function",
                    "function": {"name": tc["function"]["name"], "arguments": ""},
                }
            ]
            args = tc["function"]["arguments"]
            for j, slot in enumerate(slots[1:]):
                piece = args[len(args) * j // (len(slots) - 1) : len(args) * (j + 1) // (len(slots) - 1)]
                deltas[slot].setdefault("tool_calls", []).append({"index": i, "function": {"arguments": piece}})
        head = {
            "id": answer["id"],
            "object": "chat.completion.chunk",
            "created": answer["created"],
            "model": answer["model"],
        }
        chunks = [
            {
                **head,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                ],
                "prompt_token_ids": answer["prompt_token_ids"],
            }
        ]
        chunks += [
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": deltas[j],
                        "logprobs": {"content": [entries[j]]},
                        "finish_reason": choice["finish_reason"] if j == n - 1 else None,
                        "token_ids": [ids[j]],
                    }
                ],
            }
            for j in range(n)
        ]
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "choices": [], "usage": answer["usage"]})
        return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]

    def _handler(self):
        up = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _json(self, code: int, data: Any) -> None:
                raw = json.dumps(data).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                if self.path.endswith("/models"):
                    self._json(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
                else:
                    self._json(404, {"error": "no"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path.endswith("_lora_adapter"):  # vLLM's hot (un)load: recorded, answered 200
                    with up._lock:
                        up.adapters.append((self.path.rsplit("/", 1)[-1], body.get("lora_name"), body.get("lora_path")))
                    return self._json(200, {})
                with up._lock:
                    up.requests.append(body)
                    if up.untooled is not None and not body.get("tools"):
                        mode = up.untooled
                    else:
                        mode = up.script.pop(0) if up.script else "text"
                if mode == "500":
                    return self._json(500, {"error": {"message": "scripted failure", "type": "internal"}})
                if mode == "400":
                    return self._json(400, {"error": {"message": "scripted bad request", "type": "invalid"}})
                if mode == "notjson":  # what a broken SSE relay would send to a non-streaming client
                    raw = b"data: this is not json\n\n"
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                if mode == "waitclose":  # held until `release` (or stop), then cut as "close": an engine dying
                    up.release.wait(120.0)
                    mode = "close"
                if mode == "close":  # headers promise the whole answer; half of it comes, then EOF
                    raw = json.dumps(up._answer(body, "text")).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw[: len(raw) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if mode.startswith("hang:"):
                    time.sleep(float(mode.split(":")[1]))
                if mode == "wait" or mode.startswith("wait:"):
                    up.release.wait(float(mode.split(":")[1]) if ":" in mode else 120.0)
                answer = up._answer(body, "text" if mode == "cut" else mode)
                with up._lock:
                    up.answers.append(answer)
                if body.get("stream") is not True:
                    return self._json(200, answer)
                events = up._events(answer, body)
                if mode == "cut":
                    events = events[: len(events) // 2]
                if mode == "garbled":  # a line that is not JSON half-way through the stream
                    events.insert(len(events) // 2, b"data: {this is not json\n\n")
                # No Content-Length: the stream ends when the connection closes (HTTP/1.0).
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    for i, event in enumerate(events):
                        self.wfile.write(event)
                        self.wfile.flush()
                        if i == 1 and up.hold is not None:  # the role chunk and one token are out
                            up.hold.wait(30)
                except (BrokenPipeError, ConnectionResetError):  # the proxy went away mid-stream
                    pass

        return Handler


class ToolLoop(ScriptedUpstream):
    """Answers "tool" with one call of `tool` with `arguments` (a harness's own tool name and schema), every other
    mode as `ScriptedUpstream` does; reports `usage` prompt tokens when given (a full context: compaction)."""

    def __init__(self, tool: str, arguments: dict[str, Any], usage: int | None = None) -> None:
        super().__init__()
        self.tool, self.arguments, self.usage = tool, arguments, usage

    def _answer(self, body: dict[str, Any], mode: str) -> dict[str, Any]:
        answer = super()._answer(body, "text" if mode == "tool" else mode)
        if mode == "tool":
            answer["choices"][0].update(
                finish_reason="tool_calls",
                message={
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_{self.rng.randrange(10**9)}",
                            "type": "function",
                            "function": {"name": self.tool, "arguments": json.dumps(self.arguments)},
                        }
                    ],
                },
            )
        if self.usage is not None:
            answer["usage"] = {"prompt_tokens": self.usage, "completion_tokens": 7, "total_tokens": self.usage + 7}
        return answer

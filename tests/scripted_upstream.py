"""A scripted upstream speaking vLLM's chat-completions dialect (a test double, for unit tests only).

It answers with random prompt ids, sampled ids and logprobs (shapes exactly as vLLM 0.32 with
``--return-tokens-as-token-ids``), records every request it received, and can be told to fail:

    up = ScriptedUpstream().start()
    up.script = ["text", "tool", "500", "hang:3", "reasoning"]   # one behaviour per request, then "text"
    ... up.requests, up.answers ...
    up.stop()
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
        self.requests: list[dict[str, Any]] = []
        self.answers: list[dict[str, Any]] = []
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

    def stop(self) -> None:
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
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"chatcmpl-tool-{rng.randrange(10**9)}", "type": "function",
                "function": {"name": "write", "arguments": json.dumps({"filePath": "solution.py", "content": "x = 1\n"})}}]}
            finish = "tool_calls"
        elif mode == "reasoning":
            message["reasoning_content"] = "thinking about it"
        return {
            "id": f"chatcmpl-{rng.randrange(10**9)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model"), "prompt_token_ids": prompt,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "token_ids": out,
                         "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp, "bytes": [65],
                                                   "top_logprobs": []} for t, lp in zip(out, lps)]}}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out), "total_tokens": len(prompt) + len(out)},
        }

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
                with up._lock:
                    up.requests.append(body)
                    mode = up.script.pop(0) if up.script else "text"
                if mode == "500":
                    return self._json(500, {"error": {"message": "scripted failure", "type": "internal"}})
                if mode == "400":
                    return self._json(400, {"error": {"message": "scripted bad request", "type": "invalid"}})
                if mode.startswith("hang:"):
                    time.sleep(float(mode.split(":")[1]))
                answer = up._answer(body, mode)
                with up._lock:
                    up.answers.append(answer)
                self._json(200, answer)

        return Handler

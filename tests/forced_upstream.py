"""A teacher-forced upstream: scripted replies with the real engine's token ids and logprobs (a test double).

`ScriptedUpstream` answers with random ids: fine for the proxy's mechanics, meaningless for turns and
rows. `ForcedUpstream` says what its script says, but as the engine would have had it sampled:

- ``prompt_token_ids``: the engine's own ``/tokenize`` of the request (messages + tools, generation
  prompt), exactly what vLLM would have prefilled;
- ``token_ids``: the reply written in the model's own tool-call format (hermes: ``<tool_call>`` JSON
  ``</tool_call>``, then ``<|im_end|>``) and tokenised by the engine, i.e. its canonical split;
- ``logprobs``: the model's logprob of each of those tokens given the prompt (``prompt_logprobs`` of
  one teacher-forced pass through ``/v1/completions``), at temperature 1.

So a trace captured through it is a real opencode conversation with real ids, whose sampled text was
chosen by a script and not by the model: label it so wherever it is used.

    up = ForcedUpstream(engine).start()
    up.script = ["bash:ls -R", "bash:python -m unittest", "text:Done."]
    ... CaptureProxy(up.url, engine.served_name) ...

    python tests/forced_upstream.py OUT    # the shipped 7-turn capture on repo-tasks/inventory-fix
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx

from scripted_upstream import ScriptedUpstream

__all__ = ["ForcedUpstream", "inventory_fix_script"]


class ForcedUpstream(ScriptedUpstream):
    """Modes: ``bash:CMD`` (a bash tool call), ``text:WORDS`` (a final answer); requests without tools
    (opencode's title call) get ``untooled`` as their mode, e.g. ``text:Fix inventory``."""

    def __init__(self, engine: Any) -> None:
        super().__init__()
        self.engine = engine

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = httpx.post(f"{self.engine.url}{path}", json=body, headers=self.engine.headers, timeout=600)
        r.raise_for_status()
        return r.json()

    def _answer(self, body: dict[str, Any], mode: str) -> dict[str, Any]:
        if mode.startswith("bash:"):
            args = {"command": mode[len("bash:") :], "description": "run it"}
            text = f"<tool_call>\n{json.dumps({'name': 'bash', 'arguments': args})}\n</tool_call>"
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"chatcmpl-tool-{self.rng.randrange(16**16):016x}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps(args)},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            text = mode.split(":", 1)[1] if ":" in mode else "Done."
            message, finish = {"role": "assistant", "content": text, "tool_calls": []}, "stop"
        tok: dict[str, Any] = {
            "model": self.engine.served_name,
            "messages": body["messages"],
            "add_generation_prompt": True,
        }
        if body.get("tools"):
            tok["tools"] = body["tools"]
        prompt = self._post("/tokenize", tok)["tokens"]
        out = self._post(
            "/tokenize", {"model": self.engine.served_name, "prompt": text + "<|im_end|>", "add_special_tokens": False}
        )["tokens"]
        scored = self._post(
            "/v1/completions",
            {
                "model": self.engine.served_name,
                "prompt": prompt + out,
                "max_tokens": 1,
                "prompt_logprobs": 0,
                "temperature": 1.0,
            },
        )
        rows = scored["choices"][0]["prompt_logprobs"][len(prompt) :]
        lps = [row[str(t)]["logprob"] for row, t in zip(rows, out)]
        pieces = [row[str(t)].get("decoded_token") or "" for row, t in zip(rows, out)]
        return {
            "id": f"chatcmpl-{self.rng.randrange(10**9)}",
            "object": "chat.completion",
            "created": 0,
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
                            {"token": f"token_id:{t}", "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
                            for t, lp, p in zip(out, lps, pieces)
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


def inventory_fix_script(task: Any) -> list[str]:
    """Seven turns on repo-tasks/inventory-fix: look, read, run the tests, rewrite two modules (the
    oracle's text), run them again, answer."""
    fixed = task.held_out_tests[0]["solution"]
    rewrite = "".join(
        f"cat > {rel[len('files/') :]} <<'EOF'\n{text}EOF\n"
        for rel, text in sorted(fixed.items())
        if rel.startswith("files/")
    )
    return [
        "bash:ls -R",
        "bash:cat inventory/store.py inventory/report.py",
        "bash:cat test_inventory.py",
        "bash:python -m unittest 2>&1 | tail -3",
        f"bash:{rewrite}",
        "bash:python -m unittest 2>&1 | tail -3",
        "text:Fixed the five bugs in store.py and report.py; the tests pass.",
    ]


def main(out: Path) -> None:
    from workbench.capture import CaptureProxy
    from workbench.engine import Engine, EngineConfig
    from workbench.rollout import run_rollout, RolloutConfig, agent_prompt
    from workbench.tasks import load_task

    task = load_task("repo-tasks/inventory-fix")
    with Engine(EngineConfig(model="smollm2")) as engine:
        up = ForcedUpstream(engine).start()
        up.untooled = "text:Fix the inventory package"
        up.script = inventory_fix_script(task)
        try:
            with CaptureProxy(up.url, engine.served_name) as proxy:
                config = RolloutConfig(
                    temperature=1.0, max_output_tokens=2048, timeout_s=600, isolation="bwrap", **agent_prompt("short")
                )
                result = run_rollout(task, proxy.client(), config, out)
        finally:
            up.stop()
    print(json.dumps({k: result.summary.get(k) for k in ("status", "reward", "agent_turns", "tool_calls")}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""The engine's ``workbench_json`` tool-call parser (vLLM plugin): what it reads as a call, and that the
stream still carries every sampled token's id and logprob when it holds text back."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from workbench.engine import build_asset
from workbench.engine.config import TOOL_PARSER_PLUGIN, EngineConfig
from workbench.engine.vllm import Engine
from workbench.paths import vllm_python

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]


def test_parser_cases_in_the_engines_venv():
    """tests/tool_parser_cases.py: bare, fenced, tagged and streamed calls; every non-call comes back unchanged."""
    tiny = build_asset("tiny")
    r = subprocess.run(
        [str(vllm_python()), str(ROOT / "tests" / "tool_parser_cases.py"), str(TOOL_PARSER_PLUGIN), str(tiny.path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "all cases passed" in r.stdout
    assert r.stdout.count("ok ") >= 30  # every case printed its line


@pytest.mark.engine
def test_an_engine_with_the_plugin_streams_every_token():
    build_asset("tiny")
    with Engine(EngineConfig(model="tiny", tool_parser="json")) as engine:
        command = engine.command()
        assert command[command.index("--tool-call-parser") + 1] == "workbench_json"
        body = {
            "model": engine.served_name,
            "messages": [{"role": "user", "content": "List the files"}],
            "tools": TOOLS,
            "max_tokens": 24,
            "temperature": 1.0,
            "logprobs": True,
            "top_logprobs": 0,
            "return_token_ids": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        ids, lp_ids, usage = [], [], None
        url = f"{engine.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=engine.headers, timeout=300) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    ids += choice.get("token_ids") or []
                    content = (choice.get("logprobs") or {}).get("content") or []
                    lp_ids += [int(e["token"].split(":", 1)[1]) for e in content]
    assert ids and ids == lp_ids
    assert usage is not None and usage["completion_tokens"] == len(ids)

"""The four wire dialects through the capture proxy: Chat Completions, Responses, Anthropic Messages and
Google generateContent. Whatever the harness speaks, the engine is called in chat and the trace records
the engine's own ids, the dialect, and the chat request that was forwarded; the translations (OpenEnv's
transformers) are deterministic and survive the round trip a harness makes: the engine's reply, shown to
the harness in its dialect and sent back in its next request, is the same chat message again."""

from __future__ import annotations

import json

import httpx
import pytest
from openenv.core.harness.capture.detection import APIType
from openenv.core.harness.capture.dialects import TransformManager

from scripted_upstream import ScriptedUpstream
from workbench.capture import CaptureProxy
from workbench.capture.gate import Route, body_problem, route

ANTHROPIC_TOOLS = [
    {
        "name": "Bash",
        "description": "Run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    }
]
GOOGLE_TOOLS = [
    {
        "functionDeclarations": [
            {
                "name": "run_shell_command",
                "description": "Run a command",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            }
        ]
    }
]
ANTHROPIC = {
    "model": "claude-x",
    "max_tokens": 64,
    "system": [{"type": "text", "text": "You are Claude Code."}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "Write solution.py"}]}],
    "tools": ANTHROPIC_TOOLS,
}
GOOGLE = {
    "contents": [{"role": "user", "parts": [{"text": "Write solution.py"}]}],
    "systemInstruction": {"role": "user", "parts": [{"text": "You are Gemini CLI."}]},
    "tools": GOOGLE_TOOLS,
    "generationConfig": {"maxOutputTokens": 64, "temperature": 0},
}


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/v1/chat/completions", Route("model_call", "chat")),
        ("POST", "/v1/responses", Route("model_call", "responses")),
        ("POST", "/v1/messages", Route("model_call", "anthropic")),
        ("POST", "/v1/messages/count_tokens", Route("aux", "anthropic")),
        ("POST", "/v1beta/models/gemini-2.5-pro:generateContent", Route("model_call", "google")),
        ("POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", Route("model_call", "google")),
        ("POST", "/v1/models/tiny:generateContent", Route("model_call", "google")),
        ("POST", "/v1beta/models/gemini-2.5-pro:countTokens", Route("aux", "google")),
        ("GET", "/v1/messages", Route("unknown")),
        ("POST", "/v1beta/models/../sessions:generateContent", Route("unknown")),
        ("POST", "/v1beta/models/..:generateContent", Route("unknown")),
        ("POST", "/v1beta/models/x:deleteModel", Route("unknown")),
        ("POST", "/v1beta/models/x:generateContent/extra", Route("unknown")),
        ("POST", "/x/v1/messages", Route("unknown")),
    ],
)
def test_routes_name_the_dialect(method, path, expected):
    assert route(method, path) == expected


def test_body_problems_are_per_dialect():
    assert body_problem("anthropic", ANTHROPIC) is None
    assert body_problem("google", GOOGLE) is None
    assert body_problem("anthropic", {"messages": []}) == "messages must be a non-empty list of objects"
    assert (
        body_problem("anthropic", {"messages": [{"content": "x"}]})
        == "every message must be an object with a string role"
    )
    assert body_problem("google", {"contents": "hi"}) == "contents must be a non-empty list of objects"
    assert body_problem("google", ANTHROPIC) == "contents must be a non-empty list of objects"
    assert (
        body_problem("google", {**GOOGLE, "tools": {"functionDeclarations": []}}) == "tools must be a list of objects"
    )


@pytest.fixture()
def served():
    up = ScriptedUpstream().start()
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            yield up, proxy
    finally:
        up.stop()


def _events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages_are_recorded_with_the_engines_ids(served, stream):
    up, proxy = served
    up.script = ["tool"]
    client = proxy.client()
    key = client.open_session(harness="opencode", temperature=1.0)
    r = httpx.post(
        f"{proxy.url}/v1/messages",
        json={**ANTHROPIC, "stream": stream},
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    if stream:
        kinds = [e["type"] for e in _events(r.text)]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_start" in kinds
        # the prompt's length as the engine counted it (OpenEnv alone says 0: a harness's compaction reads it)
        start = _events(r.text)[0]["message"]["usage"]
        assert start["input_tokens"] == len(up.answers[-1]["prompt_token_ids"]) > 0
        stop = next(e for e in _events(r.text) if e["type"] == "message_delta")["delta"]["stop_reason"]
    else:
        reply = r.json()
        assert reply["type"] == "message" and reply["content"][0]["type"] == "tool_use"
        assert reply["content"][0]["name"] == "write" and reply["usage"]["output_tokens"] == 7
        stop = reply["stop_reason"]
    assert stop == "tool_use"
    [call] = client.trace(key)
    answer = up.answers[-1]
    assert call["dialect"] == "anthropic" and call["status"] == "ok" and call["purpose"] == "agent"
    assert call["prompt_token_ids"] == answer["prompt_token_ids"]
    assert call["completion_token_ids"] == answer["choices"][0]["token_ids"]
    # the trace holds the chat request the engine was sent: the system block became the system message
    assert call["request"]["messages"][0] == {"role": "system", "content": "You are Claude Code."}
    assert call["request"]["tools"][0]["function"]["name"] == "Bash"
    assert up.requests[-1]["messages"] == call["request"]["messages"]
    # every block the harness sent found in what reached the engine (streamed or not)
    assert call["fidelity"]["dropped"] == [] and call["fidelity"]["raw"]["text"] >= 2, call["fidelity"]


@pytest.mark.parametrize("method", ["generateContent", "streamGenerateContent?alt=sse"])
def test_google_generate_content_is_recorded_with_the_engines_ids(served, method):
    up, proxy = served
    up.script = ["tool"]
    client = proxy.client()
    key = client.open_session(harness="opencode", temperature=1.0)
    r = httpx.post(
        f"{proxy.url}/v1beta/models/gemini-2.5-pro:{method}", json=GOOGLE, headers={"x-goog-api-key": key}, timeout=30
    )
    assert r.status_code == 200, r.text
    replies = _events(r.text) if method.startswith("stream") else [r.json()]
    parts = [p for reply in replies for c in reply["candidates"] for p in c["content"]["parts"]]
    assert parts[0]["functionCall"]["name"] == "write"
    assert replies[-1]["usageMetadata"]["candidatesTokenCount"] == 7
    [call] = client.trace(key)
    assert call["dialect"] == "google" and call["status"] == "ok"
    assert call["prompt_token_ids"] == up.answers[-1]["prompt_token_ids"]
    assert call["request"]["messages"][0] == {"role": "system", "content": "You are Gemini CLI."}
    assert call["fidelity"]["dropped"] == [] and call["fidelity"]["raw"]["text"] >= 2, call["fidelity"]
    assert up.requests[-1]["max_tokens"] == 64  # generationConfig.maxOutputTokens reached the engine


def test_token_counts_are_answered_never_recorded_and_need_a_session(served):
    up, proxy = served
    client = proxy.client()
    key = client.open_session(harness="opencode", temperature=1.0)
    anthropic = httpx.post(f"{proxy.url}/v1/messages/count_tokens", json=ANTHROPIC, headers={"x-api-key": key})
    google = httpx.post(
        f"{proxy.url}/v1beta/models/g:countTokens", json=GOOGLE, headers={"x-goog-api-key": key}, timeout=30
    )
    assert anthropic.json()["input_tokens"] > 0 and google.json()["totalTokens"] > 0
    assert client.trace(key) == [] and up.requests == []
    stranger = httpx.post(f"{proxy.url}/v1/messages/count_tokens", json=ANTHROPIC, headers={"x-api-key": "nope"})
    assert stranger.status_code == 401


def test_bad_bodies_are_refused_and_recorded(served):
    up, proxy = served
    client = proxy.client()
    key = client.open_session(harness="opencode", temperature=1.0)
    r = httpx.post(
        f"{proxy.url}/v1beta/models/g:generateContent", json={"contents": []}, headers={"x-goog-api-key": key}
    )
    assert r.status_code == 400 and "contents" in r.json()["error"]["message"]
    [call] = client.trace(key)
    assert call["dialect"] == "google" and call["status"] == "rejected" and up.requests == []


def test_a_title_call_is_clamped_in_googles_own_field(served):
    up, proxy = served
    client = proxy.client()
    key = client.open_session(harness="opencode", temperature=1.0)
    title = {
        **GOOGLE,
        "systemInstruction": {"parts": [{"text": "You are a title generator."}]},
        "tools": [],
        "generationConfig": {"maxOutputTokens": 4000},
    }
    r = httpx.post(f"{proxy.url}/v1beta/models/g:generateContent", json=title, headers={"x-goog-api-key": key})
    assert r.status_code == 200, r.text
    [call] = client.trace(key)
    assert call["purpose"] == "title" and call["clamped_max_tokens"] == 32 and up.requests[-1]["max_tokens"] == 32


# -- translation both ways (OpenEnv's transformers, as the proxy uses them) -----------------------------------

ENGINE_REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "tiny",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "Writing it.",
                "tool_calls": [
                    {
                        "id": "call_7",
                        "type": "function",
                        "function": {"name": "Bash", "arguments": '{"command": "echo hi > solution.py"}'},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52},
}


def _chat(dialect: APIType, body: dict) -> dict:
    return TransformManager().get(dialect).transform_request(json.loads(json.dumps(body)))


def test_anthropic_round_trip_returns_the_engines_message():
    t = TransformManager().get(APIType.ANTHROPIC)
    reply = t.transform_response(json.loads(json.dumps(ENGINE_REPLY)), ANTHROPIC)
    assert reply == t.transform_response(json.loads(json.dumps(ENGINE_REPLY)), ANTHROPIC)  # deterministic
    assert reply["stop_reason"] == "tool_use"
    assert reply["usage"]["input_tokens"] == 40 and reply["usage"]["output_tokens"] == 12
    tool_use = reply["content"][-1]
    # the harness sends the reply back with its tool's result, as Claude Code does
    follow = {
        **ANTHROPIC,
        "messages": ANTHROPIC["messages"]
        + [
            {"role": "assistant", "content": reply["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"], "content": "ok"}]},
        ],
    }
    chat = _chat(APIType.ANTHROPIC, follow)
    assert chat == _chat(APIType.ANTHROPIC, follow)
    system, user, assistant, result = chat["messages"]
    assert system == {"role": "system", "content": "You are Claude Code."}
    assert user == {"role": "user", "content": "Write solution.py"}
    engine = ENGINE_REPLY["choices"][0]["message"]
    assert assistant["content"] == engine["content"]
    assert [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in assistant["tool_calls"]
    ] == [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in engine["tool_calls"]]
    assert result == {"role": "tool", "tool_call_id": "call_7", "content": "ok"}
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "Bash",
                "description": "Run a command",
                "parameters": ANTHROPIC_TOOLS[0]["input_schema"],
            },
        }
    ]
    for finish, stop in (("stop", "end_turn"), ("length", "max_tokens")):
        ended = json.loads(json.dumps(ENGINE_REPLY))
        ended["choices"][0].update(finish_reason=finish, message={"role": "assistant", "content": "done"})
        assert t.transform_response(ended, ANTHROPIC)["stop_reason"] == stop


def test_google_round_trip_returns_the_engines_message():
    t = TransformManager().get(APIType.GOOGLE)
    reply = t.transform_response(json.loads(json.dumps(ENGINE_REPLY)), GOOGLE)
    assert reply == t.transform_response(json.loads(json.dumps(ENGINE_REPLY)), GOOGLE)
    candidate = reply["candidates"][0]
    assert candidate["finishReason"] == "STOP"  # Google has no tool-call stop: a function call ends with STOP
    assert reply["usageMetadata"] == {"promptTokenCount": 40, "candidatesTokenCount": 12, "totalTokenCount": 52}
    call = next(p["functionCall"] for p in candidate["content"]["parts"] if "functionCall" in p)
    follow = {
        **GOOGLE,
        "contents": GOOGLE["contents"]
        + [
            candidate["content"],
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"id": call.get("id"), "name": call["name"], "response": {"output": "ok"}}}
                ],
            },
        ],
    }
    chat = _chat(APIType.GOOGLE, follow)
    assert chat == _chat(APIType.GOOGLE, follow)
    system, user, assistant, result = chat["messages"]
    assert system == {"role": "system", "content": "You are Gemini CLI."}
    assert user == {"role": "user", "content": "Write solution.py"}
    engine = ENGINE_REPLY["choices"][0]["message"]
    assert assistant["content"] == engine["content"]
    [tool_call] = assistant["tool_calls"]
    assert tool_call["function"]["name"] == "Bash"
    assert json.loads(tool_call["function"]["arguments"]) == {"command": "echo hi > solution.py"}
    assert result["role"] == "tool" and result["tool_call_id"] == tool_call["id"] and "ok" in result["content"]
    assert chat["tools"][0]["function"]["name"] == "run_shell_command"
    assert chat["max_tokens"] == 64 and chat["temperature"] == 0
    ended = json.loads(json.dumps(ENGINE_REPLY))
    ended["choices"][0].update(finish_reason="length", message={"role": "assistant", "content": "done"})
    assert t.transform_response(ended, GOOGLE)["candidates"][0]["finishReason"] == "MAX_TOKENS"


def test_a_block_the_transform_drops_is_named_and_a_merge_is_counted():
    """Fidelity is judged against what was forwarded: a block missing from it is dropped (named), two text blocks
    joined into one chat message are merged (counted: a chat template has no block boundaries)."""
    from workbench.capture.fidelity import fidelity

    body = {
        "system": [{"type": "text", "text": "sys A"}, {"type": "text", "text": "sys B"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image", "source": {}}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "x"},
                    {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]},
            {"role": "user", "content": "after the result"},
        ],
    }
    forwarded = _chat(APIType.ANTHROPIC, body)["messages"]
    got = fidelity(body, "anthropic", forwarded)
    assert (got["dropped"], got["merged"], got["reasoning"], got["images"]) == ([], 1, 1, 1), got
    cut = [m for m in forwarded if m.get("content") != "after the result"]
    assert fidelity(body, "anthropic", cut)["dropped"] == ["text (user): 'after the result'"]
    no_call = [{**m, "tool_calls": None} if m.get("tool_calls") else m for m in forwarded]
    assert fidelity(body, "anthropic", no_call)["dropped"][0].startswith("tool_use (assistant)")


def test_claude_codes_billing_line_is_stripped_on_purpose_and_its_environment_message_moved_not_dropped():
    """What Claude Code sends: a per-request billing line as the first system block (OpenEnv drops it: its hash
    defeats the prefix cache) and its environment as a system-role message after the user's (the transform puts it
    in the system prompt). Neither is a lost block."""
    from workbench.capture.fidelity import fidelity

    body = {
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=abc123;"},
            {"type": "text", "text": "You are Claude Code."},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Create solution.py"}]},
            {"role": "system", "content": "# Environment\n - Primary working directory: /app"},
        ],
    }
    got = fidelity(body, "anthropic", _chat(APIType.ANTHROPIC, body)["messages"])
    assert (got["dropped"], got["stripped"], got["moved"]) == ([], 1, 1), got

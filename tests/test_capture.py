"""The capture proxy against a scripted vLLM-dialect upstream: what is recorded equals what was sent."""

from __future__ import annotations

import json

import httpx
import pytest

from scripted_upstream import ScriptedUpstream
from workbench.capture import CaptureProxy, ProxyClient, ProxyError

TOOLS = [{"type": "function", "function": {"name": "write", "description": "write a file",
                                           "parameters": {"type": "object", "properties": {}}}}]
AGENT = [{"role": "system", "content": "You are opencode, an interactive CLI tool."},
         {"role": "user", "content": "Write solution.py"}]
TITLE = [{"role": "system", "content": "You are a title generator. You output ONLY a thread title."},
         {"role": "user", "content": "Generate a title for this conversation:\n"}]


@pytest.fixture
def stack():
    up = ScriptedUpstream().start()
    proxy = CaptureProxy(up.url, "scripted").start()
    client = proxy.client()
    yield up, proxy, client
    client.close()
    proxy.stop()
    up.stop()


def _post(proxy, key, messages, *, stream=False, tools=TOOLS, headers=None, **extra):
    body = {"model": "whatever/name", "messages": messages, "max_tokens": 64, **extra}
    if tools:
        body["tools"] = tools
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    h = {"Authorization": f"Bearer {key}", **(headers or {})}
    if not stream:
        return httpx.post(f"{proxy.url}/v1/chat/completions", json=body, headers=h, timeout=30)
    chunks = []
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body, headers=h, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_recorded_tokens_equal_what_upstream_sent(stack):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=0.7)
    up.script = ["text", "tool"]
    assert _post(proxy, key, AGENT).status_code == 200
    chunks = _post(proxy, key, AGENT, stream=True)
    calls = client.trace(key)
    assert [c["status"] for c in calls] == ["ok", "ok"]
    for call, answer in zip(calls, up.answers):
        choice = answer["choices"][0]
        assert call["prompt_token_ids"] == answer["prompt_token_ids"]
        assert call["completion_token_ids"] == choice["token_ids"]
        assert call["per_token_logps"] == [e["logprob"] for e in choice["logprobs"]["content"]]
    # the streamed client saw the tool call, assembled, in SSE
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    tool_calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
    assert tool_calls and tool_calls[0]["function"]["name"] == "write"
    assert json.loads("".join(tc["function"].get("arguments") or "" for tc in tool_calls))["filePath"] == "solution.py"


def test_sampling_is_pinned_and_seed_never_reaches_the_engine(stack):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=0.7)
    _post(proxy, key, AGENT, temperature=1.3, top_p=0.9, seed=42)
    sent = up.requests[-1]
    assert "seed" not in sent
    assert sent["temperature"] == 0.7 and sent["top_p"] == 1.0 and sent["top_k"] == -1
    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    assert sent["model"] == "scripted"  # the proxy names the served model, whatever the agent sent
    call = client.trace(key)[0]
    assert call["sampling_params"]["temperature"] == 0.7
    assert call["requested_sampling_params"]["top_p"] == 0.9


def test_reasoning_is_replayed_to_a_streaming_client(stack):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=1.0)
    up.script = ["reasoning"]
    chunks = _post(proxy, key, AGENT, stream=True)
    text = json.dumps(chunks)
    assert "thinking about it" in text
    assert client.trace(key)[0]["completion_token_ids"] == up.answers[0]["choices"][0]["token_ids"]


def test_purpose_tags(stack):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=1.0)
    _post(proxy, key, TITLE, tools=None, headers={"x-session-id": "ses_main"})
    _post(proxy, key, AGENT, headers={"x-session-id": "ses_main"})
    _post(proxy, key, AGENT + [{"role": "assistant", "content": "ok"}], headers={"x-session-id": "ses_main"})
    sub = [{"role": "system", "content": "You are a general-purpose subagent."}, {"role": "user", "content": "find"}]
    _post(proxy, key, sub, headers={"x-session-id": "ses_child"})
    summ = [{"role": "system", "content": "You are a context summarization agent. You are given a conversation"},
            {"role": "user", "content": "..."}]
    _post(proxy, key, summ, tools=None, headers={"x-session-id": "ses_main"})
    assert [c["purpose"] for c in client.trace(key)] == ["title", "agent", "agent", "subagent", "compaction"]


def test_upstream_500_is_recorded_on_that_call(stack):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=1.0)
    up.script = ["500", "500", "500"]  # OpenEnv retries transient statuses 3 times
    r = _post(proxy, key, AGENT)
    assert r.status_code >= 500
    call = client.trace(key)[0]
    assert call["status"] == "upstream_error" and "scripted failure" in call["error"]
    assert call["purpose"] == "agent" and "prompt_token_ids" not in call
    assert client.status(key)["upstream_errors"] == 1
    # the proxy keeps serving
    assert _post(proxy, key, AGENT).status_code == 200


def test_client_disconnect_mid_stream_is_recorded_and_proxy_survives(stack):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=1.0)
    up.script = ["hang:2"]
    body = {"model": "m", "messages": AGENT, "tools": TOOLS, "stream": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{proxy.url}/v1/chat/completions", json=body,
                   headers={"Authorization": f"Bearer {key}"}, timeout=httpx.Timeout(30, read=0.5))
    import time

    deadline = time.time() + 10
    while client.trace(key)[0]["status"] == "pending" and time.time() < deadline:
        time.sleep(0.1)
    call = client.trace(key)[0]
    assert call["status"] == "client_disconnected" and call["purpose"] == "agent"
    assert _post(proxy, key, AGENT).status_code == 200


def test_unknown_key_is_refused_and_nothing_forwarded(stack):
    up, proxy, client = stack
    r = _post(proxy, "not-a-session", AGENT)
    assert r.status_code == 401
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json={"messages": AGENT}, timeout=10)
    assert r.status_code == 401
    assert up.requests == []


def test_control_routes_need_the_admin_key(stack):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=1.0)
    for method, path in [("POST", "/sessions"), ("GET", "/sessions"), ("GET", f"/sessions/{key}"),
                         ("GET", f"/sessions/{key}/trace"), ("GET", f"/sessions/{key}/rollout"),
                         ("GET", f"/sessions/{key}/trace_entries"), ("GET", "/engine"), ("DELETE", f"/sessions/{key}")]:
        # the agent's own key is not the admin key
        r = httpx.request(method, f"{proxy.url}{path}", headers={"Authorization": f"Bearer {key}"}, json={}, timeout=10)
        assert r.status_code == 401, (method, path)
    with pytest.raises(ProxyError, match="401"):
        ProxyClient(proxy.url, "wrong").open_session(harness="opencode", temperature=1.0)


def test_agent_cannot_learn_the_engine_address(stack):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=1.0)
    port = up.url.rsplit(":", 1)[1]
    health = httpx.get(f"{proxy.url}/health", timeout=10).text
    assert port not in health
    assert httpx.get(f"{proxy.url}/v1/models", timeout=10).status_code == 401
    models = httpx.get(f"{proxy.url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10).text
    assert port not in models and "scripted" in models


def test_malformed_request_gets_a_clear_4xx(stack):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=1.0)
    r = httpx.post(f"{proxy.url}/v1/chat/completions", content=b"{not json",
                   headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 400 and "JSON" in r.text
    assert up.requests == []
    assert client.trace(key)[0]["status"] == "rejected"
    assert _post(proxy, key, AGENT).status_code == 200


def test_engine_down_is_reported_by_the_client():
    proxy = CaptureProxy("http://127.0.0.1:9", "nothing").start()
    try:
        with pytest.raises(ProxyError, match="engine not reachable at http://127.0.0.1:9"):
            proxy.client().check_engine()
    finally:
        proxy.stop()


def test_public_bind_requires_an_admin_key():
    with pytest.raises(ProxyError, match="admin-key is required"):
        CaptureProxy("http://127.0.0.1:9", "m", host="0.0.0.0")

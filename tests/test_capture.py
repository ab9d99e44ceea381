"""The capture proxy against a scripted vLLM-dialect upstream: what is recorded equals what was sent.

Every test using `stack` runs twice: with the streaming fast path (`workbench.capture.stream`, the
default) and with every call on OpenEnv's path (``stream_upstream=False``); the ``test_streamed_*``
tests cover what only the fast path does (chunks relayed as they arrive, a stream cut mid-way).
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from scripted_upstream import ScriptedUpstream
from workbench.capture import CaptureProxy, ProxyClient, ProxyError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write",
            "description": "write a file",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
AGENT = [
    {"role": "system", "content": "You are opencode, an interactive CLI tool."},
    {"role": "user", "content": "Write solution.py"},
]
TITLE = [
    {"role": "system", "content": "You are a title generator. You output ONLY a thread title."},
    {"role": "user", "content": "Generate a title for this conversation:\n"},
]


@pytest.fixture(params=[True, False], ids=["streamed", "openenv"])
def stack(request):
    up = ScriptedUpstream().start()
    proxy = CaptureProxy(up.url, "scripted", stream_upstream=request.param).start()
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
    # each answered call's raw request matched block by block (on the streamed path, while the engine sampled)
    assert [c["fidelity"]["raw"] for c in calls] == [{"text": 2}] * 2
    assert all(c["fidelity"]["dropped"] == [] for c in calls)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_sampling_is_pinned_and_seed_never_reaches_the_engine(stack, stream):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=0.7)
    _post(proxy, key, AGENT, stream=stream, temperature=1.3, top_p=0.9, seed=42, max_tokens=32000)
    sent = up.requests[-1]
    assert "seed" not in sent and sent["max_tokens"] == 4096  # the proxy's output clamp
    assert sent["top_logprobs"] == 0
    assert sent["stream"] is (stream and proxy._streaming is not None)
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
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "thinking about it"
    assert "".join(d.get("content") or "" for d in deltas) == "hello from upstream"
    call = client.trace(key)[0]
    assert call["completion_token_ids"] == up.answers[0]["choices"][0]["token_ids"]
    assert call["response"]["choices"][0]["message"]["reasoning_content"] == "thinking about it"


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_purpose_tags(stack, stream):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=1.0)
    _post(proxy, key, TITLE, stream=stream, tools=None, headers={"x-session-id": "ses_main"})
    _post(proxy, key, AGENT, stream=stream, headers={"x-session-id": "ses_main"})
    _post(
        proxy,
        key,
        AGENT + [{"role": "assistant", "content": "ok"}],
        stream=stream,
        headers={"x-session-id": "ses_main"},
    )
    sub = [{"role": "system", "content": "You are a general-purpose subagent."}, {"role": "user", "content": "find"}]
    _post(proxy, key, sub, stream=stream, headers={"x-session-id": "ses_child"})
    summ = [
        {"role": "system", "content": "You are a context summarization agent. You are given a conversation"},
        {"role": "user", "content": "..."},
    ]
    _post(proxy, key, summ, stream=stream, tools=None, headers={"x-session-id": "ses_main"})
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
        httpx.post(
            f"{proxy.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(30, read=0.5),
        )
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
    for method, path in [
        ("POST", "/sessions"),
        ("GET", "/sessions"),
        ("GET", f"/sessions/{key}"),
        ("GET", f"/sessions/{key}/trace"),
        ("GET", f"/sessions/{key}/rollout"),
        ("GET", f"/sessions/{key}/trace_entries"),
        ("GET", "/engine"),
        ("DELETE", f"/sessions/{key}"),
    ]:
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
    r = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        timeout=10,
    )
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


# -- the streaming fast path ----------------------------------------------------------------------


@pytest.fixture
def streamed():
    up = ScriptedUpstream().start()
    proxy = CaptureProxy(up.url, "scripted").start()  # stream_upstream=True is the default
    client = proxy.client()
    yield up, proxy, client
    client.close()
    proxy.stop()
    up.stop()


class _TwoCalls(ScriptedUpstream):
    """Answers with two tool calls in one message (each streamed as a header, then argument fragments)."""

    def _answer(self, body, mode):
        answer = super()._answer(body, "text")
        answer["choices"][0].update(
            finish_reason="tool_calls",
            message={
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": json.dumps({"filePath": f"{name}.py", "content": "x" * 40}),
                        },
                    }
                    for i, name in enumerate(("write", "read"))
                ],
            },
        )
        return answer


def _assembled(chunks):
    """The message a streaming client assembles from the deltas (as the AI SDK does)."""
    content, reasoning, calls = "", "", {}
    for c in chunks:
        for choice in c.get("choices") or []:
            d = choice["delta"]
            content += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or []:
                call = calls.setdefault(
                    tc["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = call["id"] or tc.get("id")
                call["function"]["name"] += (tc.get("function") or {}).get("name") or ""
                call["function"]["arguments"] += (tc.get("function") or {}).get("arguments") or ""
    return content, reasoning, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("mode", ["text", "tool", "bash:ls -la", "reasoning", "two-calls"])
def test_streamed_call_records_what_the_engine_streamed(mode):
    """Ids, logprobs and the message recorded from the chunks equal the engine's answer; the client
    assembles the same message; no capture-only field reaches it; /trace_entries and /rollout see it."""
    up = (_TwoCalls() if mode == "two-calls" else ScriptedUpstream(n_out=12)).start()
    up.script = [mode]
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            client = proxy.client()
            key = client.open_session(harness="opencode", temperature=1.0)
            chunks = _post(proxy, key, AGENT, stream=True)
            answer = up.answers[0]
            choice = answer["choices"][0]
            call = client.trace(key)[0]
            assert call["status"] == "ok" and up.requests[0]["stream"] is True
            assert call["prompt_token_ids"] == answer["prompt_token_ids"]
            assert call["completion_token_ids"] == choice["token_ids"]
            assert call["per_token_logps"] == [e["logprob"] for e in choice["logprobs"]["content"]]
            assert call["finish_reason"] == choice["finish_reason"]
            recorded = call["response"]["choices"][0]["message"]
            expected = choice["message"]
            assert (recorded["content"] or None) == (expected["content"] or None)
            assert recorded.get("reasoning_content") == expected.get("reasoning_content")
            assert (recorded.get("tool_calls") or []) == (expected.get("tool_calls") or [])
            content, reasoning, calls = _assembled(chunks)
            assert (content or None, reasoning or None, calls) == (
                recorded["content"],
                recorded.get("reasoning_content"),
                recorded.get("tool_calls") or [],
            )
            assert len([c for c in chunks if c.get("choices")]) > 2  # relayed as several chunks, not one
            leaked = {"prompt_token_ids", "token_ids", "logprobs"} & {
                k for c in chunks for k in [*c, *(k for ch in c.get("choices") or [] for k in ch)]
            }
            assert not leaked and {c["model"] for c in chunks} == {"whatever/name"}
            assert chunks[-1]["usage"]["prompt_tokens"] == len(answer["prompt_token_ids"])
            admin = {"Authorization": f"Bearer {proxy.admin_key}"}
            entries = httpx.get(f"{proxy.url}/sessions/{key}/trace_entries", headers=admin, timeout=10).json()[
                "entries"
            ]
            assert entries[0]["completion_token_ids"] == choice["token_ids"]
            assert entries[0]["prompt_token_ids"] == answer["prompt_token_ids"]
            rollout = httpx.get(f"{proxy.url}/sessions/{key}/rollout", headers=admin, timeout=10).json()
            assert rollout["stats"]["n_turns"] == 1 and rollout["trainable"]
    finally:
        up.stop()


def test_streamed_chunks_are_relayed_before_the_engine_finishes(streamed):
    """The engine holds its stream after the first token: the client already has that token."""
    up, proxy, client = streamed
    key = client.open_session(harness="opencode", temperature=1.0)
    up.hold = threading.Event()
    body = {"model": "m", "messages": AGENT, "tools": TOOLS, "stream": True}
    lines = []
    with httpx.stream(
        "POST", f"{proxy.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as r:
        it = r.iter_lines()
        while not any(json.loads(x[6:])["choices"][0]["delta"].get("content") for x in lines if x.startswith("data: ")):
            lines.append(next(it))
        assert client.trace(key)[0]["status"] == "pending"  # the engine has not finished: nothing ingested yet
        up.hold.set()
        lines += list(it)
    assert [x for x in lines if x][-1] == "data: [DONE]" and client.trace(key)[0]["status"] == "ok"


def test_streamed_upstream_500_is_recorded_and_answered_in_json(streamed):
    """OpenEnv's 3 attempts, then a 502 naming the engine's error (nothing was relayed yet)."""
    up, proxy, client = streamed
    key = client.open_session(harness="opencode", temperature=1.0)
    up.script = ["500", "500", "500"]
    body = {"model": "m", "messages": AGENT, "tools": TOOLS, "stream": True}
    r = httpx.post(
        f"{proxy.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert r.status_code == 502 and "scripted failure" in r.json()["error"]["message"]
    assert len(up.requests) == 3 and all(req["stream"] is True for req in up.requests)
    call = client.trace(key)[0]
    assert call["status"] == "upstream_error" and "scripted failure" in call["error"] and call["purpose"] == "agent"
    assert client.status(key)["upstream_errors"] == 1
    assert _post(proxy, key, AGENT, stream=True)[-1]["usage"]


def test_streamed_reply_cut_mid_way_ends_with_an_error_event(streamed):
    """The engine's stream stops half-way (no [DONE]): the client has the chunks so far and then an SSE
    error event; the call is an upstream error with no turn; the proxy serves the next call."""
    up, proxy, client = streamed
    key = client.open_session(harness="opencode", temperature=1.0)
    up.script = ["cut"]
    chunks = _post(proxy, key, AGENT, stream=True)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "ended before [DONE]" in chunks[-1]["error"]["message"] and chunks[-1]["error"]["code"] == 502
    call = client.trace(key)[0]
    assert call["status"] == "upstream_error" and "ended before [DONE]" in call["error"]
    assert "prompt_token_ids" not in call and client.status(key)["n_turns"] == 0
    assert "fidelity" not in call  # worked out while the engine sampled, dropped: no turn reached the graph
    assert _post(proxy, key, AGENT, stream=True)[-1]["usage"] and client.trace(key)[1]["status"] == "ok"


def test_streamed_client_disconnect_mid_stream_cancels_the_engine_call(streamed):
    """The client reads the first token and leaves while the engine is still streaming: the call is
    recorded as a disconnect (no turn), and the proxy serves the session's next call."""
    up, proxy, client = streamed
    key = client.open_session(harness="opencode", temperature=1.0)
    up.hold = threading.Event()
    body = {"model": "m", "messages": AGENT, "tools": TOOLS, "stream": True}
    with httpx.stream(
        "POST", f"{proxy.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as r:
        assert next(r.iter_lines()).startswith("data: ")
    import time

    deadline = time.time() + 10
    while client.trace(key)[0]["status"] == "pending" and time.time() < deadline:
        time.sleep(0.05)
    call = client.trace(key)[0]
    assert call["status"] == "client_disconnected" and call["purpose"] == "agent"
    assert client.status(key)["n_turns"] == 0
    up.hold.set()
    up.hold = None
    assert _post(proxy, key, AGENT, stream=True)[-1]["usage"] and client.trace(key)[1]["status"] == "ok"


def test_budget_stop_answers_a_streamed_call_in_sse(stack):
    """A session over its call budget: the streamed call gets OpenEnv's terminal answer, not recorded."""
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=1.0, max_model_calls=1)
    assert _post(proxy, key, AGENT, stream=True)[-1]["usage"]
    chunks = _post(proxy, key, AGENT, stream=True)
    assert chunks[0]["choices"][0]["finish_reason"] == "stop" and chunks[0]["choices"][0]["delta"]["content"]
    assert [c["status"] for c in client.trace(key)] == ["ok", "budget_stop"] and len(up.requests) == 1


# -- the classifier -------------------------------------------------------------------------------


def test_the_proxy_asks_the_classifier_it_is_given():
    """`CaptureProxy(classify=...)`: every call is tagged by the callable, which gets the session's
    harness name, the system prompt, whether tools were offered, and the calls tagged before."""
    seen = []

    def classify(harness, *, system, has_tools, call, prior):
        seen.append((harness, system, has_tools, call.harness_session, [p.purpose for p in prior]))
        return "title" if not has_tools else "agent"

    up = ScriptedUpstream().start()
    try:
        with CaptureProxy(up.url, "scripted", classify=classify) as proxy:
            client = proxy.client()
            key = client.open_session(harness="my-harness", temperature=1.0)
            _post(proxy, key, TITLE, tools=None, headers={"x-session-id": "s1"})
            _post(proxy, key, AGENT, stream=True, headers={"x-session-id": "s1"})
            assert [c["purpose"] for c in client.trace(key)] == ["title", "agent"]
            # the title cap follows the classifier's tag
            assert client.trace(key)[0]["clamped_max_tokens"] == 32 and up.requests[0]["max_tokens"] == 32
    finally:
        up.stop()
    assert {s[0] for s in seen} == {"my-harness"}  # an unknown harness name: the classifier's business
    assert seen[0] == ("my-harness", TITLE[0]["content"], False, "s1", [])
    assert ("my-harness", AGENT[0]["content"], True, "s1", ["title"]) in seen


def test_the_default_classifier_is_the_harnesses_and_no_harness_imports_the_proxy():
    """The purpose vocabulary lives with the harnesses: the proxy asks them, they never import it."""
    import subprocess
    import sys

    from workbench.harnesses import classify_call

    proxy = CaptureProxy("http://127.0.0.1:9", "m")
    assert proxy.classify is classify_call
    code = (
        "import sys, workbench.harnesses.catalog, workbench.harnesses.purpose; "
        "print(sorted(m for m in sys.modules if m.startswith('workbench.capture')), 'workbench.harnesses.pi' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[] True"


@pytest.mark.parametrize(
    "ids",
    [[], [0, 5, 151643], [3, -1], [3, True], [False], [3, 2.0], [3, "4"], [3, None], [2**70]],
    ids=["empty", "valid", "negative", "bool", "only-bool", "float", "str", "none", "big"],
)
def test_the_prompt_ids_check_reaches_check_turns_verdict(ids):
    """The ingest hands check_turn one id of a prompt `valid_token_ids` passed (the relay checks all 7k while the
    engine samples): the findings are those of check_turn on the whole list, whatever the ids hold."""
    from openenv.core.harness.capture.validate import check_turn

    from workbench.capture.ingest import valid_token_ids

    valid = valid_token_ids(ids)
    assert valid == (not any(type(t) is not int or t < 0 for t in ids))
    checked = ids[:1] if valid else ids
    assert [str(f) for f in check_turn(checked, [1], [-0.5]).findings] == [
        str(f) for f in check_turn(ids, [1], [-0.5]).findings
    ]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "openenv"])
def test_an_engine_that_stops_answering_is_drained_and_its_sessions_go_on_on_the_other(stream):
    """Two engines behind one proxy, a session on each; the second stops: within seconds it is drained, the session
    pinned to it gets its next call answered by the first engine, recorded exactly, and new sessions avoid it."""
    ups = [ScriptedUpstream(seed=1).start(), ScriptedUpstream(seed=2).start()]
    proxy = CaptureProxy(ups[0].url, "scripted", replicas=[ups[1].url]).start()
    client = proxy.client()
    try:
        keys = [client.open_session(harness="opencode", temperature=0.7) for _ in range(2)]
        for i, key in enumerate(keys):
            ups[i].script = ["text"]
            assert _post(proxy, key, AGENT + [{"role": "user", "content": f"s{i} r0"}]).status_code == 200
        ups[1].stop()
        deadline = time.monotonic() + 20
        while not client._call("GET", "/engine")["engines"][1]["drained"]:
            assert time.monotonic() < deadline, "the stopped engine was not drained within 20 s"
            time.sleep(0.2)
        engines = client._call("GET", "/engine")
        assert [e["live_sessions"] for e in engines["engines"]] == [2, 0] and engines["sessions_moved"] == 1
        ups[0].script = ["text"]
        if stream:
            assert _post(proxy, keys[1], AGENT + [{"role": "user", "content": "s1 r1"}], stream=True)
        else:
            assert _post(proxy, keys[1], AGENT + [{"role": "user", "content": "s1 r1"}]).status_code == 200
        assert ups[0].requests[-1]["messages"][-1]["content"] == "s1 r1"
        calls = client.trace(keys[1])
        assert [c["status"] for c in calls] == ["ok", "ok"]
        assert [c["engine"] for c in calls] == [1, 0], "each call's record names the engine it went to"
        assert calls[1]["completion_token_ids"] == ups[0].answers[-1]["choices"][0]["token_ids"]
        client.open_session(harness="opencode", temperature=0.7)
        assert [e["live_sessions"] for e in client._call("GET", "/engine")["engines"]] == [3, 0]
    finally:
        client.close()
        proxy.stop()
        ups[0].stop()


def test_the_watch_drains_after_its_misses_in_a_row_and_restores_on_an_answer():
    """`ReplicaWatch.check`, one round at a time, against a transport that fails the second engine on demand."""
    from workbench.capture.watch import ReplicaWatch

    ups = [ScriptedUpstream(seed=1), ScriptedUpstream(seed=2)]  # never started: only their URLs are asked
    proxy = CaptureProxy(ups[0].url, "scripted", replicas=[ups[1].url])  # not started: no watch of its own
    replicas = proxy.inner.state.registry.replicas
    down = {ups[1].url}
    transport = httpx.MockTransport(
        lambda r: httpx.Response(503 if f"{r.url.scheme}://{r.url.host}:{r.url.port}" in down else 200, json={})
    )
    watch = ReplicaWatch(replicas, failures=2)
    with httpx.Client(transport=transport) as http:
        watch.check(http)
        assert replicas.drained == set() and watch.misses == [0, 1]  # one miss is not enough
        watch.check(http)
        assert replicas.drained == {1}
        down.clear()
        watch.check(http)
        assert replicas.drained == set() and watch.misses == [0, 0]
    for up in ups:
        up.server.server_close()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "openenv"])
def test_sessions_are_spread_over_several_engines_and_each_sticks_to_its_own(stream):
    """Two engines behind one proxy: four sessions go two and two, every call of a session reaches the engine it
    was pinned to (streamed and not), each recorded exactly; a closed session frees its place; `/engine` names
    an engine that stopped answering."""
    ups = [ScriptedUpstream(seed=1).start(), ScriptedUpstream(seed=2).start()]
    proxy = CaptureProxy(ups[0].url, "scripted", replicas=[ups[1].url]).start()
    client = proxy.client()
    try:
        keys = [client.open_session(harness="opencode", temperature=0.7) for _ in range(4)]
        for round_ in range(2):
            for i, key in enumerate(keys):
                ups[0].script = ups[1].script = ["text"]
                if stream:
                    assert _post(proxy, key, AGENT + [{"role": "user", "content": f"s{i} r{round_}"}], stream=True)
                else:
                    r = _post(proxy, key, AGENT + [{"role": "user", "content": f"s{i} r{round_}"}])
                    assert r.status_code == 200
        seen = [[req["messages"][-1]["content"] for req in up.requests] for up in ups]
        # sessions 0 and 2 on the first engine, 1 and 3 on the second (fewest live sessions, ties: the first)
        assert sorted(seen[0]) == ["s0 r0", "s0 r1", "s2 r0", "s2 r1"]
        assert sorted(seen[1]) == ["s1 r0", "s1 r1", "s3 r0", "s3 r1"]
        assert all(req["model"] == "scripted" and req["stream"] is stream for up in ups for req in up.requests)
        for i, key in enumerate(keys):  # each call recorded with its own engine's ids
            up = ups[i % 2]
            answers = [
                a for req, a in zip(up.requests, up.answers) if req["messages"][-1]["content"].startswith(f"s{i} ")
            ]
            calls = client.trace(key)
            assert [c["status"] for c in calls] == ["ok", "ok"] and [c["engine"] for c in calls] == [i % 2] * 2
            assert [c["completion_token_ids"] for c in calls] == [a["choices"][0]["token_ids"] for a in answers]
        assert [e["live_sessions"] for e in client._call("GET", "/engine")["engines"]] == [2, 2]
        client.close_session(keys[1])  # the second engine has one live session now: the next goes there
        fifth = client.open_session(harness="opencode", temperature=0.7)
        ups[1].script = ["text"]
        assert _post(proxy, fifth, AGENT + [{"role": "user", "content": "s4"}]).status_code == 200
        assert ups[1].requests[-1]["messages"][-1]["content"] == "s4"
        client.check_engine()
        ups[1].stop()
        with pytest.raises(ProxyError, match=f"engine not reachable at {ups[1].url}"):
            client.check_engine()
    finally:
        client.close()
        proxy.stop()
        for up in ups:
            up.stop()

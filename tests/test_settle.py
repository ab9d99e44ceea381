"""A streamed call's turn is recorded while the engine works on the next call, and no reader ever misses it.

The proxy against a scripted upstream (`workbench.capture.settle`): the turn waits after [DONE] until the session's
next call is forwarded, another request arrives, an in-process read or a stop asks for it, or `DELAY_S` passes.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from scripted_upstream import ScriptedUpstream
from workbench.capture import CaptureProxy
from workbench.harnesses import classify_call

AGENT = [
    {"role": "system", "content": "You are opencode, an interactive CLI tool."},
    {"role": "user", "content": "Write solution.py"},
]
TOOLS = [{"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {}}}}]


class _Watching(ScriptedUpstream):
    """Notes, as each request arrives, how many turns the watched session's graph holds (read in-process)."""

    def __init__(self) -> None:
        super().__init__()
        self.graph_at_arrival: list[int] = []
        self.watch = lambda: -1

    def _answer(self, body, mode):
        self.graph_at_arrival.append(self.watch())
        return super()._answer(body, mode)


@pytest.fixture
def stack():
    up = _Watching().start()
    proxy = CaptureProxy(up.url, "scripted").start()
    client = proxy.client()
    yield up, proxy, client
    client.close()
    proxy.stop()
    up.stop()


def _stream(proxy, key, messages=AGENT):
    body = {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 16, "stream": True}
    with httpx.stream(
        "POST", f"{proxy.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1] if line.startswith("data: ")]


def _nodes(proxy, key) -> int:
    """The session's recorded turns, read without asking the proxy (nothing is flushed by this)."""
    return len(proxy.inner.state.registry.get(key).graph.nodes())


def test_a_turn_is_recorded_once_the_next_call_is_forwarded_and_before_its_own(stack):
    up, proxy, client = stack
    settling = proxy._streaming.settling
    settling.DELAY_S = 60.0  # only the next call (or a read) records the turn, however slow this machine is
    key = client.open_session(harness="opencode", temperature=1.0)
    up.watch = lambda: _nodes(proxy, key)
    started = time.monotonic()
    _stream(proxy, key)
    took = time.monotonic() - started
    assert settling.pending(key) == 1 and _nodes(proxy, key) == 0  # the reply is out, the turn waits
    time.sleep(0.5)
    _stream(proxy, key)
    # The engine had the second call before the first turn was recorded; then the first was, and the second waits.
    assert up.graph_at_arrival == [0, 0]
    assert settling.pending(key) == 1 and _nodes(proxy, key) == 1
    calls = client.trace(key)  # a read over HTTP records what waits first
    assert settling.pending() == 0 and _nodes(proxy, key) == 2
    assert [c["status"] for c in calls] == ["ok", "ok"]
    for call, answer in zip(calls, up.answers):
        assert call["completion_token_ids"] == answer["choices"][0]["token_ids"]
        assert call["prompt_token_ids"] == answer["prompt_token_ids"]
    assert calls[0]["latency_s"] <= took + 0.01  # it ended when its reply went out, not 0.5 s later when recorded


def test_a_turn_is_recorded_on_its_own_shortly_after_its_reply(stack):
    up, proxy, client = stack
    key = client.open_session(harness="opencode", temperature=1.0)
    _stream(proxy, key)
    deadline = time.monotonic() + 10
    while _nodes(proxy, key) == 0 and time.monotonic() < deadline:  # DELAY_S is 5 ms; a loaded machine is slower
        time.sleep(0.01)
    assert _nodes(proxy, key) == 1 and proxy._streaming.settling.pending() == 0
    assert proxy.log.trace(key)[0]["status"] == "ok"  # settled with it, read without asking the proxy


@pytest.mark.parametrize("reader", ["in_process_trace", "other_route", "stop"])
def test_every_reader_finds_the_turn_whose_reply_is_out(stack, reader):
    up, proxy, client = stack
    proxy._streaming.settling.DELAY_S = 60.0
    key = client.open_session(harness="opencode", temperature=1.0)
    _stream(proxy, key)
    assert _nodes(proxy, key) == 0
    if reader == "in_process_trace":  # from this thread: recorded on the serving loop, waited for
        calls = proxy.trace(key)
    elif reader == "other_route":
        assert httpx.get(f"{proxy.url}/health", timeout=10).status_code == 200
        calls = proxy.log.trace(key)
    else:
        proxy.stop()  # the loop has stopped: recorded in this thread
        calls = proxy.log.trace(key)
    assert _nodes(proxy, key) == 1 and [c["status"] for c in calls] == ["ok"]
    assert calls[0]["completion_token_ids"] == up.answers[0]["choices"][0]["token_ids"]


def test_a_turn_recorded_later_is_tagged_with_the_calls_that_had_arrived_by_its_reply():
    seen: list[tuple[str, int]] = []

    def classify(harness, *, system, has_tools, call, prior):
        seen.append((call.last_user, len(prior)))
        return classify_call(harness, system=system, has_tools=has_tools, call=call, prior=prior)

    up = ScriptedUpstream().start()
    try:
        with CaptureProxy(up.url, "scripted", classify=classify) as proxy:
            proxy._streaming.settling.DELAY_S = 60.0
            client = proxy.client()
            key = client.open_session(harness="opencode", temperature=1.0)
            first = [AGENT[0], {"role": "user", "content": "first"}]
            _stream(proxy, key, first)
            _stream(proxy, key, [AGENT[0], {"role": "user", "content": "second"}])
            calls = client.trace(key)
    finally:
        up.stop()
    # first: tagged on arrival (no prior), then when its turn was recorded, after the second had arrived: still none
    assert [n for text, n in seen if text == "first"] == [0, 0]
    assert [n for text, n in seen if text == "second"] == [1, 1]
    assert [c["purpose"] for c in calls] == ["agent", "agent"]


def test_turns_of_concurrent_calls_are_recorded_in_the_order_their_replies_went_out(stack):
    up, proxy, client = stack
    proxy._streaming.settling.DELAY_S = 60.0
    key = client.open_session(harness="opencode", temperature=1.0)
    up.script = ["wait", "text"]  # the first call is held until released; the second answers at once
    first = threading.Thread(target=_stream, args=(proxy, key))
    first.start()
    deadline = time.monotonic() + 10
    while len(up.requests) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    _stream(proxy, key)
    up.release.set()
    first.join(30)
    calls = client.trace(key)
    assert [c["status"] for c in calls] == ["ok", "ok"]
    answers = {tuple(a["choices"][0]["token_ids"]) for a in up.answers}
    assert {tuple(c["completion_token_ids"]) for c in calls} == answers
    # the second call's reply went out first, so its turn is the graph's first (nodes() is in recording order)
    recorded = [node.sampled_ids for node in proxy.inner.state.registry.get(key).graph.nodes()]
    assert recorded == [calls[1]["completion_token_ids"], calls[0]["completion_token_ids"]]

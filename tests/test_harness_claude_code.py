"""Claude Code, the real binary in the real sandbox, through the capture proxy's Anthropic Messages route, against
a scripted upstream: it writes solution.py with its own Write tool, its Agent-tool subagent is tagged, its own
event stream agrees with the trace, and its launch keeps to one credential, the proxy and the served model."""

from __future__ import annotations

import json

from scripted_upstream import ToolLoop
from wire_relay import Wire
from workbench.capture import CaptureProxy, ProxyClient
from workbench.harnesses import CallInfo, HarnessOptions, get_harness
from workbench.rollout import RolloutConfig, run_rollout
from workbench.tasks import load_task

SOLUTION = 'def hello():\n    return "hello"\n'


def _rollout(tmp_path, up: ToolLoop, script: list[str]) -> tuple[dict, list[dict], list[tuple]]:
    up.script = script
    with CaptureProxy(up.url, "scripted") as proxy:
        wire = Wire(int(proxy.url.rsplit(":", 1)[1]))
        config = RolloutConfig(
            harness="claude-code", temperature=1.0, max_output_tokens=64, timeout_s=90, max_model_calls=8
        )
        try:
            result = run_rollout(load_task("easy/0"), ProxyClient(wire.url, proxy.admin_key), config, tmp_path / "r")
        finally:
            wire.stop()
    assert result.status == "ok", result.reason
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    return summary, json.loads((tmp_path / "r" / "trace.json").read_text()), wire.seen


def test_claude_code_writes_solution_py_with_its_write_tool(tmp_path):
    write, _ = get_harness("claude-code").example_calls()
    assert write[0] == "Write"
    up = ToolLoop(*write).start()
    try:
        summary, calls, seen = _rollout(tmp_path, up, ["tool", "text"])
    finally:
        up.stop()
    assert (tmp_path / "r" / "workspace" / "solution.py").read_text() == SOLUTION
    assert summary["solution_written"] is True and summary["status"] == "ok"
    assert [(c["dialect"], c["purpose"], c["status"]) for c in calls] == [("anthropic", "agent", "ok")] * 2
    first, second = (c["request"] for c in calls)
    # the trace holds the chat request: the system blocks joined, Claude Code's own tools, the prompt last
    assert first["messages"][0]["role"] == "system"
    assert first["messages"][0]["content"].startswith("You are a Claude agent, built on Anthropic's Claude Agent SDK")
    assert {"Bash", "Edit", "Read", "Write"} <= {t["function"]["name"] for t in first["tools"]}
    assert first["messages"][-1]["content"].endswith("Use the Write tool.")  # task_prompt names its own tool
    assert second["messages"][-1]["role"] == "tool" and "solution.py" in second["messages"][-1]["content"]
    # its own event stream agrees with the trace: two model turns, one Write, no failure, no error
    assert summary["harness_steps"] == summary["agent_turns"] == 2
    assert summary["harness_tool_calls"] == summary["tool_calls"] == {"Write": 1}
    assert summary["tool_failures"] == {} and summary["harness_errors"] == []
    # on the wire: every call streamed, one credential (x-api-key), nothing but model calls (no count_tokens,
    # no preflight); the engine was asked unstreamed, within the output budget
    assert seen == [("POST", "/v1/messages?beta=true", ["x-api-key"], True)] * 2
    assert len(up.requests) == 2 and all(r["max_tokens"] <= 64 for r in up.requests)


def test_claude_code_subagent_is_tagged_and_its_turns_are_not_the_agents(tmp_path):
    # The Agent tool starts a general-purpose subagent in the background: its calls (own system prompt) and
    # the agent's interleave; every side call is tagged, never "agent".
    up = ToolLoop("Agent", {"description": "write it", "prompt": "Say hi.", "subagent_type": "general-purpose"})
    up.start()
    try:
        summary, calls, seen = _rollout(tmp_path, up, ["tool", "text", "text"])
    finally:
        up.stop()
    purposes = [c["purpose"] for c in calls]
    assert purposes[:2] == ["agent", "agent"] or purposes[:2] == ["agent", "subagent"]
    assert sorted(purposes) == ["agent", "agent", "agent", "subagent"]
    assert all(c["dialect"] == "anthropic" and c["status"] == "ok" for c in calls)
    agent_systems = {c["request"]["messages"][0]["content"] for c in calls if c["purpose"] == "agent"}
    [sub] = [c["request"] for c in calls if c["purpose"] == "subagent"]
    assert len(agent_systems) == 1 and sub["messages"][0]["content"] not in agent_systems
    agent_tools = {t["function"]["name"] for t in calls[0]["request"]["tools"]}
    assert {t["function"]["name"] for t in sub["tools"]} < agent_tools  # a general-purpose agent has fewer
    assert summary["harness_steps"] == summary["agent_turns"] == 3  # the subagent's turn is not counted
    assert summary["harness_tool_calls"] == summary["tool_calls"] == {"Agent": 1}
    assert summary["harness_errors"] == []
    assert seen == [("POST", "/v1/messages?beta=true", ["x-api-key"], True)] * 4  # the subagent's streamed too


def test_claude_code_classifies_its_side_queries():
    h = get_harness("claude-code")
    agent = "You are a Claude agent, built on Anthropic's Claude Agent SDK.\n\nYou are an agent working with the user"
    first = CallInfo("", None, "aaaa")

    def tag(system: str, tools: bool = True, last_user: str = "", digest: str = "aaaa") -> str:
        prior = [CallInfo("agent", None, "aaaa")]
        return h.classify(system=system, has_tools=tools, call=CallInfo("", None, digest, last_user), prior=prior)

    assert h.classify(system=agent, has_tools=True, call=first, prior=[]) == "agent"
    assert tag(agent) == "agent"
    assert tag("You are a Claude agent, ...\nYou are an agent for Claude Code", digest="bbbb") == "subagent"
    # compaction forks the agent's own prompt and asks in the last user message; its fallback has its own prompt
    ask = "CRITICAL: Respond with TEXT ONLY.\n\nYour task is to create a detailed summary of the conversation so far"
    assert tag(agent, last_user=ask) == "compaction"
    assert tag("You are a helpful AI assistant tasked with summarizing conversations.", tools=False) == "compaction"
    assert tag("You are a Claude agent, ...\nYou are naming a coding session so the user", tools=False) == "title"
    label = "Write a short summary label describing what these tool calls accomplished."
    assert tag(label, tools=False) == "other" and tag("anything", tools=False) == "other"


def test_claude_code_launch_talks_only_to_the_proxy_with_one_credential():
    launch = get_harness("claude-code").launch(
        base_url="http://127.0.0.1:9/v1",
        api_key="sk-k",
        model="tiny",
        prompt="p",
        options=HarnessOptions(max_output_tokens=99, system_prompt="Be brief.", tools=("bash", "write", "Read")),
    )
    env, argv = launch.env, launch.argv
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"  # it appends /v1/messages itself
    assert env["ANTHROPIC_API_KEY"] == "sk-k" and "ANTHROPIC_AUTH_TOKEN" not in env  # x-api-key alone
    assert [k for k, v in env.items() if v == "sk-k"] == ["ANTHROPIC_API_KEY"]
    models = (
        "ANTHROPIC_MODEL",
        "ANTHROPIC_SMALL_FAST_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
        "CLAUDE_CODE_SUBAGENT_MODEL",
    )
    assert all(env[k] == "tiny" for k in models)
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "99" and env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert argv[1:5] == ["-p", "--output-format", "stream-json", "--verbose"]
    assert argv[argv.index("--model") + 1] == "tiny" and "--dangerously-skip-permissions" in argv
    assert argv[argv.index("--system-prompt") + 1] == "Be brief."
    assert argv[argv.index("--tools") + 1] == "Bash,Write,Read"
    assert launch.files == {} and launch.stdin == b"p"

"""Continue CLI, Grok CLI and Cline, the real binaries in the real sandbox, through the capture proxy's chat
route, against a scripted upstream: each writes solution.py with its own write tool, every call is recorded
in the chat dialect with its purpose (bookkeeping calls tagged), its own output agrees with the trace, and
its launch keeps the key in the environment."""

from __future__ import annotations

import json


from scripted_upstream import ToolLoop
from wire_relay import Wire
from workbench.capture import CaptureProxy, ProxyClient
from workbench.harnesses import CallInfo, HarnessOptions, get_harness
from workbench.rollout import RolloutConfig, run_rollout
from workbench.tasks import load_task

SOLUTION = 'def hello():\n    return "hello"\n'


def _rollout(tmp_path, harness: str, up: ToolLoop, script: list[str], **config) -> tuple[dict, list[dict], list]:
    up.script = script
    with CaptureProxy(up.url, "scripted") as proxy:
        wire = Wire(int(proxy.url.rsplit(":", 1)[1]))
        cfg = RolloutConfig(
            harness=harness, temperature=1.0, max_output_tokens=64, timeout_s=90, max_model_calls=8, **config
        )
        try:
            result = run_rollout(load_task("easy/0"), ProxyClient(wire.url, proxy.admin_key), cfg, tmp_path / "r")
        finally:
            wire.stop()
    assert result.status == "ok", result.reason
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    return summary, json.loads((tmp_path / "r" / "trace.json").read_text()), wire.seen


def _writes_solution(tmp_path, harness: str, tool: str) -> tuple[dict, dict, dict, list, ToolLoop]:
    """A rollout in which the scripted model calls `harness`'s own write tool (`example_calls`), then answers text:
    solution.py holds what it wrote and the trace is two agent calls. (summary, first request, second, wire, up)."""
    write, _ = get_harness(harness).example_calls()
    assert write[0] == tool
    up = ToolLoop(*write).start()
    try:
        summary, calls, seen = _rollout(tmp_path, harness, up, ["tool", "text"])
    finally:
        up.stop()
    assert (tmp_path / "r" / "workspace" / "solution.py").read_text() == SOLUTION
    assert summary["solution_written"] is True
    assert [(c["dialect"], c["purpose"], c["status"]) for c in calls] == [("chat", "agent", "ok")] * 2
    first, second = (c["request"] for c in calls)
    return summary, first, second, seen, up


def _launch(harness: str, **options):
    return get_harness(harness).launch(
        base_url="http://127.0.0.1:1/v1",
        api_key="sk-rollout-key",
        model="m",
        prompt="do it",
        options=HarnessOptions(**options),
    )


# -- Continue CLI ------------------------------------------------------------------------------------------


def test_continue_writes_solution_py_with_its_write_tool(tmp_path):
    # no title call headless: two agent steps only
    summary, first, second, seen, up = _writes_solution(tmp_path, "continue", "Write")
    assert first["messages"][0]["content"].startswith("You are an agent in the Continue CLI")
    tools = {t["function"]["name"] for t in first["tools"]}
    # the write tools headless cn would leave out are allowed; Fetch is excluded (no network)
    assert {"Bash", "Edit", "Read", "Write"} <= tools and "Fetch" not in tools
    assert first["messages"][-1]["content"].endswith("Use the Write tool.")
    assert second["messages"][-1]["role"] == "tool"
    # what cn prints headless: the final answer, counted as one step
    assert summary["harness_steps"] == 1 and summary["harness_errors"] == []
    assert summary["tool_calls"] == {"Write": 1} and summary["tool_failures"] == {}
    # every call streamed, one credential (bearer), nothing but model calls (no /models, no hub)
    assert seen == [("POST", "/v1/chat/completions", ["authorization"], True)] * 2
    assert len(up.requests) == 2 and all(r["max_tokens"] <= 64 for r in up.requests)


def test_continue_compaction_is_tagged(tmp_path):
    # cn counts tokens itself (gpt-tokenizer): a ~6k-token Bash output in an 8k window compacts before the next step
    up = ToolLoop("Bash", {"command": "printf 'word %.0s' $(seq 1 6000)"}).start()
    try:
        summary, calls, seen = _rollout(tmp_path, "continue", up, ["tool", "text", "text"], context_tokens=8192)
    finally:
        up.stop()
    purposes = [c["purpose"] for c in calls]
    assert purposes[:3] == ["agent", "compaction", "agent"] and set(purposes[3:]) <= {"agent"}
    compaction = calls[1]["request"]
    assert compaction["messages"][-1]["content"].startswith("Please provide a concise summary of our conversation")
    assert summary["tool_calls"] == {"Bash": 1}
    assert all(s == ("POST", "/v1/chat/completions", ["authorization"], True) for s in seen)


def test_continue_launch():
    launch = _launch("continue", tools=("bash", "write"), system_prompt="Be brief.", context_tokens=4096)
    argv = launch.argv
    assert argv[-1] == "-p"  # cn reads stdin only when nothing follows -p
    assert argv.count("--allow") == 1 and argv[argv.index("--allow") + 1] == "Write"
    excluded = {argv[i + 1] for i, a in enumerate(argv) if a == "--exclude"}
    assert {"Read", "Edit", "Fetch", "List"} <= excluded and not {"Bash", "Write", "Exit"} & excluded
    config = launch.files[".continue/config.yaml"]
    assert "apiKey: ${{ secrets.WB_API_KEY }}" in config and launch.env["WB_API_KEY"] == "sk-rollout-key"
    assert 'apiBase: "http://127.0.0.1:1/v1"' in config and "contextLength: 4096" in config
    assert 'rules:\n  - "Be brief."' in config
    assert launch.env["CONTINUE_METRICS_ENABLED"] == "0"
    h = get_harness("continue")

    def call(last_user: str) -> CallInfo:
        return CallInfo(purpose="", harness_session=None, system_digest=None, last_user=last_user)

    assert (
        h.classify(
            system="",
            has_tools=False,
            call=call("Given the following... please reply with a title for the chat"),
            prior=(),
        )
        == "title"
    )
    assert h.classify(system="x", has_tools=True, call=call("fix it"), prior=()) == "agent"
    run = h.parse_events("All done.\n")
    assert run.steps == 1 and run.text == "All done." and not run.errors


# -- Grok CLI ----------------------------------------------------------------------------------------------


def test_grok_writes_solution_py_with_its_create_file_tool(tmp_path):
    summary, first, _, seen, up = _writes_solution(tmp_path, "grok-cli", "create_file")
    assert first["messages"][0]["content"].startswith("You are Grok CLI")
    assert {"bash", "create_file", "str_replace_editor", "view_file"} <= {t["function"]["name"] for t in first["tools"]}
    assert first["messages"][-1]["content"].endswith("Use the create_file tool.")
    # its own JSON lines agree with the trace: two replies, one create_file, no failure, no error
    assert summary["harness_steps"] == summary["agent_turns"] == 2
    assert summary["harness_tool_calls"] == summary["tool_calls"] == {"create_file": 1}
    assert summary["tool_failures"] == {} and summary["harness_errors"] == []
    # headless grok never streams (no "stream" key at all); one bearer credential; only model calls
    assert seen == [("POST", "/v1/chat/completions", ["authorization"], None)] * 2
    assert all(r["max_tokens"] <= 64 for r in up.requests)


def test_grok_launch_and_events():
    launch = _launch("grok-cli", system_prompt="Be brief.", max_output_tokens=77)
    assert launch.argv[1:] == ["-m", "m", "--prompt=do it"] and launch.stdin == b""
    assert launch.env["GROK_API_KEY"] == "sk-rollout-key" and launch.env["GROK_BASE_URL"] == "http://127.0.0.1:1/v1"
    assert launch.env["GROK_MAX_TOKENS"] == "77" and launch.files == {".grok/GROK.md": "Be brief."}
    run = get_harness("grok-cli").parse_events(
        '{"role":"user","content":"go"}\n'
        '{"role":"assistant","content":"","tool_calls":[{"id":"a","type":"function","function":{"name":"bash","arguments":"{}"}}]}\n'
        '{"role":"tool","tool_call_id":"a","content":"Command failed: exit 1"}\n'
        '{"role":"assistant","content":"Sorry, I encountered an error: Grok API error: 500"}\n'
    )
    assert run.steps == 1 and run.tool_calls == {"bash": 1} and run.tool_failures == {"bash": 1}
    assert run.errors == ["Sorry, I encountered an error: Grok API error: 500"]


# -- Cline -------------------------------------------------------------------------------------------------


def test_cline_writes_solution_py_with_its_editor_tool(tmp_path):
    summary, first, _, seen, up = _writes_solution(tmp_path, "cline", "editor")
    assert first["messages"][0]["content"].startswith("You are Cline, an AI coding agent")
    tools = {t["function"]["name"] for t in first["tools"]}
    assert {"editor", "run_commands", "read_files", "spawn_agent"} <= tools and "fetch_web_content" not in tools
    assert first["messages"][-1]["content"].endswith("Use the editor tool.")
    # its --json events agree with the trace: two iterations, one editor call, no failure, no error
    assert summary["harness_steps"] == summary["agent_turns"] == 2
    assert summary["harness_tool_calls"] == summary["tool_calls"] == {"editor": 1}
    assert summary["tool_failures"] == {} and summary["harness_errors"] == []
    # every call streamed, one bearer credential (OPENAI_API_KEY from env), only model calls (no cline.bot)
    assert seen == [("POST", "/v1/chat/completions", ["authorization"], True)] * 2


def test_cline_subagent_is_tagged(tmp_path):
    spawn = {"systemPrompt": "You are a helper that writes notes.", "task": "Write note.txt saying hi."}
    up = ToolLoop("spawn_agent", spawn).start()
    try:
        summary, calls, _ = _rollout(tmp_path, "cline", up, ["tool", "text", "text"])
    finally:
        up.stop()
    purposes = [c["purpose"] for c in calls]
    assert purposes == ["agent", "subagent", "agent"], purposes
    assert calls[1]["request"]["messages"][0]["content"].startswith("You are a helper that writes notes.")
    assert summary["tool_calls"] == {"spawn_agent": 1}


def test_cline_launch():
    launch = _launch("cline", tools=("bash", "write"), system_prompt="Be brief.")
    assert launch.argv[1:] == ["--json", "-s", "Be brief.", "--", "do it"] and launch.stdin == b""
    assert "-P" not in launch.argv and "-m" not in launch.argv and "-k" not in launch.argv
    providers = json.loads(launch.files[".cline/data/settings/providers.json"])
    entry = providers["providers"]["openai-compatible"]
    assert entry["updatedAt"] and "apiKey" not in entry["settings"]
    assert entry["settings"]["baseUrl"] == "http://127.0.0.1:1/v1"
    settings = json.loads(launch.files[".cline/data/settings/global-settings.json"])
    assert settings["telemetryOptOut"] is True
    assert "run_commands" not in settings["disabledTools"] and "editor" not in settings["disabledTools"]
    assert {"read_files", "fetch_web_content", "spawn_agent"} <= set(settings["disabledTools"])
    assert launch.env == {"OPENAI_API_KEY": "sk-rollout-key", "CLINE_SESSION_BACKEND_MODE": "local"}
    h = get_harness("cline")
    info = CallInfo(purpose="", harness_session=None, system_digest="b")
    compaction = "Summarize the provided coding session into a concise continuation note with detailed next steps."
    assert h.classify(system=compaction, has_tools=False, call=info, prior=()) == "compaction"

"""Gemini CLI and Qwen Code, the real binaries in the real sandbox, through the capture proxy against a
scripted upstream: the write tool writes solution.py, every call is recorded in the harness's dialect and
tagged, and what the harness printed agrees with the trace."""

from __future__ import annotations

import json

import pytest

from scripted_upstream import ToolLoop
from workbench.capture import CaptureProxy
from workbench.harnesses import CallInfo, HarnessOptions, get_harness
from workbench.rollout import RolloutConfig, run_rollout
from workbench.tasks import load_task

SOLUTION = "def add(a, b):\n    return a + b\n"


def _rollout(tmp_path, harness: str, up: ToolLoop, script: list[str], **config) -> tuple[dict, list[dict]]:
    up.script = script
    up.untooled = "text"  # a side call without tools never eats the script
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            cfg = RolloutConfig(
                harness=harness, temperature=1.0, max_output_tokens=64, timeout_s=90, max_model_calls=8, **config
            )
            result = run_rollout(load_task("easy/0"), proxy.client(), cfg, tmp_path / "r")
    finally:
        up.stop()
    summary = json.loads((result.out_dir / "summary.json").read_text())
    assert result.status == "ok", (result.reason, (result.out_dir / "harness.stderr.txt").read_text()[-2000:])
    return summary, json.loads((result.out_dir / "trace.json").read_text())


@pytest.mark.parametrize(
    ("harness", "dialect", "path"), [("gemini-cli", "google", "solution.py"), ("qwen-code", "chat", "/app/solution.py")]
)
def test_write_tool_writes_the_solution(tmp_path, harness, dialect, path):
    (write, args) = get_harness(harness).example_calls()[0]
    assert write == "write_file" and args["file_path"] == path  # qwen's write_file wants an absolute path
    up = ToolLoop("write_file", {"file_path": path, "content": SOLUTION}).start()
    summary, calls = _rollout(tmp_path, harness, up, ["tool", "text"])
    assert (tmp_path / "r" / "workspace" / "solution.py").read_text() == SOLUTION
    assert summary["solution_written"] and summary["harness"] == harness
    # as shipped: two agent steps and no side call (no title, no next-speaker check, no routing)
    assert [(c["dialect"], c["purpose"], c["status"]) for c in calls] == [(dialect, "agent", "ok")] * 2
    assert len(up.requests) == 2
    tools = {t["function"]["name"] for t in calls[0]["request"]["tools"]}
    assert {"run_shell_command", "write_file", "read_file"} <= tools
    # the harness's own account agrees with the trace
    assert summary["harness_tool_calls"] == {"write_file": 1} == summary["tool_calls"]
    assert summary["harness_steps"] == 2 and not summary["harness_errors"]
    assert not summary["tool_failures"]


def test_qwen_compaction_is_tagged_and_tools_are_restricted(tmp_path):
    # 16k reported prompt tokens in the 16k window: qwen compacts before its next step
    up = ToolLoop("run_shell_command", {"command": "echo hi > note.txt"}, usage=16000).start()
    summary, calls = _rollout(tmp_path, "qwen-code", up, ["tool", "text"], tools=("bash", "write"))
    assert [c["purpose"] for c in calls] == ["agent", "compaction", "agent"]
    compaction = calls[1]["request"]
    assert not compaction["tools"]
    assert compaction["messages"][0]["content"].startswith("You are the component that summarizes a conversation")
    assert {t["function"]["name"] for t in calls[0]["request"]["tools"]} == {"run_shell_command", "write_file"}
    assert (tmp_path / "r" / "workspace" / "note.txt").read_text() == "hi\n"
    assert summary["harness_tool_calls"] == {"run_shell_command": 1} and summary["harness_steps"] == 2


def test_gemini_tools_are_restricted_and_no_compression_in_a_prompt(tmp_path):
    # Gemini splits history for compression only at a user message that is not a function response:
    # in a -p run that is the prompt alone, so a full window compresses nothing (as shipped)
    up = ToolLoop("run_shell_command", {"command": "echo hi >> note.txt"}, usage=16000).start()
    summary, calls = _rollout(tmp_path, "gemini-cli", up, ["tool", "tool", "text"], tools=("bash", "write"))
    assert [c["purpose"] for c in calls] == ["agent"] * 3
    assert {t["function"]["name"] for t in calls[0]["request"]["tools"]} == {"run_shell_command", "write_file"}
    assert (tmp_path / "r" / "workspace" / "note.txt").read_text() == "hi\nhi\n"
    assert summary["harness_tool_calls"] == {"run_shell_command": 2} and summary["harness_steps"] == 3


def _info(system: str = "agent", last_user: str = "", purpose="") -> CallInfo:
    return CallInfo(purpose, None, system, last_user)


@pytest.mark.parametrize(
    ("harness", "system", "has_tools", "last_user", "expected"),
    [
        (
            "gemini-cli",
            "\nYou are a specialized system component responsible for distilling chat history into "
            "a structured XML <state_snapshot>.",
            False,
            "First, reason in your scratchpad.",
            "compaction",
        ),
        (
            "gemini-cli",
            "You are a diagnostic agent that determines whether a conversational AI assistant is stuck",
            False,
            "",
            "other",
        ),
        ("gemini-cli", "", False, "Analyze *only* the content and structure of your immediately preceding", "other"),
        ("gemini-cli", "", False, "Summarize the user's primary intent or goal in this conversation in ONE", "title"),
        ("gemini-cli", "You are Codebase Investigator", True, "find it", "subagent"),
        ("gemini-cli", "You are Gemini CLI", True, "", "agent"),
        ("qwen-code", "Generate a concise, sentence-case title (3-7 words)", False, "", "title"),
        ("qwen-code", "", True, "Analyze *only* the content and structure of your immediately preceding", "other"),
        ("qwen-code", "You are an independent Goal Verifier.", True, "{}", "other"),
        # managed auto-memory's background extraction (seen on the tiny model in the matrix)
        ("qwen-code", "You are now acting as the managed memory extraction subagent for an AI", True, "", "other"),
        ("qwen-code", "You are reviewing this conversation to extract reusable skills.", True, "", "other"),
        ("qwen-code", "You are a general-purpose agent", True, "do it", "subagent"),
        ("qwen-code", "You are Qwen Code", True, "", "agent"),
    ],
)
def test_classify_side_calls(harness, system, has_tools, last_user, expected):
    agent_system = "You are Gemini CLI" if harness == "gemini-cli" else "You are Qwen Code"
    prior = [_info(agent_system, purpose="agent")]
    call = _info(system, last_user)
    purpose = get_harness(harness).classify(system=system, has_tools=has_tools, call=call, prior=prior)
    assert purpose == expected


@pytest.mark.parametrize("harness", ["gemini-cli", "qwen-code"])
def test_launch_options_land_in_settings_not_argv(harness):
    h = get_harness(harness)
    options = HarnessOptions(max_output_tokens=77, context_tokens=8192, system_prompt="Be brief.", tools=("edit",))
    launch = h.launch(base_url="http://10.0.0.1:9/v1", api_key="sk-k", model="m", prompt="p", options=options)
    home = ".gemini" if harness == "gemini-cli" else ".qwen"
    settings = json.loads(launch.files[f"{home}/settings.json"])
    assert launch.files[f"{home}/system.md"] == "Be brief." and "sk-k" not in json.dumps(settings)
    assert settings["tools"]["core"] == (["replace"] if harness == "gemini-cli" else ["edit"])
    if harness == "gemini-cli":
        assert launch.env["GOOGLE_GEMINI_BASE_URL"] == "http://10.0.0.1:9"  # genai appends /v1beta/...
        assert launch.env["GEMINI_API_KEY"] == "sk-k" and launch.env["GEMINI_SYSTEM_MD"] == "~/.gemini/system.md"
        assert settings["model"]["compressionThreshold"] * 1_048_576 == 4096
        override = settings["modelConfigs"]["customOverrides"][0]
        assert override["modelConfig"]["generateContentConfig"]["maxOutputTokens"] == 77
    else:
        assert launch.env["OPENAI_BASE_URL"] == "http://10.0.0.1:9/v1" and launch.env["OPENAI_API_KEY"] == "sk-k"
        generation = settings["model"]["generationConfig"]
        assert generation["contextWindowSize"] == 8192 and generation["samplingParams"]["max_tokens"] == 77

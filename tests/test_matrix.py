"""The matrix: a real 1x1 grid writes every column; the cell arithmetic on hand-made records."""

from __future__ import annotations

import json

import pytest

from workbench.evaluate.matrix import (
    COLUMNS,
    MatrixConfig,
    cell_rollout,
    load_matrix,
    markdown_table,
    run_matrix,
    summarise_cell,
)
from workbench.rollout import RolloutConfig


@pytest.mark.engine
def test_one_by_one_grid_writes_the_table_with_every_column(engine, tmp_path):
    config = MatrixConfig(
        harnesses=("codex",),
        models=("tiny",),
        tasks="easy[:1]",
        n=1,
        rollout=RolloutConfig(temperature=0.8, max_output_tokens=32, timeout_s=240),
    )
    result = run_matrix(config, run_dir=tmp_path / "m", engines={"tiny": engine}, progress=False)
    assert {p.name for p in result.dir.iterdir()} >= {"config.json", "matrix.json", "matrix.md", "matrix.html"}
    cells = load_matrix(result.dir)
    assert len(cells) == 1 and list(cells[0]) == list(COLUMNS)
    cell = cells[0]
    assert (cell["harness"], cell["dialect"], cell["model"], cell["rollouts"]) == ("codex", "responses", "tiny", 1)
    assert cell["calls"] == 1 and cell["calls_by_purpose"] == {"agent": 1}
    assert cell["exact_prompt_ids"] == {"value": 1.0, "num": 1, "den": 1}
    assert cell["chain_rate"] is None  # one turn: nothing to chain
    assert cell["tool_call_rate"] == {"value": 0.0, "num": 0, "den": 1}
    assert cell["solution_written"]["den"] == 1 and cell["reward"] == 0.0 and cell["failures"] == {}
    assert cell["wall_s_per_rollout"] > 0
    md = (result.dir / "matrix.md").read_text().splitlines()
    assert md[2] == "| " + " | ".join(COLUMNS) + " |" and md[4].startswith(
        "| codex | responses | tiny | 1 | 1 | agent 1 | 1.00 (1/1) | – |"
    )
    assert "| codex | responses | npm @openai/codex 0.171.0 | `codex exec --json -`" in "\n".join(md)
    html = (result.dir / "matrix.html").read_text()
    assert all(f"<th>{c}</th>" in html for c in COLUMNS)
    rollout = json.loads((result.dir / "matrix.json").read_text())["rollouts"][0]
    assert rollout["status"] == "ok" and (result.dir / "tiny" / "codex" / "r000" / "trace.json").exists()


def _record(status="ok", turns=0, forks=0, causes=None, tool_turns=0, **kw):
    return {
        "status": status,
        "reason": kw.get("reason"),
        "reward": kw.get("reward", 0.0),
        "solution_written": kw.get("solution", False),
        "wall_s": 10.0,
        "calls": turns,
        "calls_by_purpose": {"agent": turns},
        "recorded": turns,
        "exact": turns,
        "tokenize_errors": 0,
        "turns": turns,
        "transitions": max(0, turns - 1),
        "forks": forks,
        "fork_causes": causes or {},
        "tool_turns": tool_turns,
    }


def test_each_model_gets_its_own_prompting_unless_one_is_given():
    from workbench.rollout.types import SHORT_AGENT_PROMPT

    shared = RolloutConfig(temperature=0.5)
    auto = MatrixConfig(models=("tiny", "qwen-coder"), rollout=shared)
    tiny, qwen = cell_rollout(auto, "tiny", "pi"), cell_rollout(auto, "qwen-coder", "pi")
    assert (tiny.few_shot, tiny.system_prompt, tiny.harness) == (False, None, "pi")
    assert (qwen.few_shot, qwen.system_prompt, qwen.temperature) == (True, SHORT_AGENT_PROMPT, 0.5)
    forced = MatrixConfig(models=("qwen-coder",), few_shot=False, agent_prompt="default")
    assert (
        cell_rollout(forced, "qwen-coder", "codex").few_shot,
        cell_rollout(forced, "qwen-coder", "codex").tools,
    ) == (False, None)


def test_cell_arithmetic():
    records = [
        _record(turns=3, forks=1, causes={"arguments_reserialised": 1}, tool_turns=2, solution=True, reward=1.0),
        _record(turns=1, tool_turns=1),
        _record(status="timeout", reason="no exit after 300 s (wall-clock limit)\nmore"),
    ]
    row = summarise_cell("pi", "smollm2", records)
    assert row["chain_rate"] == {"value": 0.5, "num": 1, "den": 2}  # 2 transitions, 1 forked
    assert row["tool_call_rate"] == {"value": 0.75, "num": 3, "den": 4}
    assert row["solution_written"] == {"value": 0.333, "num": 1, "den": 3}
    assert row["reward"] == 0.333 and row["fork_causes"] == {"arguments_reserialised": 1}
    assert row["failures"] == {"timeout: no exit after 300 s (wall-clock limit)": 1}
    assert (
        "| pi | chat | smollm2 | 3 | 4 | agent 4 | 1.00 (4/4) | 0.50 (1/2) | arguments_reserialised 1 |"
        in markdown_table([row])
    )

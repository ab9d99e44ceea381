"""A real small model through the unmodified harness: SmolLM2-135M calls opencode's own tools."""

from __future__ import annotations

import json

import pytest

from workbench.engine import build_asset, local_stack
from workbench.rollout import run_rollout
from workbench.rollout.types import SHORT_AGENT_PROMPT, SHORT_AGENT_TOOLS, RolloutConfig
from workbench.tasks import load_task

pytestmark = [pytest.mark.engine, pytest.mark.opencode, pytest.mark.slow]


def test_smollm2_writes_solution_with_opencodes_write_tool(tmp_path):
    """Up to 5 rollouts of easy/0 at T=0.3 (few-shot, short agent prompt); at least one must have
    opencode's `write` tool create solution.py: in opencode's own events, in the workspace, and as a
    tool call in the engine's captured answer."""
    build_asset("smollm2")
    config = RolloutConfig(
        temperature=0.3,
        max_output_tokens=256,
        max_model_calls=6,
        timeout_s=300,
        few_shot=True,
        system_prompt=SHORT_AGENT_PROMPT,
        tools=SHORT_AGENT_TOOLS,
    )
    outcomes = []
    with local_stack("smollm2") as (_, _, client):
        for i in range(5):
            result = run_rollout(load_task("easy/0"), client, config, tmp_path / f"r{i}")
            outcomes.append(result.summary)
            if result.summary.get("solution_written"):
                break
    wrote = [s for s in outcomes if s.get("solution_written")]
    assert wrote, [(s["status"], s.get("tool_calls")) for s in outcomes]
    s = wrote[0]
    assert s["tool_calls"].get("write", 0) >= 1  # opencode's own tool, reported in its own event stream
    folder = tmp_path / f"r{len(outcomes) - 1}"
    assert (folder / "workspace" / "solution.py").exists()
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines() if line.startswith("{")]
    assert any(e.get("type") == "tool_use" and (e.get("part") or {}).get("tool") == "write" for e in events)
    calls = json.loads((folder / "trace.json").read_text())
    agent = [c for c in calls if c["purpose"] == "agent" and c["status"] == "ok"]
    assert any((c["response"]["choices"][0]["message"] or {}).get("tool_calls") for c in agent)

"""benchmarks/whole_loop.py: the per-rollout report of a run's multi-call rollouts, on recorded real rollouts."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "workbench" / "data" / "rollouts"
_spec = importlib.util.spec_from_file_location("whole_loop", ROOT / "benchmarks" / "whole_loop.py")
whole_loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(whole_loop)


def _run(tmp_path: Path, rewards: list[float]) -> Path:
    """A run folder with one step: a 7-call bash rollout (a repo task) and a one-write rollout, as one group."""
    step = tmp_path / "run" / "grpo" / "rollouts" / "step-0001"
    for i, name in enumerate(("smollm2-forced-repo-task", "smollm2-easy")):
        shutil.copytree(FIXTURES / name, step / f"00-{i:02d}_{name}")
    (tmp_path / "run" / "grpo" / "metrics.jsonl").write_text(json.dumps({"step": 1, "rewards": rewards}) + "\n")
    return tmp_path / "run"


def test_each_rollout_reports_its_calls_its_executed_tools_and_what_each_turn_policy_trains(tmp_path):
    out = whole_loop.report(_run(tmp_path, [1.0, 0.0]), None)
    long, short = out["rollouts"]
    assert (long["agent_calls"], long["tool_calls_executed"], long["tools"]) == (7, 6, {"bash": 6})
    assert short["agent_calls"] == 2 and short["solution_written"]
    assert (long["advantage_sign"], short["advantage_sign"]) == (1, -1)
    # the one-write rollout's second turn (its closing prose) is trained only under "all"
    assert short["trained_tokens"]["all"] > short["trained_tokens"]["tool_calls"] > 0
    cov = out["turn_policy"]
    assert cov["all"]["negative_rollouts"] == 1
    assert cov["all"]["trained_tokens"] > cov["tool_calls"]["trained_tokens"]
    assert out["steps"] == [{"step": 1, "zero_variance_groups": 0.0, "write_credit": 0.0, "step_s": None}]
    assert out["totals"]["with_6_or_more_calls"] == 1


def test_a_group_of_equal_rewards_is_a_zero_variance_group_and_a_mismatch_is_refused(tmp_path):
    run = _run(tmp_path, [0.0, 0.0])
    assert whole_loop.report(run, None)["steps"][0]["zero_variance_groups"] == 1.0
    (run / "grpo" / "metrics.jsonl").write_text(json.dumps({"step": 1, "rewards": [0.0]}) + "\n")
    with pytest.raises(ValueError, match="2 rollouts but 1 rewards"):
        whole_loop.report(run, None)


def test_own_code_runs_count_bash_commands_that_run_python():
    def call(command: str) -> dict:
        args = json.dumps({"command": command})
        msg = {"tool_calls": [{"function": {"name": "bash", "arguments": args}}]}
        return {"purpose": "agent", "status": "ok", "response": {"choices": [{"message": msg}]}}

    calls = [call("python3 solution.py"), call("ls -la"), call("pytest -q"), call("cat x.py")]
    assert whole_loop.own_code_runs(calls) == 2


def test_why_a_written_solution_did_not_pass_is_read_from_the_graders_outcomes():
    def verify(*outcomes: tuple[str, str]) -> dict:
        tests = [{"outcome": o, "reason": r} for o, r in outcomes]
        return {"passed": sum(o == "passed" for o, _ in outcomes), "total": len(tests), "tests": tests}

    why = whole_loop.why_unsolved
    assert why(verify(("passed", ""), ("passed", ""))) is None  # solved
    assert why(verify(("missing_file", "there is no solution.py in the workspace"))) is None  # nothing written
    assert why(verify(("passed", ""), ("wrong", "reward 0"))) == "partial"
    assert why(verify(("wrong", "FAILED (failures=1)"))) == "wrong"
    assert why(verify(("timeout", "over 6 s"))) == "timeout"
    crash = ("crash", "Traceback ...\nNameError: name 'List' is not defined")
    assert why(verify(crash, crash, ("wrong", "x"))) == "crash: NameError"
    assert (
        why(verify(("crash", "solution.py defines no function 'f'"))) == "crash: solution.py defines no function <name>"
    )
    assert why(None) is None

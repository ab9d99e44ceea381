"""The learning demo's training-only reward: credit for writing solution.py, the plain reward otherwise."""

from __future__ import annotations

import pytest

from workbench.rollout import RolloutOutcome, RolloutResult
from workbench.tasks import load_tasks
from workbench.train.grpo import GRPORun, TrainConfig, hidden_test_reward, write_credit_reward


def _outcome(status: str, reward: float | None, written: bool) -> RolloutOutcome:
    task = load_tasks("easy-train[:1]")[0]
    result = RolloutResult("r0", task.id, status, None, reward, None, {"solution_written": written})
    return RolloutOutcome(task, result, [])


@pytest.mark.parametrize(
    "status, reward, written, expected",
    [
        ("ok", 0.0, True, 0.2),  # wrote a wrong solution: the credit alone
        ("ok", 0.5, True, 0.6),  # 0.2 + 0.8 x 0.5
        ("ok", 1.0, True, 1.0),  # solved: still 1, so solving always beats writing
        ("ok", 0.0, False, 0.0),  # wrote nothing: no credit
        ("timeout", 0.5, True, 0.6),  # a timeout is the agent's doing: scored on its workspace
        ("limit_exceeded", 0.0, True, 0.0),  # broke a sandbox limit: 0, never credited
        ("crashed", None, True, None),  # unscorable stays unscorable (out of the group's baseline)
    ],
)
def test_write_credit_reward(status, reward, written, expected):
    got = write_credit_reward(0.2)(_outcome(status, reward, written))
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_write_credit_is_bounded_and_off_by_default(tmp_path):
    with pytest.raises(ValueError, match="write_credit"):
        TrainConfig(write_credit=1.0)
    with pytest.raises(ValueError, match="write_credit"):
        write_credit_reward(-0.1)
    assert GRPORun(TrainConfig(tasks="easy-train[:1]"), run_dir=tmp_path / "a", engine=None, client=None).reward_fn is (
        hidden_test_reward
    )
    credited = GRPORun(TrainConfig(tasks="easy-train[:1]", write_credit=0.3), run_dir=tmp_path / "b").reward_fn
    assert credited(_outcome("ok", 0.0, True)) == pytest.approx(0.3)


def test_the_learning_curve_shows_the_test_reward_and_the_credited_one_apart():
    from workbench.views import learning_curve_figure

    plain = [{"step": 1, "rewards": [0.0, 1.0]}, {"step": 2, "rewards": [1.0, 1.0]}]
    assert [t.name for t in learning_curve_figure(plain).data] == [
        "hidden-test reward: step mean (95% CI)",
        "hidden-test reward: moving average (5 steps)",
    ]
    credited = [{"step": 1, "rewards": [0.2, 1.0], "test_rewards": [0.0, 1.0]}]
    fig = learning_curve_figure(credited, window=2)
    assert len(fig.data) == 4
    assert list(fig.data[0].y) == [0.5] and list(fig.data[2].y) == [0.6]  # test reward first, credited second


def test_the_group_signal_figure_shows_each_steps_spread_and_the_groups_that_taught_nothing():
    from workbench.views import group_signal_figure

    metrics = [
        {"step": 1, "reward_std": 0.5, "frac_reward_zero_std": 0.0},
        {"step": 2, "reward_std": 0.0, "frac_reward_zero_std": 1.0},
        {"step": 3, "reward_std": 0.25, "frac_reward_zero_std": 0.0},
        {"step": 4, "reward_std": 0.0, "frac_reward_zero_std": 1.0},
    ]
    fig = group_signal_figure(metrics)
    assert list(fig.data[0].y) == [0.5, 0.0, 0.25, 0.0] and list(fig.data[1].y) == [0.0, 1.0, 0.0, 1.0]
    assert "zero-variance groups 50% of steps" in fig.layout.title.text


def test_the_learning_evidence_pairs_each_rate_by_task():
    from workbench.evaluate.evidence import rate_delta

    def ev(written: list[float], solved: list[int]) -> dict:
        return {
            "per_task": [
                {"task_id": f"t{i}", "scored": 4, "solved": s, "solution_written_rate": w}
                for i, (w, s) in enumerate(zip(written, solved))
            ]
        }

    base, trained = ev([0.0, 0.25, 0.0, 0.0], [0, 1, 0, 0]), ev([1.0, 0.75, 0.5, 1.0], [0, 1, 0, 1])
    written = rate_delta(base, trained, 0, "solution_written_rate")
    assert written["mean"] == pytest.approx(0.75) and written["ci95"][0] > 0
    assert rate_delta(base, trained, 0)["mean"] == pytest.approx(0.0625)  # (0 + 0 + 0 + 1/4) / 4


def test_the_eval_table_shows_every_paired_delta_of_the_shipped_run():
    from workbench.evaluate import load_shipped
    from workbench.views import render_eval

    _, evidence, _ = load_shipped()
    assert evidence is not None  # the shipped run is a held-out comparison
    html = render_eval(evidence)
    for key in ("delta", "solve_delta", "tool_call_delta", "solution_written_delta"):
        assert f"{evidence[key]['mean']:.3f}" in html


def test_the_eval_table_quotes_the_clustered_rate_interval_and_flags_a_wilson_one():
    from workbench.views import render_eval

    def side(clustered: bool) -> dict:
        e = {"rollouts": 8, "solve_rate": 0.5, "solve_rate_ci95": [0.2, 0.8]}
        return e | ({"solve_rate_ci95_clustered": [0.111, 0.889]} if clustered else {})

    paired = {"mean": 0.0, "ci95": [0.0, 0.0], "p": 1.0}
    new = render_eval({"base": paired, "trained": paired, "base_eval": side(True), "trained_eval": side(True)})
    assert "[0.111, 0.889]" in new and "Wilson" not in new
    old = render_eval({"base": paired, "trained": paired, "base_eval": side(False), "trained_eval": side(False)})
    assert "[0.200, 0.800] (Wilson, too narrow)" in old


def test_the_write_credit_decays_to_zero_over_its_steps_and_then_trains_on_the_plain_reward():
    from workbench.train.grpo import reward_at

    cfg = TrainConfig(tasks="easy-train[:1]", write_credit=0.4, write_credit_decay_steps=4)
    assert [cfg.write_credit_at(s) for s in (1, 2, 3, 4, 5, 9)] == pytest.approx([0.4, 0.3, 0.2, 0.1, 0.0, 0.0])
    assert reward_at(cfg, 2)(_outcome("ok", 0.0, True)) == pytest.approx(0.3)
    assert reward_at(cfg, 5) is hidden_test_reward
    assert TrainConfig(write_credit=0.4).write_credit_at(100) == pytest.approx(0.4)  # 0 decay steps: constant
    with pytest.raises(ValueError, match="write_credit_decay_steps"):
        TrainConfig(write_credit_decay_steps=-1)

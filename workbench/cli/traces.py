"""The trace commands: ``export`` and ``import`` (OpenEnv training traces out of and into rollout folders),
``certify`` (is a harness x model training-grade?), ``html`` (a whole run as one page, no kernel) and ``figures``
(a run's figures as PNG and SVG).

    workbench export runs/x/rollouts --format openenv-trace --out out/traces      # one JSON per rollout
    workbench import --format openenv-trace out/traces/easy_1.json --out runs/imported/easy_1 --reward 1
    workbench certify --harness opencode --model smollm2 --json
    workbench html runs/x --out runs/x/view.html [--png]
    workbench figures runs/<stamp>__notebooks --formats png,svg     # every saved figure, for slides

Handlers import their stage on call, so ``--help`` stays instant (tests/test_imports.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

__all__ = ["add_trace_commands"]

Add = Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser]


def _rollout_dirs(root: Path) -> list[Path]:
    if (root / "trace.json").is_file():
        return [root]
    found = sorted(p.parent for p in root.rglob("trace.json") if "workspace" not in p.relative_to(root).parts)
    if not found:
        raise FileNotFoundError(f"no rollout folder (trace.json) in or under {root}")
    return found


def _cmd_export(args: argparse.Namespace) -> int:
    import json

    from workbench.turns import mask_policy, rollout_training_trace

    root, out = Path(args.path), Path(args.out)
    policy = mask_policy(args.train_turns)
    docs: list[tuple[Path, Path, dict]] = []
    for d in _rollout_dirs(root):  # every rollout checked by OpenEnv's validator before any file is written
        name = d.name if d == root else "__".join(d.relative_to(root).parts)
        docs.append((d, out / f"{name}.json", rollout_training_trace(d, policy)))
    taken = [str(target) for _, target, _ in docs if target.exists()]
    if taken:
        raise ValueError(
            f"export: would replace {', '.join(taken[:3])}{' ...' if len(taken) > 3 else ''}: another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    for d, target, doc in docs:
        target.write_text(json.dumps(doc))
        trained = sum(sum(t["loss_mask"]) for t in doc["turns"])
        print(f"{d} -> {target}: {len(doc['turns'])} turns, {trained} trained tokens")
    print(f"{len(docs)} training trace(s) in OpenEnv's schema (validated by openenv {_openenv_version()}) in {out}")
    return 0


def _openenv_version() -> str:
    from importlib.metadata import version

    return version("openenv")


def _cmd_import(args: argparse.Namespace) -> int:
    from workbench.turns import import_trace, write_turns

    files = [f for p in map(Path, args.files) for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    if not files:
        raise FileNotFoundError(f"no .json training trace in {', '.join(args.files)}")
    out = Path(args.out)
    for f in files:
        d = out if len(files) == 1 else out / f.stem
        import_trace(f, d, task_id=args.task_id, reward=args.reward, model=args.model, harness=args.harness)
        r = write_turns(d).report
        print(f"{f} -> {d}: {r['turns']} turns, {r['rows']} rows, {r['trained_tokens']} trained tokens")
    return 0


def _cmd_html(args: argparse.Namespace) -> int:
    from workbench.views import save_run_html

    out = Path(args.out)
    pages, skipped = save_run_html(
        Path(args.path),
        out,
        work_dir=Path(args.work) if args.work else None,
        model=args.model,
        title=args.title,
        max_context=args.max_context if args.max_context >= 0 else None,
    )
    for path, why in skipped:  # one unreadable trace must not hide the others: said, and the page has the rest
        print(f"{path}: skipped: {why}", file=sys.stderr)
    turns = sum(len(p.derived.turns) for p in pages)
    print(f"{out}: {len(pages)} rollout(s), {turns} turns, {len(skipped)} skipped ({out.stat().st_size} bytes)")
    if args.png:
        from workbench.views import screenshot

        print(screenshot(out, out.with_suffix(".png")))
    return 1 if skipped else 0


def _cmd_figures(args: argparse.Namespace) -> int:
    from workbench.views import export_figures

    folder = Path(args.path)
    folder = folder / "figures" if (folder / "figures").is_dir() else folder
    written = export_figures(folder, [f.strip() for f in args.formats.split(",") if f.strip()])
    for path in written:
        print(path)
    if not written:
        print(f"{folder}: no figures (*.json specs or *.html views) to export", file=sys.stderr)
    return 0 if written else 1


def add_trace_commands(add: Add) -> None:
    """Register export, import, html (and their flags) on the root parser's `add`."""
    from workbench.turns import FORMATS

    p = add(
        "export", _cmd_export, "write each rollout's training trace in OpenEnv's schema (what TRL's AsyncGRPO reads)"
    )
    p.add_argument("path", help="a rollout folder (with trace.json) or a run folder holding several")
    p.add_argument("--format", choices=FORMATS, required=True)
    p.add_argument("--out", required=True, help="folder for one <rollout>.json per rollout")
    p.add_argument(
        "--train-turns",
        choices=["tool_calls", "all"],
        default="tool_calls",
        help="the mask producer for calls that carry no loss_mask of their own (TrainConfig.train_turns)",
    )

    p = add("import", _cmd_import, "turn OpenEnv training traces (or trace-entry lists) into rollout folders")
    p.add_argument("files", nargs="+", help="trace files, or folders of *.json")
    p.add_argument("--format", choices=FORMATS, required=True)
    p.add_argument("--out", required=True, help="the rollout folder (several files: one subfolder per file)")
    p.add_argument("--task-id", default=None, help="the task (default: the trace's metadata, else the file's stem)")
    p.add_argument("--reward", type=float, default=None, help="the rollout's reward (default: the trace's metadata)")
    p.add_argument("--model", default=None, help="model asset whose tokenizer made the ids (views decode with it)")
    p.add_argument("--harness", default=None, help="the harness that made the trace (default: its metadata)")

    p = add(
        "html",
        _cmd_html,
        "write a run's traces (rollout folders, OpenEnv training traces, trace-entry lists) as one static HTML page",
    )
    p.add_argument("path", help="a folder (or one file) of traces in any of the three formats")
    p.add_argument("--out", required=True, help="the page to write (self-contained: no script, no network)")
    p.add_argument(
        "--model", default=None, help="model asset whose tokenizer decodes traces that name no model of their own"
    )
    p.add_argument("--work", default=None, help="keep imported OpenEnv files here (default: a temporary folder)")
    p.add_argument("--title", default=None, help="the page's title (default: the path)")
    p.add_argument(
        "--max-context", type=int, default=200, help="context tokens shown before each sampled span (-1: all)"
    )
    p.add_argument("--png", action="store_true", help="also a PNG of the page's first screen (offline Chromium)")
    p = add("figures", _cmd_figures, "a run's saved figures as PNG and SVG for slides (offline, the system's Chromium)")
    p.add_argument("path", help="a run folder (its figures/) or a folder of saved figures")
    p.add_argument("--formats", default="png,svg", help="comma-separated: png, svg (HTML views: png only)")

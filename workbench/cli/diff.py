"""``workbench diff A B``: two rollouts side by side, turn by turn (`workbench.evaluate.diff`), from the shell.

workbench diff runs/x/rollouts/easy-13__00 runs/y/rollouts/easy-13__00 --model smollm2 --html d.html
cli_diff(["A", "B", "--json"])        # the same as a function: 0 identical, 1 different (like diff(1))
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.evaluate import diff_rollouts, render_diff
from workbench.paths import DATA
from workbench.turns import Tokenizer

__all__ = ["add_diff_arguments", "diff_from_args", "cli_diff"]


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _load_tokenizer(name: str | None) -> Tokenizer | None:
    """An asset's tokenizer (``tiny``, ``smollm2``) or a tokenizer folder; SmolLM2's ships with the
    example rollouts, the tiny model's is built offline: neither needs a built model asset."""
    if not name:
        return None
    from transformers import AutoTokenizer

    from workbench.engine import ASSET_NAMES, build_tokenizer, load_asset

    if Path(name).is_dir():
        return AutoTokenizer.from_pretrained(name)
    if name in ASSET_NAMES:
        try:
            return AutoTokenizer.from_pretrained(load_asset(name).path)
        except FileNotFoundError:
            if name == "tiny":
                return build_tokenizer()
            return AutoTokenizer.from_pretrained(DATA / "rollouts" / "smollm2-tokenizer")
    raise ValueError(f"--model {name!r}: expected {', '.join(ASSET_NAMES)} or a tokenizer folder")


def add_diff_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("a", help="a rollout folder (trace.json, summary.json, task.json)")
    parser.add_argument("b", help="the rollout folder to compare it with")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    parser.add_argument(
        "--model",
        default=None,
        help="tokenizer to decode with: tiny, smollm2 or a folder "
        "(default: the model a's summary.json names, when it is an asset)",
    )
    parser.add_argument("--html", default=None, help="also write render_diff's HTML to this file")
    return parser


def diff_from_args(args: argparse.Namespace) -> int:
    """The ``workbench diff`` handler: 0 when the two rollouts are identical, 1 when they differ."""
    from workbench.engine import ASSET_NAMES

    model = args.model or _json(Path(args.a) / "summary.json").get("model")
    result = diff_rollouts(
        Path(args.a), Path(args.b), _load_tokenizer(model if args.model or model in ASSET_NAMES else None)
    )
    if args.html:
        Path(args.html).write_text(render_diff(result))
    if args.json:
        print(json.dumps(result))
        return 0 if result["identical"] else 1
    for side in ("a", "b"):
        s = result[side]
        print(f"{side}: {s['path']} task {s['task_id']} model {s['model']}: {s['turns']} turns, outcome {s['outcome']}")
    for t in result["turns"]:
        if "only" in t:
            print(f"turn {t['turn']}: only in {t['only']}")
            continue
        p, o = t["prompt"], t["output"]
        pt = (
            "same"
            if p["same"]
            else "sandbox path only"
            if p["volatile_only"]
            else f"differs at a#{p['first_real']['index']} b#{p['first_real']['index_b']} {p['first_real'].get('a_text', '')!r} vs {p['first_real'].get('b_text', '')!r}"
        )
        ot = (
            "same"
            if o["same"]
            else f"differs at #{o['first']['index']} {o['first'].get('a_text', '')!r} vs {o['first'].get('b_text', '')!r}"
        )
        print(f"turn {t['turn']}: prompt {pt}; output {ot}; tools {'same' if t['same_tool_calls'] else 'differ'}")
    f = result["first_divergence"]
    print("identical" if result["identical"] else f"first divergence: {f}" if f else "same turns, different outcome")
    return 0 if result["identical"] else 1


def cli_diff(argv: list[str] | None = None) -> int:
    """``workbench diff A B ...`` as a function (argv without the subcommand)."""
    parser = add_diff_arguments(
        argparse.ArgumentParser(
            prog="workbench diff", description=__doc__.split("\n")[0].strip("`"), allow_abbrev=False
        )
    )
    return diff_from_args(parser.parse_args(argv))

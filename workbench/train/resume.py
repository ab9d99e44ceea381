"""What a resumed training run keeps: its config.json byte for byte, and the fields it may change.

`record_config` writes a new run's config.json, or, on ``--resume``, checks the new config against the saved one
(`RESUMABLE` may change; anything else is refused, naming each field) and appends the resume to ``resumes.jsonl``.
A field added to `TrainConfig` since the run was made, at its default, and prompting that resolves the same for the
run's model are the run's own behaviour, not a change.

    record_config(run_dir, {"train": asdict(config), ...}, resume=False)   # config.json (kept as is on resume)
    last_checkpoint(run_dir.path)                    # checkpoints/checkpoint-N, the newest, or None
"""

from __future__ import annotations

import json
import time
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.cpu import machine
from workbench.train.config import TrainConfig

if TYPE_CHECKING:
    from workbench.runs import RunDir

__all__ = ["RESUMABLE", "record_config", "last_checkpoint"]

# What a resumed run may change in config.json: how long it runs, how it uses this machine, where the asset sits.
# Everything else (the task set, the sampling, the loss, the levers) would make its steps another run's.
RESUMABLE = (
    "train.steps",
    # recomputes each layer in the backward: less memory, the same gradients (tests/test_fused_logprobs.py); a run
    # whose multi-call rows outgrew the memory resumes with it on
    "train.activation_checkpointing",
    "train.train_threads",
    "train.report_to",
    "train.engine_cores",
    "train.parallel_rollouts",
    "asset",
    # the engine's dense kernels (zentorch or oneDNN: its venv and the host decide, `engine_kernels`); a run made
    # before the field existed, or before zentorch came into the venv, resumes with the change in resumes.jsonl
    "engine_kernels",
)
_RUN_FACTS = ("git_commit", "created", "host", "cpus")  # written by RunDir.write_config: of the run, not its config


def _differences(saved: Any, new: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    if isinstance(saved, dict) and isinstance(new, dict):
        out: dict[str, tuple[Any, Any]] = {}
        for key in sorted(set(saved) | set(new)):
            if not prefix and key in _RUN_FACTS:
                continue
            out.update(_differences(saved.get(key), new.get(key), f"{prefix}{key}."))
        return out
    return {} if saved == new else {prefix.rstrip("."): (saved, new)}


def _same_behaviour(saved: dict[str, Any], changed: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """`changed` without what only looks different: a field added since the run was made, now at its default (the
    run had that behaviour before the field existed), and prompting spelled otherwise that resolves the same for
    the run's model (``few_shot`` False then, unset now: the model's own, `assets.prompting`)."""
    from workbench.engine import prompting

    train = saved.get("train") or {}
    defaults = json.loads(json.dumps({f.name: f.default for f in fields(TrainConfig)}, default=str))
    out = {
        k: v
        for k, v in changed.items()
        if not (k.startswith("train.") and k[6:] not in train and v[1] == defaults.get(k[6:]))
    }
    keys = ("train.few_shot", "train.agent_prompt")
    if any(k in out for k in keys):
        was = {k: train.get(k[6:]) for k in keys}
        now = {k: out[k][1] if k in out else was[k] for k in keys}
        model = train.get("model", "")
        if prompting(model, *was.values()) == prompting(model, *now.values()):
            out = {k: v for k, v in out.items() if k not in keys}
    return out


def record_config(run_dir: "RunDir", record: dict[str, Any], *, resume: bool, checkpoint: Path | None = None) -> None:
    """A new run's config.json. A resumed run (`checkpoint`: the one it continues from) keeps the saved file byte
    for byte: its `record` must equal it but in `RESUMABLE` (ValueError naming every other field that differs),
    and the resume is appended to ``resumes.jsonl`` (when, from which checkpoint, at which commit, what changed)."""
    from workbench.runs import git_commit

    path = run_dir.path / "config.json"
    if not resume:
        run_dir.write_config(record)
        return
    if not path.is_file():
        raise ValueError(f"--resume: {run_dir.path} has no config.json, so no run to continue: drop --resume")
    if checkpoint is None:
        raise ValueError(f"--resume: {run_dir.path / 'checkpoints'} holds no checkpoint to continue from")
    saved = json.loads(path.read_text())
    changed = _same_behaviour(saved, _differences(saved, json.loads(json.dumps(record, default=str))))
    refused = {k: v for k, v in changed.items() if k not in RESUMABLE}
    if refused:
        fields = "; ".join(f"{k}: {a!r} in config.json, {b!r} now" for k, (a, b) in refused.items())
        raise ValueError(
            f"--resume: this config is not the run's ({path}): {fields}. A resumed run may change only "
            f"{', '.join(RESUMABLE)}; start a new run folder for another config"
        )
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "checkpoint": checkpoint.name,
        "git_commit": git_commit(),
        "machine": machine(),
        "changed": {k: list(v) for k, v in changed.items()},
    }
    with open(run_dir.path / "resumes.jsonl", "a") as f:
        f.write(json.dumps(entry, default=str) + "\n")


def last_checkpoint(run_dir: Path) -> Path | None:
    """The run folder's newest TRL checkpoint (``checkpoints/checkpoint-N``, highest N), None when it has none."""
    ckpts = sorted((run_dir / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return ckpts[-1] if ckpts else None

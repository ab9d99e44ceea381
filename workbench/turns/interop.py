"""OpenEnv's training traces, both ways: a rollout's agent turns as OpenEnv's `TrainingTrace` document, and such a
document (written by OpenEnv, TRL's Harbor example or any producer of the contract) as a rollout folder that
every view, ``workbench turns``, ``diff`` and training ``--from-rollouts`` read.

The schema is OpenEnv 0.10.0's `openenv.core.harness.training` (``schema_version: 1``): ``turns`` of
``{node_id, prompt_token_ids, completion_token_ids, per_token_logps, loss_mask, request, response, metadata}``,
``loss_mask`` over prompt + completion, 0 on the prompt, free to be partial inside a completion (its producer
decides). TRL 1.16's AsyncGRPO trains on this very document (``lossless_capture``: it keeps the completion part
of each mask and chains the turns), so it is TRL's lossless-capture format too: there is no second one.
OpenEnv's own validator checks every document written or read here (`validate_training_trace`; it imports OpenEnv's harness
package, ~7 s the first time).

    doc = training_trace(calls, has_tool_call, summary)       # a dict in OpenEnv's schema
    export_rollout(Path("runs/x/rollouts/easy_1"), Path("out/easy_1.json"))
    import_trace(Path("trace.json"), Path("runs/imported/easy_1"), task_id="easy/1", reward=1.0, model="smollm2")

What a document cannot say is asked for: an external trace has no task, reward or model (``import_trace``'s
keywords; a turn's ``metadata.rollout``, which our exports write, fills them). A file that does not fit the
schema is one `TraceError` naming the file and the field (``turns[3].loss_mask: ...``); nothing is written then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from workbench.turns.trace import MaskPolicy, TraceError, derive_turns, has_tool_call, load_trace

__all__ = [
    "FORMATS",
    "Format",
    "training_trace",
    "validate_training_trace",
    "export_rollout",
    "rollout_training_trace",
    "read_trace",
    "import_trace",
]

Format = Literal["openenv-trace"]
FORMATS: tuple[Format, ...] = ("openenv-trace",)
_ROLLOUT_KEYS = ("rollout_id", "task_id", "harness", "model", "status", "reward", "temperature")


def training_trace(
    calls: list[dict[str, Any]], train_turn_fn: MaskPolicy = has_tool_call, summary: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The agent turns of a trace as OpenEnv's training trace: each turn's loss mask from its producer (the
    call's own ``loss_mask``, else `train_turn_fn`), bookkeeping calls left out (they are no part of the chain).
    A call imported from another producer keeps its node id and metadata verbatim, so a round trip is exact."""
    turns, _ = derive_turns(calls, train_turn_fn)
    rollout = {k: summary.get(k) for k in _ROLLOUT_KEYS} if summary else {}
    out = []
    for t in turns:
        c = calls[t.call]
        metadata = c.get("metadata")
        if metadata is None:
            metadata = {
                "call": t.call,
                "purpose": c.get("purpose", "agent"),
                "finish_reason": c.get("finish_reason"),
                "model": c.get("model"),
                "dialect": c.get("dialect", "chat"),
                "sampling_params": c.get("sampling_params") or {},
                "requested_sampling_params": c.get("requested_sampling_params") or {},
                "rollout": rollout,
            }
        out.append(
            {
                "node_id": str(c.get("node_id") or f"call-{t.call}"),
                "prompt_token_ids": t.prompt_ids,
                "completion_token_ids": t.output_ids,
                "per_token_logps": t.per_token_logps,
                "loss_mask": t.loss_mask,
                "request": c.get("request") or {},
                "response": c.get("response") or {},
                "metadata": metadata,
            }
        )
    return {"schema_version": 1, "turns": out}


def validate_training_trace(doc: Any, where: str = "training trace") -> dict[str, Any]:
    """`doc` checked by OpenEnv's own `TrainingTrace` (strict types, mask/token/logprob rules, unique node ids);
    a list of trace entries (``TrainingTrace.to_trace_entries``, node id in ``metadata``) is taken too.
    Returns the document as OpenEnv dumps it; TraceError naming the field otherwise."""
    from pydantic import ValidationError
    from openenv.core.harness.training import TrainingTrace  # ~7 s on first import: the harness package

    try:
        if isinstance(doc, list):
            for i, entry in enumerate(doc):
                if not isinstance(entry, dict) or "node_id" not in (entry.get("metadata") or {}):
                    raise TraceError(f"{where}: entries[{i}].metadata.node_id: missing (a trace entry names its call)")
            trace = TrainingTrace.from_entries(doc)
        else:
            trace = TrainingTrace.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]).lstrip(".") or "document"
        raise TraceError(f"{where}: {field}: {first['msg']}") from None
    return trace.model_dump(mode="json")


def rollout_training_trace(rollout_dir: Path, train_turn_fn: MaskPolicy = has_tool_call) -> dict[str, Any]:
    """One rollout folder's training trace (its summary's task, reward... in each turn's metadata), validated."""
    rollout_dir = Path(rollout_dir)
    summary_path = rollout_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    calls = load_trace(rollout_dir / "trace.json")
    return validate_training_trace(training_trace(calls, train_turn_fn, summary), str(rollout_dir))


def export_rollout(rollout_dir: Path, out_file: Path, train_turn_fn: MaskPolicy = has_tool_call) -> dict[str, Any]:
    """`rollout_training_trace` written to `out_file`; returns the document."""
    doc = rollout_training_trace(rollout_dir, train_turn_fn)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(doc))
    return doc


def read_trace(path: Path) -> dict[str, Any]:
    """An OpenEnv training trace file (or a JSON list of its trace entries), validated."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    return validate_training_trace(data, str(path))


def _finish_reason(turn: dict[str, Any]) -> str | None:
    if turn["metadata"].get("finish_reason"):
        return str(turn["metadata"]["finish_reason"])
    choices = turn["response"].get("choices")
    return choices[0].get("finish_reason") if isinstance(choices, list) and choices else None


def import_trace(
    path: Path,
    out_dir: Path,
    *,
    task_id: str | None = None,
    reward: float | None = None,
    model: str | None = None,
    harness: str | None = None,
) -> Path:
    """A training trace file as a rollout folder (``trace.json`` of agent calls carrying their ``loss_mask``,
    ``summary.json``; `workbench.turns.write_turns` adds turns.json/rows.json). Keywords override what the
    turns' ``metadata.rollout`` says; the task id defaults to the file's stem. Refuses a non-empty `out_dir`."""
    path, out_dir = Path(path), Path(out_dir)
    doc = read_trace(path)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise TraceError(f"{out_dir}: not empty; import writes a new rollout folder")
    known: dict[str, Any] = next(
        (t["metadata"]["rollout"] for t in doc["turns"] if isinstance(t["metadata"].get("rollout"), dict)), {}
    )
    temps = {
        t["request"].get("temperature", (t["metadata"].get("sampling_params") or {}).get("temperature"))
        for t in doc["turns"]
    }
    calls = [
        {
            "turn": i,
            "purpose": "agent",
            "status": "ok",
            "node_id": t["node_id"],
            "model": model or t["metadata"].get("model") or known.get("model"),
            "request": t["request"],
            "response": t["response"],
            "prompt_token_ids": t["prompt_token_ids"],
            "completion_token_ids": t["completion_token_ids"],
            "per_token_logps": t["per_token_logps"],
            "loss_mask": t["loss_mask"],
            "finish_reason": _finish_reason(t),
            "sampling_params": t["metadata"].get("sampling_params") or {},
            "requested_sampling_params": t["metadata"].get("requested_sampling_params") or {},
            "metadata": t["metadata"],
        }
        for i, t in enumerate(doc["turns"])
    ]
    rollout_id = known.get("rollout_id") or path.stem
    summary = {
        "rollout_id": rollout_id,
        "task_id": task_id or known.get("task_id") or path.stem,
        "harness": harness or known.get("harness") or "imported",
        "model": model or known.get("model"),
        "status": known.get("status") or "ok",
        "reason": None,
        "reward": reward if reward is not None else known.get("reward"),
        "temperature": known.get("temperature")
        if known.get("temperature") is not None
        else (temps.pop() if len(temps) == 1 else None),
        "calls": len(calls),
        "calls_by_purpose": {"agent": len(calls)},
        "agent_turns": len(calls),
        "agent_turns_with_tool_calls": sum(has_tool_call(c) for c in calls),
        "sampled_tokens": sum(len(c["completion_token_ids"]) for c in calls),
        "trained_tokens": sum(sum(c["loss_mask"]) for c in calls),
        "imported_from": {"format": "openenv-trace", "file": str(path.resolve())},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "trace.json").write_text(json.dumps(calls))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return out_dir

"""Trace -> turns -> rows: what the trainer sees, derived from the engine's own token ids, in one call.

The stage's steps each live in their own module; this one runs them and writes the files:

- `workbench.turns.trace`: **turns**, the agent calls of a trace (`load_trace`, `derive_turns`,
  `load_turns`, `Turn`, `TraceError`), title/compaction/subagent/failed calls excluded and counted.
- `workbench.turns.rows`: **rows**, turns chained into training sequences with loss masks, and the
  **forks** where a prompt stops extending its row (`build_rows`, `Row`, `Fork`).
- `workbench.turns.drift`: **drift**, each fork's first diverging token, both sides decoded, and the
  cause (`diagnose`, `CAUSES`).
- `workbench.turns.tokenizer`: the tokenizer a rollout was captured with (`tokenizer_for_rollout`).

    result = analyse(load_trace(run / "trace.json"), tokenizer)   # turns, rows, forks, excluded, report
    write_turns(run, tokenizer)                  # the same, written: turns.json + rows.json beside the trace
    run_report([r.report for r in results])      # per-run totals and the causes x counts table

Works offline from saved folders, including folders in the seed artefact's format.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.turns.protocol import Tokenizer
from workbench.turns.drift import diagnose
from workbench.turns.rows import Fork, Row, build_rows
from workbench.turns.trace import MaskPolicy, Turn, derive_turns, has_tool_call, load_trace

__all__ = ["rollout_report", "run_report", "RolloutTurns", "analyse", "write_turns"]


def rollout_report(turns: list[Turn], rows: list[Row], forks: list[Fork], excluded: dict[str, int]) -> dict[str, Any]:
    per_turn = sum(len(t.prompt_ids) + len(t.output_ids) for t in turns)
    in_rows = sum(len(r.input_ids) for r in rows)
    return {
        "turns": len(turns),
        "turns_trained": sum(t.trained for t in turns),
        "excluded_calls": excluded,
        "rows": len(rows),
        "forks": len(forks),
        "fork_causes": dict(Counter(f.cause for f in forks)),
        "tokens_per_turn_rows": per_turn,
        "tokens_in_rows": in_rows,
        "token_saving": round(per_turn / in_rows, 3) if in_rows else None,
        "trained_tokens": sum(r.n_trained for r in rows),
    }


def run_report(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-run totals of `rollout_report`s: rows, forks, the saving, and the causes x counts table."""
    causes: Counter[str] = Counter()
    excluded: Counter[str] = Counter()
    for r in reports:
        causes.update(r["fork_causes"])
        excluded.update(r["excluded_calls"])
    per_turn = sum(r["tokens_per_turn_rows"] for r in reports)
    in_rows = sum(r["tokens_in_rows"] for r in reports)
    return {
        "rollouts": len(reports),
        "turns": sum(r["turns"] for r in reports),
        "turns_trained": sum(r["turns_trained"] for r in reports),
        "rows": sum(r["rows"] for r in reports),
        "forks": sum(r["forks"] for r in reports),
        "fork_causes": dict(causes),
        "excluded_calls": dict(excluded),
        "tokens_per_turn_rows": per_turn,
        "tokens_in_rows": in_rows,
        "token_saving": round(per_turn / in_rows, 3) if in_rows else None,
    }


@dataclass
class RolloutTurns:
    """Everything derived from one trace."""

    turns: list[Turn]
    rows: list[Row]
    forks: list[Fork]
    excluded: dict[str, int]
    report: dict[str, Any]


def analyse(
    calls: list[dict[str, Any]], tokenizer: Tokenizer | None = None, train_turn_fn: MaskPolicy = has_tool_call
) -> RolloutTurns:
    """Turns, rows, forks (diagnosed when a tokenizer is given) and the report for one trace."""
    turns, excluded = derive_turns(calls, train_turn_fn)
    rows, forks = build_rows(turns)
    if tokenizer is not None:
        diagnose(forks, turns, calls, tokenizer)
    return RolloutTurns(turns, rows, forks, excluded, rollout_report(turns, rows, forks, excluded))


def write_turns(
    rollout_dir: Path, tokenizer: Any | None = None, train_turn_fn: MaskPolicy = has_tool_call
) -> RolloutTurns:
    """Write turns.json (and rows.json with the drift) beside trace.json."""
    rollout_dir = Path(rollout_dir)
    result = analyse(load_trace(rollout_dir / "trace.json"), tokenizer, train_turn_fn)
    (rollout_dir / "turns.json").write_text(json.dumps([t.to_json() for t in result.turns]))
    (rollout_dir / "rows.json").write_text(
        json.dumps(
            {
                "report": result.report,
                "forks": [f.to_json() for f in result.forks],
                "rows": [
                    {
                        "input_ids": r.input_ids,
                        "mask": r.mask,
                        "logprobs": r.logprobs,
                        "sampled": r.sampled,
                        "turns": r.turns,
                        "spans": r.spans,
                    }
                    for r in result.rows
                ],
            }
        )
    )
    return result

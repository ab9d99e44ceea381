"""Trace -> turns -> rows: what the trainer sees, derived from the engine's own token ids.

- **Turns** (`turns.json`, the seed artefact's format): one per agent call, with the engine's
  ``prompt_ids`` (never re-tokenised), ``output_ids`` and ``per_token_logps`` as captured,
  ``trained`` (from `train_turn_fn`, default `has_tool_call`: turns where the model acted), and
  ``mask`` (derived: 0 for the context, 1 for the generated tokens). Agent calls are selected by the
  purpose tag recorded at capture; title/compaction/subagent/failed calls are excluded **and counted**.
- **Rows**: a conversation's turns chained into one training sequence wherever the next prompt
  extends the previous prompt + output token for token; a new row (a fork) where it does not. Sampled
  tokens are never overwritten with re-tokenised text (TRL's REALIGN does that; we fork instead).
  In a row, trained turns' outputs have mask 1; everything else (the prompt, tool results, the
  outputs of untrained turns) has mask 0.
- **Drift**: at every fork, the first diverging token, both sides decoded, and the cause.

    calls = load_trace(run / "trace.json")
    turns, excluded = derive_turns(calls)
    rows, forks = build_rows(turns)
    diagnose(forks, turns, calls, tokenizer)     # fills each fork's cause
    write_turns(run, tokenizer)                  # turns.json + rows.json (rows, forks, drift, report)

Works offline from saved folders, including folders in the seed artefact's format (a trace without
purpose tags falls back to the seed's anchor: the system prompt of the first tool-enabled call).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .tokenizer import Tokenizer, decode_text, token_id

__all__ = [
    "Turn",
    "Row",
    "Fork",
    "TraceError",
    "has_tool_call",
    "load_trace",
    "load_turns",
    "derive_turns",
    "build_rows",
    "diagnose",
    "rollout_report",
    "run_report",
    "analyse",
    "RolloutTurns",
    "write_turns",
    "CAUSES",
    "rollout_model",
    "tokenizer_for_rollout",
]

CAUSES = (
    "template_rerender",
    "arguments_reserialised",
    "harness_rewrote_call",
    "reasoning_stripped",
    "bpe_boundary",
    "compaction",
    "history_rewritten",
    "other",
)


class TraceError(ValueError):
    """A trace or turns file is corrupt or truncated: names the file and the position."""


@dataclass
class Turn:
    """One agent call as training sees it (the seed's turns.json record, plus provenance)."""

    index: int  # position among agent turns
    call: int  # position in trace.json
    prompt_ids: list[int]
    output_ids: list[int]
    per_token_logps: list[float]
    trained: bool
    finish_reason: str | None = None
    tool_calls: list[str] = field(default_factory=list)

    @property
    def mask(self) -> list[int]:
        """0 for the context, 1 for the generated tokens: derived, never recorded."""
        return [0] * len(self.prompt_ids) + [1] * len(self.output_ids)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "call": self.call,
            "prompt_ids": self.prompt_ids,
            "output_ids": self.output_ids,
            "per_token_logps": self.per_token_logps,
            "trained": self.trained,
            "mask": self.mask,
            "finish_reason": self.finish_reason,
            "tool_calls": self.tool_calls,
        }


@dataclass
class Row:
    """One training sequence: chained turns. `mask` is 1 exactly on trained turns' sampled tokens."""

    input_ids: list[int]
    mask: list[int]
    logprobs: list[float]  # the generator's logprob on every sampled token, 0.0 on context
    sampled: list[int]  # 1 on every sampled token (trained or not)
    turns: list[int]  # turn indices in this row
    spans: list[tuple[int, int, int]]  # per turn: (start of its new context, start of output, end)

    @property
    def n_trained(self) -> int:
        return sum(self.mask)


@dataclass
class Fork:
    """Where a turn's prompt stopped extending the row before it."""

    turn: int  # the turn that could not chain
    prev_turn: int  # the last turn of the row it diverged from
    index: int  # first diverging token position (in both sequences)
    prev_prompt_len: int
    cause: str = "other"
    detail: str = ""
    left: str = ""  # decoded text around the divergence, the row's side
    right: str = ""  # ... and the new prompt's side

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def has_tool_call(call: dict[str, Any]) -> bool:
    """The seed's default `train_turn_fn`: reinforce turns where the model acted."""
    message = ((call.get("response") or {}).get("choices") or [{}])[0].get("message") or {}
    return bool(message.get("tool_calls"))


def _load_json(path: Path) -> Any:
    text = path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno} "
            f"(char {exc.pos} of {len(text)}): {exc.msg}"
        ) from None


def load_trace(path: Path) -> list[dict[str, Any]]:
    """trace.json: a list of calls. Clear errors for truncated or malformed files."""
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, list):
        raise TraceError(f"{path}: expected a JSON list of calls, got {type(data).__name__}")
    for i, call in enumerate(data):
        if not isinstance(call, dict):
            raise TraceError(f"{path}: call {i} is not an object")
        if call.get("status", "ok") == "ok" and "prompt_token_ids" in call:
            for key in ("completion_token_ids", "per_token_logps"):
                if not isinstance(call.get(key), (list, type(None))):
                    raise TraceError(f"{path}: call {i} has a malformed {key!r}")
            if call.get("per_token_logps") is not None and len(call["per_token_logps"]) != len(
                call["completion_token_ids"]
            ):
                raise TraceError(
                    f"{path}: call {i} has {len(call['per_token_logps'])} logprobs for "
                    f"{len(call['completion_token_ids'])} sampled tokens"
                )
    return data


def load_turns(path: Path) -> list[Turn]:
    """turns.json, ours or the seed artefact's (same fields; `mask` is re-derived and checked)."""
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, list):
        raise TraceError(f"{path}: expected a JSON list of turns")
    turns = []
    for i, t in enumerate(data):
        try:
            turn = Turn(
                index=t.get("index", i),
                call=t.get("call", i),
                prompt_ids=list(t["prompt_ids"]),
                output_ids=list(t["output_ids"]),
                per_token_logps=list(t["per_token_logps"]),
                trained=bool(t["trained"]),
                finish_reason=t.get("finish_reason"),
                tool_calls=list(t.get("tool_calls") or []),
            )
        except (KeyError, TypeError) as exc:
            raise TraceError(f"{path}: turn {i} lacks or mangles {exc}") from None
        if "mask" in t and list(t["mask"]) != turn.mask:
            raise TraceError(f"{path}: turn {i} has a mask that does not match its prompt/output lengths")
        turns.append(turn)
    return turns


def _system(call: dict[str, Any]) -> str:
    for m in (call.get("request") or {}).get("messages") or []:
        if m.get("role") == "system":
            return m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
    return ""


def _agent_calls(calls: list[dict[str, Any]]) -> list[int]:
    if any("purpose" in c for c in calls):
        return [
            i
            for i, c in enumerate(calls)
            if c.get("purpose") == "agent"
            and c.get("status", "ok") == "ok"
            and c.get("prompt_token_ids")
            and c.get("per_token_logps") is not None
        ]
    # A seed-format trace has no purpose tags: anchor on the first tool-enabled call's system prompt.
    anchor = next((_system(c) for c in calls if (c.get("request") or {}).get("tools")), None)
    return [
        i
        for i, c in enumerate(calls)
        if (c.get("request") or {}).get("tools")
        and _system(c) == anchor
        and c.get("prompt_token_ids")
        and c.get("per_token_logps") is not None
    ]


def derive_turns(
    calls: list[dict[str, Any]], train_turn_fn: Callable[[dict[str, Any]], bool] = has_tool_call
) -> tuple[list[Turn], dict[str, int]]:
    """Agent turns of a trace, and the excluded calls counted as ``{"title": 1, "upstream_error": 2, ...}``."""
    keep = _agent_calls(calls)
    excluded: Counter[str] = Counter()
    for i, c in enumerate(calls):
        if i not in keep:
            excluded[c.get("purpose", "untagged") if c.get("status", "ok") == "ok" else c.get("status", "?")] += 1
    turns = []
    for n, i in enumerate(keep):
        c = calls[i]
        message = ((c.get("response") or {}).get("choices") or [{}])[0].get("message") or {}
        turns.append(
            Turn(
                index=n,
                call=i,
                prompt_ids=list(c["prompt_token_ids"]),
                output_ids=list(c["completion_token_ids"]),
                per_token_logps=list(c["per_token_logps"]),
                trained=bool(train_turn_fn(c)),
                finish_reason=c.get("finish_reason"),
                tool_calls=[(tc.get("function") or {}).get("name", "?") for tc in message.get("tool_calls") or []],
            )
        )
    return turns, dict(excluded)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def build_rows(turns: list[Turn]) -> tuple[list[Row], list[Fork]]:
    """Chain turns into rows where the next prompt extends the row exactly; fork otherwise."""
    rows: list[Row] = []
    forks: list[Fork] = []
    row: Row | None = None
    prev: Turn | None = None
    for t in turns:
        if row is not None and t.prompt_ids[: len(row.input_ids)] == row.input_ids:
            start = len(row.input_ids)
            new_ctx = t.prompt_ids[start:]
        else:
            if row is not None and prev is not None:
                forks.append(
                    Fork(
                        turn=t.index,
                        prev_turn=prev.index,
                        index=_common_prefix(row.input_ids, t.prompt_ids),
                        prev_prompt_len=len(prev.prompt_ids),
                    )
                )
            row = Row([], [], [], [], [], [])
            rows.append(row)
            start, new_ctx = 0, t.prompt_ids
        out_start = start + len(new_ctx)
        row.input_ids += new_ctx + t.output_ids
        row.mask += [0] * len(new_ctx) + [int(t.trained)] * len(t.output_ids)
        row.logprobs += [0.0] * len(new_ctx) + list(t.per_token_logps)
        row.sampled += [0] * len(new_ctx) + [1] * len(t.output_ids)
        row.turns.append(t.index)
        row.spans.append((start, out_start, len(row.input_ids)))
        prev = t
    return rows, forks


# -- drift diagnosis ------------------------------------------------------------------------------

_TOOL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def _tool_blocks(text: str) -> list[tuple[str, Any]]:
    out = []
    for raw in _TOOL_BLOCK.findall(text):
        try:
            out.append((raw, json.loads(raw)))
        except ValueError:
            out.append((raw, None))
    return out


def diagnose(
    forks: list[Fork], turns: list[Turn], calls: list[dict[str, Any]], tokenizer: Tokenizer, context_tokens: int = 12
) -> list[Fork]:
    """Classify each fork's cause (see `CAUSES`) from the token ids, their text and the trace."""
    by_index = {t.index: t for t in turns}
    end_id = token_id(tokenizer, "<|im_end|>")
    for f in forks:
        prev, cur = by_index[f.prev_turn], by_index[f.turn]
        left_ids = prev.prompt_ids + prev.output_ids
        i = f.index
        f.left = decode_text(tokenizer, left_ids[max(0, i - context_tokens) : i + context_tokens])
        f.right = decode_text(tokenizer, cur.prompt_ids[max(0, i - context_tokens) : i + context_tokens])
        between = [c.get("purpose") for c in calls[prev.call + 1 : cur.call]]
        if i < f.prev_prompt_len:
            if "compaction" in between:
                f.cause, f.detail = "compaction", "the harness summarised the history between these turns"
            else:
                f.cause, f.detail = "history_rewritten", f"diverged at {i}, inside the earlier context"
            continue
        # The divergence is inside the model's own reply as the harness replayed it.
        start = f.prev_prompt_len
        rest = cur.prompt_ids[start:]
        replay = rest[: rest.index(end_id) + 1] if end_id in rest else rest
        sampled_text = decode_text(tokenizer, prev.output_ids, skip_special_tokens=False)
        replay_text = decode_text(tokenizer, replay, skip_special_tokens=False)
        call = calls[prev.call]
        message = ((call.get("response") or {}).get("choices") or [{}])[0].get("message") or {}
        s_blocks, r_blocks = _tool_blocks(sampled_text), _tool_blocks(replay_text)
        if sampled_text == replay_text:
            f.cause, f.detail = "bpe_boundary", "same text, different token split"
        elif (
            "<think>" in sampled_text or message.get("reasoning_content") or message.get("reasoning")
        ) and "<think>" not in replay_text:
            f.cause, f.detail = "reasoning_stripped", "the model's reasoning is missing from the replayed history"
        elif (
            s_blocks
            and r_blocks
            and [b[1].get("name") if isinstance(b[1], dict) else None for b in s_blocks]
            != [b[1].get("name") if isinstance(b[1], dict) else None for b in r_blocks]
        ):
            names = [b[1].get("name") if isinstance(b[1], dict) else "?" for b in r_blocks]
            f.cause, f.detail = "harness_rewrote_call", f"replayed as {names}"
        elif s_blocks and r_blocks and [b[0] for b in s_blocks] != [b[0] for b in r_blocks]:
            same = [b[1] for b in s_blocks] == [b[1] for b in r_blocks]
            f.cause = "arguments_reserialised"
            f.detail = "same JSON, re-serialised" if same else "tool-call JSON changed in the replay"
        elif "".join(sampled_text.split()) == "".join(replay_text.split()):
            f.cause, f.detail = "template_rerender", "the chat template re-rendered the reply's whitespace"
        elif s_blocks and not r_blocks or r_blocks and not s_blocks:
            f.cause, f.detail = "harness_rewrote_call", "a tool call appeared or vanished in the replay"
        else:
            f.cause, f.detail = "other", "the replayed reply differs from what was sampled"
    return forks


# -- files and reports ----------------------------------------------------------------------------


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
    calls: list[dict[str, Any]],
    tokenizer: Tokenizer | None = None,
    train_turn_fn: Callable[[dict[str, Any]], bool] = has_tool_call,
) -> RolloutTurns:
    """Turns, rows, forks (diagnosed when a tokenizer is given) and the report for one trace."""
    turns, excluded = derive_turns(calls, train_turn_fn)
    rows, forks = build_rows(turns)
    if tokenizer is not None:
        diagnose(forks, turns, calls, tokenizer)
    return RolloutTurns(turns, rows, forks, excluded, rollout_report(turns, rows, forks, excluded))


def write_turns(
    rollout_dir: Path, tokenizer: Any | None = None, train_turn_fn: Callable[[dict[str, Any]], bool] = has_tool_call
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


_SHIPPED_TOKENIZERS = Path(__file__).resolve().parent / "data" / "rollouts"


def rollout_model(rollout_dir: Path) -> str | None:
    """The model asset a rollout was captured with (its summary.json says), or None."""
    summary = Path(rollout_dir) / "summary.json"
    return json.loads(summary.read_text()).get("model") if summary.exists() else None


def tokenizer_for_rollout(rollout_dir: Path, model: str | None = None) -> Any:
    """The tokenizer of the model that produced a rollout's ids (`model`, else its summary.json's): the
    built asset, or the tokenizer shipped beside the example captures. Decoding a SmolLM2 trace with
    another tokenizer would silently mis-diagnose every fork, so an unknown model is an error."""
    from transformers import AutoTokenizer

    from .paths import assets_dir

    name = model or rollout_model(Path(rollout_dir))
    if not name:
        raise TraceError(f"{rollout_dir}: no summary.json naming the model; pass the model (e.g. --model smollm2)")
    for folder in (assets_dir() / name, _SHIPPED_TOKENIZERS / f"{name}-tokenizer"):
        if (folder / "tokenizer.json").exists():
            return AutoTokenizer.from_pretrained(folder)
    raise TraceError(f"no tokenizer for model {name!r}: build it (workbench assets build {name})")

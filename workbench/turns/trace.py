"""Trace -> turns: the agent calls of a captured trace, with the engine's own token ids.

A **turn** (`turns.json`, the seed artefact's format) is one agent call: the engine's ``prompt_ids``
(never re-tokenised), ``output_ids`` and ``per_token_logps`` as captured, ``trained`` (any token trained),
and ``mask`` (derived: 0 for the context, 1 for the generated tokens). Agent calls are selected by the
purpose tag recorded at capture; title/compaction/subagent/failed calls are excluded **and counted**.

**What is trained is a per-token mask, owned by its producer** (OpenEnv's `TrainingTurn.loss_mask` contract):
``output_mask`` has one 0/1 per sampled token, so a completion can be trained in part (a tail the harness
rewrote or the output cap cut, left out). Two producers: a mask the trace itself carries (``loss_mask``
over prompt + completion, e.g. an imported OpenEnv training trace: authoritative), else the turn policy
``train_turn_fn(call)``, which answers a bool (the whole turn: `has_tool_call`, the purpose filter's
``all``) or one 0/1 per sampled token. A whole-turn mask writes the seed's record byte for byte; a
partial one adds ``loss_mask`` (prompt zeros + ``output_mask``) to it.

    calls = load_trace(run / "trace.json")       # TraceError names the file and position if damaged
    turns, excluded = derive_turns(calls)        # excluded: {"title": 1, "upstream_error": 2, ...}
    turns = load_turns(run / "turns.json")       # ours or the seed's; the mask is re-derived and checked

A trace without purpose tags (the seed's format) falls back to the seed's anchor: the system prompt of
the first tool-enabled call. Rows (`workbench.turns.rows`) and the whole pipeline (`workbench.turns.derive`)
build on these.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = [
    "Turn",
    "MaskPolicy",
    "TraceError",
    "has_tool_call",
    "load_trace",
    "load_turns",
    "derive_turns",
    "output_mask",
]

# A mask policy (the turn policy): for one captured call, train the whole turn (True/False) or these sampled tokens (one 0/1 each).
MaskPolicy = Callable[[dict[str, Any]], bool | Sequence[int]]


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
    output_mask: list[int] = field(default_factory=list)  # 1 = train this sampled token; [] = all `trained`

    def __post_init__(self) -> None:
        if not self.output_mask:
            self.output_mask = [int(self.trained)] * len(self.output_ids)
        elif len(self.output_mask) != len(self.output_ids) or any(m not in (0, 1) for m in self.output_mask):
            raise ValueError(
                f"turn {self.index}: output_mask needs one 0/1 per sampled token "
                f"({len(self.output_ids)}), got {len(self.output_mask)} values"
            )
        if self.output_ids:  # an empty completion keeps the seed's recorded flag
            self.trained = any(self.output_mask)

    @property
    def mask(self) -> list[int]:
        """0 for the context, 1 for the generated tokens: derived, never recorded (the seed's field)."""
        return [0] * len(self.prompt_ids) + [1] * len(self.output_ids)

    @property
    def loss_mask(self) -> list[int]:
        """What is trained, over prompt + completion (OpenEnv's `TrainingTurn.loss_mask`)."""
        return [0] * len(self.prompt_ids) + self.output_mask

    @property
    def partial(self) -> bool:
        """Only some of the sampled tokens are trained."""
        return 0 < sum(self.output_mask) < len(self.output_mask)

    def to_json(self) -> dict[str, Any]:
        partial = {"loss_mask": self.loss_mask} if self.partial else {}  # whole-turn masks: the seed's bytes
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
            **partial,
        }


def has_tool_call(call: dict[str, Any]) -> bool:
    """The seed's default `train_turn_fn`: reinforce turns where the model acted."""
    message = ((call.get("response") or {}).get("choices") or [{}])[0].get("message") or {}
    return bool(message.get("tool_calls"))


def all_turns(call: dict[str, Any]) -> bool:
    """``train_turns="all"``: every agent turn is trained (module-level: TRL pickles what holds it)."""
    return True


def mask_policy(name: str) -> MaskPolicy:
    """TrainConfig.train_turns -> its mask policy: ``tool_calls`` (the seed's `has_tool_call`) or ``all``."""
    if name == "tool_calls":
        return has_tool_call
    if name == "all":
        return all_turns
    raise ValueError(f"train_turns must be 'tool_calls' or 'all', got {name!r}")


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
                output_mask=list(t["loss_mask"][len(t["prompt_ids"]) :]) if "loss_mask" in t else [],
            )
        except (KeyError, TypeError) as exc:
            raise TraceError(f"{path}: turn {i} lacks or mangles {exc}") from None
        except ValueError as exc:
            raise TraceError(f"{path}: turn {i}: loss_mask: {exc}") from None
        if "loss_mask" in t and (len(t["loss_mask"]) != len(turn.mask) or any(t["loss_mask"][: len(turn.prompt_ids)])):
            raise TraceError(f"{path}: turn {i}: loss_mask must cover prompt + completion with the prompt at 0")
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


def output_mask(call: dict[str, Any], train_turn_fn: MaskPolicy, index: int = 0) -> list[int]:
    """One 0/1 per sampled token of an agent call: the call's own ``loss_mask`` (its producer decided), else the
    turn policy's answer. ValueError naming the call when either does not fit the completion."""
    n_prompt, n_out = len(call["prompt_token_ids"]), len(call["completion_token_ids"])
    if call.get("loss_mask") is not None:
        full = list(call["loss_mask"])
        if len(full) != n_prompt + n_out or any(full[:n_prompt]) or any(m not in (0, 1) for m in full):
            raise ValueError(
                f"call {index}: loss_mask must be 0/1 over prompt + completion ({n_prompt} + {n_out}) "
                f"with the prompt at 0, got {len(full)} values"
            )
        return full[n_prompt:]
    got = train_turn_fn(call)
    if isinstance(got, bool):
        return [int(got)] * n_out
    mask = [int(m) for m in got]
    if len(mask) != n_out or any(m not in (0, 1) for m in mask):
        raise ValueError(f"call {index}: the turn policy gave {len(mask)} mask values for {n_out} sampled tokens")
    return mask


def derive_turns(
    calls: list[dict[str, Any]], train_turn_fn: MaskPolicy = has_tool_call
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
        mask = output_mask(c, train_turn_fn, i)
        turns.append(
            Turn(
                index=n,
                call=i,
                prompt_ids=list(c["prompt_token_ids"]),
                output_ids=list(c["completion_token_ids"]),
                per_token_logps=list(c["per_token_logps"]),
                trained=any(mask),
                finish_reason=c.get("finish_reason"),
                tool_calls=[(tc.get("function") or {}).get("name", "?") for tc in message.get("tool_calls") or []],
                output_mask=mask,
            )
        )
    return turns, dict(excluded)

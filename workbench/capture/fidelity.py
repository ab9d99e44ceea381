"""Dialect fidelity: did every block the harness sent reach the engine?

The proxy forwards every dialect to the engine as a chat request (OpenEnv's transforms). The record ↔ engine check
(`workbench.evaluate.certify_checks`, prompt ids == the engine's ``/tokenize`` of the recorded request) cannot see a
block the transform dropped, since the recorded request is the transformed one. So for each answered call the raw
request body (held until the call settles) is read block by block in its own dialect and matched, in order, against
the chat request that was forwarded:

- text (system, user, assistant), tool calls (name and arguments) and tool results must each be found: one missing
  is **dropped** (the model never saw it);
- several raw text blocks carried by one chat message are **merged** (OpenEnv joins an Anthropic message's or a
  system prompt's text blocks with a newline: a chat template has no block boundaries, so this is counted, not failed);
- a block found only *before* the place the previous one matched was **moved** (Claude Code sends its environment as
  a ``system``-role message after the user's; the transform puts it in the system prompt): counted;
- left out on purpose and counted: reasoning blocks (the proxy strips them), and Claude Code's per-request
  ``x-anthropic-billing-header`` line, which OpenEnv drops from the system prompt (its hash changes every request and
  would defeat the prefix cache); images are counted (the engine serves text only).

    fidelity(body, "anthropic", forwarded_messages)
    # {"raw": {"text": 4, ...}, "forwarded": {...}, "dropped": [], "merged": 2, "moved": 0, "stripped": 1, ...}
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

__all__ = ["fidelity", "raw_blocks", "forwarded_blocks"]

# OpenEnv's own rule (dialects/anthropic.py): the billing line leaves the system prompt before forwarding
_BILLING = re.compile(r"^\s*x-anthropic-billing-header:[^\n]*\n?", re.IGNORECASE)

Block = tuple[str, str, Any]  # (kind, role, content): text -> str, tool_use -> (name, args), tool_result -> str


def _text(content: Any) -> str:
    """A content value's text: a string, or the text of its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    return ""


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def raw_blocks(body: dict[str, Any], dialect: str) -> tuple[list[Block], Counter[str]]:
    """The blocks of a request as the harness sent it, in order, and the reasoning/image blocks set aside."""
    out: list[Block] = []
    aside: Counter[str] = Counter()

    def text(role: str, value: Any) -> None:
        if isinstance(value, str) and value.strip():
            out.append(("text", role, value))

    if dialect == "anthropic":
        system = body.get("system")
        for part in [system] if isinstance(system, str) else system or []:
            value = part if isinstance(part, str) else part.get("text")
            if isinstance(value, str) and _BILLING.match(value):
                aside["stripped"] += 1
                value = _BILLING.sub("", value)
            text("system", value)
        for m in body.get("messages") or []:
            role, content = m.get("role"), m.get("content")
            if isinstance(content, str):
                text(role, content)
                continue
            for b in content or []:
                kind = b.get("type")
                if kind == "text":
                    text(role, b.get("text"))
                elif kind == "tool_use":
                    out.append(("tool_use", "assistant", (b.get("name"), b.get("input"))))
                elif kind == "tool_result":
                    out.append(("tool_result", "tool", _text(b.get("content"))))
                elif kind in ("thinking", "redacted_thinking"):
                    aside["reasoning"] += 1
                elif kind == "image":
                    aside["images"] += 1
    elif dialect == "google":
        for part in (body.get("systemInstruction") or {}).get("parts") or []:
            text("system", part.get("text"))
        for c in body.get("contents") or []:
            role = "assistant" if c.get("role") == "model" else "user"
            for part in c.get("parts") or []:
                if "text" in part:
                    if part.get("thought"):
                        aside["reasoning"] += 1
                    else:
                        text(role, part["text"])
                elif "functionCall" in part:
                    call = part["functionCall"]
                    out.append(("tool_use", "assistant", (call.get("name"), call.get("args") or {})))
                elif "functionResponse" in part:
                    out.append(("tool_result", "tool", ""))
                elif "inlineData" in part or "fileData" in part:
                    aside["images"] += 1
    elif dialect == "responses":
        text("system", body.get("instructions"))
        items = body.get("input")
        for item in [{"type": "message", "role": "user", "content": items}] if isinstance(items, str) else items or []:
            kind = item.get("type", "message")
            if kind == "message":
                role = str(item.get("role") or "user")
                role = "system" if role == "developer" else role
                content = item.get("content")
                if isinstance(content, str):
                    text(role, content)
                for p in content if isinstance(content, list) else []:
                    if p.get("type") in ("input_text", "output_text", "text"):
                        text(role, p.get("text"))
                    elif p.get("type") == "input_image":
                        aside["images"] += 1
            elif kind == "function_call":
                out.append(("tool_use", "assistant", (item.get("name"), _args(item.get("arguments")))))
            elif kind == "function_call_output":
                out.append(("tool_result", "tool", _text(item.get("output"))))
            elif kind == "reasoning":
                aside["reasoning"] += 1
    else:  # chat: the harness's own messages
        out += forwarded_blocks(body.get("messages") or [])
    return out, aside


def forwarded_blocks(messages: list[dict[str, Any]]) -> list[Block]:
    """The blocks of the chat request forwarded to the engine, one text block a message."""
    out: list[Block] = []
    for m in messages:
        role, content = str(m.get("role") or ""), _text(m.get("content"))
        if role == "tool":
            out.append(("tool_result", "tool", content))
            continue
        if content.strip():
            out.append(("text", "system" if role == "developer" else role, content))
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            out.append(("tool_use", "assistant", (fn.get("name"), _args(fn.get("arguments")))))
    return out


def fidelity(body: dict[str, Any], dialect: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Each raw block matched, in order, against the forwarded ones (the module docstring says how)."""
    raw, aside = raw_blocks(body, dialect)
    fwd = forwarded_blocks(messages)
    dropped: list[str] = []
    merged = moved = 0
    at, last = 0, -1  # next forwarded block to look at; the one the previous raw block matched

    def matches(i: int, kind: str, role: str, content: Any) -> bool:
        f_kind, f_role, f_content = fwd[i]
        if f_kind != kind or (kind == "text" and f_role != role):
            return False
        if kind == "text":
            return bool(content.strip() in f_content)
        if kind == "tool_use":
            return bool((f_content[0], f_content[1]) == (content[0], content[1]))
        return not content.strip() or content.strip() in f_content

    for kind, role, content in raw:
        start = max(at - 1, 0) if kind == "text" else at
        found = next((i for i in range(start, len(fwd)) if matches(i, kind, role, content)), None)
        if found is None:
            earlier = next((i for i in range(start) if matches(i, kind, role, content)), None)
            if earlier is None:
                dropped.append(f"{kind} ({role}): {str(content)[:80]!r}")
            else:
                moved += 1  # there, but before what came ahead of it: the pointer stays
            continue
        merged += found == last
        last, at = found, found + 1
    return {
        "raw": dict(Counter(k for k, _, _ in raw)),
        "forwarded": dict(Counter(k for k, _, _ in fwd)),
        "dropped": dropped,
        "merged": merged,
        "moved": moved,
        "stripped": aside["stripped"],
        "reasoning": aside["reasoning"],
        "images": aside["images"],
    }

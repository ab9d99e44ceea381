"""Two rollouts side by side, turn by turn: where they first differ, in the prompt or in what was sampled.

    from workbench.evaluate import diff_rollouts, render_diff
    result = diff_rollouts(Path("runs/x/rollouts/easy-13__00"), Path("runs/y/rollouts/easy-13__00"), tokenizer)
    result["first_divergence"]     # {"turn": 0, "where": "output", "index": 17, "a_text": ..., "b_text": ...}
    HTML(render_diff(result))      # the same as a table, diverging tokens outlined
    workbench diff A B [--json] [--model smollm2] [--html out.html]    # the same (workbench.cli.diff)

Each folder is a rollout artefact (trace.json, summary.json, task.json). Per agent turn (the trace's
agent calls, as `workbench.turns.derive` derives them) the result holds both sides' call index, token counts,
finish reason and tool calls (name and arguments), and two comparisons on the engine's own ids:

- ``prompt``: the first diverging token (its index on each side), and every differing segment
  (difflib on the ids). A segment inside the sandbox's random folder name (``/tmp/wb-sbx-...``, which
  opencode's system prompt shows as the working directory) differs between any two rollouts and is
  marked ``volatile``; ``first_real`` is the first segment that is not. Volatile marking needs a tokenizer.
- ``output``: the first diverging sampled token, with both sides' ids and sampling logprobs.

``first_divergence`` is the first turn where anything other than a volatile segment differs (a prompt,
an output, or a turn only one side has); ``outcome`` compares status, reward and tests passed;
``identical`` means neither differs (the sandbox path aside).
With a tokenizer every divergence carries decoded text: ``context`` (8 tokens before), each side's
next 8 tokens, and per-token texts for the view.
"""

from __future__ import annotations

import difflib
import html
import json
import re
from pathlib import Path
from typing import Any, Sequence

from workbench.turns import Turn, derive_turns, load_trace, Tokenizer, decode_text
from workbench.views import STYLE, token_texts

__all__ = ["diff_rollouts", "render_diff", "VOLATILE"]

VOLATILE = re.compile(r"wb-sbx-[\w-]*$")  # context that ends inside a sandbox folder's random name
_WINDOW = 8  # tokens of context before a divergence and of each side after it


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _tool_calls(call: dict[str, Any]) -> list[dict[str, Any]]:
    message = ((call.get("response") or {}).get("choices") or [{}])[0].get("message") or {}
    out = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or {}
        args = fn.get("arguments")
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            parsed = args  # what the model wrote, unparsed
        out.append({"name": fn.get("name"), "arguments": parsed})
    return out


def _point(
    a: Sequence[int],
    b: Sequence[int],
    i: int,
    j: int,
    tokenizer: Tokenizer | None,
    a_lps: Sequence[float] | None = None,
    b_lps: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Divergence at a[i] / b[j]: ids (None past a side's end), logprobs, decoded text when possible."""
    p: dict[str, Any] = {
        "index": i,
        "index_b": j,
        "a_id": a[i] if i < len(a) else None,
        "b_id": b[j] if j < len(b) else None,
    }
    if a_lps is not None and b_lps is not None:
        p["a_logprob"] = a_lps[i] if i < len(a_lps) else None
        p["b_logprob"] = b_lps[j] if j < len(b_lps) else None
    if tokenizer is not None:
        lo = max(0, i - _WINDOW)

        def dec(ids: Sequence[int]) -> str:
            return decode_text(tokenizer, ids, skip_special_tokens=False)

        p.update(
            context=dec(a[lo:i]),
            a_text=dec(a[i : i + _WINDOW]),
            b_text=dec(b[j : j + _WINDOW]),
            window={
                "context": token_texts(tokenizer, a[lo:i]),
                "a": token_texts(tokenizer, a[i : i + _WINDOW]),
                "b": token_texts(tokenizer, b[j : j + _WINDOW]),
            },
        )
    return p


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int | None:
    n = min(len(a), len(b))
    k = next((i for i in range(n) if a[i] != b[i]), n)
    return None if k == n and len(a) == len(b) else k


def _segments(a: list[int], b: list[int], tokenizer: Tokenizer | None) -> list[dict[str, Any]]:
    segs = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        seg: dict[str, Any] = {"op": op, "a": [i1, i2], "b": [j1, j2], "volatile": False}
        if tokenizer is not None:
            before = decode_text(tokenizer, a[max(0, i1 - 12) : i1])
            ta, tb = decode_text(tokenizer, a[i1:i2]), decode_text(tokenizer, b[j1:j2])
            seg.update(
                a_text=ta,
                b_text=tb,
                volatile=bool(VOLATILE.search(before)) and all(re.fullmatch(r"[\w-]*", t) for t in (ta, tb)),
            )
        segs.append(seg)
    return segs


def _side(turn: Turn | None, calls: list[dict[str, Any]]) -> dict[str, Any] | None:
    if turn is None:
        return None
    call = calls[turn.call]
    return {
        "call": turn.call,
        "prompt_tokens": len(turn.prompt_ids),
        "output_tokens": len(turn.output_ids),
        "finish_reason": turn.finish_reason,
        "tool_calls": _tool_calls(call),
        "model": call.get("model"),
    }


def diff_rollouts(
    a: Path, b: Path, tokenizer: Tokenizer | None = None, *, names: tuple[str, str] | None = None
) -> dict[str, Any]:
    """Compare rollout folders `a` and `b` turn by turn (see the module docstring for the fields). `names`:
    what the view calls them (e.g. "base", "step 8 adapter"); by default the folders' names."""
    a, b = Path(a), Path(b)
    name_a, name_b = names or (a.name, b.name)
    calls = {"a": load_trace(a / "trace.json"), "b": load_trace(b / "trace.json")}
    turns = {k: derive_turns(v)[0] for k, v in calls.items()}
    summary = {"a": _json(a / "summary.json"), "b": _json(b / "summary.json")}
    task = {"a": _json(a / "task.json"), "b": _json(b / "task.json")}
    per_turn, first = [], None
    for i in range(max(len(turns["a"]), len(turns["b"]))):
        ta = turns["a"][i] if i < len(turns["a"]) else None
        tb = turns["b"][i] if i < len(turns["b"]) else None
        row: dict[str, Any] = {"turn": i, "a": _side(ta, calls["a"]), "b": _side(tb, calls["b"])}
        if ta is None or tb is None:
            row["only"] = "a" if tb is None else "b"
            first = first or {"turn": i, "where": "turn_count", "only": row["only"]}
            per_turn.append(row)
            continue
        k = _first_diff(ta.prompt_ids, tb.prompt_ids)
        segments = _segments(ta.prompt_ids, tb.prompt_ids, tokenizer) if k is not None else []
        real = next((s for s in segments if not s["volatile"]), None)
        row["prompt"] = {
            "same": k is None,
            "first": None if k is None else _point(ta.prompt_ids, tb.prompt_ids, k, k, tokenizer),
            "first_real": None
            if real is None
            else _point(ta.prompt_ids, tb.prompt_ids, real["a"][0], real["b"][0], tokenizer),
            "segments": segments,
            "volatile_only": k is not None and real is None,
        }
        o = _first_diff(ta.output_ids, tb.output_ids)
        row["output"] = {
            "same": o is None,
            "first": None
            if o is None
            else _point(ta.output_ids, tb.output_ids, o, o, tokenizer, ta.per_token_logps, tb.per_token_logps),
        }
        row["same_tool_calls"] = row["a"]["tool_calls"] == row["b"]["tool_calls"]
        if first is None and real is not None:
            first = {"turn": i, "where": "prompt", **row["prompt"]["first_real"]}
        elif first is None and o is not None:
            first = {"turn": i, "where": "output", **row["output"]["first"]}
        per_turn.append(row)

    def outcome(s: dict[str, Any]) -> dict[str, Any]:
        return {k: s.get(k) for k in ("status", "reward", "tests_passed", "tests_total", "solution_written")}

    out_a, out_b = outcome(summary["a"]), outcome(summary["b"])
    return {
        "a": {
            "name": name_a,
            "path": str(a),
            "task_id": task["a"].get("id") or summary["a"].get("task_id"),
            "model": summary["a"].get("model"),
            "turns": len(turns["a"]),
            "calls": len(calls["a"]),
            "outcome": out_a,
        },
        "b": {
            "name": name_b,
            "path": str(b),
            "task_id": task["b"].get("id") or summary["b"].get("task_id"),
            "model": summary["b"].get("model"),
            "turns": len(turns["b"]),
            "calls": len(calls["b"]),
            "outcome": out_b,
        },
        "same_task": (task["a"].get("id") or summary["a"].get("task_id"))
        == (task["b"].get("id") or summary["b"].get("task_id")),
        "same_outcome": out_a == out_b,
        "decoded": tokenizer is not None,
        "turns": per_turn,
        "first_divergence": first,
        "identical": first is None and out_a == out_b,
    }


# -- the view --------------------------------------------------------------------------------------


def _tokens(texts: Sequence[str], cls: str) -> str:
    return "".join(
        f'<span class="wb-tok {cls}" style="--a:0.5">{html.escape(t).replace(chr(10), "↵") or "∅"}</span>'
        for t in texts
    )


def _divergence(p: dict[str, Any] | None) -> str:
    if p is None:
        return "same"
    head = (
        f"a #{p['index']} (id {p['a_id']})"
        + (f" / b #{p['index_b']}" if p["index_b"] != p["index"] else "")
        + f" (id {p['b_id']})"
    )
    if "a_logprob" in p:
        head += f" · logprob a {p['a_logprob']} b {p['b_logprob']}"
    if "window" not in p:
        return html.escape(head)
    w = p["window"]
    ctx = _tokens(w["context"], "wb-ctx")
    return (
        f"{html.escape(head)}<div class='wb-tokens'>a: {ctx}{_tokens(w['a'][:1], 'wb-train wb-div')}"
        f"{_tokens(w['a'][1:], 'wb-untrained')}<br>b: {ctx}{_tokens(w['b'][:1], 'wb-train wb-div')}"
        f"{_tokens(w['b'][1:], 'wb-untrained')}</div>"
    )


def _calls(side: dict[str, Any] | None) -> str:
    if side is None:
        return "<i>no such turn</i>"
    tools = "<br>".join(html.escape(f"{t['name']}({json.dumps(t['arguments'])[:200]})") for t in side["tool_calls"])
    return (
        f"call {side['call']}: {side['prompt_tokens']} + {side['output_tokens']} tokens, {side['finish_reason']}<br>"
        + (tools or "<i>no tool call</i>")
    )


def render_diff(result: dict[str, Any]) -> str:
    """The diff as HTML (pure: the same string in a live notebook and headless)."""
    a, b = result["a"], result["b"]
    head = "".join(
        f"<tr><th>{k}</th><td>{html.escape(str(s.get('name', s['path'])))}</td>"
        f"<td>{html.escape(str(s['task_id']))}</td>"
        f"<td>{html.escape(str(s['model']))}</td><td>{html.escape(json.dumps(s['outcome']))}</td></tr>"
        for k, s in (("a", a), ("b", b))
    )
    f = result["first_divergence"]
    verdict = (
        "identical: no turn differs and the outcome is the same"
        if result["identical"]
        else "no turn differs (beyond the sandbox path), but the outcome does"
        if f is None
        else f"first divergence: turn {f['turn']}, {f['where']}" + (f", token #{f['index']}" if "index" in f else "")
    )
    rows = []
    for t in result["turns"]:
        prompt = t.get("prompt") or {}
        if prompt.get("volatile_only"):
            ptxt = f"same but the sandbox path ({len(prompt['segments'])} segments)"
        elif prompt:
            ptxt = _divergence(prompt["first_real"] or prompt["first"])
        else:
            ptxt = f"only in {t['only']}"
        otxt = _divergence((t.get("output") or {}).get("first")) if "output" in t else ""
        mark = ' style="background:#fef2f2"' if f is not None and f["turn"] == t["turn"] else ""
        rows.append(
            f"<tr{mark}><td>{t['turn']}</td><td>{ptxt}</td><td>{otxt}</td><td>{_calls(t['a'])}</td>"
            f"<td>{_calls(t['b'])}</td></tr>"
        )
    note = "" if result["same_task"] else "<div><b>different tasks</b>: prompts differ at the instruction</div>"
    return (
        f'{STYLE}<table class="wb-table"><tr><th></th><th>rollout</th><th>task</th><th>model</th><th>outcome</th></tr>'
        f"{head}</table>{note}<div><b>{html.escape(verdict)}</b></div>"
        '<table class="wb-table"><tr><th>turn</th><th>prompt</th><th>sampled output</th><th>a: call, tools</th>'
        f"<th>b: call, tools</th></tr>{''.join(rows)}</table>"
    )

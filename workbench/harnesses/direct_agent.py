"""The direct baseline's agent: the task asked as one chat completion, the code taken from the reply.

Standard library only: the `direct` baseline (`workbench.harnesses.direct`) writes this file into the sandbox
home and runs it there with the sandbox's ``python -I -S``, like any harness binary, so its one model call
goes through the same proxy (and is recorded with the engine's token ids) and its solution.py is graded by
the same hidden tests in the same jail as a harness's.

    python -I -S agent.py < prompt      # env: DIRECT_BASE_URL, DIRECT_API_KEY, DIRECT_MODEL, DIRECT_MAX_TOKENS,
                                        #      DIRECT_TIMEOUT_S

It prints one JSON line, ``{"type": "direct", "rule": ..., "wrote": ..., "finish_reason": ..., "error": ...}``.

The rule that takes the code from the reply (`extract_code`), first match wins:

1. ``fenced-def``: the first fenced block (```` ```python ````, ```` ```py ````, ```` ```python3 ```` or untagged)
   that parses as Python and defines a function or class;
2. ``fenced``: else the first such block that parses as Python;
3. ``reply``: else the whole reply, when it parses as Python and defines a function or class;
4. ``none``: else no solution.py is written (the hidden tests then fail: reward 0).

From code that defines something (rules 1 and 3) only the imports, definitions and top-level assignments are
kept (`sanitize`): a model often tries its function out below it (asserts, prints, a ``__main__`` block), and
that code would run, and may fail, when the hidden tests import solution.py. A block cut off by the output cap
(no closing fence) counts when what there is parses. This is what the usual HumanEval harnesses do with a chat
model's answer (evalplus's sanitiser: the code block, its definitions); the rule is applied before grading and
never sees the tests.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import urllib.error
import urllib.request

_FENCE = re.compile(r"[ \t]*```[ \t]*([\w+-]*)[ \t]*")  # a fence line: ``` and an optional language
_PYTHON = ("", "python", "py", "python3")


def _blocks(reply: str) -> list[tuple[str, str]]:
    """(language, text) of each fenced block, in order; a block the reply ends inside runs to the end."""
    blocks: list[tuple[str, str]] = []
    lang: str | None = None
    lines: list[str] = []
    for line in reply.splitlines():
        m = _FENCE.fullmatch(line)
        if lang is None and m:
            lang, lines = m.group(1).lower(), []
        elif lang is not None and m and not m.group(1):
            blocks.append((lang, "\n".join(lines)))
            lang = None
        elif lang is not None:
            lines.append(line)
    if lang is not None:
        blocks.append((lang, "\n".join(lines)))
    return blocks


def _parses(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def _defines(tree: ast.Module) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body)


# what a definition needs at import: the rest of a module's top level (asserts, prints, calls, a __main__ block,
# loops) is the model trying its code out, and it runs when the tests import solution.py
_KEEP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def sanitize(code: str, tree: ast.Module) -> str:
    """`code`'s imports, definitions and top-level assignments, in order, as written (decorators and comments
    inside them kept); every other top-level statement dropped."""
    lines = code.splitlines()
    kept = []
    for node in tree.body:
        if isinstance(node, _KEEP):
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.append("\n".join(lines[start - 1 : node.end_lineno]))
    return "\n\n".join(kept) + "\n"


def extract_code(reply: str) -> tuple[str | None, str]:
    """(code for solution.py or None, the rule that chose it: fenced-def, fenced, reply or none)."""
    parsed = [
        (text, tree)
        for lang, text in _blocks(reply)
        if lang in _PYTHON and text.strip() and (tree := _parses(text)) is not None
    ]
    for text, tree in parsed:
        if _defines(tree):
            return sanitize(text, tree), "fenced-def"
    if parsed:
        return parsed[0][0].rstrip() + "\n", "fenced"
    tree = _parses(reply)
    if tree is not None and _defines(tree):
        return sanitize(reply, tree), "reply"
    return None, "none"


def main() -> int:
    prompt = sys.stdin.read()
    env = os.environ
    messages = [{"role": "user", "content": prompt}]
    body = {"model": env["DIRECT_MODEL"], "messages": messages, "max_tokens": int(env["DIRECT_MAX_TOKENS"])}
    request = urllib.request.Request(
        env["DIRECT_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {env['DIRECT_API_KEY']}", "Content-Type": "application/json"},
    )
    out: dict[str, object] = {"type": "direct", "rule": "none", "wrote": False, "finish_reason": None, "error": None}
    try:
        with urllib.request.urlopen(request, timeout=float(env.get("DIRECT_TIMEOUT_S", "1800"))) as response:
            answer = json.load(response)
        choice = answer["choices"][0]
        reply = choice["message"].get("content") or ""
        out["finish_reason"] = choice.get("finish_reason")
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
        print(json.dumps(out), flush=True)
        return 1
    code, out["rule"] = extract_code(reply)
    if code is not None:
        with open("solution.py", "w", encoding="utf-8") as f:
            f.write(code)
        out["wrote"] = True
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

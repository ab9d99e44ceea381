"""The call runner: the one process of a function-call test that touches the solution's code.

The grader copies this file next to the workspace copy and runs it inside the jail as the sandbox
uid (``python -E -s -B runner.py ENTRY``, cwd = the copy). It loads ``solution.py`` **from its source
text** (never a ``solution/`` package beside it, never a ``__pycache__`` the agent left), finds the
entry point (or ``Solution().entry``, LeetCode style), says it is ready, then answers one JSON line
per request line: ``{"ok": true, "value": ...}`` or ``{"ok": false, "error": ...}``. Values cross the
pipe as tagged JSON (`encode`/`decode`: tuples, sets, dict keys, bytes and non-finite floats
survive; objects are refused, so no ``__eq__`` trick can pass). The solution's prints go to stderr
and its stdin reads EOF: stdout carries answers only.

The grader imports `encode`/`decode` from here too: one definition on both sides. Standard library
only (it runs with the solution's interpreter and nothing of ours).
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
import types
from typing import Any

__all__ = ["encode", "decode", "MAX_HASHED"]

# Sets and dicts a decoded value may hold in all: a set of n integers with one hash costs n^2 to
# build (Python's int hash is the value mod 2^61 - 1), and a solution once held the grader for ~44 s
# of CPU that way. 10,000 bounds that at ~0.3 s; lists are not hashed and are bounded by the output cap.
MAX_HASHED = 10_000


def encode(value: Any) -> Any:
    """A JSON form of a plain value that keeps its type (tuples, sets, dict keys, bytes, inf/nan are
    tagged); objects and subclasses are refused, so a value with a custom __eq__ (or a set whose
    __iter__ yields 200,000 colliding integers it never held) cannot cross."""
    kind = type(value)  # exact types: a subclass could iterate, compare or print as it likes
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if kind is list:
        return [encode(v) for v in value]
    if kind is tuple:
        return {"__tuple__": [encode(v) for v in value]}
    if kind in (set, frozenset):
        return {"__set__": [encode(v) for v in value]}
    if kind is dict:
        return {"__dict__": [[encode(k), encode(v)] for k, v in value.items()]}
    if kind is bytes:
        return {"__bytes__": value.hex()}
    raise TypeError(f"cannot pass a {kind.__name__} between processes")


def decode(data: Any, _budget: list[int] | None = None) -> Any:
    """Inverse of `encode`; builds only plain values, so it is safe on what a solution sends. Raises
    ValueError past `MAX_HASHED` set/dict members in all (RecursionError for absurd nesting)."""
    budget = [MAX_HASHED] if _budget is None else _budget
    if isinstance(data, list):
        return [decode(v, budget) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) != 1:
        raise ValueError("a tagged value has exactly one key")
    ((tag, body),) = data.items()
    if tag in ("__set__", "__dict__"):
        budget[0] -= len(body)
        if budget[0] < 0:
            raise ValueError(f"more than {MAX_HASHED} set or dict members to compare")
    if tag == "__tuple__":
        return tuple(decode(v, budget) for v in body)
    if tag == "__set__":
        return {decode(v, budget) for v in body}
    if tag == "__dict__":
        return {decode(k, budget): decode(v, budget) for k, v in body}
    if tag == "__bytes__":
        return bytes.fromhex(body)
    if tag == "__float__":
        return float(body)
    raise ValueError(f"unknown tag {tag!r}")


def _describe(exc: BaseException) -> str:
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.basename(frame.filename) == "solution.py":
            where = f" (solution.py line {frame.lineno})"
    return f"{type(exc).__name__}: {exc}"[:300] + where


def _load_solution(path: str) -> types.ModuleType:
    """solution.py compiled from its text: the graded code is exactly what the file says."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    module = types.ModuleType("solution")
    module.__file__ = path
    sys.modules["solution"] = module
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def _main() -> None:
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the solution reading stdin gets EOF, never our requests
    os.dup2(2, 1)  # its prints go to stderr: stdout carries answers only
    os.close(null)

    def answer(**message: Any) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    sys.set_int_max_str_digits(0)
    sys.path.insert(0, os.getcwd())  # helper modules beside solution.py import as they would there
    entry = sys.argv[1]
    try:
        module = _load_solution(os.path.join(os.getcwd(), "solution.py"))
    except BaseException as exc:
        answer(ok=False, error=_describe(exc))
        return
    fn = getattr(module, entry, None)
    if fn is None and isinstance(getattr(module, "Solution", None), type):
        fn = getattr(module.Solution(), entry, None)  # LeetCode style: a method of class Solution
    if not callable(fn):
        answer(ok=False, error=f"solution.py defines no function {entry!r}")
        return
    answer(ok=True)
    for line in requests:
        request = json.loads(line)
        try:
            value = fn(*decode(request["args"]), **decode(request["kwargs"]))
        except BaseException as exc:
            answer(ok=False, error=_describe(exc))
            continue
        try:
            answer(ok=True, value=encode(value))
        except (TypeError, ValueError, RecursionError) as exc:
            answer(ok=False, error=f"{entry} returned a value that cannot be compared: {exc}")


if __name__ == "__main__":
    _main()

"""The capture proxy's front door: which requests exist, whose key they carry, which bodies are sane.

Decided from the method, the path and the headers alone, before a byte of the body is read, so a
caller without a key costs the proxy nothing (an unauthenticated 28 MB body used to be read and
parsed before its 401). Pure functions; `workbench.capture.proxy` applies them.

- `route`: a closed list. Model calls are exactly the four wire dialects harnesses speak (`Dialect`):
  ``POST /v1/chat/completions``, ``POST /v1/responses``, Anthropic's ``POST /v1/messages`` and Google's
  ``POST /v1beta/models/{model}:generateContent`` / ``:streamGenerateContent``; their token-count side
  routes (``/v1/messages/count_tokens``, ``:countTokens``) are ``aux``: a session key, answered by
  OpenEnv without a model call and never recorded. Control routes are exactly OpenEnv's session routes
  plus ours; anything else is 404 and reaches nothing. (OpenEnv's catch-all also
  forwarded ``/sessions/../v1/chat/completions`` or ``/sessionsX/v1/...`` to the engine, which
  our recorder took for control traffic: served, never recorded.)
- `offered_key`: the one credential of a request; two (a repeated ``Authorization``, or one plus
  ``x-api-key``) is refused, since different readers would take different ones.
- `body_problem`: a model call's body must be a JSON object of the dialect's shape, nested at most
  `MAX_DEPTH` deep: ``{"messages": 5}`` or ten thousand nested lists is a 400 here, not a 500 (or a
  trace that can no longer be read) later.

    r = route("POST", "/v1/chat/completions")     # Route("model_call", "chat")
    key = offered_key(scope["headers"])            # str, None, or DUPLICATE
    problem = body_problem("chat", json.loads(body))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from workbench.harnesses import Dialect

__all__ = ["Route", "route", "offered_key", "DUPLICATE", "body_problem", "MAX_DEPTH"]

_MODEL_CALLS: Final[dict[str, Dialect]] = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/messages": "anthropic",
}
# Google puts the model and the method in the path; the SDK (@google/genai) calls /v1beta/..., /v1 also exists.
_GOOGLE = re.compile(
    r"/v1(beta)?/models/[A-Za-z0-9][A-Za-z0-9._\-]{0,127}:(generateContent|streamGenerateContent|countTokens)"
)  # a model name starts with a letter or digit: never "..", whatever a proxy in front would make of it
MAX_DEPTH: Final = 64  # opencode's deepest request nests ~8 levels (tool schemas)
DUPLICATE: Final = "\0duplicate"  # what `offered_key` returns for a request carrying two credentials

_SESSION = r"[A-Za-z0-9_\-]{1,128}"
_CONTROL = [
    ("POST", re.compile(r"/sessions")),
    ("GET", re.compile(r"/sessions")),
    ("GET", re.compile(rf"/sessions/{_SESSION}(/(rollout|trace_entries|trace))?")),
    ("DELETE", re.compile(rf"/sessions/{_SESSION}")),
    ("PUT", re.compile(r"/model")),
    ("GET", re.compile(r"/engine")),
]
_KEY_HEADERS = (b"authorization", b"x-api-key", b"x-goog-api-key")


@dataclass(frozen=True)
class Route:
    """What a request is: ``model_call`` (agent key, in `dialect`), ``aux`` (agent key: a dialect's
    token count, never recorded), ``models`` (agent key, GET /v1/models), ``control`` (admin key),
    ``health`` (open) or ``unknown`` (404)."""

    kind: Literal["model_call", "aux", "models", "control", "health", "unknown"]
    dialect: Dialect | None = None


def route(method: str, path: str) -> Route:
    if method == "POST" and path in _MODEL_CALLS:
        return Route("model_call", _MODEL_CALLS[path])
    if method == "POST" and path == "/v1/messages/count_tokens":
        return Route("aux", "anthropic")
    google = _GOOGLE.fullmatch(path) if method == "POST" else None
    if google is not None:
        return Route("aux" if google.group(2) == "countTokens" else "model_call", "google")
    if method == "GET" and path == "/v1/models":
        return Route("models")
    if method == "GET" and path == "/health":
        return Route("health")
    if any(method == m and pattern.fullmatch(path) for m, pattern in _CONTROL):
        return Route("control")
    return Route("unknown")


def offered_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The request's credential as OpenEnv reads it (``Bearer`` token, else ``x-api-key``), None when
    there is none, `DUPLICATE` when there are several."""
    found = [(name.lower(), value) for name, value in headers if name.lower() in _KEY_HEADERS]
    if len(found) > 1:
        return DUPLICATE
    if not found:
        return None
    name, value = found[0]
    text = value.decode("latin-1")
    if name == b"authorization":
        return text[7:].strip() if text.lower().startswith("bearer ") else None
    return text


def _depth(value: Any, limit: int | None = None) -> int:
    """How deeply `value` nests (iterative: the value may be far deeper than the recursion limit); with
    `limit`, counting stops at the first level past it (`limit` + 1 is returned then).

    Level by level, each level's containers in one list comprehension: opencode's 30 KB request took 88 us as a
    depth-first walk that pushed a tuple per value, 42 us so, on every model call's path before it is forwarded
    (benchmarks/README.md, proxy overhead)."""
    depth, level = 0, [value]
    while True:
        containers = [v for v in level if isinstance(v, (dict, list))]
        if not containers:
            return depth
        depth += 1
        if limit is not None and depth > limit:
            return depth
        level = [x for c in containers for x in (c.values() if isinstance(c, dict) else c)]


def _list_of_objects(value: Any, *, role: str | None = None) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, dict) and (role is None or isinstance(v.get(role), str)) for v in value)
    )


def body_problem(dialect: Dialect, body: Any) -> str | None:
    """Why a model call's parsed body, in `dialect`, cannot be served, or None when it can."""
    if not isinstance(body, dict):
        return "body must be a JSON object"
    if _depth(body, MAX_DEPTH) > MAX_DEPTH:
        return f"body nests deeper than {MAX_DEPTH} levels"
    if dialect in ("chat", "anthropic"):
        if not _list_of_objects(body.get("messages")):
            return "messages must be a non-empty list of objects"
        if not _list_of_objects(body["messages"], role="role"):
            return "every message must be an object with a string role"
    elif dialect == "google":
        if not _list_of_objects(body.get("contents")):
            return "contents must be a non-empty list of objects"
    else:
        items = body.get("input")
        if not isinstance(items, (str, list)) or (
            isinstance(items, list) and not all(isinstance(i, dict) for i in items)
        ):
            return "input must be a string or a list of objects"
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return "tools must be a list of objects"
    return None

"""Harness adapters: how to launch an unmodified coding agent headless, read its event stream, and
recognise its own bookkeeping calls (title generation, compaction, subagents).

A harness is one small class: `launch()` returns the command, environment, stdin and config files
for one rollout (pointed at the capture proxy with a per-rollout key), `parse_events()` reads what
it printed, and `classify()` tags each captured model call with its purpose. The capture proxy calls
`classify()` as each call lands, so bookkeeping calls are kept, tagged, and counted, never hidden.

    h = get_harness("opencode")
    launch = h.launch(base_url=proxy_url + "/v1", api_key=key, model="tiny", prompt=task.instruction,
                      options=HarnessOptions(max_output_tokens=512))
    sandbox.spawn(launch.argv, stdin=launch.stdin, env=launch.env)

Adding a harness: subclass `Harness` (`base.py`: the contract and its types) in a module of its own
in this package (see `opencode.py`) and add it to `HARNESSES` below. Nothing else changes: the proxy, rollouts, turns and the matrix
look harnesses up by name. See README, "Adding a harness".
"""

from __future__ import annotations

from .base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, json_events
from .codex import Codex
from .opencode import OpenCode
from .pi import Pi

__all__ = ["CallInfo", "HarnessOptions", "Launch", "HarnessRun", "Harness", "HARNESSES", "get_harness", "json_events"]

HARNESSES: dict[str, Harness] = {"opencode": OpenCode(), "pi": Pi(), "codex": Codex()}


def get_harness(name: str) -> Harness:
    try:
        return HARNESSES[name]
    except KeyError:
        raise ValueError(f"unknown harness {name!r}; available: {', '.join(HARNESSES)}") from None

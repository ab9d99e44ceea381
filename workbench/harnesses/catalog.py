"""Harness adapters: how to launch an unmodified coding agent headless, read its event stream, and
recognise its own bookkeeping calls (title generation, compaction, subagents).

A harness is one small class: `launch()` returns the command, environment, stdin and config files
for one rollout (pointed at the capture proxy with a per-rollout key), `parse_events()` reads what
it printed, and `classify()` tags each captured model call with its purpose. The capture proxy asks
`classify_call` (its default classifier, `workbench.harnesses.purpose.Classifier`) as each call
arrives and lands, so bookkeeping calls are kept, tagged, and counted, never hidden.

    h = get_harness("opencode")
    launch = h.launch(base_url=proxy_url + "/v1", api_key=key, model="tiny", prompt=task.instruction,
                      options=HarnessOptions(max_output_tokens=512))
    sandbox.spawn(launch.argv, stdin=launch.stdin, env=launch.env)

Adding a harness: subclass `Harness` (`base.py`: the contract and its types) in a module of its own
in this package (see `opencode.py`) and add it to `HARNESSES` below. Nothing else changes: the proxy, rollouts, turns and the matrix
look harnesses up by name. See docs/harnesses.md, "Adding a harness".
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.harnesses.aider import Aider
from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose, json_events
from workbench.harnesses.claude_code import ClaudeCode
from workbench.harnesses.cline import Cline
from workbench.harnesses.codex import Codex
from workbench.harnesses.continue_cli import ContinueCli
from workbench.harnesses.direct import Direct
from workbench.harnesses.gemini_cli import GeminiCli
from workbench.harnesses.grok_cli import GrokCli
from workbench.harnesses.hermes import Hermes
from workbench.harnesses.kilo import Kilo
from workbench.harnesses.mini_swe_agent import MiniSweAgent
from workbench.harnesses.opencode import OpenCode
from workbench.harnesses.pi import Pi
from workbench.harnesses.qwen_code import QwenCode

__all__ = [
    "CallInfo",
    "Purpose",
    "HarnessOptions",
    "Launch",
    "HarnessRun",
    "Harness",
    "HARNESSES",
    "get_harness",
    "classify_call",
    "DEFAULT_HARNESS",
    "REFUSED",
    "BASELINES",
    "json_events",
]

# A session that names no harness is opencode's (the rollout default, and OpenEnv's sessions minted
# without metadata).
DEFAULT_HARNESS = "opencode"

HARNESSES: dict[str, Harness] = {
    "opencode": OpenCode(),
    "pi": Pi(),
    "codex": Codex(),
    "kilo": Kilo(),
    "mini-swe-agent": MiniSweAgent(),
    "hermes": Hermes(),
    "gemini-cli": GeminiCli(),
    "qwen-code": QwenCode(),
    "claude-code": ClaudeCode(),
    "continue": ContinueCli(),
    "grok-cli": GrokCli(),
    "cline": Cline(),
    "aider": Aider(),
}

# Not harnesses but run like one, for comparison: the model asked directly (`direct.py`). Not in the matrix or
# certification, which cover harnesses people ship.
BASELINES: dict[str, Harness] = {"direct": Direct()}

# Harnesses people use that were tried and cannot run here, with the reason (docs/harnesses.md shows them).
REFUSED: dict[str, str] = {
    "crush": "npm @charmland/crush 0.96.1: its install script downloads the binary from github.com, and only the "
    "npm registry and PyPI are reachable here (ENOTFOUND github.com)",
    "mistral-vibe": "PyPI mistral-vibe: every release requires Python >= 3.12 (3.0 needs >= 3.14); this machine and "
    "CI have 3.11",
}


def get_harness(name: str) -> Harness:
    try:
        return HARNESSES[name] if name in HARNESSES else BASELINES[name]
    except KeyError:
        why = f" (it cannot run here: {REFUSED[name]})" if name in REFUSED else ""
        raise ValueError(f"unknown harness {name!r}{why}; available: {', '.join([*HARNESSES, *BASELINES])}") from None


def classify_call(
    harness: str | None, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]
) -> Purpose:
    """The capture proxy's default classifier (`workbench.harnesses.purpose.Classifier`): the named
    harness's own ``classify`` (`DEFAULT_HARNESS` when the session named none)."""
    return get_harness(harness or DEFAULT_HARNESS).classify(system=system, has_tools=has_tools, call=call, prior=prior)

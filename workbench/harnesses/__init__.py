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

Adding a harness: subclass `Harness` in a module of its own in this package (see `opencode.py`)
and add it to `HARNESSES` below. Nothing else changes: the proxy, rollouts, turns and the matrix
look harnesses up by name. See README, "Adding a harness".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ..paths import harness_bin

__all__ = ["CallInfo", "HarnessOptions", "Launch", "HarnessRun", "Harness", "HARNESSES", "get_harness"]


@dataclass(frozen=True)
class CallInfo:
    """What classification may know about a captured call (and about earlier ones)."""

    purpose: str
    harness_session: str | None  # the harness's own conversation id (opencode: x-session-id)
    system_digest: str | None    # hash of the system prompt


@dataclass(frozen=True)
class HarnessOptions:
    """Per-rollout knobs a harness honours.

    Attributes:
        max_output_tokens: per-call output budget the harness asks for (the proxy clamps it too).
        context_tokens: the context window the harness believes the model has (drives compaction).
        system_prompt: replaces the harness's own agent prompt (opencode: ``agent.build.prompt``);
            None keeps the harness as shipped. A short prompt cuts opencode's ~7.2k-token prompt.
        tools: restrict the agent to these tools; None keeps all.
        timeout_ms: provider request/first-byte/chunk timeouts; a queued CPU engine is slow.
    """

    max_output_tokens: int = 1024
    context_tokens: int = 16384
    system_prompt: str | None = None
    tools: tuple[str, ...] | None = None
    timeout_ms: int = 1_800_000


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    stdin: bytes
    files: dict[str, str] = field(default_factory=dict)  # relative to the sandbox home


@dataclass(frozen=True)
class HarnessRun:
    """What the harness itself reported (its event stream), for summaries and reward shaping."""

    steps: int
    tool_calls: dict[str, int]
    tool_failures: dict[str, int]
    errors: list[str]
    text: str
    events: int


class Harness(ABC):
    name: str = ""
    binary: str = ""
    dialect: str = "chat"  # "chat" (Chat Completions) or "responses"

    @abstractmethod
    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        """Command, env, stdin and config files for one headless rollout."""

    @abstractmethod
    def parse_events(self, stdout: str) -> HarnessRun:
        """Read the harness's own event stream (what it printed on stdout)."""

    @abstractmethod
    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: list[CallInfo]) -> str:
        """Purpose of a call: ``agent``, ``title``, ``compaction``, ``subagent`` or ``other``."""

    def bin(self) -> str:
        return str(harness_bin(self.binary))


from .opencode import OpenCode  # noqa: E402  (the subclasses need the base above)

HARNESSES: dict[str, Harness] = {"opencode": OpenCode()}


def get_harness(name: str) -> Harness:
    try:
        return HARNESSES[name]
    except KeyError:
        raise ValueError(f"unknown harness {name!r}; available: {', '.join(HARNESSES)}") from None

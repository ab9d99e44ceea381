"""The harness contract: what one harness adapter is (`Harness`) and the plain types it speaks.

A harness adapter launches an unmodified coding agent headless (`Launch`, from `HarnessOptions`),
reads what it printed (`HarnessRun`, usually via `json_events`), and tags its own model calls with a
`Purpose` (`classify`, from a `CallInfo` of the call and of the earlier ones). `CallInfo` and
`Purpose` are the capture proxy's question (`workbench.harnesses.purpose`), re-exported here. Subclasses live one per
module beside this one (`opencode.py`, `claude_code.py`, ...); the registry is `catalog.HARNESSES`.

    from .base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, json_events

    class MyHarness(Harness):
        name = binary = "mine"
        def launch(self, *, base_url, api_key, model, prompt, options): ...
        def parse_events(self, stdout, report=""): ...
        def classify(self, *, system, has_tools, call, prior): ...
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from workbench.harnesses.purpose import CallInfo, Dialect, Purpose
from workbench.paths import harness_bin
from workbench.tasks import WRITE_HINT

__all__ = ["CallInfo", "Purpose", "HarnessOptions", "Launch", "HarnessRun", "Harness", "json_events"]


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
        session_title: the session's title, given to the harness so it generates none (opencode's
            shipped ``run --title``: no "You are a title generator" call, which is never trained);
            None: as shipped. pi and codex make no title call and ignore it.
    """

    max_output_tokens: int = 1024
    context_tokens: int = 16384
    system_prompt: str | None = None
    tools: tuple[str, ...] | None = None
    timeout_ms: int = 1_800_000
    session_title: str | None = None


@dataclass(frozen=True)
class Launch:
    """How to start one rollout's harness: the command, its environment and stdin, and the config
    files written into the sandbox home before it starts.

    The task reaches the harness once: on `stdin` (opencode, pi, codex, ...), or, for a harness that takes it
    only as an argument, as one `argv` element (``--task=...``) with `stdin` empty. An `argv` element starting
    with ``~/`` is a path in the sandbox's HOME, expanded where the harness runs (as a shell would). `report`
    names a file under HOME in which the harness keeps its own record of the run (a trajectory, a usage report,
    a chat transcript); it is read once the harness has exited and given to `Harness.parse_events`.
    """

    argv: list[str]
    env: dict[str, str]
    stdin: bytes
    files: dict[str, str] = field(default_factory=dict)  # relative to the sandbox home
    report: str | None = None  # relative to the sandbox home


@dataclass(frozen=True)
class HarnessRun:
    """What the harness itself reported (its event stream), for summaries and reward shaping."""

    steps: int
    tool_calls: dict[str, int]
    tool_failures: dict[str, int]
    errors: list[str]
    text: str
    events: int


def json_events(stdout: str) -> list[dict]:
    """The JSON objects a harness printed one per line; other lines (banners, warnings) are skipped."""
    events = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


class Harness(ABC):
    """One harness adapter (stateless: one instance serves every rollout); see the module doc."""

    name: str = ""
    binary: str = ""
    dialect: Dialect = "chat"  # the wire dialect it speaks to the proxy (`workbench.harnesses.purpose`)
    # What the matrix and docs/harnesses.md show for it, one line each: where it comes from (registry, package,
    # pinned version), what running it headless here needed (flags, config files, env), what it cannot do here.
    package: str = ""
    needs: str = ""
    cannot: str = ""
    # It acts on what it reads in the reply's text (aider's file listings), not on tool calls: its own record of
    # what it did cannot be matched against the captured completions' tool calls (certify's harness_log check).
    acts_on_text: bool = False

    @abstractmethod
    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        """Command, env, stdin and config files for one headless rollout."""

    @abstractmethod
    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        """Read the harness's own account of the run: what it printed on stdout, and the text of its
        `Launch.report` file ("" when it names none or the harness wrote none)."""

    @abstractmethod
    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        """Purpose of a call: ``agent``, ``title``, ``compaction``, ``subagent`` or ``other``."""

    def bin(self) -> str:
        return str(harness_bin(self.binary))

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        """The two worked calls of a few-shot prompt as (tool, arguments), in this harness's own tool
        names and schema: write solution.py with hello() returning "hello", then check it. A small
        model copies them verbatim, so another harness's schema teaches it calls that fail. The
        default is opencode's."""
        return (
            ("write", {"filePath": "solution.py", "content": 'def hello():\n    return "hello"\n'}),
            ("bash", {"command": 'python -c "from solution import hello; print(hello())"'}),
        )

    def task_prompt(self, instruction: str) -> str:
        """The task's instruction as this harness's agent is given it: an instruction ending in the easy set's
        `WRITE_HINT` names this harness's own file-writing tool (`example_calls`' first: codex's exec_command), so
        an agent is never told to use a tool it does not have. Identical for opencode and pi."""
        if not instruction.endswith(WRITE_HINT):
            return instruction
        return f"{instruction[: -len(WRITE_HINT)]} Use the {self.example_calls()[0][0]} tool."

    def few_shot_prompt(self, instruction: str) -> str:
        """The instruction preceded by two worked turns written in ChatML, with `example_calls`.

        vLLM tokenises the literal ``<|im_start|>``/``<|im_end|>`` strings in the user message as the
        special tokens, so the model sees a conversation in which it already wrote ``solution.py``
        with the write tool and checked it, in the hermes format. Small models imitate it. Measured
        with SmolLM2-135M, opencode, the short agent prompt, T=0.3: 5/5 rollouts wrote solution.py
        via opencode's write tool; without the examples 0/6 made a tool call.
        """
        (write, write_args), (check, check_args) = self.example_calls()

        def block(name: str, args: dict[str, str]) -> str:
            # json.dumps' ", "/": " spacing is what the chat template's tojson re-renders
            return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"

        return (
            f'Create solution.py with a function hello() that returns "hello". Use the {write} tool.<|im_end|>\n'
            f"<|im_start|>assistant\n{block(write, write_args)}<|im_end|>\n"
            f"<|im_start|>user\nRun a quick check with the {check} tool.<|im_end|>\n"
            f"<|im_start|>assistant\n{block(check, check_args)}<|im_end|>\n"
            f"<|im_start|>user\n{instruction}"
        )

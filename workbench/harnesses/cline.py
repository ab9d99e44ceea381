"""Cline CLI (npm `cline`), run headless: `cline --json -- PROMPT`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose, json_events

__all__ = ["Cline"]

# the settings file is dropped whole (cline then falls back to its own "cline" provider) without this field
_UPDATED = "2026-01-01T00:00:00.000Z"
# Our generic tool names -> Cline's (its editor both creates and edits files)
_TOOLS: dict[str, tuple[str, ...]] = {
    "bash": ("run_commands",),
    "write": ("editor",),
    "edit": ("editor",),
    "read": ("read_files",),
    "grep": ("search_codebase",),
    "glob": ("search_codebase",),
}
_OWN_TOOLS: tuple[str, ...] = (
    "read_files",
    "search_codebase",
    "run_commands",
    "fetch_web_content",
    "editor",
    "ask_question",
)
_OWN_TOOLS += ("spawn_agent",)
# the compaction call (its "agentic" strategy): this system prompt, no tools, "Summarize this session ..."
COMPACTION_SYSTEM = "Summarize the provided coding session into a concise continuation note"


class Cline(Harness):
    """Cline CLI 3.0.65 (npm ``cline``, a compiled Bun binary): ``cline --json -- PROMPT`` (it takes the
    prompt only as an argument: after "--", one operand never read as an option).

    Provider: ``~/.cline/data/settings/providers.json``, the built-in ``openai-compatible`` provider with
    ``baseUrl`` (the proxy), model, ``maxTokens``, ``contextWindow`` and ``timeout``, and no ``apiKey``: it
    reads ``OPENAI_API_KEY`` (its ``apiKeyEnv``) from the environment. No ``-P``/``-m`` flags: with them cline
    re-saves the provider without its ``baseUrl`` and calls api.openai.com; and a provider entry without
    ``updatedAt`` makes it drop the file for its own account-backed ``cline`` provider. No ``-k`` (argv).
    ``~/.cline/data/settings/global-settings.json``: ``telemetryOptOut`` (else OpenTelemetry to
    otel.cline.bot and PostHog), ``autoUpdateEnabled: false``, ``disabledTools`` (fetch_web_content always:
    no network; `HarnessOptions.tools` the rest). ``CLINE_SESSION_BACKEND_MODE=local``: no background hub
    daemon (as shipped, the first run starts one and leaves it running). ``--json`` prints its events one
    JSON object a line (``agent_event``: iteration_start/end, content_start/end of text and tool, usage,
    error, done; ``hook_event``; ``run_result``), auto-approve is its default. A one-word prompt is taken
    for an unknown command (cline's own check; task prompts have spaces). `HarnessOptions.system_prompt`
    replaces its prompt (``-s``).

    Calls, as the harness ships: agent steps, streamed (system prompt "You are Cline, an AI coding agent",
    tools read_files/search_codebase/run_commands/editor/ask_question/spawn_agent and the team_* tools).
    Compaction ("agentic", when the context nears ``contextWindow``): system prompt "Summarize the provided
    coding session into a concise continuation note", no tools. Subagents: ``spawn_agent`` and
    ``team_spawn_teammate`` run an agent with the system prompt the model wrote, with tools (recognised by a
    system prompt other than the first agent call's). No title call (none in its bundle).
    """

    name = "cline"
    binary = "cline"
    provider = "openai-compatible"
    package = "npm cline 3.0.65"
    needs = (
        "`cline --json -- PROMPT` (it takes the prompt only as an argument); `~/.cline/data/settings/"
        "providers.json`: the openai-compatible provider with baseUrl, maxTokens, contextWindow, timeout, "
        "updatedAt, no key (`OPENAI_API_KEY` from env); `global-settings.json`: telemetryOptOut, autoUpdateEnabled "
        "false, disabledTools; `CLINE_SESSION_BACKEND_MODE=local` (no hub daemon)"
    )
    cannot = (
        "its Cline account provider, cloud sessions, hub daemon and kanban (no login, no network); "
        "fetch_web_content; the -P/-m flags (they drop the provider's base URL)"
    )

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        settings: dict[str, Any] = {
            "provider": self.provider,
            "model": model,
            "baseUrl": base_url,
            "maxTokens": options.max_output_tokens,
            "contextWindow": options.context_tokens,
            "timeout": options.timeout_ms,
        }
        providers = {
            "version": 1,
            "lastUsedProvider": self.provider,
            "modes": {},
            "providers": {self.provider: {"settings": settings, "updatedAt": _UPDATED, "tokenSource": "manual"}},
        }
        disabled = ["fetch_web_content"]
        if options.tools is not None:
            keep = {t for name in options.tools for t in _TOOLS.get(name, (name,))}
            disabled = [t for t in _OWN_TOOLS if t not in keep]
        global_settings = {"telemetryOptOut": True, "autoUpdateEnabled": False, "disabledTools": disabled}
        argv = [self.bin(), "--json"]
        if options.system_prompt is not None:
            argv += ["-s", options.system_prompt]
        argv += ["--", prompt]
        env = {"OPENAI_API_KEY": api_key, "CLINE_SESSION_BACKEND_MODE": "local"}
        files = {
            ".cline/data/settings/providers.json": json.dumps(providers, indent=1),
            ".cline/data/settings/global-settings.json": json.dumps(global_settings, indent=1),
        }
        return Launch(argv=argv, env=env, stdin=b"", files=files)

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        return (
            ("editor", {"command": "create", "path": "solution.py", "new_text": 'def hello():\n    return "hello"\n'}),
            ("run_commands", {"commands": 'python -c "from solution import hello; print(hello())"'}),
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        steps, errors, texts = 0, [], []
        tools: dict[str, int] = {}
        failures: dict[str, int] = {}
        events = json_events(stdout)
        for event in events:
            kind = event.get("type")
            inner = event.get("event") or {}
            if kind == "agent_event":
                ikind = inner.get("type")
                if ikind == "iteration_end":
                    steps += 1
                elif ikind == "content_end" and inner.get("contentType") == "tool":
                    tool = inner.get("toolName") or "?"
                    tools[tool] = tools.get(tool, 0) + 1
                    if inner.get("error") or (isinstance(inner.get("output"), dict) and inner["output"].get("error")):
                        failures[tool] = failures.get(tool, 0) + 1
                elif ikind == "content_end" and inner.get("contentType") == "text":
                    texts.append(inner.get("text") or "")
            elif kind == "run_result" and event.get("finishReason") == "error":
                errors.append(f"run_result: {event.get('text')}"[:500])
            elif kind == "error" and not errors:  # the CLI's last line repeats run_result's error
                errors.append(f"error: {event.get('message')}"[:500])
        return HarnessRun(
            steps=steps,
            tool_calls=tools,
            tool_failures=failures,
            errors=errors,
            text="\n".join(texts),
            events=len(events),
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        if system.startswith(COMPACTION_SYSTEM):
            return "compaction"
        if not has_tools:
            return "other"
        anchor = next((c for c in prior if c.purpose == "agent"), None)
        if anchor is None or call.system_digest == anchor.system_digest:
            return "agent"
        return "subagent"  # spawn_agent / team_spawn_teammate: the system prompt the model wrote

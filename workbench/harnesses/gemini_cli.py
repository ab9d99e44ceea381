"""Gemini CLI (npm `@google/gemini-cli`), run headless: `gemini --output-format stream-json`, prompt on stdin."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose, json_events

__all__ = ["GeminiCli"]

# Our generic tool names (opencode's) -> Gemini CLI's own.
TOOL_NAMES = {"bash": "run_shell_command", "write": "write_file", "read": "read_file", "edit": "replace"}
# tokenLimit() of every model name but Gemma's: 1,048,576. Compression fires at threshold * that.
TOKEN_LIMIT = 1_048_576
COMPRESSION_RATIO = 0.5  # DEFAULT_COMPRESSION_TOKEN_THRESHOLD: half the window, as shipped
# V8 reserves ~10 GiB of address space per Wasm memory (undici's llhttp, tree-sitter) for its trap
# handler: under the sandbox's RLIMIT_AS (32 GiB) gemini dies at start ("Cannot allocate Wasm memory").
NODE_OPTIONS = "--disable-wasm-trap-handler"


class GeminiCli(Harness):
    """Gemini CLI 0.61.0: ``gemini --output-format stream-json --approval-mode yolo -m MODEL -p ""``,
    prompt on stdin, Google generateContent (``POST /v1beta/models/MODEL:streamGenerateContent``).

    Pointed at the proxy's root with ``GOOGLE_GEMINI_BASE_URL`` (@google/genai appends ``/v1beta/...``)
    and ``GEMINI_API_KEY`` (sent as ``x-goog-api-key``, env only); auth type ``gemini-api-key`` in
    ``~/.gemini/settings.json``, with usage statistics (Clearcut), telemetry, auto-update, IDE mode and
    folder trust off. ``GEMINI_CLI_NO_RELAUNCH``: no second node process. Its own sandbox stays off.
    ``-p ""`` is headless mode with the prompt read from stdin (``-p`` is appended to stdin's text).
    The output budget is a ``modelConfigs.customOverrides`` entry for the model; ``tools.core``
    restricts the tools; ``GEMINI_SYSTEM_MD`` replaces the system prompt.

    Calls, as the harness ships, with an explicit ``--model`` (no "auto" routing, so no Task Routing
    classifier call): agent steps only (tools, "You are Gemini CLI, an autonomous CLI agent"; the first
    user message holds ``<session_context>`` and the prompt). No title call (the session-summary call
    summarises the *previous* session at interactive start; the sandbox home has none). The next-speaker
    check is off by default (``model.skipNextSpeakerCheck``). Compression ("distilling chat history into
    a structured XML <state_snapshot>", two calls: summary and verification) is set to fire at half of
    `HarnessOptions.context_tokens`, but in a ``-p`` run it cannot: history is split only at a user
    message that is not a function response, and the prompt is the only one (measured: 16k reported
    tokens, 5 steps, no compression). Side calls that can happen: the loop-detection check (after 30
    steps of one prompt; "You are a diagnostic agent that determines whether a conversational AI
    assistant is stuck"), edit correction (``replace`` not matching: "You are an expert code-editing
    assistant"), web_fetch/google_web_search calls (no tools), subagents (``invoke_agent``: tools,
    their own system prompt). The JSON ones (loop detection, edit correction, next speaker, routing)
    ask for ``responseMimeType: application/json`` + a schema; a proxy that refuses constrained
    decoding answers 400 and gemini treats the check as failed (no loop / no correction) and goes on.
    """

    name = "gemini-cli"
    binary = "gemini"
    dialect = "google"
    package = "npm @google/gemini-cli 0.61.0"
    needs = '`gemini --output-format stream-json --approval-mode yolo -p ""` (prompt on stdin); `GOOGLE_GEMINI_BASE_URL` = the proxy root, `GEMINI_API_KEY` (sent as x-goog-api-key); `~/.gemini/settings.json`: api-key auth, telemetry, usage statistics, auto-update, IDE mode, folder trust and its own sandbox off, `tools.core`; `NODE_OPTIONS=--disable-wasm-trap-handler` (WebAssembly reserves ~10 GiB of address space, over the sandbox\'s limit)'
    cannot = "chat compression in a -p run (history is split only at a user message that is not a tool result: the one prompt); its JSON side calls (loop detection, edit correction, next speaker) are refused under training sampling (constrained decoding) and it carries on without them; Google search and web fetch (no network)"

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        # @google/genai appends /v1beta/models/{model}:... to the base URL: the proxy's root, not its /v1
        root = base_url.rstrip("/").removesuffix("/v1")
        settings: dict[str, Any] = {
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            "privacy": {"usageStatisticsEnabled": False},  # no Clearcut logging, no installation-id header
            "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "ide": {"enabled": False},
            "tools": {"sandbox": False},  # the bwrap sandbox is the boundary
            "model": {"compressionThreshold": COMPRESSION_RATIO * options.context_tokens / TOKEN_LIMIT},
            "modelConfigs": {
                "customOverrides": [
                    {
                        "match": {"model": model},
                        "modelConfig": {"generateContentConfig": {"maxOutputTokens": options.max_output_tokens}},
                    }
                ]
            },
        }
        if options.tools is not None:
            settings["tools"]["core"] = [TOOL_NAMES.get(t, t) for t in options.tools]
        files = {".gemini/settings.json": json.dumps(settings, indent=1)}
        env = {
            "GEMINI_API_KEY": api_key,
            "GOOGLE_GEMINI_BASE_URL": root,
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "NODE_OPTIONS": NODE_OPTIONS,
        }
        if options.system_prompt is not None:
            files[".gemini/system.md"] = options.system_prompt
            env["GEMINI_SYSTEM_MD"] = "~/.gemini/system.md"
        # yolo: -p cannot answer approval prompts; the sandbox is the boundary
        argv = [self.bin(), "--output-format", "stream-json", "--approval-mode", "yolo", "--model", model, "-p", ""]
        return Launch(argv=argv, env=env, stdin=prompt.encode(), files=files)

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        return (
            ("write_file", {"file_path": "solution.py", "content": 'def hello():\n    return "hello"\n'}),
            ("run_shell_command", {"command": 'python -c "from solution import hello; print(hello())"'}),
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        # stream-json reports messages and tools, not model calls: a step is a run of assistant text
        # and tool_use events, ended by the tool results that follow it
        steps, errors, texts = 0, [], []
        tools: dict[str, int] = {}
        failures: dict[str, int] = {}
        names: dict[str, str] = {}
        in_step = False
        events = json_events(stdout)
        for event in events:
            kind = event.get("type")
            if kind == "tool_use" or (kind == "message" and event.get("role") == "assistant"):
                if not in_step:
                    steps, in_step = steps + 1, True
                if kind == "message":
                    texts.append(event.get("content") or "")
                else:
                    tool = event.get("tool_name") or "?"
                    names[event.get("tool_id") or ""] = tool
                    tools[tool] = tools.get(tool, 0) + 1
            elif kind == "tool_result":
                in_step = False
                if event.get("status") == "error":
                    tool = names.get(event.get("tool_id") or "", "?")
                    failures[tool] = failures.get(tool, 0) + 1
            elif kind == "error" and event.get("severity") == "error":
                errors.append(f"error: {event.get('message')}"[:500])
            elif kind == "result" and event.get("status") == "error":
                errors.append(f"result: {json.dumps(event.get('error'))}"[:500])
        return HarnessRun(
            steps=steps,
            tool_calls=tools,
            tool_failures=failures,
            errors=errors,
            text="".join(texts),
            events=len(events),
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        head = system.lstrip()[:200]
        if "distilling chat history into a structured XML <state_snapshot>" in head:
            return "compaction"  # ChatCompressionService: the summary and its verification
        if call.last_user.startswith("Summarize the user's primary intent or goal in this conversation"):
            return "title"  # SessionSummaryService (a previous session's summary)
        if not has_tools:
            # loop detection, next speaker, Task Routing classifier, edit correction, web fetch/search
            return "other"
        anchor = next((c for c in prior if c.purpose == "agent"), None)
        if anchor is None:
            return "agent"
        # invoke_agent subagents (codebase_investigator, generalist, ...) have their own system prompt
        return "agent" if call.system_digest == anchor.system_digest else "subagent"

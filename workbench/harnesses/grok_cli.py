"""Grok CLI (npm `@vibe-kit/grok-cli`), run headless: `grok --prompt=PROMPT`."""

from __future__ import annotations

from collections.abc import Sequence

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose, json_events

__all__ = ["GrokCli"]

# Headless grok prints each tool result's text, not whether the tool succeeded: a failure is recognised by
# the error texts its tools return (dist/tools/*.js, GrokAgent.executeTool), which no success text starts with.
_TOOL_ERRORS = (
    "Command failed: ",
    "Command execution cancelled",
    "Cannot change directory: ",
    "File not found: ",
    "File or directory not found: ",
    "String not found in file",
    "Error viewing ",
    "Error replacing ",
    "Error creating ",
    "Error inserting ",
    "Error undoing ",
    "No edits to undo",
    "Invalid start line: ",
    "Invalid end line: ",
    "Search error: ",
    "Each todo must have",
    "Invalid status: ",
    "Invalid priority: ",
    "Todo with id ",
    "Error creating todo list: ",
    "Error updating todo list: ",
    "Unknown tool: ",
    "Tool execution error: ",
    "Morph Fast Apply not available",
)
# what GrokAgent.processUserMessage answers for a failed model call (it exits 0), and index.js on a crash (exit 1)
_FAILED = ("Sorry, I encountered an error: ", "Error: ")


class GrokCli(Harness):
    """Grok CLI 0.0.34 (npm ``@vibe-kit/grok-cli``): ``grok -m MODEL --prompt=PROMPT`` (it takes
    the prompt only as an argument).

    ``GROK_BASE_URL`` (the proxy; not ``--base-url``, which grok writes into ``~/.grok/user-settings.json``) and
    ``GROK_API_KEY`` (not ``--api-key``, same), ``GROK_MAX_TOKENS`` (the output budget; its default is 1536).
    Headless mode approves every tool itself (``allOperations``) and prints the new conversation as chat
    messages, one JSON object a line: the user's, each assistant reply (with its ``tool_calls``), each
    tool result (``role: tool``, its text only: `_TOOL_ERRORS` tells failures apart). A failed model call
    is an assistant message "Sorry, I encountered an error: ..." and exit 0. Its system prompt cannot be
    replaced: `HarnessOptions.system_prompt` goes to ``~/.grok/GROK.md``, which grok inserts as "CUSTOM
    INSTRUCTIONS" (a ``.grok/GROK.md`` in the workspace would win). It has no tool selection, no context
    window (it never compacts) and a fixed 360 s request timeout (the OpenAI SDK's, two retries).

    Calls, as the harness ships: agent steps only, unstreamed (headless uses ``processUserMessage``, not the
    TUI's stream), tools view_file/create_file/str_replace_editor/bash/search/create_todo_list/update_todo_list,
    system prompt "You are Grok CLI", ``search_parameters: {"mode": "off"}`` (xAI's live search; "auto" only
    for a model named grok* asked about news). No title, compaction or subagent call; its one bookkeeping
    call, the commit message of ``grok git commit-and-push``, is never made by ``--prompt``. No telemetry
    and no update check in its code; MCP servers only from a settings file we do not write.
    """

    name = "grok-cli"
    binary = "grok"
    package = "npm @vibe-kit/grok-cli 0.0.34"
    needs = (
        "`grok -m MODEL --prompt=PROMPT` (it takes the prompt only as an argument)"
        "; `GROK_BASE_URL`, `GROK_API_KEY`, `GROK_MAX_TOKENS`; `~/.grok/GROK.md` for our system prompt"
    )
    cannot = (
        "replace its system prompt (ours is added as custom instructions); restrict its tools; set its request "
        "timeout (360 s) or context window (it never compacts); xAI live search; Morph edit_file (no MORPH_API_KEY)"
    )

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        env = {
            "GROK_BASE_URL": base_url,
            "GROK_API_KEY": api_key,
            "GROK_MODEL": model,
            "GROK_MAX_TOKENS": str(options.max_output_tokens),
        }
        files = {}
        if options.system_prompt is not None:
            files[".grok/GROK.md"] = options.system_prompt
        # it takes the prompt only as an argument: one ``--prompt=``, never re-read as an option (it may start with -)
        argv = [self.bin(), "-m", model, f"--prompt={prompt}"]
        return Launch(argv=argv, env=env, stdin=b"", files=files)

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        return (
            ("create_file", {"path": "solution.py", "content": 'def hello():\n    return "hello"\n'}),
            ("bash", {"command": 'python -c "from solution import hello; print(hello())"'}),
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        steps, errors, texts = 0, [], []
        tools: dict[str, int] = {}
        failures: dict[str, int] = {}
        names: dict[str, str] = {}  # tool_call_id -> tool name
        events = json_events(stdout)
        for event in events:
            role = event.get("role")
            raw = event.get("content")
            content = raw if isinstance(raw, str) else ""
            if role == "assistant":
                if content.startswith(_FAILED):
                    errors.append(content[:500])
                    continue
                steps += 1
                for call in event.get("tool_calls") or []:
                    tool = (call.get("function") or {}).get("name") or "?"
                    names[call.get("id") or ""] = tool
                    tools[tool] = tools.get(tool, 0) + 1
                if not event.get("tool_calls") and content:
                    texts.append(content)
            elif role == "tool" and content.startswith(_TOOL_ERRORS):
                tool = names.get(event.get("tool_call_id") or "", "?")
                failures[tool] = failures.get(tool, 0) + 1
        return HarnessRun(
            steps=steps,
            tool_calls=tools,
            tool_failures=failures,
            errors=errors,
            text="\n".join(texts),
            events=len(events),
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        # every call of a --prompt run is an agent step, all with tools; anything else is not one of its own
        return "agent" if has_tools else "other"

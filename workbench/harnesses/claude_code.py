"""Claude Code (npm `@anthropic-ai/claude-code`), run headless: `claude -p --output-format stream-json`, Anthropic Messages."""

from __future__ import annotations

from collections.abc import Sequence

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose, json_events

__all__ = ["ClaudeCode"]

# Other harnesses' generic tool names as Claude Code calls its own; any other name is passed as given.
_TOOL_NAMES = {
    "bash": "Bash",
    "write": "Write",
    "read": "Read",
    "edit": "Edit",
    "glob": "Glob",
    "grep": "Grep",
    "task": "Agent",
    "webfetch": "WebFetch",
    "websearch": "WebSearch",
    "todowrite": "TodoWrite",
}

# Side queries Claude Code makes with a system prompt of their own (strings from its bundle, 2.1.332).
_TITLE = "You are naming a coding session"  # querySource "generate_session_title"
_COMPACT_SYSTEM = "You are a helpful AI assistant tasked with summarizing conversations"  # compaction's fallback
_COMPACT_REQUEST = "Your task is to create a detailed summary of"  # the compaction request, as the last user message
_OTHER = (
    "Write a short summary label describing what these tool calls accomplished",  # tool_use_summary_generation
)


class ClaudeCode(Harness):
    """Claude Code 2.1.332: ``claude -p --output-format stream-json --verbose``, prompt on stdin, Anthropic Messages.

    ``ANTHROPIC_BASE_URL`` is the proxy itself (Claude Code appends ``/v1/messages``, with ``?beta=true``) and the
    key is ``ANTHROPIC_API_KEY`` alone, so each request carries one credential (``x-api-key``). Every model alias
    (haiku/sonnet/opus, the small/fast model, subagents) is the served model, so no call leaves for another name.
    ``--dangerously-skip-permissions``: the sandbox is the boundary, ``-p`` cannot answer prompts; it refuses as
    root unless ``IS_SANDBOX=1``, which is set (the sandbox runs it as a fresh uid anyway). Offline:
    ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` (without it a ``HEAD /api/hello`` preflight reaches the proxy),
    no telemetry, error reporting, auto-update or feedback survey; ``-p`` skips onboarding and the trust dialog,
    so no config file is written. `HarnessOptions.context_tokens` has no knob: its auto-compact window cannot be
    set below 100k tokens.

    Calls, as the harness ships (measured through the proxy: every one streamed, none on another route): agent
    steps (tools Agent, Bash, Edit, Read, Write, ...; system prompt "You are a Claude agent, built on Anthropic's
    Claude Agent SDK", then the agent's own text). Agent-tool subagents: tools, their own system prompt ("You are
    an agent for Claude Code, ..." for general-purpose), launched in the background, so their calls interleave
    with the agent's; told apart by system prompt (it sends no ``x-session-id``). Compaction near the context
    limit: the agent's system prompt and "Your task is to create a detailed summary of ..." as the last user
    message, or "You are a helpful AI assistant tasked with summarizing conversations". Title ("You are naming
    a coding session") and tool-use labels ("Write a short summary label ...") are interactive/SDK-app side
    queries that ``-p`` did not make; they are tagged if they come. No quota, topic or warm-up call was seen.
    """

    name = "claude-code"
    binary = "claude"
    dialect = "anthropic"
    package = "npm @anthropic-ai/claude-code 2.1.332"
    needs = "`claude -p --output-format stream-json --verbose --dangerously-skip-permissions --no-session-persistence` (prompt on stdin); `ANTHROPIC_BASE_URL` = the proxy root, `ANTHROPIC_API_KEY` only (one x-api-key header), every model name (small/fast, haiku/sonnet/opus, subagent) set to the served one; `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`, `DISABLE_TELEMETRY`, `DISABLE_ERROR_REPORTING`, `DISABLE_AUTOUPDATER`; `IS_SANDBOX=1` (it refuses the permission bypass as root otherwise)"
    cannot = "compaction below a 100k-token window (no setting goes lower: a 16k engine refuses the prompt first); web search and fetch (no network); it makes no title call in -p mode"

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        # the others are given <proxy>/v1; the Anthropic SDK adds /v1/messages to its base URL itself
        root = base_url.rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        timeout = str(options.timeout_ms)
        env = {
            "ANTHROPIC_BASE_URL": root,
            "ANTHROPIC_API_KEY": api_key,  # x-api-key only: no ANTHROPIC_AUTH_TOKEN (a second header is a 400)
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "CLAUDE_CODE_SUBAGENT_MODEL": model,
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(options.max_output_tokens),
            # a queued CPU engine can take minutes to answer, and longer to its first byte
            "API_TIMEOUT_MS": timeout,
            "CLAUDE_STREAM_FIRST_BYTE_TIMEOUT_MS": timeout,
            "CLAUDE_STREAM_IDLE_TIMEOUT_MS": timeout,
            # offline: nothing but model calls, and only to the proxy
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
            "DISABLE_COST_WARNINGS": "1",
            "IS_SANDBOX": "1",  # it is one; lets --dangerously-skip-permissions run if the uid is 0
        }
        argv = [
            self.bin(),
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",  # stream-json with -p requires it
            "--model",
            model,
            # the sandbox session is the boundary, as for the other harnesses: -p cannot answer prompts
            "--dangerously-skip-permissions",
            "--no-session-persistence",
        ]
        if options.system_prompt is not None:
            argv += ["--system-prompt", options.system_prompt]
        if options.tools is not None:
            argv += ["--tools", ",".join(_TOOL_NAMES.get(t, t) for t in options.tools)]
        # stdin, not argv: a positional prompt would be read as an option if it began with "-"
        return Launch(argv=argv, env=env, stdin=prompt.encode())

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        return (
            ("Write", {"file_path": "solution.py", "content": 'def hello():\n    return "hello"\n'}),
            ("Bash", {"command": 'python -c "from solution import hello; print(hello())"'}),
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        steps, errors, texts = 0, [], []
        tools: dict[str, int] = {}
        failures: dict[str, int] = {}
        names: dict[str, str] = {}  # tool_use id -> tool name, for the results
        seen: set[str] = set()
        events = json_events(stdout)
        for event in events:
            kind = event.get("type")
            message = event.get("message") or {}
            content = message.get("content")
            blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
            if kind == "assistant":
                # A subagent's turns carry the Agent call's id (parent_tool_use_id): its tool calls count, its
                # turns and text are not the agent's. The blocks of one turn may come as several events, one id.
                top = not event.get("parent_tool_use_id")
                mid = message.get("id") or f"#{len(seen)}"
                if top and mid not in seen:
                    seen.add(mid)
                    steps += 1
                for b in blocks:
                    if b.get("type") == "tool_use":
                        tool = b.get("name") or "?"
                        names[b.get("id") or ""] = tool
                        tools[tool] = tools.get(tool, 0) + 1
                    elif b.get("type") == "text" and top:
                        texts.append(b.get("text") or "")
                if event.get("error"):
                    errors.append(f"assistant: {event['error']}"[:500])
            elif kind == "user":
                for b in blocks:
                    if b.get("type") == "tool_result" and b.get("is_error"):
                        tool = names.get(b.get("tool_use_id") or "", "?")
                        failures[tool] = failures.get(tool, 0) + 1
            elif kind == "result" and (event.get("is_error") or event.get("subtype") != "success"):
                detail = event.get("result") or "; ".join(map(str, event.get("errors") or [])) or "?"
                errors.append(f"{event.get('subtype') or 'error'}: {detail}"[:500])
        return HarnessRun(
            steps=steps,
            tool_calls=tools,
            tool_failures=failures,
            errors=errors,
            text="\n".join(texts),
            events=len(events),
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        # side queries' prompts follow the identity line ("You are a Claude agent, built on ..."): not a prefix
        if _COMPACT_REQUEST in call.last_user or _COMPACT_SYSTEM in system:
            return "compaction"
        if _TITLE in system:
            return "title"
        if not has_tools or any(s in system for s in _OTHER):
            return "other"
        anchor = next((c for c in prior if c.purpose == "agent"), None)
        if anchor is None:
            return "agent"
        return "agent" if call.system_digest == anchor.system_digest else "subagent"

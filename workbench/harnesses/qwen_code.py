"""Qwen Code (npm `@qwen-code/qwen-code`), run headless: `qwen --output-format stream-json`, prompt on stdin."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose, json_events

__all__ = ["QwenCode"]

# Our generic tool names (opencode's) -> Qwen Code's own (its edit tool is "edit", not Gemini's "replace").
TOOL_NAMES = {"bash": "run_shell_command", "write": "write_file", "read": "read_file", "edit": "edit"}
# Tools outside the `tools.core` allowlist's reach (it filters only "core" tools): excluded by name instead,
# all of 0.24.4's headless tools but the core ones (its stream-json init event lists them).
NON_CORE_TOOLS = (
    "agent",
    "list_agents",
    "send_message",
    "skill",
    "get_goal",
    "update_goal",
    "tool_call",
    "tool_search",
    "report_findings",
    "enter_worktree",
    "exit_worktree",
    "record_artifact",
    "task_stop",
)
# Its side queries' system prompts (runSideQuery purposes), when they are not agent steps.
_TITLES = ("Generate a concise, sentence-case title", "You generate session recaps for a programming assistant")
_OTHERS = (
    "Write a short summary label describing what these tool calls accomplished",  # tool-use-summary
    "You are an independent Goal Verifier",  # goal-verifier
    # managed auto-memory, on as shipped: after a turn it extracts memories in the background (tools, its own
    # system prompt; seen in the matrix on the tiny model), saves one, or mines the conversation for skills
    "You are now acting as the managed memory extraction subagent",
    "You are saving one explicit durable memory",
    "You are reviewing this conversation to extract reusable skills",
)


class QwenCode(Harness):
    """Qwen Code 0.24.4: ``qwen --output-format stream-json --approval-mode yolo --auth-type openai -m MODEL``,
    prompt on stdin, Chat Completions (a Gemini CLI fork).

    Pointed at the proxy with ``OPENAI_BASE_URL``/``OPENAI_API_KEY``/``OPENAI_MODEL`` (env only; the key
    as ``Authorization: Bearer``) and auth type ``openai``; ``~/.qwen/settings.json`` turns usage
    statistics, telemetry, auto-update and IDE mode off and sets ``model.generationConfig``:
    ``contextWindowSize`` (drives compaction), ``timeout`` and ``samplingParams.max_tokens``. Its own
    sandbox stays off. ``tools.core`` restricts the core tools, ``tools.exclude`` drops the others
    (subagents, skills, goals, deferred-tool search); ``QWEN_SYSTEM_MD`` replaces the system prompt.
    ``write_file`` wants an absolute path (a relative one fails: "File path must be absolute"), so the
    worked examples write ``/app/solution.py`` (the sandbox's workspace).

    Calls, as the harness ships: agent steps (tools, "You are Qwen Code, a non-interactive CLI
    agent"). No title call (session title and tool-use summaries need a configured fast model; none
    is). Next-speaker check and loop detection are off by default (``model.skipNextSpeakerCheck``,
    ``model.skipLoopDetection``). Compaction once the reported prompt passes
    ``min(0.85 * window, window - summary reserve - 13000)``: no tools, system prompt "You are the
    component that summarizes a conversation when its context window is about to overflow" (measured:
    16k reported tokens in a 16k window, compaction right after the first tool step). Subagents
    (``agent`` tool: tools, their own system prompt). Its JSON side queries (next speaker, goal
    verifier, auto-memory) force a ``respond_in_schema`` tool (``tool_choice``): tooled, recognised by
    their prompt or by a system prompt unlike the agent's; a proxy that refuses tool_choice forcing
    answers 400 and the side query fails (best effort: the agent goes on).
    """

    name = "qwen-code"
    binary = "qwen"
    package = "npm @qwen-code/qwen-code 0.24.4"
    needs = "`qwen --output-format stream-json --approval-mode yolo --auth-type openai` (prompt on stdin); `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL`; `~/.qwen/settings.json`: context window, timeout, max_tokens, telemetry, usage statistics, auto-update, IDE mode and its own sandbox off, `tools.core` + `tools.exclude`; `NODE_OPTIONS=--disable-wasm-trap-handler`"
    cannot = "titles and tool-use summaries (they need a fast model; none is configured); its JSON side queries force a tool call, refused under training sampling; web search and fetch (no network)"

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        generation: dict[str, Any] = {
            "contextWindowSize": options.context_tokens,
            "timeout": options.timeout_ms,
            "samplingParams": {"max_tokens": options.max_output_tokens},
        }
        settings: dict[str, Any] = {
            "security": {"auth": {"selectedType": "openai"}},
            "model": {"name": model, "generationConfig": generation},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"enableAutoUpdate": False},
            "ide": {"enabled": False},
            "tools": {"sandbox": False},  # the bwrap sandbox is the boundary
        }
        if options.tools is not None:
            settings["tools"]["core"] = [TOOL_NAMES.get(t, t) for t in options.tools]
            settings["tools"]["exclude"] = [t for t in NON_CORE_TOOLS if t not in options.tools]
        files = {".qwen/settings.json": json.dumps(settings, indent=1)}
        env = {
            "OPENAI_API_KEY": api_key,
            "OPENAI_BASE_URL": base_url,
            "OPENAI_MODEL": model,
            # V8's Wasm trap handler reserves ~10 GiB per Wasm memory: too much under the sandbox's RLIMIT_AS
            "NODE_OPTIONS": "--disable-wasm-trap-handler",
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        }
        if options.system_prompt is not None:
            files[".qwen/system.md"] = options.system_prompt
            env["QWEN_SYSTEM_MD"] = "~/.qwen/system.md"
        # yolo: a headless run cannot answer approval prompts; the sandbox is the boundary
        argv = [
            self.bin(),
            "--output-format",
            "stream-json",
            "--approval-mode",
            "yolo",
            "--auth-type",
            "openai",
            "--model",
            model,
        ]
        return Launch(argv=argv, env=env, stdin=prompt.encode(), files=files)

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        return (
            ("write_file", {"file_path": "/app/solution.py", "content": 'def hello():\n    return "hello"\n'}),
            ("run_shell_command", {"command": 'python -c "from solution import hello; print(hello())"'}),
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        steps, errors, texts = 0, [], []
        tools: dict[str, int] = {}
        failures: dict[str, int] = {}
        names: dict[str, str] = {}
        events = json_events(stdout)
        for event in events:
            kind = event.get("type")
            message = event.get("message") or {}
            if event.get("parent_tool_use_id"):
                continue  # a subagent's messages: its own steps, not the agent's
            if kind == "assistant":
                steps += 1  # one per model response
                for block in message.get("content") or []:
                    if block.get("type") == "text":
                        texts.append(block.get("text") or "")
                    elif block.get("type") == "tool_use":
                        tool = block.get("name") or "?"
                        names[block.get("id") or ""] = tool
                        tools[tool] = tools.get(tool, 0) + 1
            elif kind == "user":
                for block in message.get("content") or [] if isinstance(message.get("content"), list) else []:
                    if block.get("type") == "tool_result" and block.get("is_error"):
                        tool = names.get(block.get("tool_use_id") or "", "?")
                        failures[tool] = failures.get(tool, 0) + 1
            elif kind == "result" and (event.get("is_error") or event.get("subtype") != "success"):
                detail = event.get("error") or event.get("result") or event.get("subtype")
                errors.append(f"result: {detail if isinstance(detail, str) else json.dumps(detail)}"[:500])
        return HarnessRun(
            steps=steps,
            tool_calls=tools,
            tool_failures=failures,
            errors=errors,
            text="\n".join(texts),
            events=len(events),
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        head = system.lstrip()
        if head.startswith("You are the component that summarizes a conversation"):
            return "compaction"
        if head.startswith(_TITLES):
            return "title"
        if head.startswith(_OTHERS) or call.last_user.startswith("Analyze *only* the content and structure"):
            return "other"  # the last: the next-speaker check (the conversation, then this question)
        if not has_tools:
            return "other"
        anchor = next((c for c in prior if c.purpose == "agent"), None)
        if anchor is None:
            return "agent"
        if call.harness_session and anchor.harness_session:
            return "agent" if call.harness_session == anchor.harness_session else "subagent"
        # agent-tool subagents (and respond_in_schema side queries) carry another system prompt
        return "agent" if call.system_digest == anchor.system_digest else "subagent"

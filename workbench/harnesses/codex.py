"""codex (npm `@openai/codex`), run headless: `codex exec --json`, Responses API only."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose, json_events

__all__ = ["Codex"]


def _toml(value: Any) -> str:
    # JSON strings, numbers and booleans are valid TOML values
    return json.dumps(value)


class Codex(Harness):
    """codex 0.171.0: ``codex exec --json -``, prompt on stdin, ``wire_api = "responses"``.

    The capture proxy answers ``/v1/responses`` with OpenEnv's Responses transformer, which forwards
    a chat request to the engine: the trace holds chat-shaped requests, like the other harnesses'
    (codex's developer messages merged into one system message).

    Calls, as the harness ships: agent steps (system prompt "You are a coding agent running in the
    Codex CLI", exec_command and six more tools). No title call. Compaction, once the reported
    context passes its auto-compact limit: the same system prompt, no tools, and "You are performing
    a CONTEXT CHECKPOINT COMPACTION" as the last user message. Subagents cannot happen through the
    proxy: ``multi_agent_v1`` is a ``namespace`` tool, which the transformer drops (as ``web_search``).
    """

    name = "codex"
    binary = "codex"
    dialect = "responses"
    provider = "wb"
    package = "npm @openai/codex 0.171.0"
    needs = "`codex exec --json -` with `--dangerously-bypass-approvals-and-sandbox`; `~/.codex/config.toml`: a provider with `wire_api = responses`, the key from env, analytics off"
    cannot = (
        "subagents (`multi_agent_v1` is a namespace tool, which OpenEnv's Responses transformer drops, as web search)"
    )

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        top: dict[str, Any] = {
            "model": model,
            "model_provider": self.provider,
            "model_context_window": options.context_tokens,
            "approval_policy": "never",
            "sandbox_mode": "danger-full-access",
            "check_for_update_on_startup": False,
        }
        provider: dict[str, Any] = {
            "name": "workbench",
            "base_url": base_url,
            "env_key": "WB_API_KEY",
            "wire_api": "responses",
            "stream_idle_timeout_ms": options.timeout_ms,
        }
        files: dict[str, str] = {}
        if options.system_prompt is not None:
            files[".codex/instructions.md"] = options.system_prompt
            top["model_instructions_file"] = "instructions.md"
        lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
        lines += ["", f"[model_providers.{self.provider}]"] + [f"{k} = {_toml(v)}" for k, v in provider.items()]
        lines += ["", "[analytics]", "enabled = false"]
        if options.tools is not None:
            # Other harnesses' tool names (bash, write, ...) do not exist here: codex does all file
            # work through exec_command. A restricted run drops the tools that do not act on the
            # workspace (goals, subagents; web search is dropped by the proxy's transformer anyway).
            lines += ["", "[features]", "goals = false", "multi_agent = false"]
        argv = [
            self.bin(),
            "exec",
            "--json",
            "--color",
            "never",
            "--ephemeral",
            "--skip-git-repo-check",
            # the sandbox session is the boundary, as for the other harnesses: no approval prompts
            # (exec cannot answer them) and no codex sandbox of its own inside it
            "--dangerously-bypass-approvals-and-sandbox",
            "-",
        ]
        env = {"WB_API_KEY": api_key}  # CODEX_HOME defaults to $HOME/.codex, the sandbox's home
        files[".codex/config.toml"] = "\n".join(lines) + "\n"
        return Launch(argv=argv, env=env, stdin=prompt.encode(), files=files)

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        # no file-writing tool: files are written from the shell
        return (
            ("exec_command", {"cmd": "cat > solution.py << 'EOF'\ndef hello():\n    return \"hello\"\nEOF"}),
            ("exec_command", {"cmd": 'python -c "from solution import hello; print(hello())"'}),
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        steps, errors, texts = 0, [], []
        tools: dict[str, int] = {}
        failures: dict[str, int] = {}
        events = json_events(stdout)
        for event in events:
            kind = event.get("type")
            item = event.get("item") or {}
            if kind == "item.completed":
                itype = item.get("type")
                if itype == "agent_message":
                    texts.append(item.get("text") or "")
                elif itype == "error":
                    continue  # a warning (unknown model metadata, ignored settings); failures are turn.failed
                elif itype not in ("reasoning", None):  # command_execution, file_change, mcp_tool_call, ...
                    tools[itype] = tools.get(itype, 0) + 1
                    if item.get("status") in ("failed", "declined"):
                        failures[itype] = failures.get(itype, 0) + 1
            elif kind == "turn.completed":
                steps += 1  # codex reports the exec's one turn, not each model call within it
            elif kind == "turn.failed":
                errors.append(f"turn.failed: {(event.get('error') or {}).get('message')}"[:500])
            elif kind == "error":
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
        # compaction keeps the agent's system prompt and drops the tools; the request is the last message
        if call.last_user.startswith("You are performing a CONTEXT CHECKPOINT COMPACTION"):
            return "compaction"
        return "agent" if has_tools else "other"

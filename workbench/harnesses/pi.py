"""pi (npm `@mariozechner/pi-coding-agent`), run headless: `pi --offline -p --no-session --mode json`."""

from __future__ import annotations

import json
from collections.abc import Sequence

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose, json_events

__all__ = ["Pi"]


class Pi(Harness):
    """pi 0.73.1: ``pi --offline -p --no-session --mode json``, prompt on stdin, Chat Completions.

    Calls, as the harness ships: agent steps only (tools read/bash/edit/write, system prompt "You
    are an expert coding assistant operating inside pi"; no session header). No title call, no
    subagents. Its one kind of bookkeeping call is compaction ("You are a context summarization
    assistant", no tools), checked when the agent ends, before ``-p`` exits. It fires once the
    context exceeds the window minus ``compaction.reserveTokens``; pi's default reserve (16384) is
    the whole of a 16k window, so every rollout ended with a compaction of an empty conversation
    (measured). The reserve is set to the output budget instead: compaction within one reply of the window.
    """

    name = "pi"
    binary = "pi"
    provider = "wb"
    package = "npm @mariozechner/pi-coding-agent 0.73.1"
    needs = "`pi --offline -p --no-session --mode json`, no context files, extensions or skills; `~/.pi/agent/models.json`: an openai-completions provider, the key from env; compaction reserve = the output budget"
    cannot = "nothing it ships is missing here (it has no title call and no subagents)"

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        models = {
            "providers": {
                self.provider: {
                    "baseUrl": base_url,
                    "api": "openai-completions",
                    "apiKey": "WB_API_KEY",  # the name of an env var: the key never lands in a file
                    # vLLM takes the system role and has no reasoning_effort
                    "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                    "models": [
                        {
                            "id": model,
                            "contextWindow": options.context_tokens,
                            "maxTokens": options.max_output_tokens,
                            "reasoning": False,
                        }
                    ],
                }
            }
        }
        settings = {
            "compaction": {"reserveTokens": options.max_output_tokens},
            # the OpenAI SDK's own timeout; a queued CPU engine can take minutes to answer
            "retry": {"provider": {"timeoutMs": options.timeout_ms}},
        }
        argv = [
            self.bin(),
            "--offline",
            "-p",
            "--no-session",
            "--mode",
            "json",
            "--provider",
            self.provider,
            "--model",
            model,
            # nothing from the host: no AGENTS.md/CLAUDE.md, extensions, skills or templates
            "--no-context-files",
            "--no-extensions",
            "--no-skills",
            "--no-prompt-templates",
        ]
        if options.system_prompt is not None:
            argv += ["--system-prompt", options.system_prompt]
        if options.tools is not None:
            argv += ["--tools", ",".join(options.tools)]
        env = {"WB_API_KEY": api_key, "PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1"}
        # stdin, not argv: a prompt starting with "@" would be read as a file argument
        return Launch(
            argv=argv,
            env=env,
            stdin=prompt.encode(),
            files={
                ".pi/agent/models.json": json.dumps(models, indent=1),
                ".pi/agent/settings.json": json.dumps(settings, indent=1),
            },
        )

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        return (
            ("write", {"path": "solution.py", "content": 'def hello():\n    return "hello"\n'}),
            ("bash", {"command": 'python -c "from solution import hello; print(hello())"'}),
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        steps, errors, texts = 0, [], []
        tools: dict[str, int] = {}
        failures: dict[str, int] = {}
        events = json_events(stdout)
        for event in events:
            kind = event.get("type")
            if kind == "message_end":
                message = event.get("message") or {}
                if message.get("role") != "assistant":
                    continue
                steps += 1
                # json mode exits 0 on a failed request: the error is on the assistant message
                if message.get("stopReason") in ("error", "aborted"):
                    errors.append(f"{message['stopReason']}: {message.get('errorMessage') or '?'}"[:500])
                texts += [b.get("text") or "" for b in message.get("content") or [] if b.get("type") == "text"]
            elif kind == "tool_execution_end":
                tool = event.get("toolName") or "?"
                tools[tool] = tools.get(tool, 0) + 1
                if event.get("isError"):
                    failures[tool] = failures.get(tool, 0) + 1
            elif kind == "compaction_end" and event.get("errorMessage"):
                errors.append(f"compaction: {event['errorMessage']}"[:500])
        return HarnessRun(
            steps=steps,
            tool_calls=tools,
            tool_failures=failures,
            errors=errors,
            text="\n".join(texts),
            events=len(events),
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        if system.startswith("You are a context summarization assistant"):
            return "compaction"
        return "agent" if has_tools else "other"

"""opencode (npm `opencode-ai`), run headless: `opencode run --format json`, prompt on stdin."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose, json_events

__all__ = ["OpenCode"]


class OpenCode(Harness):
    """opencode 1.18.33 (npm ``opencode-ai``): ``opencode run --format json``, prompt on stdin.

    Calls, as the harness ships (no ``--title``; `HarnessOptions.session_title` passes one, and then there is
    no title call): one title call (no tools, "You are a title generator") concurrent with the first agent
    step; agent steps (tools, the ``build`` agent's prompt, one x-session-id); compaction near the context
    limit ("You are a context summarization agent"); task-tool subagents (tools, their own x-session-id).
    """

    name = "opencode"
    binary = "opencode"
    provider = "wb"
    package = "npm opencode-ai 1.18.33"
    needs = "`opencode run --format json`; `OPENCODE_CONFIG_CONTENT`: an `@ai-sdk/openai-compatible` provider, permissions allowed; `OPENCODE_DISABLE_*` (models fetch, autoupdate, LSP downloads, plugins, share)"
    cannot = "webfetch (denied: no network in the sandbox); LSP servers (nothing is downloaded)"

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        provider_options: dict[str, Any] = {
            "baseURL": base_url,
            "apiKey": api_key,
            # defaults are 5 min to first byte and between chunks; a queued CPU engine can be slower
            "timeout": options.timeout_ms,
            "headerTimeout": options.timeout_ms,
            "chunkTimeout": options.timeout_ms,
        }
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                self.provider: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "workbench",
                    "options": provider_options,
                    "models": {
                        model: {
                            "name": model,
                            "tool_call": True,
                            "limit": {"context": options.context_tokens, "output": options.max_output_tokens},
                        }
                    },
                }
            },
            "model": f"{self.provider}/{model}",
            "small_model": f"{self.provider}/{model}",
            "autoupdate": False,
            "share": "disabled",
            "snapshot": False,
            # run mode cannot answer "ask"; the sandbox is the boundary, not opencode's prompts
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny", "external_directory": "deny"},
        }
        agent: dict[str, Any] = {}
        if options.system_prompt is not None:
            agent["prompt"] = options.system_prompt
        if options.tools is not None:
            all_tools = ("bash", "edit", "glob", "grep", "read", "skill", "task", "todowrite", "webfetch", "write")
            agent["tools"] = {t: t in options.tools for t in all_tools}
        if agent:
            config["agent"] = {"build": agent}
        env = {
            "OPENCODE_CONFIG_CONTENT": json.dumps(config),
            # offline: no models.dev catalogue, no autoupdate, no LSP downloads, no plugin installs
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            "npm_config_offline": "true",  # its embedded npm would fetch @opencode-ai/plugin per HOME
        }
        # stdin, not argv: a positional prompt is re-quoted ("\"...\"") before it reaches the model
        argv = [self.bin(), "run", "--format", "json", "-m", f"{self.provider}/{model}"]
        if options.session_title is not None:  # a titled session makes no title call
            argv += ["--title", options.session_title]
        return Launch(argv=argv, env=env, stdin=prompt.encode())

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        steps, errors, texts = 0, [], []
        tools: dict[str, int] = {}
        failures: dict[str, int] = {}
        events = json_events(stdout)
        for event in events:
            kind = event.get("type")
            part = event.get("part") or {}
            if kind == "step_finish":
                steps += 1
            elif kind == "tool_use":
                tool = part.get("tool") or "?"
                tools[tool] = tools.get(tool, 0) + 1
                if (part.get("state") or {}).get("status") == "error":
                    failures[tool] = failures.get(tool, 0) + 1
            elif kind == "text":
                texts.append(part.get("text") or "")
            elif kind == "error":
                err = event.get("error") or {}
                data = err.get("data") or {}
                errors.append(f"{err.get('name', 'error')}: {data.get('message') or json.dumps(data)[:300]}")
        return HarnessRun(
            steps=steps,
            tool_calls=tools,
            tool_failures=failures,
            errors=errors,
            text="\n".join(texts),
            events=len(events),
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        if system.startswith("You are a title generator"):
            return "title"
        if system.startswith("You are a context summarization agent"):
            return "compaction"
        if not has_tools:
            return "other"
        anchor = next((c for c in prior if c.purpose == "agent"), None)
        if anchor is None:
            return "agent"
        if call.harness_session and anchor.harness_session:
            return "agent" if call.harness_session == anchor.harness_session else "subagent"
        return "agent" if call.system_digest == anchor.system_digest else "subagent"

"""hermes-agent (PyPI `hermes-agent`), run headless: `hermes -z` (one-shot), a custom provider in config.yaml."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose

__all__ = ["Hermes"]

_TOOLSETS = {"bash": "terminal", "write": "file", "read": "file", "edit": "file"}

_USAGE = ".hermes/usage.json"  # its usage report (``--usage-file``, written even when the run fails): `Launch.report`

_MIN_CONTEXT = 64_000
_TITLE = "Generate a short, descriptive title"
_COMPACTION = "You are a summarization agent creating a context checkpoint"


class Hermes(Harness):
    """hermes-agent 0.19.0: ``hermes --oneshot=PROMPT --yolo --ignore-rules`` (it takes the task only as an
    argument), Chat Completions.

    The endpoint is a user-defined provider in ``~/.hermes/config.yaml`` (``providers.wb``: ``base_url``,
    ``key_env: WB_API_KEY``, so the key stays in the environment), selected with ``--provider wb -m MODEL``.
    ``--ignore-rules``: no AGENTS.md/SOUL.md/memory injected. ``-t`` restricts its toolsets (`HarnessOptions.tools`:
    bash is its ``terminal`` toolset, write/read/edit its ``file`` one, other names are hermes toolsets); ``context_tokens`` is the model's context length, but at least 64K: hermes refuses to start below that.

    Calls, as the harness ships: agent steps (26 tools, system prompt "You are Hermes Agent"), including its
    verification nudges (after a code edit with no passing check, the next step's last user message starts
    "[System: You edited code in this turn": still the agent's conversation, measured twice per edit run);
    compaction near the context limit ("You are a summarization agent creating a context checkpoint", no tools);
    ``delegate_task`` subagents (tools, run inline in one-shot mode: tagged "agent", not told apart here). No
    title call: one-shot mode never runs its title generator ("Generate a short, descriptive title", the
    interactive CLI's and the gateway's); tagged "title" should a build send one.

    Its account of the run: the final reply on stdout, and the one-shot usage report (api_calls, completed, failed,
    failure: `Launch.report`).
    """

    name = "hermes"
    binary = "hermes"
    package = "PyPI hermes-agent 0.19.0"
    needs = "`hermes --oneshot` `--provider wb --yolo --ignore-rules --usage-file`; `~/.hermes/config.yaml`: a chat_completions provider with `key_env`; `WB_API_KEY`, `HERMES_ACCEPT_HOOKS`, `HERMES_YOLO_MODE`; the task as `--oneshot=` (it takes it only as an argument); its usage report (`--usage-file`) read after it exits"
    cannot = "per-tool counts (one-shot mode prints no tool events); a context window below 64k (it refuses to start, so compaction cannot fire before the engine's limit); its web and browser tools (no network); titles (one-shot mode makes none)"
    provider = "wb"

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        config: dict[str, Any] = {
            "model": {
                "default": model,
                "provider": self.provider,
                # it refuses to start below 64K ("below the minimum 64,000 required"): a smaller window is
                # reported as 64K, so its compaction cannot fire before the engine's own limit does
                "context_length": max(options.context_tokens, _MIN_CONTEXT),
                "max_tokens": options.max_output_tokens,
            },
            "providers": {
                self.provider: {
                    "name": "workbench",
                    "base_url": base_url,
                    "key_env": "WB_API_KEY",  # the name of an env var: the key never lands in a file
                    "default_model": model,
                    "max_output_tokens": options.max_output_tokens,
                    "api_mode": "chat_completions",
                }
            },
        }
        if options.system_prompt is not None:
            config["agent"] = {"system_prompt": options.system_prompt}
        argv = [
            self.bin(),
            "--provider",
            self.provider,
            "-m",
            model,
            "--yolo",
            "--ignore-rules",
            "--usage-file",
            f"~/{_USAGE}",
            f"--oneshot={prompt}",  # one argument, never re-read as an option (it takes the task only so)
        ]
        if options.tools is not None:
            # its tools come in toolsets: our bash is its terminal toolset, write/read/edit its file toolset
            toolsets = dict.fromkeys(_TOOLSETS.get(t, t) for t in options.tools)
            argv += ["-t", ",".join(toolsets)]
        env = {"WB_API_KEY": api_key, "HERMES_ACCEPT_HOOKS": "1", "HERMES_YOLO_MODE": "1"}
        files = {".hermes/config.yaml": json.dumps(config, indent=1)}
        return Launch(argv=argv, env=env, stdin=b"", files=files, report=_USAGE)

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        return (
            ("write_file", {"path": "solution.py", "content": 'def hello():\n    return "hello"\n'}),
            ("terminal", {"command": 'python -c "from solution import hello; print(hello())"'}),
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        # one-shot mode prints only the final reply; the usage report says how many calls and whether it failed
        try:
            usage = json.loads(report) if report else {}
        except ValueError:
            usage = {}
        usage = usage if isinstance(usage, dict) else {}
        errors = [f"failed: {usage.get('failure') or '?'}"[:500]] if usage.get("failed") else []
        return HarnessRun(
            steps=int(usage.get("api_calls") or 0),
            tool_calls={},
            tool_failures={},
            errors=errors,
            text=stdout.strip(),
            events=1 if usage else 0,
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        if system.startswith(_COMPACTION) or call.last_user.startswith(_COMPACTION):
            return "compaction"
        if system.startswith(_TITLE) or call.last_user.startswith(_TITLE):
            return "title"
        return "agent" if has_tools else "other"

"""hermes-agent (PyPI `hermes-agent`), run headless: `hermes -z` (one-shot), a custom provider in config.yaml."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose, json_events

__all__ = ["Hermes"]

_TOOLSETS = {"bash": "terminal", "write": "file", "read": "file", "edit": "file"}

# The prompt comes on stdin and goes to ``--oneshot=``: one argument, never re-read as an option. One-shot
# mode prints only the final reply; its usage report (``--usage-file``, written even when the run fails)
# follows on stdout as one JSON line, printed by its venv's python ("$1").
_SCRIPT = (
    'hermes=$0 py=$1; shift; prompt=$(cat); usage="$HOME/.hermes/usage.json"; '
    '"$hermes" "$@" --usage-file "$usage" "--oneshot=$prompt"; rc=$?; echo; '
    '[ -f "$usage" ] && "$py" -I -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))" "$usage"; '
    "exit $rc"
)

_MIN_CONTEXT = 64_000
_TITLE = "Generate a short, descriptive title"
_COMPACTION = "You are a summarization agent creating a context checkpoint"


class Hermes(Harness):
    """hermes-agent 0.19.0: ``hermes -z PROMPT --yolo --ignore-rules``, prompt on stdin, Chat Completions.

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

    Its event stream: the final reply, then the one-shot usage report (api_calls, completed, failed, failure).
    """

    name = "hermes"
    binary = "hermes"
    package = "PyPI hermes-agent 0.19.0"
    needs = "`hermes -z` (one-shot) `--provider wb --yolo --ignore-rules --usage-file`; `~/.hermes/config.yaml`: a chat_completions provider with `key_env`; `WB_API_KEY`, `HERMES_ACCEPT_HOOKS`, `HERMES_YOLO_MODE`; the task is read from stdin by a `sh -c` line, the usage report printed after"
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
        hermes = self.bin()
        venv = Path(hermes).resolve().parent
        argv = [
            "/bin/sh",
            "-c",
            _SCRIPT,
            hermes,
            str(venv / "python"),
            "--provider",
            self.provider,
            "-m",
            model,
            "--yolo",
            "--ignore-rules",
        ]
        if options.tools is not None:
            # its tools come in toolsets: our bash is its terminal toolset, write/read/edit its file toolset
            toolsets = dict.fromkeys(_TOOLSETS.get(t, t) for t in options.tools)
            argv += ["-t", ",".join(toolsets)]
        env = {"WB_API_KEY": api_key, "HERMES_ACCEPT_HOOKS": "1", "HERMES_YOLO_MODE": "1"}
        return Launch(
            argv=argv, env=env, stdin=prompt.encode(), files={".hermes/config.yaml": json.dumps(config, indent=1)}
        )

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        return (
            ("write_file", {"path": "solution.py", "content": 'def hello():\n    return "hello"\n'}),
            ("terminal", {"command": 'python -c "from solution import hello; print(hello())"'}),
        )

    def parse_events(self, stdout: str) -> HarnessRun:
        report: dict[str, Any] = {}
        for event in json_events(stdout):
            if "api_calls" in event:
                report = event
        text = stdout.rsplit("\n{", 1)[0].strip() if report else stdout.strip()
        errors = []
        if report.get("failed"):
            errors.append(f"failed: {report.get('failure') or '?'}"[:500])
        return HarnessRun(
            steps=int(report.get("api_calls") or 0),
            tool_calls={},
            tool_failures={},
            errors=errors,
            text=text,
            events=1 if report else 0,
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        if system.startswith(_COMPACTION) or call.last_user.startswith(_COMPACTION):
            return "compaction"
        if system.startswith(_TITLE) or call.last_user.startswith(_TITLE):
            return "title"
        return "agent" if has_tools else "other"

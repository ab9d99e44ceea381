"""Continue CLI (npm `@continuedev/cli`), run headless: `cn -p`, prompt on stdin, a local config.yaml."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose

__all__ = ["ContinueCli"]

# Our generic tool names -> Continue's built-in tools (`src/tools/builtInToolNames.ts`). Edit or MultiEdit:
# cn offers one of them, by whether it believes the model "capable" (MultiEdit for Claude/GPT-class names).
_TOOLS: dict[str, tuple[str, ...]] = {
    "bash": ("Bash",),
    "write": ("Write",),
    "read": ("Read",),
    "edit": ("Edit", "MultiEdit"),
    "glob": ("List",),
    "grep": ("Search",),
}
# Every built-in cn could offer a headless run without an agent id (no ReportFailure/UploadArtifact).
_BUILT_INS: tuple[str, ...] = (
    "AskQuestion",
    "Bash",
    "Checklist",
    "Diff",
    "Edit",
    "Exit",
    "Fetch",
    "List",
    "MultiEdit",
    "Read",
)
_BUILT_INS += ("Search", "Skills", "Status", "Write")
# cn's compaction request (`src/compaction.ts` COMPACTION_PROMPT), the last user message of the call
COMPACTION_PROMPT = "Please provide a concise summary of our conversation so far"
# `core/util/chatDescriber.ts`: the title request (never sent headless: see the class doc)
TITLE_PROMPT = "Given the following... please reply with a title for the chat"


def _yaml(value: Any) -> str:
    # a JSON string is a valid YAML flow scalar (double-quoted, with JSON's escapes)
    return json.dumps(value)


class ContinueCli(Harness):
    """Continue CLI 1.5.47 (npm ``@continuedev/cli``): ``cn -p``, prompt on stdin, ``~/.continue/config.yaml``.

    Config: ``~/.continue/config.yaml`` (one ``provider: openai`` model, ``apiBase`` the proxy, ``apiKey:
    ${{ secrets.WB_API_KEY }}``, which cn resolves from the environment first: the key never lands in a
    file). No hub login: a local config makes no hub call. Headless cn leaves out every tool whose
    permission is "ask" (Write, Edit, MultiEdit by default), so they are ``--allow``ed; Fetch is
    ``--exclude``d (no network); `HarnessOptions.tools` excludes the rest. ``-p`` comes last: cn reads
    stdin only when no argument follows ``-p`` (an ``--allow`` value there would be taken for the prompt).
    Not ``--format json``: it prints only the final answer (wrapped in JSON) and appends "your final
    response MUST be valid JSON" to the agent's system prompt. Plain ``-p`` prints the final answer, the
    only account cn gives on stdout: no steps, no tool calls (`parse_events` counts one step per answer).
    cn's system prompt cannot be replaced: `HarnessOptions.system_prompt` is added as a config rule (cn
    appends rules in a ``<context name="userRules">`` block after its own prompt).

    Calls, as the harness ships: agent steps, streamed (tools Bash/Read/Write/Edit/List/Search/Exit/...,
    system prompt "You are an agent in the Continue CLI"). No title call headless (`runHeadlessMode` passes
    ``firstAssistantResponse`` after clearing it; the TUI would send "reply with a title for the chat").
    Compaction, when the history nears the context window (``contextLength`` minus the output budget, 80%):
    no tools, and "Please provide a concise summary of our conversation so far" as the last user message.
    Subagents only with ``--beta-subagent-tool`` and a model carrying its own ``baseSystemMessage``: never here.
    Offline: ``CONTINUE_METRICS_ENABLED=0`` (no OpenTelemetry); the update check has no switch, it fails
    quietly without network (and ``CONTINUE_CLI_AUTO_UPDATED`` stops any self-update).
    """

    name = "continue"
    binary = "cn"
    package = "npm @continuedev/cli 1.5.47"
    needs = (
        "`cn --allow Write --allow Edit --allow MultiEdit --exclude Fetch -p` (prompt on stdin, `-p` last); "
        "`~/.continue/config.yaml`: one `provider: openai` model with `apiBase`, `apiKey: ${{ secrets.WB_API_KEY }}` "
        "(resolved from env), contextLength, maxTokens, request timeout; `CONTINUE_METRICS_ENABLED=0`"
    )
    cannot = (
        "report its steps or tool calls (headless prints only the final answer); replace its system prompt "
        "(ours is added as a rule); hub agents, models and secrets (no login); Fetch; its update check (fails offline)"
    )

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        # requestOptions.timeout is read twice, in two units: the OpenAI SDK's ms (default 10 min) and the
        # fetch agent's seconds (x1000, default 2 h). Capped where seconds x 1000 stays in Node's 32-bit timer.
        timeout = min(options.timeout_ms, 2_000_000)
        lines = [
            "name: workbench",
            "version: 0.0.1",
            "schema: v1",
            "models:",
            "  - name: wb",
            "    provider: openai",
            f"    model: {_yaml(model)}",
            f"    apiBase: {_yaml(base_url)}",
            "    apiKey: ${{ secrets.WB_API_KEY }}",
            "    roles: [chat]",
            "    defaultCompletionOptions:",
            f"      contextLength: {options.context_tokens}",
            f"      maxTokens: {options.max_output_tokens}",
            "    requestOptions:",
            f"      timeout: {timeout}",
        ]
        if options.system_prompt is not None:
            lines += ["rules:", f"  - {_yaml(options.system_prompt)}"]
        argv = [self.bin()]  # no --config: cn reads ~/.continue/config.yaml (a "~" in --config is not expanded)
        allowed: tuple[str, ...] = ("Write", "Edit", "MultiEdit")
        excluded: tuple[str, ...] = ("Fetch",)
        if options.tools is not None:
            keep = {t for name in options.tools for t in _TOOLS.get(name, (name,))} | {"Exit"}
            allowed = tuple(t for t in allowed if t in keep)
            excluded = tuple(t for t in _BUILT_INS if t not in keep)
        for tool in allowed:
            argv += ["--allow", tool]
        for tool in excluded:
            argv += ["--exclude", tool]
        argv.append("-p")  # last: see the class doc
        env = {
            "WB_API_KEY": api_key,
            "CONTINUE_METRICS_ENABLED": "0",
            "CONTINUE_CLI_AUTO_UPDATED": "true",
            # no "Co-Authored-By: Continue" instruction appended to the agent's prompt
            "CONTINUE_CLI_DISABLE_COMMIT_SIGNATURE": "1",
        }
        return Launch(
            argv=argv, env=env, stdin=prompt.encode(), files={".continue/config.yaml": "\n".join(lines) + "\n"}
        )

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        return (
            ("Write", {"filepath": "solution.py", "content": 'def hello():\n    return "hello"\n'}),
            ("Bash", {"command": 'python -c "from solution import hello; print(hello())"'}),
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        # Plain -p prints the final answer and nothing else; a failure is a JSON line on stderr (exit 1).
        text = stdout.strip()
        errors = []
        for line in text.splitlines():
            if line.startswith('{"status":"error"'):
                try:
                    errors.append(f"error: {json.loads(line).get('message')}"[:500])
                except ValueError:
                    pass
        return HarnessRun(
            steps=1 if text and not errors else 0, tool_calls={}, tool_failures={}, errors=errors, text=text, events=0
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        if call.last_user.startswith(COMPACTION_PROMPT):
            return "compaction"
        if call.last_user.startswith(TITLE_PROMPT):
            return "title"
        return "agent" if has_tools else "other"

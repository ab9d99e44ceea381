"""mini-swe-agent (PyPI `mini-swe-agent`), run headless: `mini --yolo --exit-immediately`, one bash tool."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose

__all__ = ["MiniSweAgent"]

# Its config folder (MSWEA_GLOBAL_CONFIG_DIR), relative to the sandbox home: our config and its trajectory.
_DIR = ".config/mini-swe-agent"
_TRAJECTORY = "trajectory.json"  # its own record of the run (`Launch.report`)


# How a run ends (the trajectory's info.exit_status) when nothing failed: it submitted, the model answered
# three times in a row without a bash call, or a limit stopped it. Anything else is an exception's name.
_CLEAN_EXITS = ("Submitted", "RepeatedFormatError", "LimitsExceeded", "TimeExceeded", "")
_NOT_RUN = "action was not executed"


def _raw(text: str) -> str:
    """`text` inside mini's Jinja templates, verbatim (a prompt may hold ``{{``)."""
    return "{% raw %}" + text.replace("{% endraw %}", "{% endraw %}{{ '{% endraw %}' }}{% raw %}") + "{% endraw %}"


class MiniSweAgent(Harness):
    """mini-swe-agent 2.4.6: ``mini --yolo --exit-immediately -c mini.yaml -c <ours> --task=PROMPT`` (it takes
    the task only as an argument).

    Version 2 speaks tool calls (``LitellmModel``: one ``bash`` tool, ``{"command": ...}``, through litellm's
    ``openai/<model>`` with ``api_base``; key from ``OPENAI_API_KEY``), Chat Completions, not streamed. Every
    command runs in a fresh subshell; the agent finishes by running ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``
    (``--exit-immediately``: no "new task?" question), or after three replies in a row without a bash call.

    Config (``~/.config/mini-swe-agent/workbench.yaml``, merged over the shipped ``mini.yaml``): model,
    ``api_base``, ``max_tokens``, the request timeout; ``cost_tracking: ignore_errors`` (litellm cannot price
    the served model) and no cost limit; ``system_prompt`` replaces its ``system_template``. Env: no first-run
    setup (``MSWEA_CONFIGURED``), no banner, its global config folder in the sandbox home, litellm's bundled
    model catalogue (``LITELLM_LOCAL_MODEL_COST_MAP``, ``LITELLM_OFFLINE_MODE``: nothing fetched).
    `HarnessOptions.tools` and ``context_tokens`` do not apply: one tool, and no compaction (a run past the
    window fails).

    Calls, as the harness ships: agent steps only (system prompt "You are a helpful assistant that can
    interact with a computer", the bash tool). No title call, no compaction, no subagents; a reply without a
    tool call is answered with a format-error message and the next call is an agent step too.

    Its account of the run: the trajectory it saves (``-o``, in its config folder: `Launch.report`); what it
    prints is a log.
    """

    name = "mini-swe-agent"
    binary = "mini"
    package = "PyPI mini-swe-agent 2.4.6"
    needs = "`mini --yolo --exit-immediately` with the shipped mini.yaml plus ours (`~/.config/mini-swe-agent/workbench.yaml`: litellm `openai/<model>`, `api_base`, max_tokens, timeout, cost tracking off); `OPENAI_API_KEY`, `MSWEA_CONFIGURED`, `LITELLM_LOCAL_MODEL_COST_MAP`; the task as `--task=` (it takes it only as an argument); its trajectory (`-o`) read after it exits"
    cannot = "compaction (it has none: a run past the window fails); a tool restriction (it has one tool, bash)"

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        agent: dict[str, Any] = {
            "mode": "yolo",
            "confirm_exit": False,
            "cost_limit": 0,  # unpriced: the proxy's max_model_calls is the limit
            "step_limit": 0,
        }
        if options.system_prompt is not None:
            agent["system_template"] = _raw(options.system_prompt)
        config = {
            "agent": agent,
            "model": {
                "model_class": "litellm",
                "model_name": f"openai/{model}",
                "cost_tracking": "ignore_errors",
                "model_kwargs": {
                    "api_base": base_url,  # the key is OPENAI_API_KEY, read by litellm: never in this file
                    "max_tokens": options.max_output_tokens,
                    "timeout": options.timeout_ms / 1000,
                    "drop_params": True,
                },
            },
            "environment": {"environment_class": "local"},
        }
        mini = self.bin()
        venv = Path(mini).resolve().parent.parent
        # the shipped agent prompt, by its full path: a bare "mini.yaml" is looked up in the workspace first
        shipped = next(venv.glob("lib/python3*/site-packages/minisweagent/config/mini.yaml"))
        argv = [
            mini,
            "--yolo",
            "--exit-immediately",
            "-c",
            str(shipped),  # -c replaces the default config: named first, ours over it
            "-c",
            f"~/{_DIR}/workbench.yaml",
            "-o",
            f"~/{_DIR}/{_TRAJECTORY}",
            f"--task={prompt}",  # one argument, never re-read as an option (it takes the task only as an argument)
        ]
        env = {
            "OPENAI_API_KEY": api_key,
            "MSWEA_CONFIGURED": "true",  # no interactive first-run setup (it would write a .env of keys)
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_OFFLINE_MODE": "true",
        }
        return Launch(
            argv=argv,
            env=env,
            stdin=b"",
            files={f"{_DIR}/workbench.yaml": json.dumps(config, indent=1)},  # JSON is YAML
            report=f"{_DIR}/{_TRAJECTORY}",
        )

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        # one tool: files are written from the shell
        return (
            ("bash", {"command": "cat > solution.py << 'EOF'\ndef hello():\n    return \"hello\"\nEOF"}),
            ("bash", {"command": 'python -c "from solution import hello; print(hello())"'}),
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        try:
            trajectory = json.loads(report) if report else {}
        except ValueError:
            trajectory = {}
        trajectory = trajectory if isinstance(trajectory, dict) else {}
        messages = trajectory.get("messages") or []
        steps, texts, errors = 0, [], []
        tools: dict[str, int] = {}
        failures: dict[str, int] = {}
        for message in messages:
            if not isinstance(message, dict):
                continue
            role, extra = message.get("role"), message.get("extra") or {}
            if role == "assistant":
                steps += 1
                if isinstance(message.get("content"), str) and message["content"]:
                    texts.append(message["content"])
            elif role == "tool":
                tools["bash"] = tools.get("bash", 0) + 1
                # the submitting command ends the run inside its execution: it is recorded as "not executed"
                if extra.get("exception_info") == _NOT_RUN:
                    continue
                if extra.get("returncode") not in (0, None) or extra.get("exception_info"):
                    failures["bash"] = failures.get("bash", 0) + 1
        info = trajectory.get("info") or {}
        # a reply without a bash call never joins the messages (only the format-error answer to it does)
        steps = max(steps, int((info.get("model_stats") or {}).get("api_calls") or 0))
        status = info.get("exit_status") or ""
        if trajectory and status not in _CLEAN_EXITS:
            last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
            detail = (last.get("extra") or {}).get("exception_str") or last.get("content") or "?"
            errors.append(f"{status}: {detail}"[:500])
        elif not trajectory and stdout.strip():  # it ran, and ended before writing its trajectory
            errors.append(f"it wrote no trajectory: {stdout.strip()[-300:]}")
        return HarnessRun(
            steps=steps,
            tool_calls=tools,
            tool_failures=failures,
            errors=errors,
            text="\n".join(texts),
            events=len(messages),
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        # every call it makes is an agent step with its bash tool
        return "agent" if has_tools else "other"

"""The direct baseline: the model asked the task once, with no harness loop, graded like any harness's rollout.

    workbench eval --model qwen-coder --tasks humaneval-eval --harness direct --n 2
    workbench eval --model qwen-coder --tasks humaneval-eval --harness opencode --n 2   # the same, through opencode

`Direct` is shaped like a harness (`Harness`), so a direct rollout is an ordinary rollout: a sandbox, the
capture proxy (its one call recorded with the engine's token ids and logprobs, tagged ``agent``), solution.py
graded by the same hidden tests in the same jail. What runs in the sandbox is `direct_agent.py` (standard
library only; its docstring holds the rule that takes the code from the reply), written into the sandbox home
and started with the sandbox's ``python``. The difference between a harness's solve rate and this one's, on the
same tasks, temperature and samples, is that harness's tax (`workbench.evaluate.harness_tax`).

It is a baseline, not a harness people ship: it is in `BASELINES`, not in `HARNESSES` (the matrix and
certification cover harnesses only), and `get_harness` finds both.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose, json_events
from workbench.tasks import WRITE_HINT

__all__ = ["Direct", "ANSWER_HINT"]

_AGENT = ".direct/agent.py"  # relative to the sandbox home
# Replaces a tool hint at the end of an instruction and ends every other one: the model is told how to answer,
# since it has no tool to write the file with.
ANSWER_HINT = "Answer with the complete contents of solution.py in one ```python code block."


class Direct(Harness):
    """One chat completion (not streamed, no tools), the task as the user message; the code from the reply is
    written to solution.py by the rule in `direct_agent.py`.

    `HarnessOptions.system_prompt` (an agent prompt, written for a harness with tools) is not sent: the model is
    asked as a user would ask it. `tools`, `context_tokens` and `session_title` do not apply; few-shot tool-call
    examples are never prefixed (`few_shot_prompt` returns the instruction): there is no tool to call.
    """

    name = "direct"
    binary = "python"
    package = "workbench workbench/harnesses/direct_agent.py (standard library only)"
    needs = "the sandbox's `python -I -S` running direct_agent.py (written into the sandbox home); env DIRECT_*"
    cannot = "tools, a second call, reading visible_tests.txt: one answer, no loop"

    def bin(self) -> str:
        return "python"  # the sandbox's own (`Sandbox.python`, first on its PATH), not an installed harness

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        return Launch(
            argv=[self.bin(), "-I", "-S", f"~/{_AGENT}"],
            env={
                "DIRECT_BASE_URL": base_url,
                "DIRECT_API_KEY": api_key,
                "DIRECT_MODEL": model,
                "DIRECT_MAX_TOKENS": str(options.max_output_tokens),
                "DIRECT_TIMEOUT_S": str(options.timeout_ms / 1000),
            },
            stdin=prompt.encode(),
            files={_AGENT: (Path(__file__).with_name("direct_agent.py")).read_text()},
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        events = [e for e in json_events(stdout) if e.get("type") == "direct"]
        errors = [str(e["error"]) for e in events if e.get("error")]
        answered = [e for e in events if not e.get("error")]
        return HarnessRun(
            steps=len(answered),
            tool_calls={},
            tool_failures={},
            errors=errors,
            text=" ".join(f"rule={e.get('rule')} finish={e.get('finish_reason')}" for e in answered),
            events=len(events),
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        return "agent"  # its one call is the answer

    def task_prompt(self, instruction: str) -> str:
        if instruction.endswith(WRITE_HINT):
            instruction = instruction[: -len(WRITE_HINT)]
        return f"{instruction.rstrip()}\n\n{ANSWER_HINT}"

    def few_shot_prompt(self, instruction: str) -> str:
        return instruction

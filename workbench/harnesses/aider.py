"""aider (PyPI `aider-chat`), run headless: `aider --message PROMPT --yes-always`, whole-file edits."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from workbench.harnesses.base import CallInfo, Harness, HarnessOptions, HarnessRun, Launch, Purpose
from workbench.tasks import WRITE_HINT

__all__ = ["Aider"]

# Its own transcript (`Launch.report`, what `Aider.parse_events` reads) and its input history go to HOME, not into
# the graded workspace, where aider writes them by default.
_HISTORY = ".aider.chat.history.md"

# The model's settings and metadata, in HOME, where aider looks for them by these names (then in the workspace).
_SETTINGS = ".aider.model.settings.yml"
_METADATA = ".aider.model.metadata.json"

# aider/prompts.py: the chat-history summariser (its weak model: the main one for an unknown model) and the commit
# message writer (no repository here: never sent). Every coder's own prompt (coders/*_prompts.py main_system) starts
# "Act as an expert" (whole, diff, udiff, patch, architect, editor, ask, context) after the optional prefix.
_SUMMARIZE = "*Briefly* summarize this partial conversation about programming."
_COMMIT = "You are an expert software engineer that generates concise, one-line Git commit messages"
_CODER = "Act as an expert "

# Its tool messages are the transcript's "> " lines. An API error it gave up on is one not followed by a retry.
_API_ERROR = re.compile(r"^litellm\.\w+:")
_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception)\b")
_EDIT_FAILED = ("The LLM did not conform to the edit format.", "Unable to create ", "Exception while updating files:")


class Aider(Harness):
    """aider 0.86.2 (PyPI ``aider-chat``): ``aider --message=PROMPT --yes-always``, one message, then exit.

    It edits from text, with no tools: the ``whole`` edit format (its default for a model it does not know, named
    anyway), in which the model answers with a *file listing*, the file's path on the line before a fenced block
    holding its entire new content. A path not yet in the chat is created after asking "Create new file?", which
    ``--yes-always`` answers; so ``solution.py`` needs no ``--file``. Chat Completions through litellm
    (``openai/<model>``, ``--openai-api-base``; the key in ``OPENAI_API_KEY``), ``--no-stream``: nothing is shown
    live to anyone, so each reply comes whole, as one JSON answer with its usage (streamed or not, aider treats a
    reply cut at the output cap, finish_reason "length", alike: "has hit a token limit!", nothing applied, run over;
    it would continue it only for a model marked ``supports_assistant_prefill``, which the engine is not). Headless and offline: ``--no-git`` (so no commits,
    no commit-message calls), ``--map-tokens 0`` (no repo map), no update check, analytics, release notes, model
    warnings, URL detection (its scraper would fetch) or shell-command suggestions (``--yes-always`` never runs
    them: they need an explicit yes), ``--no-pretty --no-fancy-input`` (no terminal). Its auto-lint stays on, as
    shipped: flake8 from its own venv, and a lint error is reflected back as the next agent step.

    Config in HOME: ``.aider.model.metadata.json`` (``max_input_tokens``: the context window, ``max_output_tokens``,
    zero costs: aider otherwise downloads litellm's price list, ``LITELLM_LOCAL_MODEL_COST_MAP`` keeps litellm's
    own lookups offline) and ``.aider.model.settings.yml`` (``edit_format: whole``, ``extra_params.max_tokens``: it
    sends none otherwise; `HarnessOptions.system_prompt` as ``system_prompt_prefix``: aider can only prepend to its
    prompt, never replace it, as its edit format lives there). ``--timeout`` is the request timeout.
    `HarnessOptions.tools` does not apply (no tools).

    Calls, as the harness ships: agent steps (no tools; system prompt "Act as an expert software developer",
    preceded by its few-shot file-listing turns), including its reflections (lint errors, a reply that broke the
    edit format: the next user message says so); chat-history summarisation by the weak model (system prompt
    "*Briefly* summarize this partial conversation", no tools) once the finished turns pass
    ``max_chat_history_tokens`` (a 16th of the context window, 1k to 8k), on a thread beside the agent's next step
    or before it exits. Commit messages (none: ``--no-git``) would be "other". No title call, no subagents.

    Its account of the run: the chat history (``.aider.chat.history.md`` in HOME, `Launch.report`), read when it
    exits (stdout is its terminal output): the
    task after ``#### ``, the model's replies verbatim, its own messages after ``> `` (``Tokens: ...`` after each
    agent step, ``Model ... has hit a token limit!`` instead after one cut at the cap, ``Applied edit to PATH``,
    errors).
    """

    name = "aider"
    binary = "aider"
    package = "PyPI aider-chat 0.86.2"
    needs = "`aider --message --yes-always --no-git --no-stream --no-pretty --map-tokens 0 --edit-format whole`, update check, analytics, URL detection and shell suggestions off; `~/.aider.model.metadata.json` (context window, zero costs) and `~/.aider.model.settings.yml` (max_tokens); `OPENAI_API_KEY`, `LITELLM_LOCAL_MODEL_COST_MAP`; the task as `--message=` (it takes it only as an argument), its chat history read after it exits"
    cannot = "tools (it edits from text: whole-file listings, so `HarnessOptions.tools` does not apply); replace its system prompt (a `system_prompt` is prepended: its edit format lives in its own); run shell commands (headless `--yes-always` never confirms them); apply a reply cut at the output cap (a whole-file listing must fit in max_output_tokens)"
    acts_on_text = True

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        name = f"openai/{model}"
        settings: dict = {
            "name": name,
            "edit_format": "whole",
            "use_repo_map": False,
            "streaming": False,
            "extra_params": {"max_tokens": options.max_output_tokens},
        }
        if options.system_prompt is not None:
            settings["system_prompt_prefix"] = options.system_prompt
        metadata = {
            name: {
                "max_input_tokens": options.context_tokens,
                "max_output_tokens": options.max_output_tokens,
                "max_tokens": options.max_output_tokens,
                "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0,
                "litellm_provider": "openai",
                "mode": "chat",
            }
        }
        argv = [
            self.bin(),
            "--model",
            name,
            "--openai-api-base",
            base_url,  # the key is OPENAI_API_KEY: never in argv
            "--edit-format",
            "whole",
            "--timeout",
            str(options.timeout_ms / 1000),
            "--yes-always",
            "--no-git",
            "--no-auto-commits",
            "--no-dirty-commits",
            "--map-tokens",
            "0",
            "--no-stream",
            "--no-pretty",
            "--no-fancy-input",
            "--no-check-update",
            "--no-analytics",
            "--no-show-model-warnings",
            "--no-show-release-notes",
            "--no-detect-urls",
            "--no-suggest-shell-commands",
            "--chat-history-file",
            f"~/{_HISTORY}",
            "--input-history-file",
            "~/.aider.input.history",
            # one argument, never re-read as an option (``--message-file /dev/stdin`` cannot be opened by the
            # sandbox's uid: the pipe is the runner's, and aider then read one line from its interactive prompt)
            f"--message={prompt}",
        ]
        env = {"OPENAI_API_KEY": api_key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        return Launch(
            argv=argv,
            env=env,
            stdin=b"",
            files={_SETTINGS: json.dumps([settings], indent=1), _METADATA: json.dumps(metadata, indent=1)},
            report=_HISTORY,
        )

    def task_prompt(self, instruction: str) -> str:
        """The easy set's `WRITE_HINT` names a tool aider does not have: it asks for aider's own file listing."""
        if not instruction.endswith(WRITE_HINT):
            return instruction
        return f"{instruction[: -len(WRITE_HINT)]} Reply with a file listing."

    def example_calls(self) -> tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]:
        """aider has no tools: its one action is a *file listing* (the ``whole`` format: the path, then the file's
        entire content in a fenced block), given here as ("file listing", {path, content}). It runs no command, so
        the second turn cannot be a check: it is a second listing of the same file, which runs hello() as a script."""
        hello = 'def hello():\n    return "hello"\n'
        return (
            ("file listing", {"path": "solution.py", "content": hello}),
            (
                "file listing",
                {"path": "solution.py", "content": hello + '\n\nif __name__ == "__main__":\n    print(hello())\n'},
            ),
        )

    def few_shot_prompt(self, instruction: str) -> str:
        """The instruction after two worked turns in ChatML, each reply a file listing as aider parses it (its own
        examples' plain fence), from `example_calls`: no ``<tool_call>`` blocks, which aider would never read."""
        (_, write), (_, again) = self.example_calls()

        def listing(args: dict[str, str]) -> str:
            return f"{args['path']}\n```\n{args['content']}```"

        return (
            'Create solution.py with a function hello() that returns "hello". Reply with a file listing.<|im_end|>\n'
            f"<|im_start|>assistant\n{listing(write)}<|im_end|>\n"
            "<|im_start|>user\nMake it print hello() when run as a script.<|im_end|>\n"
            f"<|im_start|>assistant\n{listing(again)}<|im_end|>\n"
            f"<|im_start|>user\n{instruction}"
        )

    def parse_events(self, stdout: str, report: str = "") -> HarnessRun:
        steps, texts, errors = 0, [], []
        edits: dict[str, int] = {}
        failures: dict[str, int] = {}
        notes: list[str] = []  # its own messages, in order
        reply: list[str] = []
        events = 0

        def end_reply() -> None:
            text = "\n".join(reply).strip()
            if text:
                texts.append(text)
            reply.clear()

        asked = False  # the model's replies follow the task; before it, the echo of its command line (the prompt)
        for line in report.splitlines():  # its transcript; stdout is its terminal output
            if line.startswith("> ") or line == ">":
                end_reply()
                notes.append(line[2:].rstrip())
            elif line.startswith("# aider chat started at"):
                end_reply()
                asked = False
            elif line.startswith("####"):
                end_reply()
                asked = True
            elif asked:
                reply.append(line)
        end_reply()
        for i, note in enumerate(notes):
            if note.startswith("Tokens: ") or note.endswith(" has hit a token limit!"):  # a reply, used or cut
                steps += 1
                events += 1
            elif note.startswith("Applied edit to "):
                edits["edit"] = edits.get("edit", 0) + 1
                events += 1
            elif note.startswith(_EDIT_FAILED):
                failures["edit"] = failures.get("edit", 0) + 1
                edits["edit"] = edits.get("edit", 0) + 1
                events += 1
            elif _API_ERROR.match(note):
                if not any(n.startswith("Retrying in ") for n in notes[i + 1 : i + 4]):  # it gave up: the run's error
                    errors.append(note[:500])
                events += 1
            elif note.startswith("Traceback (most recent call last)"):  # an exception it caught and went on past
                last = next((n for n in notes[i + 1 :] if _EXCEPTION.match(n)), "?")
                errors.append(f"Traceback: {last}"[:500])
                events += 1
        return HarnessRun(
            steps=steps, tool_calls=edits, tool_failures=failures, errors=errors, text="\n".join(texts), events=events
        )

    def classify(self, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]) -> Purpose:
        # it sends no tools: every call is told apart by its system prompt
        if system.startswith(_SUMMARIZE):
            return "compaction"
        if system.startswith(_COMMIT):
            return "other"
        return "agent" if _CODER in system else "other"

"""Harnesses: how each unmodified coding agent is launched headless, read back, and its calls tagged by purpose.

    from workbench.harnesses import HarnessOptions, get_harness
    launch = get_harness("opencode").launch(base_url=url, api_key=key, model="tiny", prompt=task.instruction,
                                            options=HarnessOptions(max_output_tokens=512))

The purpose vocabulary (`Purpose`, `CallInfo`, `Classifier`) lives here, below the capture proxy: the proxy
asks `classify_call` what each call is for, and the harness that made it answers. Private modules:
``catalog`` (the harnesses by name, and those that cannot run here), ``certified`` (what `workbench certify`
found per harness x model; a pair certified broken is refused), ``base`` (the contract), ``purpose``, one
module per harness (``opencode``, ``pi``, ``codex``, ``kilo``, ``claude_code``, ``gemini_cli``, ``qwen_code``,
``continue_cli``, ``grok_cli``, ``cline``, ``mini_swe_agent``, ``hermes``, ``aider``). docs/harnesses.md says how
to add one. ``direct`` is the baseline they are measured against (`BASELINES`): the model asked the task once,
run and graded like a harness's rollout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.harnesses.certified import certificate, refuse_broken, save_certificate, Verdict, VERDICTS
    from workbench.harnesses.base import Harness, HarnessOptions, HarnessRun, json_events, Launch
    from workbench.harnesses.catalog import classify_call, get_harness, HARNESSES, REFUSED, BASELINES
    from workbench.harnesses.opencode import OpenCode
    from workbench.harnesses.purpose import DIALECTS, CallInfo, Classifier, Dialect, Purpose

"""Kilo Code CLI (npm `@kilocode/cli`), run headless: `kilo run --format json --auto`, prompt on stdin.

Kilo's CLI is a fork of opencode: the same `run` command, JSON event stream, config schema (read from
``KILO_CONFIG_CONTENT``), title and compaction prompts, and ``KILO_*`` switches where opencode has
``OPENCODE_*``. The adapter is opencode's with those names changed; what differs is said below.
"""

from __future__ import annotations

from workbench.harnesses.base import HarnessOptions, Launch
from workbench.harnesses.opencode import OpenCode

__all__ = ["Kilo"]


class Kilo(OpenCode):
    """Kilo Code CLI 7.7.7 (npm ``@kilocode/cli``; 7.8.1's platform binary is not on the registry):
    ``kilo run --format json --auto``, prompt on stdin, Chat Completions through an
    ``@ai-sdk/openai-compatible`` provider.

    Calls, as opencode's (the same prompts, checked in its binary): one title call ("You are a title
    generator", no tools) unless the session is titled; agent steps; compaction ("You are a context
    summarization agent"); task-tool subagents (their own x-session-id). Kilo's own additions that reach a
    network (its gateway, session ingest, presence, codebase indexing, posthog telemetry) are switched off
    or find no route out of the sandbox.
    """

    name = "kilo"
    binary = "kilo"
    package = "npm @kilocode/cli 7.7.7"
    needs = (
        "`kilo run --format json --auto`; `KILO_CONFIG_CONTENT`: opencode's config (an `@ai-sdk/openai-compatible` "
        "provider, permissions allowed); `KILO_DISABLE_*` (models fetch, autoupdate, LSP downloads, plugins, share, "
        "session ingest, presence, codebase indexing)"
    )
    cannot = "its Kilo gateway models and cloud sessions (no login, no network); webfetch; codebase indexing"

    def launch(self, *, base_url: str, api_key: str, model: str, prompt: str, options: HarnessOptions) -> Launch:
        launch = super().launch(base_url=base_url, api_key=api_key, model=model, prompt=prompt, options=options)
        env = {key.replace("OPENCODE_", "KILO_", 1): value for key, value in launch.env.items()}
        env.update(
            KILO_DISABLE_SESSION_INGEST="1",
            KILO_DISABLE_PRESENCE="1",
            KILO_DISABLE_CODEBASE_INDEXING="1",
            KILO_DISABLE_EXTERNAL_SKILLS="1",
        )
        # run mode asks before acting; --auto approves what the config does not deny (the sandbox is the boundary)
        argv = [self.bin(), *launch.argv[1:], "--auto"]
        return Launch(argv=argv, env=env, stdin=launch.stdin, files=launch.files)

"""What the capture proxy asks about every call it records: which purpose it serves.

The proxy tags each captured call (agent step, title, compaction, subagent, other) so that the trainer
keeps, counts and never trains on bookkeeping calls by mistake. Only the harness knows what its own
bookkeeping calls look like, so the proxy does not decide: it asks a `Classifier`, given the facts it
has (the session's harness name, the call's system prompt, whether it offered tools, a `CallInfo` of
the call and of those tagged before it). This module is that question (and the names of the
wire dialects, which both sides speak) and nothing else: plain types, no OpenEnv, no harness class.

Direction of the imports: the harnesses own the vocabulary and answer the question; the proxy
(`workbench.capture.proxy`) asks it, importing this stage's face (`Classifier`, `classify_call`, each harness's
``classify`` looked up by name), and no harness ever imports the proxy. A classifier of your own:

    def classify(harness, *, system, has_tools, call, prior) -> Purpose:
        return "title" if system.startswith("You are a title generator") else "agent"

    CaptureProxy(upstream, model, classify=classify)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol, get_args

__all__ = ["Purpose", "PURPOSES", "Dialect", "DIALECTS", "CallInfo", "Classifier"]

# The wire dialects a harness speaks and the proxy serves, named as the trace records them: OpenAI Chat
# Completions, OpenAI Responses, Anthropic Messages, Google generateContent (OpenEnv's APIType:
# openai_chat, openai_responses, anthropic, google). The engine is always called in chat.
Dialect = Literal["chat", "responses", "anthropic", "google"]
DIALECTS: Final[tuple[Dialect, ...]] = get_args(Dialect)

Purpose = Literal["agent", "title", "compaction", "subagent", "other"]
PURPOSES: Final[tuple[Purpose, ...]] = get_args(Purpose)


@dataclass(frozen=True)
class CallInfo:
    """What classification may know about a captured call (and about earlier ones).

    `purpose` is the tag an earlier call got; on the call being classified it is ``""`` (not decided yet).
    """

    purpose: Purpose | Literal[""]
    harness_session: str | None  # the harness's own conversation id (opencode: x-session-id)
    system_digest: str | None  # sha256 of the system prompt, first 16 hex digits
    # The call's last user message, set on the call being classified only: codex sends its
    # compaction request with the agent's own system prompt, the request itself is the last message.
    last_user: str = ""


class Classifier(Protocol):
    """Maps one call to its purpose. `harness` is the session's ``metadata["harness"]`` (None when the
    session named none); `prior` lists the session's other calls tagged so far, in arrival order. A
    call is tagged from its request as it arrives (its output cap depends on the tag), and again from
    the recorded turn when the reply lands."""

    def __call__(
        self, harness: str | None, *, system: str, has_tools: bool, call: CallInfo, prior: Sequence[CallInfo]
    ) -> Purpose: ...

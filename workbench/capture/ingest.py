"""OpenEnv's ``_ingest`` for one chat completion, copied: a finished response becomes a `TurnNode`.

OpenEnv 0.10.0 records a turn inside `create_app` (server.py, ``_ingest`` at the ``tokens`` capture level),
a closure nothing outside can call. The streamed relay (`workbench.capture.stream`) assembles the same
non-streaming response OpenEnv's path would have received and records it here, so a turn captured on
either path carries the same node fields, findings, counters and ``last_turn_at``. Keep it in step with
OpenEnv's on an upgrade (the version is pinned in `workbench._compat`).

    ingest(session, chat_request, response, requested_sampling)   # never raises
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from openenv.core.harness.capture.detection import APIType
from openenv.core.harness.capture.graph import TurnNode
from openenv.core.harness.capture.server import SAMPLING_KEYS
from openenv.core.harness.capture.sessions import Session, extract_harness_session
from openenv.core.harness.capture.upstream import truncating_params
from openenv.core.harness.capture.validate import check_turn

from workbench._compat import system_digest  # OpenEnv 0.10.0's private helper

__all__ = ["ingest", "valid_token_ids"]

logger = logging.getLogger("workbench.capture.proxy")


def valid_token_ids(ids: list[Any]) -> bool:
    """`check_turn`'s test of a turn's ids (each a non-negative `int`: ``type(id) is int``, bools refused), in C
    (`map`, `min`) rather than one Python step per id: ~0.25 ms for a 7,097-id prompt. An empty list passes."""
    return not ids or (set(map(type, ids)) == {int} and min(ids) >= 0)


def ingest(
    session: Session,
    chat_request: dict[str, Any],
    response: dict[str, Any],
    requested_sampling: dict[str, Any],
    *,
    prompt_valid: bool | None = None,
) -> None:
    """OpenEnv's ``_ingest`` (server.py, the ``tokens`` level) for one accumulated response: a copy,
    since OpenEnv's is a closure inside `create_app` that nothing outside can call. Never raises: a
    capture problem degrades one turn, not the rollout or the server.

    `prompt_valid`: `valid_token_ids` of the response's prompt ids, when the caller has it already (the streamed
    relay works it out while the engine samples): `check_turn` then reads one id of a valid prompt instead of all
    of them (it reads them for that test and for being empty only; its findings are the same)."""
    try:
        choices = response.get("choices") or []
        if not choices:  # a 200 with no choices is not a turn
            logger.warning("[%s] upstream returned 200 with no choices; not recording a turn", session.session_id)
            session.upstream_errors += 1
            return
        choice = choices[0] or {}
        logprob_entries = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [e.get("logprob") for e in logprob_entries] or None
        if logprobs is not None and any(lp is None for lp in logprobs):
            logger.warning(
                "[%s] %d of %d logprobs are null; treating the turn as untrainable",
                session.session_id,
                sum(1 for lp in logprobs if lp is None),
                len(logprobs),
            )
            logprobs = None
        sampled_ids = choice.get("token_ids") or []
        prompt_ids = response.get("prompt_token_ids") or []
        index = len(session.graph.nodes())  # stats()["n_turns"], without stats()' forks and discarded-node walks
        if prompt_valid is None:
            prompt_valid = valid_token_ids(prompt_ids)
        checked = prompt_ids[:1] if prompt_valid else prompt_ids  # an invalid list goes whole: check_turn's finding
        report = check_turn(checked, sampled_ids, logprobs, finish_reason=choice.get("finish_reason"), index=index)
        session.findings.extend(str(f) for f in report.findings)
        if not report.ok:
            logger.warning(
                "[%s] turn %d rejected: %s", session.session_id, index, "; ".join(str(f) for f in report.fatal)
            )
            logprobs = None
        overridden = truncating_params(requested_sampling or chat_request)
        if overridden and not session.metadata.get("sampling_overridden"):
            session.metadata["sampling_overridden"] = overridden
            session.findings.append(
                "WARN sampling_neutralised: the harness asked for "
                + ", ".join(f"{k}={v}" for k, v in sorted(overridden.items()))
                + "; these were sent upstream at their no-op values because a processed "
                "logprob is taken after they are applied, which would bias a full-vocab "
                "recompute. requested_sampling_params preserves the harness request; "
                "sampling_params records the submitted policy."
            )
        session.graph.add_turn(
            TurnNode(
                node_id=uuid.uuid4().hex[:12],
                prompt_ids=list(prompt_ids),
                sampled_ids=list(sampled_ids),
                sampled_logprobs=list(logprobs) if logprobs else None,
                model=chat_request.get("model"),
                finish_reason=choice.get("finish_reason"),
                harness_session_id=extract_harness_session({}, chat_request),
                system_digest=system_digest(chat_request.get("messages") or []),
                n_tools=len(chat_request.get("tools") or []),
                request_messages=chat_request.get("messages") or [],
                request_tools=chat_request.get("tools"),
                sampling_params={key: chat_request[key] for key in SAMPLING_KEYS if chat_request.get(key) is not None},
                requested_sampling_params=requested_sampling or {},
                response_message=choice.get("message") or {},
            )
        )
        session.last_turn_at = time.time()
        session.metadata.setdefault("api_type", APIType.OPENAI_CHAT.value)
    except Exception:  # as OpenEnv: one turn lost, never the server
        session.findings.append("[FATAL] capture_ingest_failed: an upstream response could not be recorded")
        logger.exception("[%s] ingest failed; turn dropped", session.session_id)

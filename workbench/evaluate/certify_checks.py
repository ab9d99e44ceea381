"""The checks `workbench.evaluate.certification` grades a harness x model with: `grade` turns the rollouts' folders,
the matrix's per-rollout records and the engine/proxy probes into one `Check` each (status and evidence); the
certification module's docstring lists what each check means and how the verdict follows from them.

    checks = grade(rollout_dirs, records, probes)       # [Check("captured", "pass", "...", {...}), ...]
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from openenv.core.harness.capture.upstream import truncating_params

from workbench.harnesses import HARNESSES
from workbench.turns import TraceError, analyse, load_trace, training_trace, validate_training_trace

__all__ = ["Check", "Status", "grade"]

Status = Literal["pass", "warn", "not-observed", "eval-only", "broken"]


@dataclass
class Check:
    name: str
    status: Status
    detail: str
    evidence: dict[str, Any]


def _level(call: dict[str, Any]) -> str:
    ids = bool(call.get("prompt_token_ids")) and call.get("completion_token_ids") is not None
    lps = call.get("per_token_logps")
    if ids and lps is not None and len(lps) == len(call["completion_token_ids"]):
        return "tokens"
    return "logprobs" if lps else "text"


def grade(rollout_dirs: list[Path], records: list[dict[str, Any]], probes: dict[str, Any]) -> list[Check]:
    """The checks from the rollouts' folders, the matrix's per-rollout records and the endpoint `probes`."""
    calls_of: dict[Path, list[dict[str, Any]]] = {}
    unreadable: dict[str, str] = {}
    for d in rollout_dirs:
        try:
            calls_of[d] = load_trace(d / "trace.json") if (d / "trace.json").is_file() else []
        except TraceError as exc:  # never an empty trace: OpenEnv's validator would pass `[]`
            unreadable[d.name] = str(exc)[:300]
    empty = [d.name for d, cs in calls_of.items() if not cs]
    agent = [c for cs in calls_of.values() for c in cs if c.get("purpose") == "agent" and c.get("status") == "ok"]
    checks = [
        Check(
            "captured",
            "pass" if agent else "broken",
            f"{len(agent)} agent calls answered and recorded in {len(rollout_dirs)} rollouts",
            {
                "agent_calls": len(agent),
                "rollouts": len(rollout_dirs),
                "statuses": dict(Counter(r["status"] for r in records)),
            },
        )
    ]
    levels: dict[str, Counter[str]] = {}
    for c in agent:
        levels.setdefault(str(c.get("dialect", "chat")), Counter())[_level(c)] += 1
    below = {d: dict(n) for d, n in levels.items() if set(n) != {"tokens"}}
    checks.append(
        Check(
            "capture_level",
            "eval-only" if below else ("pass" if levels else "broken"),
            ", ".join(f"{d}: {'/'.join(sorted(n))}" for d, n in levels.items()) or "nothing captured",
            {d: dict(n) for d, n in levels.items()},
        )
    )
    checks.append(
        Check(
            "traces",
            "broken" if unreadable else ("not-observed" if empty or not rollout_dirs else "pass"),
            f"{len(calls_of) - len(empty)}/{len(rollout_dirs)} rollouts' traces readable and non-empty"
            + (f"; unreadable: {sorted(unreadable)}" if unreadable else "")
            + (f"; empty: {empty}" if empty else ""),
            {"unreadable": unreadable, "empty": empty},
        )
    )
    invalid = {}
    for d, cs in calls_of.items():
        if not cs:
            continue  # said by "traces"; an empty trace passes OpenEnv's validator and proves nothing
        try:
            validate_training_trace(training_trace(cs), str(d.name))
        except (TraceError, ValueError, KeyError) as exc:
            invalid[d.name] = str(exc)[:300]
    validated = len(calls_of) - len(empty)
    checks.append(
        Check(
            "openenv_contract",
            "broken" if invalid else ("pass" if validated else "not-observed"),
            f"{validated - len(invalid)}/{validated} non-empty training traces pass OpenEnv's TrainingTrace",
            {"invalid": invalid, "validated": validated},
        )
    )
    pairing = probes["pairing"]
    checks.append(
        Check(
            "token_logprob_pairing",
            "pass" if pairing["paired"] == pairing["tokens"] > 0 else "broken",
            f"{pairing['paired']}/{pairing['tokens']} logprobs named by the id sampled there",
            pairing,
        )
    )
    mode = probes["logprob_mode"]
    checks.append(
        Check(
            "logprob_mode",
            "pass" if mode["mode"] == "processed" else "eval-only",
            f"top-2 gap at T=2 / T=1 = {mode['ratio']} ({mode['mode']}: 0.5 is processed, 1.0 raw)",
            mode,
        )
    )
    effective = [c.get("sampling_params") or {} for c in agent]
    requested = Counter(json.dumps(c.get("requested_sampling_params") or {}, sort_keys=True) for c in agent)
    narrowed = sum(bool(truncating_params(p)) for p in effective)  # OpenEnv's own test of a narrowed policy
    checks.append(
        Check(
            "full_vocab_sampling",
            "eval-only" if narrowed else "pass",
            f"{len(effective) - narrowed}/{len(effective)} calls sampled the whole vocabulary"
            + (
                f"; the harness asked {len(requested)} sampling setting(s), neutralised"
                if any(k != "{}" for k in requested)
                else ""
            ),
            {"requested": {k: n for k, n in requested.items()}, "effective": effective[:1], "narrowed": narrowed},
        )
    )
    recorded = sum(r["recorded"] for r in records)
    exact = sum(r["exact"] for r in records)
    checks.append(
        Check(
            "record_engine_ids",
            "not-observed" if not recorded else ("pass" if exact == recorded else "eval-only"),
            f"{exact}/{recorded} recorded prompts equal the engine's /tokenize of the recorded request",
            {"exact": exact, "recorded": recorded, "tokenize_errors": sum(r["tokenize_errors"] for r in records)},
        )
    )
    stream = probes["stream"]
    checks.append(
        Check(
            "stream_ids",
            "pass" if stream["equal"] else "broken",
            "same ids streamed and not (engine, one seed); the proxy recorded the ids of exactly the text it sent, both ways"
            if stream["equal"]
            else f"engine ids equal: {stream['engine_same_seed_equal']}; proxy records = text sent: "
            f"{stream['proxy_recorded_is_what_was_sent']}",
            stream,
        )
    )
    transitions = sum(r["transitions"] for r in records)
    forks = sum(r["forks"] for r in records)
    causes: Counter[str] = Counter()
    for r in records:
        causes.update(r["fork_causes"])
    # a rollout of two or more agent calls whose turns chain, or whose every fork has a known cause
    shown = sum(1 for r in records if r["transitions"] and not r["fork_causes"].get("other"))
    checks.append(
        Check(
            "chaining",
            "not-observed" if not shown else ("warn" if causes.get("other") else "pass"),
            f"{transitions - forks}/{transitions} turns chained; forks by cause {dict(causes) or 'none'}; "
            f"{shown} multi-call rollouts chained or forked for a known cause",
            {"transitions": transitions, "forks": forks, "fork_causes": dict(causes), "multi_call_shown": shown},
        )
    )
    checks.append(_harness_log(rollout_dirs))
    degenerate = [d.name for d, cs in calls_of.items() if sum(c.get("purpose") == "agent" for c in cs) == 1]
    checks.append(
        Check(
            "degenerate",
            "warn" if degenerate else "pass",
            f"{len(degenerate)}/{len(calls_of)} rollouts made one model call for the whole task",
            {"rollouts": degenerate},
        )
    )
    trained = sum(r.n_trained for cs in calls_of.values() if cs for r in analyse(cs).rows)
    checks.append(
        Check(
            "trainable",
            "pass" if trained else "not-observed",
            f"{trained} tokens trained by the default turn policy (turns with a tool call)",
            {"trained_tokens": trained},
        )
    )
    checks.append(_tool_use(calls_of))
    checks.append(_fidelity(agent))
    checks.append(_parser(rollout_dirs, agent))
    lost = {d.name: n for d in rollout_dirs if (n := _summary(d).get("capture_ingest_failed"))}
    checks.append(
        Check(
            "ingest",
            "eval-only" if lost else "pass",
            f"{sum(lost.values())} model calls answered but not recorded (capture_ingest_failed)"
            + (f" in {lost}" if lost else ""),
            {"capture_ingest_failed": lost},
        )
    )
    return checks


def _summary(d: Path) -> dict[str, Any]:
    try:
        return json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
    except ValueError:
        return {}


# a reply that tried to call a tool in a form the parser could not read: a JSON object naming a tool and its
# arguments, or a tagged call, left as plain text
_ATTEMPT = re.compile(r'"name"\s*:\s*"[^"]+"\s*,\s*"(arguments|parameters)"|<tool_call>')


def _parser(rollout_dirs: list[Path], agent: list[dict[str, Any]]) -> Check:
    """The tool parser the engine read the calls with (every rollout's summary.json) and the replies it could not
    read: text that holds a call (`_ATTEMPT`) but gave no tool call. More than one parser in one run is broken."""
    parsers = sorted({str(p) for d in rollout_dirs if (p := _summary(d).get("tool_parser"))})
    unparsed = 0
    for c in agent:
        message = c["response"]["choices"][0].get("message") or {}
        unparsed += not message.get("tool_calls") and bool(_ATTEMPT.search(str(message.get("content") or "")))
    rate = round(unparsed / len(agent), 4) if agent else None
    status: Status = (
        "broken"
        if len(parsers) > 1
        else "not-observed"  # no reply to read, or no parser recorded: nothing was judged
        if not agent or not parsers
        else "warn"
        if unparsed
        else "pass"
    )
    return Check(
        "parser",
        status,
        f"tool parser {'/'.join(parsers) or 'not recorded'}; {unparsed}/{len(agent)} replies held a call no parser read",
        {"parsers": parsers, "unparsed_replies": unparsed, "agent_replies": len(agent), "unparsed_rate": rate},
    )


def _fidelity(agent: list[dict[str, Any]]) -> Check:
    """Every block each request carried, found in what reached the engine (`workbench.capture.fidelity`, recorded
    per answered call): a dropped one breaks the pair; merged text blocks and images are counted (a warning)."""
    seen = [c["fidelity"] for c in agent if c.get("fidelity") is not None]
    dropped = [d for f in seen for d in f["dropped"]]
    merged, images = sum(f["merged"] for f in seen), sum(f["images"] for f in seen)
    moved, stripped = sum(f.get("moved", 0) for f in seen), sum(f.get("stripped", 0) for f in seen)
    status: Status = (
        "not-observed" if not seen else "broken" if dropped else "warn" if merged or moved or images else "pass"
    )
    return Check(
        "dialect_fidelity",
        status,
        f"{len(seen)}/{len(agent)} requests matched block by block against what reached the engine: "
        f"{len(dropped)} blocks dropped, {merged} text blocks merged into one message, {moved} moved ahead, "
        f"{stripped} stripped on purpose (billing headers), {images} images",
        {
            "calls": len(seen),
            "dropped": dropped[:10],
            "merged": merged,
            "moved": moved,
            "stripped": stripped,
            "images": images,
        },
    )


def _tool_use(calls_of: dict[Path, list[dict[str, Any]]]) -> Check:
    """At least one tool call the harness executed: a later agent call's request carries its result (a ``tool``
    message, in the chat form the proxy forwards for every dialect)."""
    executed: dict[str, int] = {}
    for d, cs in calls_of.items():
        # the last request holds every result so far; the most any request held is the count
        n = max(
            (
                sum(m.get("role") == "tool" for m in ((c.get("request") or {}).get("messages") or []))
                for c in cs
                if c.get("purpose") == "agent"
            ),
            default=0,
        )
        if n:
            executed[d.name] = n
    return Check(
        "tool_use",
        "pass" if executed else "not-observed",
        f"{sum(executed.values())} tool results sent back to the model in {len(executed)}/{len(calls_of)} rollouts",
        {"tool_results": executed},
    )


def _harness_log(rollout_dirs: list[Path]) -> Check:
    """The harness's own tool-call record vs the captured completions'. More tool runs than captured requests means
    calls escaped the capture (broken); the same count under other names is the harness renaming what it ran
    (opencode runs a malformed call as its tool ``invalid``): MISMATCH, a warning with both records. A harness that
    acts on the reply's text (`Harness.acts_on_text`: aider's edits are file listings) has nothing to match: its
    record is counted as ``text``, never as an escape, and compares nothing."""
    per: dict[str, str] = {}
    escaped: dict[str, dict[str, Any]] = {}
    renamed: dict[str, dict[str, Any]] = {}
    for d in rollout_dirs:
        s = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
        said, seen = s.get("harness_tool_calls") or {}, s.get("tool_calls") or {}
        if s.get("harness") in HARNESSES and HARNESSES[s["harness"]].acts_on_text:
            per[d.name] = "text"
            continue
        if not said and not s.get("harness_steps"):  # the harness left no record of its own to compare
            per[d.name] = "none"
            continue
        if not said and not seen:  # both records empty: nothing was compared
            per[d.name] = "empty"
            continue
        per[d.name] = "match" if said == seen else "MISMATCH"
        if sum(said.values()) > sum(seen.values()):
            escaped[d.name] = {"harness": said, "captured": seen}
        elif said != seen:
            renamed[d.name] = {"harness": said, "captured": seen}
    counts = Counter(per.values())
    status: Status = (
        "broken"
        if escaped
        else "warn"
        if counts["MISMATCH"]
        else "pass"
        if counts["match"]
        else "not-observed"  # no tool call recorded on both sides anywhere: nothing was compared
    )
    return Check(
        "harness_log",
        status,
        f"match {counts['match']}, MISMATCH {counts['MISMATCH']}, empty {counts['empty']}, none {counts['none']}"
        + (
            f", text {counts['text']} (the harness acts on the reply's text, not on tool calls)"
            if counts["text"]
            else ""
        )
        + (f"; the harness ran more tools than captured completions asked for: {escaped}" if escaped else "")
        + (f"; same count, other names: {renamed}" if renamed else ""),
        {"per_rollout": per, "escaped": escaped, "renamed": renamed},
    )

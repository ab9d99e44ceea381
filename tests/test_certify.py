"""Certification (workbench.evaluate.certification, workbench.harnesses.certified): the checks on real shipped
captures made good or bad by hand, the verdict, the refusal of a pair certified broken, and one real run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from workbench.evaluate import CertifyConfig, certify, render_certificate
from workbench.evaluate.certification import Check, grade, missing_evidence, verdict
from workbench.harnesses import certificate, refuse_broken, save_certificate

SHIPPED = Path(__file__).resolve().parents[1] / "workbench" / "data" / "rollouts"
GOOD_PROBES = {
    "pairing": {"tokens": 16, "paired": 16},
    "logprob_mode": {"mode": "processed", "ratio": 0.5, "gap_t1": 0.68, "gap_t2": 0.34},
    "stream": {"equal": True, "engine_same_seed_equal": True, "proxy_recorded_is_what_was_sent": {}},
}


def _record(**kw):
    return {
        "status": "ok",
        "recorded": 2,
        "exact": 2,
        "tokenize_errors": 0,
        "transitions": 1,
        "forks": 0,
        "fork_causes": {},
    } | kw


def _copy(tmp_path, name="smollm2-easy"):
    """A real SmolLM2 rollout through opencode (write, its result sent back, a closing reply), with the harness's own
    record of the write it ran (its summary predates that field)."""
    from workbench.capture.fidelity import fidelity

    d = Path(shutil.copytree(SHIPPED / name, tmp_path / name))
    summary = json.loads((d / "summary.json").read_text())
    recorded_now = {"harness_tool_calls": {"write": 1}, "harness_steps": 2, "tool_parser": "hermes"}
    (d / "summary.json").write_text(json.dumps({**summary, **recorded_now}))
    calls = json.loads((d / "trace.json").read_text())
    for c in calls:  # what today's proxy records per answered call (the trace predates it): a chat request, whole
        if c.get("request"):
            c["fidelity"] = fidelity({"messages": c["request"]["messages"]}, "chat", c["request"]["messages"])
    (d / "trace.json").write_text(json.dumps(calls))
    return d


def _by_name(checks):
    return {c.name: c for c in checks}


def test_a_good_capture_is_training_grade(tmp_path):
    checks = grade([_copy(tmp_path)], [_record()], GOOD_PROBES)
    assert verdict(checks) == "training-grade"
    got = _by_name(checks)
    assert set(got) == {
        "captured", "capture_level", "openenv_contract", "token_logprob_pairing", "logprob_mode",
        "full_vocab_sampling", "record_engine_ids", "stream_ids", "chaining", "harness_log", "degenerate", "trainable",
        "traces", "tool_use", "ingest", "parser", "dialect_fidelity",
    }  # fmt: skip
    assert got["tool_use"].evidence == {"tool_results": {"smollm2-easy": 1}} and got["harness_log"].status == "pass"
    assert got["capture_level"].evidence == {"chat": {"tokens": 2}}
    assert got["trainable"].evidence == {"trained_tokens": 53} and got["degenerate"].status == "pass"


def test_each_defect_gives_its_verdict_with_evidence(tmp_path):
    d = _copy(tmp_path)
    calls = json.loads((d / "trace.json").read_text())
    # the harness says it ran `write` twice; the capture saw one completion asking for it: a call escaped
    summary = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps({**summary, "harness_tool_calls": {"write": 2}}))
    got = _by_name(grade([d], [_record()], GOOD_PROBES))
    escaped = {d.name: {"harness": {"write": 2}, "captured": {"write": 1}}}
    assert got["harness_log"].status == "broken" and got["harness_log"].evidence["escaped"] == escaped
    # the same count under another name (opencode runs a malformed call as `invalid`): a warning, not broken
    (d / "summary.json").write_text(json.dumps({**summary, "harness_tool_calls": {"invalid": 1}}))
    got = _by_name(grade([d], [_record()], GOOD_PROBES))
    assert got["harness_log"].status == "warn" and got["harness_log"].evidence["per_rollout"] == {d.name: "MISMATCH"}
    # aider edits from the reply's text: its "edit" is no escaped tool call, and nothing can be compared
    (d / "summary.json").write_text(json.dumps({**summary, "harness": "aider", "harness_tool_calls": {"edit": 1}}))
    got = _by_name(grade([d], [_record()], GOOD_PROBES))
    assert got["harness_log"].status == "not-observed" and got["harness_log"].evidence["per_rollout"] == {
        d.name: "text"
    }

    # raw logprobs, a narrowed vocabulary, text-only capture: each makes the pair eval-only, not broken
    calls[1]["sampling_params"] = {**calls[1]["sampling_params"], "top_p": 0.9}
    calls[2]["per_token_logps"] = None
    (d / "trace.json").write_text(json.dumps(calls))
    (d / "summary.json").write_text(json.dumps(summary))
    raw = {**GOOD_PROBES, "logprob_mode": {"mode": "raw", "ratio": 1.0, "gap_t1": 0.7, "gap_t2": 0.7}}
    checks = grade([d], [_record()], raw)
    got = _by_name(checks)
    assert got["logprob_mode"].status == "eval-only" and got["full_vocab_sampling"].evidence["narrowed"] == 1
    assert verdict(checks) == "eval-only"

    # a positive logprob breaks OpenEnv's contract: broken, with OpenEnv's words
    calls[2]["per_token_logps"] = [0.5] + [-0.1] * (len(calls[2]["completion_token_ids"]) - 1)
    (d / "trace.json").write_text(json.dumps(calls))
    got = _by_name(checks := grade([d], [_record()], GOOD_PROBES))
    assert (
        got["openenv_contract"].status == "broken" and "positive" in got["openenv_contract"].evidence["invalid"][d.name]
    )
    assert verdict(checks) == "broken"
    assert verdict([Check("x", "warn", "", {})]) == "training-grade"


def _edit(d: Path, name: str, change) -> None:
    path = d / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def _no_tool_result(calls):
    for c in calls:
        if c.get("request"):
            c["request"]["messages"] = [m for m in c["request"]["messages"] if m.get("role") != "tool"]
    return calls


def _no_tool_calls(calls):
    for c in calls:
        if c.get("response"):
            c["response"]["choices"][0]["message"]["tool_calls"] = None
    return calls


@pytest.mark.parametrize(
    ("defect", "check", "status", "expected"),
    [
        ("one call only", "chaining", "not-observed", "unverified"),
        ("no tool call executed", "tool_use", "not-observed", "unverified"),
        ("zero trained tokens", "trainable", "not-observed", "unverified"),
        ("empty harness log", "harness_log", "not-observed", "unverified"),
        ("nothing recorded to tokenize", "record_engine_ids", "not-observed", "unverified"),
        ("an empty trace", "traces", "not-observed", "unverified"),
        ("a prompt that is not the engine's", "record_engine_ids", "eval-only", "eval-only"),
        ("a FATAL ingest", "ingest", "eval-only", "eval-only"),
        ("a corrupt trace", "traces", "broken", "broken"),
        ("a block the transform dropped", "dialect_fidelity", "broken", "broken"),
        ("no parser recorded", "parser", "not-observed", "unverified"),
    ],
)
def test_each_missing_piece_of_evidence_turns_the_verdict(tmp_path, defect, check, status, expected):
    """Training-grade only with the evidence seen in the certify run itself; what it could not observe is named."""
    d, record = _copy(tmp_path), _record()
    dirs, records = [d], [record]
    if defect == "one call only":
        record = _record(transitions=0)
    elif defect == "no tool call executed":
        _edit(d, "trace.json", _no_tool_result)
    elif defect == "zero trained tokens":
        _edit(d, "trace.json", _no_tool_calls)
    elif defect == "empty harness log":
        _edit(d, "summary.json", lambda s: {**s, "harness_tool_calls": {}, "tool_calls": {}})
    elif defect == "nothing recorded to tokenize":
        record = _record(recorded=0, exact=0)
    elif defect == "an empty trace":  # beside a good rollout (with no call at all, nothing was captured: broken)
        other = Path(shutil.copytree(d, tmp_path / "other"))
        (other / "trace.json").write_text("[]")
        dirs, records = [d, other], [record, _record(recorded=0, exact=0, transitions=0)]
    elif defect == "a prompt that is not the engine's":
        record = _record(exact=1)
    elif defect == "a FATAL ingest":
        _edit(d, "summary.json", lambda s: {**s, "capture_ingest_failed": 1})
    elif defect == "a corrupt trace":
        (d / "trace.json").write_text("{")
    elif defect == "no parser recorded":
        _edit(d, "summary.json", lambda s: {k: v for k, v in s.items() if k != "tool_parser"})
    elif defect == "a block the transform dropped":  # an Anthropic text block that never reached the engine

        def dropped(calls):
            calls[-1]["fidelity"] = {**calls[-1]["fidelity"], "dropped": ["text (user): 'the hint'"]}
            return calls

        _edit(d, "trace.json", dropped)
    if defect != "an empty trace":
        records = [record]
    checks = grade(dirs, records, GOOD_PROBES)
    got = _by_name(checks)
    assert got[check].status == status, got[check]
    assert verdict(checks) == expected
    if expected == "unverified":
        assert any(line.startswith(f"{check}: ") for line in missing_evidence(checks))


def test_the_parser_is_recorded_and_a_call_it_could_not_read_is_counted(tmp_path):
    d = _copy(tmp_path)
    _edit(d, "summary.json", lambda s: {**s, "tool_parser": "json"})
    got = _by_name(grade([d], [_record()], GOOD_PROBES))["parser"]
    assert (got.status, got.evidence["parsers"], got.evidence["unparsed_replies"]) == ("pass", ["json"], 0)

    def prose_call(calls):  # the last reply: a call written as text with a stray quote, left unparsed
        c = calls[-1]["response"]["choices"][0]["message"]
        c["tool_calls"], c["content"] = None, '{"name": "write", "arguments": {"content": "x = "1"}}'
        return calls

    _edit(d, "trace.json", prose_call)
    got = _by_name(grade([d], [_record()], GOOD_PROBES))["parser"]
    assert got.status == "warn" and got.evidence["unparsed_replies"] == 1 and got.evidence["unparsed_rate"] == 0.5
    other = Path(shutil.copytree(d, tmp_path / "other"))
    _edit(other, "summary.json", lambda s: {**s, "tool_parser": "hermes"})
    mixed = grade([d, other], [_record(), _record()], GOOD_PROBES)
    assert _by_name(mixed)["parser"].status == "broken" and verdict(mixed) == "broken"


def test_a_pair_certified_broken_is_refused_by_the_matrix_and_train(tmp_path, monkeypatch):
    from workbench.evaluate import MatrixConfig, run_matrix
    from workbench.train import GRPORun, TrainConfig

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WORKBENCH_RUNS", str(tmp_path / "runs"))
    shipped = certificate("pi", "tiny")  # no cache yet: the committed certificate
    assert shipped["verdict"] == "unverified" and "workbench/data/certificates" in shipped["path"]
    assert certificate("pi", "no-such-model") is None
    cert = {
        "harness": "pi",
        "model": "tiny",
        "date": "2026-12-03",
        "verdict": "broken",
        "checks": [{"name": "stream_ids", "status": "broken", "detail": "they differ", "evidence": {}}],
    }
    save_certificate(cert)
    assert "cache" in certificate("pi", "tiny")["path"]  # this machine's newer certificate wins
    with pytest.raises(ValueError, match=r"pi x tiny is certified broken .*stream_ids: they differ.*workbench certify"):
        refuse_broken("pi", "tiny")
    with pytest.raises(ValueError, match="certified broken"):
        run_matrix(MatrixConfig(harnesses=("pi",), models=("tiny",)), run_dir=tmp_path / "m", progress=False)
    assert not (tmp_path / "m").exists()  # refused before the run folder, let alone an engine

    save_certificate({**cert, "harness": "opencode"})
    with pytest.raises(ValueError, match="opencode x tiny is certified broken"):
        GRPORun(TrainConfig(model="tiny", steps=1), run_dir=tmp_path / "t").train()
    save_certificate({**cert, "harness": "opencode", "verdict": "eval-only"})
    refuse_broken("opencode", "tiny")  # eval-only is not refused
    (tmp_path / "cache" / "certificates" / "opencode--tiny.json").write_text("{")
    with pytest.raises(ValueError, match="unreadable"):
        certificate("opencode", "tiny")


def test_the_shipped_certificates_are_read_and_say_what_they_measured():
    """Every shipped certificate is graded under the current rules: the thirteen harnesses x tiny certified anew (the
    random model never calls a tool: none training-grade; qwen-code's agent call was stopped at once, nothing
    captured: broken), the SmolLM2 ones re-graded from their stored evidence (unverified), the thirteen x qwen-coder
    (nine training-grade). Each names what it lacks; a training-grade one lacks nothing and shows its evidence:
    tokens trained, a tool result sent back, a multi-call rollout chained or forked for a known cause."""
    from workbench.evaluate.certification import RULES, regrade

    shipped = sorted((Path(__file__).resolve().parents[1] / "workbench" / "data" / "certificates").glob("*.json"))
    assert len(shipped) >= 6
    for path in shipped:
        cert = json.loads(path.read_text())
        assert path.name == f"{cert['harness']}--{cert['model']}.json"
        assert cert["rules"] == RULES and regrade(cert) == cert
        assert cert["verdict"] == verdict([Check(**c) for c in cert["checks"]])
        if cert["verdict"] == "training-grade":
            checks = {c["name"]: c for c in cert["checks"]}
            assert cert["model"] != "tiny" and not cert["missing"], path.name
            assert all(c["status"] in ("pass", "warn") for c in cert["checks"]), path.name
            assert checks["trainable"]["evidence"]["trained_tokens"] > 0 and checks["tool_use"]["status"] == "pass"
            assert checks["chaining"]["status"] == "pass" and checks["traces"]["status"] == "pass"
        if cert.get("regraded_from_rules"):
            assert cert["verdict"] == "unverified"
        trainable = next(c for c in cert["checks"] if c["name"] == "trainable")
        assert trainable["evidence"]["trained_tokens"] or any(m.startswith("trainable: ") for m in cert["missing"])
        assert all(c["detail"] and isinstance(c["evidence"], dict) for c in cert["checks"])
        assert cert["verdict"] in render_certificate(cert)


@pytest.mark.engine
def test_certify_one_real_pair(engine, tmp_path, monkeypatch):
    """codex x tiny through the real binary, engine and proxy: every check ran, the certificate is written to the
    run folder and the cache (replacing an old broken one), the engine probes measured processed logprobs (ratio
    0.5) and paired ids, and the verdict fails closed on what the random model never shows."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    save_certificate(
        {"harness": "codex", "model": "tiny", "verdict": "broken", "checks": []}
    )  # re-certifying is allowed
    cert = certify(
        CertifyConfig(harness="codex", model="tiny", tasks="easy[:1]", n=1, max_output_tokens=32),
        run_dir=tmp_path / "c",
        engine=engine,
        progress=False,
    )
    checks = {c["name"]: c for c in cert["checks"]}
    # the random tiny model makes one call and no tool call: what a training-grade pair must show is not observed
    assert len(checks) == 17 and cert["verdict"] == "unverified" and cert["rules"] == 2, checks
    assert checks["dialect_fidelity"]["evidence"]["dropped"] == [] and checks["dialect_fidelity"]["evidence"]["calls"]
    assert {line.split(":")[0] for line in cert["missing"]} >= {"tool_use", "trainable"}, cert["missing"]
    assert checks["parser"]["evidence"]["parsers"] == ["hermes"]  # recorded in every rollout's summary
    assert checks["logprob_mode"]["evidence"]["ratio"] == pytest.approx(0.5, abs=0.01)
    assert (
        checks["token_logprob_pairing"]["evidence"]["paired"]
        == checks["token_logprob_pairing"]["evidence"]["tokens"]
        > 0
    )
    assert checks["stream_ids"]["evidence"]["engine_same_seed_equal"]
    assert json.loads((tmp_path / "c" / "certificate.json").read_text())["verdict"] == cert["verdict"]
    assert certificate("codex", "tiny")["verdict"] == cert["verdict"]


def test_a_held_back_partial_character_is_no_difference():
    from workbench.evaluate.certify_probes import same_text

    assert same_text("abc naiveswift \ufffd", "abc naiveswift")  # the engine held back a partial last token
    assert same_text("abc", "abc") and not same_text(None, "abc")
    assert not same_text("abc naiveswift", "abc naive")  # a real difference
    assert not same_text("abX \ufffd", "abc")


def test_a_stop_token_is_recorded_but_not_sent():
    """A reply that ended on the model's stop token: its id is recorded (and trained), its text never sent."""
    from workbench.evaluate.certify_probes import same_text

    assert same_text("Please add.<|im_end|>", "Please add.", before_stop="Please add.")
    assert not same_text("Please add.<|im_end|>", "Please add.")  # not stopped on a token: a difference
    assert not same_text("Please adX<|im_end|>", "Please add.", before_stop="Please adX")

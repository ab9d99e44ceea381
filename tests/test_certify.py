"""Certification (workbench.evaluate.certification, workbench.harnesses.certified): the checks on real shipped
captures made good or bad by hand, the verdict, the refusal of a pair certified broken, and one real run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from workbench.evaluate import CertifyConfig, certify, render_certificate
from workbench.evaluate.certification import Check, grade, verdict
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
    return Path(shutil.copytree(SHIPPED / name, tmp_path / name))


def _by_name(checks):
    return {c.name: c for c in checks}


def test_a_good_capture_is_training_grade(tmp_path):
    checks = grade([_copy(tmp_path)], [_record()], GOOD_PROBES)
    assert verdict(checks) == "training-grade"
    got = _by_name(checks)
    assert set(got) == {
        "captured", "capture_level", "openenv_contract", "token_logprob_pairing", "logprob_mode",
        "full_vocab_sampling", "exact_prompt_ids", "stream_ids", "chaining", "harness_log", "degenerate", "trainable",
    }  # fmt: skip
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


def test_a_pair_certified_broken_is_refused_by_the_matrix_and_train(tmp_path, monkeypatch):
    from workbench.evaluate import MatrixConfig, run_matrix
    from workbench.train import GRPORun, TrainConfig

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WORKBENCH_RUNS", str(tmp_path / "runs"))
    shipped = certificate("pi", "tiny")  # no cache yet: the committed certificate
    assert shipped["verdict"] == "training-grade" and "workbench/data/certificates" in shipped["path"]
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
    shipped = sorted((Path(__file__).resolve().parents[1] / "workbench" / "data" / "certificates").glob("*.json"))
    assert len(shipped) >= 6
    for path in shipped:
        cert = json.loads(path.read_text())
        assert path.name == f"{cert['harness']}--{cert['model']}.json"
        assert cert["verdict"] in ("training-grade", "eval-only", "broken") and len(cert["checks"]) == 12
        assert all(c["detail"] and isinstance(c["evidence"], dict) for c in cert["checks"])
        assert cert["verdict"] in render_certificate(cert)


@pytest.mark.engine
def test_certify_one_real_pair(engine, tmp_path, monkeypatch):
    """codex x tiny through the real binary, engine and proxy: every check ran, the certificate is written to the
    run folder and the cache (replacing an old broken one), and the engine probes measured processed logprobs
    (ratio 0.5) and paired ids."""
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
    assert len(checks) == 12 and cert["verdict"] == "training-grade", checks
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

"""`record_config` on --resume: what counts as the run's own config (no engine, no model)."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict

import pytest

from workbench.cpu import machine
from workbench.runs import RunDir
from workbench.train import TrainConfig
from workbench.train.resume import record_config


def saved_run(tmp_path, train: dict) -> RunDir:
    run = RunDir.create("train", path=tmp_path / "run")
    (run.path / "config.json").write_text(json.dumps({"train": train}))
    return run


def test_a_field_added_since_the_run_at_its_default_and_the_same_prompting_resume(tmp_path):
    """A run made before `tool_parser` existed, with few_shot False / agent_prompt "default" spelled out."""
    old = asdict(TrainConfig(model="smollm2"))
    del old["tool_parser"]
    old.update(few_shot=False, agent_prompt="default")
    run = saved_run(tmp_path, old)
    before = (run.path / "config.json").read_bytes()
    record_config(run, {"train": asdict(TrainConfig(model="smollm2"))}, resume=True, checkpoint=tmp_path / "ckpt-1")
    assert (run.path / "config.json").read_bytes() == before
    entry = json.loads((run.path / "resumes.jsonl").read_text())
    assert entry["checkpoint"] == "ckpt-1" and entry["machine"] == machine()  # a run may resume on another machine


def test_the_machine_names_the_cpu_by_family_and_model_and_the_kernel():
    cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
    got = machine(cpuinfo)
    assert got["cpu"] == "AMD EPYC family 26 model 2" and got["kernel"] == platform.release()
    assert machine("")["cpu"] == "? family ? model ?"  # nothing to read: said, not guessed


def test_prompting_that_resolves_otherwise_or_a_new_field_off_its_default_is_refused(tmp_path):
    old = asdict(TrainConfig(model="qwen-coder"))
    del old["tool_parser"]
    old.update(few_shot=False, agent_prompt="default")  # qwen-coder unset now means short + few-shot
    run = saved_run(tmp_path, old)
    with pytest.raises(ValueError, match=r"train\.agent_prompt.*train\.few_shot"):
        record_config(run, {"train": asdict(TrainConfig(model="qwen-coder"))}, resume=True, checkpoint=tmp_path / "c")
    with pytest.raises(ValueError, match=r"train\.tool_parser: None in config.json, 'hermes' now"):
        new = asdict(TrainConfig(model="qwen-coder", few_shot=False, agent_prompt="default", tool_parser="hermes"))
        record_config(run, {"train": new}, resume=True, checkpoint=tmp_path / "c")


def test_a_run_made_before_the_engine_kernels_were_recorded_resumes_and_logs_them(tmp_path):
    """`engine_kernels` is how the run uses this machine (zentorch in the venv or not): a resume may change it."""
    run = RunDir.create("train", path=tmp_path / "run")
    (run.path / "config.json").write_text(json.dumps({"train": asdict(TrainConfig()), "cpu_flags": ["avx2"]}))
    new = {"train": asdict(TrainConfig()), "cpu_flags": ["avx2"], "engine_kernels": "zentorch"}
    record_config(run, new, resume=True, checkpoint=tmp_path / "ckpt-3")
    assert json.loads((run.path / "resumes.jsonl").read_text())["changed"] == {"engine_kernels": [None, "zentorch"]}
    with pytest.raises(ValueError, match=r"cpu_flags"):  # the host's flags are not: another host is another run
        record_config(run, {**new, "cpu_flags": ["avx2", "avx512f"]}, resume=True, checkpoint=tmp_path / "ckpt-3")

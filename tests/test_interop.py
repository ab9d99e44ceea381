"""OpenEnv training traces in and out (workbench.turns.interop), producer-owned per-token masks, TRL's lossless rows.

Every document is checked by the installed OpenEnv 0.10.0's own `TrainingTrace`; the TRL side is TRL 1.16's own
chaining (`_compat.trl_lossless_rows`). Real shipped captures and the fixtures in workbench/data/traces/ (written by
OpenEnv's classes: scripts/make_openenv_traces.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import _compat
from workbench.turns import (
    TraceError,
    analyse,
    export_rollout,
    import_trace,
    load_trace,
    load_turns,
    read_trace,
    training_trace,
    write_turns,
)

DATA = Path(__file__).resolve().parents[1] / "workbench" / "data"
SHIPPED = sorted(p for p in (DATA / "rollouts").iterdir() if (p / "trace.json").is_file())
FIXTURES = sorted((DATA / "traces").glob("openenv-*.json"))


@pytest.fixture(scope="module")
def openenv_trace():
    from openenv.core.harness.training import TrainingTrace

    return TrainingTrace


@pytest.mark.parametrize("rollout", SHIPPED, ids=lambda p: p.name)
def test_an_exported_rollout_loads_in_openenv_and_comes_back_unchanged(rollout, tmp_path, openenv_trace):
    """Export -> OpenEnv's validator -> import -> export: the second file is the first byte for byte, and the
    imported folder has the same turns, rows and masks as the capture."""
    doc = export_rollout(rollout, tmp_path / "a.json")
    trace = openenv_trace.model_validate_json((tmp_path / "a.json").read_text())
    original = analyse(load_trace(rollout / "trace.json"))
    assert [t.node_id for t in trace.turns] == [
        load_trace(rollout / "trace.json")[t.call]["node_id"] for t in original.turns
    ]
    assert [t.loss_mask for t in trace.turns] == [t.loss_mask for t in original.turns]
    assert (
        doc["turns"][0]["metadata"]["rollout"]["task_id"]
        == json.loads((rollout / "summary.json").read_text())["task_id"]
    )

    back = import_trace(tmp_path / "a.json", tmp_path / "in")
    again = analyse(load_trace(back / "trace.json"))
    assert [(r.input_ids, r.mask, r.logprobs) for r in again.rows] == [
        (r.input_ids, r.mask, r.logprobs) for r in original.rows
    ]
    summary = json.loads((back / "summary.json").read_text())
    shipped = json.loads((rollout / "summary.json").read_text())
    assert (summary["task_id"], summary["reward"], summary["model"]) == (
        shipped["task_id"],
        shipped["reward"],
        shipped["model"],
    )
    export_rollout(back, tmp_path / "b.json")
    assert (tmp_path / "b.json").read_bytes() == (tmp_path / "a.json").read_bytes()


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
def test_an_openenv_trace_with_partial_masks_is_kept_token_for_token(fixture, tmp_path):
    """OpenEnv's document (masks partial inside a completion) -> rollout folder: turns.json, rows and the
    trainer's rows carry the producer's mask exactly; exported again it is the same document."""
    from workbench.train.rows import rollout_rows

    doc = json.loads(fixture.read_text())
    partial = [t["loss_mask"] for t in doc["turns"]]
    assert any(0 < sum(m) < len(t["completion_token_ids"]) for m, t in zip(partial, doc["turns"]))

    d = import_trace(fixture, tmp_path / "r", task_id="easy/3", reward=1.0)
    write_turns(d)
    turns = load_turns(d / "turns.json")
    assert [t.loss_mask for t in turns] == partial
    assert [bool(t.partial) for t in turns] == [
        0 < sum(m[-len(t.output_ids) :]) < len(t.output_ids) for m, t in zip(partial, turns)
    ]
    # whatever policy the trainer has, the producer's mask wins
    rows, _ = rollout_rows(load_trace(d / "trace.json"), lambda call: True, token_budget=1 << 20)
    assert sum(r.n_trained for r in rows) == sum(map(sum, partial))
    assert json.loads((d / "summary.json").read_text())["temperature"] == 0.5

    assert export_rollout(d, tmp_path / "out.json")["turns"] == doc["turns"]


def test_trls_lossless_capture_makes_our_rows_from_an_exported_trace(tmp_path, openenv_trace):
    """TRL 1.16's AsyncGRPO chaining of our exported document gives exactly our rows (ids, masks, logprobs),
    forks included, partial masks included."""
    for source in [*SHIPPED, *FIXTURES]:
        if source.suffix == ".json":
            source = import_trace(source, tmp_path / source.stem, task_id="t", reward=0.0)
        doc = training_trace(load_trace(source / "trace.json"))
        trl_rows = _compat.trl_lossless_rows(openenv_trace.model_validate(doc))
        ours = [r for r in analyse(load_trace(source / "trace.json")).rows if r.n_trained]
        assert [(s.input_ids, s.completion_mask, s.old_log_probs) for s in trl_rows] == [
            (r.input_ids, r.mask, r.logprobs) for r in ours
        ], source.name


def test_a_per_token_turn_policy_and_the_seed_bytes():
    """A policy may answer one 0/1 per sampled token; a whole-turn mask writes the seed's record unchanged."""
    calls = load_trace(SHIPPED[0] / "trace.json")
    whole = analyse(calls)
    assert all("loss_mask" not in t.to_json() for t in whole.turns)
    assert whole.turns[0].to_json()["mask"] == [0] * len(whole.turns[0].prompt_ids) + [1] * len(
        whole.turns[0].output_ids
    )

    def first_half(call):
        n = len(call["completion_token_ids"])
        return [1] * (n // 2) + [0] * (n - n // 2)

    half = analyse(calls, None, first_half)
    assert [t.output_mask for t in half.turns] == [first_half(calls[t.call]) for t in half.turns]
    assert half.turns[0].to_json()["loss_mask"] == half.turns[0].loss_mask
    assert sum(r.n_trained for r in half.rows) == sum(len(t.output_ids) // 2 for t in half.turns)
    with pytest.raises(ValueError, match="gave 1 mask values"):
        analyse(calls, None, lambda call: [1])


@pytest.mark.parametrize(
    ("mangle", "field"),
    [
        (
            lambda d: d["turns"][1].update(loss_mask=d["turns"][1]["loss_mask"][:-1]),
            r"turns\[1\]: .*loss_mask must cover",
        ),
        (lambda d: d["turns"][0].pop("per_token_logps"), r"turns\[0\]\.per_token_logps: Field required"),
        (lambda d: d["turns"][0]["loss_mask"].__setitem__(0, 1), r"turns\[0\]: .*prompt tokens must remain context"),
        (lambda d: d["turns"][0]["per_token_logps"].__setitem__(0, 0.5), r"turns\[0\]: .*positive"),
        (lambda d: d["turns"][1].update(node_id=d["turns"][0]["node_id"]), r"duplicate node_ids"),
        (lambda d: d.update(schema_version=2), r"schema_version: Input should be 1"),
    ],
)
def test_a_broken_trace_is_one_error_naming_the_field_and_writes_nothing(tmp_path, mangle, field):
    doc = json.loads(FIXTURES[0].read_text())
    mangle(doc)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=field):
        import_trace(tmp_path / "bad.json", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_import_refuses_a_non_empty_folder_and_reads_trace_entries(tmp_path, openenv_trace):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(TraceError, match="not empty"):
        import_trace(FIXTURES[0], tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    entries = openenv_trace.model_validate_json(FIXTURES[0].read_text()).to_trace_entries()
    (tmp_path / "entries.json").write_text(json.dumps(entries))
    assert read_trace(tmp_path / "entries.json") == json.loads(FIXTURES[0].read_text())


def test_the_commands_export_and_import(tmp_path):
    """`workbench export` / `workbench import` as a user runs them: a run folder out, the files back in."""
    run = tmp_path / "run"
    for name in ("smollm2-easy", "smollm2-fork-bpe"):
        shutil.copytree(DATA / "rollouts" / name, run / "rollouts" / name)
    cmd = [sys.executable, "-m", "workbench"]
    out = subprocess.run(
        [*cmd, "export", str(run), "--format", "openenv-trace", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "2 training trace(s)" in out and sorted(p.name for p in (tmp_path / "x").iterdir()) == [
        "rollouts__smollm2-easy.json",
        "rollouts__smollm2-fork-bpe.json",
    ]
    again = subprocess.run(
        [*cmd, "export", str(run), "--format", "openenv-trace", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 1 and "would replace" in again.stderr  # an earlier export is never overwritten
    done = subprocess.run(
        [*cmd, "import", "--format", "openenv-trace", str(tmp_path / "x"), "--out", str(tmp_path / "y")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "2 rows" in done and (tmp_path / "y" / "rollouts__smollm2-fork-bpe" / "rows.json").is_file()
    bad = subprocess.run(
        [
            *cmd,
            "import",
            "--format",
            "openenv-trace",
            str(DATA / "rollouts" / "smollm2-easy" / "trace.json"),
            "--out",
            str(tmp_path / "z"),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "metadata.node_id" in bad.stderr and not (tmp_path / "z").exists()


def test_imported_openenv_traces_train_with_from_rollouts(tmp_path):
    """Two OpenEnv traces with partial masks, imported as one recorded group (rewards 1 and 0), train one
    GRPO step through TRL on the tiny model: the trainer's rows carry exactly the producers' 41 + 10 tokens."""
    from workbench.runs import RunDir
    from workbench.train import GRPORun, TrainConfig

    rec = tmp_path / "rec"
    for fixture, reward in zip(FIXTURES, (1.0, 0.0)):
        import_trace(fixture, rec / fixture.stem, task_id="easy/3", reward=reward)
    assert [sum(map(sum, (t["loss_mask"] for t in json.loads(f.read_text())["turns"]))) for f in FIXTURES] == [41, 10]
    config = TrainConfig(
        model="tiny",
        from_rollouts=str(rec),
        temperature=0.5,
        group_size=2,
        steps=1,
        learning_rate=1e-2,
        importance_sampling="token_truncate",  # the tiny model is ~12 nats from SmolLM2's logprobs (test_train.py)
        device="cpu",
    )
    summary = GRPORun(config, run_dir=tmp_path / "run").train()
    [step] = RunDir.open(tmp_path / "run").read_metrics()
    assert summary["steps"] == 1 and step["trained_tokens"] == 51 and step["rows_trained"] == 2
    assert step["loss"] is not None and step["off_policy"] is True

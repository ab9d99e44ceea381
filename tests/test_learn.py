"""The learning experiment's stages (workbench.evaluate.learn): the pool the probe chooses, what trains on it, what is compared,
and a stopped run resumed where it stopped. The evaluations and the GRPO run are stand-ins here (their own tests run
them for real); what is under test is the experiment's bookkeeping, which a wrong pool or a repeated stage would
silently spoil."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

import workbench.evaluate.learn as learn
import workbench.evaluate.paired as paired
from workbench.cpu import machine
from workbench.evaluate.report import SETTINGS, aggregate
from workbench.evaluate.learn import LearnConfig, choose_pool, run_learning
from workbench.runs import RunDir
from workbench.tasks import load_tasks

# base solve pattern per task over 4 rollouts: easy/0 always, easy/1 never, easy/2 and easy/3 sometimes
BASE = {"easy/0": [1, 1, 1, 1], "easy/1": [0, 0, 0, 0], "easy/2": [1, 0, 0, 0], "easy/3": [1, 1, 0, 0]}


class _Calls:
    def __init__(self) -> None:
        self.evals: list[tuple[str, str, int, str | None]] = []
        self.harnesses: dict[str, str] = {}
        self.trained_on: list[tuple[str, bool]] = []
        self.fail_training = False


def _stand_ins(monkeypatch: pytest.MonkeyPatch) -> _Calls:
    calls = _Calls()

    def run_eval(cfg, *, run_dir, engine, client, progress=True):  # noqa: ARG001 - the stage passes the shared engine
        where = Path(run_dir)  # a block of an interleaved pair is named by its pair and policy: eval-pool/base
        name = f"{where.parent.parent.name}/{where.parent.name}" if where.name.startswith("block") else where.name
        calls.evals.append((name, cfg.tasks, cfg.n, cfg.adapter))
        calls.harnesses[name] = cfg.harness
        ids = [t.id for t in load_tasks(cfg.tasks)]
        records = []
        for tid in ids:
            pattern = BASE.get(tid, [0] * cfg.n)
            for i in range(cfg.n):
                solved = 1 if cfg.adapter and tid != "easy/1" else pattern[i % len(pattern)]
                records.append(
                    {
                        "task_id": tid,
                        "rollout": f"{tid}-{i}",
                        "sample": i,
                        "status": "ok",
                        "reason": None,
                        "reward": float(solved),
                        "tool_calls": 1,
                        "solution_written": True,
                        "stale_calls": 0,
                    }
                )
        out = {
            "model": cfg.model,
            "harness": cfg.harness,
            "adapter": cfg.adapter,
            "adapter_info": None,
            "policy": "trained" if cfg.adapter else "base",
            "isolation": "bwrap",
            "settings": {k: getattr(cfg, k) for k in SETTINGS},
            "config": asdict(cfg),
            "stale_calls": 0,
            "reloads": [],
            "wall_s": 1.0,
            "tasks": cfg.tasks,
            "temperature": cfg.temperature,
            "task_ids": ids,
            "n": cfg.n,
            **aggregate(records, 0, ids),
            "records": records,
        }
        run = RunDir.create("eval", path=Path(run_dir))
        run.write_json("eval.json", out)
        return out

    class GRPORun:
        def __init__(self, train, *, run_dir, engine, client):  # noqa: ARG002
            self.train_config, self.path = train, Path(run_dir)

        def train(self, *, resume: bool = False):
            calls.trained_on.append((self.train_config.tasks, resume))
            (self.path / "checkpoints" / "checkpoint-1").mkdir(parents=True, exist_ok=True)
            if calls.fail_training:
                raise KeyboardInterrupt  # the run stopped mid-training
            (self.path / "adapters" / "final").mkdir(parents=True)
            RunDir.open(self.path).log_metrics({"step": 1, "reward": 0.5, "test_rewards": [0.0, 1.0]})
            return {}

    monkeypatch.setattr(learn, "run_eval", run_eval)
    monkeypatch.setattr(paired, "run_eval", run_eval)
    monkeypatch.setattr(learn, "GRPORun", GRPORun)
    return calls


CONFIG = dict(
    model="tiny", train_tasks="easy-train[:4]", probe_n=4, pool_eval_n=4, eval_tasks="easy-eval[:2]", eval_n=2
)


def _config(**kw) -> LearnConfig:
    return LearnConfig(**{**CONFIG, **kw})


def test_the_pool_is_the_tasks_solved_sometimes_and_training_uses_only_it(monkeypatch, tmp_path):
    calls = _stand_ins(monkeypatch)
    ev = run_learning(_config(), run_dir=tmp_path / "r", engine=object(), client=object())  # type: ignore[arg-type]
    assert ev["pool"]["task_ids"] == ["easy/2", "easy/3"]
    assert ev["pool"]["left_out"] == {"always_solved": ["easy/0"], "never_solved": ["easy/1"], "not_all_scored": []}
    assert calls.trained_on == [("easy/2,easy/3", False)]
    names = [e[0] for e in calls.evals]
    # after training, base and trained interleaved on one engine (one block each here), held out then the pool
    assert names == ["probe", "eval-held-out/base", "eval-held-out/trained", "eval-pool/base", "eval-pool/trained"]
    # the pool's comparison uses fresh base rollouts, not the probe's: base 1/4 and 2/4 -> trained 4/4 each
    d = ev["train_pool_solve_delta"]
    assert d["mean"] == pytest.approx(((1 - 0.25) + (1 - 0.5)) / 2) and d["ci95"][0] > 0
    assert set(ev["train_pool_delta"]) >= {"mean", "ci95", "p"} and "delta" in ev and "solve_delta" in ev
    assert ev["model"] == "tiny" and len(ev["train_pool"]["rollouts"]) == 2 * 2 * 4
    from workbench.views import render_eval

    html = render_eval(ev)
    assert "training pool (2 tasks)" in html and "held out" in html
    assert f"{d['mean']:.3f} [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}], p = {d['p']:.4f}" in html
    # every number of both comparisons follows from the rollout records (the check the shipped file gets)
    from test_evaluate import pool_view, recompute_learning_eval

    assert recompute_learning_eval(ev) > 0 and recompute_learning_eval(pool_view(ev)) > 0
    saved = json.loads((tmp_path / "r" / "eval.json").read_text())
    assert saved["train_pool_solve_delta"] == d and json.loads((tmp_path / "r" / "pool.json").read_text())["spec"]


def test_a_stopped_run_resumes_where_it_stopped_and_refuses_another_config(monkeypatch, tmp_path):
    calls = _stand_ins(monkeypatch)
    calls.fail_training = True
    with pytest.raises(KeyboardInterrupt):
        run_learning(_config(), run_dir=tmp_path / "r", engine=object(), client=object())  # type: ignore[arg-type]
    assert [e[0] for e in calls.evals] == ["probe"]  # base and trained are evaluated together, after training
    with pytest.raises(ValueError, match="learning_rate"):
        run_learning(_config(learning_rate=0.5), run_dir=tmp_path / "r", resume=True, engine=object(), client=object())  # type: ignore[arg-type]
    calls.fail_training, calls.evals = False, []
    # memory, not the math: a run whose multi-call rows outgrew the host resumes with checkpointing on; and one still
    # training may be given more steps
    resumed = _config(activation_checkpointing=True, steps=LearnConfig().steps + 5)
    ev = run_learning(resumed, run_dir=tmp_path / "r", resume=True, engine=object(), client=object())  # type: ignore[arg-type]
    names = [e[0] for e in calls.evals]  # finished stages are not re-run
    assert names == ["eval-held-out/base", "eval-held-out/trained", "eval-pool/base", "eval-pool/trained"]
    assert calls.trained_on[-1] == ("easy/2,easy/3", True)  # GRPO continues from its checkpoint
    assert all((e[3] or "").endswith("adapters/final") == e[0].endswith("/trained") for e in calls.evals)
    assert set(ev["timings_s"]) >= {"probe_s", "train_s", "eval-pool_s", "eval-held-out_s"}

    # a finished run re-reads its evidence without starting an engine
    def no_engine(**kw):
        raise AssertionError("a finished run started an engine")

    monkeypatch.setattr("workbench.engine.stack.local_stack", no_engine)
    calls.evals = []
    again = run_learning(resumed, run_dir=tmp_path / "r", resume=True)
    assert calls.evals == [] and again["train_pool_solve_delta"] == ev["train_pool_solve_delta"]
    with pytest.raises(ValueError, match="steps"):  # trained: its evidence is of the steps it ran
        run_learning(_config(activation_checkpointing=True), run_dir=tmp_path / "r", resume=True)
    with pytest.raises(ValueError, match="no learning run"):
        run_learning(_config(), run_dir=tmp_path / "empty", resume=True, engine=object(), client=object())  # type: ignore[arg-type]


def test_a_given_probe_chooses_the_pool_and_a_mismatched_one_is_refused(monkeypatch, tmp_path):
    calls = _stand_ins(monkeypatch)
    first = run_learning(_config(), run_dir=tmp_path / "a", engine=object(), client=object())  # type: ignore[arg-type]
    probe = str(tmp_path / "a" / "probe" / "eval.json")
    calls.evals = []
    ev = run_learning(_config(probe_file=probe), run_dir=tmp_path / "b", engine=object(), client=object())  # type: ignore[arg-type]
    assert "probe" not in [e[0] for e in calls.evals] and ev["pool"]["task_ids"] == first["pool"]["task_ids"]
    assert ev["pool"]["probe_file"] == probe
    for wrong in (dict(probe_n=8), dict(temperature=0.5), dict(train_tasks="easy-train[:3]")):
        with pytest.raises(ValueError, match="not a base probe"):
            run_learning(_config(probe_file=probe, **wrong), run_dir=tmp_path / "c", engine=object(), client=object())  # type: ignore[arg-type]
    # an eval.json from before evaluations named their harness (the shipped run's probe) is an opencode probe
    old = json.loads(Path(probe).read_text())
    del old["harness"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    ev = run_learning(
        _config(probe_file=str(tmp_path / "old.json")), run_dir=tmp_path / "e", engine=object(), client=object()
    )  # type: ignore[arg-type]
    assert ev["pool"]["task_ids"] == first["pool"]["task_ids"]
    with pytest.raises(FileNotFoundError):
        run_learning(
            _config(probe_file=str(tmp_path / "nope.json")), run_dir=tmp_path / "d", engine=object(), client=object()
        )  # type: ignore[arg-type]


def test_a_direct_probe_pools_every_task_the_base_solves_asked_once_and_trains_it_through_the_harness(
    monkeypatch, tmp_path
):
    """`probe_harness="direct"`: the probe asks once (the direct baseline), the pool keeps the always-solved task
    too; training and every comparison go through opencode."""
    calls = _stand_ins(monkeypatch)
    ev = run_learning(_config(probe_harness="direct"), run_dir=tmp_path / "r", engine=object(), client=object())  # type: ignore[arg-type]
    assert ev["pool"]["task_ids"] == ["easy/0", "easy/2", "easy/3"] and ev["pool"]["probe_harness"] == "direct"
    assert ev["pool"]["rule"] == "solved at least once" and ev["pool"]["left_out"]["never_solved"] == ["easy/1"]
    assert calls.trained_on == [("easy/0,easy/2,easy/3", False)]
    assert calls.harnesses == {
        "probe": "direct",
        **{f"{p}/{s}": "opencode" for p in ("eval-pool", "eval-held-out") for s in ("base", "trained")},
    }
    with pytest.raises(ValueError, match="harness"):  # an opencode probe file is not a direct probe
        probe = tmp_path / "r" / "probe" / "eval.json"
        run_learning(_config(probe_file=str(probe)), run_dir=tmp_path / "d", engine=object(), client=object())  # type: ignore[arg-type]


def test_pool_rules_and_bad_input():
    probe = {
        "tasks": "t",
        "n": 4,
        "per_task": [
            {"task_id": "a", "scored": 4, "solved": 2},
            {"task_id": "b", "scored": 3, "solved": 1},
            {"task_id": "c", "scored": 4, "solved": 4},
            {"task_id": "d", "scored": 4, "solved": 0},
        ],
    }
    pool = choose_pool(probe)
    assert pool["task_ids"] == ["a"] and pool["left_out"]["not_all_scored"] == ["b"] and pool["spec"] == "a"
    for bad in (dict(probe_n=1), dict(probe_n=-1), dict(pool_eval_n=0)):
        with pytest.raises(ValueError):
            LearnConfig(**bad)
    assert [t.id for t in load_tasks("easy/3,easy/5")] == ["easy/3", "easy/5"]
    for bad_spec in ("easy/3,easy/3", "easy/3,", "easy/3,nope/1"):
        with pytest.raises(ValueError):
            load_tasks(bad_spec)


def test_an_adapter_and_its_base_are_evaluated_interleaved_block_by_block(monkeypatch, tmp_path):
    """`run_paired`: blocks of about `parallel` rollouts, both policies in each block one right after the other, the
    order alternating; each policy's eval.json aggregates all its blocks' records; the pair is compared."""
    from workbench.evaluate import EvalConfig, run_paired

    calls = _stand_ins(monkeypatch)
    config = EvalConfig(model="tiny", adapter="runs/x/adapters/final", tasks="easy-train[:5]", n=2, parallel=4)
    from workbench.evaluate.run import run_eval as real_run_eval

    with pytest.raises(ValueError, match="run_paired"):
        real_run_eval(EvalConfig(model="tiny", adapter="a", with_base=True))
    out = run_paired(config, run_dir=tmp_path / "p", engine=object(), client=object())  # type: ignore[arg-type]
    blocks = [(e[1], e[3] is not None) for e in calls.evals]
    assert blocks == [
        ("easy/0,easy/1", False),
        ("easy/0,easy/1", True),
        ("easy/2,easy/3", True),  # the second block starts with the adapter
        ("easy/2,easy/3", False),
        ("easy/4", False),
        ("easy/4", True),
    ]
    base = json.loads((tmp_path / "p" / "base" / "eval.json").read_text())
    trained = json.loads((tmp_path / "p" / "trained" / "eval.json").read_text())
    assert (base["rollouts"], trained["rollouts"], base["tasks"]) == (10, 10, "easy-train[:5]")
    assert base["task_ids"] == [f"easy/{i}" for i in range(5)] and base["interleaved"]["blocks"] == 3
    # BASE: easy/0 solved, easy/1 never, easy/2 1 of 2, easy/3 2 of 2; the stand-in's adapter solves all but easy/1
    assert out["delta"]["mean"] == pytest.approx((0 + 0 + 0.5 + 0 + 1) / 5)
    assert json.loads((tmp_path / "p" / "paired.json").read_text())["delta"] == out["delta"]
    with pytest.raises(ValueError, match="give an adapter"):
        EvalConfig(model="tiny", with_base=True)


def test_a_stopped_interleaved_pair_resumes_from_its_last_whole_block_and_refuses_another_plan(monkeypatch, tmp_path):
    """`run_paired(resume=True)`: blocks whose two policies both finished are kept (not run again), a block stopped
    between its two policies is run again whole, both policies back to back; a folder planned with other settings
    is refused before anything runs, naming the field; the CLI says the same and needs --with-base and --out."""
    from workbench.evaluate import EvalConfig, run_paired
    from workbench.cli.evaluate import add_eval_arguments, run_from_args

    calls = _stand_ins(monkeypatch)
    config = EvalConfig(model="tiny", adapter="runs/x/adapters/final", tasks="easy-train[:5]", n=2, parallel=4)
    stand_in = paired.run_eval
    seen = []

    def stops_at_the_fourth(cfg, **kw):  # the stop comes between block 1's two policies
        seen.append(cfg.tasks)
        if len(seen) == 4:
            raise KeyboardInterrupt
        return stand_in(cfg, **kw)

    monkeypatch.setattr(paired, "run_eval", stops_at_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        run_paired(config, run_dir=tmp_path / "p", engine=object(), client=object())  # type: ignore[arg-type]
    assert (tmp_path / "p" / "trained" / "block001" / "eval.json").is_file()  # block 1's first policy finished
    monkeypatch.setattr(paired, "run_eval", stand_in)
    calls.evals = []
    out = run_paired(config, run_dir=tmp_path / "p", engine=object(), client=object(), resume=True)  # type: ignore[arg-type]
    assert [(e[1], e[3] is not None) for e in calls.evals] == [  # block 0 kept; block 1 again whole, in its order
        ("easy/2,easy/3", True),
        ("easy/2,easy/3", False),
        ("easy/4", False),
        ("easy/4", True),
    ]
    base = json.loads((tmp_path / "p" / "base" / "eval.json").read_text())
    assert base["rollouts"] == 10 and base["interleaved"]["blocks_resumed"] == 1
    assert out["delta"]["mean"] == pytest.approx((0 + 0 + 0.5 + 0 + 1) / 5)  # as the uninterrupted pair's
    record = json.loads((tmp_path / "p" / "config.json").read_text())
    assert record["resumes"][0]["blocks_kept"] == 1 and record["interleaved"]["block_tasks"] == 2
    assert record["resumes"][0]["machine"]["cpu"] == machine()["cpu"]

    calls.evals = []
    for other, field in (
        (replace(config, temperature=0.5), "eval.temperature"),
        (replace(config, parallel=2), "interleaved.block_tasks"),
    ):
        with pytest.raises(ValueError, match=field):
            run_paired(other, run_dir=tmp_path / "p", engine=object(), client=object(), resume=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no interleaved evaluation"):
        run_paired(config, run_dir=tmp_path / "none", engine=object(), client=object(), resume=True)  # type: ignore[arg-type]
    assert calls.evals == [] and not (tmp_path / "none").exists()

    parser = add_eval_arguments(argparse.ArgumentParser())
    args = ["--model", "tiny", "--adapter", "runs/x/adapters/final", "--tasks", "easy-train[:5]", "--n", "2"]
    monkeypatch.setattr("workbench.cli.evaluate.check_names", lambda config: None)
    with pytest.raises(SystemExit, match="--with-base and --out"):
        run_from_args(parser.parse_args([*args, "--resume"]))
    with pytest.raises(SystemExit, match="eval.temperature"):
        more = ["--with-base", "--parallel", "4", "--temperature", "0.5", "--out", str(tmp_path / "p"), "--resume"]
        run_from_args(parser.parse_args([*args, *more]))
    assert calls.evals == []

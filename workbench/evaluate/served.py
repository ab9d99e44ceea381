"""Served weights verified: every reload an evaluation makes is checked before a rollout is scored on it.

With ``serving="merged"`` an evaluation has the engine reload merged weights in place and the base weights
afterwards, under one served name: ``stale_calls`` cannot tell a reload that did not take, and vLLM answers 200
either way. `ReloadCheck.reload` therefore asks the engine for the logprobs of the training sync's fixed probe
(`workbench.train.sync_probe`: `PROBE_TEXT`, prompt logprobs, no prefix cache) and compares them with the same
weights' own forward (the folder it reloaded, loaded here in float32), with the training sync's tolerances and
its "moved" rule (`SyncProbe.check`): a reload that did not take raises `WeightSyncError`, loudly, and each
reading goes into eval.json's ``reloads``.

    check = ReloadCheck(engine, asset_path)
    check.reload(merged_folder, "merged")     # WeightSyncError unless the engine serves those weights
    check.reload(asset_path, "base")
    check.log                                 # [{"weights": "merged", "max_abs": ..., "moved": ..., ...}, ...]

Cost: one 20-token request to the engine and one 20-token forward per reload, plus loading the folder (qwen-coder
float32, 2 GB: a few seconds from the page cache).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.engine import Engine

__all__ = ["ReloadCheck"]


class ReloadCheck:
    """Reload the engine's weights and verify it serves them; `log` holds one reading per reload."""

    def __init__(self, engine: Engine, asset_path: Path) -> None:
        from transformers import AutoTokenizer

        from workbench.train import PROBE_TEXT, SyncProbe, served_dtype, tolerance

        ids = AutoTokenizer.from_pretrained(asset_path).encode(PROBE_TEXT, add_special_tokens=False)
        self.engine, self.asset_path = engine, Path(asset_path)
        self.probe = SyncProbe(ids, tolerance(served_dtype(engine), "float32"))
        self.log: list[dict[str, Any]] = []

    def reload(self, folder: Path, weights: str) -> dict[str, Any]:
        """Have the engine reload `folder` (`weights` names it in the log), then check it serves those weights."""
        import torch
        from transformers import AutoModelForCausalLM

        from workbench.train import engine_prompt_logprobs, model_logprobs, probe_threads

        def expected(path: Path) -> list[float]:
            """The probe under the weights in `path`: the asset's model, with a merged folder's tensors (a
            ``model.safetensors`` of model tensors, `write_merged`) loaded over it."""
            model = AutoModelForCausalLM.from_pretrained(self.asset_path, dtype=torch.float32)
            if Path(path).resolve() != self.asset_path.resolve():
                from safetensors.torch import load_file

                loaded = model.load_state_dict(load_file(str(Path(path) / "model.safetensors")), strict=False)
                if loaded.unexpected_keys:
                    raise ValueError(f"{path}: tensors the model does not have: {loaded.unexpected_keys[:5]}")
            return model_logprobs(model, self.probe.ids, threads=probe_threads(self.engine))

        if self.probe.last is None and self.engine.serves_asset_weights:
            # what it serves now, read first: a first reload that did not take is then caught by the "moved" rule
            # too, which matters where the dtypes' gap is wide (bf16: 1.0)
            self.probe.check(engine_prompt_logprobs(self.engine, self.probe.ids), expected(self.asset_path))
        reload_s = self.engine.reload_weights(folder)
        t = time.monotonic()
        reading = self.probe.check(engine_prompt_logprobs(self.engine, self.probe.ids), expected(folder))
        entry = {
            "weights": weights,
            "folder": str(folder),
            "reload_s": round(reload_s, 2),
            "check_s": round(time.monotonic() - t, 2),
            "max_abs": reading.max_abs,
            "moved": reading.moved,
            "tolerance": asdict(self.probe.tol),
        }
        self.log.append(entry)
        return entry

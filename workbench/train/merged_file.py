"""The merged policy as one safetensors file that the engine reloads, rewritten in place at every sync.

`workbench.train.policy_sync.MergedSync` hands vLLM the trainer's weights as a file (vLLM's ``reload_weights`` reads
a checkpoint folder). Written the obvious way (`policy_sync.write_merged`: PEFT's delta per layer, ``W + delta`` into
new tensors, safetensors' ``save_file``, which copies every tensor to bytes before writing), qwen-coder's 1.43 GB
of LoRA-touched float32 weights took 5.6-7.2 s into RAM on this 2-core host (benchmarks/weight_sync.py). Here the file
is laid out once (header, then every tensor's bytes) and mapped; each sync computes ``W + scaling * B @ A`` with one
``addmm`` per layer straight into the mapped bytes, in the engine's dtype: no intermediate copy, no serialisation, no
fresh pages after the first sync.

What it holds is `policy_sync.merged_state_dict(model, only_touched=True, dtype=...)`'s content (tested equal): every
tensor LoRA changes, and the small untouched ones (norms, biases), written once since nothing changes them; the
embedding and the LM head stay the engine's. A reader must not read while `update` runs: the engine reloads only
when told to, after `update` returned.

    merged = MergedFile(peft_model, engine.weights_folder(), dtype=torch.bfloat16)
    merged.update()                     # -> the folder, ready for Engine.reload_weights
    merged.close()                      # unmaps and removes the file
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any

__all__ = ["MergedFile", "PARTIAL_SKIP_NUMEL", "merge_plan"]

# An untouched tensor this large is left out of a partial reload (`merged_state_dict(only_touched=True)`): the
# embedding and the LM head (136M parameters each in qwen-coder, 0.54 GB apiece in float32). Smaller untouched ones
# (norms, biases: 0.1 MB in all) are written anyway: a layer whose weights are only partly given would be rebuilt
# from the given part alone by vLLM's layerwise reload.
PARTIAL_SKIP_NUMEL = 1 << 20

_SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def merge_plan(peft_model: Any, *, only_touched: bool) -> tuple[str, list[tuple[str, Any, Any]]]:
    """(the active adapter, [(checkpoint name, the trainer's base tensor, its LoRA layer or None)]): every tensor of
    the base model in state-dict order, each storage once (tied weights under their first name), LoRA's own tensors
    left out; with `only_touched`, the large tensors no LoRA layer changes left out too (`PARTIAL_SKIP_NUMEL`).
    ValueError for a LoRA layer that is not on a linear layer (its update would be served wrong) or whose base weight
    is tied to one already listed (its update would be lost)."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    base, adapter = peft_model.get_base_model(), peft_model.active_adapter
    lora: dict[str, Any] = {}  # base weight's state-dict key -> its LoRA layer
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.lora_A:
            if not isinstance(module, LoraLinear):
                raise ValueError(f"{name}: only LoRA on linear layers is merged, not {type(module).__name__}")
            lora[f"{name}.base_layer.weight"] = module
    entries: list[tuple[str, Any, Any]] = []
    seen: set[int] = set()
    for key, tensor in base.state_dict().items():
        if ".lora_" in key or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        layer = lora.pop(key, None)
        if layer is None and only_touched and tensor.numel() >= PARTIAL_SKIP_NUMEL:
            continue  # the embedding and the LM head: the engine keeps its own, which nothing changes
        entries.append((key.replace(".base_layer.", "."), tensor, layer))
    if lora:
        raise ValueError(f"LoRA deltas not merged (tied or missing base weights): {sorted(lora)[:3]}")
    return adapter, entries


class MergedFile:
    """One mapped safetensors file with a view per tensor; `update()` writes the merged weights into it."""

    def __init__(self, peft_model: Any, folder: Path, *, dtype: Any = None) -> None:
        import torch

        self.adapter, self.entries = merge_plan(peft_model, only_touched=True)
        for name, _, layer in self.entries:
            if layer is not None and (layer.fan_in_fan_out or layer.use_dora.get(self.adapter)):
                raise ValueError(f"{name}: only plain LoRA is merged in place (no fan_in_fan_out, no DoRA)")
        self.dtype = dtype or self.entries[0][1].dtype
        name = _SAFETENSORS_DTYPE[str(self.dtype).removeprefix("torch.")]
        size = torch.empty((), dtype=self.dtype).element_size()
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for key, tensor, _ in self.entries:
            n = tensor.numel() * size
            header[key] = {"dtype": name, "shape": list(tensor.shape), "data_offsets": [offset, offset + n]}
            offset += n
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        start = 8 + len(raw)
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.path = folder, folder / "model.safetensors"
        with open(self.path, "wb") as f:  # the header now, the data region sized (zeros until the first update)
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(start + offset)
        self._file = open(self.path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), start + offset)
        self.views = [
            torch.frombuffer(
                self._map, dtype=self.dtype, count=t.numel(), offset=start + header[k]["data_offsets"][0]
            ).view(t.shape)
            for k, t, _ in self.entries
        ]
        self._written = False
        self.nbytes = offset

    def update(self) -> Path:
        """Write ``W + scaling * B @ A`` for every LoRA layer (the rest only the first time); returns the folder."""
        import torch

        with torch.no_grad():
            for (_, tensor, layer), view in zip(self.entries, self.views, strict=True):
                if layer is None:
                    if not self._written:
                        view.copy_(tensor)
                    continue
                a, b = layer.lora_A[self.adapter].weight, layer.lora_B[self.adapter].weight
                scaling = layer.scaling[self.adapter]
                if view.dtype == tensor.dtype:
                    torch.addmm(tensor, b, a, alpha=scaling, out=view)
                else:  # summed in the weights' dtype, then rounded once into the engine's
                    view.copy_(torch.addmm(tensor, b, a, alpha=scaling))
        self._written = True
        return self.folder

    def close(self) -> None:
        """Unmap and remove the file (the folder stays: it is the engine's)."""
        self.views = []
        self._map.close()
        self._file.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

"""Adapter checks: refuse a LoRA folder that was not trained for the model it is about to be served on.

Reads adapter_config.json and the safetensors header only (no tensor, no torch), against the model
asset's config.json: rank, target modules, layer indices and every LoRA matrix's shape.

    from workbench.evaluate.adapter_check import AdapterMismatch, check_adapter
    info = check_adapter("runs/<grpo>/adapters/final", "smollm2")   # what was checked (eval.json records it)
    # AdapterMismatch (a ValueError) says which matrix or field does not fit
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["AdapterMismatch", "check_adapter"]


class AdapterMismatch(ValueError):
    """The adapter was not trained for this model (or is no LoRA adapter at all)."""


def _linear_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each LoRA-able linear layer of a Llama/Qwen-style decoder."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or h // heads
    inter = config["intermediate_size"]
    return {
        "q_proj": (h, heads * head_dim),
        "k_proj": (h, kv * head_dim),
        "v_proj": (h, kv * head_dim),
        "o_proj": (heads * head_dim, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
        "lm_head": (h, config["vocab_size"]),
    }


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    # The header alone (8-byte length, then JSON): no tensor is read, no torch import.
    with open(path, "rb") as f:
        try:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        except (ValueError, MemoryError, OverflowError):
            raise AdapterMismatch(f"{path} is not a safetensors file") from None
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


# PEFT's names: base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (lm_head: no layer).
_LORA_KEY = re.compile(r"\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def check_adapter(path: str | Path, model: str, *, max_rank: int = 16) -> dict[str, Any]:
    """Refuse (`AdapterMismatch`) a LoRA folder that does not fit `model`'s asset: rank above the
    engine's `max_rank`, a target module the model lacks, a layer index past its depth, or any LoRA
    matrix of the wrong shape. Returns what was checked (recorded in eval.json)."""
    from workbench.engine import ASSET_NAMES, load_asset

    folder = Path(path).expanduser()
    cfg_file, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not cfg_file.is_file() or not weights.is_file():
        raise AdapterMismatch(
            f"{folder} is not a PEFT adapter folder (needs adapter_config.json and "
            "adapter_model.safetensors, as save_pretrained writes them)"
        )
    cfg = json.loads(cfg_file.read_text())
    if cfg.get("peft_type") != "LORA":
        raise AdapterMismatch(f"{folder}: peft_type {cfg.get('peft_type')!r}, only LORA adapters are served")
    model_cfg = json.loads((load_asset(model).path / "config.json").read_text())
    base = str(cfg.get("base_model_name_or_path") or "")
    if Path(base).name in ASSET_NAMES and Path(base).name != model:
        raise AdapterMismatch(f"{folder} was trained on {Path(base).name!r} ({base}), not {model!r}")
    rank = int(cfg.get("r", 0))
    if not 0 < rank <= max_rank:
        raise AdapterMismatch(f"{folder}: rank {rank} is outside 1..{max_rank} (the engine's max LoRA rank)")
    shapes, layers = _linear_shapes(model_cfg), model_cfg["num_hidden_layers"]
    targets = cfg.get("target_modules") or []
    unknown = sorted(set([targets] if isinstance(targets, str) else targets) - set(shapes))  # a str may be a regex
    if unknown and not (isinstance(targets, str) and not targets.isidentifier()):
        raise AdapterMismatch(
            f"{folder}: target modules {unknown} are not linear layers of {model!r} (it has {sorted(shapes)})"
        )
    tensors = _safetensors_shapes(weights)
    problems, seen_layers, seen_modules = [], set(), set()
    for key, shape in tensors.items():
        m, in_layer = _LORA_KEY.search(key), _LAYER.search(key)
        if not m:
            problems.append(f"{key}: not a LoRA matrix")
            continue
        module, which, layer = m.group(1), m.group(2), in_layer.group(1) if in_layer else None
        if module not in shapes:
            problems.append(f"{key}: {module!r} is not a linear layer of {model!r}")
            continue
        if layer is not None and int(layer) >= layers:
            problems.append(f"{key}: layer {layer}, but {model!r} has {layers} layers")
            continue
        fan_in, fan_out = shapes[module]
        r = rank if not cfg.get("rank_pattern") else (shape[0] if which == "A" else shape[-1])  # per-module ranks
        want = [r, fan_in] if which == "A" else [fan_out, r]
        if list(shape) != want:
            problems.append(f"{key}: shape {list(shape)}, {model!r} needs {want}")
        seen_modules.add(module)
        if layer is not None:
            seen_layers.add(int(layer))
    if not tensors:
        problems.append("no tensors")
    if problems:
        raise AdapterMismatch(
            f"{folder} does not fit {model!r} (hidden {model_cfg['hidden_size']}, {layers} layers): "
            + "; ".join(problems[:5])
            + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
        )
    return {
        "path": str(folder.resolve()),
        "rank": rank,
        "lora_alpha": cfg.get("lora_alpha"),
        "target_modules": sorted(seen_modules),
        "layers": sorted(seen_layers),
        "tensors": len(tensors),
        "base_model_name_or_path": base,
    }

"""The tokenizer a rollout's ids were produced with: decoding them with any other would mislead.

    tokenizer = tokenizer_for_rollout(run / "rollouts" / "r0")   # its summary.json names the model
    tokenizer = tokenizer_for_rollout(folder, model="smollm2")    # a folder without one (the seed's)
    rollout_model(folder)                                          # the model name alone, or None

Looks in the built assets (`workbench assets build NAME`), then beside the example captures shipped
in workbench/data/rollouts/. transformers is imported only when a tokenizer is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench.turns.trace import TraceError
from workbench.paths import DATA

__all__ = ["rollout_model", "tokenizer_for_rollout"]

_SHIPPED_TOKENIZERS = DATA / "rollouts"


def rollout_model(rollout_dir: Path) -> str | None:
    """The model asset a rollout was captured with (its summary.json says), or None."""
    summary = Path(rollout_dir) / "summary.json"
    return json.loads(summary.read_text()).get("model") if summary.exists() else None


def tokenizer_for_rollout(rollout_dir: Path, model: str | None = None) -> Any:
    """The tokenizer of the model that produced a rollout's ids (`model`, else its summary.json's): the
    built asset, or the tokenizer shipped beside the example captures. Decoding a SmolLM2 trace with
    another tokenizer would silently mis-diagnose every fork, so an unknown model is an error."""
    from transformers import AutoTokenizer

    from workbench.paths import assets_dir

    name = model or rollout_model(Path(rollout_dir))
    if not name:
        raise TraceError(f"{rollout_dir}: no summary.json naming the model; pass the model (e.g. --model smollm2)")
    for folder in (assets_dir() / name, _SHIPPED_TOKENIZERS / f"{name}-tokenizer"):
        if (folder / "tokenizer.json").exists():
            return AutoTokenizer.from_pretrained(folder)
    raise TraceError(f"no tokenizer for model {name!r}: build it (workbench assets build {name})")

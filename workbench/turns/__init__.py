"""Turns: a captured rollout's calls made into trainable turns, rows and loss masks (notebook 03).

    from workbench.turns import analyse, load_trace
    trace = load_trace(run / "trace.json")      # the rollout artefact (docs/architecture.md: its format)
    result = analyse(trace, tokenizer)          # turns, rows with loss masks, forks, what was excluded

Private modules: ``derive`` (`analyse`), ``trace`` (the artefact reader), ``rows`` (turns to token rows with
masks), ``interop`` (OpenEnv training traces in and out), ``sources`` (any
folder of traces in the three formats as rollout folders: `load_sources`), ``drift`` (re-tokenisation checks), ``tokenizer`` (a rollout's tokenizer), ``protocol`` (what a
tokenizer must offer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.turns.derive import analyse, run_report, write_turns
    from workbench.turns.protocol import decode_text, token_id, Tokenizer
    from workbench.turns.rows import build_rows, Fork, Row
    from workbench.turns.tokenizer import rollout_model, tokenizer_for_rollout
    from workbench.turns.trace import derive_turns, has_tool_call, load_trace, load_turns, MaskPolicy, output_mask
    from workbench.turns.trace import TraceError, Turn, all_turns, mask_policy
    from workbench.turns.interop import FORMATS, export_rollout, import_trace, read_trace, rollout_training_trace
    from workbench.turns.interop import training_trace
    from workbench.turns.interop import validate_training_trace
    from workbench.turns.sources import Source, Sources, load_sources, sniff
    from workbench.turns.derive import RolloutTurns

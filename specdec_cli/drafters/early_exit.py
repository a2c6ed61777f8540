"""Self-speculation: the target's first `layers` decoder layers, its final norm and LM head draft.

The draft is a view of the target that shares every weight (one set in memory) and runs with its
own KV cache of `layers` layers. Its positions are the target's positions: both caches hold the
committed sequence, and a rejected draft is cropped from the draft's cache exactly as from a
separate draft model's, which is why this is a ModelDrafter over a view.
"""

from __future__ import annotations

import copy

from torch import nn

from ..errors import UsageError
from ..specs import DrafterSpec
from .base import DraftContext
from .model import ModelDrafter


def decoder_layers(model: nn.Module) -> tuple[nn.Module, str, nn.ModuleList]:
    """The module holding the decoder layers, the attribute name, and the layer list."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    n_layers = model.config.num_hidden_layers
    for owner in (decoder, model):
        if owner is None:
            continue
        for name, child in owner.named_children():
            if isinstance(child, nn.ModuleList) and len(child) == n_layers:
                return owner, name, child
    raise UsageError(f"early-exit: cannot find the decoder layers of {type(model).__name__}")


def shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object whose children can be swapped without touching the original."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


def early_exit_view(model: nn.Module, layers: int) -> nn.Module:
    """The model truncated to its first `layers` decoder layers, sharing all weights with it."""
    owner, attr, layer_list = decoder_layers(model)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:layers]
    short = shallow_copy(owner)
    short._modules[attr] = nn.ModuleList(list(layer_list)[:layers])
    short.config = config
    if owner is model:
        return short
    slot = next((name for name, child in model.named_children() if child is owner), None)
    if slot is None:
        raise UsageError(f"early-exit: the decoder of {type(model).__name__} is not a direct child of the model")
    view = shallow_copy(model)
    view.config = config
    view._modules[slot] = short
    return view


def default_layers(n_layers: int) -> int:
    return max(1, n_layers // 4)


def build(spec: DrafterSpec, context: DraftContext) -> ModelDrafter:
    n_layers = context.target.config.num_hidden_layers
    layers = spec.options.get("layers") or default_layers(n_layers)
    if layers >= n_layers:
        raise UsageError(
            f"drafter.layers: {layers} must be below the target's {n_layers} layers (early exit drafts with fewer)"
        )
    view = early_exit_view(context.target, layers)
    return ModelDrafter(view, context, name=f"early-exit({layers})", separate_model=False)

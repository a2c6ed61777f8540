"""int4 layers that read the same input, multiplied in one kernel call in the compiled step: a
transformer's q, k and v projections, and its MLP's gate and up projections. One call a group
instead of three or two saves the kernel's fixed costs per call (quantizing the activations,
starting its threads, the call itself).

Two halves. At load, `share_storage` lays sibling Int4Linear layers' weights end to end in
one buffer per part, each layer keeping a view of its rows (the same bytes, no copy: eager runs
call each layer as before). In the compiled step, int4_merge_pass.py finds int4_linear calls on
one input whose weights lie end to end in one buffer, calls the kernel once on the view that
covers them and splits its output. Exactness is untouched: each output column is the same dot
product of the same int8 row either way, so the bits are those of the separate calls."""

from __future__ import annotations

import hashlib

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import int4_matmul

WEIGHT_PARTS = (*int4_matmul.PARTS, "bias")  # the buffers laid end to end


def share_storage(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each run of sibling Int4Linear layers (consecutive children of one module
    with the same number of inputs, group size, device, and bias or none) holding its weights in
    one buffer per part. Siblings that never share an input (an attention's output projection beside its
    value projection) cost nothing: the compiled step merges only calls on one input."""
    for parent in model.modules():
        run: list[int4_matmul.Int4Linear] = []
        for child in [*parent.children(), None]:
            if run and (child is None or not _same_kind(run[0], child)):
                _lay_end_to_end(run)
                run = []
            if isinstance(child, int4_matmul.Int4Linear):
                run.append(child)
    return model


def _same_kind(first: int4_matmul.Int4Linear, other: torch.nn.Module) -> bool:
    return (isinstance(other, int4_matmul.Int4Linear) and other.in_features == first.in_features
            and other.group_size == first.group_size and other.packed.device == first.packed.device
            and bool(other.bias.numel()) == bool(first.bias.numel()) and other.bias.dtype == first.bias.dtype)


def _lay_end_to_end(layers: list[int4_matmul.Int4Linear]) -> None:
    if len(layers) < 2:
        return
    for part in WEIGHT_PARTS:
        if part == "bias" and not layers[0].bias.numel():
            continue
        whole = torch.cat([getattr(layer, part) for layer in layers])
        start = 0
        for layer in layers:
            rows = getattr(layer, part).shape[0]
            setattr(layer, part, whole[start : start + rows])  # a buffer's attribute: stays a buffer
            start += rows


def layout_key(model: torch.nn.Module) -> str:
    """Where the model's int4 weights lie relative to each other (which share a buffer, at what
    offsets), as a short hash. A graph compiled with the merge pass assumes its layout, so the
    graph caches key on this: a merged graph is only ever served to weights laid out alike."""
    buffers: dict[StorageWeakRef, int] = {}
    places = [(buffers.setdefault(StorageWeakRef(part.untyped_storage()), len(buffers)), part.storage_offset())
              for module in model.modules() if isinstance(module, int4_matmul.Int4Linear)
              for part in (getattr(module, name) for name in WEIGHT_PARTS)]
    return hashlib.sha256(repr(places).encode()).hexdigest()[:16]

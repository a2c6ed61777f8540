"""`quantize: int4` on specdec's CPU kernel, loaded a layer at a time from a local checkpoint.

transformers' from_pretrained first holds every weight in the load dtype, and only then are the
Linear layers packed to int4: on an AVX2 CPU that dtype is float32, so loading the 1.5B/0.5B Qwen
pair peaked at 10.9 GB of memory for 1.1 GB of int4 weights (and took 12 s with its packed weights
already cached). Here the model is built without weights; each layer to quantize takes its packed
weights from the packed cache, or packs its own weight read from the checkpoint's mapped file, and
only the other tensors (embeddings, norms, biases) are read whole. Same model, same bits as the
transformers path (tested); where anything does not fit this path (a hub id, another device, a
layer the kernel does not take, names the checkpoint does not hold) it returns None and the caller
loads through transformers."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import torch

from ..kernels import int4_matmul, packed_cache
from ..kernels.quantize import (
    check_groups_divide,
    log_on_kernel,
    mark_quantized,
    own_int4_wanted,
    quantized_layers,
    replace_with_int4_kernel,
)
from ..specs import ModelSpec
from .stored_int4 import CheckpointReader, as_loaded, empty_model, load_float_tensors, read_generation_config

log = logging.getLogger("specdec")


def load_int4_layerwise(spec: ModelSpec, source: str, dtype: torch.dtype, device: torch.device,
                        cache_folder: Path) -> torch.nn.Module | None:
    """The model in the local folder `source` with its Linear layers (the head too under
    quantize_head) on specdec's int4 kernel, its other weights in `dtype`, on the CPU `device`;
    packed weights kept in a file of `cache_folder` (packed_cache.py). None where this path does
    not apply (the module's docstring)."""
    folder = Path(source)
    if not (folder.is_dir() and any(folder.glob("*.safetensors")) and own_int4_wanted(device)):
        return None
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    if getattr(config, "quantization_config", None) is not None:
        return None
    model = empty_model(config, dtype)
    layers = quantized_layers(model, spec.quantize_head)
    check_groups_divide(layers, spec.group_size)
    if not all(int4_matmul.shape_fits(m.out_features, m.in_features, spec.group_size) for _, m in layers):
        return None
    reader = CheckpointReader(folder)
    to_pack = {f"{name}.weight" for name, _ in layers}
    unexpected = load_float_tensors(model, reader, [key for key in reader.keys() if key not in to_pack], dtype)
    if unexpected or not all(weights_at_hand(model, to_pack, reader)):
        log.debug("%s: its checkpoint's names are not the model's; loading through transformers", folder)
        return None

    def weight_of(name: str, layer: torch.nn.Linear) -> torch.Tensor:
        return layer.weight if layer.weight.device.type != "meta" else as_loaded(reader.get(f"{name}.weight"), dtype)

    identity = packed_cache.model_identity(source, None)
    cache = packed_cache.cache_file(cache_folder, identity, dtype, spec.group_size, spec.quantize_head) if identity else None
    replace_with_int4_kernel(model, layers, spec.group_size, cache, weight_of)
    log_on_kernel(len(layers))
    mark_quantized(model, "int4", spec.group_size, spec.quantize_head)
    read_generation_config(model, folder)
    return model.eval()


def weights_at_hand(model: torch.nn.Module, to_pack: set[str], reader: CheckpointReader) -> Iterator[bool]:
    """For every parameter, whether it holds its weights now (a tied head: the embedding's) or, a
    weight to pack, can read them from the checkpoint."""
    for name, parameter in model.named_parameters():
        yield parameter.device.type != "meta" or (name in to_pack and name in reader.where)

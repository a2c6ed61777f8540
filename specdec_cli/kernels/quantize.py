"""Quantization of a loaded model's Linear layers but the output head: int8 weight-only through
torchao (one scale per output row); int4 (a scale and a minimum per `group_size` inputs) through
specdec's own kernel on CPUs with AVX512-VNNI or AVX2 (int4_matmul.py: int8 activations), else through
torchao's weight-only int4. torchao is imported only here, and only when a profile asks for it.

SPECDEC_INT4_KERNEL=torchao keeps int4 on torchao's kernel where specdec's would run (for
side-by-side measurements)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import torch

from ..errors import UsageError
from ..specs import ModelSpec
from . import build, int4_matmul, packed_cache
from .isa import ISA_NAMES, kernel_isa

log = logging.getLogger("specdec")
notice = logging.getLogger("specdec.notice")  # one-time notices (the packing), shown like the compile notice

INSTALL_HINT = "pip install 'specdec-cli[quant]'"
LABEL_ATTRIBUTE = "specdec_quantization"  # set on a quantized model: what compile_choice keys its costs by


def quantization_label(method: str, group_size: int | None) -> str:
    """'none', 'int8' or 'int4-g128'."""
    return f"{method}-g{group_size}" if method == "int4" else method


def quantization_of(model: torch.nn.Module) -> str:
    """How `model`'s weights are held, as quantize_model left them ('none' if it never ran)."""
    return getattr(model, LABEL_ATTRIBUTE, "none")


def stored_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters as stored: a torchao tensor counts its packed data and scales, not
    the full-precision size its dtype and shape suggest."""
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        names = getattr(tensor, "tensor_data_names", None)
        parts = [getattr(tensor, name) for name in names] if names else [tensor]
        total += sum(part.numel() * part.element_size() for part in parts)
    return total


def own_int4_wanted(device: torch.device) -> bool:
    """Whether int4 layers on `device` run specdec's own kernel (int4_matmul.py): a CPU, not held
    to torchao's kernel, and the kernels built (built now if need be: build.py)."""
    return (device.type == "cpu" and os.environ.get("SPECDEC_INT4_KERNEL", "auto") != "torchao"
            and build.available())


def takes_int4_kernel(linear: torch.nn.Linear, group_size: int) -> bool:
    """Whether this layer in int4 runs specdec's own kernel: wanted on its device and a shape the
    kernel takes."""
    return own_int4_wanted(linear.weight.device) and int4_matmul.fits(linear, group_size)


def load_dtype(spec: ModelSpec, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype to load in. int4's kernels want bfloat16: on CPU ATen's _weight_int4pack_mm_for_cpu
    has AVX512 and AVX2 code for bfloat16 only (float32 runs its scalar loop, ~40x slower: kept
    only when the profile names float32, e.g. for bit-exact checks); on CUDA the tile-packed int4
    layout takes bfloat16 only. So int4 under dtype: auto loads in bfloat16, except where specdec's
    own kernel runs it, which takes any dtype (its activations become int8 anyway)."""
    if spec.quantize != "int4" or dtype == torch.bfloat16 or own_int4_wanted(device):
        return dtype
    if spec.dtype == "auto":
        return torch.bfloat16
    if device.type == "cuda":
        log.warning("%s: quantize: int4 runs in bfloat16 on CUDA, not dtype %s", spec.model, spec.dtype)
        return torch.bfloat16
    log.warning("%s: quantize: int4 in dtype %s runs a scalar CPU kernel, tens of times slower than in "
                "bfloat16 (dtype: auto)", spec.model, spec.dtype)
    return dtype


def _torchao(method: str):
    try:
        import torchao.quantization as quantization
    except ImportError:
        raise UsageError(f"quantize: {method} needs torchao: {INSTALL_HINT}") from None
    return quantization


def config_for(method: str, group_size: int | None, device_type: str):
    """torchao's config for `method` on this kind of device. set_inductor_config off: torchao
    would change inductor's process-wide settings, which compiled_step owns."""
    quantization = _torchao(method)
    if method == "int8":
        return quantization.Int8WeightOnlyConfig(set_inductor_config=False)
    if device_type == "cpu":
        # the CPU packing (Int4OpaqueTensor), whose matmul is ATen's _weight_int4pack_mm_for_cpu
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig

        return PrototypeInt4WeightOnlyConfig(group_size=group_size, set_inductor_config=False)
    if device_type == "cuda":
        # the tinygemm layout, whose matmul is ATen's CUDA _weight_int4pack_mm
        return quantization.Int4WeightOnlyConfig(group_size=group_size, int4_packing_format="tile_packed_to_4d",
                                                 set_inductor_config=False)
    raise UsageError(f"quantize: int4 runs on cpu or cuda, not {device_type}; remove quantize or change device")


def quantized_layers(model: torch.nn.Module, head: bool = False) -> list[tuple[str, torch.nn.Linear]]:
    """The Linear layers to quantize: all but the output head unless `head`. The head stays in full
    precision by default: its logits decide greedy ties, where a coarser head flips near-ties more
    often; but it is a large share of a small model's bytes (467 MB of the 1.5B Qwen's 1.63 GB in
    int4), so `quantize_head: true` takes it too (untied from the input embedding, which stays)."""
    output = model.get_output_embeddings()
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and (head or m is not output)]


def check_groups_divide(layers: list[tuple[str, torch.nn.Linear]], group_size: int) -> None:
    """torchao would skip a layer whose inputs are not a multiple of the group, without a word."""
    for name, layer in layers:
        if layer.in_features % group_size:
            raise UsageError(f"group_size: {group_size} does not divide the {layer.in_features} inputs of layer "
                             f"{name}; choose a smaller group_size (32, 64)")


def replace_with_int4_kernel(model: torch.nn.Module, layers: list[tuple[str, torch.nn.Linear]], group_size: int,
                      cache: Path | None, weight_of: Callable[[str, torch.nn.Linear], torch.Tensor] | None = None) -> None:
    """`layers` become Int4Linear, from `cache` where it holds them all, else packed now (and
    kept in `cache`) from `weight_of(name, layer)`, by default the layer's own weight."""
    if not layers:
        return
    names = [f"{name}.{part}" for name, _ in layers for part in int4_matmul.PARTS]
    stored = packed_cache.load_packed(cache) if cache else None
    if stored is not None and not all(key in stored for key in names):
        stored = None  # another model's layers under this key: cannot happen unless edited by hand
    if stored is None and cache is not None:
        notice.info("packing %d int4 layers once for this model; kept in %s for the next run", len(layers), cache.parent)
    for name, layer in layers:
        if stored:
            parts = tuple(stored[f"{name}.{part}"] for part in int4_matmul.PARTS)
        else:
            parts = int4_matmul.pack(weight_of(name, layer), group_size) if weight_of else None
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, int4_matmul.Int4Linear(layer, group_size, parts))
    if stored is None and cache is not None:
        packed_cache.save_packed(cache, {key: model.get_buffer(key) for key in names})


def quantize_model(model: torch.nn.Module, method: str, group_size: int | None = None,
                   head: bool = False, cache: Path | None = None) -> torch.nn.Module:
    """`model` with its Linear layers (the head too if `head`) quantized in place: int4 layers that
    specdec's kernel takes become Int4Linear, the others get torchao's quantized weights; each
    layer gets the kernels of the device its weight is on. `cache`: the file that keeps the
    Int4Linear layers' packed weights between runs (packed_cache.py)."""
    if method == "none":
        return model
    layers = quantized_layers(model, head)
    if method == "int4":
        check_groups_divide(layers, group_size)
        on_kernel = [(name, m) for name, m in layers if takes_int4_kernel(m, group_size)]
        replace_with_int4_kernel(model, on_kernel, group_size, cache)
        if on_kernel:
            log_on_kernel(len(on_kernel))
        taken = {id(m) for _, m in on_kernel}
        layers = [(name, m) for name, m in layers if id(m) not in taken]
    if layers:
        quantization = _torchao(method)
        chosen = {id(m) for _, m in layers}
        for device_type in sorted({m.weight.device.type for _, m in layers}):
            quantization.quantize_(
                model, config_for(method, group_size, device_type),
                filter_fn=lambda module, _name, kind=device_type: id(module) in chosen and module.weight.device.type == kind,
            )
        log.info("quantized %d Linear layers to %s (torchao, weight-only)", len(layers), quantization_label(method, group_size))
    mark_quantized(model, method, group_size, head)
    return model


def log_on_kernel(count: int) -> None:
    log.info("int4: %d Linear layers on specdec's %s kernel (int8 activations)", count, ISA_NAMES[kernel_isa()])


def mark_quantized(model: torch.nn.Module, method: str, group_size: int | None, head: bool) -> None:
    """Label `model` with how quantize_model left it (quantization_of reads it)."""
    setattr(model, LABEL_ATTRIBUTE, quantization_label(method, group_size) + ("-head" if head else ""))

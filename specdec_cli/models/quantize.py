"""Weight-only quantization of a loaded model through torchao: int8 (one scale per output row) or
int4 (a scale and zero point per `group_size` inputs), applied to every Linear layer but the output
head. torchao is imported only here, and only when a profile asks for quantization."""

from __future__ import annotations

import logging

import torch

from ..errors import UsageError
from ..specs import ModelSpec

log = logging.getLogger("specdec")

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
    for parameter in model.parameters():
        names = getattr(parameter, "tensor_data_names", None)
        parts = [getattr(parameter, name) for name in names] if names else [parameter]
        total += sum(part.numel() * part.element_size() for part in parts)
    return total


def load_dtype(spec: ModelSpec, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype to load in. int4's kernels want bfloat16: on CPU ATen's _weight_int4pack_mm_for_cpu
    has AVX512 and AVX2 code for bfloat16 only (float32 runs its scalar loop, ~40x slower: kept
    only when the profile names float32, e.g. for bit-exact checks); on CUDA the tile-packed int4
    layout takes bfloat16 only. So int4 under dtype: auto loads in bfloat16."""
    if spec.quantize != "int4" or dtype == torch.bfloat16:
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


def quantized_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """The Linear layers to quantize: all but the output head. The head stays in full precision:
    its weight is often tied to the input embedding (quantizing it would untie the two), and its
    logits decide greedy ties, where a coarser head would flip near-ties more often."""
    head = model.get_output_embeddings()
    return [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]


def check_groups_divide(layers: list[tuple[str, torch.nn.Linear]], group_size: int) -> None:
    """torchao would skip a layer whose inputs are not a multiple of the group, without a word."""
    for name, layer in layers:
        if layer.in_features % group_size:
            raise UsageError(f"group_size: {group_size} does not divide the {layer.in_features} inputs of layer "
                             f"{name}; choose a smaller group_size (32, 64)")


def quantize_model(model: torch.nn.Module, method: str, group_size: int | None = None) -> torch.nn.Module:
    """`model` with its Linear weights (but the head's) replaced by torchao's quantized tensors, in
    place; each layer gets the kernels of the device its weight is on."""
    if method == "none":
        return model
    quantization = _torchao(method)
    layers = quantized_layers(model)
    if method == "int4":
        check_groups_divide(layers, group_size)
    chosen = {id(m) for _, m in layers}
    for device_type in sorted({m.weight.device.type for _, m in layers}):
        quantization.quantize_(
            model, config_for(method, group_size, device_type),
            filter_fn=lambda module, _name, kind=device_type: id(module) in chosen and module.weight.device.type == kind,
        )
    setattr(model, LABEL_ATTRIBUTE, quantization_label(method, group_size))
    log.info("quantized %d Linear layers to %s (torchao, weight-only; the output head kept)",
             len(layers), quantization_label(method, group_size))
    return model

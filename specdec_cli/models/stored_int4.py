"""int4 checkpoints quantized ahead with GPTQ or AWQ (e.g. the Qwen team's -GPTQ-Int4 and -AWQ
models), loaded without their packages: each layer's codes, zero points and scales are read from
the safetensors files and handed to specdec's int4 kernel as they are (int4_matmul.pack_codes), or,
where that kernel cannot take them (CUDA, a CPU without AVX2, act-order, a group that is not a
multiple of 16), dequantized to the model's dtype once at load.

Both formats hold w = (q - zero) * scale per group of inputs, q and zero 4-bit, scale float16:
that is the kernel's q * scale + min with min = -zero * scale (rounded to float16, as its minimums
are stored: within 2^-11 of the value). The kernel rounds activations to int8, so the model is not
bit for bit the one GPTQ's or AWQ's kernels run; specdec's exactness holds against it as against
any int4 target.

Layouts (as AutoGPTQ / GPTQModel and AutoAWQ write them), 8 codes an int32, the first in the low
bits:
- GPTQ: qweight [in/8, out] packs 8 consecutive inputs; qzeros [groups, out/8] packs 8 consecutive
  outputs, each stored as zero - 1 in the original ("gptq", v1) format, as zero in "gptq_v2";
  scales [groups, out]; g_idx [in], each input's group (not i // group_size under act-order).
- AWQ (GEMM): qweight [in, out/8] and qzeros [groups, out/8] pack 8 outputs in the order
  0, 2, 4, 6, 1, 3, 5, 7; scales [groups, out]."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from ..errors import ModelLoadError, UsageError
from ..kernels import int4_matmul, packed_cache
from ..kernels.quantize import LABEL_ATTRIBUTE, own_int4_wanted

log = logging.getLogger("specdec")

PARTS = ("qweight", "qzeros", "scales", "g_idx")  # a quantized layer's tensors (AWQ has no g_idx)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the output each of an AWQ word's 8 nibbles holds, low bits first
CODES_A_WORD = 8


@dataclass(frozen=True)
class StoredInt4:
    """What a checkpoint's quantization_config says about its int4 layers."""

    method: str  # 'gptq' or 'awq'
    group_size: int
    zeros_stored_minus_one: bool  # GPTQ's original format

    @property
    def label(self) -> str:
        """As quantization_of() reports it, e.g. 'gptq-int4-g128'."""
        return f"{self.method}-int4-g{self.group_size}"


def stored_int4(config: dict[str, Any] | None, model: str) -> StoredInt4 | None:
    """The GPTQ or AWQ int4 format a checkpoint's quantization_config describes, None for any other
    (or none); a GPTQ or AWQ variant specdec cannot read is a one-line error."""
    if not isinstance(config, dict) or config.get("quant_method") not in ("gptq", "awq"):
        return None
    method = config["quant_method"]
    bits, group_size = config.get("bits"), config.get("group_size")
    if bits != 4:
        raise UsageError(f"'{model}' is {method.upper()} with {bits}-bit weights; specdec reads 4-bit "
                         f"{method.upper()} checkpoints only: choose its Int4 variant")
    if not isinstance(group_size, int) or group_size <= 0:
        raise UsageError(f"'{model}': {method.upper()} group_size {group_size!r} (per-channel scales) is not "
                         "supported; choose a checkpoint quantized with groups (e.g. 128)")
    if method == "awq":
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm" or config.get("zero_point") is False:
            raise UsageError(f"'{model}': AWQ version {version} (zero_point {config.get('zero_point')}) is not "
                             "supported; specdec reads AWQ's GEMM format with zero points")
        return StoredInt4("awq", group_size, zeros_stored_minus_one=False)
    checkpoint_format = config.get("checkpoint_format", "gptq")
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise UsageError(f"'{model}': GPTQ checkpoint_format {checkpoint_format} is not supported "
                         "(specdec reads gptq and gptq_v2)")
    return StoredInt4("gptq", group_size, zeros_stored_minus_one=checkpoint_format == "gptq")


def unpack_words(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., n] -> uint8 codes [..., 8n], each word's low nibble first. Read as the bytes of
    little-endian words (each byte two codes, the low nibble first): byte-sized temporaries only, as
    int32 ones for every code of a 1.5B model left GBs in the allocator's free lists."""
    data = words.reshape(-1).contiguous().view(torch.uint8)  # little-endian, as x86 and ARM (and safetensors) store them
    return torch.stack([data & 0x0F, data >> 4], dim=-1).reshape(*words.shape[:-1], -1)


def layer_codes(fmt: StoredInt4, tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's (codes uint8 [out, in], zeros uint8 [out, groups], scales float16 [out, groups],
    each input's group [in])."""
    scales = tensors["scales"].to(torch.float16)
    if fmt.method == "awq":
        codes, zeros = awq_outputs_in_order(tensors["qweight"]).T, awq_outputs_in_order(tensors["qzeros"]).T
        groups = torch.arange(codes.shape[1]) // fmt.group_size
    else:
        codes = unpack_words(tensors["qweight"].T)  # [out, in/8] words of 8 inputs
        zeros = unpack_words(tensors["qzeros"]).T.to(torch.int16) + int(fmt.zeros_stored_minus_one)
        groups = tensors["g_idx"].long() if "g_idx" in tensors else torch.arange(codes.shape[1]) // fmt.group_size
    out_features = scales.shape[1]
    return codes.contiguous(), zeros[:out_features].contiguous(), scales.T.contiguous(), groups


def awq_outputs_in_order(words: torch.Tensor) -> torch.Tensor:
    """AWQ's int32 [rows, out/8] -> codes [rows, out], output o at column o: nibble j of word c holds
    output 8c + AWQ_ORDER[j]."""
    codes = unpack_words(words).reshape(words.shape[0], -1, CODES_A_WORD)
    return codes[..., torch.tensor(AWQ_ORDER).argsort()].reshape(words.shape[0], -1)


def dequantize(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """The float32 weight [out, in]: (q - zero) * scale of each input's group."""
    return (codes.float() - zeros[:, groups].float()) * scales[:, groups].float()


def kernel_parts(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same weights in int4_matmul's layout: min = -zero * scale."""
    mins = (-zeros.float() * scales.float()).half()
    return int4_matmul.pack_codes(codes, scales, mins)


def as_loaded(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float tensor in the model's dtype (a copy, off the mapped file), any other as stored."""
    return tensor.to(dtype, copy=True) if tensor.is_floating_point() else tensor.clone()


def contiguous_groups(groups: torch.Tensor, group_size: int) -> bool:
    """Whether input i is in group i // group_size (not act-order's shuffled groups)."""
    return torch.equal(groups, torch.arange(groups.numel()) // group_size)


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return sorted({folder / name for name in json.loads(index.read_text())["weight_map"].values()})
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"'{folder}' has no safetensors weights; a GPTQ/AWQ checkpoint needs them")
    return files


class CheckpointReader:
    """The tensors of a checkpoint's safetensors files, read one at a time as asked (the files are
    mapped, not read whole: a 1.5B model's 1.6 GB would otherwise sit in memory beside its copy)."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        self.files = [safe_open(str(path), framework="pt") for path in weight_files(folder)]
        self.where = {key: handle for handle in self.files for key in handle.keys()}

    def keys(self) -> list[str]:
        return list(self.where)

    def get(self, key: str) -> torch.Tensor:
        return self.where[key].get_tensor(key)


def load_stored_int4(folder: Path, config: Any, fmt: StoredInt4, dtype: torch.dtype, device: torch.device,
                     cache: Path | None = None) -> torch.nn.Module:
    """The causal LM in `folder` with its GPTQ/AWQ layers on specdec's int4 kernel where it runs on
    `device`, else dequantized to `dtype`; every other weight in `dtype`. `cache`: the file that keeps
    the kernel's layout of those layers between runs (packed_cache.py), so that later loads map it."""
    del config.quantization_config  # the layers are read here, not by transformers' quantizer
    model = empty_model(config, dtype)
    reader = CheckpointReader(folder)
    keys = set(reader.keys())
    prefixes = sorted({key.rpartition(".")[0] for key in keys if key.endswith(".qweight")})
    kernel = own_int4_wanted(device)
    cached = (packed_cache.load_packed(cache) if cache and kernel else None) or {}
    converted: dict[str, torch.Tensor] = {}
    for prefix in prefixes:
        bias = reader.get(f"{prefix}.bias") if f"{prefix}.bias" in keys else None
        keys -= {f"{prefix}.{part}" for part in (*PARTS, "bias")}
        names = [f"{prefix}.{part}" for part in int4_matmul.PARTS]
        if all(name in cached for name in names):
            layer = kernel_layer(tuple(cached[name] for name in names), fmt.group_size, bias, dtype)
        else:
            parts = {part: reader.get(f"{prefix}.{part}") for part in PARTS if f"{prefix}.{part}" in reader.where}
            layer = stored_layer(fmt, parts, bias, dtype, kernel)
            if isinstance(layer, int4_matmul.Int4Linear):
                converted.update({f"{prefix}.{part}": getattr(layer, part) for part in int4_matmul.PARTS})
        parent, _, child = prefix.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
    if converted and cache:
        packed_cache.save_packed(cache, {**cached, **converted})
    unexpected = load_float_tensors(model, reader, sorted(keys), dtype)
    still_empty = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if unexpected or still_empty:
        raise ModelLoadError(f"cannot load '{folder}' as {fmt.method.upper()}: "
                             + (f"unexpected weights {unexpected[:3]}" if unexpected else f"no weights for {still_empty[:3]}"))
    read_generation_config(model, folder)
    model.to(device)
    setattr(model, LABEL_ATTRIBUTE, fmt.label)
    on_kernel = sum(isinstance(model.get_submodule(prefix), int4_matmul.Int4Linear) for prefix in prefixes)
    log.info("%s: %d of its %d %s layers on specdec's int4 kernel, the others dequantized to %s", folder,
             on_kernel, len(prefixes), fmt.method.upper(), dtype)
    return model


def empty_model(config: Any, dtype: torch.dtype) -> torch.nn.Module:
    """The causal LM `config` describes, its parameters on the meta device (load_float_tensors and
    the int4 layers fill them), its buffers (rotary frequencies) computed for real."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def load_float_tensors(model: torch.nn.Module, reader: CheckpointReader, keys: Iterable[str],
                       dtype: torch.dtype) -> list[str]:
    """The checkpoint's tensors `keys` into `model` (floats in `dtype`), then its head tied to the
    input embedding where the config says so; returns the keys the model has no place for."""
    tensors = {key: as_loaded(reader.get(key), dtype) for key in keys}
    _, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    return unexpected


def read_generation_config(model: torch.nn.Module, folder: Path) -> None:
    """The folder's generation_config.json, as from_pretrained reads it; none: the model's defaults."""
    from transformers import GenerationConfig

    try:
        model.generation_config = GenerationConfig.from_pretrained(folder)
    except OSError:
        pass


def kernel_layer(parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor], group_size: int,
                 bias: torch.Tensor | None, dtype: torch.dtype) -> torch.nn.Module:
    """An Int4Linear holding `parts` (int4_matmul's layout) and `bias`."""
    packed = parts[0]
    shell = torch.nn.Linear(packed.shape[1] * int4_matmul.CHUNK, packed.shape[0] * int4_matmul.LANES,
                            bias=bias is not None, device="meta")
    if bias is not None:
        shell.bias = torch.nn.Parameter(bias.to(dtype), requires_grad=False)
    return int4_matmul.Int4Linear(shell, group_size, parts)


def stored_layer(fmt: StoredInt4, parts: dict[str, torch.Tensor], bias: torch.Tensor | None, dtype: torch.dtype,
                 kernel: bool) -> torch.nn.Module:
    """One GPTQ/AWQ layer: on the kernel where `kernel` and its groups let it, else a dequantized Linear."""
    codes, zeros, scales, groups = layer_codes(fmt, parts)
    if kernel and contiguous_groups(groups, fmt.group_size) and int4_matmul.shape_fits(*codes.shape, fmt.group_size):
        return kernel_layer(kernel_parts(codes, zeros, scales), fmt.group_size, bias, dtype)
    # built on the meta device: a real one would first fill its weight with a random init, then overwrite it
    layer = torch.nn.Linear(codes.shape[1], codes.shape[0], bias=bias is not None, device="meta")
    layer.weight = torch.nn.Parameter(dequantize(codes, zeros, scales, groups).to(dtype), requires_grad=False)
    if bias is not None:
        layer.bias = torch.nn.Parameter(bias.to(dtype), requires_grad=False)
    return layer

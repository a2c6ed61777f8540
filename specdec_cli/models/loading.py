"""Load a target or draft model and its tokenizer (transformers + accelerate; GPTQ/AWQ int4 and
int4 a layer at a time by specdec itself), from wherever sources.py says it comes from."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from ..cache_dirs import cache_dir
from ..errors import ModelLoadError, UsageError, first_line
from ..kernels.int4_siblings import share_storage
from ..kernels.packed_cache import cache_file, model_identity
from ..kernels.quantize import (
    LABEL_ATTRIBUTE,
    load_dtype,
    quantization_of,
    quantize_model,
    quantized_layers,
    replace_with_int4_kernel,
    takes_int4_kernel,
)
from ..run_clock import timed
from ..specs import ModelSpec
from .devices import dtype_name, resolve_dtype
from .gguf import convert_gguf, gguf_path
from .int4_layerwise import load_int4_layerwise
from .progress_bars import no_progress_bars
from .sources import check_weights_format, hub_access, is_local_reference, local_folder
from .stored_int4 import StoredInt4, load_stored_int4, stored_int4

log = logging.getLogger("specdec")


@dataclass(frozen=True)
class LoadOptions:
    device: torch.device
    device_map: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False


def resolve_source(spec: ModelSpec, options: LoadOptions) -> tuple[str, dict[str, Any]]:
    """The folder or hub id to load from_pretrained, and the kwargs that say how."""
    if spec.gguf_file:
        access = {} if is_local_reference(spec.model) else hub_access(spec)
        return str(convert_gguf(gguf_path(spec, access))), {}
    if is_local_reference(spec.model):
        folder = local_folder(spec)
        check_weights_format(folder, options.allow_pickle)
        return str(folder), {}
    access = hub_access(spec)
    if spec.revision:
        access["revision"] = spec.revision
    return spec.model, access


def load_model(spec: ModelSpec, options: LoadOptions) -> torch.nn.Module:
    """A causal LM on `options.device` (or spread by device_map), in eval mode, its weights
    quantized as `spec.quantize` says; sibling int4 layers' weights laid end to end, so that the
    compiled step multiplies those reading one input in one call (int4_siblings.py)."""
    return share_storage(loaded_model(spec, options))


def loaded_model(spec: ModelSpec, options: LoadOptions) -> torch.nn.Module:
    """load_model's model as loaded and quantized."""
    from transformers import AutoModelForCausalLM

    source, access = resolve_source(spec, options)
    dtype = load_dtype(spec, resolve_dtype(spec.dtype, options.device), options.device)
    if options.trust_remote_code:
        log.warning("trust_remote_code is on: loading '%s' runs Python code from that repository", spec.model)
    placement = options.device_map or str(options.device)
    if stored := prequantized_int4(spec, source, access, options):
        fmt, config, folder = stored
        if spec.quantize != "none":
            raise UsageError(f"'{spec.model}' is stored quantized already ({fmt.method}); "
                             f"remove quantize: {spec.quantize} from its profile entry (or --quantize)")
        identity = model_identity(str(folder), None)  # a folder's files name it: no model needed
        cache = cache_file(cache_dir() / "packed", f"{identity}|{fmt.label}", dtype, fmt.group_size, False) if identity else None
        model = load_stored_int4(folder, config, fmt, dtype, options.device, cache).eval()
        return with_int4_head(model, spec, fmt.group_size, folder)
    if spec.quantize_head and spec.quantize == "none":
        raise UsageError(f"{spec.model}: quantize_head: true goes with quantize: int4 or a GPTQ/AWQ int4 "
                         "checkpoint; remove quantize_head or set quantize: int4")
    if spec.quantize == "int4" and options.device_map is None and not options.trust_remote_code:
        if model := load_int4_layerwise(spec, source, dtype, options.device, cache_dir() / "packed"):
            log.info("loaded %s (%s, %s)", spec.model, dtype_name(dtype), placement)
            return model
    try:
        with no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(
                source,
                dtype=dtype,
                device_map=placement,
                trust_remote_code=options.trust_remote_code,
                use_safetensors=None if options.allow_pickle else True,
                **access,
            )
    except torch.OutOfMemoryError:
        raise
    except (OSError, ValueError, KeyError, SafetensorError) as exc:
        raise ModelLoadError(describe_load_failure(spec, exc)) from exc
    model.eval()
    log.info("loaded %s (%s, %s)", spec.model, dtype_name(dtype), placement)
    stored = getattr(model.config, "quantization_config", None)
    if stored is not None:  # saved quantized (torchao, GPTQ, AWQ...): transformers loaded it so
        if spec.quantize != "none":
            raise UsageError(f"'{spec.model}' is stored quantized already ({quantization_name(stored)}); "
                             f"remove quantize: {spec.quantize} from its profile entry (or --quantize)")
        log.info("%s is stored quantized (%s): run as transformers loaded it", spec.model, quantization_name(stored))
    cache = None
    if spec.quantize == "int4" and (identity := model_identity(source, model)):
        cache = cache_file(cache_dir() / "packed", identity, dtype, spec.group_size, spec.quantize_head)
    return quantize_model(model, spec.quantize, spec.group_size, spec.quantize_head, cache)


def import_model_code(config: Any) -> None:
    """transformers imports a model's code at its first load (Qwen2's: about 1.3 s on a 2-core
    EPYC), here under run_clock's imports, so that -v's weights are the weights' own seconds."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    with timed("imports"):
        try:
            MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
        except KeyError:  # a model's own code (trust_remote_code): imported as it loads
            pass


def prequantized_int4(spec: ModelSpec, source: str, access: dict[str, Any],
                      options: LoadOptions) -> tuple[StoredInt4, Any, Path] | None:
    """(format, config, local folder) of a GPTQ or AWQ int4 checkpoint, which specdec reads itself;
    None for any other model, which transformers loads. Either way the model's code is imported
    here, from the config read."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=options.trust_remote_code, **access)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(describe_load_failure(spec, exc)) from exc
    import_model_code(config)
    fmt = stored_int4(getattr(config, "quantization_config", None), spec.model)
    if fmt is None:
        return None
    if options.device_map:
        raise UsageError(f"'{spec.model}' is a {fmt.method.upper()} checkpoint: it loads on one device; "
                         "remove device_map from the profile")
    if Path(source).is_dir():
        return fmt, config, Path(source)
    from huggingface_hub import snapshot_download

    hub = {key: value for key, value in access.items() if key in ("revision", "local_files_only")}
    return fmt, config, Path(snapshot_download(source, allow_patterns=["*.json", "*.safetensors"], **hub))


def with_int4_head(model: torch.nn.Module, spec: ModelSpec, group_size: int, folder: Path) -> torch.nn.Module:
    """A GPTQ/AWQ model, its output head (kept in full precision by those formats) in int4 too where
    the profile says quantize_head: true, packed once and cached as `quantize: int4` does."""
    if not spec.quantize_head:
        return model
    head = [(name, m) for name, m in quantized_layers(model, head=True) if m is model.get_output_embeddings()]
    if not head or not takes_int4_kernel(head[0][1], group_size):
        log.warning("%s: quantize_head: the head of a %s checkpoint goes to int4 on specdec's CPU kernel only; "
                    "it stays in %s here", spec.model, quantization_of(model), dtype_name(model.dtype))
        return model
    label = quantization_of(model)
    identity = model_identity(str(folder), model)
    cache = cache_file(cache_dir() / "packed", identity, model.dtype, group_size, True) if identity else None
    replace_with_int4_kernel(model, head, group_size, cache)
    setattr(model, LABEL_ATTRIBUTE, f"{label}-head")
    return model


def quantization_name(config: object) -> str:
    """A checkpoint's stored quantization, as its config names it (torchao, gptq, awq...)."""
    method = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    return str(getattr(method, "value", method) or type(config).__name__)


def describe_load_failure(spec: ModelSpec, exc: Exception) -> str:
    text = first_line(exc)
    if "safetensors" in text.lower() and "pytorch_model.bin" in str(exc):
        return (
            f"'{spec.model}' has only pickle weights (pytorch_model.bin); convert to safetensors "
            "or set `allow_pickle: true` in the profile if you trust the source"
        )
    if "trust_remote_code" in str(exc):
        return f"'{spec.model}' needs custom code; set `trust_remote_code: true` in the profile only if you trust it"
    return f"cannot load model '{spec.model}': {text}"


def load_tokenizer(spec: ModelSpec, options: LoadOptions):
    from transformers import AutoTokenizer

    source, access = resolve_source(spec, options)
    access.pop("revision", None)
    try:
        return AutoTokenizer.from_pretrained(
            source, revision=spec.revision, trust_remote_code=options.trust_remote_code, **access
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer of '{spec.model}': {str(exc).strip().splitlines()[0]}") from exc

"""GGUF models: the file found (in a local folder or on the hub), dequantized once into a plain
safetensors folder in specdec's cache, which later runs load in seconds."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..cache_dirs import cache_dir
from ..errors import ModelSourceError
from ..specs import ModelSpec
from .progress_bars import no_progress_bars
from .sources import is_local_reference, local_folder

notice = logging.getLogger("specdec.notice")  # information shown without -v (see output.configure_logging)


def gguf_path(spec: ModelSpec, access: dict[str, Any]) -> Path:
    if is_local_reference(spec.model):
        path = local_folder(spec) / spec.gguf_file
        if not path.is_file():
            raise ModelSourceError(f"gguf_file '{spec.gguf_file}' is not in '{spec.model}'")
        return path
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(spec.model, spec.gguf_file, revision=spec.revision, **access))


def converted_gguf_folder(path: Path) -> Path:
    """Where the dequantized copy of a GGUF file lives: keyed by the file's identity, not its name."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "gguf" / f"{path.stem}-{key}"


def convert_gguf(path: Path) -> Path:
    """Dequantize a GGUF file once into safetensors; later runs load that in seconds.

    transformers dequantizes GGUF on every load (slow), so the first run writes a plain folder
    (model in bfloat16 + tokenizer) into the cache, atomically: a killed conversion leaves nothing.
    """
    out = converted_gguf_folder(path)
    if (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    notice.info("converting %s to safetensors once, into %s (later runs load it from there)", path.name, out)
    folder, name = str(path.parent), path.name
    from unittest import mock

    import transformers.modeling_gguf_pytorch_utils as gguf_reader

    # the GGUF reader draws its own tqdm bar (not transformers' switchable one) over our spinner
    with mock.patch.object(gguf_reader, "tqdm", lambda items, **_: items), no_progress_bars():
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized now
    # a model loaded from GGUF refuses save_pretrained: copy its weights into a plain one
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        with no_progress_bars():  # transformers' "Writing model shards" bar, over our spinner too
            plain.save_pretrained(staging)
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(staging)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
